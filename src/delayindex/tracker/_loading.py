"""DelayIndex's segment loads: reading a bucket's next segments when its placeholder is due.

``poll`` stops at a due placeholder; ``_load`` reads the next segments (up to
``LOAD_BATCH_INDEXES``, more while they are due already; the only load in flight, under the
lock). A storage error moves that bucket's placeholder past the cutoff to its retry time;
damage quarantines the bucket. Each load notes the bucket's next batch, and hints the storage
(``prefetch_segments``, where it has one) with every noted batch that comes due within
``READAHEAD_HORIZON_MS``, so a storage that reads ahead (FileStorage) holds those bytes when
that placeholder comes due.
``_exhaust`` retires a bucket whose last segment was consumed.
"""

from __future__ import annotations

import heapq
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from delayindex.config import TrackerConfig
from delayindex.errors import (
    SnapshotCorruptError,
    SnapshotNotFoundError,
    StorageError,
)
from delayindex.policy import backoff_delay_ms
from delayindex.storage.base import SnapshotStorage
from delayindex.tracker._bucket import _EMPTY, _Bucket
from delayindex.tracker._damage import ProblemLog
from delayindex.tracker._stats import _OpStats

#: A segment load reads consecutive segments until they hold this many indexes.
LOAD_BATCH_INDEXES = 4096
#: ... or, while the following segments are due already (a backlog), until this many: they are
#: delivered now anyway, and fewer, larger reads spread each read's fixed cost (the object's
#: open, the storage's bookkeeping, the decode's set-up) over more messages.
DUE_LOAD_BATCH_INDEXES = 16_384
#: A bucket's next batch is read ahead when it comes due within this much time.
READAHEAD_HORIZON_MS = 60_000


def load_batch_end(bucket: _Bucket, first: int, cutoff: int | None = None) -> int:
    """The last segment of the batch a load starting at segment ``first`` reads: consecutive
    segments until they hold :data:`LOAD_BATCH_INDEXES` indexes, at least one; with a
    ``cutoff``, also every following segment due by it (its min deliver time at or before
    it), until they hold :data:`DUE_LOAD_BATCH_INDEXES`. Which segments a load reads never
    changes what is delivered or in which order, only how many reads it takes."""
    base = bucket.indexes_before(first)
    bounds = bucket.bounds
    last = int(np.searchsorted(bounds, base + LOAD_BATCH_INDEXES, side="right"))
    if cutoff is not None and last < bucket.num_segments and bucket.mins[last] <= cutoff:
        due = int(np.searchsorted(bucket.mins, cutoff, side="right"))  # mins ascend
        capped = int(np.searchsorted(bounds, base + DUE_LOAD_BATCH_INDEXES, side="right"))
        last = max(last, min(due, capped))
    return min(max(last, first), bucket.num_segments)


