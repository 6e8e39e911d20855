"""``delayindex clear`` and ``delayindex migrate``: the shared index's admin commands.

``clear STORE NAME`` opens index NAME as its writer (so its dispatcher must be stopped) and
calls ``clear()``: every position goes, the snapshots are deleted through the two-phase protocol
and the mark-delete position is reset; for a shared index (a manifest with subscription
records) every subscription's progress and mark are reset too, and the subscriptions stay.
``clear STORE NAME --subscription S`` drops subscription S of shared index NAME for good
(``SharedDelayIndex.unsubscribe``): the topic's mark moves up to the lowest remaining mark, and
buckets only S still needed are deleted. These are PIP-195's two admin commands.

``migrate STORE --to TOPIC --from SUB=INDEX...`` replaces per-subscription indexes with one
shared index (PIP-195's "Compatibility"): :func:`delayindex.rebuild.migrate.build_shared` builds
TOPIC from a topic dump (``--dump``) or from the old indexes' live snapshots, each old index's
mark becoming its subscription's mark, and verifies it per subscription; only then are the old
indexes cleared as ``clear`` does (unless ``--keep-old``). If the build or the verify fails, no
old index is touched (exit 1).

Nothing is asked interactively; each command prints what it did (or ``--json``). Exit codes:
0 done, 1 an unknown name or subscription, a refused or failed migration, 2 usage (bad
arguments, no store at STORE, an unreadable dump), 3 store error (a writer holds a name, an
I/O failure, deletes left pending).
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from delayindex.cli._common import (
    DUMP_FORMAT_CHOICES,
    EXIT_CHECK_FAILED,
    EXIT_CODES_HELP,
    EXIT_OK,
    EXIT_STORE_ERROR,
    STORE_ERRORS,
    _name,
    _now_ms,
    _open_store,
    _print_json,
    _progress,
    _size,
    _stamp,
    _UsageError,
    add_bucket_options,
    add_now_ms,
    add_output,
    add_strict_delivery,
    add_tick_ms,
    handler,
    tracker_config,
)
from delayindex.errors import DelayIndexError, StoreLockedError

if TYPE_CHECKING:
    from delayindex.rebuild.migrate import MigrationReport
    from delayindex.storage.base import SnapshotStorage
    from delayindex.storage.manifest import Manifest


class _NotFound(Exception):
    """An unknown index or subscription (exit 1)."""


def register(sub: Any) -> None:
    """Add ``clear`` and ``migrate`` to the CLI's subparsers."""
    clear = sub.add_parser(
        "clear",
        help="clear an index (every position and mark), or drop one subscription of a shared one",
        description="Without --subscription: clear index NAME, a per-subscription index or a "
        "shared one: every position, its snapshots (deleted through the two-phase protocol) "
        "and its mark-delete position; a shared index's subscriptions stay subscribed with "
        "their progress and marks reset. With --subscription S: drop subscription S of shared "
        "index NAME for good; the buckets only it still needed are deleted. The index is "
        "opened as its writer: stop its dispatcher first. " + EXIT_CODES_HELP,
        epilog="Exit 1: no index NAME, or no subscription S of it. Exit 3: a writer holds NAME, "
        "or snapshot deletes failed (they stay pending; `delayindex gc --delete` resumes them).",
    )
    clear.add_argument("store", type=Path, metavar="STORE", help="FileStorage directory")
    clear.add_argument("name", type=_name, metavar="NAME", help="the index name")
    clear.add_argument(
        "--subscription", default=None, metavar="S",
        help="drop only this subscription of the shared index NAME",
    )  # fmt: skip
    add_output(clear, "result", None)
    not_found = ((_NotFound,), EXIT_CHECK_FAILED, "error")
    clear.set_defaults(func=handler(_clear, (not_found, *STORE_ERRORS)))

    migrate = sub.add_parser(
        "migrate",
        help="replace per-subscription indexes with one shared index (build, verify, clear)",
        description="Build shared index TOPIC for the subscriptions given by --from SUB=INDEX "
        "(each with its per-subscription index): from a topic dump with --dump (the offline "
        "rebuild), else from the old indexes' live snapshots (their positions after their "
        "marks, with the stored deliver times). Each old index's mark-delete position becomes "
        "its subscription's mark. TOPIC is verified per subscription; only then are the old "
        "indexes cleared (not with --keep-old). If building or verifying fails, no old index "
        "is touched. The old indexes are locked while they are read: stop their dispatchers "
        "first. " + EXIT_CODES_HELP,
        epilog="Exit 1: refused (an unknown or damaged old index, TOPIC already in use) or the "
        "build or verify failed; the old indexes are untouched. Exit 3: a writer holds a name, "
        "or clearing an old index failed after TOPIC was verified.",
    )
    migrate.add_argument("store", type=Path, metavar="STORE", help="FileStorage directory")
    migrate.add_argument("--to", required=True, type=_name, metavar="TOPIC",
                         help="the shared index to build (a new name)")  # fmt: skip
    migrate.add_argument(
        "--from", dest="sources", required=True, action="append", type=_source,
        metavar="SUB=INDEX", help="a subscription and its old index (repeatable)",
    )  # fmt: skip
    migrate.add_argument("--dump", type=Path, default=None, help="build from this topic dump")
    migrate.add_argument("--format", choices=DUMP_FORMAT_CHOICES, default=None,
                         help="dump format (default: from the file names)")  # fmt: skip
    migrate.add_argument(
        "--keep-old", action="store_true",
        help="build and verify, but leave the old indexes as they are",
    )  # fmt: skip
    add_now_ms(migrate, "the time the shared index is as of, epoch ms (default: now)")
    add_tick_ms(
        migrate, "TrackerConfig.tick_ms: due means deliver_at <= now + tick (default %(default)s)"
    )
    add_strict_delivery(migrate)
    add_bucket_options(migrate)
    add_output(migrate, "report", "progress bars")
    migrate.set_defaults(func=handler(_migrate, STORE_ERRORS))


