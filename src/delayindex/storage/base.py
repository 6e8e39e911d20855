"""The snapshot storage contract and the machinery both backends share.

:class:`SnapshotStorage` is the protocol a tracker writes its sealed buckets through (Pulsar's
``BucketSnapshotStorage``, §2.4 of the notes, plus a per-name manifest and a writer lock).
:class:`BaseStorage` implements it once on top of a handful of raw primitives that a backend
provides (``_raw_put``, ``_raw_source``, ``_raw_delete``, ...), so that validation, retries,
statistics, the object read path and manifest compare-and-swap behave identically in
:class:`~delayindex.storage.memory.MemoryStorage` and :class:`~delayindex.storage.file.FileStorage`.

How a snapshot is read (the layout is ``delayindex.snapshot.codec``'s): the fixed header prefix,
then the rest of the header (entry lengths, checksummed), then only the entries asked for. The
object's size must equal the size the header announces, so truncation or trailing garbage is
caught before any entry is trusted. Decoding a segment needs the metadata (entry 0), so decoded
metadata is kept in a small LRU keyed by snapshot id and validated by a *fingerprint* of the
stored object (a generation counter in memory; inode, size and mtime on disk).

Retries (Pulsar's ``executeWithRetry``): every raw I/O call runs up to :data:`MAX_ATTEMPTS` times
in all, immediately, while it raises ``OSError`` (transient I/O). Nothing else is retried:
``SnapshotNotFoundError``, ``SnapshotCorruptError``, ``ManifestConflictError``,
``StoreLockedError`` and ``SnapshotExistsError`` are answers, not accidents, and any other
exception is a bug that must surface unchanged. After the last failed attempt the call raises
:class:`~delayindex.errors.StorageError` naming the operation and the id, chained to the last
error. A retry must not turn a success whose acknowledgement was lost into a failure, so from the
second attempt on ``create`` accepts an existing object with identical bytes and
``commit_manifest`` accepts a stored manifest equal to the one it is committing.

Manifest history: every commit also stores an independent copy of the new manifest as history
generation ``version`` (its own bytes, written with the same crash-safe protocol, never a link to
the current file), and prunes the copy :data:`MANIFEST_HISTORY` generations older, so the newest
:data:`MANIFEST_HISTORY` generations survive a damaged or deleted current manifest.
:meth:`BaseStorage.read_manifest` never mistakes a deleted manifest for a new name: when the
current manifest is missing but history exists it raises
:class:`~delayindex.errors.SnapshotCorruptError`. :meth:`BaseStorage.manifest_history`,
:meth:`BaseStorage.read_manifest_generation` and :meth:`BaseStorage.restore_manifest` are what
``Catalog.open``'s recovery, ``delayindex gc`` and ``delayindex fsck`` use.

Invariants: objects are immutable once created (never overwritten; a new version is a new id);
a reader never sees a partial object or manifest; ids and names match
:data:`~delayindex.storage.manifest.KEY_PATTERN`, so they are safe file names.
"""

from __future__ import annotations

import threading
from abc import ABC, abstractmethod
from collections import OrderedDict
from collections.abc import Callable, Hashable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, replace
from types import TracebackType
from typing import NamedTuple, Protocol, Self, TypeVar, runtime_checkable

import numpy as np
import numpy.typing as npt

from delayindex.errors import (
    ManifestConflictError,
    SnapshotCorruptError,
    SnapshotNotFoundError,
    StorageError,
)
from delayindex.snapshot.codec import (
    FIXED_HEADER_BYTES,
    ObjectHeader,
    check_metadata_bitmaps,
    decode_metadata,
    decode_segments,
    encode_snapshot,
    header_bytes_needed,
    read_header,
)
from delayindex.snapshot.format import Segment, SegmentList, SnapshotMetadata
from delayindex.storage.manifest import Manifest, decode_manifest, encode_manifest, validate_key

