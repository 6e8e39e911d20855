"""The ``delayindex`` command line.

* ``delayindex demo``: the main job (``delayindex.pipeline``): gen-dump, Spark rebuild, open,
  dispatch on a manual clock, verify the store against the dump, drain; every check must hold.
* ``delayindex simulate``: a dispatcher simulation over InMemoryTracker that verifies every
  delivery (``delayindex.demo``).
* ``delayindex inspect --store PATH [--name N]... [--json]``: per name, the live buckets (ledger
  range, segments, messages, bytes, the segment recovery would load and the next delivery time),
  pending intents, dead letters, the persisted mark-delete position, the writer's last reported
  unpersisted counts and whether a writer holds the name (``delayindex.storeinfo``). Read-only.
* ``delayindex gc --store PATH [--grace 10m] [--delete] [--retry-dead-letters] [--now-ms]``:
  objects no manifest references, unfinished intents and dead letters (``delayindex.gc``). A dry
  run unless ``--delete``; never touches an object younger than the grace period (ages are
  measured at ``--now-ms``, default now) or one any manifest references.
* ``delayindex fsck --store PATH [--name N]... [--json] [--no-progress]``: read every object
  in full (header, metadata with its bitmaps checked, every segment decoded) and every manifest
  and manifest history generation, and report each damaged one by file and what is wrong
  (``delayindex.fsck``). Read-only. Exit 1 on any damage, 0 when clean.
* ``delayindex gen-dump OUT --messages N [--entries-per-ledger] [--delayed-fraction]
  [--delay-mix] [--seed] [--format] [--start-ms]``: write a synthetic topic dump
  (``delayindex.dump``, ``docs/dump-format.md``) in chunks, with a progress bar. Needs pyarrow
  (the ``spark`` extra). OUT must not exist unless ``--force``; it appears only when complete.
* ``delayindex rebuild DUMP --store PATH --name N [--now-ms] [--mark-delete L:E] [--master]
  [--strict] [--format] [--json]``: rebuild an index from a topic dump with Spark
  (``delayindex.spark``; the store is created if missing). Config flags
  ``--min-index-count-per-bucket``, ``--max-num-buckets``, ``--tick-ms``, ``--strict-delivery``.
* ``delayindex verify DUMP --store PATH --name N [--now-ms] [--mark-delete L:E] [--report
  FILE.json] [--json] [--no-spark]``: check a store against a topic dump (every expected
  position in exactly one bucket with its deliver time, no extra position, checksums, manifest,
  orphans); writes the JSON report to ``--report`` and a readable summary. Rejected dump rows
  are reported, but only store findings fail the check.
* ``delayindex bench [--quick | --full] [--json-out FILE] [--benchmarks-dir DIR] [-k EXPR]``:
  run the repository's benchmark suite (``benchmarks/``, pytest-benchmark; only a checkout
  has it) in-process, write pytest-benchmark's JSON and print each benchmark's ratio to the
  heapq baseline of its group (``benchmarks/gate.py`` computes the ratios).

``--store`` is a FileStorage directory; it must exist (it is never created). ``--json`` prints
one JSON document on stdout (keys documented in the README; tables and progress bars are for
humans and go to stdout and stderr respectively).

Grace periods (``--grace``): ``0``, or a whole number with a unit: ``ms``, ``s``, ``m``, ``h``,
``d`` (``500ms``, ``30s``, ``10m``, ``2h``, ``1d``). A bare number other than 0 is refused, so
that ``--grace 600`` cannot silently mean 600 ms. Default ``10m``.

Exit codes:

====  =======================================================================================
0     success; for ``inspect``/``gc``: nothing wrong, nothing left to collect
1     a check found problems: ``demo``/``simulate`` found a lost, duplicated or early
      delivery (or ``demo``'s verify a mismatch); ``gc`` (dry run) found garbage or unfinished
      intents, or could not delete something; dead letters remain; ``inspect`` found a missing
      or unreadable snapshot; ``verify`` found a store mismatch; ``rebuild --strict`` found
      rejected dump rows; a ``bench`` benchmark failed its own checks; ``fsck`` found a
      damaged object, manifest or manifest history generation
2     bad usage: bad arguments, a store directory that does not exist, an unknown ``--name``;
      an unreadable dump or one missing a column; pyspark or Java missing (``rebuild``);
      no benchmarks directory or pytest-benchmark missing (``bench``)
3     store error: a damaged manifest (``gc`` then deletes nothing), an I/O failure, a name
      whose writer lock is held (``rebuild``)
====  =======================================================================================
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from delayindex import __version__
from delayindex.errors import DelayIndexError
from delayindex.storage.file import FileStorage
from delayindex.storage.manifest import validate_key
from delayindex.workload import DEFAULT_START_MS, DELAY_MIXES

if TYPE_CHECKING:
    from delayindex.gc import GcReport, Orphan
    from delayindex.storeinfo import NameInfo, PendingIntent, StoreInfo

EXIT_OK = 0
EXIT_CHECK_FAILED = 1
EXIT_USAGE = 2
EXIT_STORE_ERROR = 3
EXIT_CODES_HELP = (
    "Exit codes: 0 ok (nothing wrong, nothing left to collect); 1 a check found problems; "
    "2 usage error (bad arguments, missing store, unknown name); 3 store error (damaged "
    "manifest, I/O failure)."
)
#: Milliseconds per ``--grace`` unit.
GRACE_UNITS: dict[str, int] = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}
_GRACE = re.compile(r"(\d+)(ms|s|m|h|d)")
#: Rows of orphan tables shown to humans (JSON lists every one).
MAX_ROWS = 50
#: ``--format`` values of the dump commands (``json`` is an alias of ``jsonl``).
DUMP_FORMAT_CHOICES = ("parquet", "jsonl", "json", "csv")


def _int_at_least(minimum: int) -> Callable[[str], int]:
    """An argparse type: an int (underscores allowed) that is at least ``minimum``."""

    def parse(text: str) -> int:
        try:
            value = int(text.replace("_", ""))
        except ValueError:
            raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be >= {minimum}, got {value}")
        return value

    return parse


def parse_grace(text: str) -> int:
    """A ``--grace`` value in milliseconds: ``0`` or a whole number with a unit (module docs).

    Raises:
        argparse.ArgumentTypeError: anything else (argparse turns it into a usage error).
    """
    text = text.strip()
    if text == "0":
        return 0
    match = _GRACE.fullmatch(text)
    if match is None:
        raise argparse.ArgumentTypeError(
            f"bad grace period {text!r}: use 0 or a whole number with a unit, "
            "one of ms, s, m, h, d (e.g. 30s, 10m, 2h, 1d)"
        )
    return int(match.group(1)) * GRACE_UNITS[match.group(2)]


def _fraction(text: str) -> float:
    """An argparse type: a number in [0, 1]."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not 0.0 <= value <= 1.0:  # also refuses nan
        raise argparse.ArgumentTypeError(f"must be in [0, 1], got {text}")
    return value


