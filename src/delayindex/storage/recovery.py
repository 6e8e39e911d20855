"""Recovery of a lost manifest from its history and from the objects' own headers.

A name's manifest is never a single point of loss. Three things survive its damage or deletion:

* the **history**: every commit also stores an independent copy of the new manifest, and the
  newest :data:`~delayindex.storage.base.MANIFEST_HISTORY` generations are kept
  (:meth:`~delayindex.storage.base.BaseStorage.manifest_history`);
* the **objects**: each snapshot's metadata names its index (the manifest name), its ledger
  range and its *generation*, the manifest version of the commit that recorded its create
  intent (:meth:`~delayindex.snapshot.format.SnapshotMetadata.with_origin`);
* object ids: ``<name>-<start>-<end>-<12 hex>``, so the objects a name may own are found by id
  before any header is read.

:func:`recover_manifest` (called by ``Catalog.open`` when the current manifest is damaged or
missing) proves the newest state it can:

1. the newest history generation that decodes is the *base* (none: an empty base);
2. the objects of the name are listed and their headers read. An object is the name's when its
   header names the index; an object written before origins existed counts when its id has the
   name's key shape and its header's range equals the id's (its generation is unknown);
3. the base is reconciled with the objects, oldest generation first. *Candidates* are the
   objects of the base's create intents, and objects the base does not know that are newer than
   it (every object without a base). Each candidate is read in full (header, metadata with its
   bitmaps, every segment) before it is trusted. A candidate whose range encloses every live
   bucket it overlaps is adopted: live, and the buckets it encloses (a merge's sources, or an
   earlier copy of the same seal) become delete intents, as the lost commit made them. A
   candidate that partly overlaps a live bucket, or is enclosed by a bigger one, contradicts the
   base: it is reported and kept as a quarantine record in state ``kept`` (referenced, so
   ``gc`` leaves it; never deleted by the library), and so is an unreadable one. Create
   intents without an object are rolled back as delete intents;
4. the result gets a version above every generation seen (the history's and the objects'), and
   ``Catalog.open`` stores it as the current manifest (history kept) and reports the recovery.

Only when neither a generation nor an object of the name can be read does recovery fail
(``SnapshotCorruptError`` naming the files, which ``DelayIndex.open`` turns into
``RecoveryError``). A name with no manifest, no history and no object is new.

The mark-delete position comes from the base generation (none without one), so it may be older
than the lost one: positions acknowledged since may be delivered again (at-least-once), never
lost.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Protocol, runtime_checkable

from delayindex._cancelset import count_packed
from delayindex.errors import SnapshotCorruptError, SnapshotNotFoundError, StorageError
from delayindex.snapshot.format import SnapshotMetadata
from delayindex.storage.base import SnapshotStorage
from delayindex.storage.manifest import BucketRecord, Intent, Manifest, QuarantineRecord

_KEY_SHAPE = re.compile(r"(.+)-(\d+)-(\d+)-[0-9a-f]{12}")
_MAX_KEY = 200


@runtime_checkable
class HistoryStorage(Protocol):
    """The manifest-history half of a storage (both backends have it, via ``BaseStorage``)."""

    def manifest_history(self, name: str) -> list[int]: ...

    def read_manifest_generation(self, name: str, version: int) -> Manifest: ...

    def restore_manifest(self, name: str, manifest: Manifest) -> Manifest: ...


def key_range(name: str, snapshot_id: str) -> tuple[int, int] | None:
    """``(start, end)`` if ``snapshot_id`` has the shape of a key ``Catalog`` makes for
    ``name`` (``<name>-<start>-<end>-<12 hex>``, the name part truncated to fit 200
    characters), else None."""
    match = _KEY_SHAPE.fullmatch(snapshot_id)
    if match is None:
        return None
    suffix = snapshot_id[len(match.group(1)) :]
    if match.group(1) != name[: _MAX_KEY - len(suffix)]:
        return None
    return int(match.group(2)), int(match.group(3))


@dataclass(frozen=True)
class OwnedObject:
    """A stored object that belongs to the name, as its header (or id) says."""

    id: str
    start_ledger: int
    end_ledger: int
    generation: int | None  # None: written before objects named their origin


def verify_object(storage: SnapshotStorage, snapshot_id: str) -> tuple[SnapshotMetadata, int]:
    """Read ``snapshot_id`` in full: header, metadata with every bitmap checked, every segment
    decoded and checksummed. Returns its metadata and size.

    Raises:
        SnapshotCorruptError, SnapshotNotFoundError, StorageError.
    """
    metadata = storage.get_metadata(snapshot_id, check_bitmaps=True)
    step = 256
    for first in range(1, metadata.num_segments + 1, step):
        storage.get_segment_arrays(snapshot_id, first, first + step - 1)
    return metadata, storage.length(snapshot_id)


def owned_objects(storage: SnapshotStorage, name: str) -> tuple[list[OwnedObject], list[str]]:
    """The objects of ``name`` (by id shape, confirmed by header), and messages for the objects
    whose id says they may be the name's but whose header cannot be read."""
    owned: list[OwnedObject] = []
    unreadable: list[str] = []
    for info in storage.list_objects():
        id_range = key_range(name, info.id)
        if id_range is None:
            continue
        try:
            metadata = storage.get_metadata(info.id, check_bitmaps=False)
        except SnapshotNotFoundError:
            continue  # deleted since the listing
        except (SnapshotCorruptError, StorageError) as exc:
            unreadable.append(f"object {info.id!r} cannot be read: {exc}")
            continue
        if metadata.has_origin:
            if metadata.index_name == name:
                owned.append(
                    OwnedObject(info.id, metadata.start_ledger, metadata.end_ledger,
                                metadata.generation)
                )  # fmt: skip
        elif (metadata.start_ledger, metadata.end_ledger) == id_range:
            owned.append(OwnedObject(info.id, metadata.start_ledger, metadata.end_ledger, None))
    return owned, unreadable


