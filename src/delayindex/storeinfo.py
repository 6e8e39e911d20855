"""What a snapshot store holds, per name, as recovery would see it: ``delayindex inspect``.

:func:`inspect_store` builds a :class:`StoreInfo` from the storage protocol alone (no printing;
the CLI renders it). For each name it reads the manifest, then for each live bucket only the
snapshot's metadata (``get_metadata(id, check_bitmaps=False)``: the header and entry 0, never a
segment). From the metadata's per-segment maximum deliver times it derives what
:meth:`DelayIndex.open <delayindex.tracker.delay_index.DelayIndex.open>` would do at ``now_ms``:
segments whose every index is due at the cutoff (``now_ms + tick_ms``) are skipped, the *loaded
segment* is the first one that is not (:meth:`SnapshotMetadata.first_live_segment`), and the
bucket's *next delivery time* is that segment's minimum deliver time. A bucket with no such
segment is all due (recovery leaves its indexes to the dispatcher and deletes it).

It is read-only: it takes no lock and writes nothing, so it is safe on a store in use (a running
writer's next commit may of course change what it shows). Whether a writer holds a name is
detected without taking its lock: for :class:`~delayindex.storage.file.FileStorage`, by finding
the lock file's ``flock`` in Linux's ``/proc/locks`` (unknown elsewhere, and for other backends).

A shared index (a manifest with subscription records) also lists each subscription
(:class:`SubscriptionInfo`) with its mark and its *backlog*: the positions of the live buckets'
segments from the loaded one on (the bitmaps in the metadata, as recovery restores them) that
lie after the subscription's mark, i.e. what a reopened shared index would still deliver to it
from the snapshots (the writer's unpersisted indexes are not in them; unreadable buckets are not
counted). Offline, the backlog is the lag measure: the due-log lag (keys the topic has popped
that the subscription has not read yet) exists only in a running process's
``SharedDelayIndex.stats()["subscriptions"]``.

Errors are reported, not raised, wherever the rest of the report is still meaningful: a damaged
or unreadable manifest marks its name, a missing or unreadable snapshot marks its bucket, and
the walk goes on. Only failing to list the manifests raises.
"""

from __future__ import annotations

import os
from collections.abc import Collection
from dataclasses import dataclass, replace

import numpy as np

from delayindex.errors import SnapshotCorruptError, SnapshotNotFoundError, StorageError
from delayindex.snapshot.format import SnapshotMetadata
from delayindex.storage.base import SnapshotStorage
from delayindex.storage.file import FileStorage
from delayindex.storage.manifest import (
    Intent,
    Manifest,
    QuarantineRecord,
    WriterStatus,
    validate_key,
)

#: ``error_kind`` values: a damaged object or manifest, a missing snapshot, an I/O failure.
ERROR_KINDS: tuple[str, ...] = ("corrupt", "missing", "io")
_PROC_LOCKS = "/proc/locks"


@dataclass(frozen=True)
class StoredBucket:
    """One live bucket: the manifest's record plus what its metadata says at the cutoff.

    ``loaded_segment`` is the 1-based segment recovery would load (None: every index is due, or
    the metadata could not be read); ``next_delivery_ms`` its minimum deliver time;
    ``due_messages`` the indexes in the segments before it (skipped by recovery). ``below_mark``:
    the bucket lies wholly below the persisted mark-delete ledger (recovery trims it).
    """

    start_ledger: int
    end_ledger: int
    snapshot_id: str
    num_segments: int
    num_messages: int
    snapshot_bytes: int
    loaded_segment: int | None = None
    next_delivery_ms: int | None = None
    due_messages: int = 0
    below_mark: bool = False
    error: str = ""
    error_kind: str = ""

    @property
    def all_due(self) -> bool:
        """Readable, and every index is due at the cutoff."""
        return not self.error and self.loaded_segment is None


@dataclass(frozen=True)
class PendingIntent:
    """A pending intent or a dead letter, with the messages of a create's object if written."""

    kind: str
    snapshot_id: str
    start_ledger: int
    end_ledger: int
    replaces: tuple[str, ...]
    attempts: int
    next_attempt_ms: int
    last_error: str
    messages: int | None = None


@dataclass(frozen=True)
class LockState:
    """Whether a writer holds the name: ``held`` is None when it cannot be told."""

    held: bool | None
    pid: int | None = None


@dataclass(frozen=True)
class SubscriptionInfo:
    """One subscription of a shared index, seen offline (module docs): its mark and its
    ``backlog``, the positions of the live snapshots a reopen would deliver to it."""

    name: str
    mark_delete: tuple[int, int] | None
    backlog: int

    @property
    def lag(self) -> int:
        """Offline, the backlog (the due-log lag exists only in a running process)."""
        return self.backlog


