"""The Spark rebuild (``delayindex.spark``) against the single-process reference.

One SparkSession serves every test (the ``spark`` fixture). The reference is
``rebuild_local(read_dump(dump))``: the Spark job must publish the same bucket ranges, snapshots
whose decoded content is identical, and count rejected rows exactly as ``read_dump`` does (with
the same examples and row numbers) for every dump format and each of its read paths (by
ledger range without a shuffle, read by Spark then shuffled, file by file then shuffled). The
two-phase protocol is exercised with failures injected after the reservation (rolled back at
once) and with a simulated kill (rolled back by the next open), and the CLI round trip checks
the exit codes.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from delayindex import DelayIndex, FileStorage, ManualClock, TrackerConfig
from delayindex.cli import EXIT_CHECK_FAILED, EXIT_OK, EXIT_USAGE, main
from delayindex.dump import DumpColumns, DumpError, generate_dump, read_dump, write_dump
from delayindex.executors import InlineExecutor
from delayindex.garbage import find_garbage
from delayindex.rebuild import plan_buckets, rebuild_local, tracked_mask
from delayindex.spark import DumpRebuildReport, rebuild, scans_without_shuffle, verify
from delayindex.storage import Catalog

pytestmark = pytest.mark.spark

NAME = "topic"
HOUR = 3_600_000
#: Small buckets and segments, so that a few thousand rows make many of each.
CONFIG = TrackerConfig(
    min_index_count_per_bucket=300,
    max_num_buckets=0,
    max_indexes_per_segment=50,
    max_time_step_per_segment_ms=30_000,
)


def _now(columns: DumpColumns, after_ms: int = 30_000) -> int:
    """A ``now`` that leaves part of the delayed messages due."""
    assert columns.publish_time is not None
    return int(columns.publish_time[0]) + after_ms


def _snapshots(storage: FileStorage, name: str = NAME) -> list[tuple[Any, ...]]:
    """Every live bucket's range, metadata and fully decoded segments, in ledger order."""
    out = []
    for b in storage.read_manifest(name).buckets:
        metadata = storage.get_metadata(b.snapshot_id)
        t, lg, en = storage.get_segment_arrays(b.snapshot_id, 1, metadata.num_segments)
        out.append(
            (b.start_ledger, b.end_ledger, b.num_messages, b.num_segments, b.snapshot_bytes,
             metadata, t.tolist(), lg.tolist(), en.tolist())
        )  # fmt: skip
    return out


def _content(snapshot: tuple[Any, ...]) -> tuple[Any, ...]:
    """A :func:`_snapshots` row without the object's byte size."""
    return snapshot[:4] + snapshot[5:]


def _assert_same_index(spark_store: FileStorage, local_store: FileStorage) -> None:
    got, want = _snapshots(spark_store), _snapshots(local_store)
    assert [g[:5] for g in got] == [w[:5] for w in want]
    assert got == want  # metadata (bitmaps, times, counts) and every index, in order
    assert (
        spark_store.read_manifest(NAME).mark_delete == local_store.read_manifest(NAME).mark_delete
    )


def _no_leftovers(storage: FileStorage) -> None:
    """No intents, no orphans (grace 0), no scratch files, one object per live bucket."""
    manifest = storage.read_manifest(NAME)
    assert manifest.intents == ()
    garbage = find_garbage(storage, now_ms=2**62, grace_ms=0)
    assert garbage.orphans == () or list(garbage.orphans) == []
    assert len(storage.list_objects()) == len(manifest.buckets)
    scratch = storage.root / "tmp" / "rebuild" / NAME
    assert not scratch.exists() or list(scratch.iterdir()) == []


# -- equivalence with the single-process rebuild --------------------------------------------------


#: Case name: (generator arguments, config changes, mark-delete position, dump file name).
CASES: dict[str, tuple[dict[str, Any], dict[str, Any], tuple[int, int] | None, str]] = {
    # A single Parquet file, realistic delays, merging on, no mark.
    "parquet-realistic-merged": (
        {"n": 12_000, "entries_per_ledger": 150, "seed": 11},
        {"max_num_buckets": 6},
        None,
        "dump.parquet",
    ),
    # A directory of Parquet parts, a midnight burst (exact ties), a mark, strict cutoff.
    "parts-midnight-mark-strict": (
        {"n": 10_000, "entries_per_ledger": 90, "seed": 12, "delay_mix": "midnight-burst"},
        {"strict": True},
        (30, 40),
        "parts",
    ),
}