def _source(text: str) -> tuple[str, str]:
    """An argparse type: ``SUB=INDEX``."""
    sub, sep, index = text.rpartition("=")
    if not sep or not sub:
        raise argparse.ArgumentTypeError(f"bad --from {text!r}: use SUBSCRIPTION=INDEX")
    return sub, _name(index)


# -- clear ----------------------------------------------------------------------------------------


def _state(manifest: Manifest) -> dict[str, Any]:
    """What a manifest holds, as plain data."""
    return {
        "buckets": len(manifest.buckets),
        "messages": sum(b.num_messages for b in manifest.buckets),
        "snapshot_bytes": sum(b.snapshot_bytes for b in manifest.buckets),
        "mark_delete": list(manifest.mark_delete) if manifest.mark_delete else None,
        "subscriptions": {
            s.name: list(s.mark_delete) if s.mark_delete else None for s in manifest.subscriptions
        },
    }


def clear_index(
    storage: SnapshotStorage, name: str, subscription: str | None = None
) -> dict[str, Any]:
    """Clear index ``name`` (or drop ``subscription`` of the shared index ``name``) as its
    writer, and return what was done (``_clear``'s JSON, without the command fields).

    Raises:
        _NotFound: no such index or subscription.
        StoreLockedError, DelayIndexError, OSError: as :meth:`DelayIndex.open`.
    """
    from delayindex import DelayIndex, SharedDelayIndex
    from delayindex.executors import InlineExecutor

    if name not in storage.list_manifests():
        names = ", ".join(sorted(storage.list_manifests())) or "none"
        raise _NotFound(f"no index named {name!r} in the store (names: {names})")
    before = storage.read_manifest(name)
    shared = bool(before.subscriptions)
    if subscription is not None:
        subs = [s.name for s in before.subscriptions]
        if subscription not in subs:
            what = f"subscriptions: {', '.join(subs)}" if subs else "not a shared index"
            raise _NotFound(f"{name} has no subscription {subscription!r} ({what})")
    if shared or subscription is not None:
        with SharedDelayIndex.open(storage, name, executor=InlineExecutor()) as index:
            if subscription is None:
                index.clear()
            else:
                index.unsubscribe(subscription)
            index.flush()
    else:
        with DelayIndex.open(storage, name, executor=InlineExecutor()) as plain:
            plain.clear()
            plain.flush()
    after = storage.read_manifest(name)
    return {
        "name": name,
        "kind": "shared" if shared else "index",
        "subscription": subscription,
        "action": "cleared" if subscription is None else "unsubscribed",
        "before": _state(before),
        "after": _state(after),
        "deleted_snapshots": sorted(before.live_ids() - after.live_ids()),
        "pending_deletes": sorted(i.snapshot_id for i in after.intents if i.kind == "delete"),
        "dead_letters": sorted(d.snapshot_id for d in after.dead_letters),
    }


def _mark_text(mark: list[int] | None) -> str:
    return "-" if mark is None else f"{mark[0]}:{mark[1]}"


