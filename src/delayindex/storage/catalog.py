"""Two-phase creation and deletion of bucket snapshots for one name, and repair after a crash.

A :class:`Catalog` owns one name in a :class:`~delayindex.storage.base.SnapshotStorage`: it holds
the name's writer lock for its whole life and is the only writer of the name's manifest. Every
change of storage is bracketed by manifest commits, so that whatever instant a crash strikes,
every object the protocol wrote is referenced by the manifest (no orphan, Pulsar #17677) and no
live bucket loses its object (no data loss, Pulsar #26401). Each numbered step is one storage
call; the crash hook runs between steps under the names in brackets.

``create_bucket(metadata, segments, replaces=sources)``::

    [create.begin]
    1. commit: + Intent(create, key, replaces=sources)        sources stay live
    [create.intent_committed]
    2. storage.create(key), storage.length(key)
    [create.object_written]
    3. commit: - create intent, + live BucketRecord(key),     one atomic commit: the merge
               each source: live -> Intent(delete)            becomes visible all at once
    [create.bucket_live]
    4. per source: delete steps 2-3 below                     failures are reported, not raised

If step 2 or 3 fails, the create is rolled back, then the error is raised: commit the create
intent turned into a delete intent ``[create.rolled_back]``, then delete steps 2-3. (Dropping the
intent *before* deleting the object would orphan a partly written object if the process died in
between; turning it into a delete intent keeps it referenced until it is gone.)

``delete_bucket(id)``::

    [delete.begin]
    1. commit: live BucketRecord -> Intent(delete)
    [delete.intent_committed]
    2. storage.delete(id)                                     missing object = success
    [delete.object_deleted]
    3. commit: - delete intent
    [delete.intent_dropped]

A failed step 2 keeps the intent with ``attempts + 1``, ``last_error`` and a backoff
``next_attempt_ms`` (``delete_retry_delay_ms * 2**(attempts-1)``, at most 64x);
:meth:`Catalog.retry_pending_deletes` retries it, and after ``max_delete_attempts`` failures it
moves to the manifest's dead letters: kept and shown, never forgotten.

``apply_batch(creates, deletes)`` (group commit: many seals and deletes, two manifest writes)::

    [batch.begin]
    1. commit: + Intent(create) per create, live -> Intent(delete) per delete
    [batch.intents_committed]
    2. storage.create + length per create; storage.delete per delete      outcomes collected
    [batch.objects_written]
    3. commit: created -> live BucketRecord, failed create -> Intent(delete),
               deleted -> intent dropped, failed delete -> attempts + 1 (or dead letter)
    [batch.committed]
    4. only if a create failed: delete steps 2-3 for its object

Each change is acknowledged (reported in the result) only after the commit that makes it
durable, and the result lists outcomes in request order. A crash anywhere leaves intents that
the next open repairs exactly as for the single-change calls.

``retry_dead_letters(ids)`` moves dead letters back to pending delete intents (one commit,
``[dead.requeued]``) and retries them at once.

Repair (:meth:`Catalog.open`, after taking the lock and reading the manifest):

==============================================  ============================================
found in the manifest                           action
==============================================  ============================================
create intent (object may or may not exist)     roll back: commit it as a delete intent
                                                ``[repair.creates_converted]``, then delete
                                                the object (missing is fine) and drop the
                                                intent. The sources of a merge are still
                                                live, so nothing is lost.
delete intent                                   roll forward: delete the object (missing is
                                                fine), drop the intent. On failure: keep it,
                                                attempts + 1 (dead letter at the limit).
live bucket whose object is missing             keep the record, list it in
                                                ``RepairReport.missing_objects`` (recovery
                                                decides; never dropped silently).
dead letter                                     keep.
==============================================  ============================================

Before the repair, a damaged or missing manifest (or objects of a never-committed name) is
recovered from the manifest's history and the objects' own headers (``storage.recovery``),
stored as the new manifest and reported in ``RepairReport.recovered`` and :meth:`problems`.
Every object the catalog writes is stamped with its origin (this name, and the version of the
commit that recorded its create intent), so that it describes itself.

Every repair step is idempotent, so a crash during repair is repaired by the next open.
Objects that no manifest references (planted by hand, or by another program) are left alone:
object ids carry no unambiguous owner, so a catalog never deletes what it did not record.
"""

from __future__ import annotations

import itertools
import logging
import threading
import uuid
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from types import TracebackType
from typing import Self

