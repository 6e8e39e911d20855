"""SharedDelayIndex: one delayed index for every subscription of a topic (PIP-195).

How it works. One :class:`~delayindex.DelayIndex`, the *topic index*, holds every delayed
position of the topic once: one dedup index, one set of buckets, snapshots, merges and trims.
Its mark-delete position is the lowest of the subscriptions' marks (what every subscription has
acknowledged). When a subscription polls, the due keys are popped from the topic index in
``(deliver_at, ledger_id, entry_id)`` selection order and appended to the *due log*
(:mod:`~delayindex.tracker._duelog`), where each key has a sequence number in that one global
order. A subscription's progress is the sequence number of the next key it has not read: it
reads the log from there, skipping the positions at or below its own mark, and pops more from
the topic index when it reaches the log's end. Log chunks every subscription has read are
dropped, so the topic's memory holds each delayed position once, plus the keys between the
slowest and the fastest reader.

Re-adds. A dispatcher adds each message once (through the building cursor), but a position can
be added again while the log still holds it for some subscription. Each subscription must then
see what its own tracker would: a due re-add untracks it, a later one keeps the copy it has, and
a subscription that has already received it tracks a new copy. Such a position never goes back
to the topic index while the log or a subscription still holds it; the few per-subscription
outcomes are kept in that subscription's ``skip`` set (a log copy it must not receive) and
``private`` heap (its own new copy).

Invariants (:meth:`SharedDelayIndex._check`): the topic index's mark is the lowest subscription
mark; every subscription reads at or after the log's start and at or before its end; a position
the topic index tracks is neither in the log nor in a private heap; skip sets name positions
whose log copy a subscription has yet to read.

Durability. The subscriptions and their marks are records in the topic index's manifest, carried
by its commits (group commit) and by ``close``, like a DelayIndex's mark-delete position. After a
restart each subscription starts at the head of the (empty) due log with its stored mark: it
receives again what the topic index recovers above that mark, and its dispatcher's replay from
its own cursor delivers what was due (at-least-once, as for a :class:`DelayIndex`).
"""

from __future__ import annotations

import heapq
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Executor
from types import TracebackType
from typing import Any, Self

import numpy as np
import numpy.typing as npt
from pyroaring import BitMap

from delayindex import _impl, _lateness, _registry
from delayindex.clock import Clock
from delayindex.config import TrackerConfig
from delayindex.errors import TrackerClosedError
from delayindex.model import Position
from delayindex.storage.base import SnapshotStorage
from delayindex.storage.manifest import SubscriptionRecord
from delayindex.timers import Timer
from delayindex.tracker._duelog import DueLog, Int64Array
from delayindex.tracker._shared_overrides import SharedOverridesMixin
from delayindex.tracker.delay_index import DelayIndex
from delayindex.tracker.in_memory import _diagnose, as_int64_array
from delayindex.tracker.subscription import Subscription, _SubState

_DEFAULT_CONFIG = TrackerConfig()
#: Keys popped from the topic index per step when a check must look ahead for a subscription.
_LOOKAHEAD = 1024