@dataclass(frozen=True)
class ManifestRecovery:
    """What :func:`recover_manifest` found and decided.

    ``base_version``: the history generation recovered from (None: rebuilt from the objects'
    headers). ``version``: the version the recovered manifest is stored with. ``damaged``: the
    manifest files found damaged or missing. ``adopted``: objects made live. ``superseded``:
    live buckets of the base that an adopted object encloses (now delete intents).
    ``contradicting``: objects kept in the quarantine (state ``kept``): they contradict the
    live set.
    ``unreadable``: objects of the name that could not be read (left alone).
    ``mark_delete``: the recovered mark-delete position.
    """

    name: str
    base_version: int | None
    version: int
    damaged: tuple[str, ...] = ()
    adopted: tuple[str, ...] = ()
    superseded: tuple[str, ...] = ()
    contradicting: tuple[str, ...] = ()
    unreadable: tuple[str, ...] = ()
    mark_delete: tuple[int, int] | None = None

    def summary(self) -> str:
        """One warning line: where the state came from, and what that means for delivery."""
        if self.base_version is not None:
            source = f"history generation {self.base_version}"
        else:
            source = "the snapshot objects' own headers (no manifest generation survived)"
        parts = [
            f"manifest of {self.name!r} was damaged or missing; recovered from {source} "
            f"as version {self.version}"
        ]
        if self.adopted:
            parts.append(f"adopted {len(self.adopted)} newer object(s)")
        if self.superseded:
            parts.append(f"{len(self.superseded)} bucket(s) superseded by merges")
        if self.contradicting:
            parts.append(
                f"{len(self.contradicting)} contradicting object(s) kept in the quarantine "
                f"({', '.join(self.contradicting)})"
            )
        if self.unreadable:
            parts.append(f"{len(self.unreadable)} unreadable object(s) left alone")
        mark = "none" if self.mark_delete is None else f"{self.mark_delete}"
        parts.append(
            f"mark-delete {mark} may be older than the lost one: acknowledged positions may be "
            "delivered again (at-least-once), none is lost"
        )
        return "; ".join(parts)


def _newest_generation(
    storage: HistoryStorage, name: str, damaged: list[str]
) -> tuple[Manifest | None, list[int]]:
    versions = storage.manifest_history(name)
    for version in versions:
        try:
            return storage.read_manifest_generation(name, version), versions
        except SnapshotNotFoundError:
            continue
        except SnapshotCorruptError as exc:
            damaged.append(str(exc))
    return None, versions


