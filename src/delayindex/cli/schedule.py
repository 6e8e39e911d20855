"""The pending schedule of a stored index: ``delayindex inspect --schedule`` (its histogram,
rendered here; ``store.py`` adds the options) and ``delayindex pending``.

Both read the schedule offline with :func:`delayindex.schedule.read_schedule`, like the rest
of ``inspect``: no lock is taken and nothing is written, so they work while the writer runs,
and they show what a reopen at ``--now-ms`` would track from the store (the live snapshots'
segments not wholly due, after the mark, with the manifest's cancel and reschedule overrides
applied). The writer's memory-only indexes are not in the store; the output says how many the
writer last reported. Opening the index as its writer (as ``clear`` does) would instead refuse
while a writer runs (exit 3) and would change the store (recovery deletes all-due buckets,
repairs intents and commits a writer status), which an inspection must not do.

``pending STORE NAME [--from T] [--to T] [--limit N] [--json]`` lists positions in
``[--from, --to)`` in ``(deliver_at, ledger, entry)`` order; ``--json`` prints a JSON array of
``{"deliver_at": ms, "ledger_id": L, "entry_id": E}``. Times (``--from``, ``--to``) are epoch
milliseconds or ISO 8601 (``2026-01-01T12:00``, ``...Z``, ``...+02:00``; no zone means UTC).

Exit codes as ``inspect``: 0 ok, 1 a snapshot is missing or damaged (its bucket is not counted),
2 usage (bad arguments, no store, an unknown name, matplotlib missing for ``--plot``), 3 a
damaged manifest or an I/O failure.
"""

from __future__ import annotations

import argparse
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt
from rich.bar import Bar
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from delayindex.cli._common import (
    EXIT_CHECK_FAILED,
    EXIT_CODES_HELP,
    EXIT_OK,
    EXIT_STORE_ERROR,
    STORE_ERRORS,
    _check_names,
    _int_at_least,
    _name,
    _now_ms,
    _open_store,
    _rel,
    _UsageError,
    add_now_ms,
    add_output,
    add_tick_ms,
    handler,
)

if TYPE_CHECKING:
    from delayindex.schedule import StoredSchedule

Int64Array = npt.NDArray[np.int64]
#: ``--bins`` default: histogram rows.
DEFAULT_BINS = 20
#: ``pending --limit`` default (the library's ``pending`` default).
DEFAULT_LIMIT = 1000
#: Widest bar of the terminal histogram, in characters (narrower on a narrow terminal).
BAR_WIDTH = 40
PLOT_HINT = "pip install 'delayindex[plot]' (or: pip install matplotlib)"


def parse_time(text: str) -> int:
    """An argparse type: epoch milliseconds (an int, underscores allowed) or an ISO 8601 time
    (no zone: UTC), as epoch milliseconds."""
    try:
        return int(text.replace("_", ""))
    except ValueError:
        pass
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"bad time {text!r}: use epoch milliseconds or ISO 8601 (e.g. 2026-01-01T12:00Z)"
        ) from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return round(moment.timestamp() * 1000)


def add_range(parser: argparse.ArgumentParser, what: str) -> None:
    """``--from`` and ``--to`` (``dest`` ``from_ms``/``to_ms``): the range ``[from, to)``."""
    parser.add_argument(
        "--from", dest="from_ms", type=parse_time, default=None, metavar="TIME",
        help=f"{what} from this time on (epoch ms or ISO 8601, UTC if no zone; "
        "default: the earliest pending)",
    )  # fmt: skip
    parser.add_argument(
        "--to", dest="to_ms", type=parse_time, default=None, metavar="TIME",
        help=f"{what} before this time (excluded; default: after the latest pending)",
    )  # fmt: skip


def check_range(from_ms: int | None, to_ms: int | None) -> None:
    """Refuse ``--from`` at or after ``--to``.

    Raises:
        _UsageError: an empty range.
    """
    if from_ms is not None and to_ms is not None and from_ms >= to_ms:
        raise _UsageError(
            f"--from ({stamp_ms(from_ms)}) must be before --to ({stamp_ms(to_ms)}): "
            "the range is [from, to)"
        )


