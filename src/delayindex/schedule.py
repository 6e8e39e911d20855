"""The pending schedule of a stored index, read offline: ``delayindex inspect --schedule`` and
``delayindex pending``.

:func:`read_schedule` computes, from the storage protocol alone, the positions a
:meth:`DelayIndex.open <delayindex.tracker.delay_index.DelayIndex.open>` (or
``SharedDelayIndex.open``) at ``now_ms`` would track with a known deliver time, applying the
same rules recovery applies:

* the live buckets of the manifest (overlapping ranges resolved by
  :func:`~delayindex.policy.resolve_overlaps`), except those wholly below the mark-delete
  ledger (recovery trims them);
* per bucket, the segments from the first one not wholly due at the cutoff (``now_ms +
  tick_ms``, :func:`~delayindex.policy.cutoff_ms`) on; the earlier segments are skipped by
  recovery and left to the dispatcher's replay (counted in ``due_skipped``, not listed);
* positions after the persisted mark-delete position;
* the manifest's overrides (``Manifest.overrides``): cancelled positions are dropped; a
  rescheduled position takes its new time, or is dropped (counted in ``moved_due``) when the
  new time is due at the cutoff, since the reopen's ``reschedule`` untracks it for delivery.

What it cannot show, and says so: the writer's memory-only indexes (the mutable bucket, direct
adds, buckets whose write failed; ``writer_status`` is what the writer last reported) are not
in storage; an active quarantined bucket's positions are tracked but their times are lost
(``quarantined``), as in a running index's browse; a bucket whose snapshot cannot be read is
reported in ``errors`` and not counted. For a shared index the schedule is its topic index's
(the held keys of a running one, its due log and private copies, live only in memory).

It is read-only: no lock is taken and nothing is written, so it is safe on a store in use. A
running writer may commit meanwhile; if a snapshot disappears under the read, the manifest is
read again and the schedule recomputed (a few times), so the result is one manifest
version's. The selection and bin counting are the trackers' own rules (``delayindex._browse``):
:meth:`StoredSchedule.pending` and :meth:`StoredSchedule.due_histogram` answer exactly what a
reopened index's ``pending`` and ``due_histogram`` would, before its dispatcher replays.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from delayindex._browse import bin_counts, histogram_edges, select_pending, time_range
from delayindex.errors import SnapshotCorruptError, SnapshotNotFoundError, StorageError
from delayindex.model import Position
from delayindex.policy import cutoff_ms, resolve_overlaps
from delayindex.storage.base import SnapshotStorage
from delayindex.storage.manifest import Manifest, WriterStatus, validate_key

Int64Array = npt.NDArray[np.int64]
#: Reads of the manifest before a snapshot that went missing is reported as missing.
_ATTEMPTS = 3

__all__ = ["BucketError", "StoredSchedule", "read_schedule"]


@dataclass(frozen=True)
class BucketError:
    """A live bucket whose snapshot could not be read (its positions are not counted).

    ``kind``: ``missing``, ``corrupt`` or ``io`` (as ``delayindex.storeinfo``'s error kinds).
    """

    snapshot_id: str
    start_ledger: int
    end_ledger: int
    kind: str
    error: str


def _empty() -> Int64Array:
    return np.empty(0, dtype=np.int64)


@dataclass(frozen=True)
class StoredSchedule:
    """The positions a reopen at ``now_ms`` would track with a known time (module docs).

    ``times``, ``ledgers`` and ``entries`` are parallel int64 arrays sorted by ``(deliver_at,
    ledger, entry)``.
    """

    name: str
    manifest_version: int
    now_ms: int
    cutoff_ms: int
    mark_delete: tuple[int, int] | None
    shared: bool
    times: Int64Array = field(default_factory=_empty)
    ledgers: Int64Array = field(default_factory=_empty)
    entries: Int64Array = field(default_factory=_empty)
    #: Indexes in segments wholly due at the cutoff (left to the dispatcher's replay).
    due_skipped: int = 0
    #: Stored positions rescheduled to a time due at the cutoff (a reopen delivers them).
    moved_due: int = 0
    #: Messages of active quarantined buckets: tracked, their times lost, not listed.
    quarantined: int = 0
    #: What the writer last reported as held only in memory (None: never reported).
    writer_status: WriterStatus | None = None
    errors: tuple[BucketError, ...] = ()

    def __len__(self) -> int:
        return len(self.times)

    @property
    def span(self) -> tuple[int, int] | None:
        """``(earliest, latest)`` deliver time, or None when nothing is pending."""
        if not len(self.times):
            return None
        return int(self.times[0]), int(self.times[-1])

    def pending(
        self, start_ms: int | None = None, end_ms: int | None = None, limit: int = 1000
    ) -> list[tuple[int, Position]]:
        """Up to ``limit`` positions with ``start_ms <= deliver_at < end_ms`` (None: unbounded)
        in ``(deliver_at, position)`` order, as the trackers' ``pending``.

        Raises:
            TypeError: a bound or ``limit`` is not an int. ValueError: a bound beyond int64.
        """
        bounds = time_range(start_ms, end_ms)
        if bounds is None:
            select_pending(_empty(), _empty(), _empty(), limit)  # checks limit
            return []
        lo, hi = self._slice(*bounds)
        return select_pending(self.times[lo:hi], self.ledgers[lo:hi], self.entries[lo:hi], limit)

    def due_histogram(self, edges: object) -> npt.NDArray[np.int64]:
        """Exact count of positions per ``[edges[i], edges[i+1])``, as the trackers'
        ``due_histogram``.

        Raises:
            TypeError: an edge is not an integer. ValueError: fewer than two edges, not
            strictly increasing, or beyond int64.
        """
        bins = histogram_edges(edges)
        lo, hi = self._slice(int(bins[0]), int(bins[-1]) - 1)
        return bin_counts(bins, self.times[lo:hi])

    def _slice(self, first: int, last: int) -> tuple[int, int]:
        """The index range of times in ``[first, last]`` (the arrays are time-sorted)."""
        lo = int(np.searchsorted(self.times, first, side="left"))
        hi = int(np.searchsorted(self.times, last, side="right"))
        return lo, max(lo, hi)


def _error_kind(exc: Exception) -> str:
    if isinstance(exc, SnapshotNotFoundError):
        return "missing"
    if isinstance(exc, SnapshotCorruptError):
        return "corrupt"
    return "io"


def _after_mark(
    ledgers: Int64Array, entries: Int64Array, mark: tuple[int, int] | None
) -> npt.NDArray[np.bool_]:
    if mark is None:
        return np.ones(len(ledgers), dtype=bool)
    after: npt.NDArray[np.bool_] = (ledgers > mark[0]) | (
        (ledgers == mark[0]) & (entries > mark[1])
    )
    return after


def _members(
    ledgers: Int64Array, entries: Int64Array, set_ledgers: Int64Array, set_entries: Int64Array
) -> npt.NDArray[np.bool_]:
    """Which ``(ledgers[i], entries[i])`` are in the set (grouped per ledger: the overrides
    come per ledger, so few groups)."""
    out = np.zeros(len(ledgers), dtype=bool)
    for ledger in np.unique(set_ledgers).tolist():
        rows = ledgers == ledger
        if rows.any():
            out[rows] = np.isin(entries[rows], set_entries[set_ledgers == ledger])
    return out


def _compute(
    storage: SnapshotStorage,
    name: str,
    manifest: Manifest,
    now_ms: int,
    cutoff: int,
    *,
    missing_ok: bool,
) -> StoredSchedule:
    """One pass over ``manifest``. A missing snapshot raises SnapshotNotFoundError unless
    ``missing_ok`` (then it is reported like a damaged one): the caller first checks whether
    the manifest moved on."""
    mark = manifest.mark_delete
    records, _ = resolve_overlaps(list(manifest.buckets))
    parts: list[tuple[Int64Array, Int64Array, Int64Array]] = []
    errors: list[BucketError] = []
    due_skipped = 0
    for record in records:
        if mark is not None and record.end_ledger < mark[0]:
            continue  # trimmed by recovery
        try:
            metadata = storage.get_metadata(record.snapshot_id, check_bitmaps=False)
            first = metadata.first_live_segment(cutoff)
            if first is None:
                due_skipped += metadata.num_messages
                continue
            due_skipped += int(metadata.counts[: first - 1].sum())
            parts.append(
                storage.get_segment_arrays(record.snapshot_id, first, metadata.num_segments)
            )
        except SnapshotNotFoundError as exc:
            if not missing_ok:
                raise
            errors.append(
                BucketError(
                    record.snapshot_id, record.start_ledger, record.end_ledger, "missing",
                    str(exc),
                )
            )  # fmt: skip
        except (SnapshotCorruptError, StorageError) as exc:
            errors.append(
                BucketError(
                    record.snapshot_id,
                    record.start_ledger,
                    record.end_ledger,
                    _error_kind(exc),
                    str(exc),
                )
            )
    if parts:
        times, ledgers, entries = (np.concatenate(c) for c in zip(*parts, strict=True))
    else:
        times, ledgers, entries = _empty(), _empty(), _empty()
    keep = _after_mark(ledgers, entries, mark)
    cancelled_l, cancelled_e, moved_l, moved_e, moved_t = manifest.overrides.to_arrays()
    if len(cancelled_l):
        keep &= ~_members(ledgers, entries, cancelled_l, cancelled_e)
    times, ledgers, entries = times[keep], ledgers[keep], entries[keep]
    moved_due = 0
    if len(moved_l):
        times = times.copy()
        new_time = {
            (lg, en): t
            for lg, en, t in zip(moved_l.tolist(), moved_e.tolist(), moved_t.tolist(), strict=True)
        }
        drop = np.zeros(len(times), dtype=bool)
        for i in np.flatnonzero(_members(ledgers, entries, moved_l, moved_e)).tolist():
            t = new_time[int(ledgers[i]), int(entries[i])]
            if t <= cutoff:
                drop[i] = True  # the reopen's reschedule finds it due: untracked, delivered
                moved_due += 1
            else:
                times[i] = t
        times, ledgers, entries = times[~drop], ledgers[~drop], entries[~drop]
    order = np.lexsort((entries, ledgers, times))
    return StoredSchedule(
        name=name,
        manifest_version=manifest.version,
        now_ms=now_ms,
        cutoff_ms=cutoff,
        mark_delete=mark,
        shared=bool(manifest.subscriptions),
        times=np.ascontiguousarray(times[order]),
        ledgers=np.ascontiguousarray(ledgers[order]),
        entries=np.ascontiguousarray(entries[order]),
        due_skipped=due_skipped,
        moved_due=moved_due,
        quarantined=sum(q.num_messages for q in manifest.quarantined if q.active),
        writer_status=manifest.writer_status,
        errors=tuple(errors),
    )


def read_schedule(
    storage: SnapshotStorage, name: str, *, now_ms: int, tick_ms: int = 0
) -> StoredSchedule:
    """The pending schedule of index ``name`` as a reopen at ``now_ms`` would track it
    (module docs). Read-only; takes no lock.

    Args:
        storage: the store.
        name: a DelayIndex's or a SharedDelayIndex's name.
        now_ms: the time of the reopen (epoch ms): segments wholly due at ``now_ms + tick_ms``
            are skipped, as recovery skips them.
        tick_ms: the writer's tick (0: strict).

    Raises:
        TypeError, ValueError: bad arguments.
        SnapshotCorruptError, StorageError: the manifest could not be read (a snapshot that
            cannot be read is reported in ``errors`` instead).
    """
    validate_key(name, "name")
    for what, value in (("now_ms", now_ms), ("tick_ms", tick_ms)):
        if type(value) is not int:
            raise TypeError(f"{what} must be an int, got {type(value).__name__}")
    if tick_ms < 0:
        raise ValueError(f"tick_ms must be >= 0, got {tick_ms}")
    cutoff = cutoff_ms(now_ms, tick_ms, False)
    manifest = storage.read_manifest(name)
    for _ in range(_ATTEMPTS - 1):
        try:
            return _compute(storage, name, manifest, now_ms, cutoff, missing_ok=False)
        except SnapshotNotFoundError:
            latest = storage.read_manifest(name)
            if latest.version == manifest.version:
                break  # really missing: reported below
            manifest = latest  # the writer moved on (a merge or a delete): read again
    return _compute(storage, name, manifest, now_ms, cutoff, missing_ok=True)
