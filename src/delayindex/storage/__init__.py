"""Snapshot storage: the ``SnapshotStorage`` protocol, two backends and the two-phase catalog.

* :class:`SnapshotStorage` (``base``): immutable snapshot objects addressed by id, one manifest
  per name (compare-and-swap), a writer lock per name, retries and statistics.
* :class:`MemoryStorage` (``memory``): in-process, keeps encoded bytes, fault injection.
* :class:`FileStorage` (``file``): the embedded default, a local directory.
* :class:`Catalog` (``catalog``): the two-phase create/delete protocol for one name and the
  repair that :meth:`Catalog.open` runs after a crash.
* :class:`Manifest`, :class:`BucketRecord`, :class:`Intent`, :class:`WriterStatus`
  (``manifest``): what a manifest holds.

See docs/storage.md.
"""

from delayindex.errors import (
    ManifestConflictError,
    SnapshotCorruptError,
    SnapshotExistsError,
    SnapshotNotFoundError,
    StorageError,
    StoreLockedError,
)
from delayindex.storage.base import (
    MAX_ATTEMPTS,
    BaseStorage,
    LockHandle,
    ObjectInfo,
    SnapshotStorage,
)
from delayindex.storage.catalog import Catalog, RepairReport, RetryReport
from delayindex.storage.file import FileStorage
from delayindex.storage.manifest import (
    KEY_PATTERN,
    BucketRecord,
    Intent,
    Manifest,
    WriterStatus,
    decode_manifest,
    encode_manifest,
    validate_key,
)
from delayindex.storage.memory import InjectedIOError, MemoryStorage

__all__ = [
    "KEY_PATTERN",
    "MAX_ATTEMPTS",
    "BaseStorage",
    "BucketRecord",
    "Catalog",
    "FileStorage",
    "InjectedIOError",
    "Intent",
    "LockHandle",
    "Manifest",
    "ManifestConflictError",
    "MemoryStorage",
    "ObjectInfo",
    "RepairReport",
    "RetryReport",
    "SnapshotCorruptError",
    "SnapshotExistsError",
    "SnapshotNotFoundError",
    "SnapshotStorage",
    "StorageError",
    "StoreLockedError",
    "WriterStatus",
    "decode_manifest",
    "encode_manifest",
    "validate_key",
]
