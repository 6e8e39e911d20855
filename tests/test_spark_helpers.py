"""``delayindex.spark`` helpers that need no JVM: Java discovery, argument checks, the CLI's
position parser, the locator arithmetic of the scan's reject examples, the scan's ledger ranges
planned from Parquet footers, and where the class archive lives."""

from __future__ import annotations

import argparse
import os
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from delayindex.cli import _mark_delete
from delayindex.dump import RejectReport
from delayindex.spark import SparkUnavailableError, local_session, session
from delayindex.spark.job import LOC_SHIFT, _check_args, _locate_examples
from delayindex.spark.scan import _Dump, _resolve_dump, _sorted_groups, scans_without_shuffle
from delayindex.spark.slices import plan_slices, read_slice


def _fake_java(home: Path, version_line: str) -> Path:
    """A ``<home>/bin/java`` that prints ``version_line`` to stderr, as ``java -version`` does."""
    java = home / "bin" / "java"
    java.parent.mkdir(parents=True)
    java.write_text(f"#!/bin/sh\necho '{version_line}' >&2\n")
    java.chmod(java.stat().st_mode | stat.S_IEXEC)
    return java


@pytest.mark.parametrize(
    ("line", "major"),
    [
        ('openjdk version "17.0.15" 2025-04-15', 17),
        ('openjdk version "21" 2023-09-19', 21),
        ('java version "1.8.0_392"', 8),
        ("no version here", None),
    ],
)
def test_java_major_version_reads_java_dash_version(tmp_path: Path, line: str, major: int) -> None:
    assert session.java_major_version(_fake_java(tmp_path, line)) == major


def test_java_major_version_of_something_that_does_not_run(tmp_path: Path) -> None:
    assert session.java_major_version(tmp_path / "missing") is None


def test_find_java_home_prefers_a_suitable_java_home_and_skips_old_ones(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    old = tmp_path / "jdk8"
    _fake_java(old, 'java version "1.8.0_392"')
    good = tmp_path / "jvm" / "jdk-21"
    _fake_java(good, 'openjdk version "21.0.2"')
    monkeypatch.setattr(session, "_JVM_DIRS", (str(tmp_path / "jvm"),))
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    monkeypatch.setattr(session, "require_spark", lambda: None)  # whether pyspark is installed
    session.find_java_home.cache_clear()
    try:
        monkeypatch.setenv("JAVA_HOME", str(old))
        assert session.find_java_home() == str(good)  # Java 8 refused, the JVM dir found
        session.find_java_home.cache_clear()
        monkeypatch.setenv("JAVA_HOME", str(good))
        assert session.find_java_home() == str(good)
        session.find_java_home.cache_clear()
        monkeypatch.setattr(session, "_JVM_DIRS", ())
        monkeypatch.setenv("JAVA_HOME", str(old))
        assert session.find_java_home() is None
        with pytest.raises(SparkUnavailableError, match="no Java 17-25 found"):
            local_session()
    finally:
        session.find_java_home.cache_clear()


def test_local_session_checks_its_arguments() -> None:
    with pytest.raises(ValueError, match="shuffle_partitions"):
        local_session(shuffle_partitions=0)


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"name": "a/b"}, ValueError, "index name"),
        ({"config": {"tick_ms": 1}}, TypeError, "TrackerConfig"),
        ({"now_ms": 1.5}, TypeError, "now_ms"),
        ({"mark_delete": (1,)}, TypeError, "mark_delete"),
        ({"mark_delete": (1, 2**32)}, ValueError, "entry_id"),
        ({"mark_delete": (-1, 0)}, ValueError, "ledger_id"),
    ],
)
def test_rebuild_arguments_are_checked_up_front(
    kwargs: dict[str, Any], error: type, match: str
) -> None:
    from delayindex import TrackerConfig

    args = {"name": "n", "config": TrackerConfig(), "now_ms": 0, "mark_delete": None, **kwargs}
    with pytest.raises(error, match=match):
        _check_args(args["name"], args["config"], args["now_ms"], args["mark_delete"])


def test_check_args_defaults_now_to_the_wall_clock() -> None:
    from delayindex import TrackerConfig, wall_clock_ms

    before = wall_clock_ms()
    _, now, mark = _check_args("n", TrackerConfig(), None, [3, 4])
    assert before <= now <= wall_clock_ms() and mark == (3, 4)