def _write(path: Path, columns: DumpColumns, parts: int = 1) -> Path:
    """The dump as one file, or (``parts > 1``) a directory of Parquet part files."""
    if parts == 1:
        return write_dump(path, columns)
    path.mkdir()
    bounds = np.linspace(0, len(columns), parts + 1).astype(int)
    for i in range(parts):
        write_dump(path / f"part-{i:05d}.parquet", columns.take(slice(bounds[i], bounds[i + 1])))
    return path


@pytest.mark.parametrize("case", sorted(CASES))
def test_spark_rebuild_equals_the_local_rebuild(spark: Any, tmp_path: Path, case: str) -> None:
    gen, settings, mark, where = CASES[case]
    config = CONFIG.replace(**settings)
    columns = generate_dump(**gen)
    now = _now(columns)
    dump = _write(tmp_path / where, columns, parts=1 if where.endswith(".parquet") else 3)

    report = rebuild(spark, dump, tmp_path / "spark", NAME, config, now, mark)
    clean, rejects = read_dump(dump)
    local = FileStorage(tmp_path / "local")
    expected = rebuild_local(clean, local, NAME, config, now_ms=now, mark_delete=mark)

    assert isinstance(report, DumpRebuildReport)
    assert report.ranges == expected.ranges
    assert report.planned_buckets >= 10  # many buckets, or the comparison proves little
    assert len(report.ranges) == min(report.planned_buckets, config.max_num_buckets or 10**9) or (
        len(report.ranges) <= config.max_num_buckets
    )
    for field in ("rows", "tracked", "not_delayed", "due", "acked", "planned_buckets",
                  "cutoff_ms", "mark_delete"):  # fmt: skip
        assert getattr(report, field) == getattr(expected, field), field
    assert report.rejects.to_json() == rejects.to_json()
    assert report.tracked == int(np.count_nonzero(
        tracked_mask(clean, now_ms=now, config=config, mark_delete=mark)
    ))  # fmt: skip
    assert set(report.phases) == {"scan", "plan", "build", "publish"}
    spark_store = FileStorage(tmp_path / "spark")
    _assert_same_index(spark_store, local)
    _no_leftovers(spark_store)


def _drain(storage: FileStorage, config: TrackerConfig, now: int, schedule: list[int]) -> list[Any]:
    clock = ManualClock(now)
    index = DelayIndex.open(storage, NAME, config, clock=clock, executor=InlineExecutor())
    out = []
    try:
        for t in schedule:
            clock.set(t)
            while got := index.poll(37):
                out.append((t, tuple(got)))
        assert len(index) == 0
    finally:
        index.close()
    return out


def test_spark_rebuild_delivers_what_online_ingestion_delivers(spark: Any, tmp_path: Path) -> None:
    """Issue 6's equivalence: online ingestion of a dump and the Spark rebuild of it give the
    same buckets and, reopened, the same full delivery sequence."""
    config = CONFIG
    columns = generate_dump(9000, entries_per_ledger=60, seed=21)
    now = _now(columns)
    mask = tracked_mask(columns, now_ms=now, config=config)
    # Online, the last bucket is sealed by a newer ledger only if it holds the minimum: drop
    # the last planned bucket's ledgers when it is smaller.
    ledgers, counts = np.unique(columns.ledger_ids[mask], return_counts=True)
    start, _ = plan_buckets(ledgers, counts, config)[-1]
    if counts[ledgers >= start].sum() < config.min_index_count_per_bucket:
        columns = columns.take(columns.ledger_ids < start)
    full = int(columns.ledger_ids.max())
    dump = write_dump(tmp_path / "dump.parquet", columns)

    online = FileStorage(tmp_path / "online")
    index = DelayIndex.open(online, NAME, config, clock=ManualClock(now), executor=InlineExecutor())
    index.add_many(columns.ledger_ids, columns.entry_ids, columns.deliver_at)
    assert index.add(full + 1, 0, now + 1000 * HOUR)  # a newer ledger seals the last bucket
    index.close()
    report = rebuild(spark, dump, tmp_path / "spark", NAME, config, now)

    online_ranges = [(b.start_ledger, b.end_ledger) for b in online.read_manifest(NAME).buckets]
    assert report.ranges == online_ranges
    assert len(online_ranges) >= 6
    times = np.sort(columns.deliver_at[tracked_mask(columns, now_ms=now, config=config)])
    schedule = sorted({*np.quantile(times, np.linspace(0, 1, 30)).astype(np.int64).tolist()})
    rebuilt = _drain(FileStorage(tmp_path / "spark"), config, now, schedule)
    assert rebuilt == _drain(online, config, now, schedule)
    assert sum(len(batch) for _, batch in rebuilt) == report.tracked