@dataclass(frozen=True)
class NameInfo:
    """One name of the store."""

    name: str
    version: int = 0
    buckets: tuple[StoredBucket, ...] = ()
    intents: tuple[PendingIntent, ...] = ()
    dead_letters: tuple[PendingIntent, ...] = ()
    mark_delete: tuple[int, int] | None = None
    #: What the writer last reported as held only in memory (None in older manifests).
    writer_status: WriterStatus | None = None
    lock: LockState = LockState(None)
    error: str = ""
    error_kind: str = ""
    #: Buckets whose snapshot was found damaged or missing (active or resolved; objects kept).
    quarantined: tuple[QuarantineRecord, ...] = ()
    #: A shared index's subscriptions, sorted by name (empty for a per-subscription index).
    subscriptions: tuple[SubscriptionInfo, ...] = ()

    @property
    def messages(self) -> int:
        """Indexes in the live snapshots (as written; some may be delivered since)."""
        return sum(b.num_messages for b in self.buckets)

    @property
    def snapshot_bytes(self) -> int:
        """Bytes of the live snapshots."""
        return sum(b.snapshot_bytes for b in self.buckets)

    @property
    def being_written(self) -> int:
        """Indexes in objects of pending create intents (written, not yet live)."""
        return sum(i.messages or 0 for i in self.intents if i.kind == "create")

    @property
    def next_delivery_ms(self) -> int | None:
        """The earliest next delivery time over the buckets (None: no bucket has one)."""
        times = [b.next_delivery_ms for b in self.buckets if b.next_delivery_ms is not None]
        return min(times) if times else None

    def error_kinds(self) -> set[str]:
        """The kinds of every error in this name (manifest and buckets)."""
        kinds = {b.error_kind for b in self.buckets if b.error_kind}
        if self.error_kind:
            kinds.add(self.error_kind)
        return kinds


@dataclass(frozen=True)
class StoreInfo:
    """Every inspected name, at ``now_ms`` with cutoff ``now_ms + tick_ms``."""

    now_ms: int
    tick_ms: int
    names: tuple[NameInfo, ...]

    def problems(self) -> list[str]:
        """What an operator should look at: errors and dead letters (empty: all well)."""
        out = []
        for info in self.names:
            if info.error:
                out.append(f"{info.name}: {info.error}")
            out.extend(f"{info.name}: {b.error}" for b in info.buckets if b.error)
            if info.dead_letters:
                out.append(f"{info.name}: {len(info.dead_letters)} dead letters")
            out.extend(
                f"{info.name}: bucket [{q.start_ledger}, {q.end_ledger}] ({q.snapshot_id}) is "
                f"quarantined, {q.num_messages} messages wait: {q.reason}"
                for q in info.quarantined
                if q.active
            )
        return out


def lock_state(storage: SnapshotStorage, name: str) -> LockState:
    """Whether a writer holds ``name``'s lock, found without taking it.

    FileStorage on Linux: the lock file's ``flock`` in ``/proc/locks`` (device and inode), and
    the holder's pid, which it writes into the lock file. Anything else: unknown.

    Raises:
        ValueError, TypeError: bad ``name``.
    """
    validate_key(name, "name")
    if not isinstance(storage, FileStorage):
        return LockState(None)
    path = storage.lock_path(name)
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return LockState(False)  # never locked: lock files are never deleted
    except OSError:
        return LockState(None)
    try:
        with open(_PROC_LOCKS, encoding="ascii", errors="replace") as f:
            table = f.read()
    except OSError:
        return LockState(None)
    key = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    for line in table.splitlines():
        fields = [f for f in line.split() if f != "->"]  # "->": a waiter, same columns
        if len(fields) >= 6 and fields[1] == "FLOCK" and fields[5] == key:
            return LockState(True, _holder_pid(path, fields[4]))
    return LockState(False)


def _holder_pid(path: os.PathLike[str], proc_pid: str) -> int | None:
    """The pid the holder wrote into the lock file, else the one /proc/locks shows."""
    try:
        with open(path, "rb") as f:
            text = f.read(32).decode(errors="replace").strip()
    except OSError:
        text = ""
    for candidate in (text, proc_pid):
        if candidate.isdigit() and int(candidate) > 0:
            return int(candidate)
    return None


def _intent(intent: Intent, messages: int | None = None) -> PendingIntent:
    return PendingIntent(
        intent.kind,
        intent.snapshot_id,
        intent.start_ledger,
        intent.end_ledger,
        intent.replaces,
        intent.attempts,
        intent.next_attempt_ms,
        intent.last_error,
        messages,
    )


def _error_kind(exc: Exception) -> str:
    if isinstance(exc, SnapshotNotFoundError):
        return "missing"
    if isinstance(exc, SnapshotCorruptError):
        return "corrupt"
    return "io"


def _backlogs(
    metadata: SnapshotMetadata, first: int, marks: list[tuple[int, int] | None]
) -> list[int]:
    """Positions of segments ``first..`` after each mark (from the metadata's bitmaps)."""
    ids, offsets, entries = metadata.ledger_entries(first)
    out = []
    for mark in marks:
        if mark is None:
            out.append(len(entries))
            continue
        i = int(np.searchsorted(ids, mark[0]))  # the first ledger at or after the mark's
        count = len(entries) - int(offsets[i])
        if i < len(ids) and int(ids[i]) == mark[0]:
            own = entries[int(offsets[i]) : int(offsets[i + 1])]
            count -= int(np.searchsorted(own, mark[1], side="right"))
        out.append(count)
    return out


