"""Pure-Python twin of the native ``Front`` (``cython/delayindex/_front.pxi``).

How it works. A tracker's public ``add``, ``contains``, ``cancel``, ``poll`` and
``tracked_entries`` each take its lock, read its clock and call its core; the front does exactly
that, in one call, with the tracker's hooks called only when they apply (the native module's
header lists them: ``seal``, ``restore``, ``arming``, ``check_open``, ``load``,
``after_poll``, ``queued`` and ``submit``). The tracker sets ``core`` when it replaces its
core (on close) and ``closed`` when it closes.

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
        self.closed = False

    def add(self, ledger: int, entry: int, deliver_at: int) -> bool:
        """``core.add`` at the clock's now, under the lock; True unless it is to be delivered
        now. Bad arguments raise before anything happens."""
        c_ledger, c_entry, time = as_i64(ledger), as_i64(entry), as_i64(deliver_at)
        check_ids(c_ledger, c_entry)
        with self._lock:
            now = as_i64(self._clock())
            core = self.core
            code = core.add(ledger, entry, deliver_at, now)
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
        if self.queued and self.submit is not None:
            self.submit()
        return bool(code != ADD_DELIVER)

    def contains(self, ledger: int, entry: int) -> bool:
        """``core.contains`` under the lock."""
        check_ids(as_i64(ledger), as_i64(entry))
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
