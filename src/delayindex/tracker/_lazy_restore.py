"""Membership restored per bucket, on first use, after an open (issue 18, item 3).

How it works. Recovery used to restore every recovered bucket's positions into the core's dedup
index at open: per-message work, about 6 ns each. Now a bucket whose positions nothing at open
depends on is *lazy*: its first live segment is a placeholder (read when due, as for every
bucket), and its positions wait in ``_lazy``, undecoded (formats 5 and 6 keep them, ledger
columns included, in a part of their own). Until they are all restored the tracker's core is a
:class:`LazyCore`, which routes each call by what it names:

- a call that names positions (a ledger, a ledger range, columns of ledgers) restores the lazy
  buckets whose ranges it touches, then goes to the core: a first ``contains`` pays for one
  bucket, not for the index;
- a call that names a segment source (a segment read, a cut, a removal) restores its bucket;
- a call that needs no membership (the heaps, the clock rule, the sealed ranges, the override
  sets) goes straight to the core: a lazy bucket's source is a placeholder, so nothing of it
  can be delivered;
- any other call restores every lazy bucket first.

The first restore a call pays for also queues a background job (unless a close has begun)
that restores the rest, one bucket per lock hold, so the native front gets its typed core back
soon: until then each call pays a Python-level dispatch. A synchronous executor runs the job
on the caller's thread after the call, so there it restores the rest at once. When no lazy
bucket is left the real core is put back in place (the tracker's and its front's), and later
calls pay nothing. Every path to the core goes through the tracker's ``_core`` or its front's
``core``, so no call can see a partial membership.

Invariants: a lazy bucket is durable, live in the tracker, not folded, and has a source (its
segment ``first``, or a placeholder for it); ``_lazy`` maps its sid to it, and ``_lazy_spans``
lists the lazy buckets' ``(start, end, sid)`` sorted by start (the ranges are disjoint);
``_lazy_count`` is the sum of their live counts; no position of a lazy bucket is in the core.
A bucket whose bitmaps turn out damaged when restored is quarantined then, its positions
unknown, as it would have been at open.
"""

from __future__ import annotations

import bisect
import itertools
import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from delayindex.errors import SnapshotCorruptError
from delayindex.snapshot.format import SnapshotMetadata
from delayindex.tracker._bucket import _Bucket

_LOWEST = -(2**63)
_HIGHEST = 2**63 - 1


@dataclass
class LazyBucket:
    """A recovered bucket whose positions are not in the core yet."""

    bucket: _Bucket
    metadata: SnapshotMetadata
    first: int  # its first live segment: positions of segments first.. are restored
    count: int  # how many: the live segments' counts


# What each routed call names, from its arguments: an inclusive ledger span, or the ledgers
# themselves (a column), or None when it cannot tell (then every lazy bucket is restored).
Touched = tuple[int, int] | npt.NDArray[np.int64] | None
Span = Callable[[tuple[Any, ...]], Touched]


def _at_ledger(args: tuple[Any, ...]) -> tuple[int, int]:
    return args[0], args[0]


def _ledger_range(args: tuple[Any, ...]) -> tuple[int, int]:
    return args[0], args[1]


def _up_to_ledger(args: tuple[Any, ...]) -> tuple[int, int]:
    return _LOWEST, args[0]


def _ledger_column(args: tuple[Any, ...]) -> npt.NDArray[np.int64] | None:
    """A column of ledgers as int64; None (restore all) when it is not one of ints in range,
    so the core's own check raises the caller's error."""
    column = np.asarray(args[0])
    if column.ndim != 1 or column.dtype.kind not in "iu" or column.dtype == np.uint64:
        return None
    return column.astype(np.int64, copy=False)


def _routed(name: str, span: Span) -> Callable[..., Any]:
    def call(self: LazyCore, *args: Any) -> Any:
        self._owner._restore_ledgers(span(args))
        return getattr(self.core, name)(*args)

    call.__name__ = call.__qualname__ = name
    call.__doc__ = f"``core.{name}`` once the lazy buckets it touches are restored."
    return call


def _by_source(name: str) -> Callable[..., Any]:
    def call(self: LazyCore, sid: int, *args: Any) -> Any:
        self._owner._restore_source(sid)
        return getattr(self.core, name)(sid, *args)

    call.__name__ = call.__qualname__ = name
    call.__doc__ = f"``core.{name}`` once source ``sid``'s bucket is restored, if lazy."
    return call