from delayindex.clock import wall_clock_ms
from delayindex.errors import (
    CommitOutcomeUnknownError,
    ManifestConflictError,
    SnapshotCorruptError,
    SnapshotNotFoundError,
    StorageError,
)
from delayindex.policy import backoff_delay_ms
from delayindex.snapshot.format import Segment, SnapshotMetadata
from delayindex.storage.base import LockHandle, SnapshotStorage
from delayindex.storage.manifest import (
    BucketRecord,
    Intent,
    Manifest,
    QuarantineRecord,
    WriterStatus,
    validate_key,
)
from delayindex.storage.recovery import HistoryStorage, ManifestRecovery, recover_manifest

_log = logging.getLogger(__name__)

CrashHook = Callable[[str], None]
#: Re-reads of the manifest after a failed commit, to learn whether it landed (each read is
#: itself retried by the storage): an unknown outcome must be rare, as it stalls the writer.
RESOLVE_READS = 8
_KEY_RANDOM_HEX = 12
_MAX_KEY = 200


@dataclass(frozen=True)
class RepairReport:
    """What :meth:`Catalog.open` found and did.

    ``rolled_back``: create intents rolled back. ``completed_deletes``: delete intents (including
    rolled-back creates) finished. ``pending_deletes``: deletes that failed and stay pending (or
    were dead-lettered). ``missing_objects``: live buckets whose object does not exist.
    """

    rolled_back: tuple[str, ...] = ()
    completed_deletes: tuple[str, ...] = ()
    pending_deletes: tuple[str, ...] = ()
    missing_objects: tuple[str, ...] = ()
    #: Non-empty when the manifest was damaged or missing and was recovered from its history
    #: or from the objects' headers: the warning that says from what, and what it means.
    recovered: str = ""

    @property
    def clean(self) -> bool:
        """Nothing was found to repair or report."""
        return not (
            self.rolled_back
            or self.completed_deletes
            or self.pending_deletes
            or self.missing_objects
            or self.recovered
        )


@dataclass(frozen=True)
class RetryReport:
    """Outcome of :meth:`Catalog.retry_pending_deletes`, by snapshot id."""

    completed: tuple[str, ...] = ()
    failed: tuple[str, ...] = ()
    dead_lettered: tuple[str, ...] = ()


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


