"""DelayIndex's housekeeping: trim and delete of buckets, and the retries of failed changes.

Buckets wholly below the mark-delete ledger are trimmed (their ledgers untracked) and, like
exhausted buckets, retired through the catalog's two-phase delete. Failed snapshot writes and
deletes are deferred and retried once their backoff runs out on the index's clock
(``_maybe_retry_failures``, driven from ``poll``/``has_message_available``); a create intent
that a failed rollback left behind (it still replaces its merge's sources) is rolled back
first, since the retried group commits and merges would fail on it again. ``clear`` drops
everything and deletes every snapshot of the name.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from delayindex.config import TrackerConfig
from delayindex.errors import ManifestConflictError, StorageError
from delayindex.model import MAX_TIME
from delayindex.policy import backoff_delay_ms
from delayindex.snapshot.format import SnapshotMetadata
from delayindex.storage._overrides import Overrides
from delayindex.storage.catalog import Catalog
from delayindex.storage.manifest import QuarantineRecord
from delayindex.timers import ArmingRule
from delayindex.tracker._bucket import _Bucket, _PendingCreate
from delayindex.tracker._damage import ProblemLog
from delayindex.tracker._stats import _OpStats


class HousekeepingMixin:
    """DelayIndex's trim, delete, retries and ``clear`` (state lives on the DelayIndex)."""

    # State (set in DelayIndex.__init__).
    _arming: ArmingRule | None
    _buckets: dict[int, _Bucket]
    _catalog: Catalog
    _config: TrackerConfig
    _core: Any
    _drop_lazy: Callable[[], Any]
    _deferred_at: int
    _deferred_creates: list[_PendingCreate]
    _deferred_deletes: list[str]
    _epoch: int
    _evicted_count: int
    _lock: threading.Lock
    _mark: tuple[int, int] | None
    _merge_in_flight: bool
    _ops: dict[str, _OpStats]
    _pending_quarantine: list[tuple[QuarantineRecord, str]]
    _persist_creates: deque[_PendingCreate]
    _persist_deletes: deque[str]
    _persist_scheduled: bool
    _retry_queued: bool
    _unresolved_merge: tuple[list[_Bucket], int, SnapshotMetadata] | None
    _warnings: ProblemLog

    # Provided by DelayIndex and its other mixins.
    _check_open: Callable[[], None]
    flush: Callable[[], None]
    _forget_quarantined: Callable[[Any, str], None]
    _now: Callable[[], int]
    _queue: Callable[[Callable[[], None]], None]
    _request_delete: Callable[[str], None]
    _resolve_merge_job: Callable[[], None]
    _resume_merges: Callable[[int], None]
    _unfold: Callable[[_Bucket], bool]
    _retry_quarantine_commits: Callable[[], None]
    _schedule_persist: Callable[[], None]

    def _defer_at(self, attempts: int) -> int:
        """Schedule the retry tick after the backoff of ``attempts`` failures (lock held);
        return when that backoff runs out."""
        at: int = max(self._now(), 0) + backoff_delay_ms(
            self._config.delete_retry_delay_ms, attempts
        )
        self._deferred_at = min(self._deferred_at, at)
        return at

    def _defer(self, queue: list[Any], item: Any) -> None:
        """Keep a failed change for a retry after the backoff, on the index's clock (lock held)."""
        queue.append(item)
        self._defer_at(item.attempts if isinstance(item, _PendingCreate) else 1)

    def _trim(self, bucket: _Bucket) -> None:
        """Delete a bucket wholly below the mark-delete ledger (lock held). Everything in its
        ledgers is acknowledged (positions added after the mark at or below it were never
        tracked), so they are untracked: nothing stays counted that can no longer be
        delivered."""
        self._core.untrack_ledgers(bucket.start, bucket.end)
        if bucket.state in ("quarantined", "released"):
            self._forget_quarantined(bucket, "acknowledged")  # the damaged object stays
            self._drop_bucket(bucket)
        elif bucket.state == "memory":
            self._drop_bucket(bucket)
        else:
            self._retire(bucket)

    def _retire(self, bucket: _Bucket) -> None:
        """Drop a durable bucket from memory and queue its two-phase delete (lock held).

        A bucket holding folded cancels above the mark hands them back first (they go to the
        manifest with the delete's commit); if they cannot be read it stays, since its object
        is their only copy, until the mark passes it."""
        mark = self._mark
        if bucket.folded and (mark is None or bucket.end >= mark[0]):
            if not self._unfold(bucket):
                bucket.exhausted = True
                return
            bucket.folded = 0
        snapshot_id = bucket.snapshot_id
        self._drop_bucket(bucket)
        if snapshot_id is not None:
            self._request_delete(snapshot_id)

    def _drop_bucket(self, bucket: _Bucket, *, keep_range: bool = False) -> None:
        core = self._core
        if self._buckets.pop(bucket.sid, None) is None:
            return
        core.remove_source(bucket.sid)
        if not keep_range:
            core.remove_range(bucket.start)

    def _maybe_retry_failures(self, now: int) -> None:
        """Queue the retries whose backoff has run out (lock held): failed snapshot writes and
        deletes the group commit deferred, a merge whose outcome is unknown, merging after a
        failed merge, the catalog's failed delete intents and leftover create intents.

        Driven by the index's clock: failures wait ``delete_retry_delay_ms`` (doubling per
        failure); delete intents move to the dead letters after ``max_delete_attempts``.
        """
        if self._deferred_at <= now:
            self._deferred_at = MAX_TIME
            if self._unresolved_merge is not None:
                self._queue(self._resolve_merge_job)  # first: before any delete is retried
            else:
                # First too: a leftover create intent still replaces its merge's sources, so a
                # group commit deleting one of them, and a merge taking one, would fail again.
                self._queue_leftover_rollback(now)
            for item in self._deferred_creates:
                if self._buckets.get(item.bucket.sid) is item.bucket and item.epoch == self._epoch:
                    item.enqueued = time.monotonic()
                    self._persist_creates.append(item)
            self._persist_deletes.extend(self._deferred_deletes)
            self._deferred_creates, self._deferred_deletes = [], []
            self._retry_quarantine_commits()
            if self._persist_creates or self._persist_deletes:
                self._schedule_persist()
            self._resume_merges(now)
        if self._retry_queued or self._unresolved_merge is not None:
            return
        if self._queue_leftover_rollback(now):
            return
        due = [i.next_attempt_ms for i in self._catalog.manifest.intents if i.kind == "delete"]
        if not due or min(due) > now:
            return
        self._retry_queued = True
        self._queue(lambda: self._retry_deletes_job(now))

    def _queue_leftover_rollback(self, now: int) -> bool:
        """Queue the rollback of create intents that failed rollbacks left behind (lock held),
        with the due delete retries (``Catalog.retry_pending_deletes`` does both); whether it
        was queued.

        Only while no create is running (no persist job scheduled, no merge in flight), so a
        create intent is a leftover; else it waits for the next call. The retry tick calls this
        before it queues the retried writes and merges: a leftover still replaces its merge's
        sources, and until it is rolled back a group commit deleting one of them fails whole
        (its creates stay in memory mode) and a merge taking one fails, every time.
        """
        if (
            self._retry_queued
            or self._unresolved_merge is not None
            or self._persist_scheduled
            or self._merge_in_flight
            or not any(i.kind == "create" for i in self._catalog.manifest.intents)
        ):
            return False
        self._retry_queued = True
        self._queue(lambda: self._retry_deletes_job(now))
        return True

    def _retry_deletes_job(self, now: int) -> None:
        started = time.perf_counter()
        try:
            report = self._catalog.retry_pending_deletes(now_ms=now)
        finally:
            with self._lock:
                self._retry_queued = False
        with self._lock:
            for _ in report.completed:
                self._ops["delete"].record(True, started)
            for snapshot_id in (*report.failed, *report.dead_lettered):
                self._ops["delete"].record(False, started)
                self._warnings.append(f"delete of {snapshot_id!r} failed again")

    def clear(self) -> None:
        """Drop everything and delete every snapshot of this name.

        Always completes: in-flight jobs are awaited, and deletes that fail stay as pending
        intents in the manifest (retried later, shown in :meth:`stats`), never raised.
        Quarantined buckets are resolved as ``cleared``; their damaged objects are kept.
        """
        self._check_open()
        self.flush()
        with self._lock:
            self._epoch += 1
            self._drop_lazy().clear()  # deferred positions go with their snapshots
            self._buckets.clear()
            self._persist_creates.clear()
            self._deferred_creates.clear()
            self._merge_in_flight = False
            self._mark = None
            self._catalog.note_mark_delete(None)
            self._catalog.note_overrides(Overrides())  # the core forgot them too
            self._overrides_dirty = False
            self._evicted_count = 0  # evicted ones included
            if self._arming is not None:
                self._arming.cancel()
            live = [b.snapshot_id for b in self._catalog.buckets()]
            self._pending_quarantine.clear()  # superseded by the resolution below
            damaged = [q.snapshot_id for q in self._catalog.manifest.quarantined if q.active]
        try:
            self._catalog.resolve_quarantine(damaged, "cleared")
        except (StorageError, ManifestConflictError) as exc:
            with self._lock:
                self._warnings.append(f"clear: the quarantine is not resolved: {exc}")
        for snapshot_id in live:
            try:
                self._catalog.delete_bucket(snapshot_id)
            except (StorageError, ManifestConflictError, ValueError) as exc:
                with self._lock:
                    self._warnings.append(f"clear: delete of {snapshot_id!r} failed: {exc}")
        try:
            self._catalog.retry_pending_deletes(force=True)
        except (StorageError, ManifestConflictError) as exc:
            with self._lock:
                self._warnings.append(f"clear: pending deletes not finished: {exc}")
        try:
            self._catalog.persist_mark_delete()  # the reset, now: an old mark must not return
        except (StorageError, ManifestConflictError) as exc:
            with self._lock:
                self._warnings.append(f"clear: the mark-delete reset is not persisted: {exc}")
