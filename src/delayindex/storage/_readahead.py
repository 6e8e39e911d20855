"""Segment read-ahead: a background thread reads the entry bytes of segments a tracker will need
soon, so that the read which later decodes them finds the bytes in memory instead of waiting
for the storage.

A tracker hints with :meth:`ReadAhead.request` (it never blocks and never fails); the storage's
segment read asks :meth:`ReadAhead.take` before it reads. Only the framed entry bytes are held
here (the storage's read callback also warms its metadata cache): their checksums and decoding
stay on the caller's own read, so damage is found, named and handled exactly as without
read-ahead. A background read that fails is dropped and counted; the
caller's read then meets the fault itself and reports it the usual way.

Invariants: bytes are handed out only for the object key, fingerprint and segment range they
were read for (objects are immutable; the fingerprint catches a replaced object), and each at
most once; at most ``max_bytes`` of entry bytes are held (the oldest dropped first) and at most
``max_pending`` hints wait; a hint for a range already waiting, being read or held is ignored.
``take`` of a range still waiting withdraws the hint (the caller reads it now); ``take`` of the
range being read waits for that one read rather than reading it twice. In a forked child a
read-ahead starts over empty (the thread did not survive the fork), so nothing waits for it.
"""

from __future__ import annotations

import os
import threading
import weakref
from collections import OrderedDict, deque
from collections.abc import Callable, Hashable

#: What the background read returns: the object's fingerprint and its framed entries.
ReadResult = tuple[Hashable, list[bytes]]
#: (object key, first segment, last segment)
RangeKey = tuple[str, int, int]

#: Counters of :meth:`ReadAhead.stats`.
READAHEAD_COUNTERS = ("requested", "read", "hits", "misses", "stale", "failed", "dropped")


class ReadAhead:
    """A bounded read-ahead of segment entry bytes on one daemon thread (started on first use).

    Args:
        read: ``read(key, first, last)`` reads segments ``first..last`` of object ``key``:
            ``(fingerprint, entries)``, or None when the object has no such segments. Runs on
            the read-ahead thread; any exception it raises drops that hint.
        max_bytes: entry bytes held at most (> 0).
        max_pending: hints waiting at most (> 0); more are dropped.
    """

    def __init__(
        self, read: Callable[[str, int, int], ReadResult | None], max_bytes: int, max_pending: int
    ) -> None:
        if max_bytes <= 0 or max_pending <= 0:
            raise ValueError("max_bytes and max_pending must be > 0")
        self._read = read
        self._max_bytes = max_bytes
        self._max_pending = max_pending
        self._cond = threading.Condition(threading.Lock())
        self._queue: deque[RangeKey] = deque()
        self._reading: RangeKey | None = None
        self._held: OrderedDict[RangeKey, tuple[Hashable, list[bytes], int]] = OrderedDict()
        self._held_bytes = 0
        self._thread: threading.Thread | None = None
        self._closed = False
        self._counts = dict.fromkeys(READAHEAD_COUNTERS, 0)
        _instances.add(self)

    def _after_fork_in_child(self) -> None:
        # The thread did not survive the fork, and its lock may have been held by it: start
        # over empty, with a new lock; the next hint starts a new thread.
        self._cond = threading.Condition(threading.Lock())
        self._queue.clear()
        self._reading = None
        self._held.clear()
        self._held_bytes = 0
        self._thread = None

    def request(self, key: str, first: int, last: int) -> bool:
        """Read segments ``first..last`` of ``key`` in the background; False if the hint was
        ignored (already known, closed) or dropped (too many waiting)."""
        wanted = (key, first, last)
        with self._cond:
            if self._closed or wanted == self._reading or wanted in self._held:
                return False
            if wanted in self._queue:  # at most max_pending entries: a short scan
                return False
            if len(self._queue) >= self._max_pending:
                self._counts["dropped"] += 1
                return False
            self._queue.append(wanted)
            self._counts["requested"] += 1
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="delayindex-readahead", daemon=True
                )
                self._thread.start()
            self._cond.notify_all()  # the thread, whoever else waits
        return True

    def take(self, key: str, fingerprint: Hashable, first: int, last: int) -> list[bytes] | None:
        """The entries of segments ``first..last`` of ``key`` if they were read ahead from the
        object with ``fingerprint``; None tells the caller to read them itself."""
        wanted = (key, first, last)
        with self._cond:
            while wanted == self._reading:
                self._cond.wait()
            held = self._held.pop(wanted, None)
            if held is None:
                if wanted in self._queue:
                    self._queue.remove(wanted)  # the caller reads it now
                    self._counts["misses"] += 1
                    self._cond.notify_all()
                return None
            self._held_bytes -= held[2]
            if held[0] != fingerprint:
                self._counts["stale"] += 1
                return None
            self._counts["hits"] += 1
            return held[1]

    def forget(self, key: str) -> None:
        """Drop every hint and held range of object ``key`` (it is being deleted)."""
        with self._cond:
            for wanted in [w for w in self._queue if w[0] == key]:
                self._queue.remove(wanted)
            for wanted in [w for w in self._held if w[0] == key]:
                self._held_bytes -= self._held.pop(wanted)[2]
            self._cond.notify_all()

    def stats(self) -> dict[str, int]:
        """The counters of :data:`READAHEAD_COUNTERS`, plus ``held_bytes`` and ``waiting``."""
        with self._cond:
            return {**self._counts, "held_bytes": self._held_bytes, "waiting": len(self._queue)}

    def wait_idle(self, timeout: float | None = None) -> bool:
        """Wait until no hint is waiting or being read; False if ``timeout`` s passed first."""
        with self._cond:
            return self._cond.wait_for(
                lambda: self._closed or (not self._queue and self._reading is None), timeout
            )

    def close(self) -> None:
        """Stop the thread (after the read it is in) and drop everything held."""
        with self._cond:
            self._closed = True
            self._queue.clear()
            self._held.clear()
            self._held_bytes = 0
            thread = self._thread
            self._cond.notify_all()
        if thread is not None and thread is not threading.current_thread():
            thread.join()

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._queue and not self._closed:
                    self._cond.wait()
                if self._closed:
                    return
                wanted = self._reading = self._queue.popleft()
            result: ReadResult | None = None
            try:
                result = self._read(*wanted)
            except Exception:  # a hint's fault is for the caller's own read to meet and report
                with self._cond:
                    self._counts["failed"] += 1
            with self._cond:
                self._reading = None
                if result is not None and not self._closed:
                    self._hold(wanted, result)
                self._cond.notify_all()

    def _hold(self, wanted: RangeKey, result: ReadResult) -> None:
        fingerprint, entries = result
        size = sum(len(e) for e in entries)
        self._held[wanted] = (fingerprint, entries, size)
        self._held_bytes += size
        self._counts["read"] += 1
        while self._held_bytes > self._max_bytes and self._held:
            self._held_bytes -= self._held.popitem(last=False)[1][2]


#: Every live read-ahead, reset in a forked child (see ``_after_fork_in_child``).
_instances: weakref.WeakSet[ReadAhead] = weakref.WeakSet()


def _reset_after_fork() -> None:
    for ahead in list(_instances):
        ahead._after_fork_in_child()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_reset_after_fork)
