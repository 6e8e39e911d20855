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