def _name(text: str) -> str:
    """An argparse type: a manifest name (KEY_PATTERN)."""
    try:
        return validate_key(text, "name")
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def build_parser() -> argparse.ArgumentParser:
    """The argument parser for every subcommand."""
    parser = argparse.ArgumentParser(
        prog="delayindex",
        description=f"Delayed-message index tools. {EXIT_CODES_HELP}",
    )
    parser.add_argument("--version", action="version", version=f"delayindex {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    demo = sub.add_parser(
        "demo",
        help="the main job: gen-dump, Spark rebuild, open, dispatch, verify, drain",
        description="Write a realistic topic dump, rebuild its delayed index with Spark (local "
        "mode), open it and dispatch on a manual clock, verify the store against the dump, then "
        "drain everything and check that nothing is lost, delivered twice or early, and that no "
        "snapshot is left behind. Needs the spark extra and Java 17+.",
    )
    demo.add_argument("--messages", type=_int_at_least(1), default=1_000_000, help="default 1e6")
    demo.add_argument("--seed", type=_int_at_least(0), default=7)
    demo.add_argument("--master", default="local[*]", help="Spark master (default local[*])")
    demo.add_argument("--workdir", type=Path, help="keep the dump and the store here")
    demo.add_argument("--json", action="store_true", help="print the result as JSON")
    demo.add_argument("--no-progress", action="store_true", help="hide the stage messages")

    simulate = sub.add_parser(
        "simulate",
        help="simulate a dispatcher over a realistic workload (InMemoryTracker) and verify it",
        description="Publish a realistic workload, track it, dispatch it on a manual clock and "
        "verify that nothing is lost, delivered twice or delivered early.",
    )
    simulate.add_argument(
        "--messages", type=_int_at_least(1), default=1_000_000, help="default 1e6"
    )
    simulate.add_argument("--seed", type=_int_at_least(0), default=7)
    simulate.add_argument("--tick-ms", type=_int_at_least(0), default=1000)
    simulate.add_argument("--strict", action="store_true", help="never deliver before deliver_at")
    simulate.add_argument("--json", action="store_true", help="print the result as JSON")
    simulate.add_argument("--no-progress", action="store_true", help="hide the progress bar")

    inspect = sub.add_parser(
        "inspect",
        help="show what a store holds: buckets, intents, dead letters, unpersisted counts",
        description="Show, per name, the live buckets as recovery would see them now (ledger "
        "range, segments, messages, bytes, the segment it would load and the next delivery "
        "time), pending intents, dead letters, the mark-delete position, the writer's "
        "unpersisted counts and whether a writer holds the name. Read-only: takes no lock. "
        + EXIT_CODES_HELP,
        epilog="Exit 1: a snapshot is missing or unreadable, or dead letters remain.",
    )
    inspect.add_argument("--store", required=True, type=Path, help="FileStorage directory")
    inspect.add_argument(
        "--name", type=_name, action="append", help="only this name (repeatable; default: all)"
    )
    inspect.add_argument("--json", action="store_true", help="print the report as JSON")
    inspect.add_argument(
        "--now-ms",
        type=_int_at_least(0),
        default=None,
        help="evaluate due segments at this epoch-ms time (default: now)",
    )
    inspect.add_argument(
        "--tick-ms",
        type=_int_at_least(0),
        default=0,
        help="the writer's tick: recovery's cutoff is now + tick (default 0: strict)",
    )

    gc = sub.add_parser(
        "gc",
        help="find (and with --delete remove) objects no manifest references; resume intents",
        description="Find objects that no manifest references (left by older versions, foreign "
        "writers or lost intents), names with unfinished intents and dead letters. A dry run "
        "unless --delete. Never touches an object younger than the grace period or one any "
        "manifest references; a damaged manifest makes gc delete nothing. Intents are resumed "
        "by opening the name's catalog; a name whose writer is running is skipped. "
        + EXIT_CODES_HELP,
        epilog="Exit 1: a dry run found something to collect, a delete failed, or dead letters "
        "remain. Grace: 0 or a whole number with a unit ms, s, m, h, d.",
    )
    gc.add_argument("--store", required=True, type=Path, help="FileStorage directory")
    gc.add_argument(
        "--name",
        type=_name,
        action="append",
        help="resume intents of this name only (repeatable); orphans are always store-wide",
    )
    gc.add_argument(
        "--grace",
        type=parse_grace,
        default=parse_grace("10m"),
        metavar="DURATION",
        help="keep unreferenced objects younger than this (default 10m; e.g. 0, 30s, 2h, 1d)",
    )
    gc.add_argument(
        "--now-ms",
        type=_int_at_least(0),
        default=None,
        help="measure object ages (and run resumed catalogs) at this epoch-ms time (default: now)",
    )
    gc.add_argument("--delete", action="store_true", help="collect (default: dry run)")
    gc.add_argument(
        "--retry-dead-letters",
        action="store_true",
        help="with --delete: move dead letters back to pending deletes and retry them",
    )
    gc.add_argument("--json", action="store_true", help="print the report as JSON")
    gc.add_argument("--no-progress", action="store_true", help="hide the progress bar")

    fsck = sub.add_parser(
        "fsck",
        help="read every object and manifest generation in full; report damage",
        description="Read every object of the store in full (header, metadata with its bitmaps "
        "checked, every segment decoded and checksummed) and every manifest and manifest "
        "history generation; report each damaged item by file and what is wrong. Read-only: "
        "takes no lock. " + EXIT_CODES_HELP,
        epilog="Exit 1: something is damaged. Exit 0: everything read back intact.",
    )
    fsck.add_argument("--store", required=True, type=Path, help="FileStorage directory")
    fsck.add_argument(
        "--name", type=_name, action="append", help="only this name's manifests (repeatable)"
    )
    fsck.add_argument("--json", action="store_true", help="print the report as JSON")
    fsck.add_argument("--no-progress", action="store_true", help="hide the progress bar")

    gen = sub.add_parser(
        "gen-dump",
        help="write a synthetic topic dump (Parquet, JSON Lines or CSV) to rebuild or verify from",
        description="Write a realistic, deterministic topic dump: one row per message in topic "
        "order with ledger_id, entry_id, deliver_at (null: not delayed) and publish_time. "
        "The format follows OUT's extension (.parquet, .jsonl/.json, .csv, optionally .gz) or "
        "--format (default Parquet). See docs/dump-format.md. " + EXIT_CODES_HELP,
        epilog="Exit 2 also when OUT exists (use --force) or pyarrow is missing (install the "
        "spark extra); exit 3 when writing fails (OUT is then left as it was).",
    )
    gen.add_argument("out", type=Path, metavar="OUT", help="the dump file to write")
    gen.add_argument("--messages", type=_int_at_least(0), required=True, help="rows to write")
    gen.add_argument(
        "--entries-per-ledger",
        type=_int_at_least(1),
        default=1000,
        help="entries per ledger, at most 2**32 (default 1000)",
    )
    gen.add_argument(
        "--delayed-fraction",
        type=_fraction,
        default=0.5,
        help="share of delayed messages, 0 to 1 (default 0.5)",
    )
    gen.add_argument(
        "--delay-mix",
        choices=DELAY_MIXES,
        default="realistic",
        help="fixed: 60 s; uniform: 1 s-1 h; realistic (default): 70%% 1-60 s, 25%% 1-60 min, "
        "5%% 1-10 days; midnight-burst: half due at the next UTC midnight, rest realistic",
    )
    gen.add_argument("--seed", type=_int_at_least(0), default=7, help="default 7")
    gen.add_argument(
        "--format",
        choices=DUMP_FORMAT_CHOICES,
        default=None,
        help="default: from OUT's extension, else parquet",
    )
    gen.add_argument(
        "--start-ms",
        type=_int_at_least(0),
        default=DEFAULT_START_MS,
        help=f"publish time of the first message, epoch ms (default {DEFAULT_START_MS}: "
        "2026-01-01 UTC)",
    )
    gen.add_argument(
        "--first-ledger", type=_int_at_least(0), default=1, help="first ledger id (default 1)"
    )
    gen.add_argument("--force", action="store_true", help="replace OUT if it exists")
    gen.add_argument("--json", action="store_true", help="print the summary as JSON")
    gen.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    _add_rebuild_commands(sub)
    _add_bench_command(sub)
    from delayindex.repair_cli import add_repair_command

    add_repair_command(sub, _name, EXIT_CODES_HELP)
    return parser