#: Manifest generations kept as independent history copies (the current one's copy included).
MANIFEST_HISTORY = 3
#: Attempts per I/O operation, first try included (Pulsar: 1 + 3 retries, no backoff).
MAX_ATTEMPTS = 4
#: Operation names, as keys of :meth:`SnapshotStorage.stats`.
OPS: tuple[str, ...] = (
    "create",
    "get_metadata",
    "get_segments",
    "length",
    "delete",
    "list_objects",
    "list_manifests",
    "read_manifest",
    "commit_manifest",
    "lock",
)
#: Counters kept per operation: calls made, attempts run, attempts that raised, and calls that
#: raised ``StorageError`` because every attempt failed.
STAT_FIELDS: tuple[str, ...] = ("calls", "attempts", "failures", "gave_up")

T = TypeVar("T")
Int64Array = npt.NDArray[np.int64]


class ObjectInfo(NamedTuple):
    """One stored snapshot object, as :meth:`SnapshotStorage.list_objects` reports it."""

    id: str
    size: int
    mtime_ms: int


class LockHandle:
    """A held writer lock on one name. Release it, or use it as a context manager.

    Releasing twice is harmless. The lock is also released when its storage is closed.
    """

    def __init__(self, name: str, where: str, release: Callable[[], None]) -> None:
        self.name = name
        self.where = where
        self._release: Callable[[], None] | None = release
        self._mutex = threading.Lock()

    @property
    def held(self) -> bool:
        """Whether this handle still holds the lock."""
        return self._release is not None

    def release(self) -> None:
        """Release the lock (idempotent)."""
        with self._mutex:
            release, self._release = self._release, None
        if release is not None:
            release()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.release()

    def __repr__(self) -> str:
        return f"LockHandle({self.name!r}, {self.where!r}, held={self.held})"


@runtime_checkable
class SnapshotStorage(Protocol):
    """Where sealed buckets live: immutable snapshot objects plus one manifest per name.

    Objects are addressed by opaque string ids; every backend here uses the caller's key as the
    id, so an id recorded in a create intent *before* the write finds the object after a crash.
    Missing objects raise :class:`~delayindex.errors.SnapshotNotFoundError` (never retried);
    damaged ones raise :class:`~delayindex.errors.SnapshotCorruptError` naming the object; I/O
    failures are retried (:data:`MAX_ATTEMPTS` attempts in all) and then raise
    :class:`~delayindex.errors.StorageError`. Bad arguments raise ``ValueError``/``TypeError``
    before any I/O. Implementations are thread-safe.
    """

    def create(self, metadata: SnapshotMetadata, segments: Sequence[Segment], key: str) -> str:
        """Store a snapshot under ``key`` and return its id (``key`` itself).

        The object is complete and durable when this returns, and invisible before.

        Raises:
            ValueError: ``key`` does not match ``KEY_PATTERN``, or the segments do not match
                the metadata.
            SnapshotExistsError: an object with this id exists (it is never overwritten).
            StorageError: the write failed :data:`MAX_ATTEMPTS` times.
        """
        ...

    def get_metadata(self, snapshot_id: str, *, check_bitmaps: bool = True) -> SnapshotMetadata:
        """The snapshot's metadata (entry 0).

        ``check_bitmaps=False`` skips parsing every per-segment bitmap up front, for callers
        that parse the ones they use themselves (recovery does, with its own checks).

        Raises:
            SnapshotNotFoundError, SnapshotCorruptError, StorageError.
        """
        ...

    def get_segments(self, snapshot_id: str, first: int, last: int) -> list[Segment]:
        """Segments ``first..last`` (1-based, inclusive) of a snapshot.

        ``last`` is clamped to the number of segments (as Pulsar does); ``first`` past the end
        returns ``[]``. Only the header and the requested entries are read.

        Raises:
            ValueError: ``first < 1`` or ``last < first``.
            SnapshotNotFoundError, SnapshotCorruptError, StorageError.
        """
        ...

    def get_segment_arrays(
        self, snapshot_id: str, first: int, last: int
    ) -> tuple[Int64Array, Int64Array, Int64Array]:
        """Segments ``first..last`` as three concatenated int64 arrays ``(times, ledgers,
        entries)``, sorted by ``(time, ledger, entry)``; the same reads, checks, clamping and
        errors as :meth:`get_segments`, without a Python object per segment."""
        ...

    def length(self, snapshot_id: str) -> int:
        """The stored size of the snapshot in bytes.

        Raises:
            SnapshotNotFoundError, StorageError.
        """
        ...

    def delete(self, snapshot_id: str) -> None:
        """Delete the snapshot. Deleting a missing id succeeds (deletes are idempotent).

        Raises:
            StorageError: the delete failed :data:`MAX_ATTEMPTS` times.
        """
        ...

    def list_objects(self) -> list[ObjectInfo]:
        """Every stored snapshot object of every name, sorted by id."""
        ...

    def list_manifests(self) -> list[str]:
        """The names that have a stored manifest (or manifest history), sorted.

        A name appears once its first commit lands, whether or not its manifest is readable
        (a damaged manifest is listed, and so is a deleted one whose history survives;
        :meth:`read_manifest` reports the damage).

        Raises:
            StorageError: the listing failed :data:`MAX_ATTEMPTS` times.
        """
        ...

    def read_manifest(self, name: str) -> Manifest:
        """The manifest of ``name``; an empty one at version 0 if none was ever committed.

        A missing manifest whose history survives is damage, not a new name: it raises
        ``SnapshotCorruptError`` (``Catalog.open`` recovers it).

        Raises:
            ValueError: bad name. SnapshotCorruptError: the stored manifest is damaged.
            StorageError.
        """
        ...

    def commit_manifest(self, name: str, manifest: Manifest) -> Manifest:
        """Compare-and-swap: store ``manifest`` if the stored version equals ``manifest.version``.

        The stored (and returned) manifest has ``version + 1``. The replacement is atomic: a
        reader sees the old manifest or the new one, never a mixture.

        Raises:
            ValueError: bad name, or ``manifest.name != name``.
            ManifestConflictError: the stored version differs (someone else committed).
            SnapshotCorruptError: the stored manifest is damaged (it is not overwritten).
            StorageError.
        """
        ...

    def lock(self, name: str) -> LockHandle:
        """Take the exclusive, non-blocking writer lock of ``name``.

        Returns a :class:`LockHandle` (a context manager). Other names are independent.

        Raises:
            StoreLockedError: another writer holds it; the message names the name and the lock.
        """
        ...

    def stats(self) -> dict[str, dict[str, int]]:
        """Per-operation counters: ``{op: {"calls", "attempts", "failures", "gave_up"}}``."""
        ...

    def close(self) -> None:
        """Release every lock this instance holds and its resources. Idempotent."""
        ...