# -- rejected rows: counted (and exemplified) exactly as read_dump does ---------------------------


def _dirty_rows(n: int = 4000) -> tuple[list[Any], list[Any], list[Any]]:
    """A generated dump with one of every problem seeded in (some across part boundaries)."""
    columns = generate_dump(n, entries_per_ledger=100, seed=31)
    ledgers: list[Any] = columns.ledger_ids.tolist()
    entries: list[Any] = columns.entry_ids.tolist()
    deliver: list[Any] = [None if d < 0 else d for d in columns.deliver_at.tolist()]
    ledgers[5] = None  # null_id
    entries[7] = -3  # negative_id
    entries[9] = 2**32 + 1  # entry_id_too_large
    deliver[50] = -5  # not delayed (normalized to -1, not rejected)
    ledgers[100], entries[100], deliver[100] = ledgers[200], entries[200], deliver[200]  # dup
    conflict = deliver[400] if deliver[400] is not None else 0
    ledgers[300], entries[300], deliver[300] = ledgers[400], entries[400], conflict + 5
    last = n - 10  # repeats row 10, in another part file
    ledgers[last], entries[last], deliver[last] = ledgers[10], entries[10], deliver[10]
    return ledgers, entries, deliver


def _write_parts(root: Path, fmt: str, rows: tuple[list[Any], list[Any], list[Any]]) -> Path:
    """Two part files of ``fmt``; the text formats get a wrong-typed row each."""
    ledgers, entries, deliver = rows
    root.mkdir()
    half = len(ledgers) // 2
    for i, part in enumerate((slice(0, half), slice(half, None))):
        lg, en, dl = ledgers[part], entries[part], deliver[part]
        path = root / f"part-{i:05d}"
        if fmt == "parquet":
            table = pa.table(
                {"ledger_id": pa.array(lg, pa.int64()), "entry_id": pa.array(en, pa.int64()),
                 "deliver_at": pa.array(dl, pa.int64())}
            )  # fmt: skip
            pq.write_table(table, f"{path}.parquet")
        elif fmt == "parquet-strings":  # not integer columns: read file by file
            text = [None if x is None else (f" {x}.0" if j % 7 == 0 else str(x))
                    for j, x in enumerate(lg)]  # fmt: skip
            table = pa.table(
                {"ledger_id": pa.array(text, pa.string()), "entry_id": pa.array(en, pa.int64()),
                 "deliver_at": pa.array(dl, pa.int64())}
            )  # fmt: skip
            pq.write_table(table, f"{path}.parquet")
        elif fmt == "jsonl":
            with open(f"{path}.jsonl", "w") as f:
                for row in zip(lg, en, dl, strict=True):
                    f.write(json.dumps(dict(zip(("ledger_id", "entry_id", "deliver_at"), row,
                                                strict=True))) + "\n")  # fmt: skip
                f.write('{"ledger_id": "abc", "entry_id": 1.5, "deliver_at": true}\n')
        else:
            with open(f"{path}.csv", "w") as f:
                f.write("ledger_id,entry_id,deliver_at\n")
                for a, b, c in zip(lg, en, dl, strict=True):
                    f.write(f"{'null' if a is None else a},{b},{'' if c is None else c}\n")
                f.write("x,2.5,7\n")
    return root


