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

A histogram needs no positions where every stored copy counts: a *clean* bucket (nothing of it
left storage untracked) has its unloaded segments that lie wholly inside a bin counted from
the bucket's own segment counts, and the ones that straddle a bin edge read as times alone
(``get_segment_times``: one read per run of segments, one decode per bucket), so its snapshot's
metadata (mostly bitmaps, about 5 B per message) is neither decoded nor cached by the storage.
The plan works on every durable bucket's unloaded segments at once, as one concatenated column
(per-bucket numpy calls cost more than the arithmetic at 50 buckets), and the check after the
unlocked reads compares only the plan's signature (:meth:`ScheduleMixin._state`), not a new plan.
"""

from __future__ import annotations

import threading
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from delayindex._browse import bin_counts, histogram_edges, select_pending, time_range
from delayindex.model import MAX_TIME as _MAX_TIME
from delayindex.model import MIN_TIME as _MIN_TIME
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
        return select_pending(*self._browse(*bounds)[0], limit)

    def due_histogram(self, edges: object) -> npt.NDArray[np.int64]:
        """Exact count of tracked positions per ``[edges[i], edges[i+1])`` (``edges``: at least
        two strictly increasing ints). A segment still in storage that lies wholly inside one
        bin is counted from the snapshot's metadata without being read, when nothing of its
        bucket left storage untracked (see the module docs); the others are read.

        Raises:
            TypeError: an edge is not an integer. ValueError: fewer than two edges, not
            strictly increasing, or beyond int64. StorageError, SnapshotCorruptError: a
            segment could not be read.
        """
        bins = histogram_edges(edges)
        keys, whole = self._browse(int(bins[0]), int(bins[-1]) - 1, bins)
        return bin_counts(bins, keys[0]) + whole

    def _browse(
        self, first: int, last: int, bins: Int64Array | None = None
    ) -> tuple[Keys, Int64Array]:
        """Every tracked position with ``first <= deliver_at <= last`` and a known time, and
        (with ``bins``) the per-bin counts of the segments counted from metadata instead."""
        for attempt in range(_ATTEMPTS + 1):
            locked = attempt == _ATTEMPTS
            if locked:
                self._lock.acquire()
            try:
                with self._lock if not locked else nullcontext():
                    if self._closed:
                        return _empty(), _no_counts(bins)
                    plan = self._plan(first, last, bins)
                rows = [
                    _within(first, last, *self._read(bucket, runs, plan.clean.get(bucket.sid)))
                    for bucket, runs in plan.runs_per_bucket()
                ]
                with self._lock if not locked else nullcontext():
                    if self._closed:
                        return _empty(), _no_counts(bins)
                    if self._state(bins)[2] != plan.signature:
                        continue  # loaded, merged, dropped or changed meanwhile: plan again
                    # Only the membership test needs the lock; a histogram keeps times alone.
                    parts = [self._core.live_keys(first, last)]
                    for times, ledgers, entries in rows:
                        if ledgers is _NO_POSITIONS:  # a clean bucket: every copy is tracked
                            parts.append((times, ledgers, entries))
                            continue
                        live = self._core.authoritative_mask(ledgers, entries)
                        if bins is None:
                            parts.append((times[live], ledgers[live], entries[live]))
                        else:
                            parts.append((times[live], _NO_POSITIONS, _NO_POSITIONS))
                if bins is not None:
                    times = np.concatenate([part[0] for part in parts])
                    return (times, _NO_POSITIONS, _NO_POSITIONS), plan.whole
                keys = tuple(np.concatenate(c) for c in zip(*parts, strict=True))
                return keys, plan.whole  # type: ignore[return-value]
            finally:
                if locked:
                    self._lock.release()
        raise AssertionError("unreachable: the last attempt holds the lock")

    def _plan(self, first: int, last: int, bins: Int64Array | None) -> _Plan:
        """Which unloaded segments to read and which to count whole (lock held). The unloaded
        segments of every durable bucket are planned together, as one concatenated column."""
        durable, clean, signature = self._state(bins)
        plan = _Plan(_no_counts(bins), signature=signature)
        if not durable:
            return plan
        currents = np.array([b.current for b in durable], dtype=np.int64)
        totals = np.array([b.num_segments for b in durable], dtype=np.int64)
        lengths = totals - currents
        mins = np.concatenate([b.mins[b.current :] for b in durable])
        maxs = np.concatenate([b.maxs[b.current :] for b in durable])
        owner = np.repeat(np.arange(len(durable)), lengths)
        # Every segment of every bucket, concatenated: where each bucket starts, and each
        # unloaded segment's place (its 1-based number is place - start + 1).
        bucket_start = np.cumsum(totals) - totals
        place = np.arange(len(mins), dtype=np.int64) + np.repeat(
            bucket_start + currents - (np.cumsum(lengths) - lengths), lengths
        )
        wanted = (maxs >= first) & (mins <= last)
        counts = None
        if bins is not None and clean:
            nbins = len(bins) - 1
            low = np.searchsorted(bins, mins, side="right") - 1
            high = np.searchsorted(bins, maxs, side="right") - 1
            is_clean = np.array([b.sid in clean for b in durable], dtype=np.bool_)[owner]
            whole = wanted & is_clean & (low == high) & (low >= 0) & (low < nbins)
            bounds = np.concatenate([b.bounds for b in durable])
            counts = np.diff(bounds, prepend=np.int64(0))
            counts[bucket_start[totals > 0]] = bounds[bucket_start[totals > 0]]
            if whole.any():
                plan.whole += np.bincount(
                    low[whole], weights=counts[place[whole]], minlength=nbins
                ).astype(np.int64)
                wanted &= ~whole
        read = np.flatnonzero(wanted)
        if len(read):  # contiguous runs of segments of one bucket, one read each
            breaks = np.flatnonzero((np.diff(place[read]) != 1) | (np.diff(owner[read]) != 0))
            starts = read[np.concatenate(([0], breaks + 1))]
            ends = read[np.concatenate((breaks, [len(read) - 1]))]
            run_owner = owner[starts]
            numbers = place - bucket_start[owner] + 1
            for k, a, b in zip(
                run_owner.tolist(), numbers[starts].tolist(), numbers[ends].tolist(), strict=True
            ):
                plan.reads.append((durable[k], a, b))
            if counts is not None:
                for k in np.unique(run_owner).tolist():
                    bucket = durable[k]
                    if bucket.sid in clean:  # captured under the lock: the read runs without it
                        a = int(bucket_start[k])
                        cols = bucket.mins, bucket.maxs, counts[a : a + bucket.num_segments]
                        plan.clean[bucket.sid] = cols
        return plan

    def _state(
        self, bins: Int64Array | None
    ) -> tuple[list[_Bucket], set[int], list[tuple[int, str | None, int, bool]]]:
        """The durable buckets with unloaded segments, the clean ones among them (a histogram
        only) and the signature a plan is valid for: if it is unchanged after the unlocked
        reads, nothing they read was loaded, merged, dropped or made unclean meanwhile."""
        durable = [
            b for b in self._buckets.values()
            if b.state == "durable" and b.current < b.num_segments
        ]  # fmt: skip
        clean = self._clean_buckets(durable) if bins is not None else set()
        signature = [(b.sid, b.snapshot_id, b.current, b.sid in clean) for b in durable]
        return durable, clean, signature

    def _clean_buckets(self, durable: list[_Bucket]) -> set[int]:
        """The buckets whose unloaded segments hold only tracked, authoritative copies: the
        tracked positions of the bucket's ledgers are exactly those in memory plus the
        unloaded segments' counts (a cancel, a due re-add, a reschedule or a mark that took a
        position out of storage breaks the equality)."""
        if not durable:
            return set()
        ledgers, counts = self._core.ledger_counts()
        cumulative = np.concatenate(([0], np.cumsum(counts)))
        memory = np.sort(self._core.live_keys(_MIN_TIME, _MAX_TIME)[1])
        starts = np.array([b.start for b in durable], dtype=np.int64)
        ends = np.array([b.end for b in durable], dtype=np.int64)
        tracked = (
            cumulative[np.searchsorted(ledgers, ends, side="right")]
            - cumulative[np.searchsorted(ledgers, starts, side="left")]
        )
        in_memory = np.searchsorted(memory, ends, side="right") - np.searchsorted(
            memory, starts, side="left"
        )
        on_disk = [int(b.bounds[-1]) - b.indexes_before(b.current + 1) for b in durable]
        equal = (tracked == in_memory + np.array(on_disk, dtype=np.int64)).tolist()
        clean = {b.sid for b, same in zip(durable, equal, strict=True) if same}
        return clean

    def _read(
        self, bucket: _Bucket, runs: list[tuple[int, int]], columns: Keys | None = None
    ) -> Keys:
        """Runs of segments ``(a, b)`` (1-based, inclusive) of ``bucket``, read from storage
        in one call. With ``columns`` (a histogram of a clean bucket, where every stored copy
        counts: the bucket's segment ``(mins, maxs, counts)`` as planned): the times alone, so
        that the snapshot's metadata is neither decoded nor cached; the positions are
        :data:`_NO_POSITIONS`."""
        assert bucket.snapshot_id is not None
        if columns is not None:
            times = self._storage.get_segment_times(bucket.snapshot_id, runs, *columns)
            return times, _NO_POSITIONS, _NO_POSITIONS
        times, ledgers, entries = self._storage.get_segment_runs(bucket.snapshot_id, runs)
        return times, ledgers, entries


@dataclass
class _Plan:
    """A browse's reads, its whole-segment counts, and what it was planned against."""

    whole: Int64Array
    reads: list[tuple[_Bucket, int, int]] = field(default_factory=list)
    #: Buckets whose reads need the times only (a histogram of a clean bucket): their segment
    #: ``(mins, maxs, counts)``, taken under the lock.
    clean: dict[int, Keys] = field(default_factory=dict)
    signature: list[tuple[int, str | None, int, bool]] = field(default_factory=list)

    def runs_per_bucket(self) -> list[tuple[_Bucket, list[tuple[int, int]]]]:
        """The reads grouped by bucket (one storage call each), in plan order."""
        grouped: dict[int, tuple[_Bucket, list[tuple[int, int]]]] = {}
        for bucket, a, b in self.reads:
            grouped.setdefault(bucket.sid, (bucket, []))[1].append((a, b))
        return list(grouped.values())


#: The positions of a times-only read (never indexed: the histogram uses the times alone).
_NO_POSITIONS: Int64Array = np.empty(0, dtype=np.int64)


def _within(
    first: int, last: int, times: Int64Array, ledgers: Int64Array, entries: Int64Array
) -> Keys:
    """The rows with ``first <= time <= last`` (times-only rows keep :data:`_NO_POSITIONS`)."""
    if not len(times) or (int(times.min()) >= first and int(times.max()) <= last):
        return times, ledgers, entries
    keep = (times >= first) & (times <= last)
    if ledgers is _NO_POSITIONS:
        return times[keep], ledgers, entries
    return times[keep], ledgers[keep], entries[keep]


def _no_counts(bins: Int64Array | None) -> Int64Array:
    return np.zeros(0 if bins is None else len(bins) - 1, dtype=np.int64)


def _empty() -> Keys:
    empty = np.empty(0, dtype=np.int64)
    return empty, empty.copy(), empty.copy()