@dataclass(frozen=True)
class ObjectSource:
    """Random access to one stored object during one read attempt (raw-primitive result)."""

    key: str
    where: str
    size: int
    fingerprint: Hashable
    read: Callable[[int, int], bytes]  # (offset, length) -> bytes; short only at end of object


def run_with_retries(
    op: str, target: str, attempt: Callable[[int], T], counters: dict[str, int] | None = None
) -> T:
    """Run ``attempt(n)`` for n = 1..MAX_ATTEMPTS while it raises ``OSError``.

    Any other exception propagates at once. ``counters`` (if given) is updated in place with
    the keys of :data:`STAT_FIELDS`. After the last failure raises ``StorageError`` naming
    ``op`` and ``target``, chained to the last ``OSError``.
    """
    stats = counters if counters is not None else dict.fromkeys(STAT_FIELDS, 0)
    stats["calls"] += 1
    last: OSError | None = None
    for n in range(1, MAX_ATTEMPTS + 1):
        stats["attempts"] += 1
        try:
            return attempt(n)
        except OSError as exc:
            stats["failures"] += 1
            last = exc
        except BaseException:
            stats["failures"] += 1
            raise
    stats["gave_up"] += 1
    raise StorageError(
        f"{op} of {target!r} failed after {MAX_ATTEMPTS} attempts: {last!r}"
    ) from last


def _check_int(value: object, what: str) -> int:
    if type(value) is not int:
        raise TypeError(f"{what} must be an int, got {type(value).__name__}")
    return value


