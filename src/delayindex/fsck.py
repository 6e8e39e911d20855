"""A full consistency check of a snapshot store: every byte of every object and manifest.

:func:`check_store` (the ``delayindex fsck`` command) reads, unlike ``delayindex inspect``,
everything in full:

* every object: the header and its checksum, the metadata with every bitmap parsed and checked
  against the segment counts, every segment decoded and checksummed
  (:func:`~delayindex.storage.recovery.verify_object`); and, for an object that names its
  origin, that the range in its header is the range in its id;
* every manifest, and every history generation of it (a deleted current manifest whose
  history survives is damage, as ``read_manifest`` reports it).

Each damaged item is reported by file with what is wrong; nothing is changed and no lock is
taken. Pure logic: the CLI renders the report.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass

from delayindex.errors import SnapshotCorruptError, SnapshotNotFoundError
from delayindex.storage.base import SnapshotStorage
from delayindex.storage.file import FileStorage
from delayindex.storage.recovery import HistoryStorage, key_range, verify_object

#: ``progress(phase, done, total)``: phase ``"objects"`` then ``"manifests"``.
Progress = Callable[[str, int, int], None]
#: :attr:`Damage.kind` values.
KINDS: tuple[str, ...] = ("object", "manifest", "history")


@dataclass(frozen=True)
class Damage:
    """One damaged item: its ``kind`` (:data:`KINDS`), its id (an object id, a manifest name,
    or ``name@version`` for a history generation), its file and what is wrong."""

    kind: str
    id: str
    file: str
    error: str


@dataclass(frozen=True)
class FsckReport:
    """What :func:`check_store` read and found."""

    objects: int
    object_bytes: int
    manifests: int
    generations: int
    damaged: tuple[Damage, ...] = ()

    @property
    def clean(self) -> bool:
        """Nothing is damaged."""
        return not self.damaged


def _object_file(storage: SnapshotStorage, snapshot_id: str) -> str:
    if isinstance(storage, FileStorage):
        return str(storage.object_path(snapshot_id))
    return f"objects/{snapshot_id}"


def _manifest_file(storage: SnapshotStorage, name: str, version: int | None = None) -> str:
    if isinstance(storage, FileStorage):
        if version is None:
            return str(storage.manifest_path(name))
        return str(storage.manifest_history_path(name, version))
    return f"manifests/{name}.manifest" + ("" if version is None else f".{version}")


def check_store(
    storage: SnapshotStorage,
    *,
    names: Collection[str] | None = None,
    progress: Progress | None = None,
) -> FsckReport:
    """Read every object and every manifest generation of ``storage`` in full (module docs).

    ``names`` restricts the manifests checked (objects are always all checked).

    Raises:
        StorageError: listing or reading failed after retries (I/O, not damage).
    """
    damaged: list[Damage] = []
    objects = storage.list_objects()
    for done, info in enumerate(objects, 1):
        try:
            metadata, _ = verify_object(storage, info.id)
        except SnapshotNotFoundError:
            pass  # deleted since the listing
        except SnapshotCorruptError as exc:
            damaged.append(Damage("object", info.id, _object_file(storage, info.id), str(exc)))
        else:
            if metadata.has_origin:
                expected = key_range(metadata.index_name, info.id)
                actual = (metadata.start_ledger, metadata.end_ledger)
                if expected is not None and expected != actual:
                    damaged.append(
                        Damage(
                            "object", info.id, _object_file(storage, info.id),
                            f"header range {list(actual)} differs from its id's {list(expected)}",
                        )
                    )  # fmt: skip
        if progress is not None:
            progress("objects", done, len(objects))
    all_names = [n for n in storage.list_manifests() if names is None or n in names]
    generations = 0
    for done, name in enumerate(all_names, 1):
        try:
            storage.read_manifest(name)
        except SnapshotCorruptError as exc:
            damaged.append(Damage("manifest", name, _manifest_file(storage, name), str(exc)))
        if isinstance(storage, HistoryStorage):
            for version in storage.manifest_history(name):
                generations += 1
                try:
                    storage.read_manifest_generation(name, version)
                except SnapshotNotFoundError:
                    generations -= 1  # pruned since the listing
                except SnapshotCorruptError as exc:
                    damaged.append(
                        Damage("history", f"{name}@{version}",
                               _manifest_file(storage, name, version), str(exc))
                    )  # fmt: skip
        if progress is not None:
            progress("manifests", done, len(all_names))
    return FsckReport(
        objects=len(objects),
        object_bytes=sum(o.size for o in objects),
        manifests=len(all_names),
        generations=generations,
        damaged=tuple(damaged),
    )


__all__ = ["KINDS", "Damage", "FsckReport", "Progress", "check_store"]
