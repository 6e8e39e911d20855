"""``delayindex bench``: argument parsing, the clear exits when it cannot run, and one end-to-end
run on a tiny stand-in suite (two trivial benchmarks, in a subprocess) that checks the JSON is
written and the table shows each row's ratio to heapq. The real suite is not run here."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import pytest_benchmark  # noqa: F401  (the test extra; the end-to-end runs need it)

from delayindex import cli
from delayindex.cli import EXIT_CHECK_FAILED, EXIT_OK, EXIT_USAGE, build_parser, main

REPO = Path(__file__).resolve().parents[1]


def test_defaults_are_the_quick_tier() -> None:
    args = build_parser().parse_args(["bench"])
    assert (args.command, args.tier, args.json_out) == (
        "bench",
        "quick",
        Path("delayindex-bench.json"),
    )
    assert args.benchmarks_dir is None and args.keyword is None
    assert build_parser().parse_args(["bench", "--quick"]).tier == "quick"


def test_full_tier_and_options() -> None:
    args = build_parser().parse_args(
        ["bench", "--full", "--json-out", "out/run.json", "--benchmarks-dir", "b", "-k", "add"]
    )
    assert (args.tier, args.json_out, args.benchmarks_dir, args.keyword) == (
        "full",
        Path("out/run.json"),
        Path("b"),
        "add",
    )


@pytest.mark.parametrize("argv", [["bench", "--quick", "--full"], ["bench", "--tier", "x"]])
def test_bad_arguments_exit_2(argv: list[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == EXIT_USAGE


def test_default_suite_is_the_checkouts_benchmarks_dir() -> None:
    if Path(cli.__file__).resolve().is_relative_to(REPO / "src"):  # this checkout (editable)
        assert cli.find_benchmarks_dir() == REPO / "benchmarks"
    else:  # an installed wheel ships no benchmarks: a usage error that says what to do
        with pytest.raises(cli._UsageError, match=r"no benchmark suite at .*editable"):
            cli.find_benchmarks_dir()


def test_no_suite_exits_2_with_an_explanation(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["bench", "--benchmarks-dir", str(tmp_path)]) == EXIT_USAGE
    err = capsys.readouterr().err
    assert "no benchmark suite at" in err and "editable" in err
    assert not (tmp_path / "delayindex-bench.json").exists()


def test_missing_pytest_benchmark_exits_2(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    real = importlib.util.find_spec

    def find_spec(name: str, *args: object) -> object:
        return None if name == "pytest_benchmark" else real(name, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)
    assert main(["bench", "--quick"]) == EXIT_USAGE
    err = capsys.readouterr().err
    assert "pytest_benchmark" in err and ".[test]" in err


_CONFTEST = """
def pytest_addoption(parser):
    parser.addoption("--bench-tier", default="quick")
"""
_BENCH = """
import pytest


def _work(n):
    return sum(range(n))


@pytest.mark.parametrize("kind, n, group", {params})
def test_sum(benchmark, request, kind, n, group):
    assert request.config.getoption("bench_tier") == "{tier}"
    benchmark.group = group
    benchmark.extra_info.update(kind=kind, label=kind + " row")
    assert benchmark.pedantic(_work, args=(n,), rounds=2, iterations=1) == n * (n - 1) // 2
    {extra}
