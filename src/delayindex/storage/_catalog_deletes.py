"""The catalog's deletes: the two-phase delete, its retries and the dead letters.

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

``retry_dead_letters(ids)`` moves dead letters back to pending delete intents (one commit,
``[dead.requeued]``) and retries them at once. A create that must be undone (a failed create,
or a create intent found by repair) becomes a delete intent first (``_convert_creates``), so
its object stays referenced until it is gone.

Invariants: an object is deleted only while a delete intent references it, and the intent is
dropped only after the delete succeeded (a missing object is success); a failed delete is never
forgotten: it stays a pending intent or a dead letter; ``_finish_delete`` and
``_finish_deletes`` never raise storage errors, they record them on the intents and in
:meth:`Catalog.problems`.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace

from delayindex.errors import (
    ManifestConflictError,
    StorageError,
)
from delayindex.policy import backoff_delay_ms
from delayindex.storage.base import SnapshotStorage
from delayindex.storage.manifest import Intent, Manifest


@dataclass(frozen=True)
class RetryReport:
    """Outcome of :meth:`Catalog.retry_pending_deletes`, by snapshot id."""

    completed: tuple[str, ...] = ()
    failed: tuple[str, ...] = ()
    dead_lettered: tuple[str, ...] = ()


class DeletesMixin:
    """The catalog's delete paths (state lives on the Catalog)."""

    # State (set in Catalog.__init__).
    _manifest: Manifest
    _mutex: threading.RLock
    _storage: SnapshotStorage
    name: str
    _clock: Callable[[], int]
    _max_delete_attempts: int
    _retry_delay_ms: int

    # Provided by Catalog and its other mixins.
    _check_open: Callable[[], None]
    _commit: Callable[[Manifest], None]
    _hook: Callable[[str], None]
    _problem: Callable[[str], None]
    _sync: Callable[[], None]

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