class Catalog:
    """The two-phase protocol over a :class:`SnapshotStorage` for one name (see module docs).

    Build it with :meth:`open`. Thread-safe (one mutex); close it (or use ``with``) to release
    the name's lock.
    """

    def __init__(
        self,
        storage: SnapshotStorage,
        name: str,
        lock: LockHandle,
        manifest: Manifest,
        *,
        clock: Callable[[], int],
        crash_hook: CrashHook | None,
        max_delete_attempts: int,
        delete_retry_delay_ms: int,
    ) -> None:
        """Internal: use :meth:`open`, which takes the lock and repairs."""
        self._storage = storage
        self.name = name
        self._lock = lock
        self._manifest = manifest
        self._clock = clock
        self._crash_hook = crash_hook
        self._max_delete_attempts = max_delete_attempts
        self._retry_delay_ms = delete_retry_delay_ms
        self._mutex = threading.RLock()
        self._closed = False
        self._problems: deque[str] = deque(maxlen=100)
        self._mark_dirty = False
        self._noted_mark: tuple[int, int] | None = manifest.mark_delete
        self._writer_status: WriterStatus | None = None
        self._stale = False  # a commit's outcome is unknown: re-read before the next change
        self.repair_report = RepairReport()

    @classmethod
    def open(
        cls,
        storage: SnapshotStorage,
        name: str,
        *,
        clock: Callable[[], int] | None = None,
        crash_hook: CrashHook | None = None,
        max_delete_attempts: int = 10,
        delete_retry_delay_ms: int = 60_000,
    ) -> Catalog:
        """Lock ``name``, read its manifest, repair it (table in the module docs) and return.

        Args:
            storage: any SnapshotStorage.
            name: the manifest/lock name (``KEY_PATTERN``).
            clock: epoch-ms clock for delete backoff (default: the wall clock).
            crash_hook: called with a step name between protocol steps (tests raise from it).
            max_delete_attempts: failed deletes before an intent moves to the dead letters.
            delete_retry_delay_ms: first retry delay of a failed delete (doubles per failure).

        Raises:
            StoreLockedError: another writer holds ``name``.
            SnapshotCorruptError: the manifest is damaged or missing and nothing consistent
                could be recovered from its history or its objects' headers; the message names
                the files (nothing is changed). A recovery that succeeds is stored as the new
                manifest and reported (``repair_report.recovered``, :meth:`problems`).
            StorageError, ManifestConflictError: the manifest could not be read or repaired
                (the lock is released; whatever was done is safe to redo).
        """
        validate_key(name, "catalog name")
        if max_delete_attempts < 1:
            raise ValueError(f"max_delete_attempts must be >= 1, got {max_delete_attempts}")
        if delete_retry_delay_ms < 0:
            raise ValueError(f"delete_retry_delay_ms must be >= 0, got {delete_retry_delay_ms}")
        lock = storage.lock(name)
        try:
            manifest, recovery = cls._read_or_recover(storage, name)
            catalog = cls(
                storage,
                name,
                lock,
                manifest,
                clock=clock or wall_clock_ms,
                crash_hook=crash_hook,
                max_delete_attempts=max_delete_attempts,
                delete_retry_delay_ms=delete_retry_delay_ms,
            )
            if recovery is not None:
                catalog._problem(recovery.summary())
                for note in (*recovery.damaged, *recovery.unreadable):
                    catalog._problem(note)
            report = catalog._repair()
            if recovery is not None:
                report = replace(report, recovered=recovery.summary())
            catalog.repair_report = report
        except BaseException:
            lock.release()
            raise
        return catalog

    @staticmethod
    def _read_or_recover(
        storage: SnapshotStorage, name: str
    ) -> tuple[Manifest, ManifestRecovery | None]:
        """The stored manifest; or, when it is damaged or missing (or was never committed but
        objects of this name exist), the state recovered from its history and the objects'
        headers, stored as the new current manifest (``storage.recovery``)."""
        try:
            manifest = storage.read_manifest(name)
        except SnapshotCorruptError as exc:
            found = recover_manifest(storage, name, exc)
        else:
            if manifest.version != 0:
                return manifest, None
            found = recover_manifest(storage, name, None)  # new, or everything lost?
        if found is None:
            return Manifest(name), None
        recovered, recovery = found
        if not isinstance(storage, HistoryStorage):
            raise SnapshotCorruptError(
                f"{recovery.summary()}; this storage cannot store a recovered manifest"
            )
        return storage.restore_manifest(name, recovered), recovery

    # -- queries --------------------------------------------------------------------------------

    @property
    def manifest(self) -> Manifest:
        """The manifest as last committed (or read) by this catalog."""
        return self._manifest

    def buckets(self) -> list[BucketRecord]:
        """The live buckets, in ledger order."""
        return list(self._manifest.buckets)

    def problems(self) -> list[str]:
        """Recent failures that were reported instead of raised (newest last, at most 100)."""
        with self._mutex:
            return list(self._problems)

    def resync(self) -> Manifest:
        """Re-read the stored manifest and adopt it (after an unknown commit outcome).

        Raises:
            StorageError, SnapshotCorruptError: it could not be read; nothing changed.
        """
        with self._mutex:
            self._check_open()
            self._stale = True
            self._sync()
            return self._manifest

    @property
    def mark_pending(self) -> bool:
        """Whether a noted mark-delete position is not yet in the stored manifest."""
        return self._mark_dirty

    @property
    def stale(self) -> bool:
        """Whether a commit's outcome is unknown (the next change re-reads the manifest)."""
        return self._stale

    def _sync(self) -> None:
        """Re-read the manifest if a commit's outcome is unknown (this catalog is the only
        writer, so what is stored is the truth)."""
        if not self._stale:
            return
        current = self._storage.read_manifest(self.name)
        if self._mark_dirty and current.mark_delete != self._noted_mark:
            current = replace(current, mark_delete=self._noted_mark)  # still to be persisted
        self._manifest = current
        self._stale = False

    # -- protocol -------------------------------------------------------------------------------

    def create_bucket(
        self,
        metadata: SnapshotMetadata,
        segments: Sequence[Segment],
        *,
        replaces: Iterable[str] = (),
        delete_replaced: bool = True,
    ) -> BucketRecord:
        """Persist a sealed (or merged) bucket and make it live; return its record.

        ``replaces`` are live buckets this one supersedes (a merge): they stay live until the
        new bucket is, then become delete intents in the same commit and are deleted.
        Failures deleting them are reported (intents, :meth:`problems`), never raised. With
        ``delete_replaced=False`` they are left as delete intents for the caller to finish (with
        :meth:`apply_batch`), e.g. once nothing reads them any more.

        Raises:
            ValueError: a ``replaces`` id is not live, or the range overlaps a live bucket that
                is not replaced; or the segments do not match the metadata (rolled back).
            StorageError: the object or the manifest could not be written; the create was
                rolled back (or is left to the next open's repair), the sources are untouched.
            ManifestConflictError: the manifest changed behind this catalog's back.
        """
        with self._mutex:
            self._check_open()
            self._sync()
            if not isinstance(metadata, SnapshotMetadata):
                raise TypeError(
                    f"metadata must be a SnapshotMetadata, not {type(metadata).__name__}"
                )
            sources = tuple(replaces)
            start, end = metadata.start_ledger, metadata.end_ledger
            before = self._manifest
            if len(set(sources)) != len(sources):
                raise ValueError(f"replaces repeats an id: {sources}")
            for source in sources:
                if before.bucket(source) is None:
                    raise ValueError(f"{source!r} is not a live bucket of {self.name!r}")
            clash = [
                b.snapshot_id
                for b in before.overlapping(start, end)
                if b.snapshot_id not in sources
            ]
            if clash:
                raise ValueError(f"range [{start}, {end}] overlaps live buckets {clash}")
            intent = Intent("create", self._new_key(start, end), start, end, sources)
            key = intent.snapshot_id

            self._hook("create.begin")
            self._commit(before.with_intent(intent))  # 1
            self._hook("create.intent_committed")
            record = self._write_object(intent, metadata, segments)  # 2
            self._hook("create.object_written")
            live = self._manifest.without_intent(key)
            for source in sources:
                old = live.bucket(source)
                assert old is not None  # checked above; the lock keeps it so
                live = live.without_bucket(source).with_intent(
                    Intent("delete", source, old.start_ledger, old.end_ledger)
                )
            self._commit_live(intent, live.with_bucket(record))  # 3
            self._hook("create.bucket_live")
            if not delete_replaced:
                return record  # the caller deletes them (delete_bucket/apply_batch) when done
            for source in sources:  # 4
                pending = self._manifest.intent(source)
                if pending is not None:
                    self._finish_delete(pending)
            return record

    def delete_bucket(self, snapshot_id: str) -> bool:
        """Delete a live bucket's snapshot; True when done, False when the delete is pending.

        After step 1 the bucket is no longer live, whatever happens next; a failed object
        delete stays as a pending intent (retried by :meth:`retry_pending_deletes` and by the
        next open) and is reported, not raised.

        Raises:
            ValueError: ``snapshot_id`` is not a live bucket, or a pending merge replaces it.
            StorageError, ManifestConflictError: step 1 failed; nothing changed.
        """
        with self._mutex:
            self._check_open()
            self._sync()
            record = self._manifest.bucket(snapshot_id)
            if record is None:
                raise ValueError(f"{snapshot_id!r} is not a live bucket of {self.name!r}")
            if any(snapshot_id in i.replaces for i in self._manifest.intents):
                raise ValueError(f"{snapshot_id!r} is being merged; delete it after the merge")
            intent = Intent("delete", snapshot_id, record.start_ledger, record.end_ledger)
            self._hook("delete.begin")
            self._commit(self._manifest.without_bucket(snapshot_id).with_intent(intent))  # 1
            self._hook("delete.intent_committed")
            return self._finish_delete(intent)

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

    def reserve_creates(
        self, ranges: Sequence[tuple[int, int]], *, replacing_live: bool = False
    ) -> list[str]:
        """Phase 1 of a bulk create whose objects someone else writes (an offline rebuild).

        Commits one create intent per ``(start_ledger, end_ledger)`` (one commit) and returns
        their keys, in order. The caller writes each object with
        ``storage.create(metadata.with_origin(catalog.name, catalog.manifest.version), segments,
        key)`` (from any process that can reach the storage; the origin is the version right
        after this call), then calls :meth:`publish_creates`. A crash in between leaves create
        intents, which repair rolls back: no orphan, and the live buckets are untouched.

        Args:
            ranges: disjoint ranges, each ``start <= end``.
            replacing_live: the new buckets will replace *every* live bucket at publish time,
                so they may overlap live ones now.

        Raises:
            ValueError: overlapping ranges (with each other, or with live buckets unless
                ``replacing_live``), or a bad range; nothing changed.
            StorageError, ManifestConflictError: the commit failed; nothing changed.
        """
        with self._mutex:
            self._check_open()
            self._sync()
            ordered = sorted(ranges)
            for (a, b), (c, d) in itertools.pairwise(ordered):
                if c <= b:
                    raise ValueError(f"ranges [{a}, {b}] and [{c}, {d}] overlap")
            manifest = self._manifest
            intents: list[Intent] = []
            for start, end in ranges:
                if not replacing_live and manifest.overlapping(start, end):
                    raise ValueError(f"range [{start}, {end}] overlaps a live bucket")
                intents.append(Intent("create", self._new_key(start, end, intents), start, end))
            for intent in intents:
                manifest = manifest.with_intent(intent)
            if intents:
                self._commit(manifest)
            self._hook("reserve.committed")
            return [i.snapshot_id for i in intents]

    def publish_creates(
        self, records: Sequence[BucketRecord], *, replace_live: bool = False
    ) -> list[str]:
        """Phase 2: make reserved buckets live (one commit) once their objects are written.

        Each record's object must exist with ``snapshot_bytes`` bytes. With ``replace_live``
        every other live bucket becomes a delete intent in the same commit, and is then
        deleted (failures stay as pending intents, as in :meth:`delete_bucket`). Reserved keys
        not published stay as create intents: :meth:`retry_pending_deletes` or the next open
        rolls them back. Returns the ids that were replaced.

        Raises:
            ValueError: a record's key is not a reserved create intent, its range differs from
                the reservation, or its object is missing or of another size; nothing changed.
            StorageError, ManifestConflictError: the commit failed (as for :meth:`apply_batch`
                step 3); the reservations stay and are rolled back later.
        """
        with self._mutex:
            self._check_open()
            self._sync()
            manifest = self._manifest
            for record in records:
                intent = manifest.intent(record.snapshot_id)
                if intent is None or intent.kind != "create":
                    raise ValueError(f"{record.snapshot_id!r} is not a reserved create")
                if (intent.start_ledger, intent.end_ledger) != (
                    record.start_ledger,
                    record.end_ledger,
                ):
                    raise ValueError(f"{record.snapshot_id!r}: range differs from its reservation")
                try:
                    size = self._storage.length(record.snapshot_id)
                except SnapshotNotFoundError:
                    raise ValueError(f"{record.snapshot_id!r}: object not written") from None
                if size != record.snapshot_bytes:
                    raise ValueError(
                        f"{record.snapshot_id!r}: object is {size} bytes, "
                        f"the record says {record.snapshot_bytes}"
                    )
            replaced = list(manifest.buckets) if replace_live else []
            for old in replaced:
                manifest = manifest.without_bucket(old.snapshot_id).with_intent(
                    Intent("delete", old.snapshot_id, old.start_ledger, old.end_ledger)
                )
            for record in records:
                manifest = manifest.without_intent(record.snapshot_id).with_bucket(record)
            self._commit(manifest)
            self._hook("publish.committed")
            for old in replaced:
                pending = self._manifest.intent(old.snapshot_id)
                if pending is not None:
                    self._finish_delete(pending)
            return [old.snapshot_id for old in replaced]

    def retry_dead_letters(self, snapshot_ids: Iterable[str] | None = None) -> RetryReport:
        """Move dead letters (all, or ``snapshot_ids``) back to pending deletes and retry them now.

        Their attempt counters restart, so a delete that fails again gets a full set of retries
        before it is dead-lettered again.

        Raises:
            ValueError: an id in ``snapshot_ids`` is not a dead letter (nothing changed).
            StorageError, ManifestConflictError: the requeue commit failed (nothing changed).
        """
        with self._mutex:
            self._check_open()
            self._sync()
            dead = {d.snapshot_id: d for d in self._manifest.dead_letters}
            wanted = list(dead) if snapshot_ids is None else list(snapshot_ids)
            unknown = [i for i in wanted if i not in dead]
            if unknown:
                raise ValueError(f"not dead letters of {self.name!r}: {unknown}")
            if not wanted:
                return RetryReport()
            kept = tuple(d for d in self._manifest.dead_letters if d.snapshot_id not in wanted)
            manifest = replace(self._manifest, dead_letters=kept)
            for snapshot_id in wanted:
                d = dead[snapshot_id]
                manifest = manifest.with_intent(
                    Intent("delete", d.snapshot_id, d.start_ledger, d.end_ledger,
                           last_error=d.last_error)
                )  # fmt: skip
            self._commit(manifest)
            self._hook("dead.requeued")
            return self._finish_deletes(wanted)

    # -- quarantine -------------------------------------------------------------------------------

    def quarantine_buckets(self, records: Sequence[QuarantineRecord]) -> list[str]:
        """Move live buckets whose snapshot is damaged or missing to the quarantine, in one
        commit; their objects are kept. Returns the ids moved (ids no longer live are skipped:
        a bucket deleted meanwhile needs no quarantine).

        Raises:
            StorageError, ManifestConflictError: the commit failed; nothing changed.
        """
        with self._mutex:
            self._check_open()
            self._sync()
            manifest, moved = self._manifest, []
            for record in records:
                if manifest.bucket(record.snapshot_id) is None:
                    continue
                if any(record.snapshot_id in i.replaces for i in manifest.intents):
                    continue  # a merge in flight replaces it; its outcome decides
                manifest = manifest.with_quarantined(record)
                moved.append(record.snapshot_id)
            if moved:
                self._commit(manifest)
                self._hook("quarantine.committed")
            return moved

    def resolve_quarantine(self, snapshot_ids: Iterable[str], state: str) -> list[str]:
        """Mark active quarantine records resolved (``released``, ``acknowledged`` or
        ``cleared``) in one commit; the damaged objects stay. Returns the ids changed.

        Raises:
            ValueError: ``state`` is not a resolution.
            StorageError, ManifestConflictError: the commit failed; nothing changed.
        """
        if state not in ("released", "acknowledged", "cleared"):
            raise ValueError(f"not a quarantine resolution: {state!r}")
        with self._mutex:
            self._check_open()
            self._sync()
            manifest, changed = self._manifest, []
            for snapshot_id in snapshot_ids:
                record = manifest.quarantine(snapshot_id)
                if record is not None and record.active:
                    manifest = manifest.with_quarantine_state(snapshot_id, state)
                    changed.append(snapshot_id)
            if changed:
                self._commit(manifest)
            return changed

    def repair_bucket(
        self, snapshot_id: str, metadata: SnapshotMetadata, segments: Sequence[Segment]
    ) -> BucketRecord:
        """Replace the quarantined bucket ``snapshot_id`` by a rebuilt snapshot of its range.

        Two-phase like :meth:`create_bucket`: a create intent, the object, then one commit
        that makes the new bucket live and marks the quarantine record ``repaired``. The
        damaged object is kept (before and after: it is never deleted by the library).

        Raises:
            ValueError: ``snapshot_id`` is not actively quarantined, or ``metadata``'s range is
                not exactly its range.
            StorageError, ManifestConflictError: the repair failed and was rolled back; the
                bucket stays quarantined.
        """
        with self._mutex:
            self._check_open()
            self._sync()
            damaged = self._manifest.quarantine(snapshot_id)
            if damaged is None or not damaged.active:
                raise ValueError(f"{snapshot_id!r} is not a quarantined bucket of {self.name!r}")
            start, end = metadata.start_ledger, metadata.end_ledger
            if (start, end) != (damaged.start_ledger, damaged.end_ledger):
                raise ValueError(
                    f"a repair of [{damaged.start_ledger}, {damaged.end_ledger}] cannot cover "
                    f"[{start}, {end}]"
                )
            intent = Intent("create", self._new_key(start, end), start, end)
            key = intent.snapshot_id
            self._commit(self._manifest.with_intent(intent))
            self._hook("repair.intent_committed")
            record = self._write_object(intent, metadata, segments)
            repaired = self._manifest.without_intent(key).with_quarantine_state(
                snapshot_id, "repaired"
            )
            self._commit_live(intent, repaired.with_bucket(record))
            self._hook("repair.bucket_live")
            return record

    def _write_object(
        self, intent: Intent, metadata: SnapshotMetadata, segments: Sequence[Segment]
    ) -> BucketRecord:
        """Step 2 of a create whose intent is committed: write the object, stamped with its
        origin (this index and the commit that recorded the intent); roll back on failure."""
        key = intent.snapshot_id
        stamped = metadata.with_origin(self.name, self._manifest.version)
        try:
            self._storage.create(stamped, segments, key)
            size = self._storage.length(key)
        except Exception as exc:
            self._roll_back(intent, exc)
            raise
        return BucketRecord(
            intent.start_ledger, intent.end_ledger, key,
            metadata.num_messages, metadata.num_segments, size,
        )  # fmt: skip

    def _commit_live(self, intent: Intent, manifest: Manifest) -> None:
        """Step 3: commit ``manifest`` (the create made live); roll back if it surely failed."""
        try:
            self._commit(manifest)
        except CommitOutcomeUnknownError:
            raise  # maybe live, maybe not: the caller resyncs and looks
        except (StorageError, ManifestConflictError) as exc:
            if self._manifest.bucket(intent.snapshot_id) is None:
                self._roll_back(intent, exc)
                raise

    def note_mark_delete(self, mark: tuple[int, int] | None) -> None:
        """Record the owner's mark-delete position; it is persisted with the next commit (or
        :meth:`persist_mark_delete`), not at once: acknowledgements are frequent."""
        with self._mutex:
            self._check_open()
            self._noted_mark = mark
            if mark != self._manifest.mark_delete:
                self._manifest = replace(self._manifest, mark_delete=mark)
                self._mark_dirty = True

    def note_writer_status(self, status: WriterStatus | None) -> None:
        """Record what the writer holds only in memory; carried by every later commit (for
        ``delayindex inspect``), never committed on its own."""
        with self._mutex:
            self._writer_status = status

    def persist_mark_delete(self, *, final_status: WriterStatus | None = None) -> None:
        """Commit the manifest if only the mark-delete position changed since the last commit.

        With ``final_status`` (a writer closing), also commit when the stored writer status
        differs from it, so ``delayindex inspect`` shows what the writer left unpersisted when
        it stopped rather than its last batch's figures.

        Raises:
            StorageError, ManifestConflictError: the commit failed (the mark stays pending).
        """
        with self._mutex:
            self._check_open()
            if final_status is not None:
                self._writer_status = final_status
            status_changed = (
                final_status is not None and self._manifest.writer_status != final_status
            )
            if not self._mark_dirty and not status_changed:
                return
            # Base the commit on what is stored: a commit whose outcome was unknown may have
            # landed, and this catalog (holding the name's lock) is the only writer.
            stored = self._storage.read_manifest(self.name)
            self._manifest = stored
            self._stale = False
            if stored.mark_delete == self._noted_mark and (
                final_status is None or stored.writer_status == final_status
            ):
                self._mark_dirty = False
                return
            self._commit(replace(stored, mark_delete=self._noted_mark))

    def retry_pending_deletes(
        self, *, now_ms: int | None = None, force: bool = False
    ) -> RetryReport:
        """Retry the delete intents that are due (all of them with ``force``).

        Also rolls back any create intent left behind by a failed rollback. Failures are
        recorded on the intents (and dead-lettered at ``max_delete_attempts``), not raised.
        """
        with self._mutex:
            self._check_open()
            self._sync()
            try:
                self._convert_creates()
            except (StorageError, ManifestConflictError) as exc:
                self._problem(f"could not roll back pending creates: {exc}")
            now = self._clock() if now_ms is None else now_ms
            due = [
                i.snapshot_id
                for i in self._manifest.intents
                if i.kind == "delete" and (force or i.next_attempt_ms <= now)
            ]
            return self._finish_deletes(due)

    def close(self) -> None:
        """Release the name's lock. Idempotent; the catalog is unusable afterwards."""
        with self._mutex:
            self._closed = True
            self._lock.release()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._closed else f"v{self._manifest.version}"
        return f"Catalog({self.name!r}, {state}, buckets={len(self._manifest.buckets)})"

    # -- internals ------------------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise ValueError(f"catalog {self.name!r} is closed")

    def _hook(self, step: str) -> None:
        if self._crash_hook is not None:
            self._crash_hook(step)

    def _problem(self, message: str) -> None:
        self._problems.append(message)
        _log.warning("catalog %s: %s", self.name, message)

    def _new_key(self, start: int, end: int, pending: Sequence[Intent] = ()) -> str:
        taken = self._manifest.referenced_ids() | {i.snapshot_id for i in pending}
        while True:
            suffix = f"-{start}-{end}-{uuid.uuid4().hex[:_KEY_RANDOM_HEX]}"
            key = self.name[: _MAX_KEY - len(suffix)] + suffix
            if key not in taken:
                return key

    def _commit(self, new: Manifest) -> None:
        """Commit ``new``; on failure re-read the manifest to learn whether it landed."""
        if self._writer_status is not None:
            new = replace(new, writer_status=self._writer_status)
        try:
            self._manifest = self._storage.commit_manifest(self.name, new)
            self._mark_dirty = False
            return
        except (StorageError, ManifestConflictError) as exc:
            failure = exc
        for _ in range(RESOLVE_READS):
            try:
                current = self._storage.read_manifest(self.name)
                break
            except (StorageError, SnapshotCorruptError):
                continue
        else:
            # Landed or not: nobody can tell now. Every later change re-reads first (resync).
            self._stale = True
            old = self._manifest
            changed = tuple(
                sorted(
                    i
                    for i in old.referenced_ids() | new.referenced_ids()
                    if old.bucket(i) != new.bucket(i) or old.intent(i) != new.intent(i)
                )
            )
            raise CommitOutcomeUnknownError(
                f"commit of manifest {self.name!r} failed and its outcome is unknown: {failure}",
                changed,
            ) from failure
        if self._mark_dirty and current.mark_delete != self._noted_mark:
            current = replace(current, mark_delete=self._noted_mark)  # still to be persisted
        self._manifest = current
        if current != replace(new, version=new.version + 1):
            raise failure

    def _roll_back(self, intent: Intent, cause: BaseException) -> None:
        """Undo a create whose step 2 or 3 failed; notes on ``cause`` tell what was not undone."""
        key = intent.snapshot_id
        try:
            pending = self._manifest.intent(key)
            if pending is None:  # someone rewrote the manifest; make sure nothing is orphaned
                if key not in self._manifest.referenced_ids():
                    self._storage.delete(key)
                return
            undo = Intent("delete", key, intent.start_ledger, intent.end_ledger)
            self._commit(self._manifest.with_updated_intent(undo))
        except (StorageError, ManifestConflictError) as exc:
            note = f"rollback of {key!r} failed ({exc}); the next open rolls it back"
            cause.add_note(note)
            self._problem(note)
            return
        self._hook("create.rolled_back")
        if not self._finish_delete(undo):
            cause.add_note(f"{key!r} stays as a pending delete intent")

    def _finish_delete(self, intent: Intent) -> bool:
        """Delete steps 2-3 for a pending delete intent; never raises storage errors."""
        snapshot_id = intent.snapshot_id
        try:
            self._storage.delete(snapshot_id)  # 2
        except StorageError as exc:
            self._record_delete_failure(intent, exc)
            return False
        self._hook("delete.object_deleted")
        try:
            self._commit(self._manifest.without_intent(snapshot_id))  # 3
        except (StorageError, ManifestConflictError) as exc:
            self._problem(f"deleted {snapshot_id!r} but could not drop its intent: {exc}")
            return False
        self._hook("delete.intent_dropped")
        return True

    def _with_delete_failure(
        self, manifest: Manifest, intent: Intent, exc: BaseException
    ) -> Manifest:
        """``manifest`` with a failed delete recorded: attempts + 1 and backoff, or dead letter."""
        attempts = intent.attempts + 1
        updated = replace(
            intent,
            attempts=attempts,
            next_attempt_ms=max(self._clock(), 0)
            + backoff_delay_ms(self._retry_delay_ms, attempts),
            last_error=f"{type(exc).__name__}: {exc}"[:1000],
        )
        if attempts >= self._max_delete_attempts:
            self._problem(f"delete of {intent.snapshot_id!r} failed {attempts} times; dead letter")
            return manifest.with_dead_letter(updated)
        self._problem(f"delete of {intent.snapshot_id!r} failed (attempt {attempts}): {exc}")
        return manifest.with_updated_intent(updated)

    def _finish_deletes(self, snapshot_ids: Iterable[str]) -> RetryReport:
        """Delete steps 2-3 for each pending delete intent of ``snapshot_ids``; by outcome."""
        completed, failed, dead = [], [], []
        for snapshot_id in snapshot_ids:
            intent = self._manifest.intent(snapshot_id)
            if intent is None:
                continue
            if self._finish_delete(intent):
                completed.append(snapshot_id)
            elif any(d.snapshot_id == snapshot_id for d in self._manifest.dead_letters):
                dead.append(snapshot_id)
            else:
                failed.append(snapshot_id)
        return RetryReport(tuple(completed), tuple(failed), tuple(dead))

    def _record_delete_failure(self, intent: Intent, exc: BaseException) -> None:
        new = self._with_delete_failure(self._manifest, intent, exc)
        try:
            self._commit(new)
        except (StorageError, ManifestConflictError) as commit_exc:
            self._problem(
                f"could not record the failed delete of {intent.snapshot_id!r}: {commit_exc}"
            )

    def _convert_creates(self) -> list[str]:
        """Repair step: every create intent becomes a delete intent, in one commit."""
        creates = [i for i in self._manifest.intents if i.kind == "create"]
        if not creates:
            return []
        manifest = self._manifest
        for intent in creates:
            undo = Intent("delete", intent.snapshot_id, intent.start_ledger, intent.end_ledger)
            manifest = manifest.with_updated_intent(undo)
        self._commit(manifest)
        self._hook("repair.creates_converted")
        return [i.snapshot_id for i in creates]

    def _repair(self) -> RepairReport:
        rolled_back = self._convert_creates()
        completed, pending = [], []
        for intent in [i for i in self._manifest.intents if i.kind == "delete"]:
            if self._finish_delete(intent):
                completed.append(intent.snapshot_id)
            else:
                pending.append(intent.snapshot_id)
        missing = []
        for bucket in self._manifest.buckets:
            try:
                self._storage.length(bucket.snapshot_id)
            except SnapshotNotFoundError:
                missing.append(bucket.snapshot_id)
                self._problem(f"live bucket {bucket.snapshot_id!r} has no snapshot object")
        return RepairReport(tuple(rolled_back), tuple(completed), tuple(pending), tuple(missing))
