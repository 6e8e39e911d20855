"""``delayindex inspect``, ``gc`` and ``fsck``: the commands that look at (and, for ``gc
--delete``, collect in) an existing FileStorage directory. ``inspect`` shows per name what
recovery would see (``delayindex.storeinfo``); ``gc`` finds unreferenced objects and
unfinished intents (``delayindex.garbage``); ``fsck`` reads every object and manifest generation in
full (``delayindex.fsck``). Each renders a report as tables or JSON; exit codes follow the
report (``_common.STORE_ERRORS`` maps the exceptions).
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from delayindex.cli._common import (
    EXIT_CHECK_FAILED,
    EXIT_CODES_HELP,
    EXIT_OK,
    EXIT_STORE_ERROR,
    MAX_ROWS,
    STORE_ERRORS,
    _check_names,
    _duration,
    _int_at_least,
    _name,
    _now_ms,
    _open_store,
    _print_json,
    _print_problems,
    _progress,
    _rel,
    _size,
    _stamp,
    _UsageError,
    _when,
    add_now_ms,
    add_output,
    add_store,
    add_tick_ms,
    handler,
    parse_grace,
)
from delayindex.cli.schedule import (
    DEFAULT_BINS,
    add_range,
    check_range,
    render_histogram,
    schedule_edges,
    schedule_exit,
    schedule_json,
    write_plot,
)
from delayindex.cli.watch import Render, add_watch, run_watch

if TYPE_CHECKING:
    from delayindex.garbage import GcReport, Orphan
    from delayindex.schedule import StoredSchedule
    from delayindex.storage.file import FileStorage
    from delayindex.storeinfo import NameInfo, PendingIntent, StoreInfo

#: Per name: its offline schedule, the histogram's edges and counts (None: no range).
Schedules = dict[str, tuple["StoredSchedule", Any, Any]]


def register(sub: Any) -> None:
    """Add ``inspect``, ``gc`` and ``fsck`` to the CLI's subparsers."""
    inspect = sub.add_parser(
        "inspect",
        help="show what a store holds: buckets, intents, dead letters, unpersisted counts",
        description="Show, per name, the live buckets as recovery would see them now (ledger "
        "range, segments, messages, bytes, the segment it would load and the next delivery "
        "time), pending intents, dead letters, the mark-delete position, the writer's "
        "unpersisted counts and whether a writer holds the name. For a shared index, each "
        "subscription with its mark-delete position and its backlog: the positions after its "
        "mark in the live buckets' segments from the loaded one on, counted offline from the "
        "snapshots' metadata bitmaps (what a reopen would still deliver to it; the writer's "
        "unpersisted indexes and unreadable buckets are not counted). Offline the backlog is "
        "the lag measure; the due-log lag exists only in a running process's "
        "SharedDelayIndex.stats()['subscriptions']. Read-only: takes no lock. " + EXIT_CODES_HELP,
        epilog="Exit 1: a snapshot is missing or unreadable, or dead letters remain.",
    )
    add_store(inspect)
    inspect.add_argument(
        "--name", type=_name, action="append", help="only this name (repeatable; default: all)"
    )
    add_output(inspect, "report", None)
    add_now_ms(inspect, "evaluate due segments at this epoch-ms time (default: now)")
    # Default 0 (strict), not TrackerConfig's tick: without --tick-ms inspect counts only
    # what is due by now, whatever tick the writer runs with.
    add_tick_ms(
        inspect, "the writer's tick: recovery's cutoff is now + tick (default 0: strict)", 0
    )
    inspect.add_argument(
        "--schedule", action="store_true",
        help="also show each name's pending schedule as a histogram (read offline from the "
        "snapshots' segments, as a reopen at --now-ms would track it)",
    )  # fmt: skip
    inspect.add_argument(
        "--bins", type=_int_at_least(1), default=None, metavar="N",
        help=f"histogram bins for --schedule (default {DEFAULT_BINS})",
    )  # fmt: skip
    add_range(inspect, "--schedule: bin the positions due")
    inspect.add_argument(
        "--plot", type=Path, default=None, metavar="FILE.png",
        help="also write the --schedule histogram as a PNG (one name; implies --schedule; "
        "needs matplotlib: the plot extra)",
    )  # fmt: skip
    add_watch(inspect)
    inspect.set_defaults(func=handler(_inspect, STORE_ERRORS))

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
    add_store(gc)
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
    add_now_ms(
        gc, "measure object ages (and run resumed catalogs) at this epoch-ms time (default: now)"
    )
    gc.add_argument("--delete", action="store_true", help="collect (default: dry run)")
    gc.add_argument(
        "--retry-dead-letters",
        action="store_true",
        help="with --delete: move dead letters back to pending deletes and retry them",
    )
    add_output(gc, "report", "progress bar")
    gc.set_defaults(func=handler(_gc, STORE_ERRORS))

    fsck = sub.add_parser(
        "fsck",
        help="read every object and manifest generation in full; report damage",
        description="Read every object of the store in full (header, metadata with its bitmaps "
        "checked, every segment decoded and checksummed) and every manifest and manifest "
        "history generation; report each damaged item by file and what is wrong. Read-only: "
        "takes no lock. " + EXIT_CODES_HELP,
        epilog="Exit 1: something is damaged. Exit 0: everything read back intact.",
    )
    add_store(fsck)
    fsck.add_argument(
        "--name", type=_name, action="append", help="only this name's manifests (repeatable)"
    )
    add_output(fsck, "report", "progress bar")
    fsck.set_defaults(func=handler(_fsck, STORE_ERRORS))


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
        if not name.subscriptions:
            del item["subscriptions"]  # a per-subscription index: its keys as before
        for sub in item.get("subscriptions", ()):
            sub["lag"] = sub["backlog"]  # offline, the backlog is the lag (module docs)
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