@pytest.mark.parametrize("fmt", ["parquet", "parquet-strings", "jsonl", "csv"])
def test_rejects_are_counted_as_read_dump_counts_them(spark: Any, tmp_path: Path, fmt: str) -> None:
    dump = _write_parts(tmp_path / "dump", fmt, _dirty_rows())
    # A repeat of an early row in the second part: its ledger ranges overlap, so the scan
    # shuffles (read by Spark, or file by file); the ledger-range scan has its own test.
    assert not scans_without_shuffle(dump)
    clean, rejects = read_dump(dump)
    now = _now(generate_dump(10, seed=31))
    report = rebuild(spark, dump, tmp_path / "store", NAME, CONFIG, now)

    assert report.rejects.to_json() == rejects.to_json()  # counts, examples, row numbers
    kinds = {k for k, v in rejects.counts.items() if v}
    expected = {"null_id", "negative_id", "entry_id_too_large", "conflicting_duplicate",
                "duplicate"}  # fmt: skip
    assert kinds == expected | ({"wrong_type"} if fmt in ("jsonl", "csv") else set())
    local = FileStorage(tmp_path / "local")
    rebuild_local(clean, local, NAME, CONFIG, now_ms=now)
    _assert_same_index(FileStorage(tmp_path / "store"), local)


@pytest.mark.parametrize("partitions", [1, 3, 8])
def test_a_dump_in_ledger_order_is_scanned_by_ledger_range_with_the_same_result(
    spark: Any, tmp_path: Path, partitions: int
) -> None:
    """The scan without a shuffle (row groups that do not overlap in ledger ids): the same
    rejects, examples and index as read_dump and the local rebuild, whatever the tasks."""
    ledgers, entries, deliver = _dirty_rows()
    order = sorted(range(len(ledgers)), key=lambda i: (ledgers[i] or 0, i))  # nulls first
    root = tmp_path / "dump"
    root.mkdir()
    half = len(order) // 2
    for i, part in enumerate((order[:half], order[half:])):
        table = pa.table(
            {"ledger_id": pa.array([ledgers[j] for j in part], pa.int64()),
             "entry_id": pa.array([entries[j] for j in part], pa.int64()),
             "deliver_at": pa.array([deliver[j] for j in part], pa.int64())}
        )  # fmt: skip
        pq.write_table(table, root / f"part-{i:05d}.parquet", row_group_size=300)
    assert scans_without_shuffle(root)
    clean, rejects = read_dump(root)
    now = _now(generate_dump(10, seed=31))
    report = rebuild(spark, root, tmp_path / "store", NAME, CONFIG, now, partitions=partitions)

    assert report.partitions == partitions
    assert report.rejects.to_json() == rejects.to_json()  # counts, examples, row numbers
    assert {k for k, v in rejects.counts.items() if v} == {
        "null_id", "negative_id", "entry_id_too_large", "conflicting_duplicate", "duplicate"
    }  # fmt: skip
    local = FileStorage(tmp_path / "local")
    expected = rebuild_local(clean, local, NAME, CONFIG, now_ms=now)
    assert report.ranges == expected.ranges and report.tracked == expected.tracked
    spark_store = FileStorage(tmp_path / "store")
    _assert_same_index(spark_store, local)
    _no_leftovers(spark_store)


def test_strict_fails_on_rejected_rows_before_writing(spark: Any, tmp_path: Path) -> None:
    dump = _write_parts(tmp_path / "dump", "parquet", _dirty_rows(2000))
    with pytest.raises(DumpError, match="null_id at row 5") as caught:
        rebuild(spark, dump, tmp_path / "store", NAME, CONFIG, 0, strict=True)
    assert caught.value.report is not None
    assert caught.value.report.counts["negative_id"] == 1
    storage = FileStorage(tmp_path / "store")
    assert storage.list_objects() == []
    assert storage.read_manifest(NAME).version == 0  # the manifest was never written


def test_bad_arguments_are_refused_before_anything_runs(spark: Any, tmp_path: Path) -> None:
    dump = write_dump(tmp_path / "d.parquet", generate_dump(100))
    store = tmp_path / "store"
    with pytest.raises(ValueError, match="index name"):
        rebuild(spark, dump, store, "bad/name")
    with pytest.raises(TypeError, match="mark_delete"):
        rebuild(spark, dump, store, NAME, mark_delete=(1, "2"))  # type: ignore[arg-type]
    with pytest.raises(FileNotFoundError):
        rebuild(spark, tmp_path / "missing.parquet", store, NAME)
    pq.write_table(pa.table({"ledger_id": [1], "entry_id": [2]}), tmp_path / "short.parquet")
    with pytest.raises(DumpError, match="missing column"):
        rebuild(spark, tmp_path / "short.parquet", store, NAME)
    assert not (store / "manifests" / f"{NAME}.manifest").exists()