def _add_bench_command(sub: Any) -> None:
    bench = sub.add_parser(
        "bench",
        help="run the benchmark suite (quick tier by default) and print ratios to heapq",
        description="Run the repository's benchmark suite (benchmarks/, pytest-benchmark) in "
        "this process, write pytest-benchmark's JSON and print every benchmark's min time (or "
        "bytes per message) and its ratio to the heapq baseline measured in the same run. "
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


def _demo(args: argparse.Namespace, console: Console) -> int:
    from delayindex.pipeline import run_pipeline
    from delayindex.spark import SparkUnavailableError

    started = time.perf_counter()

    def stage(text: str) -> None:
        if not args.no_progress and not args.json:
            elapsed = time.perf_counter() - started
            console.print(f"[dim]{elapsed:6.1f}s[/] {escape(text)}")

    try:
        result = run_pipeline(
            args.messages,
            seed=args.seed,
            master=args.master,
            workdir=args.workdir,  # a given workdir is kept
            progress=stage,
        )
    except SparkUnavailableError as exc:
        console.print(f"[red]delayindex demo:[/] {escape(str(exc))}")
        return EXIT_USAGE
    if args.json:
        console.print_json(json.dumps(result.as_dict()))
        return EXIT_OK if result.ok else EXIT_CHECK_FAILED
    table = Table(
        title=f"delayindex demo: dump -> Spark rebuild -> DelayIndex ({result.implementation})"
    )
    table.add_column("stage")
    table.add_column("result", justify="right")
    findings = ", ".join(f"{k} {v}" for k, v in result.verify_findings.items()) or "none"
    rows = [
        ("topic dump (Parquet)", f"{result.messages:,} messages, {result.dump_bytes / 1e6:.1f} MB"),
        ("  delayed, not yet due (expected in the index)", f"{result.expected:,}"),
        ("  rejected rows", f"{result.rejected_rows:,}"),
        (
            f"Spark rebuild ({result.spark_master})",
            f"{result.rebuild_seconds:.1f} s, {result.rebuild_rate / 1e6:.2f} M msg/s",
        ),
        ("  buckets / snapshot bytes", f"{result.buckets} / {result.snapshot_bytes / 1e6:.2f} MB"),
        ("open: recovered indexes", f"{result.recovered:,} in {result.open_seconds * 1e3:.0f} ms"),
        ("dispatch, first simulated minute", f"{result.short_dispatch_delivered:,} delivered"),
        ("verify store vs dump", "ok" if result.verify_ok else f"FAILED: {findings}"),
        ("drain: delivered (all runs)", f"{result.delivered:,}"),
        ("  redelivered after the reopen (not acked)", f"{result.redelivered:,}"),
        ("lost", f"{result.lost:,}"),
        ("delivered twice in one run", f"{result.delivered_twice:,}"),
        ("early", f"{result.early:,}"),
        ("unexpected", f"{result.unexpected:,}"),
        ("snapshot objects left in the store", f"{result.objects_left:,}"),
    ]
    for name, value in rows:
        table.add_row(name, value)
    console.print(table)
    if result.ok:
        console.print(
            "[green]verified:[/] the rebuilt index matches the dump; every message was "
            "delivered, none lost, none early; the store is empty."
        )
        return EXIT_OK
    console.print("[red]FAILED:[/] the checks above found problems.")
    return EXIT_CHECK_FAILED


def _simulate(args: argparse.Namespace, console: Console) -> int:
    from delayindex.demo import run_demo

    show_progress = not args.no_progress and not args.json
    with Progress(
        TextColumn("[bold]ingesting"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("windows"),
        TimeElapsedColumn(),
        console=console,
        disable=not show_progress,
        transient=True,
    ) as bar:
        task = bar.add_task("ingest", total=None)
        result = run_demo(
            args.messages,
            seed=args.seed,
            tick_ms=args.tick_ms,
            strict=args.strict,
            progress=lambda done, total: bar.update(task, completed=done, total=total),
        )
    if args.json:
        payload = {
            **result.__dict__,
            "ok": result.ok,
            "bytes_per_message": result.bytes_per_message,
        }
        console.print_json(json.dumps(payload))
        return EXIT_OK if result.ok else EXIT_CHECK_FAILED

    table = Table(title=f"delayindex simulate: InMemoryTracker ({result.implementation})")
    table.add_column("metric")
    table.add_column("value", justify="right")
    rate = result.messages / max(result.ingest_seconds, 1e-9)
    rows = [
        ("messages published", f"{result.messages:,}"),
        ("  delayed (realistic mix)", f"{result.delayed:,}"),
        ("  tracked", f"{result.tracked:,}"),
        ("  delivered at once (not delayed / due)", f"{result.immediate:,}"),
        ("  re-added by cursor replays", f"{result.replayed_adds:,}"),
        ("delivered by poll", f"{result.polled:,}"),
        ("timer wake-ups", f"{result.timer_fires:,}"),
        ("peak tracked", f"{result.peak_tracked:,}"),
        ("peak memory (estimate)", f"{result.peak_memory_bytes / 1e6:.1f} MB"),
        ("  per tracked message", f"{result.bytes_per_message:.1f} B"),
        ("ingest + dispatch rate", f"{rate / 1e6:.2f} M msg/s"),
        ("drain of long delays", f"{result.drain_seconds:.2f} s"),
        (
            "lateness vs deliver_at (mean / max)",
            f"{result.mean_late_ms:.0f} / {result.max_late_ms} ms",
        ),
        ("lost", f"{result.lost:,}"),
        ("polled twice", f"{result.polled_twice:,}"),
        ("early (beyond the tick)", f"{result.early:,}"),
    ]
    for name, value in rows:
        table.add_row(name, value)
    console.print(table)
    if result.ok:
        console.print("[green]verified:[/] every message delivered once, none lost, none early.")
        return EXIT_OK
    console.print("[red]FAILED:[/] the delivery checks above found problems.")
    return EXIT_CHECK_FAILED


# -- inspect and gc: shared helpers ------------------------------------------------------------


class _UsageError(Exception):
    """A usage problem found after parsing (exit 2)."""


def _check_store(path: Path) -> None:
    """Raise a usage error unless ``path`` is already a FileStorage directory."""
    if not path.exists():
        raise _UsageError(f"no store at {path}: the directory does not exist")
    if not path.is_dir():
        raise _UsageError(f"{path} is not a directory")
    if not ((path / "objects").is_dir() and (path / "manifests").is_dir()):
        raise _UsageError(f"{path} is not a delayindex store (no objects/ and manifests/)")


def _open_store(path: Path) -> FileStorage:
    """The FileStorage at ``path``, which must already be one (never created here).

    Temp files are left alone (``clean_tmp=False``): inspect and dry runs change nothing.
    """
    _check_store(path)
    return FileStorage(path, clean_tmp=False)


def _check_names(storage: FileStorage, names: list[str] | None) -> list[str] | None:
    if names is None:
        return None
    known = set(storage.list_manifests())
    unknown = [n for n in names if n not in known]
    if unknown:
        have = ", ".join(sorted(known)) or "none"
        raise _UsageError(
            f"no manifest named {', '.join(unknown)} in {storage.root} (names: {have})"
        )
    return list(dict.fromkeys(names))


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


def _duration(ms: int) -> str:
    """``1d 2h``, ``3m 5s``, ``10m``, ``250ms``: the two largest non-zero units."""
    parts: list[str] = []
    rest = ms // 1000
    for unit, size in (("d", 86_400), ("h", 3600), ("m", 60), ("s", 1)):
        if rest >= size:
            parts.append(f"{rest // size}{unit}")
            rest %= size
    return " ".join(parts[:2]) if parts else f"{ms}ms"


def _stamp(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _rel(ms: int | None, now_ms: int, *, due: bool = False) -> str:
    """How far ``ms`` is from now: ``in 5m 2s``, ``3s ago`` (``due 3s ago`` with ``due``)."""
    if ms is None:
        return "-"
    if ms > now_ms:
        return f"in {_duration(ms - now_ms)}"
    return f"{'due ' if due else ''}{_duration(now_ms - ms)} ago"


def _when(ms: int | None, now_ms: int, *, due: bool = False) -> str:
    """An epoch-ms time in UTC, with how far from now it is."""
    if ms is None:
        return "-"
    return f"{_stamp(ms)} ({_rel(ms, now_ms, due=due)})"


def _size(n: int) -> str:
    for unit, size in (("GB", 10**9), ("MB", 10**6), ("kB", 10**3)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n} B"


def _print_problems(console: Console, problems: Sequence[str], ok: str) -> None:
    """The problems of an inspect or gc report, or the ``ok`` line when there are none."""
    if problems:
        console.print(f"[red]{len(problems)} problem(s):[/]")
        for problem in problems:
            console.print(f"  - {escape(problem)}", highlight=False, soft_wrap=True)
    else:
        console.print(f"[green]ok:[/] {ok}")


def _fail(command: str, code: int, kind: str, exc: BaseException) -> int:
    """Print ``delayindex COMMAND: KIND: error`` on stderr and return the exit ``code``."""
    Console(stderr=True).print(
        f"delayindex {command}: {kind}: {escape(str(exc))}", highlight=False, soft_wrap=True
    )
    return code


def _print_json(console: Console, payload: dict[str, Any]) -> None:
    # Plain print: rich's print_json would re-wrap long strings at the console width.
    console.out(json.dumps(payload, indent=2, sort_keys=True), highlight=False)


@contextmanager
def _progress(enabled: bool, label: str) -> Iterator[Callable[[str, int, int], None]]:
    """A transient rich progress bar on stderr, fed by ``callback(phase, done, total)``."""
    with Progress(
        TextColumn(f"[bold]{label}"),
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=Console(stderr=True),
        disable=not enabled,
        transient=True,
    ) as bar:
        tasks: dict[str, Any] = {}

        def update(phase: str, done: int, total: int) -> None:
            if phase not in tasks:
                tasks[phase] = bar.add_task(phase, total=total)
            bar.update(tasks[phase], completed=done, total=total)

        yield update


# -- inspect --------------------------------------------------------------------------------------


def _inspect_exit(info: StoreInfo) -> int:
    kinds: set[str] = set()
    for name in info.names:
        kinds |= name.error_kinds()
        if name.error_kind:  # a damaged manifest is a store error whatever its kind
            kinds.add("io")
    if "io" in kinds:
        return EXIT_STORE_ERROR
    return EXIT_CHECK_FAILED if info.problems() else EXIT_OK


def _inspect_json(info: StoreInfo, store: Path, code: int) -> dict[str, Any]:
    names = []
    for name in info.names:
        item = dataclasses.asdict(name)
        item["writer"] = item.pop("lock")
        for bucket, raw in zip(item["buckets"], name.buckets, strict=True):
            bucket["all_due"] = raw.all_due
        item.update(
            messages=name.messages,
            snapshot_bytes=name.snapshot_bytes,
            being_written=name.being_written,
            next_delivery_ms=name.next_delivery_ms,
        )
        names.append(item)
    return {
        "command": "inspect",
        "store": str(store),
        "now_ms": info.now_ms,
        "tick_ms": info.tick_ms,
        "names": names,
        "problems": info.problems(),
        "exit_code": code,
    }


def _writer_text(name: NameInfo) -> str:
    if name.lock.held is None:
        return "unknown"
    if not name.lock.held:
        return "none"
    return f"running (pid {name.lock.pid})" if name.lock.pid else "running"


def _intent_table(
    title: str, intents: Sequence[PendingIntent], now_ms: int, *, dead: bool = False
) -> Table:
    """Pending intents, or dead letters (``dead``: never retried on their own, so no time)."""
    table = Table(title=title, title_justify="left")
    columns = ["kind", "snapshot", "ledgers", "attempts", "next attempt", "last error"]
    if dead:
        columns.remove("next attempt")
    for column in columns:
        table.add_column(column, overflow="fold")
    for i in intents:
        kind = i.kind if i.messages is None else f"{i.kind} ({i.messages:,} msgs)"
        cells = [kind, i.snapshot_id, f"{i.start_ledger}-{i.end_ledger}", str(i.attempts)]
        if not dead:
            cells.append(_rel(i.next_attempt_ms, now_ms, due=True) if i.attempts else "-")
        cells.append(escape(i.last_error) or "-")
        table.add_row(*cells)
    return table


def _quarantine_table(name: NameInfo, now: int) -> Table:
    """Damaged buckets: active ones wait for ``delayindex repair``; resolved ones only keep
    their damaged object."""
    table = Table(
        title="[red]quarantined buckets[/] (damaged objects are kept)", title_justify="left"
    )
    for column in ("ledgers", "messages", "state", "found", "snapshot", "reason"):
        table.add_column(column, overflow="fold")
    for q in name.quarantined:
        state = f"[red]{q.state}[/]" if q.active else q.state
        table.add_row(
            f"{q.start_ledger}-{q.end_ledger}", f"{q.num_messages:,}", state,
            _rel(q.found_ms, now), q.snapshot_id, escape(q.reason),
        )  # fmt: skip
    return table


def _inspect_human(console: Console, info: StoreInfo, store: Path) -> None:
    now = info.now_ms
    cutoff = "" if not info.tick_ms else f", tick {info.tick_ms} ms"
    console.print(
        f"[bold]store[/] {escape(str(store))}   now {_stamp(now)}{cutoff}", soft_wrap=True
    )
    if not info.names:
        console.print("no names (no manifest in this store)")
    for name in info.names:
        console.print()
        console.print(
            f"[bold]{name.name}[/]  manifest v{name.version}  writer: {_writer_text(name)}",
            soft_wrap=True,
        )
        if name.error:
            console.print(f"  [red]{escape(name.error)}[/]")
            continue
        facts = [
            f"buckets {len(name.buckets)}",
            f"messages {name.messages:,}",
            f"snapshots {_size(name.snapshot_bytes)}",
            f"next delivery {_when(name.next_delivery_ms, now, due=True)}",
        ]
        console.print("  " + "   ".join(facts), soft_wrap=True)
        mark = "-" if name.mark_delete is None else f"{name.mark_delete[0]}:{name.mark_delete[1]}"
        status = name.writer_status
        unpersisted = (
            "not reported"
            if status is None
            else f"{status.unpersisted:,} indexes, {status.memory_mode_buckets} memory-mode "
            f"buckets (as of {_rel(status.as_of_ms, now)})"
        )
        console.print(f"  mark-delete {mark}   unpersisted: {unpersisted}", soft_wrap=True)
        if name.being_written:
            console.print(f"  being written: {name.being_written:,} messages", soft_wrap=True)
        if name.buckets:
            table = Table(title_justify="left")
            for column, justify in (
                ("ledgers", "left"),
                ("segments", "right"),
                ("messages", "right"),
                ("bytes", "right"),
                ("loaded", "right"),
                ("next delivery", "left"),
                ("snapshot", "left"),
            ):
                table.add_column(column, justify=justify, overflow="fold")  # type: ignore[arg-type]
            for b in name.buckets:
                if b.error:
                    loaded, nxt = "-", f"[red]{escape(b.error)}[/]"
                elif b.all_due:
                    loaded, nxt = "-", "all due"
                else:
                    loaded, nxt = f"{b.loaded_segment}", _rel(b.next_delivery_ms, now, due=True)
                if b.below_mark:
                    nxt += " (below mark: trimmed on open)"
                table.add_row(
                    f"{b.start_ledger}-{b.end_ledger}",
                    str(b.num_segments),
                    f"{b.num_messages:,}",
                    f"{b.snapshot_bytes:,}",
                    loaded,
                    nxt,
                    b.snapshot_id,
                )
            console.print(table)
        if name.intents:
            console.print(_intent_table("pending intents", name.intents, now))
        if name.dead_letters:
            dead = _intent_table("[red]dead letters[/]", name.dead_letters, now, dead=True)
            console.print(dead)
        if name.quarantined:
            console.print(_quarantine_table(name, now))
    console.print()
    _print_problems(console, info.problems(), "every snapshot readable, no dead letters.")


def _inspect(args: argparse.Namespace, console: Console) -> int:
    from delayindex.storeinfo import inspect_store

    storage = _open_store(args.store)
    with storage:
        names = _check_names(storage, args.name)
        now = _now_ms() if args.now_ms is None else args.now_ms
        info = inspect_store(storage, now_ms=now, tick_ms=args.tick_ms, names=names)
    code = _inspect_exit(info)
    if args.json:
        _print_json(console, _inspect_json(info, args.store, code))
    else:
        _inspect_human(console, info, args.store)
    return code


# -- gc -------------------------------------------------------------------------------------------


def _gc_exit(report: GcReport) -> int:
    if report.corrupt_manifests or report.store_error:
        return EXIT_STORE_ERROR
    return EXIT_CHECK_FAILED if report.problems() else EXIT_OK


def _gc_json(report: GcReport, store: Path, code: int) -> dict[str, Any]:
    payload = dataclasses.asdict(report)
    payload["corrupt_manifests"] = [
        {"name": name, "error": error} for name, error in report.corrupt_manifests
    ]
    payload.update(
        command="gc",
        store=str(store),
        orphan_bytes=report.orphan_bytes,
        problems=report.problems(),
        exit_code=code,
    )
    return payload


def _orphan_table(title: str, orphans: Sequence[Orphan]) -> Table:
    table = Table(title=title, title_justify="left")
    table.add_column("object", overflow="fold")
    table.add_column("bytes", justify="right")
    table.add_column("age", justify="right")
    for orphan in orphans[:MAX_ROWS]:
        table.add_row(orphan.id, f"{orphan.size:,}", _duration(max(orphan.age_ms, 0)))
    if len(orphans) > MAX_ROWS:
        table.add_row(f"... and {len(orphans) - MAX_ROWS} more (--json lists all)", "", "")
    return table


def _gc_human(console: Console, report: GcReport, store: Path) -> None:
    mode = "collect" if report.delete else "dry run"
    console.print(
        f"[bold]gc[/] {escape(str(store))}   {mode}   grace {_duration(report.grace_ms)}",
        soft_wrap=True,
    )
    summary = Table(show_header=False, box=None, pad_edge=False)
    summary.add_column("what")
    summary.add_column("count", justify="right")
    summary.add_column("bytes", justify="right")
    young_bytes = sum(o.size for o in report.young)
    for what, count, size in (
        ("objects scanned", report.objects, _size(report.object_bytes)),
        ("referenced by a manifest", report.referenced, ""),
        ("manifests read", len(report.manifests), ""),
        ("orphans older than the grace period", len(report.orphans), _size(report.orphan_bytes)),
        ("orphans too young, kept", len(report.young), _size(young_bytes)),
        ("stale temp files", len(report.temp_files), ""),
    ):
        summary.add_row(f"  {what}", f"{count:,}", size)
    console.print(summary)
    for name, error in report.corrupt_manifests:
        console.print(f"[red]damaged manifest {name}:[/] {escape(error)}", soft_wrap=True)
    if report.orphans:
        console.print(_orphan_table("orphans", report.orphans))
    if report.young:
        console.print(_orphan_table("too young, kept", report.young))
    busy = [n for n in report.names if n.has_work or n.action != "none"]
    if busy:
        table = Table(title="names with unfinished work", title_justify="left")
        for column in ("name", "pending deletes", "pending creates", "dead letters", "action"):
            table.add_column(column, overflow="fold")
        for n in busy:
            action = n.action
            if n.action == "resumed":
                done = [f"{len(n.completed)} intents finished"] if n.completed else []
                if n.retried:
                    done.append(f"{len(n.retried)} dead letters deleted")
                if n.remaining_intents or n.remaining_dead_letters:
                    done.append(
                        f"left: {len(n.remaining_intents)} intents, "
                        f"{len(n.remaining_dead_letters)} dead letters"
                    )
                action += ": " + (", ".join(done) or "nothing left")
            elif n.action == "failed":
                action += f": {escape(n.error)}"
            table.add_row(
                n.name,
                str(len(n.pending_deletes)),
                str(len(n.pending_creates)),
                str(len(n.dead_letters)),
                action,
            )
        console.print(table)
    if report.delete:
        deleted = set(report.deleted)
        freed = sum(o.size for o in report.orphans if o.id in deleted)
        console.print(f"deleted {len(report.deleted)} orphans ({_size(freed)})")
        for skipped in report.skipped:
            console.print(f"  kept {skipped.id}: {escape(skipped.reason)}", soft_wrap=True)
        for failed in report.failed:
            console.print(f"  [red]failed[/] {failed.id}: {escape(failed.error)}", soft_wrap=True)
        if report.removed_temp_files:
            console.print(f"removed {len(report.removed_temp_files)} stale temp files")
    elif report.orphans or report.temp_files or any(n.has_work for n in report.names):
        console.print("dry run: nothing was changed; run with --delete to collect.")
    _print_problems(console, report.problems(), "nothing left to collect.")


def _gc(args: argparse.Namespace, console: Console) -> int:
    from delayindex.gc import run_gc

    if args.retry_dead_letters and not args.delete:
        raise _UsageError("--retry-dead-letters needs --delete (a dry run changes nothing)")
    storage = _open_store(args.store)
    with storage:
        names = _check_names(storage, args.name)
        with _progress(not (args.json or args.no_progress), "gc") as progress:
            report = run_gc(
                storage,
                now_ms=_now_ms() if args.now_ms is None else args.now_ms,
                grace_ms=args.grace,
                delete=args.delete,
                retry_dead_letters=args.retry_dead_letters,
                names=names,
                progress=progress,
            )
    code = _gc_exit(report)
    if args.json:
        _print_json(console, _gc_json(report, args.store, code))
    else:
        _gc_human(console, report, args.store)
    return code


# -- fsck -----------------------------------------------------------------------------------------


def _fsck(args: argparse.Namespace, console: Console) -> int:
    from delayindex.fsck import check_store

    storage = _open_store(args.store)
    with storage:
        names = _check_names(storage, args.name)
        with _progress(not (args.json or args.no_progress), "fsck") as progress:
            report = check_store(storage, names=names, progress=progress)
    code = EXIT_OK if report.clean else EXIT_CHECK_FAILED
    if args.json:
        payload = dataclasses.asdict(report)
        payload.update(command="fsck", store=str(args.store), exit_code=code, clean=report.clean)
        _print_json(console, payload)
        return code
    console.print(
        f"[bold]{escape(str(args.store))}[/]: {report.objects} objects "
        f"({_size(report.object_bytes)}), {report.manifests} manifests, "
        f"{report.generations} history generations read in full"
    )
    if report.damaged:
        table = Table(title=f"{len(report.damaged)} damaged", title_justify="left")
        for column in ("kind", "file", "what is wrong"):
            table.add_column(column, overflow="fold")
        for item in report.damaged:
            what = item.error.removeprefix(f"{item.file}: ")
            table.add_row(item.kind, escape(item.file), escape(what))
        console.print(table)
    _print_problems(
        console, [f"{d.kind} {d.id}: {d.error}" for d in report.damaged], "nothing is damaged"
    )
    return code


# -- gen-dump -------------------------------------------------------------------------------------


def _gen_dump(args: argparse.Namespace, console: Console) -> int:
    from delayindex.dump import (
        ENTRY_ID_LIMIT,
        DumpWriter,
        detect_format,
        iter_generated,
        normalize_format,
    )

    out: Path = args.out
    fmt = normalize_format(args.format)
    by_name = detect_format(out)
    if fmt is not None and by_name is not None and fmt != by_name:
        raise _UsageError(f"--format {args.format} does not match the extension of {out}")
    if out.is_dir():
        raise _UsageError(f"{out} is a directory; OUT names the dump file to write")
    if out.exists() and not args.force:
        raise _UsageError(f"{out} exists; pass --force to replace it")
    if args.entries_per_ledger > ENTRY_ID_LIMIT:
        raise _UsageError(f"--entries-per-ledger must be <= 2**32, got {args.entries_per_ledger}")
    try:
        chunks = iter_generated(
            args.messages,
            entries_per_ledger=args.entries_per_ledger,
            delayed_fraction=args.delayed_fraction,
            delay_mix=args.delay_mix,
            seed=args.seed,
            start_ms=args.start_ms,
            first_ledger=args.first_ledger,
        )
    except ValueError as exc:  # e.g. ids or times that would overflow int64
        raise _UsageError(str(exc)) from None
    writer = DumpWriter(out, fmt)
    started = time.perf_counter()
    delayed = 0
    last_publish = args.start_ms
    with _progress(not (args.json or args.no_progress), "gen-dump") as progress, writer:
        progress("rows", 0, args.messages)
        for chunk in chunks:
            writer.write(chunk)
            delayed += int(chunk.delayed_mask.sum())
            if chunk.publish_time is not None and len(chunk):
                last_publish = int(chunk.publish_time[-1])
            progress("rows", writer.rows, args.messages)
    seconds = time.perf_counter() - started
    ledgers = -(-args.messages // args.entries_per_ledger)
    payload: dict[str, Any] = {
        "command": "gen-dump",
        "path": str(out),
        "format": writer.fmt,
        "messages": writer.rows,
        "delayed": delayed,
        "delayed_fraction": args.delayed_fraction,
        "delay_mix": args.delay_mix,
        "entries_per_ledger": args.entries_per_ledger,
        "ledgers": ledgers,
        "first_ledger": args.first_ledger,
        "last_ledger": args.first_ledger + max(ledgers - 1, 0),
        "seed": args.seed,
        "start_ms": args.start_ms,
        "last_publish_ms": last_publish,
        "bytes": out.stat().st_size,
        "seconds": round(seconds, 3),
        "exit_code": EXIT_OK,
    }
    if args.json:
        _print_json(console, payload)
        return EXIT_OK
    table = Table(title=f"delayindex gen-dump: {escape(str(out))}", title_justify="left")
    table.add_column("what")
    table.add_column("value", justify="right")
    share = delayed / writer.rows if writer.rows else 0.0
    for what, value in (
        ("format", writer.fmt),
        ("messages", f"{writer.rows:,}"),
        ("  delayed", f"{delayed:,} ({share:.1%}, mix {args.delay_mix})"),
        (
            "ledgers",
            f"{ledgers:,} ({payload['first_ledger']}-{payload['last_ledger']}, "
            f"{args.entries_per_ledger:,} entries each)",
        ),
        ("publish times", f"{_stamp(args.start_ms)} - {_stamp(last_publish)}"),
        ("seed", str(args.seed)),
        ("file size", _size(payload["bytes"])),
        ("time", f"{seconds:.2f} s ({writer.rows / max(seconds, 1e-9) / 1e6:.2f} M rows/s)"),
    ):
        table.add_row(what, value)
    console.print(table)
    return EXIT_OK


# -- rebuild and verify (Spark) -------------------------------------------------------------------

#: Dumps smaller than this (about 4 M Parquet rows) run on a quick-start JVM (C1 only); larger
#: ones get the full JIT, whose faster shuffle and Arrow conversion then repay its slower start
#: (10 M rows: 14.1 s in all instead of 15.6 s, session start included).
QUICK_START_BYTES = 16 << 20


def _mark_delete(text: str) -> tuple[int, int]:
    """An argparse type: a mark-delete position ``LEDGER:ENTRY``."""
    ledger, sep, entry = text.partition(":")
    try:
        if not sep:
            raise ValueError
        mark = int(ledger.replace("_", "")), int(entry.replace("_", ""))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"bad position {text!r}: use LEDGER:ENTRY, e.g. 42:17"
        ) from None
    if mark[0] < 0 or not 0 <= mark[1] < 2**32:
        raise argparse.ArgumentTypeError(f"bad position {text!r}: ids out of range")
    return mark


def _add_rebuild_commands(sub: Any) -> None:
    """The ``rebuild`` and ``verify`` subcommands."""
    rebuild = sub.add_parser(
        "rebuild",
        help="rebuild an index from a topic dump with Spark (offline, instead of a replay)",
        description="Rebuild index NAME in the store from a topic dump with Spark: keep the "
        "delayed, not yet due, unacknowledged messages, cut buckets by the online tracker's "
        "sealing rule, build the snapshots on the executors and publish them with one manifest "
        "commit that replaces whatever NAME held. A killed run leaves no orphan; a re-run gives "
        "the same index. Needs the spark extra and Java 17+. " + EXIT_CODES_HELP,
        epilog="Exit 1: --strict and the dump has rejected rows (nothing was written).",
    )
    verify = sub.add_parser(
        "verify",
        help="check a store against a topic dump; JSON report and summary, exit 1 on mismatch",
        description="Check index NAME against a topic dump: every expected position (delayed, "
        "not due at --now-ms, after --mark-delete) in exactly one live bucket with the same "
        "deliver time, no extra position, every snapshot fully decoded with good checksums, the "
        "manifest consistent, orphans listed. Read-only. Use the --now-ms and --mark-delete the "
        "index was rebuilt with: messages that fell due since show up as extra positions. "
        + EXIT_CODES_HELP,
        epilog="Exit 1: any finding (missing snapshot, corrupt snapshot, manifest mismatch, "
        "missing or extra position, wrong deliver time, orphan).",
    )
    for cmd in (rebuild, verify):
        cmd.add_argument("dump", type=Path, metavar="DUMP", help="dump file or directory")
        cmd.add_argument("--store", required=True, type=Path, help="FileStorage directory")
        cmd.add_argument("--name", required=True, type=_name, help="the index name")
        cmd.add_argument(
            "--now-ms",
            type=_int_at_least(0),
            default=None,
            help="the time the index is as of, epoch ms (default: now)",
        )
        cmd.add_argument(
            "--mark-delete",
            type=_mark_delete,
            default=None,
            metavar="L:E",
            help="the cursor's mark-delete position: positions at or below are acknowledged",
        )
        cmd.add_argument(
            "--format", choices=DUMP_FORMAT_CHOICES, default=None,
            help="dump format (default: from the file names)",
        )  # fmt: skip
        cmd.add_argument("--strict", action="store_true", help="fail if any dump row is rejected")
        cmd.add_argument("--master", default="local[*]", help="Spark master (default local[*])")
        cmd.add_argument("--driver-memory", default="1g", help="Spark driver memory (default 1g)")
        cmd.add_argument(
            "--partitions", type=_int_at_least(1), default=None,
            help="scan tasks (default: 2 per core, or one per 8 MB of Parquet)",
        )  # fmt: skip
        cmd.add_argument(
            "--tick-ms", type=_int_at_least(0), default=1000,
            help="TrackerConfig.tick_ms: due means deliver_at <= now + tick (default 1000)",
        )  # fmt: skip
        cmd.add_argument(
            "--strict-delivery", action="store_true",
            help="TrackerConfig.strict: due means deliver_at <= now (no tick slack)",
        )  # fmt: skip
        cmd.add_argument("--json", action="store_true", help="print the report as JSON")
        cmd.add_argument("--no-progress", action="store_true", help="hide the progress bars")
    rebuild.add_argument(
        "--min-index-count-per-bucket", type=_int_at_least(1), default=50_000,
        help="seal a bucket once it holds this many indexes (default 50000)",
    )  # fmt: skip
    rebuild.add_argument(
        "--max-num-buckets", type=int, default=50,
        help="merge adjacent buckets down to this many; <= 0: no merging (default 50)",
    )  # fmt: skip
    verify.add_argument(
        "--report", type=Path, default=None, metavar="FILE.json",
        help="also write the JSON report to this file",
    )  # fmt: skip
    verify.add_argument(
        "--no-spark", action="store_true",
        help="read the dump in this process (no JVM; the dump must fit in memory)",
    )  # fmt: skip
    verify.add_argument(
        "--grace", type=parse_grace, default=parse_grace("10m"), metavar="DURATION",
        help="unreferenced objects younger than this are not orphans (default 10m)",
    )  # fmt: skip


def _tracker_config(args: argparse.Namespace) -> Any:
    from delayindex.config import TrackerConfig

    changes: dict[str, Any] = {"tick_ms": args.tick_ms, "strict": args.strict_delivery}
    if args.command == "rebuild":
        changes["min_index_count_per_bucket"] = args.min_index_count_per_bucket
        changes["max_num_buckets"] = args.max_num_buckets
    try:
        return TrackerConfig(**changes)
    except (TypeError, ValueError) as exc:
        raise _UsageError(str(exc)) from None


@contextmanager
def _spark_session(args: argparse.Namespace, dump_bytes: int) -> Iterator[Any]:
    """A Spark session for one command (``delayindex.spark.session_for``)."""
    from delayindex.spark import session_for

    with session_for(
        args.master,
        driver_memory=args.driver_memory,
        quick_start=dump_bytes < QUICK_START_BYTES,
        app_name=f"delayindex {args.command}",
    ) as session:
        yield session


def _dump_bytes(path: Path) -> int:
    if path.is_file():
        return path.stat().st_size
    if path.is_dir():
        return sum(p.stat().st_size for p in path.iterdir() if p.is_file())
    return 0


def _reject_lines(rejects: Any) -> list[str]:
    """Human lines about a dump's rejected and repeated rows (examples included)."""
    from delayindex.dump import REASONS

    lines = [f"dump: {escape(rejects.summary())}"]
    for reason in REASONS:
        if not rejects.counts.get(reason):
            continue
        lines.append(f"  {reason}: {rejects.counts[reason]:,}")
        for ex in rejects.examples.get(reason, [])[:3]:
            where = f"row {ex.get('row')}"
            if "file" in ex:
                where += f" ({ex['file']} row {ex['file_row']})"
            lines.append(f"    {escape(where)}: {escape(str(ex.get('detail', '')))}")
    return lines


def _rebuild_human(console: Console, report: Any, args: argparse.Namespace) -> None:
    table = Table(
        title=f"delayindex rebuild: {escape(str(args.dump))} -> {escape(str(args.store))} "
        f"name {escape(args.name)}",
        title_justify="left",
    )
    table.add_column("what")
    table.add_column("value", justify="right")
    rows_read = report.rejects.total_rows
    rate = f"{report.rate / 1e6:.2f} M rows/s"
    rows = [
        ("rows read", f"{rows_read:,}"),
        ("  rejected / repeated", f"{report.rejects.errors:,} / {report.rejects.duplicates:,}"),
        ("  not delayed", f"{report.not_delayed:,}"),
        ("  due (deliver_at <= cutoff)", f"{report.due:,}"),
        ("  acknowledged (<= mark-delete)", f"{report.acked:,}"),
        ("  tracked", f"{report.tracked:,}"),
        ("cutoff (now + tick)", _stamp(report.cutoff_ms)),
        ("mark-delete", "-" if report.mark_delete is None else
         f"{report.mark_delete[0]}:{report.mark_delete[1]}"),
        ("buckets (sealed / after merging)", f"{report.planned_buckets} / {len(report.buckets)}"),
        ("snapshot bytes", _size(report.snapshot_bytes)),
        ("  per index", f"{report.snapshot_bytes / report.tracked:.2f} B" if report.tracked
         else "-"),
        ("replaced buckets", f"{len(report.replaced)}"),
        ("Spark", f"{report.master}, {report.partitions} scan tasks"),
        ("time", f"{report.seconds:.2f} s ({rate})"),
    ]  # fmt: skip
    rows += [(f"  {phase}", f"{seconds:.2f} s") for phase, seconds in report.phases.items()]
    for what, value in rows:
        table.add_row(what, value)
    console.print(table)
    if not report.rejects.ok or report.rejects.duplicates:
        for line in _reject_lines(report.rejects):
            console.print(line, highlight=False, soft_wrap=True)
    for note in report.notes:
        console.print(f"[yellow]note:[/] {escape(note)}", soft_wrap=True)
    console.print(
        f"[green]published[/] {len(report.buckets)} buckets as of now_ms={report.now_ms}; "
        f"verify with: delayindex verify {escape(str(args.dump))} --store "
        f"{escape(str(args.store))} --name {escape(args.name)} --now-ms {report.now_ms}"
        + (f" --mark-delete {report.mark_delete[0]}:{report.mark_delete[1]}"
           if report.mark_delete else ""),
        soft_wrap=True,
        highlight=False,
    )  # fmt: skip


def _verify_human(console: Console, report: Any, args: argparse.Namespace) -> None:
    console.print(
        f"[bold]verify[/] {escape(str(args.store))} name {escape(args.name)} against "
        f"{escape(str(args.dump))} as of {_stamp(report.now_ms)} (now_ms={report.now_ms})",
        soft_wrap=True,
        highlight=False,
    )
    summary = Table(show_header=False, box=None, pad_edge=False)
    summary.add_column("what")
    summary.add_column("count", justify="right")
    for what, count in (
        ("expected positions (from the dump)", report.expected),
        ("positions in the store", report.found),
        ("live buckets", report.buckets),
        ("segments decoded", report.segments),
    ):
        summary.add_row(f"  {what}", f"{count:,}")
    console.print(summary)
    for line in _reject_lines(report.rejects):
        console.print(line, highlight=False, soft_wrap=True)
    if report.findings:
        table = Table(title="findings", title_justify="left")
        table.add_column("kind")
        table.add_column("count", justify="right")
        table.add_column("what", overflow="fold")
        for finding in report.findings[:MAX_ROWS]:
            text = finding.message
            if finding.examples:
                text += "; e.g. " + ", ".join(
                    json.dumps(ex, sort_keys=True) for ex in finding.examples[:2]
                )
            table.add_row(finding.kind, f"{finding.count:,}", escape(text))
        if len(report.findings) > MAX_ROWS:
            table.add_row("...", "", f"{len(report.findings) - MAX_ROWS} more (see the JSON)")
        console.print(table)
        counts = ", ".join(f"{k} {v:,}" for k, v in report.counts().items())
        console.print(f"[red]MISMATCH:[/] {counts}", highlight=False)
    else:
        console.print(
            "[green]ok:[/] every expected position is in exactly one bucket with its deliver "
            "time, nothing extra, every snapshot decodes, the manifest is consistent, no orphans.",
            highlight=False,
        )
    if args.report is not None:
        console.print(f"report written to {escape(str(args.report))}", highlight=False)


def _rebuild_cmd(args: argparse.Namespace, console: Console) -> int:
    from delayindex.spark import rebuild

    config = _tracker_config(args)
    show = not (args.json or args.no_progress)
    with (
        _spark_session(args, _dump_bytes(args.dump)) as spark,
        _progress(show, "rebuild") as progress,
    ):
        report = rebuild(
            spark,
            args.dump,
            args.store,
            args.name,
            config,
            now_ms=args.now_ms,
            mark_delete=args.mark_delete,
            strict=args.strict,
            fmt=args.format,  # rebuild normalizes the json alias
            partitions=args.partitions,
            progress=progress,
        )
    if args.json:
        _print_json(console, {"command": "rebuild", **report.as_dict(), "exit_code": EXIT_OK})
    else:
        _rebuild_human(console, report, args)
    return EXIT_OK


def _verify_cmd(args: argparse.Namespace, console: Console) -> int:
    from delayindex.spark import verify

    config = _tracker_config(args)
    _check_store(args.store)
    show = not (args.json or args.no_progress)
    kwargs: dict[str, Any] = {
        "now_ms": args.now_ms,
        "mark_delete": args.mark_delete,
        "strict": args.strict,
        "fmt": args.format,  # verify normalizes the json alias
        "orphan_grace_ms": args.grace,
    }
    if args.no_spark:
        report = verify(None, args.dump, args.store, args.name, config, **kwargs)
    else:
        with (
            _spark_session(args, _dump_bytes(args.dump)) as spark,
            _progress(show, "verify") as progress,
        ):
            report = verify(
                spark, args.dump, args.store, args.name, config, partitions=args.partitions,
                progress=progress, **kwargs,
            )  # fmt: skip
    code = EXIT_OK if report.ok else EXIT_CHECK_FAILED
    payload = {"command": "verify", **report.as_dict(), "exit_code": code}
    if args.report is not None:
        args.report.parent.mkdir(parents=True, exist_ok=True)
        args.report.write_text(json.dumps(payload, indent=2, sort_keys=True) + "\n")
    if args.json:
        _print_json(console, payload)
    else:
        _verify_human(console, report, args)
    return code


def _run_rebuild_command(args: argparse.Namespace, console: Console) -> int:
    """``rebuild``/``verify`` with their errors mapped to exit codes (module docs)."""
    from delayindex.dump import DumpError
    from delayindex.spark import SparkUnavailableError

    run = _rebuild_cmd if args.command == "rebuild" else _verify_cmd
    try:
        return run(args, console)
    except DumpError as exc:
        if exc.report is not None and not exc.report.ok:  # --strict found rejected rows
            errors = Console(stderr=True)
            for line in _reject_lines(exc.report):
                errors.print(line, highlight=False, soft_wrap=True)
            return _fail(args.command, EXIT_CHECK_FAILED, "rejected rows (--strict)", exc)
        return _fail(args.command, EXIT_USAGE, "bad dump", exc)
    except (_UsageError, FileNotFoundError, SparkUnavailableError, ImportError) as exc:
        return _fail(args.command, EXIT_USAGE, "error", exc)
    except (DelayIndexError, OSError) as exc:
        return _fail(args.command, EXIT_STORE_ERROR, "store error", exc)


def find_benchmarks_dir(given: Path | None = None) -> Path:
    """The benchmark suite to run: ``given``, else ``benchmarks/`` beside this checkout's ``src/``.

    Raises:
        _UsageError: the directory holds no suite (no ``conftest.py`` and ``gate.py``), e.g.
            because delayindex is installed from a wheel, which ships no benchmarks.
    """
    where = given if given is not None else Path(__file__).resolve().parents[2] / "benchmarks"
    if not ((where / "conftest.py").is_file() and (where / "gate.py").is_file()):
        raise _UsageError(
            f"no benchmark suite at {where}: `delayindex bench` runs the benchmarks/ directory "
            "of a source checkout, which an installed wheel does not have; install the checkout "
            "in editable mode (pip install -e '.[test]') or pass --benchmarks-dir"
        )
    return where


def _bench(args: argparse.Namespace, console: Console) -> int:
    import importlib.util

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
    import pytest

    out = args.json_out.resolve()
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
    started = time.monotonic()
    code = int(pytest.main(argv))
    elapsed = time.monotonic() - started
    if not console.is_terminal and "COLUMNS" not in os.environ:
        console = Console(width=160)  # a log file: room for the labels
    if not out.is_file():
        console.print(f"delayindex bench: pytest exited {code} and wrote no results", style="red")
        return EXIT_CHECK_FAILED if code == 1 else EXIT_USAGE
    console.print(_bench_table(gate, out, args.tier, elapsed))
    console.print(
        f"JSON: {out}\nGate: python {suite / 'gate.py'} {out}", highlight=False, soft_wrap=True
    )
    return {0: EXIT_OK, 1: EXIT_CHECK_FAILED}.get(code, EXIT_USAGE)


def _bench_table(gate: Any, out: Path, tier: str, elapsed: float) -> Table:
    """One row per benchmark: group, structure, min time or bytes/msg, ratio to heapq."""
    ratios = gate.ratios(gate.load_records(out))
    table = Table(
        title=f"delayindex bench --{tier}: {len(ratios)} benchmarks in {elapsed:.0f} s",
        caption="ratio: min time (memory groups: bytes/msg) over the heapq row of the same "
        "group, same run; below 1 is better",
    )
    for column in ("group", "structure", "min time / memory", "ratio vs heapq"):
        table.add_column(column, justify="right" if column.startswith(("min", "ratio")) else "left")
    previous = None
    for ratio in sorted(ratios.values(), key=lambda r: (r.group, r.ratio or 0.0, r.name)):
        if ratio.metric == "time":
            figure = f"{ratio.value * 1e3:.2f} ms" if ratio.value < 1 else f"{ratio.value:.2f} s"
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


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``delayindex`` command; returns the exit code."""
    parser = build_parser()
    args = parser.parse_args(argv)
    console = Console()
    if args.command == "demo":
        return _demo(args, console)
    if args.command == "simulate":
        return _simulate(args, console)
    if args.command == "gen-dump":
        try:
            return _gen_dump(args, console)
        except (_UsageError, ImportError) as exc:
            return _fail(args.command, EXIT_USAGE, "error", exc)
        except OSError as exc:
            return _fail(args.command, EXIT_STORE_ERROR, "I/O error", exc)
    if args.command in ("rebuild", "verify"):
        return _run_rebuild_command(args, console)
    if args.command == "repair":
        from delayindex.repair_cli import run_repair

        return run_repair(args, console)
    if args.command == "bench":
        try:
            return _bench(args, console)
        except _UsageError as exc:
            return _fail(args.command, EXIT_USAGE, "error", exc)
    if args.command in ("inspect", "gc", "fsck"):
        run = {"inspect": _inspect, "gc": _gc, "fsck": _fsck}[args.command]
        try:
            return run(args, console)
        except _UsageError as exc:
            return _fail(args.command, EXIT_USAGE, "error", exc)
        except (DelayIndexError, OSError) as exc:
            return _fail(args.command, EXIT_STORE_ERROR, "store error", exc)
    parser.error(f"unknown command {args.command!r}")  # pragma: no cover - argparse rejects first
    return EXIT_USAGE  # pragma: no cover


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