"""


_TWO = [("heapq", 20000, "fake-1e3"), ("delay_index", 2000, "fake-1e3")]
#: With a second group: the machine factor (a median over the run's records) is then an
#: unchanged record's, so a changed baseline of one structure is seen in full (with two records
#: the median is their mean, which takes half of any change away).
_THREE = [*_TWO, ("heapq", 30000, "fake-2e3")]


def _suite(
    tmp_path: Path,
    tier: str = "quick",
    extra: str = "",
    params: list[tuple[str, int, str]] = _TWO,
) -> Path:
    suite = tmp_path / "benchmarks"
    suite.mkdir()
    (suite / "conftest.py").write_text(_CONFTEST, encoding="utf-8")
    text = _BENCH.format(tier=tier, extra=extra, params=repr(params))
    (suite / "test_fake.py").write_text(text, encoding="utf-8")
    for module in [*(REPO / "benchmarks").glob("gate*.py"), REPO / "benchmarks" / "calibration.py"]:
        shutil.copy(module, suite / module.name)
    return suite


def _bench(suite: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, COLUMNS="200")
    env.pop("DELAYINDEX_BENCH_SLOWDOWN", None)
    return subprocess.run(
        [sys.executable, "-m", "delayindex", "bench", "--benchmarks-dir", str(suite), *argv],
        capture_output=True,
        text=True,
        cwd=suite.parent,
        env=env,
        check=False,
        timeout=300,
    )


def test_runs_the_suite_writes_json_and_prints_ratios(tmp_path: Path) -> None:
    suite = _suite(tmp_path, tier="full")
    done = _bench(suite, "--full", "--json-out", "out.json")
    assert done.returncode == EXIT_OK, done.stdout + done.stderr
    records = json.loads((tmp_path / "out.json").read_text(encoding="utf-8"))["benchmarks"]
    assert sorted(r["extra_info"]["kind"] for r in records) == ["delay_index", "heapq"]
    table = done.stdout[done.stdout.index("delayindex bench --full") :]
    assert "fake-1e3" in table and "delay_index row" in table and "heapq row" in table
    heapq_line = next(line for line in table.splitlines() if "heapq row" in line)
    assert heapq_line.rstrip(" │").endswith("1")  # heapq's ratio to itself
    assert f"gate.py {tmp_path / 'out.json'}" in done.stdout


def test_a_failing_benchmark_exits_1(tmp_path: Path) -> None:
    suite = _suite(tmp_path, extra="assert kind != 'delay_index', 'the check failed'")
    done = _bench(suite, "--json-out", "out.json")
    assert done.returncode == EXIT_CHECK_FAILED, done.stdout + done.stderr
    assert "the check failed" in done.stdout


@pytest.mark.parametrize("scale, code", [(100.0, EXIT_OK), (0.01, EXIT_CHECK_FAILED)])
def test_gate_gates_the_run_and_confirms_a_failure(tmp_path: Path, scale: float, code: int) -> None:
    """``--gate`` after the run: against a baseline 100x slower it passes; against one 100x
    faster it fails, after running the offender again (a real rerun, in a fresh process)."""
    suite = _suite(tmp_path, params=_THREE)
    first = _bench(suite, "--json-out", "first.json")
    assert first.returncode == EXIT_OK, first.stdout + first.stderr
    data = json.loads((tmp_path / "first.json").read_text(encoding="utf-8"))
    for record in data["benchmarks"]:
        if record["extra_info"]["kind"] == "delay_index":
            record["stats"]["min"] *= scale
    (suite / "baselines").mkdir()
    (suite / "baselines" / "quick-here.json").write_text(json.dumps(data), encoding="utf-8")
    done = _bench(suite, "--json-out", "out.json", "--gate")
    assert done.returncode == code, done.stdout + done.stderr
    assert "run 2 of 2, in a fresh process" in done.stdout  # --gate: two processes
    assert json.loads((tmp_path / "out.2.json").read_text(encoding="utf-8"))["benchmarks"]
    if code == EXIT_OK:
        assert "OK: 1 benchmarks" in done.stdout and "confirmation" not in done.stdout
    else:
        assert "confirmation: 1 offending benchmarks run again" in done.stdout
        assert "REGRESSION" in done.stdout and "delay_index row" in done.stdout


def test_record_baseline_then_gate_against_it(tmp_path: Path) -> None:
    """``--gate`` with no baseline of this processor exits 2 saying how to record one;
    ``--record-baseline`` stores the runs' medians under this processor's name (six runs by
    default; two here), and ``--gate`` then reads it."""
    suite = _suite(tmp_path, params=_THREE)
    missing = _bench(suite, "--json-out", "out.json", "--gate")
    assert missing.returncode == EXIT_USAGE, missing.stdout + missing.stderr
    assert "no stored quick-tier baseline was recorded on this processor" in missing.stderr
    assert "--record-baseline" in missing.stderr
    recorded = _bench(suite, "--json-out", "base.json", "--record-baseline", "--runs", "2")
    assert recorded.returncode == EXIT_OK, recorded.stdout + recorded.stderr
    assert "run 2 of 2, in a fresh process" in recorded.stdout
    stored = list((suite / "baselines").glob("quick-*.json"))
    assert len(stored) == 1 and f"wrote 3 records to {stored[0]}" in recorded.stdout
    held = json.loads(stored[0].read_text(encoding="utf-8"))
    assert "median figures of 2 runs" in held["note"]
    assert held["machine_info"]["cpu"]["brand_raw"]  # what the gate matches runs with
    gated = _bench(suite, "--json-out", "out.json", "--gate")
    assert gated.returncode in (EXIT_OK, EXIT_CHECK_FAILED), gated.stdout + gated.stderr
    assert f"against {stored[0]} (recorded on" in gated.stdout


def test_gate_and_record_baseline_exclude_each_other() -> None:
    with pytest.raises(SystemExit) as exc:
        main(["bench", "--gate", "--record-baseline"])
    assert exc.value.code == EXIT_USAGE


def test_runs_must_be_positive(tmp_path: Path) -> None:
    done = _bench(_suite(tmp_path), "--runs", "0")
    assert done.returncode == EXIT_USAGE and "--runs must be at least 1" in done.stderr