# -- failures, kills, re-runs ---------------------------------------------------------------------


class Killed(BaseException):
    """A simulated kill: not an Exception, so no cleanup handler runs."""


@pytest.fixture
def first_build(spark: Any, tmp_path: Path) -> tuple[Path, Path, int, list[Any]]:
    """A dump and a store holding its rebuild (the 'old index' later runs must not lose)."""
    columns = generate_dump(6000, entries_per_ledger=80, seed=41)
    now = _now(columns)
    dump = write_dump(tmp_path / "dump.parquet", columns)
    store = tmp_path / "store"
    rebuild(spark, dump, store, NAME, CONFIG, now)
    return dump, store, now, _snapshots(FileStorage(store))


@pytest.mark.parametrize("step", ["reserve.committed", "rebuild.objects_written"])
def test_a_failure_after_the_reservation_rolls_back_at_once(
    spark: Any, first_build: Any, step: str
) -> None:
    dump, store, now, before = first_build

    def fail(at: str) -> None:
        if at == step:
            raise RuntimeError(f"injected at {at}")

    with pytest.raises(RuntimeError, match="injected"):
        rebuild(spark, dump, store, NAME, CONFIG, now + HOUR, crash_hook=fail)
    storage = FileStorage(store)
    _no_leftovers(storage)  # rolled back before returning: no intents, no orphans
    assert _snapshots(storage) == before  # the old index is untouched


def test_a_killed_rebuild_is_rolled_back_by_the_next_open(spark: Any, first_build: Any) -> None:
    dump, store, now, before = first_build

    def kill(at: str) -> None:
        if at == "rebuild.objects_written":
            raise Killed(at)

    with pytest.raises(Killed):
        rebuild(spark, dump, store, NAME, CONFIG, now + HOUR, crash_hook=kill)
    storage = FileStorage(store)
    left = storage.read_manifest(NAME)
    assert {i.kind for i in left.intents} == {"create"}  # reserved and written, never published
    assert len(storage.list_objects()) == len(before) + len(left.intents)
    Catalog.open(storage, NAME).close()  # what DelayIndex.open and gc do first
    _no_leftovers(storage)
    assert _snapshots(storage) == before


def test_a_rerun_is_idempotent(spark: Any, first_build: Any) -> None:
    dump, store, now, before = first_build
    storage = FileStorage(store)
    old_ids = {b.snapshot_id for b in storage.read_manifest(NAME).buckets}
    report = rebuild(spark, dump, store, NAME, CONFIG, now)
    assert set(report.replaced) == old_ids
    # Same ranges, same contents. Not the same bytes: the new objects' origin (the manifest
    # generation of their commit) is compressed with their columns, so a size may differ by a
    # few bytes.
    assert [_content(a) for a in _snapshots(storage)] == [_content(b) for b in before]
    assert not old_ids & {b.snapshot_id for b in storage.read_manifest(NAME).buckets}
    _no_leftovers(storage)


def test_a_rebuild_where_everything_is_due_empties_the_index(spark: Any, first_build: Any) -> None:
    dump, store, now, before = first_build
    report = rebuild(spark, dump, store, NAME, CONFIG, now + 30 * 24 * HOUR)
    assert report.tracked == 0 and report.buckets == () and len(report.replaced) == len(before)
    storage = FileStorage(store)
    assert storage.read_manifest(NAME).buckets == ()
    _no_leftovers(storage)


def test_verify_with_spark_finds_what_verify_in_process_finds(spark: Any, first_build: Any) -> None:
    dump, store, now, _ = first_build
    assert verify(spark, dump, store, NAME, CONFIG, now).ok
    later = now + 10 * 60_000  # messages due since the rebuild are extra positions now
    with_spark = verify(spark, dump, store, NAME, CONFIG, later)
    in_process = verify(None, dump, store, NAME, CONFIG, later)
    assert not with_spark.ok and with_spark.kinds() == {"extra_position"}
    assert with_spark.findings == in_process.findings
    assert (with_spark.expected, with_spark.found) == (in_process.expected, in_process.found)
    assert with_spark.rejects.to_json() == in_process.rejects.to_json()


