"""DelayIndex's group-commit writer: the persist job and how its changes are acknowledged.

Snapshot creates and deletes queue for one *persist job*, which takes up to
``group_commit_max_ops`` of them (creates until their snapshots hold
``group_commit_max_bytes``), waiting up to ``group_commit_max_delay_ms`` for a batch to fill,
and makes the whole batch durable with two manifest writes (``Catalog.apply_batch``). A change
is acknowledged (the bucket becomes durable and ``_settle`` drops its data from memory, or it
leaves the manifest) only after the write that makes it durable, and in order.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

from delayindex.config import TrackerConfig
from delayindex.errors import (
    ManifestConflictError,
    StorageError,
)
from delayindex.snapshot.format import PreparedSegments, SnapshotMetadata
from delayindex.storage.catalog import Catalog
from delayindex.storage.manifest import BucketRecord, WriterStatus
from delayindex.tracker._bucket import Int64Array, _Bucket, _PendingCreate
from delayindex.tracker._damage import ProblemLog
from delayindex.tracker._stats import _OpStats


class PersistMixin:
    """DelayIndex's group-commit writer (state lives on the DelayIndex)."""

    # State (set in DelayIndex.__init__).
    _buckets: dict[int, _Bucket]
    _note_overrides_unlocked: Callable[[], bool]
    _catalog: Catalog
    _closed: bool
    _config: TrackerConfig
    _core: Any
    _deferred_creates: list[_PendingCreate]
    _deferred_deletes: list[str]
    _epoch: int
    _flushing: int
    _group: dict[str, int]
    _lock: threading.Lock
    _mark: tuple[int, int] | None
    _ops: dict[str, _OpStats]
    _persist_creates: deque[_PendingCreate]
    _persist_deletes: deque[str]
    _persist_scheduled: bool
    _persist_wakeup: threading.Condition
    _synchronous: bool
    _warnings: ProblemLog

    # Provided by DelayIndex and its other mixins.
    _build: Callable[
        [Int64Array, Int64Array, Int64Array, int, int],
        tuple[SnapshotMetadata, PreparedSegments],
    ]
    _defer: Callable[[list[Any], Any], None]
    _drop_bucket: Callable[..., None]
    _make_durable: Callable[[_Bucket, BucketRecord, SnapshotMetadata], None]
    _maybe_merge: Callable[[], None]
    _now: Callable[[], int]
    _queue: Callable[[Callable[[], None]], None]
    _retire: Callable[[_Bucket], None]
    _trim: Callable[[_Bucket], None]
    _read_ahead: Callable[[_Bucket, int], None]
    _unpersisted: Callable[[], int]

    def _schedule_persist(self) -> None:
        """Make sure a persist job will run for the queued changes (lock held)."""
        if not self._persist_scheduled:
            self._persist_scheduled = True
            self._queue(self._persist_job)
        elif len(self._persist_creates) + len(self._persist_deletes) >= (
            self._config.group_commit_max_ops
        ):
            self._persist_wakeup.notify()  # a full batch: stop waiting for more

    def _request_delete(self, snapshot_id: str) -> None:
        """Queue the two-phase delete of a snapshot with the next group commit (lock held)."""
        self._persist_deletes.append(snapshot_id)
        self._schedule_persist()

    def _await_batch(self) -> None:
        """Wait (lock held, released while waiting) until the batch is full, the oldest change
        has waited ``group_commit_max_delay_ms``, or someone flushes or closes."""
        config = self._config
        if self._synchronous or config.group_commit_max_delay_ms <= 0:
            return
        oldest = self._persist_creates[0].enqueued if self._persist_creates else time.monotonic()
        deadline = oldest + config.group_commit_max_delay_ms / 1000.0
        while (
            len(self._persist_creates) + len(self._persist_deletes) < config.group_commit_max_ops
            and not self._flushing
            and not self._closed
        ):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return
            self._persist_wakeup.wait(remaining)

    def _take_batch(self) -> tuple[list[_PendingCreate], list[str]]:
        """Pop the next batch's changes in arrival order (lock held)."""
        limit = self._config.group_commit_max_ops
        deletes: list[str] = []
        while self._persist_deletes and len(deletes) < limit:
            deletes.append(self._persist_deletes.popleft())
        creates: list[_PendingCreate] = []
        while self._persist_creates and len(creates) + len(deletes) < limit:
            item = self._persist_creates.popleft()
            if item.epoch == self._epoch and self._buckets.get(item.bucket.sid) is item.bucket:
                item.bucket.state = "creating"
                creates.append(item)  # else: cleared (or dropped) before it was written
        return creates, deletes

    def _build_batch(
        self, creates: list[_PendingCreate]
    ) -> tuple[list[_PendingCreate], list[tuple[SnapshotMetadata, PreparedSegments]]]:
        """Sort, cut and encode each create until the batch holds ``group_commit_max_bytes``;
        the rest go back to the front of the queue. Returns what to write; builds that fail
        (a bug, or bad settings) put their bucket in memory mode."""
        kept: list[_PendingCreate] = []
        built: list[tuple[SnapshotMetadata, PreparedSegments]] = []
        size = 0
        for i, item in enumerate(creates):
            if built and size >= self._config.group_commit_max_bytes:
                with self._lock:
                    self._persist_creates.extendleft(reversed(creates[i:]))
                break
            b = item.bucket
            try:
                metadata, segments = self._build(item.times, item.ledgers, item.entries,
                                                 b.start, b.end)  # fmt: skip
            except ValueError as exc:
                with self._lock:
                    self._create_failed(item, exc)
                continue
            size += sum(len(p) for p in segments.packed)
            kept.append(item)
            built.append((metadata, segments))
        return kept, built

    def _writer_status(self) -> WriterStatus:
        """What this writer holds only in memory now, for the manifest (lock held)."""
        return WriterStatus(
            self._unpersisted(),
            sum(b.state == "memory" for b in self._buckets.values()),
            max(self._now(), 0),
        )

    def _persist_job(self) -> None:
        """Group commit: write a batch of snapshot creates and deletes with two manifest writes,
        then acknowledge each change (in order) now that it is durable."""
        with self._lock:
            self._await_batch()
            creates, deletes = self._take_batch()
            status = self._writer_status()
        self._catalog.note_writer_status(status)
        self._note_overrides_unlocked()  # carried by this batch's commit
        started = time.perf_counter()
        creates, built = self._build_batch(creates)
        sizes = [len(item.times) for item in creates]

        def status_after(results: Sequence[BucketRecord | Exception]) -> WriterStatus:
            # What the acknowledging commit should record: this batch's creates are durable.
            written = sum(
                n for n, r in zip(sizes, results, strict=True) if not isinstance(r, Exception)
            )
            failed = sum(isinstance(r, Exception) for r in results)
            return WriterStatus(
                max(status.unpersisted - written, 0),
                status.memory_mode_buckets + failed,
                status.as_of_ms,
            )

        outcomes: tuple[BucketRecord | Exception, ...]
        try:
            result = self._catalog.apply_batch(built, deletes, status_after=status_after)
            outcomes, done, commits = result.created, result.deleted, result.commits
        except (StorageError, ManifestConflictError, ValueError) as exc:
            outcomes, done, commits = tuple(exc for _ in creates), tuple(False for _ in deletes), 0
            failed_batch: Exception | None = exc
        else:
            failed_batch = None
        with self._lock:
            self._group["batches"] += 1
            self._group["creates"] += len(creates)
            self._group["deletes"] += len(deletes)
            self._group["manifest_writes"] += commits
            for item, (metadata, segments), outcome in zip(creates, built, outcomes, strict=True):
                if isinstance(outcome, Exception):
                    self._create_failed(item, outcome)
                else:
                    self._create_succeeded(item, outcome, metadata, segments, started)
            for snapshot_id, ok in zip(deletes, done, strict=True):
                self._ops["delete"].record(ok, started)
                if ok:
                    continue
                if self._catalog.manifest.bucket(snapshot_id) is not None:
                    # Still live: the batch failed before deciding it. Retry after the backoff.
                    self._defer(self._deferred_deletes, snapshot_id)
                else:  # a pending intent now: the catalog's retries own it
                    self._warnings.append(f"delete of {snapshot_id!r} failed; will retry")
            if failed_batch is not None:
                self._warnings.append(f"a group commit failed; retried later: {failed_batch}")
            self._persist_scheduled = False
            if self._persist_creates or self._persist_deletes:
                self._schedule_persist()

    def _create_failed(self, item: _PendingCreate, exc: BaseException) -> None:
        """A snapshot write failed: the bucket stays in memory and is retried later."""
        bucket = item.bucket
        self._ops["create"].record(False, time.perf_counter())
        self._warnings.append(
            f"create of bucket [{bucket.start}, {bucket.end}] failed; kept in memory: {exc}"
        )
        if self._buckets.get(bucket.sid) is not bucket:
            return
        bucket.state = "memory"
        if bucket.exhausted:
            self._drop_bucket(bucket)
            return
        item.attempts += 1
        self._defer(self._deferred_creates, item)

    def _create_succeeded(
        self,
        item: _PendingCreate,
        record: BucketRecord,
        metadata: SnapshotMetadata,
        segments: PreparedSegments,
        started: float,
    ) -> None:
        bucket = item.bucket
        self._ops["create"].record(True, started)
        if self._closed or item.epoch != self._epoch or self._buckets.get(bucket.sid) is not bucket:
            # Cleared (or trimmed away) while being written: the snapshot is garbage.
            self._request_delete(record.snapshot_id)
            return
        self._make_durable(bucket, record, metadata)
        self._settle(bucket, segments)

    def _settle(self, bucket: _Bucket, segments: PreparedSegments) -> None:
        """A bucket whose snapshot just became durable: drop its data from memory.

        The segment holding the first index not yet consumed becomes a placeholder, read back
        from storage when it comes due.
        """
        core = self._core
        head = core.source_head(bucket.sid) if core.has_source(bucket.sid) else None
        if bucket.exhausted or head is None:
            self._retire(bucket)
            return
        # Nothing stays in memory: a placeholder (the min deliver time of the segment holding
        # the head) stands for the rest, and the segment is read back when it comes due. An idle
        # bucket then costs its bitmaps in the index and 16 bytes per segment.
        k = segments.segment_of(*head)  # 0-based segment holding the head
        core.cut_source(bucket.sid, -1, -1, -1, bucket.next_time(k))
        bucket.current = k
        if self._mark is not None and bucket.end < self._mark[0]:
            self._trim(bucket)
            return
        self._read_ahead(bucket, self._now())
        self._maybe_merge()
