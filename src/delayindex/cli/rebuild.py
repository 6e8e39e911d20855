"""``delayindex rebuild`` and ``delayindex verify``: the Spark commands that read a topic dump.
``rebuild`` builds an index from the dump and publishes it with one manifest commit
(``delayindex.spark.rebuild``); ``verify`` checks a store against the dump
(``delayindex.spark.verify``, or in-process with ``--no-spark``). Both share their options,
the TrackerConfig they assemble from them, the Spark session and the error mapping.

With ``DELAYINDEX_SPARK_CLASS_ARCHIVE=on`` (or a file name), the session they start keeps a
class archive of Spark's JVM classes (about 150 MB, written by the first run as its JVM exits,
which makes that run about half a minute longer) in ``~/.cache/delayindex``
(``$XDG_CACHE_HOME``): later runs start their JVM with about half the CPU (10 M rows: 15 s
instead of 22 s in all). Off by default (``delayindex.spark.default_class_archive``).
"""

from __future__ import annotations

import argparse
import functools
import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from delayindex.cli._common import (
    DUMP_FORMAT_CHOICES,
    EXIT_CHECK_FAILED,
    EXIT_CODES_HELP,
    EXIT_OK,
    EXIT_STORE_ERROR,
    EXIT_USAGE,
    MAX_ROWS,
    Handler,
    _check_store,
    _fail,
    _int_at_least,
    _mark_delete,
    _name,
    _print_json,
    _progress,
    _size,
    _stamp,
    _UsageError,
    add_bucket_options,
    add_now_ms,
    add_output,
    add_store,
    add_strict_delivery,
    add_subscriptions,
    add_tick_ms,
    parse_grace,
    subscription_marks,
    tracker_config,
)
from delayindex.errors import DelayIndexError

#: Dumps smaller than this (about 4 M Parquet rows) run on a quick-start JVM (C1 only); larger
#: ones that the scan shuffles get the full JIT, whose faster shuffle and Arrow conversion then
#: repay its slower start (10 M rows: 14.1 s in all instead of 15.6 s, session start included).
#: A dump the scan splits by ledger range (no shuffle; the JVM only schedules) always gets the
#: quick start.
QUICK_START_BYTES = 16 << 20