def test_mark_delete_argument() -> None:
    assert _mark_delete("42:17") == (42, 17)
    assert _mark_delete("1_000:0") == (1000, 0)
    for bad in ("42", "a:b", "-1:0", f"1:{2**32}"):
        with pytest.raises(argparse.ArgumentTypeError):
            _mark_delete(bad)


def test_examples_get_global_rows_files_and_details_back() -> None:
    report = RejectReport(total_rows=30)
    loc = (1 << LOC_SHIFT) | 4  # row 4 of the second file
    report.record(
        "duplicate",
        1,
        [{"row": loc, "detail": f"repeats row {(1 << LOC_SHIFT) | 2} (kept)"}],
    )
    report.record("null_id", 1, [{"row": 7, "detail": "ledger_id is null"}])
    _locate_examples(report, {0: 10, 1: 20}, ("a.csv", "b.csv"))
    duplicate = report.examples["duplicate"][0]
    assert duplicate == {
        "row": 14,
        "detail": "repeats row 12 (kept)",
        "file": "b.csv",
        "file_row": 4,
    }
    assert report.examples["null_id"][0] == {
        "row": 7,
        "detail": "ledger_id is null",
        "file": "a.csv",
        "file_row": 7,
    }


@pytest.mark.parametrize(("ci", "outcome"), [("", "1 skipped"), ("1", "1 error")])
def test_the_spark_fixture_skips_without_java_but_fails_in_ci(
    tmp_path: Path, ci: str, outcome: str
) -> None:
    """The ``spark`` fixture of tests/conftest.py, in a pytest run that finds no Java."""
    (tmp_path / "no_java.py").write_text(
        "import delayindex.spark.session as s\ns._JVM_DIRS = ()\ns.find_java_home.cache_clear()\n"
    )
    env = {k: v for k, v in os.environ.items() if k not in ("JAVA_HOME", "CI")}
    env.update(PATH=str(tmp_path), PYTHONPATH=os.pathsep.join([str(tmp_path), *sys.path]))
    if ci:
        env["CI"] = ci
    test = "tests/test_spark_rebuild.py::test_strict_fails_on_rejected_rows_before_writing"
    root = Path(__file__).resolve().parents[1]
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no_java", "-p", "no:cacheprovider", "-q", test],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert outcome in done.stdout, done.stdout + done.stderr
    if ci:
        assert "Spark tests must run in CI" in done.stdout
    else:
        assert "Spark unavailable" in done.stdout or "SKIPPED" in done.stdout


# -- the scan's ledger ranges (no shuffle): planned from the Parquet footers alone ---------------


def _parquet(path: Path, ledgers: list[Any], row_group_size: int, **extra: Any) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    n = len(ledgers)
    table = pa.table(
        {
            "ledger_id": pa.array(ledgers, pa.int64()),
            "entry_id": pa.array(range(n), pa.int64()),
            "deliver_at": pa.array([-1] * n, pa.int64()),
            **extra,
        }
    )
    pq.write_table(table, path, row_group_size=row_group_size)
    return path


def test_slices_cover_every_ledger_once_and_balance_the_rows(tmp_path: Path) -> None:
    # 1000 rows, 100 ledgers:
    ledgers: list[int | None] = [lg for lg in range(1, 101) for _ in range(10)]
    ledgers[3] = None  # a null id: slice 0 takes it
    dump = _parquet(tmp_path / "d.parquet", ledgers, row_group_size=64)
    source = _resolve_dump(dump, None)
    groups = _sorted_groups(source)
    assert groups is not None and len(groups) == 16
    assert scans_without_shuffle(dump)
    for partitions in (1, 2, 3, 7, 40):
        slices = plan_slices(groups, partitions)
        assert len(slices) == partitions
        assert [s.nulls for s in slices] == [True] + [False] * (partitions - 1)
        owners = {lg: [k for k, s in enumerate(slices) if _owns(s, lg)] for lg in range(102)}
        assert all(len(found) == 1 for found in owners.values())  # every id, exactly once
        for k, s in enumerate(slices):  # each reads the row groups that may hold its rows
            for g in groups:
                assert g.low is not None and g.high is not None
                holds = any(_owns(s, lg) for lg in range(g.low, g.high + 1))
                assert (g in s.groups) == (holds or (k == 0 and g.nulls))
        read = [read_slice(source.files, s) for s in slices]  # what the tasks read
        locs = sorted(loc for table in read for loc in table.column("loc").to_pylist())
        assert locs == list(range(1000))  # every row, once: the null one too
        assert read[0].column("ledger_id").null_count == 1
        if partitions <= 7:  # rows per slice within a row group of the even share
            shares = [sum(10 for lg in range(1, 101) if _owns(s, lg)) for s in slices]
            assert max(shares) - min(shares) <= 2 * 64, shares