class SharedDelayIndex(SharedOverridesMixin):
    """One durable delayed index per topic, read by every subscription (see the module docs).

    Build it with :meth:`open`; get each subscription's view with :meth:`subscribe`.
    """

    def __init__(self, topic: DelayIndex, _token: object) -> None:
        """Internal: use :meth:`SharedDelayIndex.open`."""
        if _token is not _OPEN_TOKEN:
            raise TypeError("use SharedDelayIndex.open(storage, name, ...)")
        self._topic = topic
        self._log = DueLog(topic._config.due_log_memory_keys)
        self._subs: dict[str, _SubState] = {}
        self._views: dict[str, Subscription] = {}
        self._private_count: dict[tuple[int, int], int] = {}
        self._lock = threading.RLock()
        self._closed = False
        # The hot calls (add here, contains on each subscription): one native call each under
        # the topic index's lock alone; held positions and a closed index go to the hooks.
        self._front = _impl.SharedFront(
            topic._front, self._log.memory, self._log.spilled, self._private_count
        )
        self._front.slow_add = self._add_slow
        self._front.diagnose = topic._diagnose_call  # names a bad argument or clock value
        # The hot call is the front's own method (no Python frame); add() below documents it.
        vars(self).update(add=self._front.add)
        self._last_batch: tuple[int, list[Position]] | None = None
        self._last_lateness: tuple[int, int, int, list[int], int] | None = None

    @classmethod
    def open(
        cls,
        storage: SnapshotStorage,
        name: str,
        config: TrackerConfig = _DEFAULT_CONFIG,
        *,
        clock: Clock | None = None,
        timer: Timer | None = None,
        on_ready: Callable[[], object] | None = None,
        executor: Executor | None = None,
    ) -> SharedDelayIndex:
        """Open (or create) the shared index ``name`` on ``storage``.

        Arguments as for :meth:`DelayIndex.open`; ``on_ready()`` is called when something may
        be due for some subscription.

        Raises:
            RecoveryError, StorageError, TypeError, ValueError: as :meth:`DelayIndex.open`.
        """
        topic = DelayIndex.open(
            storage, name, config, clock=clock, timer=timer, on_ready=on_ready,
            executor=executor,
        )  # fmt: skip
        shared = cls(topic, _OPEN_TOKEN)
        for record in topic._stored_subscriptions():  # the subscriptions survive a restart
            shared._subs[record.name] = shared._new_state(record.name, 0, record.mark_delete)
            shared._views[record.name] = Subscription(shared, record.name)
        # A commit may have landed between a subscription's new mark and the topic's: the
        # topic's mark moves up to the lowest subscription mark again.
        shared._after_progress()
        _registry.withdraw(topic)  # the shared index reports its topic index itself
        _registry.enroll(shared)
        return shared

    # -- subscriptions ---------------------------------------------------------------------------

    def subscribe(self, sub_name: str) -> Subscription:
        """The named subscription's view, created if new.

        A new subscription receives every position the topic index still tracks (its mark
        starts at the topic's), and everything added later; keys already handed to the other
        subscriptions (in the due log) are theirs.

        Raises:
            TypeError: ``sub_name`` is not a str. ValueError: it is empty.
            TrackerClosedError: the index is closed.
        """
        if not isinstance(sub_name, str):
            raise TypeError(f"sub_name must be a str, got {type(sub_name).__name__}")
        if not sub_name:
            raise ValueError("sub_name must not be empty")
        with self._lock:
            self._check_open()
            view = self._views.get(sub_name)
            if view is None:
                mark = self._topic.mark_delete
                SubscriptionRecord(sub_name, mark)  # validates the name first
                self._subs[sub_name] = self._new_state(sub_name, self._log.end, mark)
                view = self._views[sub_name] = Subscription(self, sub_name)
                self._note()
            return view

    def unsubscribe(self, sub_name: str) -> None:
        """Drop the subscription's state for good; what only it still needed is released.

        Raises:
            KeyError: no such subscription. TrackerClosedError: the index is closed.
        """
        with self._lock:
            self._check_open()
            state = self._subs.pop(sub_name)  # KeyError names it
            self._views.pop(sub_name)._detached = state.front.detached = True
            for pos in state.private_positions():
                self._unpin(pos)
            self._note()
            self._after_progress()

    def _new_state(self, sub_name: str, seq: int, mark: tuple[int, int] | None) -> _SubState:
        """A fresh state for ``sub_name``; it keeps the subscription's front if it has one (its
        view holds that front)."""
        held = self._subs.get(sub_name)
        if held is not None:
            front = held.front
        else:
            front = _impl.SubFront(self._front)
            front.slow_contains = lambda ledger, entry: self._contains_slow(sub_name, ledger, entry)
            front.diagnose = self._topic._diagnose_call  # names a bad position
        return _SubState(sub_name, seq, mark, front)

    def _contains_slow(self, sub_name: str, ledger_id: int, entry_id: int) -> bool:
        """A subscription's ``contains`` under the shared lock (its front's hook: a held
        position)."""
        with self._lock:
            state = self._subs.get(sub_name)
            if self._closed or state is None or state.front.detached:
                return False
            return self._contains(state, ledger_id, entry_id)

    def subscriptions(self) -> list[str]:
        """The subscription names, sorted."""
        with self._lock:
            return sorted(self._subs)

    # -- the building cursor ---------------------------------------------------------------------

    def add(self, ledger_id: int, entry_id: int, deliver_at: int) -> bool:
        """Track a position for every subscription (as :meth:`DelayIndex.add`).

        Returns True when it is tracked (or acknowledged by every subscription), False when it
        is due now or not delayed: every subscription's dispatcher delivers it directly.
        """
        # Replaced per instance by the front's add (see __init__): one native call under the
        # topic index's lock, unless the position is held (the due log or a private heap has
        # it) or the index closed: then _add_slow.
        return self._front.add(ledger_id, entry_id, deliver_at)  # type: ignore[no-any-return]

    def _add_slow(self, ledger_id: int, entry_id: int, deliver_at: int) -> bool:
        """:meth:`add` under the shared lock (the front's hook: a held position, or closed)."""
        with self._lock:
            self._check_open()
            if self._held((ledger_id, entry_id)):
                return self._readd((ledger_id, entry_id), deliver_at)
            return self._topic.add(ledger_id, entry_id, deliver_at)

    def add_many(
        self,
        ledger_ids: Sequence[int] | npt.ArrayLike,
        entry_ids: Sequence[int] | npt.ArrayLike,
        deliver_ats: Sequence[int] | npt.ArrayLike,
    ) -> npt.NDArray[np.bool_]:
        """:meth:`add` for each element (as :meth:`DelayIndex.add_many`)."""
        with self._lock:
            self._check_open()
            if not len(self._log) and not self._private_count:
                return self._topic.add_many(ledger_ids, entry_ids, deliver_ats)
            ledgers = as_int64_array(ledger_ids, "ledger_ids")
            entries = as_int64_array(entry_ids, "entry_ids")
            times = as_int64_array(deliver_ats, "deliver_ats")
            if not len(ledgers) == len(entries) == len(times):
                raise ValueError("ledger_ids, entry_ids and deliver_ats differ in length")
            if not len(ledgers) or int(ledgers.min()) > self._held_max_ledger():
                return self._topic.add_many(ledgers, entries, times)  # the usual: newer ledgers
            held_ledgers = self._log.ledgers() | {led for led, _ in self._private_count}
            rows = np.flatnonzero(np.isin(ledgers, np.fromiter(held_ledgers, np.int64)))
            held = [int(i) for i in rows if self._held((int(ledgers[i]), int(entries[i])))]
            if not held:
                return self._topic.add_many(ledgers, entries, times)
            # Validated as a whole by the topic first; then the held rows in order.
            out = np.empty(len(ledgers), dtype=np.bool_)
            keep = np.ones(len(ledgers), dtype=np.bool_)
            keep[held] = False
            out[keep] = self._topic.add_many(ledgers[keep], entries[keep], times[keep])
            for i in held:
                out[i] = self._readd((int(ledgers[i]), int(entries[i])), int(times[i]))
            return out

    def _held_max_ledger(self) -> int:
        """No held position has a larger ledger (-1: nothing held)."""
        held = self._log.max_ledger if len(self._log) else -1
        if self._private_count:  # rare (re-adds of held positions): off the usual add path
            held = max(held, max(led for led, _ in self._private_count))
        return held

    def _maybe_held(self, ledger_id: object) -> bool:
        """Cheap pre-check for :meth:`add`: a ledger newer than every held one is not held."""
        if not len(self._log) and not self._private_count:
            return False
        try:
            return bool(ledger_id <= self._held_max_ledger())  # type: ignore[operator]
        except TypeError:
            return False  # a bad id: the topic index's validation reports it

    def _held(self, pos: tuple[int, int]) -> bool:
        """Whether the log or a subscription's private heap holds ``pos``."""
        return self._log.holds(pos) or pos in self._private_count

    def _readd(self, pos: tuple[int, int], deliver_at: int) -> bool:
        """A re-add of a held position: each subscription's own tracker's outcome."""
        _diagnose(ledger_id=pos[0], entry_id=pos[1], deliver_at=deliver_at)
        self._topic._ensure_overrides(*pos)
        override = self._topic._core.override_of(*pos)
        if override == "cancelled":
            return True  # a cancel holds for every subscription
        if override is not None:
            deliver_at = int(override)  # a reschedule holds too
        topic_mark = self._topic.mark_delete
        if topic_mark is not None and pos <= topic_mark:
            return True  # acknowledged by every subscription: refused
        now = self._topic._now()
        tracked = deliver_at >= 0 and deliver_at > self._topic._core.cutoff_for(now)
        seq = self._log.seq_of(pos)
        for state in self._subs.values():
            if state.acked(*pos):
                continue
            in_log = seq is not None and seq >= state.seq and pos not in state.skip
            private = next((k for k in state.private if (k[1], k[2]) == pos), None)
            if not tracked:  # due now: untracked, the dispatcher delivers it
                if private is not None:
                    state.private.remove(private)
                    heapq.heapify(state.private)
                    self._unpin(pos)
                if in_log:
                    state.skip.add(pos)
            elif private is None and not in_log:  # received already: a new copy
                heapq.heappush(state.private, (deliver_at, pos[0], pos[1]))
                self._private_count[pos] = self._private_count.get(pos, 0) + 1
        return tracked

    def _unpin(self, pos: tuple[int, int]) -> None:
        left = self._private_count[pos] - 1
        if left:
            self._private_count[pos] = left
        else:
            del self._private_count[pos]

    # -- reading (Subscription calls these under the lock) ---------------------------------------

    def _pull(self, want: int) -> bool:
        """Pop up to ``want`` due keys from the topic index into the log; whether any came.

        The keys enter the log before the topic index's lock is released: the fronts answer
        "not held" from the topic index alone, under that lock (see SharedFront)."""
        times, _, _ = self._topic._poll_keys(want, self._log.append_unspilled)
        self._log.spill_excess()
        return len(times) > 0

    def _poll(self, state: _SubState, max_messages: int) -> list[Position]:
        parts: list[list[Position]] = []
        got = 0
        now = self._topic._now()
        cutoff = self._topic._core.cutoff_for(now)
        while got < max_messages:
            if state.private and state.private[0][0] <= cutoff:
                head = state.private[0]
                if state.seq >= self._log.end:
                    self._pull(1)
                if state.seq >= self._log.end or head < self._log.key_at(state.seq):
                    heapq.heappop(state.private)
                    self._unpin((head[1], head[2]))
                    state.lateness.note(now - head[0])
                    parts.append([Position(head[1], head[2])])
                    got += 1
                    continue
                limit = 1  # the private key may come next: one log key at a time
            else:
                limit = max_messages - got
            if state.seq >= self._log.end and not self._pull(limit):
                break
            seq, times, ledgers, entries = self._log.slice(state.seq, limit)
            state.seq = seq + len(ledgers)
            keep = self._unacked(state, ledgers, entries)
            if state.skip:
                for i in np.flatnonzero(keep).tolist():
                    pos = (int(ledgers[i]), int(entries[i]))
                    if pos in state.skip:
                        state.skip.discard(pos)
                        keep[i] = False
            n = int(np.count_nonzero(keep))
            if n == len(keep):
                parts.append(self._batch(seq, ledgers, entries))
                self._note_lateness(state, now, seq, times)
            elif n:
                parts.append(_positions(ledgers[keep], entries[keep]))
                state.lateness.note_many(now, times[keep])
            got += n
        state.received += got
        self._after_progress()
        if len(parts) == 1:
            return list(parts[0])  # a copy: the batch may be shared with other subscriptions
        out = [pos for part in parts for pos in part]
        out.sort()
        return out

    def _note_lateness(self, state: _SubState, now: int, seq: int, times: Int64Array) -> None:
        """Count a whole log slice's lateness for ``state``; counted once for the
        subscriptions that read the same slice at the same ``now`` (as :meth:`_batch`)."""
        cached = self._last_lateness
        if cached is None or cached[:3] != (seq, len(times), now):
            cached = self._last_lateness = (seq, len(times), now, *_lateness.batch(now, times))
        state.lateness.add(cached[3], cached[4])

    def _batch(self, seq: int, ledgers: Int64Array, entries: Int64Array) -> list[Position]:
        """The sorted positions of the whole log slice at ``seq``, built once for the
        subscriptions that read the same slice (the common case: equal poll sizes)."""
        cached = self._last_batch
        if cached is not None and cached[0] == seq and len(cached[1]) == len(ledgers):
            return cached[1]
        positions = _positions(ledgers, entries)
        self._last_batch = (seq, positions)
        return positions

    @staticmethod
    def _unacked(
        state: _SubState, ledgers: Int64Array, entries: Int64Array
    ) -> npt.NDArray[np.bool_]:
        if state.mark is None:
            return np.ones(len(ledgers), dtype=np.bool_)
        ml, me = state.mark
        return (ledgers > ml) | ((ledgers == ml) & (entries > me))  # type: ignore[no-any-return]

    def _has_available(self, state: _SubState) -> bool:
        cutoff = self._topic._core.cutoff_for(self._topic._now())
        if state.private and state.private[0][0] <= cutoff:
            return True
        while True:
            for _, (_, ledger, entry) in self._log.keys_from(state.seq):
                if not state.acked(ledger, entry) and (ledger, entry) not in state.skip:
                    return True
            if not self._pull(_LOOKAHEAD):
                return False

    def _next_time(self, state: _SubState) -> int | None:
        times = [state.private[0][0]] if state.private else []
        for _, (time, ledger, entry) in self._log.keys_from(state.seq):
            if not state.acked(ledger, entry) and (ledger, entry) not in state.skip:
                # Not always the earliest unread key (a late-loaded bucket's come after later
                # ones): the log's bound keeps this a lower bound.
                bound = self._log.min_time_from(state.seq)
                times.append(time if bound is None else min(time, bound))
                break
        topic_next = self._topic.next_delivery_time()
        if topic_next is not None:
            times.append(topic_next)
        return min(times) if times else None

    def _log_pending_count(self, state: _SubState) -> int:
        """How many log keys ``state`` still has to read (vectorized; spilled chunks are read)."""
        total = 0
        for _, _, ledgers, entries in self._log.columns_from(state.seq):
            total += int(np.count_nonzero(self._unacked(state, ledgers, entries)))
        return total - len(state.skip)  # skipped keys are pending and unacknowledged

    def _pending_any(self, pos: tuple[int, int]) -> bool:
        """Whether some subscription still has to read ``pos`` from the log."""
        return any(
            not s.acked(*pos) and pos not in s.skip and self._log.pending_from(pos, s.seq)
            for s in self._subs.values()
        )

    def _contains(self, state: _SubState, ledger: int, entry: int) -> bool:
        _diagnose(ledger_id=ledger, entry_id=entry)
        pos = (ledger, entry)
        if state.acked(ledger, entry):
            return False
        if pos not in state.skip and self._log.pending_from(pos, state.seq):
            return True
        if pos in self._private_count and any((k[1], k[2]) == pos for k in state.private):
            return True
        return bool(self._topic.contains(ledger, entry))

    def _count(self, state: _SubState) -> int:
        topic_part = len(self._topic) - self._topic_acked_by(state)
        return topic_part + self._log_pending_count(state) + len(state.private)

    def _topic_acked_by(self, state: _SubState) -> int:
        """Positions the topic index tracks that ``state`` has acknowledged (above the topic's
        mark, at or below its own)."""
        if state.mark is None or state.mark == self._topic.mark_delete:
            return 0
        return self._topic._count_upto(*state.mark)

    def _tracked_entries(self, state: _SubState, ledger: int, first: int, last: int) -> BitMap:
        out = BitMap(self._topic.tracked_entries(ledger, first, last))
        seq = state.seq
        # The usual read batch is of a ledger the log does not hold (two bitmap probes), so
        # the scan of the log's keys is skipped.
        in_log = self._log.memory.ledger_count(ledger) or self._log.spilled.ledger_count(ledger)
        if in_log and seq <= self._log.start and self._log.spilled_keys:
            # The slowest reader has every spilled key still to read: the bitmap says which.
            out |= BitMap(self._log.spilled.bitmap(ledger, first, last))
            seq = self._log.spill_start
        for _, _, ledgers, entries in self._log.columns_from(seq) if in_log else ():
            hit = (ledgers == ledger) & (entries >= first) & (entries <= last)
            if hit.any():
                out.update(entries[hit].tolist())
        for led, ent in state.skip:
            if led == ledger:
                out.discard(ent)
        for _, led, ent in state.private:
            if led == ledger and first <= ent <= last:
                out.add(ent)
        if state.mark is not None and state.mark[0] >= ledger:
            if state.mark[0] > ledger:
                return BitMap()
            out.remove_range(0, state.mark[1] + 1)
        return out

    def _set_mark(self, state: _SubState, ledger: int, entry: int) -> None:
        _diagnose(ledger_id=ledger, entry_id=entry)
        mark = (ledger, entry)
        if state.mark is not None and mark <= state.mark:
            return  # marks only move forward, as on DelayIndex
        state.mark = mark
        state.skip = {pos for pos in state.skip if pos > mark}
        dropped = [k for k in state.private if (k[1], k[2]) <= mark]
        if dropped:
            state.private = [k for k in state.private if (k[1], k[2]) > mark]
            heapq.heapify(state.private)
            for _, led, ent in dropped:
                self._unpin((led, ent))
        self._note()
        self._after_progress()

    def _after_progress(self) -> None:
        """Drop log chunks every subscription has read; move the topic's mark to the lowest."""
        states = list(self._subs.values())
        self._log.trim(min((s.seq for s in states), default=self._log.end))
        if not states or any(s.mark is None for s in states):
            return
        lowest = min(s.mark for s in states if s.mark is not None)
        current = self._topic.mark_delete
        if current is None or lowest > current:
            self._topic.set_mark_delete(*lowest)

    def _note(self) -> None:
        """Hand the subscription records to the topic index (persisted with its commits)."""
        self._topic._note_subscriptions(
            tuple(SubscriptionRecord(n, s.mark) for n, s in sorted(self._subs.items()))
        )

    def _check_open(self) -> None:
        if self._closed:
            raise TrackerClosedError("the shared index is closed")

    # -- the whole topic -------------------------------------------------------------------------

    def __len__(self) -> int:
        """Distinct positions some subscription still has to receive."""
        with self._lock:
            if self._closed:
                return 0
            states = list(self._subs.values())
            if not states:
                return len(self._topic)
            total = 0
            low = min(s.seq for s in states)
            for base, _, ledgers, entries in self._log.columns_from(low):
                seqs = np.arange(base, base + len(ledgers))
                anyone = np.zeros(len(ledgers), dtype=np.bool_)
                for s in states:
                    anyone |= (seqs >= s.seq) & self._unacked(s, ledgers, entries)
                total += int(np.count_nonzero(anyone))
            # Skips and private copies are few: settle them one by one.
            for pos in set().union(*(s.skip for s in states)):
                counted = any(not s.acked(*pos) and self._log.pending_from(pos, s.seq)
                              for s in states)  # fmt: skip
                total -= counted and not self._pending_any(pos)
            private = set().union(*(s.private_positions() for s in states))
            total += sum(1 for pos in private if not self._pending_any(pos))
            return len(self._topic) + total

    def flush(self) -> None:
        """Block until every background write started so far has finished (as DelayIndex)."""
        self._topic.flush()

    def reset_tick_time(self, tick_ms: int) -> None:
        """Use ``tick_ms`` from now on, for every subscription (as DelayIndex)."""
        self._topic.reset_tick_time(tick_ms)

    def clear(self) -> None:
        """Forget every position and every subscription's progress and mark (a rewind); the
        subscriptions stay subscribed."""
        with self._lock:
            self._check_open()
            self._log.clear()
            self._private_count.clear()
            for name in self._subs:
                self._subs[name] = self._new_state(name, self._log.end, None)
            # Noted first: the topic's clear commits at once, and that commit must carry the
            # reset marks (an old mark must not come back after a crash).
            self._note()
            self._topic.clear()

    def close(self) -> None:
        """Close the topic index (idempotent); the subscriptions' views close with it.

        Raises:
            StorageError: as :meth:`DelayIndex.close` (everything else is closed first).
        """
        with self._lock:
            if self._closed:
                return
            self._closed = self._front.closed = True
            _registry.withdraw(self)
            self._log.close()
        self._topic.close()

    @property
    def name(self) -> str:
        """The index name in its storage."""
        return self._topic.name

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called."""
        return self._closed

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def stats(self) -> dict[str, Any]:
        """The topic index's :meth:`DelayIndex.stats`, plus ``delayed`` (``len(self)``: what
        some subscription has still to receive; ``tracked`` is the topic index's alone),
        ``subscriptions`` (per name: ``backlog``, ``lag`` in due-log keys, ``mark_delete``,
        ``received``, delivery ``lateness`` counters and ``lateness_ms``), ``due_log`` (keys
        held) and ``due_log_bytes``."""
        with self._lock:
            out = self._topic.stats()
            out["subscriptions"] = {
                name: {
                    "backlog": self._count(state) if not self._closed else 0,
                    "lag": self._log.end - state.seq,
                    "mark_delete": state.mark,
                    "received": state.received,
                    "lateness": list(state.lateness.counts),
                    "lateness_ms": state.lateness.total_ms,
                }
                for name, state in sorted(self._subs.items())
            }
            # Positions some subscription has still to receive (len(self)); "tracked" is
            # the topic index's alone.
            out["delayed"] = len(self)
            out["due_log"] = len(self._log)
            out["due_log_spilled"] = self._log.spilled_keys
            out["due_log_bytes"] = self._log.nbytes
            return out

    def memory_usage_bytes(self) -> int:
        """Resident estimate: the topic index plus the due log and private copies."""
        with self._lock:
            private = sum(48 * len(s.private) + 100 * len(s.skip) for s in self._subs.values())
            return self._topic.memory_usage_bytes() + self._log.nbytes + private

    def buckets(self) -> list[Any]:
        """The topic index's buckets (:meth:`DelayIndex.buckets`)."""
        return self._topic.buckets()

    def quarantined(self) -> list[Any]:
        """The topic index's quarantined buckets (:meth:`DelayIndex.quarantined`)."""
        return self._topic.quarantined()

    def release_quarantined(self, snapshot_id: str | None = None) -> int:
        """As :meth:`DelayIndex.release_quarantined`, for the whole topic."""
        return self._topic.release_quarantined(snapshot_id)

    def _check(self) -> None:
        """Assert the invariants in the module docs (tests call this)."""
        with self._lock:
            self._topic._check()
            self._log._check()
            states = list(self._subs.values())
            marks = [s.mark for s in states]
            if states and None not in marks:
                assert self._topic.mark_delete == min(m for m in marks if m is not None)
            pinned: dict[tuple[int, int], int] = {}
            for state in states:
                assert self._log.start <= state.seq <= self._log.end
                for pos in state.skip:
                    assert self._log.pending_from(pos, state.seq), f"stale skip {pos}"
                for _, led, ent in state.private:
                    pinned[led, ent] = pinned.get((led, ent), 0) + 1
            assert pinned == self._private_count
            held = [(led, ent) for _, (_, led, ent) in self._log.keys_from(self._log.start)]
            for pos in [*held, *pinned]:
                assert not self._topic.contains(*pos), f"{pos} both held and in the topic"


def _positions(ledgers: Int64Array, entries: Int64Array) -> list[Position]:
    """``Position`` s of the columns, sorted by position."""
    return _impl.sorted_positions(np.ascontiguousarray(ledgers), np.ascontiguousarray(entries))


_OPEN_TOKEN = object()