def _clear_lines(done: dict[str, Any]) -> list[str]:
    """Human lines about one :func:`clear_index` result."""
    before, after = done["before"], done["after"]
    freed = (
        f"{len(done['deleted_snapshots'])} snapshot(s) deleted "
        f"({before['messages'] - after['messages']:,} indexes, "
        f"{_size(before['snapshot_bytes'] - after['snapshot_bytes'])})"
    )
    marks = f"mark-delete {_mark_text(before['mark_delete'])} -> {_mark_text(after['mark_delete'])}"
    if done["action"] == "cleared":
        what = "shared index" if done["kind"] == "shared" else "index"
        lines = [f"cleared {what} {done['name']}: {freed}", f"  {marks}"]
        if before["subscriptions"]:
            was = ", ".join(
                f"{n} (was {_mark_text(m)})" for n, m in before["subscriptions"].items()
            )
            lines.append(f"  subscriptions kept, progress and marks reset: {was}")
        return lines
    sub = done["subscription"]
    left = ", ".join(after["subscriptions"]) or "none"
    lines = [
        f"dropped subscription {sub} of shared index {done['name']} (its mark was "
        f"{_mark_text(before['subscriptions'][sub])})",
        f"  {marks} (the lowest of the remaining subscriptions: {left})",
        f"  released what only it still needed: {freed}",
    ]
    if not after["subscriptions"] and after["buckets"]:
        lines.append(
            f"  no subscription is left: {done['name']} still holds {after['buckets']} "
            f"bucket(s); `delayindex clear STORE {done['name']}` drops them"
        )
    return lines


def _pending_problem(done: dict[str, Any]) -> str | None:
    left = len(done["pending_deletes"]) + len(done["dead_letters"])
    if not left:
        return None
    return (
        f"{done['name']}: {left} snapshot deletes failed and stay journaled; "
        "`delayindex gc --store STORE --delete --retry-dead-letters` resumes them"
    )


def _clear(args: argparse.Namespace, console: Console) -> int:
    storage = _open_store(args.store)
    with storage:
        done = clear_index(storage, args.name, args.subscription)
    problem = _pending_problem(done)
    code = EXIT_STORE_ERROR if problem else EXIT_OK
    if args.json:
        _print_json(console, {"command": "clear", "store": str(args.store), **done,
                              "exit_code": code})  # fmt: skip
        return code
    for line in _clear_lines(done):
        console.print(escape(line), highlight=False, soft_wrap=True)
    if problem:
        console.print(f"[red]store error:[/] {escape(problem)}", soft_wrap=True)
    return code


# -- migrate --------------------------------------------------------------------------------------


def _sources(args: argparse.Namespace) -> dict[str, str]:
    sources = dict(args.sources)
    if len(sources) != len(args.sources):
        raise _UsageError("each --from needs its own subscription name")
    return sources


def _migrate_table(report: MigrationReport) -> Table:
    table = Table(title="subscriptions", title_justify="left")
    for column, justify in (
        ("subscription", "left"),
        ("old index", "left"),
        ("mark-delete", "right"),
        ("old index (not due)", "right"),
        ("shared index gives it", "right"),
        ("verify", "left"),
    ):
        table.add_column(column, justify=justify, overflow="fold")  # type: ignore[arg-type]
    checks = {c.name: c for c in report.verify.subscriptions}
    for old in report.old:
        check = checks[old.subscription]
        held = "-" if old.pending is None else f"{old.pending:,}"
        table.add_row(
            escape(old.subscription),
            escape(old.name),
            "-" if old.mark_delete is None else f"{old.mark_delete[0]}:{old.mark_delete[1]}",
            held,
            f"{check.found:,}",
            "[green]ok[/]" if check.ok else "[red]mismatch[/]",
        )
    return table  # fmt: skip


def _migrate(args: argparse.Namespace, console: Console) -> int:
    from delayindex.dump import DumpError, read_dump
    from delayindex.rebuild.migrate import MigrationError, build_shared

    sources = _sources(args)
    config = tracker_config(args)
    now = _now_ms() if args.now_ms is None else args.now_ms
    storage = _open_store(args.store)
    payload: dict[str, Any] = {
        "command": "migrate", "store": str(args.store), "to": args.to, "from": sources,
        "dump": None if args.dump is None else str(args.dump), "now_ms": now, "cleared": [],
        "kept_old": False,
    }  # fmt: skip
    try:
        dump = None
        if args.dump is not None:
            try:
                dump = read_dump(args.dump, args.format)[0]
            except (DumpError, FileNotFoundError) as exc:
                raise _UsageError(f"bad dump: {exc}") from None
        with _progress(not (args.json or args.no_progress), "migrate") as progress:
            try:
                report = build_shared(
                    storage, args.to, sources, config, now_ms=now, dump=dump, progress=progress
                )
            except MigrationError as exc:
                return _migrate_failed(console, args, payload, f"refused: {exc}")
            except StoreLockedError:
                raise  # a running writer: a store error (exit 3)
            except (DelayIndexError, OSError, ValueError) as exc:
                return _migrate_failed(console, args, payload, f"the build failed: {exc}")
            payload["report"] = report.as_dict()
            if not report.ok:
                counts = ", ".join(f"{k} {v:,}" for k, v in report.verify.counts().items())
                return _migrate_failed(
                    console, args, payload,
                    f"the verify of {args.to} found {counts}; {args.to} is left for inspection "
                    f"(`delayindex clear {args.store} {args.to}` removes it)", report,
                )  # fmt: skip
            code = EXIT_OK
            if args.keep_old:
                payload["kept_old"] = True
            else:
                code = _clear_old(storage, report, payload, progress)
    finally:
        storage.close()
    payload["exit_code"] = code
    if args.json:
        _print_json(console, payload)
    else:
        _migrate_human(console, args, report, payload)
    return code


