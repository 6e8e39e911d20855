"""SharedDelayIndex's cancel, reschedule and browse (a mixin): one call for every subscription.

How it works. A position the topic index tracks is cancelled or rescheduled there, exactly as
on a :class:`~delayindex.DelayIndex` (its override is durable in the topic's manifest). A
position *held* outside the topic index (in the due log for a subscription that has not read
it yet, or in a subscription's private heap after a re-add) is handled per subscription, the
way each subscription's own tracker would: a cancel makes every subscription that still has it
pending skip its log copy and drops the private copies; a reschedule does the same and gives
every subscription that has not acknowledged the position a private copy at the new time
(none if the new time is due: the call returns False and the dispatchers deliver it). Either
way the override is also recorded, untracked, in the topic index: the one place re-adds consult
(the topic's own ``add``, and the shared index's re-add of a held position through
``BucketCore.override_of``), durable like every override. A cancel holds for every subscription
of the topic: one that had already received the position does not get it again from a replay.

Browse. ``pending`` and ``due_histogram`` cover the whole topic: what the topic index tracks
(read as on a DelayIndex) plus the held keys some subscription still has to receive (its log
keys after its progress, not acknowledged and not skipped, and its private copies); a position
two subscriptions hold at two different times is listed at both.

Invariant kept: a position the topic index tracks is never also held (so a held position is
never rescheduled into the topic index).
"""

from __future__ import annotations

import heapq
import threading
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from delayindex._browse import bin_counts, histogram_edges, select_pending, time_range
from delayindex.model import Position
from delayindex.tracker._front import as_count
from delayindex.tracker.in_memory import _diagnose, as_int64_array

if TYPE_CHECKING:
    from delayindex.tracker._duelog import DueLog
    from delayindex.tracker.delay_index import DelayIndex
    from delayindex.tracker.subscription import _SubState