def _bucket(
    storage: SnapshotStorage,
    manifest: Manifest,
    index: int,
    cutoff: int,
    backlog: list[int] | None = None,
) -> StoredBucket:
    """One live bucket's report; with ``backlog`` (one counter per subscription, in the
    manifest's order), add the positions each subscription would still receive from it."""
    record = manifest.buckets[index]
    below = manifest.mark_delete is not None and record.end_ledger < manifest.mark_delete[0]
    bucket = StoredBucket(
        record.start_ledger,
        record.end_ledger,
        record.snapshot_id,
        record.num_segments,
        record.num_messages,
        record.snapshot_bytes,
        below_mark=below,
    )
    try:
        metadata = storage.get_metadata(record.snapshot_id, check_bitmaps=False)
    except (SnapshotNotFoundError, SnapshotCorruptError, StorageError) as exc:
        kind = _error_kind(exc)
        what = "missing" if kind == "missing" else "unreadable"
        return replace(bucket, error=f"snapshot {what}: {exc}", error_kind=kind)
    first = metadata.first_live_segment(cutoff)
    if first is None:
        due = metadata.num_messages
        next_ms = None
    else:
        due = int(metadata.counts[: first - 1].sum())
        next_ms = int(metadata.mins[first - 1])
        if backlog is not None:
            marks = [sub.mark_delete for sub in manifest.subscriptions]
            for k, count in enumerate(_backlogs(metadata, first, marks)):
                backlog[k] += count
    return replace(bucket, loaded_segment=first, next_delivery_ms=next_ms, due_messages=due)


def _create_messages(storage: SnapshotStorage, snapshot_id: str) -> int | None:
    """Messages in a pending create's object; None while it is not written (or unreadable)."""
    try:
        return storage.get_metadata(snapshot_id, check_bitmaps=False).num_messages
    except (SnapshotNotFoundError, SnapshotCorruptError, StorageError):
        return None


def inspect_name(storage: SnapshotStorage, name: str, *, now_ms: int, tick_ms: int = 0) -> NameInfo:
    """The report of one name (see the module docs); errors are recorded in it, not raised.

    Raises:
        TypeError, ValueError: bad ``name``, ``now_ms`` or ``tick_ms``.
    """
    for what, value in (("now_ms", now_ms), ("tick_ms", tick_ms)):
        if type(value) is not int:
            raise TypeError(f"{what} must be an int, got {type(value).__name__}")
    if tick_ms < 0:
        raise ValueError(f"tick_ms must be >= 0, got {tick_ms}")
    lock = lock_state(storage, name)  # validates the name before any I/O
    try:
        manifest = storage.read_manifest(name)
    except (SnapshotCorruptError, StorageError) as exc:
        kind = _error_kind(exc)
        return NameInfo(name, lock=lock, error=f"manifest {kind}: {exc}", error_kind=kind)
    cutoff = now_ms + tick_ms
    backlog = [0] * len(manifest.subscriptions) if manifest.subscriptions else None
    buckets = tuple(
        _bucket(storage, manifest, i, cutoff, backlog) for i in range(len(manifest.buckets))
    )
    return NameInfo(
        name=name,
        version=manifest.version,
        buckets=buckets,
        intents=tuple(
            _intent(i, _create_messages(storage, i.snapshot_id) if i.kind == "create" else None)
            for i in manifest.intents
        ),
        dead_letters=tuple(_intent(d) for d in manifest.dead_letters),
        mark_delete=manifest.mark_delete,
        writer_status=manifest.writer_status,
        lock=lock,
        quarantined=manifest.quarantined,
        subscriptions=tuple(
            SubscriptionInfo(sub.name, sub.mark_delete, count)
            for sub, count in zip(manifest.subscriptions, backlog or (), strict=True)
        ),
    )


def inspect_store(
    storage: SnapshotStorage,
    *,
    now_ms: int,
    tick_ms: int = 0,
    names: Collection[str] | None = None,
) -> StoreInfo:
    """Inspect every name with a manifest (or only ``names``, in the order given).

    Raises:
        StorageError: the manifests could not be listed.
        TypeError, ValueError: bad arguments.
    """
    chosen = storage.list_manifests() if names is None else list(names)
    return StoreInfo(
        now_ms,
        tick_ms,
        tuple(inspect_name(storage, n, now_ms=now_ms, tick_ms=tick_ms) for n in chosen),
    )


__all__ = [
    "ERROR_KINDS",
    "LockState",
    "NameInfo",
    "PendingIntent",
    "StoreInfo",
    "StoredBucket",
    "SubscriptionInfo",
    "inspect_name",
    "inspect_store",
    "lock_state",
]
