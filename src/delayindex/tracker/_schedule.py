"""DelayIndex's browse of the pending schedule: ``pending`` and ``due_histogram`` (a mixin).

How it works. The tracked positions live in memory (the mutable and direct heaps, each sealed
bucket's loaded segment from its cursor on; ``BucketCore.live_keys``) or in segments still in
storage. A browse plans, under the lock, which unloaded segments can hold times in the range
(each segment's minimum time is known, and a bucket's segments are in time order); reads them
without the lock, through the storage directly (nothing is installed: what ``poll`` has
loaded is never disturbed); then, under the lock again, takes the in-memory keys and keeps the
read rows whose positions are still tracked and not shadowed, from the segments that are still
unloaded. If a planned bucket was merged or dropped meanwhile the browse starts over (the last
attempt reads under the lock). Quarantined buckets' positions are tracked but their times are
lost: a browse does not list them (``quarantined()`` does).
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np
import numpy.typing as npt

from delayindex._browse import histogram_edges, select_pending, time_range
from delayindex.model import Position
from delayindex.storage.base import SnapshotStorage
from delayindex.tracker._bucket import _Bucket
from delayindex.tracker._front import as_count

Int64Array = npt.NDArray[np.int64]
Keys = tuple[Int64Array, Int64Array, Int64Array]
#: Attempts with the lock released during reads before one under the lock.
_ATTEMPTS = 3


class ScheduleMixin:
    """``pending`` and ``due_histogram`` for :class:`~delayindex.DelayIndex`."""

    _lock: threading.Lock
    _core: Any
    _closed: bool
    _buckets: dict[int, _Bucket]
    _storage: SnapshotStorage

    def pending(
        self, start_ms: int | None = None, end_ms: int | None = None, limit: int = 1000
    ) -> list[tuple[int, Position]]:
        """Up to ``limit`` tracked positions with ``start_ms <= deliver_at < end_ms`` (None:
        unbounded), in ``(deliver_at, position)`` order, as ``(deliver_at, Position)`` pairs.
        Nothing is removed; segments in storage are read as needed (see the module docs).

        Raises:
            TypeError: a bound or ``limit`` is not an int. ValueError: a bound beyond int64.
            StorageError, SnapshotCorruptError: a segment could not be read.
        """
        bounds = time_range(start_ms, end_ms)
        as_count(limit, "limit")
        if bounds is None:
            return []
        return select_pending(*self._browse(*bounds), limit)

    def due_histogram(self, edges: object) -> npt.NDArray[np.int64]:
        """Exact count of tracked positions per ``[edges[i], edges[i+1])`` (``edges``: at least
        two strictly increasing ints); segments in storage are read as needed.

        Raises:
            TypeError: an edge is not an integer. ValueError: fewer than two edges, not
            strictly increasing, or beyond int64. StorageError, SnapshotCorruptError: a
            segment could not be read.
        """
        bins = histogram_edges(edges)
        times = self._browse(int(bins[0]), int(bins[-1]) - 1)[0]
        counts = np.bincount(
            np.searchsorted(bins, times, side="right") - 1, minlength=len(bins) - 1
        )
        return counts.astype(np.int64)

    def _browse(self, first: int, last: int) -> Keys:
        """Every tracked position with ``first <= deliver_at <= last`` and a known time."""
        for attempt in range(_ATTEMPTS + 1):
            locked = attempt == _ATTEMPTS
            if locked:
                self._lock.acquire()
            try:
                with self._lock if not locked else _Held():
                    if self._closed:
                        return _empty()
                    plan = self._plan_reads(first, last)
                rows = [self._read(bucket, a, b) for bucket, a, b in plan]
                with self._lock if not locked else _Held():
                    if self._closed:
                        return _empty()
                    if not all(self._buckets.get(b.sid) is b for b, _, _ in plan):
                        continue  # merged or dropped meanwhile: plan again
                    parts = [self._core.live_keys(first, last)]
                    for (bucket, a, _), (times, ledgers, entries, starts) in zip(
                        plan, rows, strict=True
                    ):
                        skip = max(bucket.current + 1 - a, 0)  # segments loaded meanwhile
                        begin = int(starts[skip]) if skip < len(starts) else len(times)
                        t, lg, en = times[begin:], ledgers[begin:], entries[begin:]
                        keep = (t >= first) & (t <= last)
                        t, lg, en = t[keep], lg[keep], en[keep]
                        live = self._core.authoritative_mask(lg, en)
                        parts.append((t[live], lg[live], en[live]))
                    return tuple(np.concatenate(c) for c in zip(*parts, strict=True))  # type: ignore[return-value]
            finally:
                if locked:
                    self._lock.release()
        raise AssertionError("unreachable: the last attempt holds the lock")

    def _plan_reads(self, first: int, last: int) -> list[tuple[_Bucket, int, int]]:
        """Per durable bucket, the unloaded segments (1-based, inclusive) that can hold times
        in ``[first, last]`` (lock held)."""
        plan = []
        for bucket in self._buckets.values():
            if bucket.state != "durable" or bucket.current >= bucket.num_segments:
                continue
            lo = bucket.current + 1
            # Segment k's times lie in [mins[k-1], mins[k]] (the next segment's minimum).
            wanted = [
                k for k in range(lo, bucket.num_segments + 1)
                if int(bucket.mins[k - 1]) <= last
                and (k == bucket.num_segments or int(bucket.mins[k]) >= first)
            ]  # fmt: skip
            if wanted:
                plan.append((bucket, wanted[0], wanted[-1]))
        return plan

    def _read(self, bucket: _Bucket, a: int, b: int) -> tuple[Any, Any, Any, Any]:
        """Segments ``a..b`` of ``bucket`` and where each starts in the arrays."""
        assert bucket.snapshot_id is not None
        times, ledgers, entries = self._storage.get_segment_arrays(bucket.snapshot_id, a, b)
        base = int(bucket.bounds[a - 2]) if a > 1 else 0
        starts = np.array(
            [(int(bucket.bounds[k - 2]) if k > 1 else 0) - base for k in range(a, b + 1)],
            dtype=np.int64,
        )
        return times, ledgers, entries, starts


class _Held:
    """A no-op context for the attempt that already holds the lock."""

    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


def _empty() -> Keys:
    empty = np.empty(0, dtype=np.int64)
    return empty, empty.copy(), empty.copy()
