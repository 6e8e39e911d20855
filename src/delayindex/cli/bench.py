"""``delayindex bench``: run the repository's benchmark suite (``benchmarks/``,
pytest-benchmark) in a fresh pytest process, write pytest-benchmark's JSON and print each
benchmark's ratio to the heapq baseline of its group (``benchmarks/gate.py`` computes the
ratios). Only a source checkout has the suite; :func:`find_benchmarks_dir` finds it.

``--gate`` runs the suite twice, each run in its own process (``--runs``), and gates
both runs together: a structure's speed moves with its process, and the gate takes each
structure's mean over the processes (``benchmarks/gate.py``, "Several runs"), against the stored
baseline of this machine's processor. ``--record-baseline`` runs it six times (each in a fresh
process) and stores their median figures as that baseline (``benchmarks/gate_machine.py``).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from delayindex.cli._common import (
    EXIT_CHECK_FAILED,
    EXIT_CODES_HELP,
    EXIT_OK,
    EXIT_USAGE,
    _UsageError,
    handler,
)

#: Runs of ``--record-baseline``: the stored baselines are the median of six clean runs.
RECORD_RUNS = 6


def register(sub: Any) -> None:
    """Add ``bench`` to the CLI's subparsers."""
    bench = sub.add_parser(
        "bench",
        help="run the benchmark suite (quick tier by default) and print ratios to heapq",
        description="Run the repository's benchmark suite (benchmarks/, pytest-benchmark) in a "
        "fresh pytest process, write pytest-benchmark's JSON and print every benchmark's min "
        "time (or bytes per message) and its ratio to the heapq baseline measured in the same run. "
        "Needs a checkout with an editable install and the test extra "
        "(pip install -e '.[test]'). " + EXIT_CODES_HELP,
        epilog="Exit 1: a benchmark failed its own checks. Exit 2: no benchmarks directory "
        "(a non-editable install has none), pytest-benchmark missing, or bad arguments.",
    )
    tier = bench.add_mutually_exclusive_group()
    tier.add_argument(
        "--quick",
        dest="tier",
        action="store_const",
        const="quick",
        help="the quick tier (default): sizes 1e5, memory 1e5 and 1e6, no Spark; minutes",
    )
    tier.add_argument(
        "--full",
        dest="tier",
        action="store_const",
        const="full",
        help="the full tier: sizes up to 1e7 and every group; hours and up to ~24 GiB",
    )
    bench.set_defaults(tier="quick")
    bench.add_argument(
        "--json-out",
        type=Path,
        default=Path("delayindex-bench.json"),
        help="where to write pytest-benchmark's JSON (default ./delayindex-bench.json)",
    )
    bench.add_argument(
        "--benchmarks-dir",
        type=Path,
        default=None,
        help="the suite to run (default: benchmarks/ of the checkout delayindex runs from)",
    )
    bench.add_argument(
        "-k",
        dest="keyword",
        default=None,
        help="only benchmarks matching this pytest -k expression",
    )
    then = bench.add_mutually_exclusive_group()
    then.add_argument(
        "--gate",
        action="store_true",
        help="then gate the runs against the stored baseline recorded on this processor "
        "(benchmarks/gate.py --confirm: a failing run's offenders are run again before the "
        "verdict); exit 1 on a regression, 2 when no baseline was recorded on this processor",
    )
    then.add_argument(
        "--record-baseline",
        action="store_true",
        help="then store the runs' median figures as this processor's baseline "
        "(benchmarks/baselines/<tier>-<processor>.json), replacing it; run on an idle machine",
    )
    bench.add_argument(
        "--runs",
        type=int,
        default=None,
        help="run the suite this many times, each in a fresh process (default: 2 "
        "with --gate, which averages each structure over both processes; 6 with "
        "--record-baseline; else 1)",
    )
    bench.set_defaults(func=handler(_bench, (((_UsageError,), EXIT_USAGE, "error"),)))


def find_benchmarks_dir(given: Path | None = None) -> Path:
    """The benchmark suite to run: ``given``, else ``benchmarks/`` beside this checkout's ``src/``.

    Raises:
        _UsageError: the directory holds no suite (no ``conftest.py`` and ``gate.py``), e.g.
            because delayindex is installed from a wheel, which ships no benchmarks.
    """
    where = given if given is not None else Path(__file__).resolve().parents[3] / "benchmarks"
    if not ((where / "conftest.py").is_file() and (where / "gate.py").is_file()):
        raise _UsageError(
            f"no benchmark suite at {where}: `delayindex bench` runs the benchmarks/ directory "
            "of a source checkout, which an installed wheel does not have; install the checkout "
            "in editable mode (pip install -e '.[test]') or pass --benchmarks-dir"
        )
    return where