class LoadingMixin:
    """DelayIndex's segment loads (state lives on the DelayIndex)."""

    # State (set in DelayIndex.__init__).
    _buckets: dict[int, _Bucket]
    _config: TrackerConfig
    _core: Any
    _ops: dict[str, _OpStats]
    _storage: SnapshotStorage
    _warnings: ProblemLog
    _prefetch: Callable[[str, int, int], bool] | None  # the storage's read-ahead hint, if any
    _ahead: list[tuple[int, int, int]]  # (due time, sid, first segment) of batches to hint

    # Provided by DelayIndex and its other mixins.
    _drop_bucket: Callable[..., None]
    _quarantine: Callable[[Any, BaseException, int], None]
    _retire: Callable[[_Bucket], None]

    def _load(self, sid: int, now: int, *, single: bool = False) -> None:
        """Load bucket ``sid``'s next segments (lock held).

        Consecutive segments are read together until they hold :data:`LOAD_BATCH_INDEXES`
        indexes (more while they are due already, :func:`load_batch_end`): a realistic
        bucket's far-future tail is hundreds of one-index segments, and one read per index
        would bound delivery by storage latency.

        Damage (a checksum or decode failure, a missing object) quarantines the bucket. A
        transient storage error moves the bucket's placeholder past the cutoff to its retry
        time (``load_retry_delay_ms``, backing off): its messages come late, never early, and
        the other buckets keep delivering meanwhile. A damaged batch is read again one segment
        at a time (``single``), so the good segments before the damage are still delivered.
        """
        bucket = self._buckets[sid]
        started = time.perf_counter()
        first = bucket.current + 1
        base = bucket.indexes_before(first)
        last = first if single else load_batch_end(bucket, first, self._core.cutoff_for(now))
        assert bucket.snapshot_id is not None
        try:
            times, ledgers, entries = self._storage.get_segment_arrays(
                bucket.snapshot_id, first, last
            )
            expected = int(bucket.bounds[last - 1]) - base
            if len(times) != expected:
                raise SnapshotCorruptError(
                    f"{bucket.snapshot_id}: segments {first}..{last} hold {len(times)} "
                    f"indexes, expected {expected}"
                )
        except (SnapshotCorruptError, SnapshotNotFoundError) as exc:
            self._ops["load"].record(False, started)
            if last > first and isinstance(exc, SnapshotCorruptError):
                self._load(sid, now, single=True)  # isolate the damaged segment
            else:
                self._quarantine(bucket, exc, first)
            return
        except StorageError as exc:
            self._ops["load"].record(False, started)
            bucket.load_failures += 1
            delay = backoff_delay_ms(self._config.load_retry_delay_ms, bucket.load_failures)
            retry_at = max(now + max(delay, 1), self._core.cutoff_for(now) + 1)
            self._core.set_source(sid, _EMPTY, _EMPTY, _EMPTY, retry_at)
            self._warnings.append(
                f"reads of segments {first}..{last} of {bucket.snapshot_id!r} (bucket "
                f"[{bucket.start}, {bucket.end}]) are failing; retried with backoff, the "
                f"bucket's messages wait (late, never early), the others keep delivering; "
                f"check the storage: {exc}",
                key=f"load:{bucket.snapshot_id}",
            )
            return
        self._core.set_source(sid, times, ledgers, entries, bucket.next_time(last))
        bucket.current = last
        self._read_ahead(bucket, now)
        if bucket.load_failures:
            bucket.load_failures = 0
            self._warnings.resolve(f"load:{bucket.snapshot_id}")
        self._ops["load"].record(True, started)

    def _read_ahead(self, bucket: _Bucket, now: int) -> None:
        """Note ``bucket``'s next batch for read-ahead (when its current batch is loaded, or it
        became durable), then hint the storage with every noted batch that now comes due
        within :data:`READAHEAD_HORIZON_MS` (lock held). A storage that reads ahead then holds
        those bytes when the placeholder comes due; delivery itself is unchanged.

        Only ahead of time, and not too far: a batch already due is loaded by the poll under
        way (a backlog drain measured 10 % slower with a reader thread taking the GIL from
        it), and one due much later waits in ``_ahead`` (a heap by due time) until a later
        load finds it within the horizon: the read-ahead also decodes its object's metadata
        into the storage's cache, and doing that at every seal doubled a 1 M fill's resident
        memory.
        """
        if self._prefetch is None:
            return
        first = bucket.current + 1
        if first <= bucket.num_segments:
            heapq.heappush(self._ahead, (bucket.next_time(bucket.current), bucket.sid, first))
        cutoff = self._core.cutoff_for(now)
        horizon = now + READAHEAD_HORIZON_MS
        while self._ahead and self._ahead[0][0] <= horizon:
            due_at, sid, first = heapq.heappop(self._ahead)
            noted = self._buckets.get(sid)
            if (
                due_at <= cutoff  # due: the poll loads it now
                or noted is None
                or noted.state != "durable"
                or noted.current + 1 != first  # loaded (or moved) since it was noted
            ):
                continue
            assert noted.snapshot_id is not None
            self._prefetch(noted.snapshot_id, first, load_batch_end(noted, first))

    def _exhaust(self, sid: int) -> None:
        bucket = self._buckets.get(sid)
        if bucket is None:
            return
        bucket.exhausted = True
        if bucket.state in ("memory", "released"):  # a released one keeps its damaged object
            self._drop_bucket(bucket)
        elif bucket.state == "durable" and not bucket.merging:
            self._retire(bucket)