class BaseStorage(ABC):
    """The backend-independent half of :class:`SnapshotStorage` (see the module docstring).

    Subclasses implement the ``_raw_*`` primitives; each is one attempt of an operation and
    signals transient failure by raising ``OSError``. ``_fault_point`` is a test seam that
    :class:`~delayindex.storage.memory.MemoryStorage` uses for fault injection.
    """

    def __init__(self, *, metadata_cache_size: int = 128) -> None:
        if metadata_cache_size < 0:
            raise ValueError("metadata_cache_size must be >= 0")
        self._stats: dict[str, dict[str, int]] = {op: dict.fromkeys(STAT_FIELDS, 0) for op in OPS}
        self._state_lock = threading.Lock()  # guards stats, cache, held locks, closed
        # id -> (fingerprint, metadata, whether every bitmap was checked)
        self._cache: OrderedDict[str, tuple[Hashable, SnapshotMetadata, bool]] = OrderedDict()
        self._cache_size = metadata_cache_size
        self._held: set[LockHandle] = set()
        self._closed = False

    # -- raw primitives (one attempt each; OSError = transient) ----------------------------------

    @abstractmethod
    def _raw_put(self, key: str, data: bytes, *, may_exist: bool) -> None:
        """Store ``data`` as object ``key`` atomically; never overwrite.

        If ``key`` exists: return quietly when ``may_exist`` and its bytes equal ``data`` (an
        earlier attempt of this call wrote it), else raise ``SnapshotExistsError``.
        """

    @abstractmethod
    def _raw_source(self, key: str) -> AbstractContextManager[ObjectSource]:
        """Open object ``key`` for reading (``SnapshotNotFoundError`` if missing)."""

    @abstractmethod
    def _raw_size(self, key: str) -> int:
        """Size of object ``key`` in bytes (``SnapshotNotFoundError`` if missing)."""

    @abstractmethod
    def _raw_delete(self, key: str) -> None:
        """Remove object ``key``; a missing object is success."""

    @abstractmethod
    def _raw_list(self) -> list[ObjectInfo]:
        """Every stored object."""

    @abstractmethod
    def _raw_list_manifests(self) -> list[str]:
        """The names that have a stored manifest or manifest history (any order; only names
        matching KEY_PATTERN)."""

    @abstractmethod
    def _raw_read_manifest(self, name: str) -> tuple[bytes | None, str]:
        """The stored manifest bytes of ``name`` (None if absent) and where they live."""

    @abstractmethod
    def _raw_manifest_history(self, name: str) -> list[int]:
        """The versions of ``name``'s stored history copies (any order)."""

    @abstractmethod
    def _raw_read_manifest_history(self, name: str, version: int) -> tuple[bytes | None, str]:
        """The bytes of history generation ``version`` of ``name`` (None if absent), and where."""

    @abstractmethod
    def _raw_delete_manifest_history(self, name: str, version: int) -> None:
        """Remove history generation ``version`` of ``name``; a missing one is success."""

    @abstractmethod
    def _raw_manifest_guard(self, name: str) -> AbstractContextManager[object]:
        """Mutual exclusion for one compare-and-swap of ``name``'s manifest (all writers)."""

    @abstractmethod
    def _raw_write_manifest(self, name: str, data: bytes, version: int) -> None:
        """Atomically replace ``name``'s manifest with ``data``, and store an independent copy
        of ``data`` as history generation ``version`` (replacing any copy of that version).

        The current manifest is replaced first, then the copy gets its name, so a crash in
        between never leaves history newer than the current manifest."""

    @abstractmethod
    def _raw_lock(self, name: str) -> tuple[str, Callable[[], None]]:
        """Take ``name``'s writer lock or raise ``StoreLockedError``; return (where, release)."""

    def _raw_close(self) -> None:  # noqa: B027 - optional hook
        """Free backend resources (locks are already released)."""

    def _fault_point(self, op: str, phase: str, attempt: int) -> None:  # noqa: B027 - optional hook
        """Called before (``"before"``) and after (``"after"``) the effect of every attempt;
        ``attempt`` is 1 for a call's first attempt (so a hook can tell calls apart)."""

    # -- shared machinery -------------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise ValueError(f"{self!r} is closed")

    def _retry(self, op: str, target: str, attempt: Callable[[int], T]) -> T:
        self._check_open()

        def one(n: int) -> T:
            self._fault_point(op, "before", n)
            result = attempt(n)
            self._fault_point(op, "after", n)
            return result

        counters = dict.fromkeys(STAT_FIELDS, 0)
        try:
            return run_with_retries(op, target, one, counters)
        finally:
            with self._state_lock:
                for key, value in counters.items():
                    self._stats[op][key] += value

    @staticmethod
    def _read_header(src: ObjectSource) -> ObjectHeader:
        prefix = src.read(0, FIXED_HEADER_BYTES)
        needed = header_bytes_needed(prefix, src.where)
        data = prefix + src.read(len(prefix), needed - len(prefix))
        header = read_header(data, src.where)
        if src.size != header.total_bytes:
            raise SnapshotCorruptError(
                f"{src.where}: object is {src.size} bytes, its header says {header.total_bytes}"
            )
        return header

    @staticmethod
    def _read_entries(
        src: ObjectSource, header: ObjectHeader, first: int, last: int
    ) -> list[bytes]:
        """Framed entries ``first..last`` (entry indexes, inclusive), read in one call."""
        lengths = header.entry_lengths[first : last + 1]
        blob = src.read(header.entry_offset(first), sum(lengths))
        if len(blob) != sum(lengths):
            raise SnapshotCorruptError(f"{src.where}: short read of entries {first}..{last}")
        entries, pos = [], 0
        for length in lengths:
            entries.append(blob[pos : pos + length])
            pos += length
        return entries

    def _metadata(
        self, src: ObjectSource, header: ObjectHeader, check_bitmaps: bool = False
    ) -> SnapshotMetadata:
        """Decoded metadata, cached with whether its bitmaps were fully checked yet."""
        with self._state_lock:
            cached = self._cache.get(src.key)
            if cached is not None and cached[0] != src.fingerprint:
                cached = None
            if cached is not None:
                self._cache.move_to_end(src.key)
                if cached[2] or not check_bitmaps:
                    return cached[1]
        if cached is not None:
            metadata = cached[1]
        else:
            metadata = decode_metadata(
                self._read_entries(src, header, 0, 0)[0], src.where, check_bitmaps=False
            )
            if metadata.num_segments != header.num_segments:
                raise SnapshotCorruptError(
                    f"{src.where}: {header.num_segments} segment entries, "
                    f"metadata lists {metadata.num_segments}"
                )
        if check_bitmaps:
            check_metadata_bitmaps(metadata, src.where)
        if self._cache_size:
            with self._state_lock:
                self._cache[src.key] = (src.fingerprint, metadata, check_bitmaps)
                self._cache.move_to_end(src.key)
                while len(self._cache) > self._cache_size:
                    self._cache.popitem(last=False)
        return metadata

    def _forget(self, key: str) -> None:
        with self._state_lock:
            self._cache.pop(key, None)

    # -- SnapshotStorage ----------------------------------------------------------------------

    def create(self, metadata: SnapshotMetadata, segments: Sequence[Segment], key: str) -> str:
        """See :meth:`SnapshotStorage.create`."""
        validate_key(key, "snapshot key")
        self._check_open()
        data = encode_snapshot(metadata, segments)
        self._retry("create", key, lambda n: self._raw_put(key, data, may_exist=n > 1))
        return key

    def get_metadata(self, snapshot_id: str, *, check_bitmaps: bool = True) -> SnapshotMetadata:
        """See :meth:`SnapshotStorage.get_metadata`."""
        validate_key(snapshot_id, "snapshot id")

        def attempt(_: int) -> SnapshotMetadata:
            with self._raw_source(snapshot_id) as src:
                return self._metadata(src, self._read_header(src), check_bitmaps)

        return self._retry("get_metadata", snapshot_id, attempt)

    def _decoded_segments(self, snapshot_id: str, first: int, last: int) -> Sequence[Segment]:
        validate_key(snapshot_id, "snapshot id")
        _check_int(first, "first")
        _check_int(last, "last")
        if first < 1 or last < first:
            raise ValueError(f"bad segment range {first}..{last} (1-based, inclusive)")

        def attempt(_: int) -> Sequence[Segment]:
            with self._raw_source(snapshot_id) as src:
                header = self._read_header(src)
                stop = min(last, header.num_segments)
                if first > stop:
                    return []
                metadata = self._metadata(src, header)
                entries = self._read_entries(src, header, first, stop)
            return decode_segments(entries, metadata, first, src.where)

        return self._retry("get_segments", snapshot_id, attempt)

    def get_segments(self, snapshot_id: str, first: int, last: int) -> list[Segment]:
        """See :meth:`SnapshotStorage.get_segments`."""
        # The codec returns a lazy SegmentList; the protocol promises a plain list.
        return list(self._decoded_segments(snapshot_id, first, last))

    def get_segment_arrays(
        self, snapshot_id: str, first: int, last: int
    ) -> tuple[Int64Array, Int64Array, Int64Array]:
        """See :meth:`SnapshotStorage.get_segment_arrays`."""
        decoded = self._decoded_segments(snapshot_id, first, last)
        if isinstance(decoded, SegmentList):
            return decoded.times, decoded.ledgers, decoded.entries
        empty = np.empty(0, dtype=np.int64)
        parts = list(decoded)
        if not parts:
            return empty, empty.copy(), empty.copy()
        return (
            np.concatenate([s.times for s in parts]),
            np.concatenate([s.ledgers for s in parts]),
            np.concatenate([s.entries for s in parts]),
        )

    def length(self, snapshot_id: str) -> int:
        """See :meth:`SnapshotStorage.length`."""
        validate_key(snapshot_id, "snapshot id")
        return self._retry("length", snapshot_id, lambda _: self._raw_size(snapshot_id))

    def delete(self, snapshot_id: str) -> None:
        """See :meth:`SnapshotStorage.delete`."""
        validate_key(snapshot_id, "snapshot id")
        try:
            self._retry("delete", snapshot_id, lambda _: self._raw_delete(snapshot_id))
        finally:
            self._forget(snapshot_id)

    def list_objects(self) -> list[ObjectInfo]:
        """See :meth:`SnapshotStorage.list_objects`."""
        return sorted(self._retry("list_objects", "*", lambda _: self._raw_list()))

    def list_manifests(self) -> list[str]:
        """See :meth:`SnapshotStorage.list_manifests`."""
        return sorted(self._retry("list_manifests", "*", lambda _: self._raw_list_manifests()))

    def _decode_stored_manifest(self, name: str) -> Manifest:
        data, where = self._raw_read_manifest(name)
        if data is None:
            history = sorted(self._raw_manifest_history(name), reverse=True)
            if history:
                # A deleted manifest is not a new name: its history proves it existed.
                raise SnapshotCorruptError(
                    f"{where}: manifest of {name!r} is missing, but history generation(s) "
                    f"{history} exist"
                )
            return Manifest(name)
        manifest = decode_manifest(data, where)
        if manifest.name != name:
            raise SnapshotCorruptError(f"{where}: holds the manifest of {manifest.name!r}")
        return manifest

    def _decode_generation(self, name: str, version: int) -> Manifest:
        data, where = self._raw_read_manifest_history(name, version)
        if data is None:
            raise SnapshotNotFoundError(f"history generation {version} of {name!r} not found")
        manifest = decode_manifest(data, where)
        if manifest.name != name or manifest.version != version:
            raise SnapshotCorruptError(
                f"{where}: holds version {manifest.version} of {manifest.name!r}, "
                f"expected version {version} of {name!r}"
            )
        return manifest

    def manifest_history(self, name: str) -> list[int]:
        """The versions of ``name``'s stored history generations, newest first (the newest is
        normally a copy of the current manifest)."""
        validate_key(name, "manifest name")
        versions = self._retry("read_manifest", name, lambda _: self._raw_manifest_history(name))
        return sorted(versions, reverse=True)

    def read_manifest_generation(self, name: str, version: int) -> Manifest:
        """History generation ``version`` of ``name``.

        Raises:
            SnapshotNotFoundError: no such generation. SnapshotCorruptError: it is damaged.
            StorageError.
        """
        validate_key(name, "manifest name")
        _check_int(version, "version")
        return self._retry(
            "read_manifest", f"{name}@{version}", lambda _: self._decode_generation(name, version)
        )

    def restore_manifest(self, name: str, manifest: Manifest) -> Manifest:
        """Store ``manifest`` (as is, version included) as ``name``'s current manifest, in place
        of a missing or damaged one: what ``Catalog.open`` commits after a recovery.

        Its version must be newer than every history generation, so versions keep growing; the
        history is pruned to the newest :data:`MANIFEST_HISTORY` generations afterwards.

        Raises:
            ValueError: bad name, a name mismatch, or a version not above the history's.
            ManifestConflictError: the current manifest is readable (nothing to restore).
            StorageError.
        """
        validate_key(name, "manifest name")
        if not isinstance(manifest, Manifest):
            raise TypeError(f"manifest must be a Manifest, got {type(manifest).__name__}")
        if manifest.name != name:
            raise ValueError(f"manifest of {manifest.name!r} restored under {name!r}")
        data = encode_manifest(manifest)

        def attempt(n: int) -> Manifest:
            with self._raw_manifest_guard(name):
                try:
                    current = self._decode_stored_manifest(name)
                except SnapshotCorruptError:
                    current = None
                if current is not None:
                    if n > 1 and current == manifest:
                        return manifest  # an earlier attempt landed; its reply was lost
                    if current.version != 0:
                        raise ManifestConflictError(
                            f"manifest {name!r} is readable (version {current.version}); "
                            "nothing to restore"
                        )
                newest = max(self._raw_manifest_history(name), default=0)
                if manifest.version <= newest and not (n > 1 and newest == manifest.version):
                    raise ValueError(
                        f"restored version {manifest.version} of {name!r} is not above its "
                        f"newest history generation {newest}"
                    )
                self._raw_write_manifest(name, data, manifest.version)
            return manifest

        restored = self._retry("commit_manifest", name, attempt)
        self._prune_history(name, restored.version, everything=True)
        return restored

    def _prune_history(self, name: str, version: int, *, everything: bool = False) -> None:
        """Drop history generations older than the newest :data:`MANIFEST_HISTORY` (best effort:
        a copy left behind is harmless, the next commit or restore prunes it)."""
        try:
            if everything:
                floor = version - MANIFEST_HISTORY
                old = [v for v in self._raw_manifest_history(name) if v <= floor]
            else:
                old = [version - MANIFEST_HISTORY] if version > MANIFEST_HISTORY else []
            for stale in old:
                self._raw_delete_manifest_history(name, stale)
        except OSError:
            pass

    def read_manifest(self, name: str) -> Manifest:
        """See :meth:`SnapshotStorage.read_manifest`."""
        validate_key(name, "manifest name")
        return self._retry("read_manifest", name, lambda _: self._decode_stored_manifest(name))

    def commit_manifest(self, name: str, manifest: Manifest) -> Manifest:
        """See :meth:`SnapshotStorage.commit_manifest`."""
        validate_key(name, "manifest name")
        if not isinstance(manifest, Manifest):
            raise TypeError(f"manifest must be a Manifest, got {type(manifest).__name__}")
        if manifest.name != name:
            raise ValueError(f"manifest of {manifest.name!r} committed under {name!r}")
        desired = replace(manifest, version=manifest.version + 1)
        data = encode_manifest(desired)

        def attempt(n: int) -> Manifest:
            with self._raw_manifest_guard(name):
                current = self._decode_stored_manifest(name)
                if current.version != manifest.version:
                    if n > 1 and current == desired:
                        return desired  # an earlier attempt committed; its reply was lost
                    raise ManifestConflictError(
                        f"manifest {name!r} is at version {current.version}; the commit "
                        f"expected version {manifest.version}"
                    )
                self._raw_write_manifest(name, data, desired.version)
            return desired

        committed = self._retry("commit_manifest", name, attempt)
        self._prune_history(name, committed.version)
        return committed

    def lock(self, name: str) -> LockHandle:
        """See :meth:`SnapshotStorage.lock`."""
        validate_key(name, "lock name")
        where, raw_release = self._retry("lock", name, lambda _: self._raw_lock(name))
        handle: LockHandle

        def release() -> None:
            with self._state_lock:
                self._held.discard(handle)
            raw_release()

        handle = LockHandle(name, where, release)
        with self._state_lock:
            self._held.add(handle)
        return handle

    def stats(self) -> dict[str, dict[str, int]]:
        """See :meth:`SnapshotStorage.stats`."""
        with self._state_lock:
            return {op: dict(counters) for op, counters in self._stats.items()}

    def close(self) -> None:
        """See :meth:`SnapshotStorage.close`."""
        with self._state_lock:
            if self._closed:
                return
            self._closed = True
            held = list(self._held)
            self._cache.clear()
        for handle in held:
            handle.release()
        self._raw_close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
