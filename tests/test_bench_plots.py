"""Tests of ``benchmarks/plots.py`` on small synthetic pytest-benchmark JSON files.

The data extraction (keys read defensively, later files winning, rates, operation order) is
tested without matplotlib; drawing tests need it (the ``bench`` extra) and skip without it,
except under ``CI``, where they fail: CI must draw the plots.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

PLOTS_PATH = Path(__file__).resolve().parents[1] / "benchmarks" / "plots.py"
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def _load_plots() -> ModuleType:
    spec = importlib.util.spec_from_file_location("delayindex_bench_plots", PLOTS_PATH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses resolve their module by name
    spec.loader.exec_module(module)
    return module


plots = _load_plots()


@pytest.fixture
def matplotlib_available() -> None:
    """Skip (fail under CI) when matplotlib is not installed."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        if os.environ.get("CI"):
            pytest.fail("matplotlib is required in CI for the plot tests (bench extra)")
        pytest.skip("matplotlib is not installed (bench extra)")


def bench(
    group: str,
    name: str,
    min_s: float,
    extra: dict[str, Any] | None = None,
    params: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """One record shaped like pytest-benchmark's ``--benchmark-json`` output."""
    return {
        "group": group,
        "name": name,
        "fullname": f"benchmarks/bench_x.py::{name}",
        "params": params,
        "extra_info": extra or {},
        "stats": {"min": min_s, "max": min_s * 1.1, "mean": min_s * 1.05, "rounds": 3},
    }


def write_run(path: Path, benchmarks: list[Any]) -> Path:
    path.write_text(json.dumps({"machine_info": {}, "benchmarks": benchmarks}), encoding="utf-8")
    return path


def memory(n_label: str, label: str, rss: float, **extra: Any) -> dict[str, Any]:
    return bench(
        f"memory-{n_label}",
        f"test_memory[{label}]",
        2.0,
        {"label": label, "rss_bytes_per_msg": rss, **extra},
    )


def tracker(op: str, size: int, kind: str, min_s: float, **extra: Any) -> dict[str, Any]:
    group = f"tracker-{op}-{plots.size_text(size)}"
    return bench(
        group,
        f"test_{op}[{kind}]",
        min_s,
        {"label": f"{kind} label", **extra},
        {"size": size, "kind": kind},
    )


def full_run() -> list[dict[str, Any]]:
    """Memory at two sizes, four tracker ops at 1e3, a Spark group and an unrelated group."""
    records = [
        memory("1e5", "heapq+set", 230.0),
        memory("1e6", "heapq+set", 254.0),
        memory("1e5", "DelayIndex add_many", 24.0),
        memory("1e6", "DelayIndex add_many", 15.0),
    ]
    for op in ("add", "add-many", "poll", "contains"):
        for kind, min_s in (("delay_index", 0.001), ("heapq", 0.004)):
            records.append(tracker(op, 1000, kind, min_s))
    records += [
        bench(
            "spark-rebuild-1e4",
            "test_rebuild[1e4]",
            0.5,
            {"label": "Spark rebuild", "msgs_per_s": 20_000, "cold_msgs_per_s": 8_000},
            {"size": 10_000},
        ),
        bench(
            "spark-rebuild-1e4",
            "test_open_rebuilt[1e4]",
            0.02,
            {"label": "open of the result"},
            {"size": 10_000},
        ),
        bench("codec-encode-realistic", "test_encode[native]", 0.003, {"label": "native"}),
    ]
    return records


# -- reading ------------------------------------------------------------------------------------


def test_parse_and_format_sizes() -> None:
    assert plots.parse_size("1e6") == 1_000_000
    assert plots.parse_size("250000") == 250_000
    assert plots.parse_size("realistic") is None
    assert plots.parse_size("0") is None
    assert plots.size_text(10_000_000) == "1e7"
    assert plots.size_text(2_500_000) == "2.5e6"
    assert plots.size_text(200) == "200"
    assert plots.rate_text(3_870_000) == "3.87M"
    assert plots.rate_text(250_000) == "250k"


def test_keys_are_read_defensively(tmp_path: Path) -> None:
    run = write_run(
        tmp_path / "run.json",
        [
            # extra_info wins over params and the group's suffix
            bench(
                "tracker-add-1e5",
                "a",
                0.1,
                {"label": "A", "kind": "redis", "size": 7},
                {"size": 100_000, "kind": "heapq"},
            ),
            # params only
            bench("tracker-add-1e5", "b", 0.1, {"label": "B"}, {"size": 100_000, "kind": "heapq"}),
            # the group's suffix; variant parameter as the kind
            bench("memory-1e6", "c", 0.1, {"label": "C"}, {"variant": "in_memory-add"}),
            # no label, no params, no numeric suffix: the name stands in
            bench("codec-encode-realistic", "d", 0.1),
            # no usable time: left out
            bench("tracker-add-1e5", "e", 0.0),
            {"group": "tracker-add-1e5", "name": "f", "stats": None},
            "not a record",
        ],
    )
    records = plots.load_runs([run])
    found = {r.name: (r.kind, r.size, r.label) for r in records}
    assert found == {
        "a": ("redis", 7, "A"),
        "b": ("heapq", 100_000, "B"),
        "c": ("in_memory-add", 1_000_000, "C"),
        "d": ("d", None, "d"),
    }


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (None, "cannot read"),
        ("{not json", "not JSON"),
        (json.dumps({"machine_info": {}}), "no 'benchmarks' list"),
        (json.dumps([1, 2]), "no 'benchmarks' list"),
    ],
)
def test_bad_input_is_named_and_writes_nothing(
    tmp_path: Path, content: str | None, message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    good = write_run(tmp_path / "good.json", full_run())
    bad = tmp_path / "bad.json"
    if content is not None:
        bad.write_text(content, encoding="utf-8")
    with pytest.raises(plots.PlotInputError, match=message) as info:
        plots.load_runs([good, bad])
    assert str(bad) in str(info.value)
    out = tmp_path / "img"
    assert plots.main([str(good), str(bad), "--out", str(out)]) == 2
    assert message in capsys.readouterr().err
    assert not out.exists()


# -- figure data --------------------------------------------------------------------------------


def test_memory_series_sorted_and_later_file_wins(tmp_path: Path) -> None:
    first = write_run(tmp_path / "first.json", full_run())
    second = write_run(
        tmp_path / "second.json",
        [
            memory("1e7", "DelayIndex add_many", 2.1),
            memory("1e6", "DelayIndex add_many", 14.0),
            memory("1e7", "InMemoryTracker add", 27.0),
            bench("memory-1e7", "x", 1.0, {"label": "no figure"}),
            # another set-up's resident memory (bench_shared.py): not a line of this figure
            bench("shared-memory-1e6", "y", 1.0, {"label": "Shared", "rss_bytes_per_msg": 9.0}),
        ],
    )
    series = plots.memory_series(plots.load_runs([first, second]))
    assert series == {
        "heapq+set": [(100_000, 230.0), (1_000_000, 254.0)],
        "DelayIndex add_many": [(100_000, 24.0), (1_000_000, 14.0), (10_000_000, 2.1)],
        "InMemoryTracker add": [(10_000_000, 27.0)],
    }


def test_throughput_rates_order_and_size(tmp_path: Path) -> None:
    run = write_run(
        tmp_path / "run.json",
        [
            tracker("poll", 1000, "heapq", 0.004),
            tracker("poll", 1000, "delay_index", 0.001),
            tracker("add", 1000, "my_struct", 0.002),
            tracker("add", 1000, "delay_index", 0.0005, msgs_per_s=1_234_567),
            tracker("add-many", 1000, "delay_index", 0.0001),
            tracker("zap", 1000, "delay_index", 0.01),
            tracker("tracked-entries", 1000, "delay_index", 0.02),
            tracker("add", 100, "delay_index", 0.00001),
            tracker("contains", 100, "heapq", 0.00002),
        ],
    )
    records = plots.load_runs([run])
    table = plots.throughput_table(records)
    assert table.size == 1000  # the largest by default
    assert table.operations == ["add", "add_many", "poll", "tracked_entries", "zap"]
    assert table.kinds == ["delay_index", "heapq", "my_struct"]
    assert table.names == {
        "delay_index": "DelayIndex",
        "heapq": "heapq+set",
        "my_struct": "my_struct label",
    }
    assert table.rates["add"] == {"delay_index": 1_234_567, "my_struct": pytest.approx(500_000)}
    assert table.rates["poll"] == {
        "heapq": pytest.approx(250_000),
        "delay_index": pytest.approx(1_000_000),
    }
    small = plots.throughput_table(records, 100)
    assert small.operations == ["add", "contains"]
    assert small.rates["contains"] == {"heapq": pytest.approx(5_000_000)}
    assert plots.throughput_table(records, 12345) is None
    assert plots.throughput_table([r for r in records if r.group.startswith("x")]) is None


def test_spark_bars_largest_group_with_rates(tmp_path: Path) -> None:
    run = write_run(
        tmp_path / "run.json",
        [
            *full_run(),
            bench(
                "spark-rebuild-1e5",
                "test_open_rebuilt[1e5]",
                0.1,
                {"label": "open"},
                {"size": 100_000},
            ),  # no rate at 1e5: the 1e4 group is drawn
            bench(
                "spark-rebuild-1e4",
                "test_online[1e4]",
                0.8,
                {"label": "online", "msgs_per_s": 12_500},
                {"size": 10_000},
            ),
        ],
    )
    spark = plots.spark_bars(plots.load_runs([run]))
    assert spark.size == 10_000
    assert spark.bars == [
        ("Spark rebuild, warm (best)", 20_000.0),
        ("Spark rebuild, cold JVM", 8_000.0),
        ("online", 12_500.0),
    ]
    assert spark.notes == ["open of the result: 0.02 s"]


def test_failed_write_keeps_the_old_png(tmp_path: Path) -> None:
    target = tmp_path / "plot.png"
    target.write_bytes(b"old")

    class BrokenFigure:
        def savefig(self, filename: Path, **kwargs: Any) -> None:
            Path(filename).write_bytes(b"partial")
            raise RuntimeError("disk full")

    with pytest.raises(RuntimeError, match="disk full"):
        plots._save(BrokenFigure(), target)
    assert target.read_bytes() == b"old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["plot.png"]


# -- drawing ------------------------------------------------------------------------------------


def _assert_png(path: Path) -> None:
    import matplotlib.image

    assert path.read_bytes()[:8] == PNG_SIGNATURE
    height, width, _ = matplotlib.image.imread(path).shape
    assert height > 200 and width > 400


@pytest.mark.usefixtures("matplotlib_available")
def test_cli_writes_every_png(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    first = write_run(tmp_path / "a.json", full_run())
    second = write_run(tmp_path / "b.json", [memory("1e7", "heapq+set", 251.0)])
    out = tmp_path / "docs" / "img"
    assert plots.main([str(first), str(second), "--out", str(out)]) == 0
    names = ["memory_per_msg.png", "throughput.png", "spark_rebuild.png"]
    assert sorted(p.name for p in out.iterdir()) == sorted(names)
    umask = os.umask(0)
    os.umask(umask)
    for name in names:
        _assert_png(out / name)
        assert (out / name).stat().st_mode & 0o777 == 0o666 & ~umask  # not mkstemp's 0600
    captured = capsys.readouterr()
    assert captured.out.splitlines() == [f"wrote {out / name}" for name in names]
    assert captured.err == ""


@pytest.mark.usefixtures("matplotlib_available")
def test_cli_skips_missing_groups(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = write_run(tmp_path / "run.json", [tracker("add", 1000, "heapq", 0.004)])
    out = tmp_path / "img"
    assert plots.main([str(run), "--out", str(out)]) == 0
    assert [p.name for p in out.iterdir()] == ["throughput.png"]
    _assert_png(out / "throughput.png")
    err = capsys.readouterr().err
    assert "skipped memory_per_msg.png" in err and "skipped spark_rebuild.png" in err


@pytest.mark.usefixtures("matplotlib_available")
def test_cli_nothing_to_plot(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = write_run(tmp_path / "run.json", [tracker("add", 1000, "heapq", 0.004)])
    out = tmp_path / "img"
    assert plots.main([str(run), "--out", str(out), "--size", "1e5"]) == 1
    err = capsys.readouterr().err
    assert "no tracker-<op>-<n> record at size 100000" in err and "nothing to plot" in err
    assert not out.exists()


def test_cli_rejects_a_bad_size(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = write_run(tmp_path / "run.json", full_run())
    with pytest.raises(SystemExit) as info:
        plots.main([str(run), "--out", str(tmp_path / "img"), "--size", "lots"])
    assert info.value.code == 2
    assert "expected a positive size" in capsys.readouterr().err
    assert not (tmp_path / "img").exists()


def test_cli_without_matplotlib(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # makes the import fail
    run = write_run(tmp_path / "run.json", full_run())
    out = tmp_path / "img"
    assert plots.main([str(run), "--out", str(out)]) == 2
    assert "matplotlib is required" in capsys.readouterr().err
    assert not out.exists()
