"""What a rebuild reads and what it keeps: input checks, the cutoff and the tracked mask.

How it works: the dump's three columns are checked (equal length, int64, ids in range, no
position twice) and classified as an online tracker at ``now_ms`` would: a row is tracked when
delayed (``deliver_at >= 0``), not due (``deliver_at > cutoff``, the cutoff being
:func:`delayindex.policy.cutoff_ms`) and, with a mark-delete position, after it (a dispatcher
reads the topic from its cursor's mark-delete position on). :class:`Classification` counts every
skipped row once, by its first reason; :class:`Tally` is what a rebuild report carries of it.

Invariants: nothing here changes the dump's arrays (masks and copies only); bad input raises
``ValueError``/``TypeError`` before anything else runs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple, Protocol

import numpy as np
import numpy.typing as npt

from delayindex._ints import INT64_MAX as _INT64_MAX
from delayindex._ints import INT64_MIN, as_int, int64_array
from delayindex.config import TrackerConfig
from delayindex.dump import is_position_sorted
from delayindex.model import MAX_ENTRY_ID, MAX_LEDGER_ID
from delayindex.policy import cutoff_ms
from delayindex.storage.manifest import validate_key

Int64Array = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]


class PositionColumns(Protocol):
    """What the rebuild reads of a dump: equal-length int64 columns, one row per message."""

    @property
    def ledger_ids(self) -> Int64Array:
        """Ledger id of each message."""
        ...

    @property
    def entry_ids(self) -> Int64Array:
        """Entry id of each message."""
        ...

    @property
    def deliver_at(self) -> Int64Array:
        """Deliver time (epoch ms) of each message; negative: not delayed."""
        ...


# -- input checks -----------------------------------------------------------------------------


def _int(value: object, what: str, low: int = INT64_MIN, high: int = _INT64_MAX) -> int:
    return as_int(what, value, low, high)


def _mark(mark_delete: object) -> tuple[int, int] | None:
    if mark_delete is None:
        return None
    if not isinstance(mark_delete, tuple | list) or len(mark_delete) != 2:
        raise TypeError(f"mark_delete must be (ledger_id, entry_id) or None, got {mark_delete!r}")
    return (
        _int(mark_delete[0], "mark_delete ledger_id", 0, MAX_LEDGER_ID),
        _int(mark_delete[1], "mark_delete entry_id", 0, MAX_ENTRY_ID),
    )


def _config(config: object) -> TrackerConfig:
    if not isinstance(config, TrackerConfig):
        raise TypeError(f"config must be a TrackerConfig, got {type(config).__name__}")
    return config


def check_arguments(
    name: str, config: object, now_ms: object, mark_delete: object
) -> tuple[TrackerConfig, int, tuple[int, int] | None]:
    """Check the arguments every rebuild and verify takes; return config, ``now_ms``, mark.

    Raises:
        ValueError: a bad index name, ``now_ms`` beyond int64, an id of the mark out of range.
        TypeError: config not a TrackerConfig, ``now_ms`` or an id not an int, a mark that is
            not a ``(ledger_id, entry_id)`` pair.
    """
    validate_key(name, "index name")
    return _config(config), _int(now_ms, "now_ms"), _mark(mark_delete)


def _array(values: object, what: str) -> Int64Array:
    return int64_array(values, what)  # strict: floats raise, never truncate


def _columns(columns: PositionColumns) -> tuple[Int64Array, Int64Array, Int64Array]:
    """The three columns as int64 arrays of equal length (no copy when they already are)."""
    try:
        raw = (columns.ledger_ids, columns.entry_ids, columns.deliver_at)
    except AttributeError as exc:
        raise TypeError(
            f"columns must have ledger_ids, entry_ids and deliver_at (a DumpColumns), "
            f"got {type(columns).__name__}"
        ) from exc
    ledgers, entries, times = (
        _array(v, n) for v, n in zip(raw, ("ledger_ids", "entry_ids", "deliver_at"), strict=True)
    )
    if not len(ledgers) == len(entries) == len(times):
        raise ValueError(
            f"columns differ in length: ledger_ids {len(ledgers)}, entry_ids {len(entries)}, "
            f"deliver_at {len(times)}"
        )
    return ledgers, entries, times


def _check_positions(ledgers: Int64Array, entries: Int64Array) -> None:
    """Raise ValueError on an id out of range or a position found twice (naming the rows)."""
    if not len(ledgers):
        return
    bad = np.flatnonzero((ledgers < 0) | (entries < 0) | (entries > MAX_ENTRY_ID))
    if len(bad):
        i = int(bad[0])
        raise ValueError(
            f"row {i}: bad position ({ledgers[i]}, {entries[i]}); need ledger_id >= 0 and "
            f"0 <= entry_id < 2**32 ({len(bad)} such rows; read dumps with "
            f"delayindex.dump.read_dump, which rejects them)"
        )
    if is_position_sorted(ledgers, entries, strict=True):
        return  # a dump in position order has no duplicate (one pass)
    order = np.lexsort((entries, ledgers))
    sl, se = ledgers[order], entries[order]
    same = np.flatnonzero((sl[1:] == sl[:-1]) & (se[1:] == se[:-1]))
    if len(same):
        k = int(same[0])
        rows = sorted((int(order[k]), int(order[k + 1])))
        raise ValueError(
            f"position ({sl[k]}, {se[k]}) appears twice (rows {rows[0]} and {rows[1]}); "
            f"read dumps with delayindex.dump.read_dump, which resolves duplicates"
        )


# -- what is tracked ---------------------------------------------------------------------------


class Tally(NamedTuple):
    """The rows a rebuild read and what became of them (the counts of a rebuild report)."""

    cutoff_ms: int
    rows: int
    tracked: int
    not_delayed: int
    due: int
    acked: int


@dataclass(frozen=True)
class Classification:
    """Which rows an online tracker at ``now_ms`` tracks, and why the others are skipped.

    Each skipped row is counted once, by the first reason that applies in this order:
    ``not_delayed`` (``deliver_at < 0``), ``due`` (``deliver_at <= cutoff_ms``), ``acked``
    (position at or below the mark-delete position).
    """

    mask: BoolArray
    cutoff_ms: int
    not_delayed: int
    due: int
    acked: int

    @property
    def tracked(self) -> int:
        """Rows tracked."""
        return int(np.count_nonzero(self.mask))

    def tally(self) -> Tally:
        """The counts, with ``rows`` (every classified row) and ``tracked``."""
        return Tally(
            self.cutoff_ms, len(self.mask), self.tracked, self.not_delayed, self.due, self.acked
        )


def cutoff_for(now_ms: int, config: TrackerConfig) -> int:
    """The online cutoff at ``now_ms``: a message is due when ``deliver_at <= cutoff``."""
    return cutoff_ms(_int(now_ms, "now_ms"), config.tick_ms, config.strict)


def classify(
    columns: PositionColumns,
    *,
    now_ms: int,
    config: TrackerConfig,
    mark_delete: tuple[int, int] | None = None,
) -> Classification:
    """:func:`tracked_mask` with the counts of skipped rows by reason (see :class:`Classification`).

    Raises:
        TypeError, ValueError: bad columns, ``now_ms``, config or mark.
    """
    config = _config(config)
    ledgers, entries, times = _columns(columns)
    return _classify(ledgers, entries, times, now_ms, config, _mark(mark_delete))


def after_mark(ledgers: Int64Array, entries: Int64Array, mark: tuple[int, int] | None) -> BoolArray:
    """For each position, whether it lies after ``mark`` (every position when None)."""
    if mark is None:
        return np.ones(len(ledgers), dtype=np.bool_)
    return (ledgers > mark[0]) | ((ledgers == mark[0]) & (entries > mark[1]))  # type: ignore[no-any-return]


def _classify(
    ledgers: Int64Array,
    entries: Int64Array,
    times: Int64Array,
    now_ms: int,
    config: TrackerConfig,
    mark: tuple[int, int] | None,
) -> Classification:
    cutoff = cutoff_for(now_ms, config)
    delayed = times >= 0
    live = delayed & (times > cutoff)
    mask = live if mark is None else live & after_mark(ledgers, entries, mark)
    n_delayed = int(np.count_nonzero(delayed))
    n_live = int(np.count_nonzero(live))
    return Classification(
        mask=mask,
        cutoff_ms=cutoff,
        not_delayed=len(times) - n_delayed,
        due=n_delayed - n_live,
        acked=n_live - int(np.count_nonzero(mask)),
    )


def tracked_mask(
    columns: PositionColumns,
    *,
    now_ms: int,
    config: TrackerConfig,
    mark_delete: tuple[int, int] | None = None,
) -> BoolArray:
    """For each row, whether an online tracker at ``now_ms`` tracks it.

    ``DelayIndex.add`` tracks a message when ``deliver_at > cutoff`` (cutoff = ``now_ms +
    tick_ms``, or ``now_ms`` with ``config.strict``; a negative ``deliver_at`` is never
    tracked). With ``mark_delete``, rows at or below it are acknowledged: a dispatcher reads the
    topic from the cursor's mark-delete position on, so it never adds them.

    Raises:
        TypeError, ValueError: bad columns, ``now_ms``, config or mark.
    """
    return classify(columns, now_ms=now_ms, config=config, mark_delete=mark_delete).mask
