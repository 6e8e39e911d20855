"""DelayIndex's merges and the bucket bound (``max_num_buckets``).

When more than ``max_num_buckets`` buckets are sealed, up to four adjacent durable buckets with
the fewest messages are merged on the executor: their segments are read back, filtered to
still-tracked positions, re-cut and written; the sources stay live until the merged snapshot is
durable (one manifest commit swaps them), so a failed merge changes nothing. A merge whose
commit outcome is unknown is resolved by a resync before anything is retried. The cancels of
the merged range are folded into the merged snapshot (see ``_overrides.py``, "Folding").
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from delayindex._memory import release_free_memory
from delayindex.config import TrackerConfig
from delayindex.errors import (
    CommitOutcomeUnknownError,
    ManifestConflictError,
    SnapshotCorruptError,
    SnapshotNotFoundError,
    StorageError,
)
from delayindex.model import MAX_TIME
from delayindex.policy import select_merge_window
from delayindex.snapshot.format import PreparedSegments, SnapshotMetadata
from delayindex.storage.base import SnapshotStorage
from delayindex.storage.catalog import Catalog
from delayindex.storage.manifest import BucketRecord
from delayindex.tracker._bucket import _EMPTY, Int64Array, _Bucket
from delayindex.tracker._damage import ProblemLog
from delayindex.tracker._stats import _OpStats

#: A merge reads its sources this many segments at a time, and filters this many rows per
#: lock hold, so that no single step keeps add() waiting for long.
MERGE_READ_SEGMENTS = 256
MERGE_FILTER_ROWS = 65_536


class MergeMixin:
    """DelayIndex's merge job and bucket bound (state lives on the DelayIndex)."""

    # State (set in DelayIndex.__init__).
    _buckets: dict[int, _Bucket]
    _catalog: Catalog
    _closed: bool
    _config: TrackerConfig
    _core: Any
    _deferred_at: int
    _epoch: int
    _lock: threading.Lock
    _mark: tuple[int, int] | None
    _merge_failures: int
    _merge_in_flight: bool
    _merge_retry_at: int
    _ops: dict[str, _OpStats]
    _storage: SnapshotStorage
    _unresolved_merge: tuple[list[_Bucket], int, SnapshotMetadata] | None
    _warnings: ProblemLog

    # Provided by DelayIndex and its other mixins.
    _build: Callable[
        [Int64Array, Int64Array, Int64Array, int, int],
        tuple[SnapshotMetadata, PreparedSegments],
    ]
    _defer_at: Callable[[int], int]
    _drop_bucket: Callable[..., None]
    _fold_for_merge: Callable[[list[_Bucket]], tuple[bytes, int]]
    _folded: Callable[[int, int, int | None], None]
    _make_durable: Callable[[_Bucket, BucketRecord, SnapshotMetadata], None]
    _new_bucket: Callable[[int, int, int], _Bucket]
    _now: Callable[[], int]
    _quarantine: Callable[[Any, BaseException, int], None]
    _queue: Callable[[Callable[[], None]], None]
    _request_delete: Callable[[str], None]
    _retire: Callable[[_Bucket], None]
    _trim: Callable[[_Bucket], None]
    _read_ahead: Callable[[_Bucket, int], None]

    def _maybe_merge(self) -> None:
        """Start a merge if there are too many sealed buckets (lock held).

        Started by a seal, a create or merge that completes, and (after a failed merge's
        backoff) by the retry tick of ``poll``/``has_message_available``.
        """
        limit = self._config.max_num_buckets
        if limit <= 0 or self._merge_in_flight or len(self._buckets) <= limit:
            return
        if self._merge_failures and self._now() < self._merge_retry_at:
            return  # backing off; _resume_merges restarts merging when the backoff runs out
        ordered = sorted(self._buckets.values(), key=lambda b: b.start)
        candidates = [
            (
                b.mergeable(),
                b.num_messages,
                b.next_time(b.current) if b.has_unloaded() else MAX_TIME,
            )
            for b in ordered
        ]
        low, high = self._core.mutable_range
        cut = len(ordered)
        if low >= 0:
            # The mutable bucket lies between sealed ones (after a reopen): no window may span
            # it, so it splits the candidates like an ineligible bucket.
            cut = sum(b.start < low for b in ordered)
            candidates.insert(cut, (False, 0, MAX_TIME))
        chosen = select_merge_window(candidates)
        if chosen is None:
            return
        first, count = chosen
        if first > cut:
            first -= 1
        sources = ordered[first : first + count]
        start, end = sources[0].start, sources[-1].end
        if low >= 0 and low <= end and high >= start:
            return  # cannot happen after the split above; kept as a guard
        # The merged range covers the gaps between the sources too. Registering it now routes
        # adds in those gaps to the direct heap, so no other bucket can claim a ledger in it.
        for b in sources:
            b.merging = True
            self._core.remove_range(b.start)
        self._core.add_range(start, end)
        self._merge_in_flight = True
        epoch = self._epoch
        self._queue(lambda: self._merge_then_trim(sources, epoch))

    def _resume_merges(self, now: int) -> None:
        """Retry tick (lock held): merge again once a failed merge's backoff has run out."""
        if self._merge_failures and now < self._merge_retry_at:
            # Another retry fired the tick first: keep it armed for the merge's own time.
            self._deferred_at = min(self._deferred_at, self._merge_retry_at)
            return
        self._maybe_merge()

    def _bound_stats(self) -> dict[str, Any]:
        """``stats()`` keys on the bucket bound: how far above ``max_num_buckets``, and why."""
        limit = self._config.max_num_buckets
        sealed = list(self._buckets.values())
        over = max(len(sealed) - limit, 0) if limit > 0 else 0
        return {
            "bucket_limit": limit if limit > 0 else None,
            "over_limit": over,
            "over_limit_why": {
                "creating": sum(b.state == "creating" for b in sealed),
                "memory_mode": sum(b.state == "memory" for b in sealed),
                "quarantined": sum(b.state in ("quarantined", "released") for b in sealed),
                "merging": sum(b.merging for b in sealed),
                "merge_failures": self._merge_failures,
                "merge_retry_at_ms": self._merge_retry_at if self._merge_failures else None,
            },
        }

    def _merge_then_trim(self, sources: list[_Bucket], epoch: int) -> None:
        self._merge_job(sources, epoch)
        release_free_memory()  # the merge's decoded segments (tens of MB) are garbage now

    def _merge_job(self, sources: list[_Bucket], epoch: int) -> None:
        started = time.perf_counter()
        record: BucketRecord | None = None
        metadata: SnapshotMetadata | None = None
        reading: _Bucket | None = None
        fold_gen: int | None = None
        try:
            columns: list[tuple[Int64Array, Int64Array, Int64Array]] = []
            for b in sources:
                reading = b
                assert b.snapshot_id is not None
                # Read in slices: each decode holds the GIL, and add() must not wait long.
                for first in range(1, b.num_segments + 1, MERGE_READ_SEGMENTS):
                    last = min(first + MERGE_READ_SEGMENTS - 1, b.num_segments)
                    columns.append(self._storage.get_segment_arrays(b.snapshot_id, first, last))
            times, ledgers, entries = (np.concatenate(c) for c in zip(*columns, strict=True))
            times, ledgers, entries = self._still_tracked(times, ledgers, entries)
            if len(times):
                # The range's cancels move into the merged bucket (it holds them for the
                # dispatcher's replay), so they leave memory and the manifest.
                reading = None  # a folded set that does not read fails the merge, no more
                folded, fold_gen = self._fold_for_merge(sources)
                # build_snapshot sorts (natively, without the GIL).
                metadata, segments = self._build(
                    times, ledgers, entries, sources[0].start, sources[-1].end
                )
                if folded:
                    metadata = metadata.with_folded(folded)
                # The sources' objects are deleted only once this index no longer reads them
                # (_merge_succeeded): a poll may be loading one of their segments right now.
                record = self._catalog.create_bucket(
                    metadata,
                    segments,
                    replaces=[b.snapshot_id for b in sources if b.snapshot_id],
                    delete_replaced=False,
                )
        except CommitOutcomeUnknownError as exc:
            # The merged bucket may be live and its sources delete intents, or not. Until a
            # resync tells, the sources stay as they are (still readable: the catalog deletes
            # nothing before it has re-read the manifest, and this index retries nothing first).
            assert metadata is not None
            with self._lock:
                self._ops["merge"].record(False, started)
                self._warnings.append(f"merge outcome unknown; resolved later: {exc}")
                self._unresolved_merge = (sources, epoch, metadata)
                self._defer_at(1)
            return
        except (StorageError, ManifestConflictError, SnapshotCorruptError,
                SnapshotNotFoundError, ValueError) as exc:  # fmt: skip
            with self._lock:
                self._ops["merge"].record(False, started)
                self._warnings.append(f"merge of {len(sources)} buckets failed: {exc}")
                self._merge_failed(sources, epoch)
                damaged = isinstance(exc, (SnapshotCorruptError, SnapshotNotFoundError))
                if damaged and reading is not None and self._buckets.get(reading.sid) is reading:
                    self._quarantine(reading, exc, max(reading.current, 1))
            return
        with self._lock:
            self._ops["merge"].record(True, started)
            if record is None:  # nothing tracked any more: the sources just go
                self._merge_in_flight = False
                for b in sources:
                    b.merging = False
                if epoch == self._epoch and not self._closed:
                    self._unregister_merge(sources)
                for b in sources:
                    if self._buckets.get(b.sid) is b:
                        self._retire(b)
                self._merge_failures = 0
                self._maybe_merge()  # still too many buckets? merges chain until they fit
                return
            assert metadata is not None
            self._merge_succeeded(sources, epoch, record, metadata, fold_gen)

    def _still_tracked(
        self, times: Int64Array, ledgers: Int64Array, entries: Int64Array
    ) -> tuple[Int64Array, Int64Array, Int64Array]:
        """The rows whose position is still tracked, filtered a slice per lock hold (the lock
        is add()'s too), in the order the core filters fastest (``tracked_mask_order``; the
        build sorts them by time anyway)."""
        order = self._core.tracked_mask_order(ledgers, entries)
        if order is not None:
            times, ledgers, entries = times[order], ledgers[order], entries[order]
        keep = np.empty(len(times), dtype=np.bool_)
        for start in range(0, len(times), MERGE_FILTER_ROWS):
            stop = start + MERGE_FILTER_ROWS
            with self._lock:
                keep[start:stop] = self._core.tracked_mask(ledgers[start:stop], entries[start:stop])
        return times[keep], ledgers[keep], entries[keep]

    def _merge_failed(self, sources: list[_Bucket], epoch: int) -> None:
        """A merge did not happen: the sources are themselves again (lock held), and merging
        resumes after the retry backoff (the count stays above the bound meanwhile)."""
        self._merge_in_flight = False
        self._merge_failures += 1
        self._merge_retry_at = self._defer_at(self._merge_failures)
        if epoch == self._epoch and not self._closed:
            self._unregister_merge(sources)
        mark = self._mark
        for b in sources:
            b.merging = False
            if self._buckets.get(b.sid) is not b:
                continue
            if mark is not None and b.end < mark[0]:
                self._trim(b)  # acknowledged while the merge ran
            elif b.exhausted:
                self._retire(b)

    def _merge_succeeded(
        self,
        sources: list[_Bucket],
        epoch: int,
        record: BucketRecord,
        metadata: SnapshotMetadata,
        fold_gen: int | None = None,
    ) -> None:
        """The merged bucket is live and its sources are gone from the manifest (lock held).

        The sources' in-memory runs (loaded segments) are dropped: every position still
        tracked in them was tracked when the merge filtered, so it is in the merged snapshot,
        behind a placeholder for segment 1 that keeps delivery in global order. Cancels it
        folded (taken at ``fold_gen``; None: unknown) leave memory and the manifest.
        """
        self._merge_in_flight = False
        self._merge_failures = 0
        for b in sources:
            b.merging = False
            if b.snapshot_id is not None:
                self._request_delete(b.snapshot_id)  # delete intents since the merge's commit
        if self._closed or epoch != self._epoch:
            self._request_delete(record.snapshot_id)
            return
        for b in sources:
            self._drop_bucket(b, keep_range=True)  # the merged range is registered
            if b.load_failures:
                self._warnings.resolve(f"load:{b.snapshot_id}")
        merged = self._new_bucket(record.start_ledger, record.end_ledger, record.num_messages)
        self._make_durable(merged, record, metadata)
        # A source whose reads were failing had its messages held back (late): they are the
        # merged bucket's now, and stay late until its first read succeeds, so stats() keeps
        # reporting the bucket in ``retrying_loads`` until then.
        merged.load_failures = max((b.load_failures for b in sources), default=0)
        if merged.folded:
            self._folded(merged.start, merged.end, fold_gen)
        # Nothing in memory: a placeholder for segment 1, read back when it comes due.
        self._core.set_source(merged.sid, _EMPTY, _EMPTY, _EMPTY, merged.next_time(0))
        if self._mark is not None and merged.end < self._mark[0]:
            self._trim(merged)  # acknowledged while it was being merged
        else:
            self._read_ahead(merged, self._now())
        self._maybe_merge()  # still too many buckets? merges chain until they fit

    def _resolve_merge_job(self) -> None:
        """Learn whether a merge whose commit outcome was unknown happened, and act on it."""
        with self._lock:
            unresolved = self._unresolved_merge
        if unresolved is None:
            return
        sources, epoch, metadata = unresolved
        try:
            manifest = self._catalog.resync()
        except (StorageError, SnapshotCorruptError) as exc:
            with self._lock:
                self._warnings.append(f"merge outcome still unknown: {exc}")
                self._defer_at(2)
            return
        live = manifest.live_ids()
        merged = next(
            (
                b
                for b in manifest.buckets
                if (b.start_ledger, b.end_ledger) == (sources[0].start, sources[-1].end)
                and b.snapshot_id not in {s.snapshot_id for s in sources}
            ),
            None,
        )
        with self._lock:
            self._unresolved_merge = None
            if merged is not None and not any(s.snapshot_id in live for s in sources):
                self._merge_succeeded(sources, epoch, merged, metadata)
            else:
                self._merge_failed(sources, epoch)

    def _unregister_merge(self, sources: list[_Bucket]) -> None:
        """A merge did not happen: the sources get their own ranges back (lock held)."""
        self._core.remove_range(sources[0].start)
        for b in sources:
            self._core.add_range(b.start, b.end)
