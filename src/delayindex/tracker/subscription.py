"""A subscription of a shared index: its progress (``_SubState``) and its view (``Subscription``).

A subscription's state is the ``seq`` of the next due-log key it has not read, its mark-delete
position, and the few per-position outcomes of re-adds (``skip``: log keys it must not receive;
``private``: its own copies). The view takes the shared index's lock and calls the index's
internals with that state; every rule lives in :mod:`delayindex.tracker.shared`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pyroaring import BitMap

from delayindex._lateness import Lateness
from delayindex.errors import TrackerClosedError
from delayindex.model import Position
from delayindex.tracker._front import as_count
from delayindex.tracker.in_memory import _diagnose

if TYPE_CHECKING:
    from delayindex.tracker.shared import SharedDelayIndex


class _SubState:
    """One subscription's progress: its next ``seq`` in the due log, its mark, its overrides."""

    __slots__ = ("front", "lateness", "name", "private", "received", "seq", "skip")

    def __init__(self, name: str, seq: int, mark: tuple[int, int] | None, front: Any) -> None:
        self.name = name
        self.seq = seq
        self.front = front  # the subscription's SubFront: it holds the mark (native contains)
        self.front.mark = mark
        self.skip: set[tuple[int, int]] = set()
        self.private: list[tuple[int, int, int]] = []  # heap of (time, ledger, entry)
        self.received = 0
        self.lateness = Lateness()  # of what this subscription polled

    @property
    def mark(self) -> tuple[int, int] | None:
        """The mark-delete position, or None (kept in the front)."""
        return self.front.mark  # type: ignore[no-any-return]

    @mark.setter
    def mark(self, value: tuple[int, int] | None) -> None:
        self.front.mark = value

    def acked(self, ledger: int, entry: int) -> bool:
        return self.mark is not None and (ledger, entry) <= self.mark

    def private_positions(self) -> set[tuple[int, int]]:
        return {(led, ent) for _, led, ent in self.private}


class Subscription:
    """One subscription's view of a :class:`SharedDelayIndex` (see :meth:`subscribe`).

    Each method has :class:`~delayindex.DelayIndex`'s contract for this subscription alone:
    every position becomes due once for the topic and this subscription receives it once, in
    ``(deliver_at, ledger_id, entry_id)`` selection order, except positions at or below its
    mark-delete.
    """

    def __init__(self, shared: SharedDelayIndex, name: str) -> None:
        """Internal: use :meth:`SharedDelayIndex.subscribe`."""
        self._shared = shared
        self._name = name
        self._detached = False
        self._front = shared._subs[name].front  # kept across clear(): see _new_state
        # The hot call is the front's own method: no Python frame per call (the front names a
        # bad id through its diagnose hook). The method below documents it.
        self.contains = self._front.contains  # type: ignore[method-assign]

    @property
    def name(self) -> str:
        """The subscription's name."""
        return self._name

    def _state(self) -> _SubState:
        self._shared._check_open()
        if self._detached:
            raise TrackerClosedError(f"subscription {self._name!r} was unsubscribed")
        return self._shared._subs[self._name]

    def poll(self, max_messages: int) -> list[Position]:
        """Remove and return up to ``max_messages`` due positions for this subscription,
        selected in ``(deliver_at, ledger_id, entry_id)`` order, returned sorted by position."""
        count = as_count(max_messages)
        with self._shared._lock:
            return self._shared._poll(self._state(), count)

    def has_message_available(self) -> bool:
        """Whether :meth:`poll` would return something now (False once closed)."""
        with self._shared._lock:
            if self._shared.closed or self._detached:
                return False
            return self._shared._has_available(self._state())

    def next_delivery_time(self) -> int | None:
        """Never later than the smallest deliver time this subscription still has; None when
        it has nothing."""
        with self._shared._lock:
            if self._shared.closed or self._detached:
                return None
            return self._shared._next_time(self._state())

    def contains(self, ledger_id: int, entry_id: int) -> bool:
        """Whether this subscription still has to receive the position."""
        # Replaced per instance by the front's method (see __init__); the same call.
        return self._front.contains(ledger_id, entry_id)  # type: ignore[no-any-return]

    def __contains__(self, position: object) -> bool:
        """``(ledger_id, entry_id) in subscription``."""
        if not isinstance(position, tuple) or len(position) != 2:
            return False
        return self.contains(position[0], position[1])

    def __len__(self) -> int:
        """Positions this subscription still has to receive."""
        with self._shared._lock:
            if self._shared.closed or self._detached:
                return 0
            return self._shared._count(self._state())

    def set_mark_delete(self, ledger_id: int, entry_id: int) -> None:
        """Acknowledge every position ``<= (ledger_id, entry_id)`` for this subscription (moves
        only forward); the topic index trims what every subscription has acknowledged."""
        with self._shared._lock:
            self._shared._set_mark(self._state(), ledger_id, entry_id)

    @property
    def mark_delete(self) -> tuple[int, int] | None:
        """This subscription's mark-delete position, or None."""
        with self._shared._lock:
            return self._state().mark

    def tracked_entries(self, ledger_id: int, first_entry: int, last_entry: int) -> BitMap:
        """Entries of ``ledger_id`` in ``[first_entry, last_entry]`` this subscription still has
        to receive (its dispatcher skips reading them)."""
        _diagnose(ledger_id=ledger_id, entry_id=first_entry)
        _diagnose(ledger_id=ledger_id, entry_id=last_entry)
        with self._shared._lock:
            return self._shared._tracked_entries(self._state(), ledger_id, first_entry, last_entry)

    def should_pause_all_deliveries(self) -> bool:
        """The topic index's fixed-delay pause, unless this subscription has something due."""
        with self._shared._lock:
            if self._shared.closed or self._detached:
                return False
            state = self._state()
            if self._shared._has_available(state):
                return False
            return self._shared._topic.should_pause_all_deliveries()

    def __repr__(self) -> str:
        return f"Subscription({self._name!r})"
