"""The exceptions the library raises on purpose. All derive from :class:`DelayIndexError`."""

from __future__ import annotations


class DelayIndexError(Exception):
    """Base class of every error that delayindex raises on purpose."""


class TrackerClosedError(DelayIndexError):
    """A tracker was used after :meth:`close`."""


class SnapshotCorruptError(DelayIndexError):
    """A stored snapshot failed its checksum or could not be decoded; the message names it."""


class StorageError(DelayIndexError):
    """A storage operation failed after its retries."""


class RecoveryError(DelayIndexError):
    """``DelayIndex.open`` could not recover the index; nothing was deleted."""


class SnapshotNotFoundError(DelayIndexError):
    """The snapshot object does not exist; the message names it. Never retried.

    Deliberately *not* a :class:`StorageError`: a missing object is a definite answer, not an I/O
    failure, so a handler that retries or downgrades on ``StorageError`` must not swallow it
    (Pulsar keeps ``BucketNotExistException`` apart from its retryable persistence error too).
    """


class SnapshotExistsError(StorageError):
    """A snapshot was created under an id that is already taken (objects are never overwritten)."""


class CommitOutcomeUnknownError(StorageError):
    """A manifest commit failed, and so did every re-read that would tell whether it landed.

    The change may be durable or not. The catalog re-reads the manifest before its next change
    (:meth:`~delayindex.storage.catalog.Catalog.resync`); ``snapshot_ids`` names the objects
    whose fate the commit decided.
    """

    def __init__(self, message: str, snapshot_ids: tuple[str, ...] = ()) -> None:
        super().__init__(message)
        self.snapshot_ids = snapshot_ids


class ManifestConflictError(DelayIndexError):
    """A manifest commit lost its compare-and-swap: the stored version is not the expected one."""


class StoreLockedError(DelayIndexError):
    """Another writer holds the lock of this name; the message names the name and the lock."""