class SharedOverridesMixin:
    """``cancel``, ``cancel_many`` and ``reschedule`` for the shared index."""

    _lock: threading.RLock
    _topic: DelayIndex
    _log: DueLog
    _subs: dict[str, _SubState]
    _private_count: dict[tuple[int, int], int]
    _closed: bool
    _front: Any  # the shared index's SharedFront (is_held)

    if TYPE_CHECKING:  # provided by SharedDelayIndex

        def _check_open(self) -> None: ...

        def _maybe_held(self, ledger_id: object) -> bool: ...

        def _held(self, pos: tuple[int, int]) -> bool: ...

        def _unpin(self, pos: tuple[int, int]) -> None: ...

        @staticmethod
        def _unacked(state: _SubState, ledgers: Any, entries: Any) -> Any: ...

    def cancel(self, ledger_id: int, entry_id: int) -> bool:
        """Cancel a position for every subscription (as :meth:`DelayIndex.cancel`): True if
        some subscription still had it to receive."""
        if not self._closed:
            # The usual case without the shared lock: the topic index tracked it, or nothing
            # holds it (a position the topic index does not track only becomes held through
            # the topic index: a later add and poll, after this call in any order).
            done = self._topic.cancel(ledger_id, entry_id)  # validates first
            if done or not self._front.is_held(ledger_id, entry_id):
                return done
        with self._lock:
            self._check_open()
            _diagnose(ledger_id=ledger_id, entry_id=entry_id)
            done = self._topic.cancel(ledger_id, entry_id)
            pos = (ledger_id, entry_id)
            if not done and self._maybe_held(ledger_id) and self._held(pos):
                done = self._cancel_held(pos)
            return done

    def cancel_many(self, ledger_ids: object, entry_ids: object) -> npt.NDArray[np.bool_]:
        """:meth:`cancel` for each element; validated as a whole first."""
        ledgers = as_int64_array(ledger_ids, "ledger_ids")
        entries = as_int64_array(entry_ids, "entry_ids")
        with self._lock:
            self._check_open()
            out = self._topic.cancel_many(ledgers, entries)  # validates everything first
            if len(self._log) or self._private_count:
                for i in np.flatnonzero(~out).tolist():
                    pos = (int(ledgers[i]), int(entries[i]))
                    if self._maybe_held(pos[0]) and self._held(pos):
                        out[i] = self._cancel_held(pos)
            return out

    def reschedule(self, ledger_id: int, entry_id: int, deliver_at: int) -> bool:
        """Move a position to ``deliver_at`` for every subscription that has not acknowledged
        it (as :meth:`DelayIndex.reschedule`); False: due now, deliver it."""
        with self._lock:
            self._check_open()
            _diagnose(ledger_id=ledger_id, entry_id=entry_id, deliver_at=deliver_at)
            pos = (ledger_id, entry_id)
            if not (self._maybe_held(ledger_id) and self._held(pos)):
                return self._topic.reschedule(ledger_id, entry_id, deliver_at)
            topic_mark = self._topic.mark_delete
            if topic_mark is not None and pos <= topic_mark:
                return True  # acknowledged by every subscription
            self._drop_held(pos)
            self._topic._ensure_overrides(*pos)  # an evicted cancel must be revived too
            self._topic._record_overrides(moved=[(*pos, deliver_at)])
            tracked = deliver_at >= 0 and deliver_at > self._topic._core.cutoff_for(
                self._topic._now()
            )
            if tracked:
                for state in self._subs.values():
                    if not state.acked(*pos):
                        heapq.heappush(state.private, (deliver_at, *pos))
                        self._private_count[pos] = self._private_count.get(pos, 0) + 1
            return tracked

    def _cancel_held(self, pos: tuple[int, int]) -> bool:
        """Cancel a held position: True (and an override) if some subscription still had it
        to receive; as on a DelayIndex, nothing is recorded otherwise."""
        if not self._drop_held(pos):
            return False
        self._topic._record_overrides(cancelled=[pos])
        return True

    def pending(
        self, start_ms: int | None = None, end_ms: int | None = None, limit: int = 1000
    ) -> list[tuple[int, Position]]:
        """The whole topic's pending schedule (as :meth:`DelayIndex.pending`)."""
        bounds = time_range(start_ms, end_ms)
        as_count(limit, "limit")
        with self._lock:
            if bounds is None or self._closed:
                return []
            topic, held = self._topic._browse(*bounds)[0], self._held_keys(*bounds)
        times, ledgers, entries = (np.concatenate(c) for c in zip(topic, held, strict=True))
        return select_pending(times, ledgers, entries, limit)

    def due_histogram(self, edges: object) -> npt.NDArray[np.int64]:
        """The whole topic's counts per bin (as :meth:`DelayIndex.due_histogram`)."""
        bins = histogram_edges(edges)
        with self._lock:
            if self._closed:
                return np.zeros(len(bins) - 1, dtype=np.int64)
            held = self._held_keys(int(bins[0]), int(bins[-1]) - 1)[0]
            return self._topic.due_histogram(bins) + bin_counts(bins, held)

    def _held_keys(self, first: int, last: int) -> tuple[Any, Any, Any]:
        """The held keys with ``first <= time <= last`` some subscription still has to
        receive: log keys after its progress, not acknowledged, not skipped; private copies
        (lock held)."""
        held: set[tuple[int, int, int]] = set()
        for state in self._subs.values():
            for _, times, ledgers, entries in self._log.columns_from(state.seq):
                keep = (times >= first) & (times <= last) & self._unacked(state, ledgers, entries)
                for key in zip(times[keep].tolist(), ledgers[keep].tolist(),
                               entries[keep].tolist(), strict=True):  # fmt: skip
                    if (key[1], key[2]) not in state.skip:
                        held.add(key)
            held.update(k for k in state.private if first <= k[0] <= last)
        rows = sorted(held)
        return tuple(np.array([r[i] for r in rows], dtype=np.int64) for i in range(3))  # type: ignore[return-value]

    def _drop_held(self, pos: tuple[int, int]) -> bool:
        """No subscription receives its held copies of ``pos`` (log or private); True if some
        subscription still had one to receive."""
        found = False
        for state in self._subs.values():
            if state.acked(*pos):
                continue
            if pos not in state.skip and self._log.pending_from(pos, state.seq):
                state.skip.add(pos)
                found = True
            copies = [key for key in state.private if (key[1], key[2]) == pos]
            if copies:
                state.private = [key for key in state.private if (key[1], key[2]) != pos]
                heapq.heapify(state.private)
                for _ in copies:
                    self._unpin(pos)
                found = True
        return found