def _subscription_table(name: NameInfo) -> Table:
    """A shared index's subscriptions: mark and backlog (offline, the lag)."""
    table = Table(title="subscriptions (shared index)", title_justify="left")
    table.add_column("subscription", overflow="fold")
    table.add_column("mark-delete", justify="right")
    table.add_column("backlog (lag)", justify="right")
    for sub in name.subscriptions:
        mark = "-" if sub.mark_delete is None else f"{sub.mark_delete[0]}:{sub.mark_delete[1]}"
        table.add_row(escape(sub.name), mark, f"{sub.backlog:,}")
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


def _inspect_human(
    console: Console, info: StoreInfo, store: Path, schedules: Schedules | None = None
) -> None:
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
        if name.subscriptions:
            console.print(_subscription_table(name))
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
        if schedules and name.name in schedules:
            render_histogram(console, *schedules[name.name])
    console.print()
    _print_problems(console, info.problems(), "every snapshot readable, no dead letters.")


def _schedule_args(args: argparse.Namespace, names: list[str]) -> bool:
    """Whether to read the schedules; refuses schedule options that cannot apply.

    Raises:
        _UsageError: ``--bins``/``--from``/``--to`` without ``--schedule`` or ``--plot``, an
            empty range, or ``--plot`` over other than one name.
    """
    wanted = bool(args.schedule or args.plot is not None)
    extra = [
        flag
        for flag, value in (("--bins", args.bins), ("--from", args.from_ms), ("--to", args.to_ms))
        if value is not None
    ]
    if extra and not wanted:
        raise _UsageError(f"{', '.join(extra)} apply to the schedule: add --schedule")
    check_range(args.from_ms, args.to_ms)
    if args.plot is not None and len(names) != 1:
        raise _UsageError(
            f"--plot draws one name's schedule; choose one with --name (this store has "
            f"{len(names)}: {', '.join(names) or 'none'})"
        )
    return wanted


def _read_schedules(args: argparse.Namespace, storage: FileStorage, info: StoreInfo) -> Schedules:
    """Each readable name's schedule and its histogram over the requested bins."""
    from delayindex.schedule import read_schedule

    out: Schedules = {}
    bins = DEFAULT_BINS if args.bins is None else args.bins
    for name in info.names:
        if name.error:
            continue  # a damaged manifest: reported (exit 3)
        schedule = read_schedule(storage, name.name, now_ms=info.now_ms, tick_ms=info.tick_ms)
        edges = schedule_edges(schedule, bins, args.from_ms, args.to_ms)
        counts = None if edges is None else schedule.due_histogram(edges)
        out[name.name] = (schedule, edges, counts)
    return out


def _inspect(args: argparse.Namespace, console: Console) -> int:
    if args.watch is not None:
        if args.plot is not None:
            raise _UsageError("--plot writes one picture: not with --watch")
        return run_watch(args, console, lambda: _inspect_once(args))
    if args.metrics_url is not None:
        raise _UsageError("--metrics-url goes with --watch")
    code, payload, render = _inspect_once(args)
    if args.json:
        _print_json(console, payload)
    else:
        render(console)
    return code


def _inspect_once(args: argparse.Namespace) -> tuple[int, dict[str, Any], Render]:
    """Read the store once: the exit code, the JSON report and a function printing the
    human one (writes the --plot picture)."""
    from delayindex.storeinfo import inspect_store

    storage = _open_store(args.store)
    with storage:
        names = _check_names(storage, args.name)
        wanted = _schedule_args(args, names if names is not None else storage.list_manifests())
        now = _now_ms() if args.now_ms is None else args.now_ms
        info = inspect_store(storage, now_ms=now, tick_ms=args.tick_ms, names=names)
        schedules = _read_schedules(args, storage, info) if wanted else {}
    code = _inspect_exit(info)
    if schedules:
        code = max(code, schedule_exit([s for s, _, _ in schedules.values()]))
    if args.plot is not None and schedules:
        ((name, (_, edges, counts)),) = schedules.items()
        total = 0 if counts is None else int(counts.sum())
        write_plot(args.plot, f"{args.store} / {name}: {total:,} pending (UTC)", edges, counts)
    payload = _inspect_json(info, args.store, code)
    for item in payload["names"]:
        if item["name"] in schedules:
            item["schedule"] = schedule_json(*schedules[item["name"]])
    if args.plot is not None:
        payload["plot"] = str(args.plot)

    def render(console: Console) -> None:
        _inspect_human(console, info, args.store, schedules)
        if args.plot is not None and schedules:
            console.print(f"wrote {escape(str(args.plot))}", soft_wrap=True)

    return code, payload, render


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
    from delayindex.garbage import run_gc

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