def _owns(share: Any, ledger: int) -> bool:
    return (share.low is None or ledger >= share.low) and (
        share.high is None or ledger < share.high
    )


def test_dumps_that_need_the_shuffle_are_recognised(tmp_path: Path) -> None:
    import pyarrow as pa

    # Row groups whose ledger ranges overlap: a task per range would read most of the dump.
    shuffled = _parquet(tmp_path / "shuffled.parquet", [1, 9, 2, 8, 3, 7] * 10, 6)
    assert not scans_without_shuffle(shuffled)
    # A ledger shared by two row groups at their edge is fine.
    touching = _parquet(tmp_path / "touching.parquet", [1, 1, 2, 2, 2, 3], 3)
    assert scans_without_shuffle(touching)
    # Columns Spark does not read as integers go file by file (then shuffled).
    text = pa.array(["x"] * 6)
    assert not scans_without_shuffle(
        _parquet(tmp_path / "t.parquet", [1] * 6, 3, publish_time=text)
    )
    big = pa.array([2**63] * 6, pa.uint64())
    assert not scans_without_shuffle(_parquet(tmp_path / "u.parquet", [1] * 6, 3, publish_time=big))
    (tmp_path / "short").mkdir()
    pa_table = pa.table({"ledger_id": pa.array([1], pa.int64())})
    import pyarrow.parquet as pq

    pq.write_table(pa_table, tmp_path / "short" / "p.parquet")
    assert not scans_without_shuffle(tmp_path / "short")  # the Spark read names the column
    assert _sorted_groups(_Dump("hdfs://x/d.parquet", "parquet", ("hdfs://x/d.parquet",),
                                ("hdfs://x/d.parquet",), 0)) is None  # fmt: skip


def test_the_class_archive_follows_its_environment_variable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for off in ("", "off", " OFF "):
        monkeypatch.setenv(session.CLASS_ARCHIVE_ENV, off)
        assert session.default_class_archive() is None
    monkeypatch.delenv(session.CLASS_ARCHIVE_ENV)
    assert session.default_class_archive() is None  # opt-in: nothing written unasked
    monkeypatch.setenv(session.CLASS_ARCHIVE_ENV, str(tmp_path / "a.jsa"))
    assert session.default_class_archive() == tmp_path / "a.jsa"
    monkeypatch.setenv(session.CLASS_ARCHIVE_ENV, " On ")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    found = session.default_class_archive()
    if session.find_java_home() is not None:  # named after this Java and this pyspark
        assert found is not None and found.parent == tmp_path / "cache" / "delayindex"
        assert found.name.startswith("spark-classes-") and found.suffix == ".jsa"
        assert session.default_class_archive() == found


def test_arrow_buffers_to_and_from_numpy_without_pandas() -> None:
    import pyarrow as pa

    from delayindex.spark.arrowbuf import int64_array, int64s, int64s_or, string_array

    gappy = pa.chunked_array(
        [pa.array([1, None, 3], pa.int64()).slice(1), pa.array([4, None], pa.int64())]
    )
    assert int64s_or(gappy, -1).tolist() == [-1, 3, 4, -1]
    whole = pa.chunked_array([pa.array([7, 8, 9], pa.int64()).slice(1), pa.array([10], pa.int64())])
    assert int64s(whole).tolist() == [8, 9, 10] and int64s(whole.chunk(0)).tolist() == [8, 9]
    assert int64s(pa.chunked_array([], pa.int64())).tolist() == []
    with pytest.raises(ValueError, match="nulls"):
        int64s(gappy)
    assert int64_array([5, -6]).to_pylist() == [5, -6]
    assert string_array(["a", "", "héllo"]).to_pylist() == ["a", "", "héllo"]
