"""What every ``delayindex`` command shares: exit codes, argparse types, the shared options,
store checks, time and size formatting, error and JSON printing, progress bars, and
:func:`handler`, which wraps a command so that its errors map to the CLI's exit codes.

The shared options (``--tick-ms``, ``--strict-delivery``, ``--store``, ``--json``, ...) are
defined here once, with their defaults read from :class:`delayindex.config.TrackerConfig`.
"""

from __future__ import annotations

import argparse
import functools
import json
import re
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from delayindex.config import TrackerConfig
from delayindex.errors import DelayIndexError
from delayindex.storage.file import FileStorage
from delayindex.storage.manifest import validate_key

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


def _subscription(text: str) -> tuple[str, tuple[int, int] | None]:
    """An argparse type: ``NAME`` or ``NAME=LEDGER:ENTRY`` (a subscription and its mark-delete
    position; the name ends at the last ``=``)."""
    name, sep, mark = text.rpartition("=") if "=" in text else (text, "", "")
    if not name:
        raise argparse.ArgumentTypeError(f"bad subscription {text!r}: use NAME[=LEDGER:ENTRY]")
    return name, _mark_delete(mark) if sep else None


def add_subscriptions(parser: argparse.ArgumentParser, what: str) -> None:
    """``--subscription NAME[=L:E]`` (repeatable): ``what`` says what the subscriptions do."""
    parser.add_argument(
        "--subscription", dest="subscriptions", type=_subscription, action="append",
        default=None, metavar="NAME[=L:E]",
        help=f"{what} (repeatable; the mark-delete position L:E, none if omitted)",
    )  # fmt: skip


def subscription_marks(
    args: argparse.Namespace,
) -> dict[str, tuple[int, int] | None] | None:
    """The ``--subscription`` values as name -> mark (None without any).

    Raises:
        _UsageError: a name given twice, or ``--mark-delete`` too (a shared index's mark is its
            subscriptions' lowest).
    """
    if args.subscriptions is None:
        return None
    marks = dict(args.subscriptions)
    if len(marks) != len(args.subscriptions):
        names = [n for n, _ in args.subscriptions]
        twice = sorted({n for n in names if names.count(n) > 1})
        raise _UsageError(f"--subscription {', '.join(twice)} given twice")
    if getattr(args, "mark_delete", None) is not None:
        raise _UsageError(
            "give --mark-delete or --subscription, not both: a shared index's mark-delete "
            "position is the lowest of its subscriptions' marks"
        )
    return marks


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


# -- shared options -----------------------------------------------------------------------------

#: A command handler: parsed arguments and the stdout console in, exit code out.
Handler = Callable[[argparse.Namespace, Console], int]
#: ``(exception types, exit code, kind)``: how :func:`handler` maps a command's errors.
ErrorMap = Sequence[tuple[tuple[type[BaseException], ...], int, str]]
#: The errors of the store commands (inspect, gc, fsck).
STORE_ERRORS: ErrorMap = (
    ((_UsageError,), EXIT_USAGE, "error"),
    ((DelayIndexError, OSError), EXIT_STORE_ERROR, "store error"),
)


def handler(run: Handler, errors: ErrorMap = ()) -> Handler:
    """``run`` with the exceptions of ``errors`` printed by :func:`_fail` as their exit code."""
    catch = tuple(t for types, _, _ in errors for t in types)
    if not catch:
        return run

    @functools.wraps(run)
    def wrapped(args: argparse.Namespace, console: Console) -> int:
        try:
            return run(args, console)
        except catch as exc:
            code, kind = next((c, k) for types, c, k in errors if isinstance(exc, types))
            return _fail(args.command, code, kind, exc)

    return wrapped


def add_tick_ms(parser: argparse.ArgumentParser, help: str, default: int | None = None) -> None:
    """``--tick-ms``; ``default`` None means ``TrackerConfig().tick_ms``, and ``%(default)s``
    in ``help`` shows the effective one."""
    tick = TrackerConfig().tick_ms if default is None else default
    parser.add_argument("--tick-ms", type=_int_at_least(0), default=tick, help=help)


def add_strict_delivery(parser: argparse.ArgumentParser, *, alias: bool = False) -> None:
    """``--strict-delivery`` (TrackerConfig.strict); ``alias`` also accepts the old ``--strict``."""
    flags = ("--strict-delivery", "--strict") if alias else ("--strict-delivery",)
    old = " (--strict: the old spelling)" if alias else ""
    parser.add_argument(
        *flags, dest="strict_delivery", action="store_true",
        default=TrackerConfig().strict,
        help=f"TrackerConfig.strict: due means deliver_at <= now (no tick slack){old}",
    )  # fmt: skip


def add_store(parser: argparse.ArgumentParser) -> None:
    """``--store``: a FileStorage directory (required)."""
    parser.add_argument("--store", required=True, type=Path, help="FileStorage directory")


def add_output(parser: argparse.ArgumentParser, what: str, progress: str | None) -> None:
    """``--json`` (print ``what`` as JSON) and, unless ``progress`` is None, ``--no-progress``."""
    parser.add_argument("--json", action="store_true", help=f"print the {what} as JSON")
    if progress is not None:
        parser.add_argument("--no-progress", action="store_true", help=f"hide the {progress}")


def add_now_ms(parser: argparse.ArgumentParser, help: str) -> None:
    """``--now-ms``: an epoch-ms time, default None (now)."""
    parser.add_argument("--now-ms", type=_int_at_least(0), default=None, help=help)


def add_bucket_options(parser: argparse.ArgumentParser) -> None:
    """``--min-index-count-per-bucket`` and ``--max-num-buckets`` of a build (TrackerConfig's
    defaults)."""
    defaults = TrackerConfig()
    parser.add_argument(
        "--min-index-count-per-bucket", type=_int_at_least(1),
        default=defaults.min_index_count_per_bucket,
        help="seal a bucket once it holds this many indexes (default %(default)s)",
    )  # fmt: skip
    parser.add_argument(
        "--max-num-buckets", type=int, default=defaults.max_num_buckets,
        help="merge adjacent buckets down to this many; <= 0: no merging (default %(default)s)",
    )  # fmt: skip


def tracker_config(args: argparse.Namespace) -> TrackerConfig:
    """The TrackerConfig of ``--tick-ms``, ``--strict-delivery`` and, where the command has
    them, the bucket options.

    Raises:
        _UsageError: a bad combination of values.
    """
    changes: dict[str, Any] = {"tick_ms": args.tick_ms, "strict": args.strict_delivery}
    for option in ("min_index_count_per_bucket", "max_num_buckets"):
        if hasattr(args, option):
            changes[option] = getattr(args, option)
    try:
        return TrackerConfig(**changes)
    except (TypeError, ValueError) as exc:
        raise _UsageError(str(exc)) from None
