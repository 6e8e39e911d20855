"""The ``delayindex`` command line.

Exit codes: 0 success; 1 a check failed (the demo found a lost, duplicated or early delivery);
2 bad usage.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from delayindex import __version__

EXIT_OK = 0
EXIT_CHECK_FAILED = 1
EXIT_USAGE = 2


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


def build_parser() -> argparse.ArgumentParser:
    """The argument parser for every subcommand."""
    parser = argparse.ArgumentParser(
        prog="delayindex",
        description="Delayed-message index tools. Exit codes: 0 ok, 1 check failed, 2 usage.",
    )
    parser.add_argument("--version", action="version", version=f"delayindex {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    demo = sub.add_parser(
        "demo",
        help="simulate a dispatcher over a realistic workload and verify every delivery",
        description="Publish a realistic workload, track it, dispatch it on a manual clock and "
        "verify that nothing is lost, delivered twice or delivered early.",
    )
    demo.add_argument("--messages", type=_int_at_least(1), default=1_000_000, help="default 1e6")
    demo.add_argument("--seed", type=_int_at_least(0), default=7)
    demo.add_argument("--tick-ms", type=_int_at_least(0), default=1000)
    demo.add_argument("--strict", action="store_true", help="never deliver before deliver_at")
    demo.add_argument("--json", action="store_true", help="print the result as JSON")
    demo.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    return parser


def _demo(args: argparse.Namespace, console: Console) -> int:
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

    table = Table(title=f"delayindex demo: InMemoryTracker ({result.implementation})")
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


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``delayindex`` command; returns the exit code."""
    parser = build_parser()
    args = parser.parse_args(argv)
    console = Console()
    if args.command == "demo":
        return _demo(args, console)
    parser.error(f"unknown command {args.command!r}")  # pragma: no cover - argparse rejects first
    return EXIT_USAGE  # pragma: no cover


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