def recover_manifest(
    storage: SnapshotStorage, name: str, cause: SnapshotCorruptError | None
) -> tuple[Manifest, ManifestRecovery] | None:
    """The newest state of ``name`` provable from its history and objects (module docs).

    ``cause`` is the damage of the current manifest, or None when there is none (it was never
    committed, or it and all its history are gone): then None is returned if the name has no
    object either (a new name).

    Raises:
        SnapshotCorruptError: nothing consistent can be proven; the message names the files.
        StorageError: the store could not be listed or read.
    """
    damaged = [] if cause is None else [str(cause)]
    base: Manifest | None = None
    versions: list[int] = []
    if isinstance(storage, HistoryStorage):
        base, versions = _newest_generation(storage, name, damaged)
    owned, unreadable = owned_objects(storage, name)
    if base is None and not owned:
        if cause is None and not unreadable:
            return None  # a new name
        raise SnapshotCorruptError(
            f"cannot recover the manifest of {name!r}: "
            + "; ".join([*damaged, *unreadable] or ["no manifest generation and no object"])
            + ("" if damaged else "; no readable manifest generation")
            + ("; no readable object of this name" if not owned else "")
        )
    manifest, adopted, superseded, contradicting, more = _reconcile(
        storage, base if base is not None else Manifest(name), base is not None, owned
    )
    unreadable += more
    generations = [o.generation or 0 for o in owned]
    version = max([0, *versions, *generations, base.version if base else 0]) + 1
    recovered = replace(manifest, version=version)
    return recovered, ManifestRecovery(
        name,
        None if base is None else base.version,
        version,
        tuple(damaged),
        tuple(adopted),
        tuple(superseded),
        tuple(contradicting),
        tuple(unreadable),
        manifest.mark_delete,
    )


def _reconcile(
    storage: SnapshotStorage, base: Manifest, has_base: bool, owned: Sequence[OwnedObject]
) -> tuple[Manifest, list[str], list[str], list[str], list[str]]:
    manifest = base
    objects = {o.id: o for o in owned}
    candidates: list[OwnedObject] = []
    for intent in [i for i in manifest.intents if i.kind == "create"]:
        found = objects.get(intent.snapshot_id)
        if found is not None:
            candidates.append(found)  # its lost commit may have made it live: decide below
            manifest = manifest.without_intent(intent.snapshot_id)
        else:
            undo = Intent("delete", intent.snapshot_id, intent.start_ledger, intent.end_ledger)
            manifest = manifest.with_updated_intent(undo)  # rolled back by the repair
    referenced = base.referenced_ids()
    for obj in owned:
        if obj.id in referenced:
            continue
        if not has_base or (obj.generation is not None and obj.generation > base.version):
            candidates.append(obj)
        # else: older than the base and unknown to it: a leftover the protocol had deleted
        # (or an object of unknown age next to a surviving generation); neither is adopted.
    adopted: list[str] = []
    superseded: list[str] = []
    contradicting: list[str] = []
    unreadable: list[str] = []
    candidates.sort(key=lambda o: (o.generation or 0, o.end_ledger - o.start_ledger, o.id))
    for obj in candidates:
        try:
            metadata, size = verify_object(storage, obj.id)
        except SnapshotNotFoundError:
            continue
        except (SnapshotCorruptError, StorageError) as exc:
            unreadable.append(f"object {obj.id!r} is damaged: {exc}")
            manifest = _dead_letter(manifest, obj, f"recovery: damaged, not adopted: {exc}")
            continue
        overlap = manifest.overlapping(obj.start_ledger, obj.end_ledger)
        encloses = all(
            obj.start_ledger <= b.start_ledger and b.end_ledger <= obj.end_ledger for b in overlap
        )
        if not encloses:
            contradicting.append(obj.id)
            clash = ", ".join(b.snapshot_id for b in overlap)
            manifest = _dead_letter(
                manifest, obj, f"recovery: not adopted, its range contradicts live {clash}"
            )
            continue
        for old in overlap:
            manifest = manifest.without_bucket(old.snapshot_id).with_intent(
                Intent("delete", old.snapshot_id, old.start_ledger, old.end_ledger)
            )
            superseded.append(old.snapshot_id)
        manifest = manifest.with_bucket(
            BucketRecord(
                obj.start_ledger, obj.end_ledger, obj.id,
                metadata.num_messages, metadata.num_segments, size,
                count_packed(metadata.folded_cancels),
            )
        )  # fmt: skip
        adopted.append(obj.id)
    return manifest, adopted, superseded, contradicting, unreadable


def _dead_letter(manifest: Manifest, obj: OwnedObject, why: str) -> Manifest:
    """Keep an object recovery could not adopt where the operator sees it: a quarantine
    record in state ``kept`` (never deleted, by the library or by ``gc``; a dead letter
    could be deleted by ``gc --retry-dead-letters``)."""
    keep = QuarantineRecord(
        obj.id, obj.start_ledger, obj.end_ledger, 0, 1, why[:1000], 0, state="kept"
    )
    return replace(manifest, quarantined=(*manifest.quarantined, keep))
