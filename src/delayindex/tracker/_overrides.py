"""DelayIndex's cancel and reschedule: the core's overrides, made durable (a mixin).

How it works. ``BucketCore`` does the work: ``cancel`` untracks a position (its copies, in
memory or in segments still on disk, are skipped when they come up) and records it in a
compact bitmap of *cancel overrides*; ``reschedule`` untracks it the way a due re-add does and
tracks it again at the new time (a sealed-range position goes to the direct heap, its segment
copy shadowed), recording a *reschedule override*. A later ``add`` of a cancelled position is
refused and one of a rescheduled position takes the new time: that is what makes both survive
the dispatcher's replay after a restart. ``set_mark_delete`` forgets the overrides it passes.

Durability. The overrides travel in the manifest (``Manifest.overrides``), noted like the
mark-delete position: a cancel only sets ``_overrides_dirty`` (O(1)); the overrides are copied
into the catalog before each seal (whose commit carries them), on ``set_mark_delete``, and by
``flush()`` and ``close()``, which commit them. So a cancel is durable once ``flush()`` returns
(or the next seal's commit lands). At open, :meth:`_restore_overrides` re-applies them after
the mark: tracked positions are cancelled or rescheduled again, and the rest are only recorded
(the dispatcher's replay will meet them).

Eviction. Once a commit carries them (``flush()``, and at open), the cancels of sealed ranges
leave the core's memory (``BucketCore.evict_cancels``): the catalog's copy of the overrides
(packed, about a fifth of the core's bitmaps) is then their only one, so cancelling half of
10 M messages costs about 0.2 B/msg resident instead of 0.6. Adds reach a sealed range only
through a replay (or a non-monotonic producer); one of an untracked position there makes the
core answer ``ADD_NEED_OVERRIDES``, and :meth:`_restore_evicted` hands back the record's
cancels of that bucket's ledgers (:meth:`_restore_span`; the other ranges stay evicted) before
the add is made again. Each later note is the core's cancels plus the record's
evicted ones, so the manifest always carries them all; joining them means decoding the record
(about 0.3 s for 5 M cancels), so with evicted cancels a note is made outside the lock
(:meth:`_note_overrides_unlocked`, by the persist job before its commit and by ``flush()``),
never on the add path: a seal leaves it to its persist job. The core's
``override_gen`` makes eviction safe against a cancel made between the note and the end of its
commit: nothing is evicted if the set changed meanwhile.

Folding. A merge moves the cancels of its ledger range into the merged snapshot
(``folded_cancels``, snapshot format 3): :meth:`_fold_for_merge` takes them (the core's, the
record's and the sources' folded ones, less the rescheduled positions) with the core's
``override_gen``; once the merged bucket is live, :meth:`_folded` evicts the range
(``BucketCore.evict_range``) and, if the gen did not move, drops the core's copies and has the
next note drop the record's (``_fold_pending``). If it moved, both keep theirs: a folded set is
then a duplicate, never the only copy of a newer state. Truth is therefore the record's cancels
plus every live bucket's folded ones, less the positions with a move (a reschedule after a fold
wins; ``restore_evicted`` skips moved positions). :meth:`_restore_evicted` reads the span's
folded sets back; a bucket whose set cannot be read keeps its range evicted and adds there
raise. A folded bucket deleted above the mark (:meth:`_unfold`, from ``_retire``; at open, a
wholly due one) first hands its cancels back to memory, so the delete's commit carries them in
the manifest.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from delayindex._cancelset import pack_cancelled, union_unique
from delayindex._ranges import LedgerRanges
from delayindex.errors import SnapshotCorruptError, SnapshotNotFoundError, StorageError
from delayindex.model import ADD_DELIVER, ADD_NEED_OVERRIDES, ADD_SEAL_FIRST
from delayindex.storage._overrides import Overrides
from delayindex.tracker.in_memory import _diagnose, as_int64_array


def _joined(
    ledgers: npt.NDArray[np.int64],
    entries: npt.NDArray[np.int64],
    moved: Any,
    record: Overrides,
    evicted: list[tuple[int, int]],
    mark: tuple[int, int] | None,
    folded: list[tuple[int, int]] = [],  # noqa: B006 (never mutated)
) -> tuple[Overrides, int]:
    """The overrides to note: a core's cancels (``ledgers``, ``entries``) and ``moved``, plus
    the cancels of ``record`` (the catalog's current copy) that lie in the ``evicted`` ranges,
    outside the ``folded`` ones (a merge folded them into its bucket since the record was
    made) and above ``mark``; and how many of those there were."""
    if not evicted:
        return Overrides.from_arrays(ledgers, entries, moved), 0
    stored_ledgers, stored_entries, *_ = record.to_arrays()
    ranges = LedgerRanges()
    for start, end in evicted:
        ranges.add(start, end)
    keep = ranges.mask(stored_ledgers)
    if folded:
        done = LedgerRanges()
        for start, end in folded:
            done.add(start, end)
        keep &= ~done.mask(stored_ledgers)
    if mark is not None:
        keep &= (stored_ledgers > mark[0]) | (
            (stored_ledgers == mark[0]) & (stored_entries > mark[1])
        )
    kept_ledgers, kept_entries = stored_ledgers[keep], stored_entries[keep]
    # Overlapping: a range evicted without dropping (a fold racing a cancel, or at open)
    # keeps its cancels in the core as well.
    ledgers, entries = union_unique(ledgers, entries, kept_ledgers, kept_entries)
    return Overrides.from_arrays(ledgers, entries, moved), len(kept_ledgers)


class OverridesMixin:
    """``cancel``, ``cancel_many`` and ``reschedule`` for :class:`~delayindex.DelayIndex`."""

    _lock: threading.Lock
    _core: Any
    _catalog: Any
    _clock: Any
    _overrides_dirty: bool
    _overrides_used: bool
    _queued: deque[Callable[[], None]]
    _front: Any
    _mark: tuple[int, int] | None
    _noted_gen: int  # the core's override_gen at the last note (-1: none)
    _evicted_count: int  # cancels held only in the catalog's record (not in the core)
    _fold_pending: list[tuple[int, int]]  # ranges folded since the last note (record: drop)
    _buckets: dict[int, Any]
    _storage: Any
    _warnings: Any

    if TYPE_CHECKING:  # provided by DelayIndex

        def _seal(self) -> None: ...

        def _check_open(self) -> None: ...

        def _rearm(self, now: int) -> None: ...

        def _now(self) -> int: ...

        def _submit_queued(self) -> None: ...

    def cancel(self, ledger_id: int, entry_id: int) -> bool:
        """Untrack a scheduled message for good: it is never delivered, and a later ``add`` of
        the position is refused (returns True: do not deliver) until the mark-delete passes it.

        Returns True if the position was tracked, False otherwise (nothing changes). O(1); no
        snapshot is rewritten (its copy is skipped when it comes up, and merges drop it). The
        cancel is persisted with the next commit and by :meth:`flush`/:meth:`close`: once
        ``flush()`` returns it survives a crash.

        Raises:
            ValueError: an id is out of range. TypeError: an id is not an int.
            TrackerClosedError: the index is closed.
        """
        try:
            done: bool = self._front.cancel(ledger_id, entry_id)
        except (TypeError, OverflowError):
            _diagnose(ledger_id=ledger_id, entry_id=entry_id)
            raise
        if done:
            # Set after the lock is released: a flush that began before this call returned
            # need not carry the cancel, and the next one will.
            self._overrides_dirty = self._overrides_used = True
        return done

    def cancel_many(self, ledger_ids: object, entry_ids: object) -> npt.NDArray[np.bool_]:
        """:meth:`cancel` each ``(ledger_ids[i], entry_ids[i])``; everything is validated
        before anything changes. Returns a bool array (True = it was tracked).

        Raises:
            ValueError: lengths differ or an id is out of range. TypeError: a value is not an
            integer. TrackerClosedError: the index is closed.
        """
        ledgers = as_int64_array(ledger_ids, "ledger_ids")
        entries = as_int64_array(entry_ids, "entry_ids")
        with self._lock:
            self._check_open()
            out: npt.NDArray[np.bool_] = self._core.cancel_many(ledgers, entries)
            if out.any():
                self._overrides_dirty = self._overrides_used = True
            return out

    def reschedule(self, ledger_id: int, entry_id: int, deliver_at: int) -> bool:
        """Move a position, tracked or not, to ``deliver_at``; a later ``add`` of it keeps the
        new time until the mark-delete passes it, and a cancelled one is scheduled again.
        Persisted like :meth:`cancel`.

        Returns what :meth:`add` returns for the new time: True (tracked, or at or below the
        mark-delete), False (due now: it is untracked, deliver it).

        Raises:
            ValueError: an id is out of range or ``deliver_at`` does not fit int64.
            TypeError: an argument is not an int. TrackerClosedError: the index is closed.
        """
        with self._lock:
            self._check_open()
            now = self._clock()
            try:
                code = self._core.reschedule(ledger_id, entry_id, deliver_at, now)
                if code == ADD_NEED_OVERRIDES:  # evicted cancels there: take them back first
                    self._restore_evicted(ledger_id)
                    code = self._core.reschedule(ledger_id, entry_id, deliver_at, now)
                if code == ADD_SEAL_FIRST:  # recorded and untracked: seal, then track it
                    self._seal()
                    code = self._core.reschedule(ledger_id, entry_id, deliver_at, now)
            except (TypeError, OverflowError):
                _diagnose(ledger_id=ledger_id, entry_id=entry_id, deliver_at=deliver_at)
                self._now()
                raise
            self._overrides_dirty = self._overrides_used = True
            self._rearm(now)
        if self._queued:
            self._submit_queued()
        return bool(code != ADD_DELIVER)

    # -- durability ------------------------------------------------------------------------

    def _note_overrides(self) -> bool:
        """Hand the overrides to the catalog if they changed (lock held); True if they did.
        The core's cancels and the record's evicted ones still in force, together."""
        if not self._overrides_dirty:
            return False
        core = self._core
        gen = core.override_gen
        ledgers, entries, moved = core.override_record()
        folded = list(self._fold_pending)
        overrides, kept = _joined(
            ledgers, entries, moved, self._catalog.manifest.overrides,
            core.evicted_ranges(), self._mark, folded,
        )  # fmt: skip
        self._noted(overrides, kept, gen, len(folded))
        return True

    def _note_overrides_unlocked(self) -> bool:
        """:meth:`_note_overrides` called without the lock: with evicted cancels, the record is
        decoded and joined outside it; True if a note was made."""
        with self._lock:
            core = self._core
            if not self._overrides_dirty or not hasattr(core, "evicted_ranges"):
                return False  # nothing new, or closed (close noted what it had)
            ranges = core.evicted_ranges()
            if not ranges:
                return self._note_overrides()  # nothing to decode: cheap under the lock
            gen = core.override_gen
            ledgers, entries, moved = core.override_record()
            record, mark = self._catalog.manifest.overrides, self._mark
            folded = list(self._fold_pending)
        overrides, kept = _joined(ledgers, entries, moved, record, ranges, mark, folded)
        with self._lock:
            if not self._overrides_dirty:
                return False  # noted meanwhile
            if (
                self._core.override_gen != gen
                or self._catalog.manifest.overrides is not record
                or self._fold_pending != folded
            ):
                return self._note_overrides()  # changed meanwhile (rare): again, locked
            self._noted(overrides, kept, gen, len(folded))
            return True

    def _noted(self, overrides: Overrides, evicted: int, gen: int, folds: int = 0) -> None:
        self._catalog.note_overrides(overrides)
        self._evicted_count = evicted
        self._noted_gen = gen
        self._overrides_dirty = False
        del self._fold_pending[:folds]  # the record no longer holds what those merges folded

    def _restore_evicted(self, ledger: int) -> None:
        """The core needs the cancels it evicted (lock held): hand it, from the catalog's
        record and the cancels folded into merged buckets, which together hold them all (see
        the module docs), those of ``ledger``'s span (:meth:`_restore_span`: its bucket's
        ledgers). The rest stay evicted until an add needs them: a replay pays for one
        bucket's cancels at a time.

        A bucket whose folded cancels cannot be read keeps its range evicted (reported in
        ``stats()``); if ``ledger`` (the position an add or reschedule is for) lies there, the
        read's error is raised: the position may be cancelled, so it is neither added nor
        delivered.
        """
        ledgers, entries, *_ = self._catalog.manifest.overrides.to_arrays()
        start, end = self._restore_span(ledger)
        # The record is ascending: slice the span out (end may be the largest id).
        lo = int(np.searchsorted(ledgers, start, side="left"))
        hi = int(np.searchsorted(ledgers, end, side="right"))
        ledgers, entries = ledgers[lo:hi], entries[lo:hi]
        from_record = int(self._core.evicted_mask(ledgers).sum())
        failed: list[tuple[Any, Exception]] = []
        for bucket in list(self._buckets.values()):
            if not bucket.folded or bucket.end < start or bucket.start > end:
                continue
            try:
                folded = self._read_folded(bucket)
            except (SnapshotCorruptError, SnapshotNotFoundError, StorageError) as exc:
                failed.append((bucket, exc))
                continue
            ledgers, entries = union_unique(ledgers, entries, *folded)
        self._core.restore_evicted(ledgers, entries, start, end)
        # The record's cancels the span took back are the core's now (exact again at the
        # next note, which counts what the record alone holds).
        self._evicted_count = max(0, self._evicted_count - from_record)
        error: Exception | None = None
        for bucket, failure in failed:
            self._core.evict_range(bucket.start, bucket.end, False)
            self._warnings.append(
                f"the cancels folded into bucket [{bucket.start}, {bucket.end}] cannot be read "
                f"({failure}); adds of untracked positions in those ledgers are refused with an "
                "error until it reads again or the mark-delete passes it"
            )
            if bucket.start <= ledger <= bucket.end:
                error = failure
        if error is not None:
            raise error

    def _restore_span(self, ledger: int) -> tuple[int, int]:
        """The ledgers whose evicted cancels an add at ``ledger`` takes back: its bucket's,
        or (no bucket holds it) the evicted range that holds it, or ``ledger`` alone."""
        for bucket in self._buckets.values():
            if bucket.start <= ledger <= bucket.end:
                return bucket.start, bucket.end
        for start, end in self._core.evicted_ranges():
            if start <= ledger <= end:
                return start, end
        return ledger, ledger

    def _read_folded(self, bucket: Any) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
        """The cancels folded into a durable bucket's snapshot, read from storage."""
        metadata = self._storage.get_metadata(bucket.snapshot_id, check_bitmaps=False)
        try:
            return metadata.folded_positions()  # type: ignore[no-any-return]
        except ValueError as exc:  # checked at decode: only a changed object gets here
            raise SnapshotCorruptError(f"{bucket.snapshot_id}: folded cancels: {exc}") from None

    def _unfold(self, bucket: Any) -> bool:
        """A bucket with folded cancels is about to be deleted above the mark (lock held): its
        cancels go back to memory, and so to the manifest with the delete's commit. False
        (nothing changed) if they cannot be read: the bucket must stay."""
        try:
            self._restore_evicted(bucket.start)
        except (SnapshotCorruptError, SnapshotNotFoundError, StorageError):
            return False
        self._overrides_dirty = self._overrides_used = True
        return True

    def _fold_for_merge(self, sources: list[Any]) -> tuple[bytes, int]:
        """The cancels a merge of ``sources`` folds into its bucket (packed) and the core's
        ``override_gen`` they were taken at: every cancel of the merged range above the mark,
        from the core, the catalog's record and the sources' own folded cancels, except the
        rescheduled positions. Runs in the merge job: only the core's copy is taken locked."""
        start, end = sources[0].start, sources[-1].end
        with self._lock:
            core = self._core
            gen = core.override_gen
            folded_sources = [b for b in sources if b.folded]
            if not self._overrides_used and not folded_sources:
                return b"", gen
            ledgers, entries, moved = core.override_record()
            record, mark = self._catalog.manifest.overrides, self._mark
        stored_ledgers, stored_entries, *_ = record.to_arrays()
        ledgers, entries = union_unique(ledgers, entries, stored_ledgers, stored_entries)
        for bucket in folded_sources:
            ledgers, entries = union_unique(ledgers, entries, *self._read_folded(bucket))
        keep = (ledgers >= start) & (ledgers <= end)
        if mark is not None:
            keep &= (ledgers > mark[0]) | ((ledgers == mark[0]) & (entries > mark[1]))
        if moved:
            rescheduled = {(m[0], m[1]) for m in moved}
            pairs = zip(ledgers.tolist(), entries.tolist(), strict=True)
            keep &= np.fromiter((p not in rescheduled for p in pairs), np.bool_, len(ledgers))
        return pack_cancelled(ledgers[keep], entries[keep]), gen

    def _folded(self, start: int, end: int, gen: int | None) -> None:
        """A merged bucket ``start..end`` holding folded cancels is live (lock held): the core
        drops its copies of them if nothing changed since they were taken at ``gen``, and the
        next note drops the record's; otherwise both keep theirs (they are then held twice,
        which is harmless). Either way the range is evicted: adds there ask for them."""
        unchanged = gen is not None and self._core.override_gen == gen
        self._core.evict_range(start, end, unchanged)
        if unchanged:
            self._fold_pending.append((start, end))
            self._overrides_dirty = self._overrides_used = True

    def _evict_cancels(self, gen: int) -> None:
        """A commit carried the overrides noted at ``gen`` (lock held): unless they changed
        since, the cancels of sealed ranges leave the core's memory."""
        core = self._core
        if not hasattr(core, "evict_cancels") or core.override_gen != gen:
            return  # closed, or cancelled or rescheduled meanwhile: the next flush evicts
        if self._noted_gen == gen:
            self._evicted_count += core.evict_cancels()

    def _restore_overrides(self) -> None:
        """Re-apply the stored overrides after recovery and the mark (lock held or not yet
        shared): cancel or reschedule the tracked positions, record the others."""
        stored: Overrides = self._catalog.manifest.overrides
        if not stored:
            return
        self._overrides_used = True
        cancelled_ledgers, cancelled_entries, moved_ledgers, moved_entries, moved_times = (
            stored.to_arrays()
        )
        core = self._core
        tracked = core.tracked_mask(cancelled_ledgers, cancelled_entries)
        core.cancel_many(cancelled_ledgers[tracked], cancelled_entries[tracked])
        now = self._clock()
        moved_tracked = core.tracked_mask(moved_ledgers, moved_entries)
        for ledger, entry, time in zip(
            moved_ledgers[moved_tracked].tolist(), moved_entries[moved_tracked].tolist(),
            moved_times[moved_tracked].tolist(), strict=True,
        ):  # fmt: skip
            if core.reschedule(ledger, entry, time, now) == ADD_SEAL_FIRST:
                self._seal()
                core.reschedule(ledger, entry, time, now)
        core.restore_overrides(
            cancelled_ledgers, cancelled_entries, moved_ledgers, moved_entries, moved_times
        )
        if not self._overrides_dirty:  # the manifest carries exactly these: durable
            self._noted_gen = core.override_gen
            self._evict_cancels(self._noted_gen)
