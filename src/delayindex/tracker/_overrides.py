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
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from delayindex.model import ADD_DELIVER, ADD_SEAL_FIRST
from delayindex.storage._overrides import Overrides
from delayindex.tracker.in_memory import _diagnose, as_int64_array


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
        """Hand the overrides to the catalog if they changed (lock held); True if they did."""
        if not self._overrides_dirty:
            return False
        cancelled_ledgers, cancelled_entries, moved = self._core.override_record()
        self._catalog.note_overrides(
            Overrides.from_arrays(cancelled_ledgers, cancelled_entries, moved)
        )
        self._overrides_dirty = False
        return True

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