def _passed(name: str) -> Callable[..., Any]:
    def call(self: LazyCore, *args: Any) -> Any:
        return getattr(self.core, name)(*args)

    call.__name__ = call.__qualname__ = name
    call.__doc__ = f"``core.{name}``: it needs no membership."
    return call


def _read(name: str) -> property:
    return property(lambda self: getattr(self.core, name), doc=f"``core.{name}``.")


def _holding(ranges: Sequence[tuple[int, ...]], ledgers: Any) -> list[int]:
    """Indexes of the ``ranges`` (``(start, end, ...)``: disjoint, sorted, inclusive) that
    hold any of ``ledgers``, ascending."""
    if not ranges:
        return []
    starts = np.fromiter((r[0] for r in ranges), np.int64, len(ranges))
    ends = np.fromiter((r[1] for r in ranges), np.int64, len(ranges))
    ledgers = np.unique(ledgers)
    at = np.searchsorted(starts, ledgers, side="right") - 1
    inside = (at >= 0) & (ledgers <= ends[np.maximum(at, 0)])
    return [int(i) for i in np.unique(at[inside])]


def _spans(lazy: dict[int, LazyBucket]) -> list[tuple[int, int, int]]:
    return sorted((item.bucket.start, item.bucket.end, sid) for sid, item in lazy.items())


class LazyCore:
    """Stands in for the core while recovered buckets' positions are lazy.

    ``len`` and the membership-free calls answer at once; a call that names positions or a
    source restores the lazy buckets it touches; any other attribute restores them all
    (``owner._finish_lazy``) and then comes from the core itself. The routed calls are set
    from the tables below the class.
    """

    __slots__ = ("_owner", "core")

    def __init__(self, owner: LazyRestoreMixin, core: Any) -> None:
        self._owner = owner
        self.core = core

    def __len__(self) -> int:
        # Under the restore's lock: ``len`` takes no tracker lock, and a restore under way in
        # another thread has moved some positions into the core but not yet out of the count.
        with self._owner._lazy_lock:
            return len(self.core) + self._owner._lazy_count

    def __getattr__(self, name: str) -> Any:
        return getattr(self._owner._finish_lazy(), name)

    @property
    def tick_ms(self) -> int:
        return int(self.core.tick_ms)

    @tick_ms.setter
    def tick_ms(self, value: int) -> None:
        self.core.tick_ms = value

    def counters(self) -> dict[str, Any]:
        """``core.counters()`` with the lazy buckets' positions in ``tracked`` (``ledgers``
        counts the restored ones): a ``stats()`` or a metrics scrape restores nothing, so it
        never holds the tracker's lock for a whole restore."""
        with self._owner._lazy_lock:  # as ``len``: a restore may be moving the count
            out = dict(self.core.counters())
            out["tracked"] += self._owner._lazy_count
            return out

    def _check(self) -> None:
        self.core._check()
        self._owner._check_lazy()


# How LazyCore routes the core's calls (any other restores every lazy bucket first).
# Calls that name positions, with what they touch:
_BY_LEDGERS: dict[str, Span] = {
    "contains": _at_ledger,
    "add": _at_ledger,
    "cancel": _at_ledger,
    "reschedule": _at_ledger,
    "index_bitmap": _at_ledger,
    "needs_restore": _at_ledger,
    "remove_range": _at_ledger,  # a range named by its start
    "untrack_upto": _up_to_ledger,
    "count_upto": _up_to_ledger,
    "add_range": _ledger_range,
    "tracked_in_range": _ledger_range,
    "untrack_ledgers": _ledger_range,
    "add_many": _ledger_column,
    "cancel_many": _ledger_column,
    "tracked_mask": _ledger_column,
    "authoritative_mask": _ledger_column,
}
# Calls that name a source (first argument):
_BY_SOURCE = ("set_source", "cut_source", "remove_source")
# Membership-free: the heaps (a lazy bucket's source is a placeholder), the clock rule, the
# sealed ranges, the sources, the memory held, and the override sets (cancels, moves, evicted
# ranges: kept apart from membership). ``counters`` is LazyCore's own (it adds the lazy count).
_MEMBERSHIP_FREE = (
    "poll", "next_time", "has_due", "take_exhausted", "seal", "tracked_mask_order",
    "source_head", "source_remaining", "cutoff_for", "in_sealed_range", "has_source",
    "memory_bytes", "evict_cancels", "evict_range", "evicted_ranges", "evicted_mask",
    "restore_evicted", "override_of", "override_record",
)  # fmt: skip
_MEMBERSHIP_FREE_ATTRIBUTES = (
    "override_gen", "load_needed", "mutable_range", "mutable_size", "direct_size",
)  # fmt: skip

