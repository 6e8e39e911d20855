"""``delayindex repair``: rebuild quarantined buckets of a stopped index from a topic dump.

The command opens the index as its writer (so the dispatcher must be stopped), reads the dump
in this process with :func:`delayindex.dump.read_dump` (the same reader and validation the
offline rebuild uses), and calls :meth:`delayindex.DelayIndex.repair_quarantined` (or, with
``--release``, :meth:`~delayindex.DelayIndex.release_quarantined`). Exit codes are the CLI's:
0 repaired (or nothing to do), 1 the dump lacks positions of a bucket (nothing changed),
2 usage, 3 store error. The damaged objects are always kept.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from delayindex.cli._common import (
    EXIT_CHECK_FAILED,
    EXIT_CODES_HELP,
    EXIT_OK,
    EXIT_STORE_ERROR,
    EXIT_USAGE,
    _name,
    add_now_ms,
    add_output,
    add_store,
    add_tick_ms,
    handler,
)
from delayindex.config import TrackerConfig
from delayindex.errors import DelayIndexError


def register(sub: Any) -> None:
    """Add ``repair`` to the CLI's subparsers."""
    repair = sub.add_parser(
        "repair",
        help="rebuild quarantined buckets from a topic dump (or release them)",
        description="Rebuild the quarantined buckets of index NAME (snapshots found damaged or "
        "missing) from a topic dump of their ledger ranges, with the online sealing rule; "
        "the damaged objects are kept. The index must not be open elsewhere (stop the "
        "dispatcher). With --release, give up on the lost delivery times instead: the buckets "
        "leave the quarantine, and the dispatcher's replay of their ledger ranges after its "
        "restart re-adds their messages (due ones are delivered at once). " + EXIT_CODES_HELP,
        epilog="Exit 1: the dump lacks positions of a quarantined bucket (nothing changed).",
    )
    add_store(repair)
    repair.add_argument("--name", required=True, type=_name, help="the index name")
    repair.add_argument("--dump", type=Path, default=None, help="dump file or directory")
    repair.add_argument("--format", default=None, help="dump format (default: from the names)")
    repair.add_argument("--snapshot", default=None, help="only this quarantined snapshot id")
    repair.add_argument("--release", action="store_true", help="release instead of repairing")
    add_tick_ms(repair, "TrackerConfig.tick_ms of the index (default %(default)s)")
    add_now_ms(repair, "the index's clock, epoch ms (default: the wall clock)")
    add_output(repair, "result", None)
    # run_repair prints its own errors (on stdout, as it always has).
    repair.set_defaults(func=handler(run_repair))


def run_repair(args: argparse.Namespace, console: Console) -> int:
    """Run ``delayindex repair``; returns the exit code."""
    from delayindex import DelayIndex, FileStorage
    from delayindex.dump import DumpError, read_dump

    if args.release == (args.dump is not None):
        console.print("[red]error:[/] give exactly one of --dump and --release")
        return EXIT_USAGE
    if not (args.store / "manifests").is_dir():
        console.print(f"[red]error:[/] {args.store} is not a delayindex store")
        return EXIT_USAGE
    try:
        columns = read_dump(args.dump, args.format)[0] if args.dump is not None else None
    except (DumpError, FileNotFoundError) as exc:
        console.print(f"[red]bad dump:[/] {exc}")
        return EXIT_USAGE
    try:
        with FileStorage(args.store) as storage:
            config = TrackerConfig(tick_ms=args.tick_ms)
            now = args.now_ms
            clock = None if now is None else (lambda: now)
            index = DelayIndex.open(storage, args.name, config, clock=clock)
            try:
                before = [dataclasses.asdict(q) for q in index.quarantined()]
                if columns is None:
                    released = index.release_quarantined(args.snapshot)
                    payload: dict[str, Any] = {"released": released}
                else:
                    results = index.repair_quarantined(columns, args.snapshot)
                    payload = {"repaired": [dataclasses.asdict(r) for r in results]}
                index.flush()
            finally:
                index.close()
    except ValueError as exc:
        console.print(f"[red]not repaired:[/] {exc}")
        return EXIT_CHECK_FAILED
    except (DelayIndexError, OSError) as exc:
        console.print(f"[red]store error:[/] {exc}")
        return EXIT_STORE_ERROR
    payload = {"command": "repair", "quarantined_before": before, **payload}
    if args.json:
        console.print_json(json.dumps(payload))
        return EXIT_OK
    if not before:
        console.print(f"{args.name}: nothing is quarantined")
        return EXIT_OK
    table = Table(title=f"{args.name}: quarantined buckets")
    for column in ("snapshot", "ledgers", "messages", "reason"):
        table.add_column(column)
    for q in before:
        table.add_row(
            q["snapshot_id"], f"{q['start_ledger']}..{q['end_ledger']}",
            str(q["num_messages"]), q["reason"][:80],
        )  # fmt: skip
    console.print(table)
    if "released" in payload:
        console.print(f"released {payload['released']} positions (due now)")
    for r in payload.get("repaired", []):
        console.print(
            f"repaired {r['damaged_snapshot_id']} -> {r['snapshot_id'] or '(nothing left)'}: "
            f"{r['num_messages']} positions from {r['dump_rows']} dump rows"
        )
    return EXIT_OK
