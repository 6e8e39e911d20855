"""Pure-Python twins of the native ``Front`` (``cython/delayindex/_front.pxi``) and of
``SharedFront`` and ``SubFront`` (``cython/delayindex/_shared_front.pxi``).

How it works. A tracker's public ``add``, ``contains``, ``cancel``, ``poll`` and
``tracked_entries`` each take its lock, read its clock and call its core; the front does exactly
that, in one call, with the tracker's hooks called only when they apply (the native module's
header lists them: ``seal``, ``restore``, ``arming``, ``check_open``, ``load``,
``after_poll``, ``queued`` and ``submit``). The tracker sets ``core`` when it replaces its
core (on close) and ``closed`` when it closes.

A shared index's ``add`` and a subscription's ``contains`` answer from the topic index under
its lock alone unless the due log or a private heap holds the position (then the shared index's
hooks answer, with no lock held); the native header says why that is safe.

Invariants: none beyond the attributes' types (``_check`` is there for the twin API).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pyroaring import BitMap

from delayindex._pure._ints import as_i64, check_ids
from delayindex.model import (
    ADD_DELIVER,
    ADD_NEED_OVERRIDES,
    ADD_SEAL_FIRST,
    ADD_TRACKED,
    Position,
)


def _position(
    ledger: object, entry: object, diagnose: Callable[..., object] | None
) -> tuple[int, int]:
    """A call's position as checked ints; a TypeError/OverflowError goes through
    ``diagnose(ledger, entry)`` first (a tracker's hook that names the bad argument)."""
    try:
        c_ledger, c_entry = as_i64(ledger), as_i64(entry)
    except (TypeError, OverflowError):
        if diagnose is not None:
            diagnose(ledger, entry)
        raise
    check_ids(c_ledger, c_entry)
    return c_ledger, c_entry


class Front:
    """One call per hot tracker call: lock, clock, core, hooks.

    ``Front(lock, clock, core)``: ``lock`` has ``acquire()``/``release()`` (a
    ``threading.Lock``), ``clock()`` returns epoch ms, ``core`` is the tracker's core.
    """

    __slots__ = (
        "_clock",
        "_lock",
        "after_poll",
        "arming",
        "check_open",
        "closed",
        "core",
        "diagnose",
        "load",
        "queued",
        "restore",
        "seal",
        "submit",
    )

    def __init__(self, lock: Any, clock: Callable[[], int], core: Any) -> None:
        if not callable(clock):
            raise TypeError("clock must be callable")
        self._lock = lock
        self._clock = clock
        self.core: Any = core
        self.arming: Any = None
        self.seal: Callable[[], object] | None = None
        self.restore: Callable[[int], object] | None = None
        self.queued: Any = None  # a Sized (DelayIndex: its deque of jobs) or None
        self.submit: Callable[[], object] | None = None
        self.check_open: Callable[[], object] | None = None
        self.load: Callable[[int, int], object] | None = None
        self.after_poll: Callable[[int], object] | None = None
        self.diagnose: Callable[..., object] | None = None
        self.closed = False

    def add(self, ledger: int, entry: int, deliver_at: int) -> bool:
        """``core.add`` at the clock's now, under the lock; True unless it is to be delivered
        now. Bad arguments raise before anything happens (``diagnose`` may name them)."""
        try:
            c_ledger, c_entry, time = as_i64(ledger), as_i64(entry), as_i64(deliver_at)
            check_ids(c_ledger, c_entry)
            with self._lock:
                code = self._add_locked(ledger, entry, deliver_at, time)
        except (TypeError, OverflowError):  # a bad argument, or a bad clock value
            if self.diagnose is not None:
                self.diagnose(ledger, entry, deliver_at)
            raise
        if self.queued and self.submit is not None:
            self.submit()
        return bool(code != ADD_DELIVER)

    def _add_locked(self, ledger: int, entry: int, deliver_at: int, time: int) -> int:
        # The add under the lock (the caller holds it; SharedFront calls this too): the
        # core's answer code, after the seal, restore and timer hooks.
        now = as_i64(self._clock())
        core = self.core
        code: int = core.add(ledger, entry, deliver_at, now)
        if code == ADD_NEED_OVERRIDES and self.restore is not None:
            self.restore(ledger)
            code = core.add(ledger, entry, deliver_at, now)
        if code == ADD_SEAL_FIRST and self.seal is not None:
            self.seal()
            code = core.add(ledger, entry, deliver_at, now)
        arming = self.arming
        if code == ADD_TRACKED and arming is not None:
            target = arming.target
            if target < 0 or time < target:
                arming.update(core.next_time(), now, core.tick_ms)
        return code

    def contains(self, ledger: int, entry: int) -> bool:
        """``core.contains`` under the lock (``diagnose`` may name a bad argument)."""
        _position(ledger, entry, self.diagnose)
        with self._lock:
            return not self.closed and bool(self.core.contains(ledger, entry))

    def cancel(self, ledger: int, entry: int) -> bool:
        """``core.cancel`` under the lock: True if the position was tracked."""
        check_ids(as_i64(ledger), as_i64(entry))
        with self._lock:
            return bool(self.core.cancel(ledger, entry))

    def poll(self, max_messages: int) -> list[Position]:
        """``core.poll`` at the clock's now, under the lock, loading due segments through
        ``load`` as long as more is wanted; positions sorted by position."""
        max_messages = max(as_i64(max_messages), 0)
        with self._lock:
            if self.check_open is not None:
                self.check_open()
            now = as_i64(self._clock())
            core = self.core
            out: list[Position] = core.poll(max_messages, now)
            if self.load is not None:
                while core.load_needed >= 0 and len(out) < max_messages:
                    self.load(core.load_needed, now)
                    out = core.poll(max_messages - len(out), now, out)
            if self.after_poll is not None:
                self.after_poll(now)
            elif self.arming is not None:
                self.arming.update(core.next_time(), now, core.tick_ms)
        if self.queued and self.submit is not None:
            self.submit()
        return out

    def tracked_entries(self, ledger: int, first: int, last: int) -> BitMap:
        """``core.index_bitmap(ledger, first, last)`` under the lock: a new BitMap (empty when
        nothing is tracked there, the range is empty or the tracker is closed)."""
        c_ledger, c_first, c_last = as_i64(ledger), as_i64(first), as_i64(last)
        check_ids(c_ledger, c_first)
        check_ids(c_ledger, c_last)
        if c_last < c_first:
            return BitMap()
        with self._lock:
            bm = None if self.closed else self.core.index_bitmap(c_ledger, c_first, c_last)
        return BitMap() if bm is None else bm

    def _check(self) -> None:
        """Nothing to check beyond the types (the native twin checks its typed views)."""


class SharedFront:
    """The shared index's hot calls: ``SharedFront(topic_front, log_memory, log_spilled,
    private_count)``: the topic index's Front, the due log's two position sets
    (LedgerIndexes), the dict of positions held in private heaps. ``slow_add(ledger, entry,
    deliver_at)`` answers for a held position or a closed shared index (no lock held); without
    it every add goes to the topic index.
    """

    __slots__ = ("closed", "diagnose", "log_memory", "log_spilled", "private_count", "slow_add",
                 "topic")  # fmt: skip

    def __init__(
        self,
        topic_front: Front,
        log_memory: Any,
        log_spilled: Any,
        private_count: dict[tuple[int, int], int],
    ) -> None:
        if topic_front is None or log_memory is None or log_spilled is None:
            raise TypeError("topic_front, log_memory and log_spilled must not be None")
        if not isinstance(private_count, dict):
            raise TypeError("private_count must be a dict")
        self.topic = topic_front
        self.log_memory = log_memory
        self.log_spilled = log_spilled
        self.private_count = private_count
        self.slow_add: Callable[[int, int, int], bool] | None = None
        self.diagnose: Callable[[object, object, object], object] | None = None
        self.closed = False

    def _held(self, ledger: int, entry: int) -> bool:
        return bool(
            self.log_memory.contains(ledger, entry)
            or self.log_spilled.contains(ledger, entry)
            or (self.private_count and (ledger, entry) in self.private_count)
        )

    def add(self, ledger: int, entry: int, deliver_at: int) -> bool:
        """The topic index's add under its lock, unless the position is held or the shared
        index closed (then ``slow_add``); True unless it is to be delivered now. Bad arguments
        raise first (``diagnose`` may name them)."""
        try:
            return self._add(ledger, entry, deliver_at)
        except (TypeError, OverflowError):  # a bad argument, or a bad clock value
            if self.diagnose is not None:
                self.diagnose(ledger, entry, deliver_at)
            raise

    def _add(self, ledger: int, entry: int, deliver_at: int) -> bool:
        c_ledger, c_entry, time = as_i64(ledger), as_i64(entry), as_i64(deliver_at)
        check_ids(c_ledger, c_entry)
        topic = self.topic
        slow = self.closed and self.slow_add is not None
        code = ADD_DELIVER
        if not slow:
            with topic._lock:
                slow = self.slow_add is not None and self._held(c_ledger, c_entry)
                if not slow:
                    code = topic._add_locked(ledger, entry, deliver_at, time)
        if slow:
            assert self.slow_add is not None
            return bool(self.slow_add(ledger, entry, deliver_at))
        if topic.queued and topic.submit is not None:
            topic.submit()
        return bool(code != ADD_DELIVER)

    def is_held(self, ledger: int, entry: int) -> bool:
        """Whether the due log or a private heap holds the position (no lock taken)."""
        c_ledger, c_entry = as_i64(ledger), as_i64(entry)
        check_ids(c_ledger, c_entry)
        return self._held(c_ledger, c_entry)

    def _check(self) -> None:
        """Nothing beyond the types to check (the native twin's attributes are typed)."""


class SubFront:
    """A subscription's hot calls: ``SubFront(shared_front)``. ``slow_contains(ledger, entry)``
    answers for a held position (no lock held); without it the topic index answers. The
    subscription binds ``contains`` as its own (no Python frame per call)."""

    __slots__ = ("_mark", "detached", "diagnose", "shared", "slow_contains")

    def __init__(self, shared: SharedFront) -> None:
        if shared is None:
            raise TypeError("shared must not be None")
        self.shared = shared
        self.slow_contains: Callable[[int, int], bool] | None = None
        self.diagnose: Callable[[object, object], object] | None = None
        self.detached = False
        self._mark: tuple[int, int] | None = None

    @property
    def mark(self) -> tuple[int, int] | None:
        """The subscription's mark-delete position ``(ledger, entry)``, or None."""
        return self._mark

    @mark.setter
    def mark(self, value: tuple[int, int] | None) -> None:
        if value is None:
            self._mark = None
            return
        ledger, entry = value
        self._mark = (as_i64(ledger), as_i64(entry))

    def contains(self, ledger: int, entry: int) -> bool:
        """Whether the subscription still has to receive the position: False when closed,
        detached or acknowledged; else the topic index's answer, unless the position is held
        (then ``slow_contains``). A bad id raises; ``diagnose`` may name it first."""
        c_ledger, c_entry = _position(ledger, entry, self.diagnose)
        shared = self.shared
        if shared.closed or self.detached:
            return False
        if self._mark is not None and (c_ledger, c_entry) <= self._mark:
            return False
        topic = shared.topic
        with topic._lock:
            slow = self.slow_contains is not None and shared._held(c_ledger, c_entry)
            if not slow:
                return not topic.closed and bool(topic.core.contains(ledger, entry))
        assert self.slow_contains is not None
        return bool(self.slow_contains(ledger, entry))

    def _check(self) -> None:
        """Nothing beyond the types to check (the native twin's attributes are typed)."""
