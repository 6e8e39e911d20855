"""Migration of per-subscription indexes to one shared index (PIP-195's "Compatibility").

How it works. Before the shared index, each subscription of a topic had its own
:class:`~delayindex.DelayIndex` (its *old index*). :func:`build_shared` builds the shared index
that replaces them, through the offline rebuild, and verifies it; it never touches an old index
(clearing them, once the result is verified, is the caller's: ``delayindex migrate`` opens each
and calls ``clear()``, since offline tools do not import the tracker):

1. **Read** (:func:`read_old_index`), under each old index's writer lock, held until the
   verify is done (so no dispatcher changes an old index meanwhile; a running one makes
   :class:`~delayindex.errors.StoreLockedError`): the manifest's mark-delete position becomes
   the subscription's mark. Without a dump, every live snapshot is decoded in full and its
   positions after that mark are kept with their stored deliver times. An old index whose
   positions cannot all be read (an active quarantine, a missing or damaged snapshot) or that
   is itself a shared index is refused (:class:`MigrationError`): repair it, or migrate from a
   topic dump.
2. **Source**: the topic dump when one is given; else the union of the old indexes' positions
   (:func:`union_positions`: one message is in several old indexes; a position stored with two
   deliver times keeps the later one, so no subscription receives it early, and is counted as
   a conflict). The shared index gives each subscription the source's rows after its own mark,
   so every position an old index held after its mark is kept.
3. **Build**: :func:`~delayindex.rebuild.rebuild_local` with ``subscriptions`` (the rebuild
   path: the topic keeps the rows after the lowest mark, the records carry every mark).
4. **Verify**: :func:`~delayindex.rebuild.verify_store` with the same source and
   subscriptions, per subscription. Orphans elsewhere in the store are reported but do not fail
   the migration; every other finding does (:attr:`MigrationReport.ok`).

Invariants: nothing here writes to an old index; the shared index's name must be new, empty,
or hold a previous migration of the same subscriptions (a re-run after a failed verify).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from delayindex.config import TrackerConfig
from delayindex.errors import SnapshotCorruptError, SnapshotNotFoundError
from delayindex.rebuild.local import rebuild_local
from delayindex.rebuild.run import RebuildReport
from delayindex.rebuild.tracked import Int64Array, PositionColumns, after_mark, cutoff_for
from delayindex.rebuild.verify import Finding, VerifyReport, verify_store
from delayindex.storage.base import SnapshotStorage
from delayindex.storage.manifest import Manifest, validate_key

#: ``progress(phase, done, total)``: phases ``read NAME`` (an old index's buckets), ``build``
#: (the new buckets) and ``verify`` (0 or 1 of 1).
Progress = Callable[[str, int, int], None]


class MigrationError(Exception):
    """A migration that cannot be done as asked (nothing was changed)."""


@dataclass(frozen=True)
class Columns:
    """Positions as the rebuild reads them (a ``PositionColumns``)."""

    ledger_ids: Int64Array
    entry_ids: Int64Array
    deliver_at: Int64Array

    def __len__(self) -> int:
        return len(self.ledger_ids)


@dataclass(frozen=True)
class OldIndex:
    """One subscription's old index: its name, its mark, what it holds after the mark.

    ``positions`` (None when a dump is the source) are the live snapshots' positions after the
    mark with their stored deliver times, ``due`` how many of them are due at the build's
    cutoff (not tracked: a dispatcher delivers them directly); ``buckets`` and
    ``snapshot_bytes`` describe its live buckets; ``version`` is its manifest's version when
    read.
    """

    subscription: str
    name: str
    mark_delete: tuple[int, int] | None
    version: int
    buckets: int
    snapshot_bytes: int
    positions: Columns | None = None
    due: int = 0

    @property
    def pending(self) -> int | None:
        """Positions after the mark not yet due (None when a dump is the source)."""
        return None if self.positions is None else len(self.positions) - self.due

    def as_dict(self) -> dict[str, Any]:
        """Plain data (JSON-ready), positions counted."""
        return {
            "subscription": self.subscription,
            "index": self.name,
            "mark_delete": list(self.mark_delete) if self.mark_delete else None,
            "version": self.version,
            "buckets": self.buckets,
            "snapshot_bytes": self.snapshot_bytes,
            "positions": None if self.positions is None else len(self.positions),
            "due": self.due,
            "pending": self.pending,
        }


@dataclass(frozen=True)
class MigrationReport:
    """What :func:`build_shared` did: the old indexes read, the source's ``conflicts``, the
    build and its verify. ``ok`` when verify found nothing but orphans elsewhere in the store
    (listed in ``notes``)."""

    topic: str
    now_ms: int
    old: tuple[OldIndex, ...]
    build: RebuildReport
    verify: VerifyReport
    conflicts: int = 0
    notes: tuple[str, ...] = field(default=())

    @property
    def blocking(self) -> tuple[Finding, ...]:
        """The verify findings that fail the migration (all but orphans)."""
        return tuple(f for f in self.verify.findings if f.kind != "orphan")

    @property
    def ok(self) -> bool:
        """Whether the shared index is verified: the old ones may be cleared."""
        return not self.blocking

    def as_dict(self) -> dict[str, Any]:
        """Plain data (JSON-ready)."""
        return {
            "topic": self.topic,
            "now_ms": self.now_ms,
            "old": [o.as_dict() for o in self.old],
            "conflicts": self.conflicts,
            "build": self.build.as_dict(),
            "verify": self.verify.as_dict(),
            "notes": list(self.notes),
            "ok": self.ok,
        }


@contextlib.contextmanager
def holding(storage: SnapshotStorage, names: Sequence[str]) -> Iterator[None]:
    """Hold the writer locks of ``names`` (a running writer raises ``StoreLockedError``)."""
    with contextlib.ExitStack() as stack:
        for name in names:
            handle = storage.lock(name)
            stack.callback(handle.release)
        yield


def read_old_index(
    storage: SnapshotStorage,
    subscription: str,
    name: str,
    *,
    positions: bool,
    progress: Progress | None = None,
) -> OldIndex:
    """Read one old index (module docs, step 1): its mark and, with ``positions``, every live
    snapshot's positions after the mark. Takes no lock (see :func:`holding`).

    Raises:
        MigrationError: no such index, a shared index, an active quarantine, a missing or
            damaged snapshot (with ``positions``).
        StorageError: the manifest or a snapshot could not be read.
    """
    if name not in storage.list_manifests():
        raise MigrationError(f"no index named {name!r} (subscription {subscription!r})")
    try:
        manifest = storage.read_manifest(name)
    except SnapshotCorruptError as exc:
        raise MigrationError(f"{name}: the manifest is damaged ({exc}); open it to repair") from exc
    if manifest.subscriptions:
        raise MigrationError(f"{name} is a shared index already, not a subscription's index")
    held = _live_positions(storage, manifest, progress) if positions else None
    return OldIndex(
        subscription,
        name,
        manifest.mark_delete,
        manifest.version,
        len(manifest.buckets),
        sum(b.snapshot_bytes for b in manifest.buckets),
        held,
    )


def _live_positions(
    storage: SnapshotStorage, manifest: Manifest, progress: Progress | None
) -> Columns:
    """Every live snapshot's positions after the manifest's mark, with their deliver times."""
    name = manifest.name
    active = [q for q in manifest.quarantined if q.active]
    if active:
        ranges = ", ".join(f"[{q.start_ledger}, {q.end_ledger}]" for q in active)
        raise MigrationError(
            f"{name} has quarantined buckets ({ranges}) whose positions cannot be read: "
            "repair them (delayindex repair) or migrate from a topic dump (--dump)"
        )
    parts: list[tuple[Int64Array, Int64Array, Int64Array]] = []
    for k, bucket in enumerate(manifest.buckets):
        sid = bucket.snapshot_id
        try:
            metadata = storage.get_metadata(sid, check_bitmaps=True)
            parts.append(storage.get_segment_arrays(sid, 1, max(metadata.num_segments, 1)))
        except (SnapshotNotFoundError, SnapshotCorruptError) as exc:
            raise MigrationError(
                f"{name}: snapshot {sid!r} cannot be read ({exc}); repair the index or "
                "migrate from a topic dump (--dump)"
            ) from exc
        if progress is not None:
            progress(f"read {name}", k + 1, len(manifest.buckets))
    if not parts:
        return Columns(*(np.empty(0, dtype=np.int64) for _ in range(3)))
    times, ledgers, entries = (np.concatenate(column) for column in zip(*parts, strict=True))
    keep = after_mark(ledgers, entries, manifest.mark_delete)
    return Columns(ledgers[keep], entries[keep], times[keep])


def union_positions(old: Sequence[OldIndex]) -> tuple[Columns, int]:
    """The union of the old indexes' positions in position order, and how many positions had
    different deliver times in two of them (each keeps its latest one: never early).

    Raises:
        ValueError: an old index was read without its positions.
    """
    held = [o.positions for o in old]
    if any(p is None for p in held):
        raise ValueError("every old index must be read with its positions")
    none = np.empty(0, dtype=np.int64)
    ledgers = np.concatenate([none, *(p.ledger_ids for p in held if p is not None)])
    entries = np.concatenate([none, *(p.entry_ids for p in held if p is not None)])
    times = np.concatenate([none, *(p.deliver_at for p in held if p is not None)])
    order = np.lexsort((-times, entries, ledgers))  # the latest time first in each position
    ledgers, entries, times = ledgers[order], entries[order], times[order]
    first = np.ones(len(ledgers), dtype=np.bool_)
    first[1:] = (ledgers[1:] != ledgers[:-1]) | (entries[1:] != entries[:-1])
    groups = np.cumsum(first) - 1
    lowest = np.full(int(first.sum()), np.iinfo(np.int64).max, dtype=np.int64)
    np.minimum.at(lowest, groups, times)
    conflicts = int(np.count_nonzero(lowest != times[first]))
    return Columns(ledgers[first], entries[first], times[first]), conflicts


def _with_due(old: OldIndex, cutoff: int) -> OldIndex:
    if old.positions is None:
        return old
    return replace(old, due=int(np.count_nonzero(old.positions.deliver_at <= cutoff)))


def check_topic(storage: SnapshotStorage, topic: str, subscriptions: Sequence[str]) -> None:
    """Refuse a shared index name that holds something else than a previous migration of
    these subscriptions (the rebuild would replace it).

    Raises:
        MigrationError: it holds buckets, intents, a mark, other subscriptions, quarantined
            buckets, or its writer last reported indexes held only in memory (an index in use).
        StorageError, SnapshotCorruptError: its manifest could not be read.
    """
    if topic not in storage.list_manifests():
        return
    manifest = storage.read_manifest(topic)
    names = [s.name for s in manifest.subscriptions]
    if names == sorted(subscriptions):
        return  # a previous migration of the same subscriptions: replaced by this one
    status = manifest.writer_status
    in_use = status is not None and (status.unpersisted or status.memory_mode_buckets)
    if (
        manifest.buckets or manifest.intents or manifest.mark_delete is not None or names
        or manifest.quarantined or in_use
    ):  # fmt: skip
        raise MigrationError(
            f"{topic} already holds an index (subscriptions: {', '.join(names) or 'none'}): "
            f"the shared index needs a new name (or `delayindex clear` it first)"
        )


def build_shared(
    storage: SnapshotStorage,
    topic: str,
    sources: Mapping[str, str],
    config: TrackerConfig,
    *,
    now_ms: int,
    dump: PositionColumns | None = None,
    progress: Progress | None = None,
) -> MigrationReport:
    """Build and verify shared index ``topic`` from per-subscription indexes (module docs).

    Args:
        storage: the store holding the old indexes; the shared index is written there.
        topic: the shared index's name.
        sources: subscription name -> its old index's name.
        config: tracker settings of the build (cutoff, bucket size, segment limits).
        now_ms: the time the shared index is as of.
        dump: the topic dump to build from; None: the old indexes' live snapshots.
        progress: ``progress(phase, done, total)``.

    Raises:
        MigrationError: refused before anything was written (module docs).
        StoreLockedError: an old index (or ``topic``) has a running writer.
        StorageError, ManifestConflictError: the build failed (rolled back; old indexes
            untouched).
        TypeError, ValueError: bad arguments.
    """
    validate_key(topic, "shared index name")
    if not sources:
        raise MigrationError("no subscription to migrate")
    names = list(sources.values())
    for name in names:
        validate_key(name, "index name")
    if len(set(names)) != len(names):
        raise MigrationError("each subscription needs its own old index")
    if topic in names:
        raise MigrationError(f"{topic} is one of the old indexes: choose a new name")
    known = set(storage.list_manifests())
    for sub, name in sorted(sources.items()):
        if name not in known:  # before any lock: no lock file for a name that does not exist
            raise MigrationError(f"no index named {name!r} (subscription {sub!r})")
    check_topic(storage, topic, list(sources))
    with holding(storage, names):
        cutoff = cutoff_for(now_ms, config)
        old = tuple(
            _with_due(
                read_old_index(storage, sub, name, positions=dump is None, progress=progress),
                cutoff,
            )
            for sub, name in sorted(sources.items())
        )
        conflicts = 0
        columns: PositionColumns
        if dump is None:
            columns, conflicts = union_positions(old)
        else:
            columns = dump
        marks = {o.subscription: o.mark_delete for o in old}

        def built_bucket(_: str, done: int, total: int) -> None:
            if progress is not None:
                progress("build", done, total)

        built = rebuild_local(
            columns, storage, topic, config, now_ms=now_ms, subscriptions=marks,
            progress=built_bucket,
        )  # fmt: skip
        if progress is not None:
            progress("verify", 0, 1)
        checked = verify_store(storage, topic, columns, config, now_ms=now_ms, subscriptions=marks)
        if progress is not None:
            progress("verify", 1, 1)
    notes = []
    orphans = sum(1 for f in checked.findings if f.kind == "orphan")
    if orphans:
        notes.append(f"{orphans} orphans in the store (not this migration's; `delayindex gc`)")
    if conflicts:
        notes.append(
            f"{conflicts} positions had different deliver times in two old indexes; each "
            "keeps its latest (never early)"
        )
    return MigrationReport(topic, now_ms, old, built, checked, conflicts, tuple(notes))


__all__ = [
    "Columns",
    "MigrationError",
    "MigrationReport",
    "OldIndex",
    "Progress",
    "build_shared",
    "check_topic",
    "holding",
    "read_old_index",
    "union_positions",
]
