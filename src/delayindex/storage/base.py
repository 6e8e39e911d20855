"""The snapshot storage contract and the machinery both backends share.

:class:`SnapshotStorage` is the protocol a tracker writes its sealed buckets through (Pulsar's
``BucketSnapshotStorage``, §2.4 of the notes, plus a per-name manifest and a writer lock).
:class:`BaseStorage` implements it once on top of a handful of raw primitives that a backend
provides (``_raw_put``, ``_raw_source``, ``_raw_delete``, ...), so that validation, retries,
statistics, the object read path and manifest compare-and-swap behave identically in
:class:`~delayindex.storage.memory.MemoryStorage` and :class:`~delayindex.storage.file.FileStorage`.

:class:`BaseStorage` is assembled from three layers, one module each:

* ``_base_raw``: the raw primitives a backend implements, the retry loop (:data:`MAX_ATTEMPTS`
  attempts while ``OSError`` is raised, then ``StorageError``) and the statistics;
* ``_base_objects``: creating, reading (header, entries, a metadata LRU validated by the stored
  object's fingerprint) and deleting snapshot objects;
* ``_base_manifests``: manifest compare-and-swap and the :data:`MANIFEST_HISTORY` history
  generations that ``Catalog.open``'s recovery, ``delayindex gc`` and ``delayindex fsck`` use.

This module adds the writer locks and ``close``, and re-exports the layers' public names.

Invariants: objects are immutable once created (never overwritten; a new version is a new id);
a reader never sees a partial object or manifest; ids and names match
:data:`~delayindex.storage.manifest.KEY_PATTERN`, so they are safe file names; a closed storage
refuses every call and holds no lock.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from types import TracebackType
from typing import Protocol, Self, runtime_checkable

from delayindex.snapshot.format import Segment, SnapshotMetadata
from delayindex.storage._base_manifests import MANIFEST_HISTORY, ManifestsMixin
from delayindex.storage._base_objects import Int64Array, ObjectsMixin
from delayindex.storage._base_raw import (
    MAX_ATTEMPTS,
    OPS,
    STAT_FIELDS,
    ObjectInfo,
    ObjectSource,
    run_with_retries,
)
from delayindex.storage._readahead import ReadAhead
from delayindex.storage.manifest import Manifest, validate_key

#: Segment ranges a read-ahead queues at most (more hints are dropped): a tracker hints one
#: range per bucket, and a bucket bound of 50 leaves room for several rounds.
READAHEAD_MAX_PENDING = 256


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

    def get_segment_runs(
        self, snapshot_id: str, runs: Sequence[tuple[int, int]]
    ) -> tuple[Int64Array, Int64Array, Int64Array]:
        """Several ranges ``(first, last)`` of segments in one call (one open of the object):
        the concatenation of :meth:`get_segment_arrays` of each range, in the given order;
        all ranges are validated before anything is read."""
        ...

    def get_segment_times(
        self,
        snapshot_id: str,
        runs: Sequence[tuple[int, int]],
        mins: Int64Array,
        maxs: Int64Array,
        counts: Int64Array,
    ) -> Int64Array:
        """The deliver times only of several ranges of segments, in one call, without reading
        or decoding the metadata: the caller passes the snapshot's per-segment ``mins``,
        ``maxs`` and ``counts`` (one element per segment, as its metadata says; a bucket keeps
        them). The same clamping, validation and errors as :meth:`get_segment_runs`; each
        segment's times in its position order, range after range. For a histogram, whose
        positions do not matter: no metadata is decoded or cached for it.

        Raises:
            ValueError: a bad range, or columns of different lengths.
            SnapshotNotFoundError, StorageError.
            SnapshotCorruptError: a damaged entry, or columns that do not match the object's
                number of segments.
        """
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


class BaseStorage(ObjectsMixin, ManifestsMixin):
    """The backend-independent half of :class:`SnapshotStorage` (see the module docstring).

    Subclasses implement the ``_raw_*`` primitives of
    :class:`~delayindex.storage._base_raw.RawStorage`; each is one attempt of an operation and
    signals transient failure by raising ``OSError``. ``_fault_point`` is a test seam that
    :class:`~delayindex.storage.memory.MemoryStorage` uses for fault injection.
    """

    def __init__(self, *, metadata_cache_size: int = 128, readahead_bytes: int = 0) -> None:
        if metadata_cache_size < 0:
            raise ValueError("metadata_cache_size must be >= 0")
        if isinstance(readahead_bytes, bool) or not isinstance(readahead_bytes, int):
            kind = type(readahead_bytes).__name__
            raise TypeError(f"readahead_bytes must be an int, not {kind}")
        if readahead_bytes < 0:
            raise ValueError(f"readahead_bytes must be >= 0 (0: off), got {readahead_bytes}")
        super().__init__()
        self._cache = OrderedDict()
        self._headers = OrderedDict()
        self._cache_size = metadata_cache_size
        self._held: set[LockHandle] = set()
        self._readahead = (
            ReadAhead(self._read_ahead, readahead_bytes, READAHEAD_MAX_PENDING)
            if readahead_bytes
            else None
        )

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
        if self._readahead is not None:
            self._readahead.close()
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


__all__ = [
    "MANIFEST_HISTORY",
    "MAX_ATTEMPTS",
    "OPS",
    "STAT_FIELDS",
    "BaseStorage",
    "Int64Array",
    "LockHandle",
    "ObjectInfo",
    "ObjectSource",
    "SnapshotStorage",
    "run_with_retries",
]