def register(sub: Any) -> None:
    """Add ``rebuild`` and ``verify`` to the CLI's subparsers."""
    rebuild = sub.add_parser(
        "rebuild",
        help="rebuild an index from a topic dump with Spark (offline, instead of a replay)",
        description="Rebuild index NAME in the store from a topic dump with Spark: keep the "
        "delayed, not yet due, unacknowledged messages, cut buckets by the online tracker's "
        "sealing rule, build the snapshots on the executors and publish them with one manifest "
        "commit that replaces whatever NAME held. A killed run leaves no orphan; a re-run gives "
        "the same index. Needs the spark extra and Java 17+. " + EXIT_CODES_HELP,
        epilog="Exit 1: --fail-on-rejected (--strict) and the dump has rejected rows (nothing was "
        "written).",
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
        add_store(cmd)
        cmd.add_argument("--name", required=True, type=_name, help="the index name")
        add_now_ms(cmd, "the time the index is as of, epoch ms (default: now)")
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
        cmd.add_argument(
            "--fail-on-rejected", "--strict", dest="fail_on_rejected", action="store_true",
            help="fail if any dump row is rejected (--strict: the old spelling)",
        )  # fmt: skip
        cmd.add_argument("--master", default="local[*]", help="Spark master (default local[*])")
        cmd.add_argument("--driver-memory", default="1g", help="Spark driver memory (default 1g)")
        cmd.add_argument(
            "--partitions", type=_int_at_least(1), default=None,
            help="scan tasks (default: 2 per core, or one per 8 MB of Parquet)",
        )  # fmt: skip
        add_tick_ms(
            cmd, "TrackerConfig.tick_ms: due means deliver_at <= now + tick (default %(default)s)"
        )
        add_strict_delivery(cmd)
        add_subscriptions(
            cmd,
            "a shared index's subscription and its mark: build (check) NAME as the shared "
            "index of these subscriptions, keeping the rows after the lowest mark"
            if cmd is rebuild
            else "check NAME as a shared index, per subscription: the rows after its mark",
        )
        add_output(cmd, "report", "progress bars")
        cmd.set_defaults(func=_handle_errors(_rebuild_cmd if cmd is rebuild else _verify_cmd))
    add_bucket_options(rebuild)
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


@contextmanager
def _spark_session(args: argparse.Namespace, dump_bytes: int) -> Iterator[Any]:
    """A Spark session for one command (``delayindex.spark.session_for``)."""
    from delayindex.spark import default_class_archive, scans_without_shuffle, session_for

    quick = dump_bytes < QUICK_START_BYTES or scans_without_shuffle(args.dump, args.format)
    with session_for(
        args.master,
        driver_memory=args.driver_memory,
        quick_start=quick,
        class_archive=default_class_archive(),
        app_name=f"delayindex {args.command}",
        lazy=True,  # Spark SQL only if the scan needs it (not for a dump in topic order)
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
        ("mark-delete" + (" (lowest subscription)" if report.subscriptions else ""),
         _position(report.mark_delete)),
        *((f"  subscription {escape(sub.name)}", _position(sub.mark_delete))
          for sub in report.subscriptions),
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
        + _marks_argv(report),
        soft_wrap=True,
        highlight=False,
    )  # fmt: skip


def _position(mark: tuple[int, int] | None) -> str:
    return "-" if mark is None else f"{mark[0]}:{mark[1]}"


def _marks_argv(report: Any) -> str:
    """The ``--mark-delete``/``--subscription`` options that verify a rebuild's result."""
    if report.subscriptions:
        return "".join(
            f" --subscription {escape(s.name)}"
            + (f"={_position(s.mark_delete)}" if s.mark_delete else "")
            for s in report.subscriptions
        )
    return f" --mark-delete {_position(report.mark_delete)}" if report.mark_delete else ""


def _subscription_table(checks: Any) -> Table:
    """A shared index's verify, per subscription."""
    table = Table(title="subscriptions", title_justify="left")
    for column, justify in (
        ("subscription", "left"),
        ("mark-delete", "right"),
        ("expected", "right"),
        ("in the store", "right"),
        ("", "left"),
    ):
        table.add_column(column, justify=justify)  # type: ignore[arg-type]
    for c in checks:
        table.add_row(
            escape(c.name),
            _position(c.mark_delete),
            f"{c.expected:,}",
            f"{c.found:,}",
            "[green]ok[/]" if c.ok else "[red]mismatch[/]",
        )
    return table  # fmt: skip


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
    if report.subscriptions:
        console.print(_subscription_table(report.subscriptions))
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
    from delayindex.spark import check_dump, rebuild

    config = tracker_config(args)
    subscriptions = subscription_marks(args)  # usage errors before the JVM starts
    check_dump(args.dump, args.format)  # so is a bad dump path or name
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
            subscriptions=subscriptions,
            strict=args.fail_on_rejected,
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
    from delayindex.spark import check_dump, verify

    config = tracker_config(args)
    _check_store(args.store)
    show = not (args.json or args.no_progress)
    kwargs: dict[str, Any] = {
        "now_ms": args.now_ms,
        "mark_delete": args.mark_delete,
        "subscriptions": subscription_marks(args),
        "strict": args.fail_on_rejected,
        "fmt": args.format,  # verify normalizes the json alias
        "orphan_grace_ms": args.grace,
    }
    if args.no_spark:
        report = verify(None, args.dump, args.store, args.name, config, **kwargs)
    else:
        check_dump(args.dump, args.format)  # before the JVM starts
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


def _handle_errors(run: Handler) -> Handler:
    """``rebuild``/``verify`` with their errors mapped to exit codes (``delayindex.cli`` docs)."""

    @functools.wraps(run)
    def wrapped(args: argparse.Namespace, console: Console) -> int:
        from delayindex.dump import DumpError
        from delayindex.spark import SparkUnavailableError

        try:
            return run(args, console)
        except DumpError as exc:
            if exc.report is not None and not exc.report.ok:  # --fail-on-rejected found some
                errors = Console(stderr=True)
                for line in _reject_lines(exc.report):
                    errors.print(line, highlight=False, soft_wrap=True)
                return _fail(args.command, EXIT_CHECK_FAILED, "rejected rows (--strict)", exc)
            return _fail(args.command, EXIT_USAGE, "bad dump", exc)
        except (_UsageError, FileNotFoundError, SparkUnavailableError, ImportError) as exc:
            return _fail(args.command, EXIT_USAGE, "error", exc)
        except (DelayIndexError, OSError) as exc:
            return _fail(args.command, EXIT_STORE_ERROR, "store error", exc)

    return wrapped
