"""Garbage collection of a snapshot store: orphaned objects, unfinished intents, dead letters.

This module is pure logic over the :class:`~delayindex.storage.base.SnapshotStorage` protocol
(no printing; the ``delayindex gc`` command renders its reports). :func:`find_garbage` is a dry
run and changes nothing: it takes no lock and writes nothing. :func:`run_gc` with
``delete=True`` collects.

How orphans are found. The store is **listed first, then every manifest is read**. The two-phase
protocol (:mod:`delayindex.storage.catalog`) commits a create intent *before* it writes the
object and drops a reference only *after* the object is deleted, so an object that exists when
the listing is taken and was written by the protocol is referenced by a manifest read afterwards
(or is already deleted again). What no manifest references (live buckets, intents or dead letters:
:meth:`~delayindex.storage.manifest.Manifest.referenced_ids`) is garbage: left by older versions,
by foreign writers or by lost intents. Reading the manifests first and listing second would be
wrong: an object created in between would look unreferenced.

Invariants of collection:

* an object referenced by any manifest is never deleted; nor is one younger than the grace
  period (``now_ms - mtime_ms < grace_ms``; a writer that does not use intents may still be
  writing it, or about to reference it), nor one whose age cannot be known;
* one damaged (or unreadable) manifest makes gc refuse to delete anything: nobody can tell what
  that manifest references. It is reported, and the store is left as it was. A *deleted*
  manifest whose history survives is damaged too (``read_manifest`` says so), and so is a name
  that only the objects know: an unreferenced object whose header names an index (its origin,
  see ``SnapshotMetadata.with_origin``) that has no readable manifest, or whose generation is
  newer than that manifest (the manifest was lost or rolled back), makes gc refuse, because
  ``Catalog.open`` rebuilds that index from exactly those objects;
* an object referenced by any surviving history generation of a manifest is never deleted
  either (each name keeps its newest generations: ``storage.base.MANIFEST_HISTORY``);
* right before deleting, gc lists the objects and reads every manifest again and re-checks each
  candidate (still present, still unreferenced, still old). After that re-check nothing can
  start referencing a candidate: the protocol only ever references fresh random ids, and
  ``create`` never overwrites an existing id;
* unfinished intents of a name are resumed by opening the name's
  :class:`~delayindex.storage.catalog.Catalog`, whose repair finishes delete intents and rolls
  back create intents. Opening takes the name's writer lock: a name whose writer is running is
  skipped and reported "in use" (that writer retries its own intents). Dead letters are retried
  only on request (``retry_dead_letters``), through the same catalog.

For :class:`~delayindex.storage.file.FileStorage`, temp files in ``tmp/`` whose writer process is
gone are reported too (and removed when collecting).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass, replace

from delayindex.errors import (
    ManifestConflictError,
    SnapshotCorruptError,
    SnapshotNotFoundError,
    StorageError,
    StoreLockedError,
)
from delayindex.storage.base import ObjectInfo, SnapshotStorage
from delayindex.storage.catalog import Catalog
from delayindex.storage.file import FileStorage
from delayindex.storage.manifest import Manifest
from delayindex.storage.recovery import HistoryStorage

#: ``progress(phase, done, total)``: phase ``"manifests"`` while reading manifests,
#: ``"deletes"`` while deleting orphans.
Progress = Callable[[str, int, int], None]

#: :attr:`NameGc.action` values.
ACTIONS: tuple[str, ...] = ("none", "would-resume", "resumed", "in-use", "failed")


@dataclass(frozen=True)
class Orphan:
    """A stored object that no manifest references."""

    id: str
    size: int
    mtime_ms: int
    age_ms: int


@dataclass(frozen=True)
class Skipped:
    """An orphan candidate that the re-check before deleting spared, and why."""

    id: str
    reason: str


@dataclass(frozen=True)
class FailedDelete:
    """An orphan whose delete failed."""

    id: str
    error: str


@dataclass(frozen=True)
class NameGc:
    """One name's unfinished business: what its manifest held, and what gc did about it.

    ``pending_deletes``/``pending_creates``/``dead_letters`` are snapshot ids as the scan read
    them. ``action``: ``"none"`` (nothing was done), ``"would-resume"`` (dry run: the name has
    unfinished intents that collecting would resume), ``"resumed"``
    (the catalog was opened and repaired), ``"in-use"`` (a running writer holds the name),
    ``"failed"`` (``error`` says why). After a resume, ``completed`` lists the intents finished
    (deleted objects and rolled-back creates), ``retried`` the dead letters that were deleted,
    and ``remaining_intents``/``remaining_dead_letters`` what is still left.
    """

    name: str
    pending_deletes: tuple[str, ...] = ()
    pending_creates: tuple[str, ...] = ()
    dead_letters: tuple[str, ...] = ()
    action: str = "none"
    completed: tuple[str, ...] = ()
    retried: tuple[str, ...] = ()
    remaining_intents: tuple[str, ...] = ()
    remaining_dead_letters: tuple[str, ...] = ()
    error: str = ""

    @property
    def has_work(self) -> bool:
        """The name had unfinished intents or dead letters when it was scanned."""
        return bool(self.pending_deletes or self.pending_creates or self.dead_letters)


@dataclass(frozen=True)
class GcReport:
    """What a gc run found and (with ``delete``) did.

    ``orphans`` are unreferenced objects old enough to collect, ``young`` unreferenced ones kept
    because they are inside the grace period. ``corrupt_manifests`` lists ``(name, error)``;
    when it is not empty, or ``store_error`` is set (the re-check before deleting failed),
    ``refused`` explains why orphans were not deleted. ``temp_files`` are stale temp files of a
    FileStorage (``removed_temp_files``: those removed).
    """

    now_ms: int
    grace_ms: int
    delete: bool
    objects: int
    object_bytes: int
    referenced: int
    manifests: tuple[str, ...]
    orphans: tuple[Orphan, ...] = ()
    young: tuple[Orphan, ...] = ()
    corrupt_manifests: tuple[tuple[str, str], ...] = ()
    names: tuple[NameGc, ...] = ()
    temp_files: tuple[str, ...] = ()
    deleted: tuple[str, ...] = ()
    skipped: tuple[Skipped, ...] = ()
    failed: tuple[FailedDelete, ...] = ()
    removed_temp_files: tuple[str, ...] = ()
    refused: str = ""
    store_error: str = ""

    @property
    def orphan_bytes(self) -> int:
        """Bytes held by the collectable orphans."""
        return sum(o.size for o in self.orphans)

    def problems(self) -> list[str]:
        """Why the store is not clean after this run (empty: nothing left to collect).

        A dry run lists what collecting would do; a collecting run lists what it could not do.
        Dead letters count until they are retried successfully. Orphans inside the grace period
        and intents of a name in use (its writer handles them) do not count.
        """
        out: list[str] = [self.refused] if self.refused else []
        if not self.delete:
            if self.orphans:
                out.append(f"{len(self.orphans)} orphaned objects ({self.orphan_bytes:,} bytes)")
            if self.temp_files:
                out.append(f"{len(self.temp_files)} stale temp files")
        elif self.failed:
            out.append(f"{len(self.failed)} orphan deletes failed")
        for name in self.names:
            if name.action == "would-resume" and (name.pending_deletes or name.pending_creates):
                count = len(name.pending_deletes) + len(name.pending_creates)
                out.append(f"{name.name}: {count} unfinished intents")
            if name.action == "failed":
                out.append(f"{name.name}: {name.error}")
            if name.action == "resumed" and name.remaining_intents:
                out.append(f"{name.name}: {len(name.remaining_intents)} intents still pending")
            dead = name.remaining_dead_letters if name.action == "resumed" else name.dead_letters
            if dead:
                out.append(f"{name.name}: {len(dead)} dead letters")
        return out


@dataclass(frozen=True)
class _Scan:
    manifests: dict[str, Manifest]
    corrupt: dict[str, str]
    history_refs: frozenset[str] = frozenset()

    def referenced(self) -> frozenset[str]:
        ids: set[str] = set(self.history_refs)
        for manifest in self.manifests.values():
            ids |= manifest.referenced_ids()
        return frozenset(ids)


def _history_refs(storage: SnapshotStorage, name: str) -> set[str]:
    """Ids referenced by the surviving history generations of ``name`` (damaged ones skipped:
    the current manifest is readable, so they are only older copies)."""
    if not isinstance(storage, HistoryStorage):
        return set()
    ids: set[str] = set()
    for version in storage.manifest_history(name):
        try:
            ids |= storage.read_manifest_generation(name, version).referenced_ids()
        except (SnapshotCorruptError, SnapshotNotFoundError):
            continue
    return ids


def _unowned(storage: SnapshotStorage, scan: _Scan, ids: Iterable[str]) -> dict[str, str]:
    """Names that unreferenced objects claim (their header's origin) but whose manifest is
    missing, or older than the object: ``{name: why}``; gc must not collect anything then."""
    out: dict[str, str] = {}
    for snapshot_id in ids:
        try:
            metadata = storage.get_metadata(snapshot_id, check_bitmaps=False)
        except (SnapshotCorruptError, SnapshotNotFoundError):
            continue  # gone, or no header to tell an owner by: an orphan as before
        name = metadata.index_name
        if not name or name in scan.corrupt or name in out:
            continue
        manifest = scan.manifests.get(name)
        if manifest is None or manifest.version == 0:
            out[name] = (
                f"object {snapshot_id!r} names index {name!r}, which has no manifest and no "
                "history: opening it rebuilds it from its objects"
            )
        elif metadata.generation > manifest.version:
            out[name] = (
                f"object {snapshot_id!r} (generation {metadata.generation}) is newer than the "
                f"manifest of {name!r} (version {manifest.version}): the manifest was lost or "
                "rolled back"
            )
    return out


def _read_manifests(storage: SnapshotStorage, progress: Progress | None) -> _Scan:
    """Every manifest of the store; damaged ones are collected, not raised."""
    names = storage.list_manifests()
    manifests: dict[str, Manifest] = {}
    corrupt: dict[str, str] = {}
    history: set[str] = set()
    for done, name in enumerate(names, 1):
        try:
            manifests[name] = storage.read_manifest(name)
            history |= _history_refs(storage, name)
        except SnapshotCorruptError as exc:
            corrupt[name] = str(exc)
        if progress is not None:
            progress("manifests", done, len(names))
    return _Scan(manifests, corrupt, frozenset(history))


def _check_times(now_ms: int, grace_ms: int) -> None:
    for what, value in (("now_ms", now_ms), ("grace_ms", grace_ms)):
        if type(value) is not int:
            raise TypeError(f"{what} must be an int, got {type(value).__name__}")
    if grace_ms < 0:
        raise ValueError(f"grace_ms must be >= 0, got {grace_ms}")


def _name_work(manifest: Manifest) -> NameGc:
    return NameGc(
        name=manifest.name,
        pending_deletes=tuple(i.snapshot_id for i in manifest.intents if i.kind == "delete"),
        pending_creates=tuple(i.snapshot_id for i in manifest.intents if i.kind == "create"),
        dead_letters=tuple(d.snapshot_id for d in manifest.dead_letters),
    )


def _selected(all_names: Iterable[str], names: Collection[str] | None) -> list[str]:
    return [n for n in all_names if names is None or n in names]


def find_garbage(
    storage: SnapshotStorage,
    *,
    now_ms: int,
    grace_ms: int,
    names: Collection[str] | None = None,
    progress: Progress | None = None,
) -> GcReport:
    """Dry run: what gc would collect now. Changes nothing, takes no lock.

    Args:
        storage: the store.
        now_ms: the current time (epoch ms) that object ages are measured against.
        grace_ms: unreferenced objects younger than this are kept (reported as ``young``).
        names: restrict the per-name part (intents, dead letters) to these names; orphans
            belong to no name, so the orphan scan always reads every manifest.
        progress: optional ``progress(phase, done, total)`` callback.

    Raises:
        StorageError: listing or reading failed after retries.
        TypeError, ValueError: bad ``now_ms``/``grace_ms``.
    """
    _check_times(now_ms, grace_ms)
    objects = storage.list_objects()  # first: see the module docs
    scan = _read_manifests(storage, progress)
    referenced = scan.referenced()
    orphans: list[Orphan] = []
    young: list[Orphan] = []
    for info in objects:
        if info.id in referenced:
            continue
        orphan = Orphan(info.id, info.size, info.mtime_ms, now_ms - info.mtime_ms)
        (orphans if orphan.age_ms >= grace_ms else young).append(orphan)
    scan.corrupt.update(_unowned(storage, scan, [o.id for o in (*orphans, *young)]))
    work = []
    for name in _selected(scan.manifests, names):
        item = _name_work(scan.manifests[name])
        if item.pending_deletes or item.pending_creates:
            item = replace(item, action="would-resume")
        work.append(item)
    corrupt = tuple(sorted(scan.corrupt.items()))
    refused = ""
    if corrupt:
        refused = (
            f"refusing to delete anything: {len(corrupt)} manifest(s) cannot be read "
            f"({', '.join(n for n, _ in corrupt)}), so what they reference is unknown"
        )
    return GcReport(
        now_ms=now_ms,
        grace_ms=grace_ms,
        delete=False,
        objects=len(objects),
        object_bytes=sum(o.size for o in objects),
        referenced=sum(1 for o in objects if o.id in referenced),
        manifests=tuple(sorted({*scan.manifests, *scan.corrupt})),
        orphans=tuple(orphans),
        young=tuple(young),
        corrupt_manifests=corrupt,
        names=tuple(work),
        temp_files=tuple(storage.stale_temp_files()) if isinstance(storage, FileStorage) else (),
        refused=refused,
    )


def _resume(
    storage: SnapshotStorage,
    item: NameGc,
    *,
    now_ms: int,
    retry_dead_letters: bool,
    max_delete_attempts: int,
) -> NameGc:
    """Open the name's catalog (its repair resumes the intents); retry dead letters if asked."""
    try:
        catalog = Catalog.open(
            storage, item.name, clock=lambda: now_ms, max_delete_attempts=max_delete_attempts
        )
    except StoreLockedError:
        return replace(item, action="in-use")
    except (StorageError, ManifestConflictError, SnapshotCorruptError) as exc:
        return replace(item, action="failed", error=f"could not open: {exc}")
    with catalog:
        repair = catalog.repair_report
        completed = (*repair.completed_deletes,)
        retried: tuple[str, ...] = ()
        error = ""
        if retry_dead_letters and catalog.manifest.dead_letters:
            try:
                retry = catalog.retry_dead_letters(None)
                retried = retry.completed
            except (StorageError, ManifestConflictError) as exc:
                error = f"retrying dead letters failed: {exc}"
        manifest = catalog.manifest
    return replace(
        item,
        action="failed" if error else "resumed",
        error=error,
        completed=completed,
        retried=retried,
        remaining_intents=tuple(i.snapshot_id for i in manifest.intents),
        remaining_dead_letters=tuple(d.snapshot_id for d in manifest.dead_letters),
    )


def run_gc(
    storage: SnapshotStorage,
    *,
    now_ms: int,
    grace_ms: int,
    delete: bool = False,
    retry_dead_letters: bool = False,
    names: Collection[str] | None = None,
    max_delete_attempts: int = 10,
    progress: Progress | None = None,
) -> GcReport:
    """Find garbage and, with ``delete``, collect it (module docs: order and safety rules).

    Without ``delete`` this is :func:`find_garbage`. With it: unless a manifest is damaged
    (then nothing at all is changed), each selected name with unfinished intents (or dead
    letters, with ``retry_dead_letters``) is resumed through its catalog, then the orphans are
    re-checked against a fresh listing and fresh manifests and deleted, and (FileStorage) stale
    temp files are removed.

    Args:
        storage: the store.
        now_ms: the current time (epoch ms); also the clock of resumed catalogs.
        grace_ms: unreferenced objects younger than this are never deleted.
        delete: collect (default: dry run).
        retry_dead_letters: also move dead letters back to pending deletes and retry them.
        names: restrict intents and dead letters to these names (orphans are store-wide).
        max_delete_attempts: for resumed catalogs: failures before a delete is dead-lettered.
        progress: optional ``progress(phase, done, total)`` callback.

    Raises:
        StorageError: listing or reading failed after retries (nothing more was attempted).
        TypeError, ValueError: bad arguments.
    """
    report = find_garbage(storage, now_ms=now_ms, grace_ms=grace_ms, names=names, progress=progress)
    if not delete:
        return report
    if max_delete_attempts < 1:
        raise ValueError(f"max_delete_attempts must be >= 1, got {max_delete_attempts}")
    report = replace(report, delete=True)
    if report.corrupt_manifests:
        return report

    work = []
    for item in report.names:
        wanted = bool(item.pending_deletes or item.pending_creates) or (
            retry_dead_letters and bool(item.dead_letters)
        )
        if wanted:
            item = _resume(
                storage,
                item,
                now_ms=now_ms,
                retry_dead_letters=retry_dead_letters,
                max_delete_attempts=max_delete_attempts,
            )
        else:
            item = replace(item, action="none", remaining_dead_letters=item.dead_letters)
        work.append(item)
    report = replace(report, names=tuple(work))

    # Re-check right before deleting: listing first, then manifests, as in the scan.
    try:
        current = {o.id: o for o in storage.list_objects()}
        scan = _read_manifests(storage, None)
    except StorageError as exc:
        return replace(
            report,
            store_error=str(exc),
            refused=f"refusing to delete orphans: the re-check failed: {exc}",
        )
    if scan.corrupt:
        corrupt = tuple(sorted(scan.corrupt.items()))
        return replace(
            report,
            corrupt_manifests=corrupt,
            refused=f"refusing to delete orphans: manifest(s) {', '.join(n for n, _ in corrupt)} "
            "became unreadable during gc",
        )
    unowned = _unowned(storage, scan, [o.id for o in report.orphans])
    if unowned:
        return replace(
            report,
            corrupt_manifests=tuple(sorted(unowned.items())),
            refused=f"refusing to delete orphans: index(es) {', '.join(sorted(unowned))} have "
            "objects but no readable manifest",
        )
    referenced = scan.referenced()
    deleted: list[str] = []
    skipped: list[Skipped] = []
    failed: list[FailedDelete] = []
    for done, orphan in enumerate(report.orphans, 1):
        info: ObjectInfo | None = current.get(orphan.id)
        if info is None:
            skipped.append(Skipped(orphan.id, "gone before gc deleted it"))
        elif orphan.id in referenced:
            skipped.append(Skipped(orphan.id, "referenced by a manifest now"))
        elif now_ms - info.mtime_ms < grace_ms:
            skipped.append(Skipped(orphan.id, "rewritten: inside the grace period now"))
        else:
            try:
                storage.delete(orphan.id)
                deleted.append(orphan.id)
            except StorageError as exc:
                failed.append(FailedDelete(orphan.id, str(exc)))
        if progress is not None:
            progress("deletes", done, len(report.orphans))
    report = replace(report, deleted=tuple(deleted), skipped=tuple(skipped), failed=tuple(failed))
    if isinstance(storage, FileStorage):
        removed = {*storage.removed_temp_files, *storage.remove_stale_temp_files()}
        report = replace(report, removed_temp_files=tuple(sorted(removed)))
    return report


__all__ = [
    "ACTIONS",
    "FailedDelete",
    "GcReport",
    "NameGc",
    "Orphan",
    "Progress",
    "Skipped",
    "find_garbage",
    "run_gc",
]