def test_an_executor_whose_reservation_is_gone_leaves_no_object(tmp_path: Path) -> None:
    from delayindex.rebuild import build_bucket
    from delayindex.spark.job import _write_reserved

    storage = FileStorage(tmp_path / "store")
    catalog = Catalog.open(storage, NAME)
    (kept, gone) = catalog.reserve_creates([(1, 1), (2, 2)])
    catalog.retry_pending_deletes(force=True)  # rolls back both reservations
    catalog.close()
    built = build_bucket(np.array([5]), np.array([2]), np.array([0]), 2, 2, CONFIG)
    assert _write_reserved(storage, NAME, gone, *built) is None
    assert storage.list_objects() == []
    assert kept != gone


# -- the CLI ---------------------------------------------------------------------------------------


def test_cli_rebuild_then_verify_round_trip(
    spark: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    columns = generate_dump(3000, entries_per_ledger=50, seed=51)
    now = _now(columns)
    dump = write_dump(tmp_path / "dump.parquet", columns)
    store, report_file = tmp_path / "store", tmp_path / "out" / "verify.json"
    common = ["--store", str(store), "--name", NAME, "--now-ms", str(now), "--mark-delete",
              "20:5", "--no-progress"]  # fmt: skip
    config = ["--min-index-count-per-bucket", "200", "--max-num-buckets", "0"]
    assert main(["rebuild", str(dump), *common, *config, "--json"]) == EXIT_OK
    built = json.loads(capsys.readouterr().out)
    assert built["command"] == "rebuild" and built["mark_delete"] == [20, 5]
    assert len(built["buckets"]) >= 3 and built["rejects"]["ok"]

    assert main(["verify", str(dump), *common, "--report", str(report_file)]) == EXIT_OK
    out = capsys.readouterr().out
    assert "ok:" in out and f"{built['tracked']:,}" in out
    saved = json.loads(report_file.read_text())
    assert saved["ok"] and saved["exit_code"] == EXIT_OK and saved["found"] == built["tracked"]

    # A deleted snapshot is a mismatch: exit 1, named in the report.
    os.remove(FileStorage(store).object_path(built["buckets"][1]["snapshot_id"]))
    code = main(["verify", str(dump), *common, "--no-spark", "--json"])
    assert code == EXIT_CHECK_FAILED
    payload = json.loads(capsys.readouterr().out)
    assert "missing_snapshot" in payload["counts"] and payload["exit_code"] == EXIT_CHECK_FAILED

    # Usage errors: a missing dump, a missing store, a bad position.
    assert main(["rebuild", str(tmp_path / "nope.parquet"), *common]) == EXIT_USAGE
    assert main(["verify", str(dump), *common[:1], str(tmp_path / "nostore"), *common[2:]]) == (
        EXIT_USAGE
    )
    with pytest.raises(SystemExit) as caught:
        main(["rebuild", str(dump), "--store", str(store), "--name", NAME, "--mark-delete", "7"])
    assert caught.value.code == EXIT_USAGE
    capsys.readouterr()


def test_cli_rebuild_strict_exits_1_on_rejected_rows(
    spark: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    dump = _write_parts(tmp_path / "dump", "csv", _dirty_rows(1000))
    args = ["rebuild", str(dump), "--store", str(tmp_path / "s"), "--name", NAME, "--strict"]
    assert main([*args, "--no-progress"]) == EXIT_CHECK_FAILED
    err = capsys.readouterr().err
    assert "null_id" in err and "--strict" in err


# -- a shared index -------------------------------------------------------------------------------

SHARED_SUBS = {"sub-b": (40, 9), "sub-a": (25, 3)}


def test_spark_shared_rebuild_equals_the_local_one_and_verifies_per_subscription(
    spark: Any, tmp_path: Path
) -> None:
    columns = generate_dump(8000, entries_per_ledger=60, seed=61)
    now = _now(columns)
    dump = write_dump(tmp_path / "dump.parquet", columns)
    report = rebuild(spark, dump, tmp_path / "spark", NAME, CONFIG, now, subscriptions=SHARED_SUBS)
    clean, _ = read_dump(dump)
    local = FileStorage(tmp_path / "local")
    expected = rebuild_local(clean, local, NAME, CONFIG, now_ms=now, subscriptions=SHARED_SUBS)
    assert report.mark_delete == expected.mark_delete == (25, 3)  # the lowest mark
    assert report.subscriptions == expected.subscriptions
    assert [s.name for s in report.subscriptions] == ["sub-a", "sub-b"]
    assert (report.ranges, report.tracked, report.acked) == (
        expected.ranges, expected.tracked, expected.acked,
    )  # fmt: skip
    spark_store = FileStorage(tmp_path / "spark")
    _assert_same_index(spark_store, local)
    assert spark_store.read_manifest(NAME).subscriptions == report.subscriptions
    _no_leftovers(spark_store)

    checked = verify(spark, dump, tmp_path / "spark", NAME, CONFIG, now, subscriptions=SHARED_SUBS)
    assert checked.ok, checked.findings
    by_name = {c.name: c for c in checked.subscriptions}
    assert by_name["sub-a"].expected == by_name["sub-a"].found == report.tracked
    assert 0 < by_name["sub-b"].expected == by_name["sub-b"].found < report.tracked

    # A snapshot above both marks goes missing: each subscription names its lost positions.
    victim = spark_store.read_manifest(NAME).buckets[-1]
    os.remove(spark_store.object_path(victim.snapshot_id))
    with_spark = verify(
        spark, dump, tmp_path / "spark", NAME, CONFIG, now, subscriptions=SHARED_SUBS
    )
    in_process = verify(None, dump, tmp_path / "spark", NAME, CONFIG, now,
                        subscriptions=SHARED_SUBS)  # fmt: skip
    assert with_spark.findings == in_process.findings
    missing = {f.subscription: f.count for f in with_spark.findings
               if f.kind == "missing_position"}  # fmt: skip
    assert missing == {"sub-a": victim.num_messages, "sub-b": victim.num_messages}
    assert [c.ok for c in with_spark.subscriptions] == [False, False]


def test_cli_rebuild_and_verify_a_shared_index(
    spark: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    columns = generate_dump(3000, entries_per_ledger=50, seed=52)
    now = _now(columns)
    dump = write_dump(tmp_path / "dump.parquet", columns)
    store = tmp_path / "store"
    common = ["--store", str(store), "--name", NAME, "--now-ms", str(now), "--no-progress"]
    subs = ["--subscription", "b=30:1", "--subscription", "a=20:5"]
    config = ["--min-index-count-per-bucket", "200", "--max-num-buckets", "0"]
    assert main(["rebuild", str(dump), *common, *subs, *config, "--json"]) == EXIT_OK
    built = json.loads(capsys.readouterr().out)
    assert built["mark_delete"] == [20, 5]
    assert built["subscriptions"] == [
        {"name": "a", "mark_delete": [20, 5]}, {"name": "b", "mark_delete": [30, 1]},
    ]  # fmt: skip
    assert main(["verify", str(dump), *common, *subs, "--no-spark"]) == EXIT_OK
    out = capsys.readouterr().out
    assert "subscriptions" in out and "mismatch" not in out
    # The topic's mark alone is not the shared index: the records are a mismatch.
    assert main(["verify", str(dump), *common, "--mark-delete", "20:5", "--json"]) == (
        EXIT_CHECK_FAILED
    )
    payload = json.loads(capsys.readouterr().out)
    assert payload["counts"] == {"manifest_mismatch": 1}
    # A subscription without a mark makes the topic keep everything; the human report says so.
    assert main(["rebuild", str(dump), *common, "--subscription", "a", *subs[:2]]) == EXIT_OK
    out = capsys.readouterr().out
    assert "mark-delete (lowest subscription)" in out
    assert "--subscription a --subscription b=30:1" in out
    for bad in (
        [*subs, "--mark-delete", "1:1"],
        ["--subscription", "a=1:1", "--subscription", "a=2:2"],
    ):
        assert main(["rebuild", str(dump), *common, *bad]) == EXIT_USAGE
        assert main(["verify", str(dump), *common, *bad]) == EXIT_USAGE
    with pytest.raises(SystemExit) as caught:
        main(["rebuild", str(dump), *common, "--subscription", "a=7"])
    assert caught.value.code == EXIT_USAGE
    capsys.readouterr()
