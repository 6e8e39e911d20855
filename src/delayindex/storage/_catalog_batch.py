"""The catalog's group commit: many creates and deletes with two manifest writes.

``apply_batch(creates, deletes)`` (group commit: many seals and deletes, two manifest writes)::

    [batch.begin]
    1. commit: + Intent(create) per create, live -> Intent(delete) per delete
    [batch.intents_committed]
    2. storage.create + length per create; storage.delete per delete      outcomes collected
    [batch.objects_written]
    3. commit: created -> live BucketRecord, failed create -> Intent(delete),
               deleted -> intent dropped, failed delete -> attempts + 1 (or dead letter)
    [batch.committed]
    4. only if a create failed: delete steps 2-3 for its object (``_catalog_deletes``)

Each change is acknowledged (reported in the result) only after the commit that makes it
durable, and the result lists outcomes in request order. A crash anywhere leaves intents that
the next open repairs exactly as for the single-change calls.

Invariants: a failure of the first commit changes nothing and is raised; after it every outcome
is reported per change, never raised; a create whose commit landed although its caller was
told the outcome is unknown is recognised on retry (same range, same metadata) and acknowledged
with the live record instead of being written twice.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from delayindex._cancelset import count_packed
from delayindex.errors import (
    CommitOutcomeUnknownError,
    ManifestConflictError,
    SnapshotCorruptError,
    SnapshotNotFoundError,
    StorageError,
)
from delayindex.snapshot.format import Segment, SnapshotMetadata
from delayindex.storage.base import SnapshotStorage
from delayindex.storage.manifest import BucketRecord, Intent, Manifest, WriterStatus, validate_key


@dataclass(frozen=True)
class BatchResult:
    """Outcome of :meth:`Catalog.apply_batch`, in request order.

    ``created[i]`` is the live record of create ``i``, or the exception that made it fail (the
    create was rolled back). ``deleted[j]`` is True when delete ``j`` is finished, False when it
    stays pending (retried later, or dead-lettered). ``commits`` counts manifest writes made.
    """

    created: tuple[BucketRecord | Exception, ...] = ()
    deleted: tuple[bool, ...] = ()
    commits: int = 0


class BatchMixin:
    """The catalog's group commit (state lives on the Catalog)."""

    # State (set in Catalog.__init__).
    _manifest: Manifest
    _mutex: threading.RLock
    _storage: SnapshotStorage
    name: str
    _writer_status: WriterStatus | None

    # Provided by Catalog and its other mixins.
    _check_open: Callable[[], None]
    _commit: Callable[[Manifest], None]
    _convert_creates: Callable[[], list[str]]
    _finish_delete: Callable[[Intent], bool]
    _hook: Callable[[str], None]
    _new_key: Callable[[int, int, Sequence[Intent]], str]
    _problem: Callable[[str], None]
    _sync: Callable[[], None]
    _with_delete_failure: Callable[[Manifest, Intent, BaseException], Manifest]

    def apply_batch(
        self,
        creates: Sequence[tuple[SnapshotMetadata, Sequence[Segment]]] = (),
        deletes: Sequence[str] = (),
        *,
        status_after: Callable[[Sequence[BucketRecord | Exception]], WriterStatus] | None = None,
    ) -> BatchResult:
        """Create and delete many buckets with two manifest commits (group commit).

        ``creates`` are ``(metadata, segments)`` of new buckets (not merges; use
        :meth:`create_bucket` with ``replaces`` for those); ``deletes`` are snapshot ids that are
        live, or pending delete intents (retried), or unknown (already gone: reported done).
        Outcomes are reported per change, never raised, except a failure of the first commit,
        after which nothing has changed:

        * a create whose range is already live with equal metadata (a retry after an unknown
          commit outcome) is acknowledged with the live record; one that overlaps a live bucket
          or an earlier create of the batch fails with ``ValueError``;
        * storage failures fail that change (``StorageError``; ``CommitOutcomeUnknownError``
          when the second commit's outcome is unknown).

        ``status_after`` (called with the create outcomes, under this catalog's lock: it must
        not block) gives the writer status that the second commit records.

        Raises:
            ValueError, TypeError: malformed requests (not a SnapshotMetadata, a repeated or bad
                delete id, a delete of a bucket that a pending merge replaces); nothing changed.
            StorageError, ManifestConflictError: the first commit failed; nothing changed.
        """
        with self._mutex:
            self._check_open()
            self._sync()
            before = self._manifest
            plan: list[Intent | BucketRecord | Exception] = []
            taken: list[tuple[int, int]] = []
            for metadata, _segments in creates:
                if not isinstance(metadata, SnapshotMetadata):
                    raise TypeError(
                        f"metadata must be a SnapshotMetadata, not {type(metadata).__name__}"
                    )
            ids = list(deletes)
            if len(set(ids)) != len(ids):
                raise ValueError(f"deletes repeats an id: {ids}")
            for snapshot_id in ids:
                validate_key(snapshot_id, "snapshot id")
                if any(snapshot_id in i.replaces for i in before.intents):
                    raise ValueError(f"{snapshot_id!r} is being merged; delete it after the merge")
            for metadata, _segments in creates:
                start, end = metadata.start_ledger, metadata.end_ledger
                live = before.overlapping(start, end)
                if self._already_created(live, metadata):
                    plan.append(live[0])
                    continue
                clash = [b.snapshot_id for b in live]
                clash += [f"[{a}, {b}]" for a, b in taken if a <= end and start <= b]
                if clash:
                    plan.append(ValueError(f"range [{start}, {end}] overlaps {clash}"))
                    continue
                taken.append((start, end))
                pending = [p for p in plan if isinstance(p, Intent)]
                plan.append(Intent("create", self._new_key(start, end, pending), start, end))
            intents = [p for p in plan if isinstance(p, Intent)]
            manifest = before
            for snapshot_id in ids:
                record = before.bucket(snapshot_id)
                if record is not None:
                    manifest = manifest.without_bucket(snapshot_id).with_intent(
                        Intent("delete", snapshot_id, record.start_ledger, record.end_ledger)
                    )
            for intent in intents:
                manifest = manifest.with_intent(intent)
            commits = 0
            self._hook("batch.begin")
            if manifest != before:
                self._commit(manifest)  # 1
                commits += 1
            self._hook("batch.intents_committed")

            outcomes: list[BucketRecord | Exception] = []  # 2
            generation = self._manifest.version  # the commit that recorded the intents
            for step, (metadata, segments) in zip(plan, creates, strict=True):
                if not isinstance(step, Intent):
                    outcomes.append(step)
                    continue
                key = step.snapshot_id
                try:
                    self._storage.create(metadata.with_origin(self.name, generation), segments, key)
                    size = self._storage.length(key)
                    outcomes.append(
                        BucketRecord(
                            step.start_ledger, step.end_ledger, key,
                            metadata.num_messages, metadata.num_segments, size,
                            count_packed(metadata.folded_cancels),
                        )
                    )  # fmt: skip
                except (StorageError, SnapshotCorruptError, ValueError) as exc:
                    outcomes.append(exc)
            deleted: dict[str, Exception | None] = {}
            for snapshot_id in ids:
                pending_delete = self._manifest.intent(snapshot_id)
                if pending_delete is None or pending_delete.kind != "delete":
                    continue
                try:
                    self._storage.delete(snapshot_id)
                    deleted[snapshot_id] = None
                except StorageError as exc:
                    deleted[snapshot_id] = exc
            self._hook("batch.objects_written")

            if status_after is not None:
                self._writer_status = status_after(outcomes)
            manifest = self._manifest  # 3
            failed: list[Intent] = []
            for step, outcome in zip(plan, outcomes, strict=True):
                if not isinstance(step, Intent):
                    continue
                if isinstance(outcome, BucketRecord):
                    manifest = manifest.without_intent(step.snapshot_id).with_bucket(outcome)
                else:
                    undo = Intent("delete", step.snapshot_id, step.start_ledger, step.end_ledger)
                    manifest = manifest.with_updated_intent(undo)
                    failed.append(undo)
            for snapshot_id, error in deleted.items():
                pending_delete = manifest.intent(snapshot_id)
                assert pending_delete is not None  # the lock keeps it so
                if error is None:
                    manifest = manifest.without_intent(snapshot_id)
                else:
                    manifest = self._with_delete_failure(manifest, pending_delete, error)
            try:
                if manifest != self._manifest:
                    self._commit(manifest)
                    commits += 1
            except (StorageError, ManifestConflictError) as exc:
                # Every create of the batch failed with it; the other outcomes stand.
                failed_all = tuple(
                    exc if isinstance(s, Intent) else o for s, o in zip(plan, outcomes, strict=True)
                )
                if isinstance(exc, CommitOutcomeUnknownError):
                    # Maybe durable, maybe not: nothing is rolled back. A retry of the same
                    # create after the resync finds it live (same range and metadata).
                    self._problem(f"batch commit outcome unknown: {exc}")
                    return BatchResult(failed_all, tuple(False for _ in ids), commits)
                self._problem(f"batch commit failed; the batch is rolled back: {exc}")
                try:
                    self._convert_creates()  # the written objects become delete intents
                except (StorageError, ManifestConflictError) as undo_exc:
                    self._problem(f"rollback failed ({undo_exc}); the next open rolls it back")
                return BatchResult(failed_all, self._deletes_done(ids), commits)
            self._hook("batch.committed")
            for undo in failed:  # 4
                self._finish_delete(undo)
            return BatchResult(tuple(outcomes), self._deletes_done(ids), commits)

    def _already_created(self, live: Sequence[BucketRecord], metadata: SnapshotMetadata) -> bool:
        """Whether ``live`` is exactly one bucket of ``metadata``'s range holding ``metadata``:
        a create whose commit landed although its caller was told the outcome is unknown."""
        if len(live) != 1:
            return False
        record = live[0]
        if (record.start_ledger, record.end_ledger) != (metadata.start_ledger, metadata.end_ledger):
            return False
        try:
            return self._storage.get_metadata(record.snapshot_id) == metadata
        except (StorageError, SnapshotCorruptError, SnapshotNotFoundError):
            return False

    def _deletes_done(self, ids: Sequence[str]) -> tuple[bool, ...]:
        dead = {d.snapshot_id for d in self._manifest.dead_letters}
        return tuple(
            self._manifest.intent(i) is None and self._manifest.bucket(i) is None and i not in dead
            for i in ids
        )
