"""``delayindex demo`` and ``delayindex simulate``: the two end-to-end runs that check every
delivery. ``demo`` is the main job (``delayindex.demo``: gen-dump, Spark rebuild, open,
dispatch, verify, drain); ``simulate`` runs a dispatcher over InMemoryTracker
(``delayindex.simulate``). Each prints a table (or JSON) and exits 1 when a check fails.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from delayindex.cli._common import (
    EXIT_CHECK_FAILED,
    EXIT_OK,
    EXIT_USAGE,
    _int_at_least,
    add_output,
    add_strict_delivery,
    add_tick_ms,
    handler,
)


def register(sub: Any) -> None:
    """Add ``demo`` and ``simulate`` to the CLI's subparsers."""
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
    add_output(demo, "result", "stage messages")
    demo.set_defaults(func=handler(_demo))

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
    add_tick_ms(simulate, "TrackerConfig.tick_ms (default %(default)s)")
    add_strict_delivery(simulate, alias=True)
    add_output(simulate, "result", "progress bar")
    simulate.set_defaults(func=handler(_simulate))


def _demo(args: argparse.Namespace, console: Console) -> int:
    from delayindex.demo import run_demo
    from delayindex.spark import SparkUnavailableError

    started = time.perf_counter()

    def stage(text: str) -> None:
        if not args.no_progress and not args.json:
            elapsed = time.perf_counter() - started
            console.print(f"[dim]{elapsed:6.1f}s[/] {escape(text)}")

    try:
        result = run_demo(
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
    from delayindex.simulate import run_simulation

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
        result = run_simulation(
            args.messages,
            seed=args.seed,
            tick_ms=args.tick_ms,
            strict=args.strict_delivery,
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
