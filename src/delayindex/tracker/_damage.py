"""Fault isolation for DelayIndex: the problem log, quarantine, release and repair.

A bucket whose snapshot is found damaged (a checksum or decode failure) or missing, at open or
when a segment is read, is *quarantined*: its segment source leaves the k-way merge, so every
other bucket keeps delivering in time order, while its positions stay tracked wherever they
are still known (``contains``, dedup and ``len()`` count them) and are not delivered. Its ledger
range stays registered, so a dispatcher's replay re-adds what the damage lost into the direct
heap (shadowing any copy the bucket might still hold). The manifest moves the bucket out of
the live set into its quarantine list in one commit; the damaged object is never deleted.

An operator then either *repairs* the bucket from a topic dump (the rows of its range are
rebuilt into a new snapshot with the online sealing rule and made live in one commit that
marks the quarantine record ``repaired``), or *releases* it: its still-tracked positions become
due now (at-least-once) and are delivered from memory. A mark-delete past the bucket resolves
it as ``acknowledged``; ``clear()`` as ``cleared``.

Invariants: a quarantined bucket has no segment source and keeps its range registered; a
released one has a source whose times are the release time; neither is ever merged, retired or
deleted; every quarantine and resolution reaches the manifest (retried with backoff when a
commit fails), :meth:`DelayIndex.stats`, the log (once per distinct problem) and ``inspect``.
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict, deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from delayindex._ints import int64_array
from delayindex.config import TrackerConfig
from delayindex.errors import (
    ManifestConflictError,
    SnapshotCorruptError,
    SnapshotNotFoundError,
    StorageError,
)
from delayindex.model import MAX_LEDGER_ID
from delayindex.snapshot.format import PreparedSegments, SnapshotMetadata
from delayindex.storage.base import SnapshotStorage
from delayindex.storage.catalog import Catalog
from delayindex.storage.manifest import QuarantineRecord

_log = logging.getLogger("delayindex.tracker")
#: Distinct problems remembered for de-duplication (oldest forgotten first).
_MAX_PROBLEM_KEYS = 1000


class ProblemLog:
    """Warnings, each logged and kept once per distinct problem, not once per occurrence.

    ``append(message, key=None)`` records a problem (``key`` defaults to the message); while
    the key is active, repeats are dropped, not logged again. ``resolve(key)`` ends a problem,
    so a later recurrence is reported afresh. Iterating yields the newest 100 messages.
    """

    def __init__(self, owner: str, maxlen: int = 100) -> None:
        self._owner = owner
        self._messages: deque[str] = deque(maxlen=maxlen)
        self._active: OrderedDict[str, None] = OrderedDict()  # active keys, oldest first

    def append(self, message: str, key: str | None = None) -> None:
        """Record ``message`` unless its problem is already active."""
        key = message if key is None else key
        if key in self._active:
            return
        self._active[key] = None
        while len(self._active) > _MAX_PROBLEM_KEYS:
            self._active.popitem(last=False)
        self._messages.append(message)
        _log.warning("%s: %s", self._owner, message)

    def resolve(self, key: str) -> None:
        """The problem ``key`` is over (a recurrence is reported again)."""
        self._active.pop(key, None)

    def __iter__(self) -> Iterator[str]:
        return iter(self._messages)

    def __len__(self) -> int:
        return len(self._messages)


@dataclass(frozen=True)
class QuarantineInfo:
    """One quarantined bucket, as :meth:`DelayIndex.quarantined` reports it.

    ``num_messages`` counts the positions whose delivery times were lost (still tracked when
    ``positions_known``; otherwise the damage lost them too, and the dispatcher's replay of
    ``[start_ledger, end_ledger]`` re-adds them). ``reason`` says what was found and what to do.
    """

    snapshot_id: str
    start_ledger: int
    end_ledger: int
    num_messages: int
    reason: str
    positions_known: bool
    found_ms: int
    first_segment: int


@dataclass(frozen=True)
class RepairResult:
    """What :meth:`DelayIndex.repair_quarantined` did for one bucket."""

    damaged_snapshot_id: str
    snapshot_id: str
    start_ledger: int
    end_ledger: int
    num_messages: int
    dump_rows: int


def damage_reason(exc: BaseException) -> str:
    """The text a quarantine record keeps: what was found, and what the operator can do."""
    what = "missing" if isinstance(exc, SnapshotNotFoundError) else "damaged"
    return (
        f"snapshot {what}: {exc}"[:700]
        + "; repair it from a topic dump (delayindex repair) or release its positions "
        "(release_quarantined); the object is kept"
    )


class QuarantineMixin:
    """DelayIndex's quarantine, release and repair (state lives on the DelayIndex)."""

    _lock: threading.Lock
    _core: Any
    _buckets: dict[int, Any]
    _catalog: Catalog
    _storage: SnapshotStorage
    _config: TrackerConfig
    _warnings: ProblemLog
    _closed: bool
    _epoch: int
    _mark: tuple[int, int] | None
    _on_ready: Callable[[], object] | None
    _pending_quarantine: list[tuple[QuarantineRecord, str]]
    _quarantine_job_queued: bool
    _quarantine_failures: int
    _name: str

    # Provided by DelayIndex.
    _now: Callable[[], int]
    _check_open: Callable[[], None]
    _queue: Callable[[Callable[[], None]], None]
    _submit_queued: Callable[[], None]
    _restore_source: Callable[[int], None]
    _new_bucket: Callable[[int, int, int], Any]
    _drop_bucket: Callable[..., None]
    _make_durable: Callable[[Any, Any, SnapshotMetadata], None]
    _build: Callable[..., tuple[SnapshotMetadata, PreparedSegments]]
    _defer_at: Callable[[int], int]
    _rearm: Callable[[int], None]

    # -- finding damage (lock held) ---------------------------------------------------------------

    def _quarantined_positions(self, record: QuarantineRecord) -> Any:
        """At open: the positions of an active quarantine record's segments from
        ``first_segment`` on, if its metadata is still readable (else None)."""
        try:
            metadata = self._storage.get_metadata(record.snapshot_id, check_bitmaps=False)
            if record.first_segment > metadata.num_segments:
                return None
            ids, offsets, entries = metadata.ledger_entries(record.first_segment)
        except (SnapshotCorruptError, SnapshotNotFoundError, StorageError, ValueError):
            return None
        return ids, offsets, entries

    def _install_quarantined(self, record: QuarantineRecord, live: Any) -> None:
        """Register a quarantined bucket found at open (``live``: its positions, or None)."""
        if live is not None:
            self._core.restore_many(*live)
        bucket = self._new_bucket(record.start_ledger, record.end_ledger, record.num_messages)
        bucket.state = "quarantined"
        bucket.snapshot_id = record.snapshot_id
        bucket.current = record.first_segment - 1
        bucket.damage = record
        bucket.positions_known = live is not None
        # Its folded cancels are unreadable: the range stays evicted, so a replayed add of an
        # untracked position there raises instead of bringing back a cancelled message.
        bucket.folded = record.folded_cancels
        self._core.add_range(record.start_ledger, record.end_ledger)
        self._warn_quarantined(record)

    def _quarantine(
        self, bucket: Any, exc: BaseException, first_segment: int, *, positions_known: bool = True
    ) -> None:
        """Quarantine a bucket whose snapshot turned out damaged while running (lock held).

        Its positions stay tracked: restored from its metadata at open, unless the damage was
        found when they were to be restored (``positions_known=False``, a deferred restore)."""
        self._restore_source(bucket.sid)  # if lazy: its positions stay tracked, in the core
        if bucket.state in ("quarantined", "released"):
            return
        self._core.remove_source(bucket.sid)  # out of the merge; its positions stay tracked
        held = int(bucket.bounds[-1]) - (
            bucket.indexes_before(first_segment)
        ) if len(bucket.bounds) else bucket.num_messages  # fmt: skip
        record = QuarantineRecord(
            bucket.snapshot_id, bucket.start, bucket.end, max(held, 0), first_segment,
            damage_reason(exc), max(self._now(), 0), folded_cancels=bucket.folded,
        )  # fmt: skip
        bucket.state = "quarantined"
        bucket.damage = record
        bucket.positions_known = positions_known
        bucket.current = first_segment - 1
        self._warn_quarantined(record)
        self._note_quarantine(record, "active")

    def _warn_quarantined(self, record: QuarantineRecord) -> None:
        self._warnings.append(
            f"bucket [{record.start_ledger}, {record.end_ledger}] ({record.snapshot_id!r}) is "
            f"quarantined: {record.reason}",
            key=f"quarantine:{record.snapshot_id}",
        )

    def _note_quarantine(self, record: QuarantineRecord, state: str) -> None:
        """Queue a quarantine (``active``) or a resolution for the manifest (lock held)."""
        self._pending_quarantine.append((record, state))
        if not self._quarantine_job_queued:
            self._quarantine_job_queued = True
            self._queue(self._quarantine_job)

    def _quarantine_job(self) -> None:
        """Commit the queued quarantines and resolutions; on failure retry after a backoff."""
        with self._lock:
            changes, self._pending_quarantine = self._pending_quarantine, []
            self._quarantine_job_queued = False
        try:
            for record, state in changes:
                if state == "active":
                    self._catalog.quarantine_buckets([record])
                else:
                    self._catalog.resolve_quarantine([record.snapshot_id], state)
        except (StorageError, ManifestConflictError) as exc:
            with self._lock:
                done = changes.index((record, state))
                self._pending_quarantine[:0] = changes[done:]
                self._quarantine_failures += 1
                self._defer_at(self._quarantine_failures)
                self._warnings.append(
                    f"recording a quarantine in the manifest failed (retried later): {exc}",
                    key="quarantine-commit",
                )
            return
        with self._lock:
            self._quarantine_failures = 0
            self._warnings.resolve("quarantine-commit")

    def _retry_quarantine_commits(self) -> None:
        """Queue the quarantine job again after its backoff (lock held)."""
        if self._pending_quarantine and not self._quarantine_job_queued:
            self._quarantine_job_queued = True
            self._queue(self._quarantine_job)

    def _forget_quarantined(self, bucket: Any, state: str) -> None:
        """A quarantined bucket is resolved without a repair (lock held)."""
        record = bucket.damage
        self._warnings.resolve(f"quarantine:{bucket.snapshot_id}")
        if record is not None and bucket.state == "quarantined":
            self._note_quarantine(record, state)

    # -- public API -------------------------------------------------------------------------------

    def quarantined(self) -> list[QuarantineInfo]:
        """One record per quarantined bucket, in ledger order (see :class:`QuarantineInfo`).

        Their positions are not delivered until :meth:`repair_quarantined` or
        :meth:`release_quarantined`; every other bucket keeps delivering.
        """
        with self._lock:
            out = []
            for bucket in sorted(self._buckets.values(), key=lambda b: b.start):
                if bucket.state != "quarantined":
                    continue
                record = bucket.damage
                known = bucket.positions_known
                held = len(self._core.tracked_in_range(bucket.start, bucket.end)[0])
                out.append(
                    QuarantineInfo(
                        record.snapshot_id, record.start_ledger, record.end_ledger,
                        held if known else record.num_messages, record.reason, known,
                        record.found_ms, record.first_segment,
                    )
                )  # fmt: skip
            return out

    def release_quarantined(self, snapshot_id: str | None = None) -> int:
        """Give up on the lost delivery times of one (or every) quarantined bucket.

        Its still-tracked positions become due now (at-least-once: deliver them), the damaged
        object is kept for the operator, and the manifest records the release. Positions the
        damage lost are not known here: the dispatcher's replay of the bucket's ledger range
        re-adds them. Returns how many positions were released.

        Raises:
            ValueError: ``snapshot_id`` is not a quarantined bucket (nothing changed).
            TrackerClosedError: the index is closed.
        """
        with self._lock:
            self._check_open()
            targets = [
                b for b in self._buckets.values()
                if b.state == "quarantined" and snapshot_id in (None, b.snapshot_id)
            ]  # fmt: skip
            if snapshot_id is not None and not targets:
                raise ValueError(f"{snapshot_id!r} is not a quarantined bucket of {self._name!r}")
            now = self._now()
            released = 0
            for bucket in targets:
                ledgers, entries = self._core.tracked_in_range(bucket.start, bucket.end)
                self._forget_quarantined(bucket, "released")
                bucket.state = "released"
                if bucket.folded:  # given up with the times: replayed adds there are taken
                    self._warnings.append(
                        f"bucket [{bucket.start}, {bucket.end}] released: the {bucket.folded} "
                        "cancels folded into it are lost; a replayed add of one is tracked"
                    )
                    bucket.folded = 0
                times = np.full(len(ledgers), now, dtype=np.int64)
                self._core.set_source(bucket.sid, times, ledgers, entries, -1)
                released += len(ledgers)
            for sid in self._core.take_exhausted():
                bucket = self._buckets.get(sid)
                if bucket is not None and bucket.state == "released":
                    self._drop_bucket(bucket)
            self._rearm(now)
        self._submit_queued()
        if released and self._on_ready is not None:
            self._on_ready()  # due now: a dispatcher waiting for its timer must hear of it
        return released

    def repair_quarantined(
        self, columns: Any, snapshot_id: str | None = None
    ) -> list[RepairResult]:
        """Rebuild one (or every) quarantined bucket from a topic dump of its ledger range.

        ``columns`` is a dump (``DumpColumns``, a ``Workload``, or anything with int64
        ``ledger_ids``, ``entry_ids`` and ``deliver_at``). Where the bucket's positions are
        still known, exactly those are rebuilt with the dump's delivery times (the dump must
        hold every one of them); where the damage lost them, the dump's rows of the range that
        an ``add`` now would track (delayed, not due, after the mark-delete, not already
        tracked) are. The new snapshot is cut by the online sealing rule and made live in one
        commit that marks the quarantine record ``repaired``; the damaged object is kept.

        Raises:
            ValueError: bad columns, an unknown ``snapshot_id``, or a dump that lacks positions
                of the bucket (nothing changed).
            StorageError, ManifestConflictError: writing failed; the bucket stays quarantined.
            TrackerClosedError: the index is closed.
        """
        ledgers_all, entries_all, times_all = _dump_columns(columns)
        with self._lock:
            self._check_open()
            targets = [
                b for b in sorted(self._buckets.values(), key=lambda b: b.start)
                if b.state == "quarantined" and snapshot_id in (None, b.snapshot_id)
            ]  # fmt: skip
            if snapshot_id is not None and not targets:
                raise ValueError(f"{snapshot_id!r} is not a quarantined bucket of {self._name!r}")
            plans = [self._repair_rows(b, ledgers_all, entries_all, times_all) for b in targets]
        results = []
        for bucket, (times, ledgers, entries, rows) in zip(targets, plans, strict=True):
            results.append(self._repair_one(bucket, times, ledgers, entries, rows))
        self._submit_queued()
        return [r for r in results if r is not None]

    # -- repair internals -------------------------------------------------------------------------

    def _repair_rows(
        self, bucket: Any, ledgers: Any, entries: Any, times: Any
    ) -> tuple[Any, Any, Any, int]:
        """The dump rows a repair of ``bucket`` writes (lock held); raises ValueError when the
        dump lacks positions the bucket still tracks."""
        in_range = (ledgers >= bucket.start) & (ledgers <= bucket.end)
        lg, en, tm = ledgers[in_range], entries[in_range], times[in_range]
        if bucket.positions_known:
            held_l, held_e = self._core.tracked_in_range(bucket.start, bucket.end)
            # The positions are known: rebuild exactly those, with the dump's times.
            held = set(zip(held_l.tolist(), held_e.tolist(), strict=True))
            keep = np.fromiter(
                ((a, b) in held for a, b in zip(lg.tolist(), en.tolist(), strict=True)),
                dtype=np.bool_, count=len(lg),
            )  # fmt: skip
            if int(keep.sum()) != len(held):
                raise ValueError(
                    f"the dump holds {int(keep.sum())} of the {len(held)} positions quarantined "
                    f"in [{bucket.start}, {bucket.end}] (is it the whole topic, with no "
                    "duplicate positions?); nothing was changed"
                )
            return np.maximum(tm[keep], 0), lg[keep], en[keep], int(in_range.sum())
        # Lost with the metadata: what an add would track now.
        cutoff = self._core.cutoff_for(self._now())
        keep = (tm > cutoff) & ~self._core.tracked_mask(lg, en)
        if self._mark is not None:
            ml, me = self._mark
            keep &= (lg > ml) | ((lg == ml) & (en > me))
        return tm[keep], lg[keep], en[keep], int(in_range.sum())

    def _repair_one(
        self, bucket: Any, times: Any, ledgers: Any, entries: Any, rows: int
    ) -> RepairResult | None:
        """Write and install one repaired bucket (no lock held while writing)."""
        damaged_id = bucket.snapshot_id
        epoch = self._epoch
        if len(times) == 0:
            with self._lock:
                if bucket.state == "quarantined" and self._buckets.get(bucket.sid) is bucket:
                    self._forget_quarantined(bucket, "released")  # nothing left to deliver
                    self._drop_bucket(bucket)
            return RepairResult(damaged_id, "", bucket.start, bucket.end, 0, rows)
        metadata, segments = self._build(times, ledgers, entries, bucket.start, bucket.end)
        record = self._catalog.repair_bucket(damaged_id, metadata, segments)
        with self._lock:
            self._warnings.resolve(f"quarantine:{damaged_id}")
            if (
                self._closed
                or epoch != self._epoch
                or bucket.state != "quarantined"
                or self._buckets.get(bucket.sid) is not bucket
            ):
                return RepairResult(
                    damaged_id, record.snapshot_id, bucket.start, bucket.end, 0, rows
                )
            self._drop_bucket(bucket, keep_range=True)
            known = self._core.tracked_mask(ledgers, entries)
            if not known.all():
                self._core.restore_many(*metadata.ledger_entries(1))
            repaired = self._new_bucket(record.start_ledger, record.end_ledger, 0)
            self._make_durable(repaired, record, metadata)
            empty = np.empty(0, dtype=np.int64)
            # Nothing in memory: a placeholder for segment 1, read when it comes due.
            self._core.set_source(repaired.sid, empty, empty, empty, repaired.next_time(0))
            self._rearm(self._now())
        return RepairResult(
            damaged_id, record.snapshot_id, record.start_ledger, record.end_ledger,
            record.num_messages, rows,
        )  # fmt: skip


def _dump_columns(columns: Any) -> tuple[Any, Any, Any]:
    """The int64 ``ledger_ids``, ``entry_ids`` and ``deliver_at`` of a dump, checked."""
    names = ("ledger_ids", "entry_ids", "deliver_at")
    try:
        raw = [getattr(columns, name) for name in names]
    except AttributeError:
        raise TypeError(
            "columns must have ledger_ids, entry_ids and deliver_at (a DumpColumns or Workload)"
        ) from None
    ledgers, entries, times = (int64_array(v, n) for v, n in zip(raw, names, strict=True))
    if not len(ledgers) == len(entries) == len(times):
        raise ValueError("the dump's columns differ in length")
    if len(ledgers) and (
        int(ledgers.min()) < 0 or int(ledgers.max()) > MAX_LEDGER_ID
        or int(entries.min()) < 0 or int(entries.max()) > 0xFFFFFFFF
    ):  # fmt: skip
        raise ValueError("the dump holds a position out of range")
    return ledgers, entries, times


__all__ = [
    "ProblemLog",
    "QuarantineInfo",
    "QuarantineMixin",
    "RepairResult",
    "damage_reason",
]
