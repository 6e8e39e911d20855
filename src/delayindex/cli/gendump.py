"""``delayindex gen-dump``: write a synthetic, deterministic topic dump (``delayindex.dump``,
``docs/dump-format.md``) in chunks with a progress bar, and print a summary. Needs pyarrow (the
``spark`` extra). OUT must not exist unless ``--force``; it appears only when complete.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from delayindex.cli._common import (
    DUMP_FORMAT_CHOICES,
    EXIT_CODES_HELP,
    EXIT_OK,
    EXIT_STORE_ERROR,
    EXIT_USAGE,
    _fraction,
    _int_at_least,
    _print_json,
    _progress,
    _size,
    _stamp,
    _UsageError,
    add_output,
    handler,
)
from delayindex.workload import DEFAULT_START_MS, DELAY_MIXES


def register(sub: Any) -> None:
    """Add ``gen-dump`` to the CLI's subparsers."""
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
    add_output(gen, "summary", "progress bar")
    gen.set_defaults(
        func=handler(
            _gen_dump,
            (
                ((_UsageError, ImportError), EXIT_USAGE, "error"),
                ((OSError,), EXIT_STORE_ERROR, "I/O error"),
            ),
        )
    )


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