def stamp_ms(ms: int) -> str:
    """An epoch-ms time in UTC with milliseconds: ``2026-01-01 12:00:00.250``."""
    try:
        moment = datetime.fromtimestamp(ms // 1000, UTC)
    except (OverflowError, OSError, ValueError):
        return f"{ms} ms"
    return f"{moment:%Y-%m-%d %H:%M:%S}.{ms % 1000:03d}"


def schedule_edges(
    schedule: StoredSchedule, bins: int, from_ms: int | None, to_ms: int | None
) -> Int64Array | None:
    """``bins`` equal (to the millisecond) bins over ``[from, to)``, each bound defaulting to
    the pending range (earliest; latest + 1); fewer bins when the range is shorter than
    ``bins`` ms. None: no range (nothing pending and no bounds given)."""
    span = schedule.span
    start = from_ms if from_ms is not None else (span[0] if span else None)
    end = to_ms if to_ms is not None else (span[1] + 1 if span else None)
    if start is None or end is None:
        return None
    if end <= start:  # only one bound given, on the far side of everything pending
        return None
    width = end - start
    edges = sorted({start + width * i // bins for i in range(bins + 1)})
    return np.array(edges, dtype=np.int64)


def schedule_json(
    schedule: StoredSchedule, edges: Int64Array | None, counts: Int64Array | None
) -> dict[str, Any]:
    """The ``schedule`` object of ``inspect --schedule --json``."""
    status = schedule.writer_status
    return {
        "now_ms": schedule.now_ms,
        "cutoff_ms": schedule.cutoff_ms,
        "pending": len(schedule),
        "earliest_ms": None if schedule.span is None else schedule.span[0],
        "latest_ms": None if schedule.span is None else schedule.span[1],
        "edges": [] if edges is None else edges.tolist(),
        "counts": [] if counts is None else counts.tolist(),
        "in_range": 0 if counts is None else int(counts.sum()),
        "due_skipped": schedule.due_skipped,
        "moved_due": schedule.moved_due,
        "quarantined": schedule.quarantined,
        "memory_only": None if status is None else status.unpersisted,
        "errors": [
            {"snapshot_id": e.snapshot_id, "kind": e.kind, "error": e.error}
            for e in schedule.errors
        ],
    }


def schedule_exit(schedules: list[StoredSchedule]) -> int:
    """1 if a bucket was missing or damaged, 3 if one could not be read (I/O), else 0."""
    kinds = {e.kind for s in schedules for e in s.errors}
    if "io" in kinds:
        return EXIT_STORE_ERROR
    return EXIT_CHECK_FAILED if kinds else EXIT_OK


def _notes(schedule: StoredSchedule) -> list[str]:
    """What the schedule does not show, in words."""
    now = schedule.now_ms
    status = schedule.writer_status
    memory = (
        "the writer has not reported how many"
        if status is None
        else f"{status.unpersisted:,} as the writer last reported ({_rel(status.as_of_ms, now)})"
    )
    notes = [
        f"not shown: indexes held only in the writer's memory (its mutable bucket, direct adds, "
        f"unwritten buckets): {memory}; they are not in the store"
    ]
    if schedule.due_skipped:
        notes.append(
            f"not shown: {schedule.due_skipped:,} indexes in segments wholly due at "
            f"{stamp_ms(schedule.cutoff_ms)} (a reopen leaves them to the dispatcher's replay)"
        )
    if schedule.moved_due:
        notes.append(f"not shown: {schedule.moved_due:,} rescheduled to a time already due")
    if schedule.quarantined:
        notes.append(
            f"not shown: {schedule.quarantined:,} messages of quarantined buckets (times lost)"
        )
    notes.extend(
        f"[red]not counted: bucket {e.start_ledger}-{e.end_ledger} ({e.snapshot_id}): "
        f"{escape(e.error)}[/]"
        for e in schedule.errors
    )
    return notes


def render_histogram(
    console: Console,
    schedule: StoredSchedule,
    edges: Int64Array | None,
    counts: Int64Array | None,
) -> None:
    """The schedule as a table of bins with proportional bars, the total and the notes."""
    kind = "shared index (topic)" if schedule.shared else "index"
    head = f"  [bold]pending schedule[/] of {kind} {escape(schedule.name)}: {len(schedule):,}"
    if schedule.span is not None:
        head += f" from {stamp_ms(schedule.span[0])} to {stamp_ms(schedule.span[1])} UTC"
    console.print(head, soft_wrap=True)
    if edges is not None and counts is not None:
        top = max(int(counts.max()), 1)
        # The times and counts never wrap; the bars take what the terminal has left.
        width = max(10, min(BAR_WIDTH, console.width - 65))
        table = Table(title_justify="left")
        table.add_column("from (UTC)", no_wrap=True)
        table.add_column("to (UTC)", no_wrap=True)
        table.add_column("count", justify="right", no_wrap=True)
        table.add_column("", width=width, no_wrap=True)
        for i, count in enumerate(counts.tolist()):
            table.add_row(
                stamp_ms(int(edges[i])), stamp_ms(int(edges[i + 1])), f"{count:,}",
                Bar(top, 0, count, width=width, color="cyan"),
            )  # fmt: skip
        console.print(table)
        console.print(f"  total {int(counts.sum()):,} in {len(counts)} bins", soft_wrap=True)
    for note in _notes(schedule):
        console.print(f"  {note}", soft_wrap=True, highlight=False)


def write_plot(path: Path, title: str, edges: Int64Array | None, counts: Int64Array | None) -> None:
    """The histogram as a PNG bar chart (time in UTC on x, counts on y).

    Raises:
        _UsageError: matplotlib is not installed (the ``plot`` extra).
        OSError: the file could not be written.
    """
    try:
        import matplotlib
        import matplotlib.dates as mdates
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
        from matplotlib.ticker import MaxNLocator
    except ImportError:
        raise _UsageError(f"--plot needs matplotlib: {PLOT_HINT}") from None
    matplotlib.rcParams["timezone"] = "UTC"
    figure = Figure(figsize=(10, 4.5), layout="constrained")
    FigureCanvasAgg(figure)
    axes = figure.add_subplot()
    if edges is None or counts is None or not len(counts):
        axes.text(0.5, 0.5, "nothing pending", ha="center", va="center")
        axes.set_axis_off()
    else:
        # matplotlib dates: days since the epoch (floats), so edges / 1 day in ms.
        left = edges[:-1] / 86_400_000
        widths = np.diff(edges) / 86_400_000
        axes.bar(left, counts, width=widths, align="edge", color="tab:blue", edgecolor="white")
        locator = mdates.AutoDateLocator(tz=UTC)  # type: ignore[no-untyped-call]
        axes.xaxis.set_major_locator(locator)
        formatter = mdates.ConciseDateFormatter(locator, tz=UTC)  # type: ignore[no-untyped-call]
        axes.xaxis.set_major_formatter(formatter)
        axes.set_xlabel("deliver at (UTC)")
        axes.set_ylabel("messages per bin")
        axes.yaxis.set_major_locator(MaxNLocator(integer=True))
        axes.grid(axis="y", alpha=0.3)
    axes.set_title(title)
    figure.savefig(path, dpi=100, format="png")


# -- pending --------------------------------------------------------------------------------------


def register(sub: Any) -> None:
    """Add ``pending`` to the CLI's subparsers."""
    pending = sub.add_parser(
        "pending",
        help="list the pending positions of an index in a time range, in delivery order",
        description="List index NAME's pending positions with start <= deliver_at < end in "
        "(deliver_at, ledger, entry) order, read offline from the store as a reopen at "
        "--now-ms would track them: the live snapshots' segments not wholly due, after the "
        "mark, cancelled positions dropped and rescheduled ones at their new times. The "
        "writer's memory-only indexes are not in the store (not listed). Read-only: takes no "
        "lock. " + EXIT_CODES_HELP,
        epilog="Exit 1: a snapshot is missing or damaged (its positions are not listed).",
    )
    pending.add_argument("store", type=Path, metavar="STORE", help="FileStorage directory")
    pending.add_argument("name", type=_name, metavar="NAME", help="the index name")
    add_range(pending, "list positions due")
    pending.add_argument(
        "--limit", type=_int_at_least(1), default=DEFAULT_LIMIT,
        help="list at most this many (default %(default)s)",
    )  # fmt: skip
    add_output(pending, "positions (an array of {deliver_at, ledger_id, entry_id})", None)
    add_now_ms(pending, "read the schedule as a reopen at this epoch-ms time would (default: now)")
    add_tick_ms(
        pending, "the writer's tick: segments wholly due at now + tick are skipped (default 0)", 0
    )
    pending.set_defaults(func=handler(_pending, STORE_ERRORS))


def _pending(args: argparse.Namespace, console: Console) -> int:
    from delayindex.schedule import read_schedule

    check_range(args.from_ms, args.to_ms)
    storage = _open_store(args.store)
    with storage:
        _check_names(storage, [args.name])
        now = _now_ms() if args.now_ms is None else args.now_ms
        schedule = read_schedule(storage, args.name, now_ms=now, tick_ms=args.tick_ms)
    rows = schedule.pending(args.from_ms, args.to_ms, args.limit + 1)
    more = len(rows) > args.limit
    rows = rows[: args.limit]
    code = schedule_exit([schedule])
    if args.json:
        import json

        items = [
            {"deliver_at": t, "ledger_id": p.ledger_id, "entry_id": p.entry_id} for t, p in rows
        ]
        console.out(json.dumps(items, indent=2), highlight=False)
        for note in _notes(schedule) if schedule.errors else ():
            Console(stderr=True).print(f"delayindex pending: {note}", soft_wrap=True)
        return code
    table = Table(title_justify="left")
    table.add_column("deliver at (UTC)")
    table.add_column("epoch ms", justify="right")
    table.add_column("position", justify="right")
    for t, p in rows:
        table.add_row(stamp_ms(t), str(t), f"{p.ledger_id}:{p.entry_id}")
    console.print(table)
    shown = f"{len(rows):,} listed"
    if more:
        shown += f" (--limit {args.limit}; more pending in the range)"
    console.print(f"{shown}; {len(schedule):,} pending in the store", highlight=False)
    for note in _notes(schedule):
        console.print(note, soft_wrap=True, highlight=False)
    return code
