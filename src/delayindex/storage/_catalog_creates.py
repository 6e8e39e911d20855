"""The catalog's creates: single and merged buckets, and reserved bulk creates.

Each numbered step is one storage call; the crash hook runs between steps under the names in
brackets (see :mod:`delayindex.storage.catalog`).

``create_bucket(metadata, segments, replaces=sources)``::

    [create.begin]
    1. commit: + Intent(create, key, replaces=sources)        sources stay live
    [create.intent_committed]
    2. storage.create(key), storage.length(key)
    [create.object_written]
    3. commit: - create intent, + live BucketRecord(key),     one atomic commit: the merge
               each source: live -> Intent(delete)            becomes visible all at once
    [create.bucket_live]
    4. per source: delete steps 2-3 (_catalog_deletes)       failures are reported, not raised

If step 2 or 3 fails, the create is rolled back, then the error is raised: commit the create
intent turned into a delete intent ``[create.rolled_back]``, then delete steps 2-3. (Dropping the
intent *before* deleting the object would orphan a partly written object if the process died in
between; turning it into a delete intent keeps it referenced until it is gone.)

``reserve_creates(ranges)`` then ``publish_creates(records)`` (an offline rebuild, whose objects
another process writes): one commit of create intents ``[reserve.committed]``; the objects are
written by the caller, stamped with the version that commit produced; one commit makes them
live, optionally turning every other live bucket into a delete intent ``[publish.committed]``,
then those are deleted. Unpublished reservations stay create intents, which
``retry_pending_deletes`` or the next open rolls back.

Invariants: a create intent is committed before its object is written, so a crash never leaves
an object no manifest references; the sources of a merge stay live until the commit that makes
the merged bucket live, which turns them into delete intents in the same commit; every object
written here is stamped with its origin (this name and the version of the commit that recorded
its intent); keys are fresh (never an id the manifest references).
"""

from __future__ import annotations

import itertools
import threading
import uuid
from collections.abc import Callable, Iterable, Sequence

from delayindex._cancelset import count_packed
from delayindex.errors import (
    CommitOutcomeUnknownError,
    ManifestConflictError,
    SnapshotNotFoundError,
    StorageError,
)
from delayindex.snapshot.format import Segment, SnapshotMetadata
from delayindex.storage.base import SnapshotStorage
from delayindex.storage.manifest import BucketRecord, Intent, Manifest

_KEY_RANDOM_HEX = 12
_MAX_KEY = 200


class CreatesMixin:
    """The catalog's create paths (state lives on the Catalog)."""

    # State (set in Catalog.__init__).
    _manifest: Manifest
    _mutex: threading.RLock
    _storage: SnapshotStorage
    name: str

    # Provided by Catalog and its other mixins.
    _check_open: Callable[[], None]
    _commit: Callable[[Manifest], None]
    _finish_delete: Callable[[Intent], bool]
    _hook: Callable[[str], None]
    _problem: Callable[[str], None]
    _sync: Callable[[], None]

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
            count_packed(metadata.folded_cancels),
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

    def _new_key(self, start: int, end: int, pending: Sequence[Intent] = ()) -> str:
        taken = self._manifest.referenced_ids() | {i.snapshot_id for i in pending}
        while True:
            suffix = f"-{start}-{end}-{uuid.uuid4().hex[:_KEY_RANDOM_HEX]}"
            key = self.name[: _MAX_KEY - len(suffix)] + suffix
            if key not in taken:
                return key
