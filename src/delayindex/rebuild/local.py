"""The local rebuild: a dump in, a published index out, in this process (the reference path).

How it works: :func:`rebuild_local` checks and classifies the dump
(:mod:`delayindex.rebuild.tracked`), plans buckets from the per-ledger tracked counts
(:func:`~delayindex.rebuild.plan.plan_for`), groups the tracked rows by bucket, and runs the
offline skeleton (:class:`~delayindex.rebuild.run.RebuildRun`) with a build step that builds
and writes each bucket in turn. The Spark job runs the same skeleton with a distributed step.

Invariants: the dump's arrays are never changed; bad input raises before the store is touched;
a re-run yields the same ranges and snapshot contents (only the random keys differ).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from contextlib import closing

import numpy as np
import numpy.typing as npt

from delayindex.config import TrackerConfig
from delayindex.rebuild.build import build_bucket, write_bucket
from delayindex.rebuild.plan import plan_for
from delayindex.rebuild.run import RebuildReport, RebuildRun, Reservation
from delayindex.rebuild.shared import Subscriptions, acknowledged
from delayindex.rebuild.tracked import (
    Int64Array,
    PositionColumns,
    _check_positions,
    _classify,
    _columns,
    check_arguments,
)
from delayindex.storage.base import SnapshotStorage
from delayindex.storage.manifest import BucketRecord

#: ``progress(phase, done, total)``; :func:`rebuild_local` reports phase ``"buckets"``.
Progress = Callable[[str, int, int], None]


def _group_by_bucket(
    ledgers: Int64Array, ranges: Sequence[tuple[int, int]]
) -> tuple[npt.NDArray[np.intp], Int64Array]:
    """Row order grouping rows by bucket, and each bucket's slice bounds in that order."""
    starts = np.array([s for s, _ in ranges], dtype=np.int64)
    which = np.searchsorted(starts, ledgers, side="right") - 1
    order = np.argsort(which, kind="stable")
    bounds = np.searchsorted(which[order], np.arange(len(ranges) + 1))
    return order, bounds.astype(np.int64)


def rebuild_local(
    columns: PositionColumns,
    storage: SnapshotStorage,
    name: str,
    config: TrackerConfig,
    *,
    now_ms: int,
    mark_delete: tuple[int, int] | None = None,
    progress: Progress | None = None,
    subscriptions: Subscriptions | None = None,
) -> RebuildReport:
    """Rebuild index ``name`` in ``storage`` from a dump, in this process (the reference path).

    Mask, plan, then the two-phase write (:mod:`delayindex.rebuild.run`): reserve every range in
    one commit, build and write each bucket, publish all of them in one commit that replaces
    whatever the name held and records ``mark_delete``. The result opens with
    :meth:`DelayIndex.open` as the index an online tracker would have built from the same
    messages at ``now_ms``.

    With ``subscriptions`` it builds a shared index instead (open it with
    :meth:`SharedDelayIndex.open`): the rows after the *lowest* subscription mark, published
    with every subscription's record (:func:`~delayindex.rebuild.shared.acknowledged`).

    Args:
        columns: the dump (``DumpColumns``); positions must be distinct.
        storage: where the index lives.
        name: the index name; its writer lock is held for the whole rebuild.
        config: tracker settings (cutoff, bucket size, segment limits, ``max_num_buckets``).
        now_ms: the time the rebuilt index is as of (epoch ms).
        mark_delete: the cursor's mark-delete position, or None.
        subscriptions: a shared index's subscriptions, name -> mark-delete position (None:
            nothing acknowledged); not with ``mark_delete``.
        progress: ``progress("buckets", done, total)`` after each bucket is written.

    Raises:
        TypeError, ValueError: bad arguments or a position found twice (nothing changed).
        StoreLockedError: another writer holds ``name``.
        StorageError, ManifestConflictError: the store failed; the reservations were rolled back
            (or, if that failed too, are left for the next open): the old buckets stay live.
    """
    started = time.perf_counter()
    ack = acknowledged(mark_delete, subscriptions)
    config, now, mark = check_arguments(name, config, now_ms, ack.mark_delete)
    if progress is not None and not callable(progress):
        raise TypeError("progress must be callable")
    ledgers, entries, times = _columns(columns)
    _check_positions(ledgers, entries)
    seen = _classify(ledgers, entries, times, now, config, mark)
    t, lg, en = times[seen.mask], ledgers[seen.mask], entries[seen.mask]
    unique, counts = np.unique(lg, return_counts=True)
    plan = plan_for(unique, counts, config)
    order, bounds = _group_by_bucket(lg, plan.ranges)

    def build(reservation: Reservation) -> list[BucketRecord]:
        records: list[BucketRecord] = []
        for k, bucket in enumerate(reservation.buckets):
            rows = order[bounds[k] : bounds[k + 1]]
            # Positions were checked distinct above: skip build_snapshot's second check.
            metadata, segments = build_bucket(
                t[rows], lg[rows], en[rows], bucket.start, bucket.end, config, validate=False
            )
            records.append(
                write_bucket(storage, bucket.key, metadata, segments, origin=reservation.origin)
            )
            if progress is not None:
                progress("buckets", k + 1, len(reservation.buckets))
        return records

    with closing(RebuildRun(storage, name, config)) as run:
        run.publish(plan, ack, build)
    return run.report(RebuildReport, now_ms=now, tally=seen.tally(), started=started)
