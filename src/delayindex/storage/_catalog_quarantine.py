"""The catalog's quarantine: damaged buckets leave the live set, and are repaired or resolved.

A live bucket whose snapshot is damaged or missing moves to the manifest's quarantine list
(``quarantine_buckets``, one commit ``[quarantine.committed]``); its object is kept. A
quarantined bucket is then either repaired (``repair_bucket``: a rebuilt snapshot of exactly its
range, created two-phase like ``create_bucket`` under ``[repair.intent_committed]`` and
``[repair.bucket_live]``, whose final commit also marks the record ``repaired``) or resolved
(``resolve_quarantine``: ``released``, ``acknowledged`` or ``cleared``, one commit).

Invariants: the library never deletes a damaged object; a bucket a merge in flight replaces is
not quarantined (the merge's outcome decides); quarantine records are kept with their final
state, never dropped; a failed repair is rolled back and leaves the bucket quarantined.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Sequence

from delayindex.snapshot.format import Segment, SnapshotMetadata
from delayindex.storage.manifest import BucketRecord, Intent, Manifest, QuarantineRecord


class QuarantineMixin:
    """The catalog's quarantine (state lives on the Catalog)."""

    # State (set in Catalog.__init__).
    _manifest: Manifest
    _mutex: threading.RLock
    name: str

    # Provided by Catalog and its other mixins.
    _check_open: Callable[[], None]
    _commit: Callable[[Manifest], None]
    _commit_live: Callable[[Intent, Manifest], None]
    _hook: Callable[[str], None]
    _new_key: Callable[[int, int], str]
    _sync: Callable[[], None]
    _write_object: Callable[[Intent, SnapshotMetadata, Sequence[Segment]], BucketRecord]

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