for _name, _span in _BY_LEDGERS.items():
    setattr(LazyCore, _name, _routed(_name, _span))
for _name in _BY_SOURCE:
    setattr(LazyCore, _name, _by_source(_name))
for _name in _MEMBERSHIP_FREE:
    setattr(LazyCore, _name, _passed(_name))
for _name in _MEMBERSHIP_FREE_ATTRIBUTES:
    setattr(LazyCore, _name, _read(_name))


class LazyRestoreMixin:
    """DelayIndex's lazy restores (state lives on the DelayIndex)."""

    # State (set in DelayIndex.__init__).
    _core: Any
    _front: Any
    _buckets: dict[int, _Bucket]
    _lazy: dict[int, LazyBucket]
    _lazy_spans: list[tuple[int, int, int]]
    _lazy_count: int
    _lazy_lock: threading.RLock
    _restore_job_queued: bool
    _restore_in_background: bool
    _synchronous: bool
    _lock: Any

    # Provided by DelayIndex and its other mixins.
    _quarantine: Callable[..., None]
    _queue: Callable[[Callable[[], None]], None]

    def _defer_restores(self, core: Any, lazy: list[LazyBucket]) -> None:
        """Put the core behind a :class:`LazyCore` until ``lazy`` are restored
        (recovery, before anything else can reach the core)."""
        if not lazy:
            return
        self._lazy = {item.bucket.sid: item for item in lazy}
        self._lazy_count = sum(d.count for d in lazy)
        self._index_lazy()
        self._core = self._front.core = LazyCore(self, core)

    def _index_lazy(self) -> None:
        self._lazy_spans = _spans(self._lazy)

    def _restore_lazy_in(
        self, core: Any, lazy: list[LazyBucket], ledgers: npt.NDArray[np.int64]
    ) -> list[LazyBucket]:
        """Restore into ``core`` now the buckets of ``lazy`` that hold any of ``ledgers``
        (sorted; recovery applies overrides there); returns the others."""
        if not len(ledgers):
            return lazy
        lazy = sorted(lazy, key=lambda item: item.bucket.start)
        hit = set(_holding([(d.bucket.start, d.bucket.end) for d in lazy], ledgers))
        needed = [item for i, item in enumerate(lazy) if i in hit]
        keep = [item for i, item in enumerate(lazy) if i not in hit]
        restored = [(item, _restore_one(core, item)) for item in needed]
        self._quarantine_unrestored([(item, exc) for item, exc in restored if exc is not None])
        return keep

    def _restore_ledgers(self, touched: Touched) -> None:
        """Restore the lazy buckets that hold any of the ``touched`` ledgers (an inclusive
        span or a column; None: all of them). Callers hold the tracker's lock."""
        with self._lazy_lock:
            if not self._lazy:
                return
            spans = self._lazy_spans
            if touched is None:
                self._finish_lazy()
                return
            if isinstance(touched, tuple):
                low, high = touched
                # The ranges are disjoint and sorted, so their ends are sorted too.
                stop = bisect.bisect_right(spans, (high, _HIGHEST, _HIGHEST))
                start = bisect.bisect_left(spans, low, hi=stop, key=lambda s: s[1])
                hit = list(range(start, stop))
            else:
                hit = _holding(spans, touched)
            if len(hit):
                self._restore_now([self._lazy[spans[i][2]] for i in hit])

    def _restore_source(self, sid: int) -> None:
        """Restore source ``sid``'s bucket if it is lazy (callers hold the tracker's lock)."""
        with self._lazy_lock:
            item = self._lazy.get(sid)
            if item is not None:
                self._restore_now([item])

    def _restore_now(self, items: Iterable[LazyBucket]) -> None:
        """Restore lazy ``items`` now; queue the background restore of the rest. A bucket
        leaves the lazy set once its positions are in the core, or found damaged (then
        quarantined): an unexpected error leaves the others lazy and the count exact."""
        with self._lazy_lock:
            core = self._real_core()
            damaged: list[tuple[LazyBucket, SnapshotCorruptError]] = []
            try:
                for item in list(items):
                    exc = _restore_one(core, item)
                    if exc is not None:
                        damaged.append((item, exc))
                    del self._lazy[item.bucket.sid]
                    self._lazy_count -= item.count
            finally:
                self._index_lazy()
                if not self._lazy:
                    self._unwrap_lazy()
                elif self._restore_in_background and not self._restore_job_queued:
                    self._restore_job_queued = True
                    self._queue(self._restore_job)
                self._quarantine_unrestored(damaged)

    def _restore_job(self) -> None:
        """Background job: restore one lazy bucket (the lowest) per lock hold, then queue
        itself again while any is left, unless a close stopped it (the lazy buckets' snapshots
        keep their positions: nothing is lost). On a synchronous executor, which runs it on
        the caller's thread, it restores them all at once (a chain of jobs would nest)."""
        with self._lock, self._lazy_lock:
            self._restore_job_queued = False
            if self._restore_in_background and self._lazy:
                if self._synchronous:
                    self._finish_lazy()
                else:  # queues this job again while any bucket is left
                    self._restore_now([self._lazy[self._lazy_spans[0][2]]])

    def _finish_lazy(self) -> Any:
        """Restore every lazy bucket and put the real core back; returns it. Idempotent
        and safe from any thread: callers hold the tracker's lock or are its only user."""
        with self._lazy_lock:
            if self._lazy:
                self._restore_now(list(self._lazy.values()))
            return self._unwrap_lazy()

    def _drop_lazy(self) -> Any:
        """Forget the lazy buckets' positions without restoring them (close, clear: the
        snapshots keep them); returns the real core."""
        with self._lazy_lock:
            self._lazy, self._lazy_spans, self._lazy_count = {}, [], 0
            return self._unwrap_lazy()

    def _real_core(self) -> Any:
        """The core itself, whether or not it is behind a :class:`LazyCore`."""
        core = self._core
        return core.core if isinstance(core, LazyCore) else core

    def _unwrap_lazy(self) -> Any:
        core = self._real_core()
        self._core = self._front.core = core
        return core

    def _quarantine_unrestored(
        self, damaged: list[tuple[LazyBucket, SnapshotCorruptError]]
    ) -> None:
        """Quarantine the buckets whose restore failed: found now rather than at open, their
        positions unknown."""
        for item, exc in damaged:
            self._quarantine(item.bucket, exc, item.first, positions_known=False)

    def _check_lazy(self) -> None:
        """Assert the lazy buckets' invariants (see the module doc)."""
        core = self._real_core()
        if isinstance(self._core, LazyCore) != bool(self._lazy):
            raise AssertionError("the core is wrapped iff some bucket is lazy")
        if sum(d.count for d in self._lazy.values()) != self._lazy_count:
            raise AssertionError("the lazy count differs from the lazy buckets'")
        spans = _spans(self._lazy)
        if spans != self._lazy_spans:
            raise AssertionError("the lazy spans differ from the lazy buckets'")
        if any(a[1] >= b[0] for a, b in itertools.pairwise(spans)):
            raise AssertionError("lazy buckets overlap")
        for sid, item in self._lazy.items():
            b = item.bucket
            if self._buckets.get(sid) is not b or b.sid != sid:
                raise AssertionError(f"lazy bucket [{b.start}, {b.end}] is not live")
            if b.state != "durable" or b.folded or not core.has_source(b.sid):
                raise AssertionError(f"lazy bucket [{b.start}, {b.end}] is not durable")
            if b.current not in (item.first - 1, item.first) or item.count < 1:
                raise AssertionError(f"lazy bucket [{b.start}, {b.end}] has moved on")


def _restore_one(core: Any, item: LazyBucket) -> SnapshotCorruptError | None:
    """Restore ``item``'s positions into ``core``; the error if its bitmaps turned out
    damaged (the core then holds none of its positions)."""
    from delayindex.tracker._recovery import _restore_live  # it imports this module

    assert item.bucket.snapshot_id is not None
    try:
        _restore_live(core, item.metadata, item.first, item.bucket.snapshot_id)
    except SnapshotCorruptError as exc:
        return exc
    return None
