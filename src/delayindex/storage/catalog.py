"""Two-phase creation and deletion of bucket snapshots for one name, and repair after a crash.

A :class:`Catalog` owns one name in a :class:`~delayindex.storage.base.SnapshotStorage`: it holds
the name's writer lock for its whole life and is the only writer of the name's manifest. Every
change of storage is bracketed by manifest commits, so that whatever instant a crash strikes,
every object the protocol wrote is referenced by the manifest (no orphan, Pulsar #17677) and no
live bucket loses its object (no data loss, Pulsar #26401). Each numbered step is one storage
call; the crash hook runs between steps under the names in brackets.

Layout. :class:`Catalog` is assembled from mixins; its state lives on the instance (set in
``__init__`` here) and each mixin declares the attributes it uses:

* this module: the class, :meth:`Catalog.open` (lock, read or recover the manifest, repair), the
  queries, the mark-delete and writer status, ``close``, and the commit that every change goes
  through (``_commit``: a failed commit is resolved by re-reading the manifest, or reported as
  :class:`~delayindex.errors.CommitOutcomeUnknownError` and the catalog resyncs before its next
  change);
* ``storage._catalog_creates``: ``create_bucket`` (and merges), ``reserve_creates`` and
  ``publish_creates``, the object write and the rollback of a failed create;
* ``storage._catalog_batch``: ``apply_batch``, the group commit, and :class:`BatchResult`;
* ``storage._catalog_deletes``: ``delete_bucket``, the retries with backoff, the dead letters,
  and :class:`RetryReport`;
* ``storage._catalog_quarantine``: ``quarantine_buckets``, ``resolve_quarantine`` and
  ``repair_bucket``.

Each of those modules' docstrings draws its protocol step by step, with the crash-hook names.

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

import logging
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, replace
from types import TracebackType
from typing import Any, Self

from delayindex.clock import wall_clock_ms
from delayindex.errors import (
    CommitOutcomeUnknownError,
    ManifestConflictError,
    SnapshotCorruptError,
    SnapshotNotFoundError,
    StorageError,
)
from delayindex.storage._catalog_batch import BatchMixin, BatchResult
from delayindex.storage._catalog_creates import CreatesMixin
from delayindex.storage._catalog_deletes import DeletesMixin, RetryReport
from delayindex.storage._catalog_quarantine import QuarantineMixin
from delayindex.storage._overrides import Overrides
from delayindex.storage.base import LockHandle, SnapshotStorage
from delayindex.storage.manifest import (
    BucketRecord,
    Manifest,
    SubscriptionRecord,
    WriterStatus,
    validate_key,
)
from delayindex.storage.recovery import HistoryStorage, ManifestRecovery, recover_manifest

_log = logging.getLogger(__name__)

CrashHook = Callable[[str], None]
#: Re-reads of the manifest after a failed commit, to learn whether it landed (each read is
#: itself retried by the storage): an unknown outcome must be rare, as it stalls the writer.
RESOLVE_READS = 8


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


class Catalog(CreatesMixin, BatchMixin, DeletesMixin, QuarantineMixin):
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
        # The owner's acknowledgement state (mark, and a shared index's subscriptions): noted
        # often, carried by the next commit; _mark_dirty while the stored manifest lacks it.
        self._mark_dirty = False
        self._noted: dict[str, Any] = {
            "mark_delete": manifest.mark_delete,
            "subscriptions": manifest.subscriptions,
            "overrides": manifest.overrides,
        }
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
        """Whether a noted mark-delete position (or subscription state) is not yet stored."""
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
        if self._mark_dirty:
            current = self._with_noted(current)  # still to be persisted
        self._manifest = current
        self._stale = False

    def note_mark_delete(self, mark: tuple[int, int] | None) -> None:
        """Record the owner's mark-delete position; it is persisted with the next commit (or
        :meth:`persist_mark_delete`), not at once: acknowledgements are frequent."""
        self._note(mark_delete=mark)

    def note_subscriptions(self, subscriptions: tuple[SubscriptionRecord, ...]) -> None:
        """Record a shared index's subscriptions and their marks, persisted like the mark.

        Raises:
            ValueError, TypeError: not sorted by name, a name twice, or a bad record.
        """
        replace(self._manifest, subscriptions=subscriptions)  # validates before anything changes
        self._note(subscriptions=subscriptions)

    def note_overrides(self, overrides: Overrides) -> None:
        """Record the owner's cancel and reschedule overrides, persisted like the mark."""
        if not isinstance(overrides, Overrides):
            raise TypeError("overrides must be an Overrides")
        self._note(overrides=overrides)

    def _note(self, **state: Any) -> None:
        with self._mutex:
            self._check_open()
            self._noted.update(state)
            noted = self._with_noted(self._manifest)
            if noted is not self._manifest:
                self._manifest = noted
                self._mark_dirty = True

    def _with_noted(self, manifest: Manifest) -> Manifest:
        """``manifest`` carrying the noted acknowledgement state."""
        if all(getattr(manifest, key) == value for key, value in self._noted.items()):
            return manifest
        return replace(manifest, **self._noted)

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
            if self._with_noted(stored) is stored and (
                final_status is None or stored.writer_status == final_status
            ):
                self._mark_dirty = False
                return
            self._commit(self._with_noted(stored))

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
        if self._mark_dirty:
            current = self._with_noted(current)  # still to be persisted
        self._manifest = current
        if current != replace(new, version=new.version + 1):
            raise failure

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


__all__ = [
    "RESOLVE_READS",
    "BatchResult",
    "Catalog",
    "CrashHook",
    "RepairReport",
    "RetryReport",
]