def _bench(args: argparse.Namespace, console: Console) -> int:
    import importlib.util

    runs = (
        args.runs
        if args.runs is not None
        else (2 if args.gate else RECORD_RUNS if args.record_baseline else 1)
    )
    if runs < 1:
        raise _UsageError(f"--runs must be at least 1, got {runs}")
    missing = [m for m in ("pytest", "pytest_benchmark") if importlib.util.find_spec(m) is None]
    if missing:
        raise _UsageError(
            f"delayindex bench needs {' and '.join(missing)}: pip install -e '.[test]'"
        )
    suite = find_benchmarks_dir(args.benchmarks_dir)
    spec = importlib.util.spec_from_file_location("delayindex_bench_gate", suite / "gate.py")
    if spec is None or spec.loader is None:  # pragma: no cover - find_benchmarks_dir checked it
        raise _UsageError(f"cannot load {suite / 'gate.py'}")
    gate: Any = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = gate  # dataclasses look their module up there
    spec.loader.exec_module(gate)
    out = args.json_out.resolve()
    outs: list[Path] = []
    code, elapsed = 0, 0.0
    for number in range(1, runs + 1):
        outs.append(out if number == 1 else out.with_name(f"{out.stem}.{number}{out.suffix}"))
        if runs > 1:
            console.print(f"delayindex bench: run {number} of {runs}, in a fresh process")
        sys.stdout.flush()
        # Every run in its own interpreter, none in this one: this process pinned glibc's mmap
        # threshold (cli.main), which a benchmark process must not inherit (a dispatcher's
        # process runs with the defaults), and each run starts from the same state.
        command = [sys.executable, "-m", "pytest", *_pytest_argv(args, suite, outs[-1])]
        started = time.monotonic()
        code = subprocess.run(command, cwd=suite.parent, check=False).returncode
        if number == 1:  # the table reports run 1's time
            elapsed = time.monotonic() - started
        if code != 0:
            break
    if not console.is_terminal and "COLUMNS" not in os.environ:
        console = Console(width=160)  # a log file: room for the labels
    if not out.is_file():
        console.print(f"delayindex bench: pytest exited {code} and wrote no results", style="red")
        return EXIT_CHECK_FAILED if code == 1 else EXIT_USAGE
    console.print(_bench_table(gate, out, args.tier, elapsed))
    files = " ".join(map(str, outs))
    console.print(
        f"JSON: {files}\nGate: python {suite / 'gate.py'} {files}",
        highlight=False,
        soft_wrap=True,
    )
    if code == 0 and args.gate:
        sys.stdout.flush()
        code = int(gate.main([*map(str, outs), "--confirm", f"--tier={args.tier}"]))
    elif code == 0 and args.record_baseline:
        sys.stdout.flush()
        gate.BASELINE_DIR.mkdir(exist_ok=True)
        where = ["--write-baseline", str(gate.BASELINE_DIR), f"--tier={args.tier}"]
        code = int(gate.main([*map(str, outs), *where]))
    return {0: EXIT_OK, 1: EXIT_CHECK_FAILED}.get(code, EXIT_USAGE)


def _pytest_argv(args: argparse.Namespace, suite: Path, out: Path) -> list[str]:
    """pytest's arguments for one run of ``suite`` writing its JSON to ``out``."""
    argv = [
        str(suite),
        "--benchmark-enable",
        f"--bench-tier={args.tier}",
        f"--benchmark-json={out}",
        "-q",
        "-p",
        "no:cacheprovider",
        f"--rootdir={suite.parent}",
    ]
    if (suite.parent / "pyproject.toml").is_file():
        argv.append(f"--config-file={suite.parent / 'pyproject.toml'}")
    if args.keyword:
        argv += ["-k", args.keyword]
    return argv


def _bench_table(gate: Any, out: Path, tier: str, elapsed: float) -> Table:
    """One row per benchmark: group, structure, min time or bytes/msg, ratio to heapq."""
    ratios = gate.ratios(gate.load_records(out))
    table = Table(
        title=f"delayindex bench --{tier}: {len(ratios)} benchmarks in {elapsed:.0f} s",
        caption="ratio: min time (memory groups: bytes/msg; a calibrated tier: the median time "
        "in calibration loops, benchmarks/calibration.py) over the heapq row of the same group, "
        "same run; below 1 is better",
    )
    for column in ("group", "structure", "min time / memory", "ratio vs heapq"):
        table.add_column(column, justify="right" if column.startswith(("min", "ratio")) else "left")
    previous = None
    for ratio in sorted(ratios.values(), key=lambda r: (r.group, r.ratio or 0.0, r.name)):
        if ratio.metric == "time":
            figure = f"{ratio.value * 1e3:.2f} ms" if ratio.value < 1 else f"{ratio.value:.2f} s"
        elif ratio.metric == "calibrated":  # a timed call over the calibration loop's time
            figure = f"{ratio.value:.3g} loops"
        else:
            figure = f"{ratio.value:.1f} B/msg"
        table.add_row(
            escape(ratio.group) if ratio.group != previous else "",
            escape(ratio.label),
            figure,
            "-" if ratio.ratio is None else f"{ratio.ratio:.3g}",
        )
        previous = ratio.group
    return table