def _clear_old(
    storage: SnapshotStorage, report: MigrationReport, payload: dict[str, Any], progress: Any
) -> int:
    """Clear every old index that has not changed since it was read; the exit code."""
    code = EXIT_OK
    payload["not_cleared"] = {}
    for k, old in enumerate(report.old):
        try:
            if storage.read_manifest(old.name).version != old.version:
                raise DelayIndexError(f"{old.name} changed since it was read (a writer ran)")
            done = clear_index(storage, old.name)
        except (DelayIndexError, OSError, _NotFound) as exc:
            payload["not_cleared"][old.name] = str(exc)
            code = EXIT_STORE_ERROR
        else:
            payload["cleared"].append(done)
            if _pending_problem(done):
                code = EXIT_STORE_ERROR
        progress("clear", k + 1, len(report.old))
    return code


def _migrate_failed(
    console: Console,
    args: argparse.Namespace,
    payload: dict[str, Any],
    why: str,
    report: MigrationReport | None = None,
) -> int:
    payload.update(error=why, exit_code=EXIT_CHECK_FAILED)
    if args.json:
        _print_json(console, payload)
        return EXIT_CHECK_FAILED
    if report is not None:
        console.print(_migrate_table(report))
        for f in report.blocking[:10]:
            console.print(f"  {f.kind}: {escape(f.message)}", highlight=False, soft_wrap=True)
    console.print(f"[red]migration failed:[/] {escape(why)}", soft_wrap=True, highlight=False)
    console.print("the old indexes were not touched")
    return EXIT_CHECK_FAILED


def _migrate_human(
    console: Console, args: argparse.Namespace, report: MigrationReport, payload: dict[str, Any]
) -> None:
    olds = ", ".join(f"{o.name} ({o.subscription})" for o in report.old)
    source = (f"the topic dump {args.dump}" if args.dump is not None
              else "the old indexes' live snapshots")  # fmt: skip
    console.print(
        f"[bold]migrate[/] {escape(str(args.store))}: {escape(olds)} -> shared index "
        f"{escape(args.to)}", soft_wrap=True, highlight=False,
    )  # fmt: skip
    console.print(
        f"  source: {escape(source)}, as of {_stamp(report.now_ms)} (now_ms={report.now_ms})",
        soft_wrap=True, highlight=False,
    )  # fmt: skip
    console.print(_migrate_table(report))
    built = report.build
    mark = "-" if built.mark_delete is None else f"{built.mark_delete[0]}:{built.mark_delete[1]}"
    console.print(
        f"built {escape(args.to)}: {len(built.buckets)} bucket(s), {built.tracked:,} positions "
        f"({_size(built.snapshot_bytes)}), topic mark-delete {mark} (the lowest)",
        highlight=False, soft_wrap=True,
    )  # fmt: skip
    console.print(f"verified {escape(args.to)} per subscription: ok", highlight=False)
    for note in report.notes:
        console.print(f"[yellow]note:[/] {escape(note)}", soft_wrap=True)
    for done in payload["cleared"]:
        for line in _clear_lines(done):
            console.print(escape(line), highlight=False, soft_wrap=True)
    for name, why in payload.get("not_cleared", {}).items():
        console.print(f"[red]not cleared:[/] {escape(name)}: {escape(why)}", soft_wrap=True)
    if payload["kept_old"]:
        console.print("--keep-old: the old indexes were left as they are")
    if payload["exit_code"] == EXIT_OK:
        console.print(
            f"[green]ok:[/] shared index {escape(args.to)} serves "
            f"{', '.join(escape(o.subscription) for o in report.old)}; open it with "
            f"SharedDelayIndex.open(storage, {args.to!r})", soft_wrap=True, highlight=False,
        )  # fmt: skip
    else:
        console.print(
            f"[red]store error:[/] {escape(args.to)} is built and verified, but not every old "
            "index was cleared: `delayindex clear` them once their writers are stopped",
            soft_wrap=True,
        )


__all__ = ["clear_index", "register"]
