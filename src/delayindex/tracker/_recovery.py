"""DelayIndex's recovery at open (:meth:`DelayIndex.open` calls ``_recover``).

The catalog has repaired the manifest's intents; each live bucket's metadata is read and fully
due segments are skipped; its first live segment becomes a placeholder, read when due like any
later one (an open reads no segment). Its positions are restored now only
if something at open needs them (folded cancels, the mark, a stored override in its range);
the others wait for the first call that needs membership (``_lazy_restore.py``). The
persisted mark is applied.

A damaged or missing snapshot quarantines its bucket only (damage in a segment, or in a lazy
bucket's bitmaps, when it is read: then). A storage error reading a metadata raises
:class:`~delayindex.errors.RecoveryError` having changed nothing (its positions cannot be
known); one reading a segment later retries with the loads' backoff.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import numpy as np

from delayindex.errors import (
    ManifestConflictError,
    RecoveryError,
    SnapshotCorruptError,
    SnapshotNotFoundError,
    StorageError,
)
from delayindex.policy import resolve_overlaps
from delayindex.snapshot.format import SnapshotMetadata
from delayindex.storage._overrides import Overrides
from delayindex.storage.base import SnapshotStorage
from delayindex.storage.catalog import Catalog
from delayindex.storage.manifest import BucketRecord, QuarantineRecord
from delayindex.tracker._bucket import _Bucket
from delayindex.tracker._damage import ProblemLog, damage_reason
from delayindex.tracker._lazy_restore import LazyBucket
from delayindex.tracker._stats import _OpStats

_NONE = np.empty(0, dtype=np.int64)


def _restore_live(core: Any, metadata: SnapshotMetadata, first: int, name: str) -> None:
    """Track the positions of segments ``first..`` in ``core``, parsed straight from the
    metadata's bitmap block (no per-ledger arrays between), checked against the counts.

    Raises:
        SnapshotCorruptError: a bitmap is malformed, a position is in two segments, or the
            bitmaps do not hold the segments' counts; ``core`` then holds none of them.
    """
    expected = int(metadata.counts[first - 1 :].sum())
    try:
        core.restore_block(*metadata.live_block(first), expected)
    except ValueError as exc:
        raise SnapshotCorruptError(f"{name}: bad bitmaps: {exc}") from None


class RecoveryMixin:
    """DelayIndex's recovery (state lives on the DelayIndex)."""

    # State (set in DelayIndex.__init__).
    _buckets: dict[int, _Bucket]
    _catalog: Catalog
    _core: Any
    _mark: tuple[int, int] | None
    _name: str
    _ops: dict[str, _OpStats]
    _storage: SnapshotStorage
    _warnings: ProblemLog

    # Provided by DelayIndex and its other mixins.
    _install_quarantined: Callable[[QuarantineRecord, Any], None]
    _make_durable: Callable[[_Bucket, BucketRecord, SnapshotMetadata], None]
    _new_bucket: Callable[[int, int, int], _Bucket]
    _now: Callable[[], int]
    _quarantined_positions: Callable[[QuarantineRecord], Any]
    _read_ahead: Callable[[_Bucket, int], None]
    _request_delete: Callable[[str], None]
    _restore_overrides: Callable[[], None]
    _maybe_merge: Callable[[], None]
    _overrides_dirty: bool
    _overrides_used: bool
    _trim: Callable[[_Bucket], None]
    _defer_restores: Callable[[Any, list[LazyBucket]], None]
    _restore_lazy_in: Callable[..., list[LazyBucket]]

    def _recover(self) -> None:
        started = time.perf_counter()
        report = self._catalog.repair_report
        if report.recovered:  # a damaged or missing manifest, recovered: say so, loudly
            self._warnings.append(report.recovered)
        for snapshot_id in report.pending_deletes:
            self._warnings.append(f"delete of {snapshot_id!r} still pending after repair")
        records, overlapping = resolve_overlaps(self._catalog.buckets())
        now = self._now()
        core = self._core
        cutoff = core.cutoff_for(now)
        # (record, metadata, first live segment, whether its positions wait for a call)
        loaded: list[tuple[BucketRecord, SnapshotMetadata, int, bool]] = []
        mark = self._catalog.manifest.mark_delete
        damaged: list[tuple[QuarantineRecord, Any]] = []
        drop: list[str] = [r.snapshot_id for r in overlapping]
        unfolded: list[tuple[Any, Any]] = []
        for record in records:
            sid_name = record.snapshot_id
            first = 1
            try:
                # Bitmaps are parsed once, below, and only those of the live segments.
                metadata = self._storage.get_metadata(sid_name, check_bitmaps=False)
                found = metadata.first_live_segment(cutoff)
                if found is None:
                    drop.append(sid_name)  # every index is due: the dispatcher delivers them
                    if metadata.folded_cancels:  # its folded cancels go back to memory
                        unfolded.append(metadata.folded_positions())
                    continue
                first = found
                deferred = not record.folded_cancels and (
                    mark is None or record.start_ledger > mark[0]
                )
                if not deferred:
                    _restore_live(core, metadata, first, sid_name)
            except (SnapshotNotFoundError, SnapshotCorruptError) as exc:
                # Damage stays local: this bucket is quarantined (its positions unknown: its
                # metadata or bitmaps are damaged), the others recover.
                damaged.append(
                    (
                        QuarantineRecord(
                            sid_name, record.start_ledger, record.end_ledger,
                            record.num_messages, first, damage_reason(exc), max(now, 0),
                            folded_cancels=record.folded_cancels,
                        ),
                        None,
                    )
                )  # fmt: skip
                continue
            except StorageError as exc:
                self._ops["recover"].record(False, started)
                raise RecoveryError(
                    f"cannot recover {self._name!r}: reading snapshot {sid_name!r} (bucket "
                    f"[{record.start_ledger}, {record.end_ledger}]) failed: {exc}; nothing was "
                    "changed, open again once the storage answers"
                ) from exc
            loaded.append((record, metadata, first, deferred))
        if damaged:
            try:
                self._catalog.quarantine_buckets([q for q, _ in damaged])
            except (StorageError, ManifestConflictError) as exc:
                self._ops["recover"].record(False, started)
                names = ", ".join(repr(q.snapshot_id) for q, _ in damaged)
                raise RecoveryError(
                    f"cannot recover {self._name!r}: snapshots {names} are damaged and moving "
                    f"them to the quarantine failed: {exc}"
                ) from exc
        new_ids = {q.snapshot_id for q, _ in damaged}
        damaged.extend(
            (q, self._quarantined_positions(q))
            for q in self._catalog.manifest.quarantined
            if q.active and q.snapshot_id not in new_ids
        )
        lazy: list[LazyBucket] = []
        for record, metadata, first, deferred in loaded:
            bucket = self._new_bucket(record.start_ledger, record.end_ledger, 0)
            self._make_durable(bucket, record, metadata)
            core.add_range(bucket.start, bucket.end)
            if deferred:
                count = int(metadata.counts[first - 1 :].sum())
                lazy.append(LazyBucket(bucket, metadata, first, count))
            # Its first live segment is a placeholder, read when due (or ahead of that, by the
            # storage's read-ahead): an open reads no segment. Damage found then quarantines
            # the bucket as any load's does; a failing read retries with backoff.
            bucket.current = first - 1
            core.set_source(bucket.sid, _NONE, _NONE, _NONE, bucket.next_time(first - 1))
            self._read_ahead(bucket, now)
        for quarantine, live in damaged:
            self._install_quarantined(quarantine, live)
        for snapshot_id in drop:
            self._request_delete(snapshot_id)
        # What is applied below needs the positions it touches: those buckets are restored now.
        needed = _override_ledgers(self._catalog.manifest.overrides, unfolded)
        lazy = self._restore_lazy_in(core, lazy, needed)
        if mark is not None:  # acknowledged before the restart: never delivered again
            self._mark = mark
            core.untrack_upto(*mark)
            for bucket in list(self._buckets.values()):
                if bucket.end < mark[0]:
                    self._trim(bucket)
        for ledgers, entries in unfolded:  # before the manifest's: a move there wins
            core.restore_overrides(ledgers, entries, _NONE, _NONE, _NONE)
            self._overrides_dirty = self._overrides_used = True  # the delete's commit notes
        self._restore_overrides()  # after the mark: it forgets the overrides it passes
        for bucket in self._buckets.values():
            if bucket.folded:  # an add there of an untracked position asks for them
                core.evict_range(bucket.start, bucket.end, False)
        self._defer_restores(core, lazy)
        # Over the bucket bound (a lower max_num_buckets, or a crash mid-merge): merge now, not
        # only after the next seal.
        self._maybe_merge()
        self._ops["recover"].record(True, started)


def _override_ledgers(stored: Overrides, unfolded: list[tuple[Any, Any]]) -> Any:
    """The ledgers recovery applies overrides to (the manifest's ``stored`` ones and the
    unfolded cancels), sorted and unique: a lazy bucket holding one is restored before."""
    parts = [ledgers for ledgers, _ in unfolded]
    if stored:
        cancelled, _, moved, _, _ = stored.to_arrays()
        parts += [cancelled, moved]
    return np.unique(np.concatenate(parts)) if parts else _NONE
