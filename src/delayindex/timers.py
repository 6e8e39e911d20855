"""Timers that wake a dispatcher when delayed messages come due, and the rule that arms them.

A timer is any object with ``schedule(delay_ms, callback) -> handle`` whose handle has
``cancel()``. Three come with the library:

* :class:`ManualTimer` fires only when told to (``run_due``), against any clock; with a
  :class:`~delayindex.clock.ManualClock` it makes simulations and tests fully deterministic.
* :class:`ThreadingTimer` runs callbacks on one daemon thread (one thread per timer, however
  many trackers share it, like Pulsar's per-broker wheel timer).
* :class:`AsyncioTimer` runs callbacks on an asyncio event loop; ``schedule`` may be called from
  any thread.

:class:`ArmingRule` is Pulsar's ``updateTimer`` with the 2026 fixes (#26012): at most one armed
handle; delay ``max(next - now, last_tick_run + tick - now)``; nothing armed when the tracker is
empty or the next message is already due; state reset on every re-arm; a superseded or cancelled
fire is ignored (each arm gets a fresh token and only the current token is honoured).
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import threading
import time
from collections.abc import Callable
from typing import Protocol, Self

from delayindex.clock import Clock

Callback = Callable[[], object]


class TimerHandle(Protocol):
    """What ``Timer.schedule`` returns."""

    def cancel(self) -> object:
        """Stop the callback from running if it has not run yet."""


class Timer(Protocol):
    """Anything that can run a callback after a delay."""

    def schedule(self, delay_ms: int, callback: Callback) -> TimerHandle:
        """Run ``callback()`` once, ``delay_ms`` milliseconds from now."""


def _check_schedule_args(delay_ms: object, callback: object) -> int:
    if isinstance(delay_ms, bool) or not isinstance(delay_ms, int):
        raise TypeError(f"delay_ms must be an int, got {type(delay_ms).__name__}")
    if delay_ms < 0:
        raise ValueError(f"delay_ms must be >= 0, got {delay_ms}")
    if not callable(callback):
        raise TypeError("callback must be callable")
    return delay_ms


# -- ManualTimer --------------------------------------------------------------------------------


class ManualHandle:
    """Handle of a :class:`ManualTimer` callback."""

    __slots__ = ("callback", "cancelled", "deadline", "fired")

    def __init__(self, deadline: int, callback: Callback) -> None:
        self.deadline = deadline
        self.callback = callback
        self.cancelled = False
        self.fired = False

    def cancel(self) -> bool:
        """Cancel; returns False if it already fired."""
        if self.fired:
            return False
        self.cancelled = True
        return True

    def __repr__(self) -> str:
        state = "fired" if self.fired else "cancelled" if self.cancelled else "armed"
        return f"<ManualHandle deadline={self.deadline} {state}>"


class ManualTimer:
    """A timer that fires only from :meth:`run_due`, reading deadlines off ``clock``.

    >>> from delayindex import ManualClock
    >>> clock = ManualClock(0)
    >>> timer = ManualTimer(clock)
    >>> fired = []
    >>> _ = timer.schedule(100, lambda: fired.append(clock()))
    >>> timer.run_due(), clock.advance(100), timer.run_due(), fired
    (0, 100, 1, [100])
    """

    def __init__(self, clock: Clock) -> None:
        if not callable(clock):
            raise TypeError("clock must be a zero-argument callable returning epoch ms")
        self._clock = clock
        self._queue: list[tuple[int, int, ManualHandle]] = []
        self._seq = itertools.count()
        #: Every handle ever scheduled, in order (tests inspect armed deadlines through it).
        self.history: list[ManualHandle] = []

    def schedule(self, delay_ms: int, callback: Callback) -> ManualHandle:
        """Arm ``callback`` for ``clock() + delay_ms``."""
        delay_ms = _check_schedule_args(delay_ms, callback)
        handle = ManualHandle(self._clock() + delay_ms, callback)
        heapq.heappush(self._queue, (handle.deadline, next(self._seq), handle))
        self.history.append(handle)
        return handle

    def _drop_cancelled(self) -> None:
        while self._queue and self._queue[0][2].cancelled:
            heapq.heappop(self._queue)

    def next_deadline(self) -> int | None:
        """The earliest deadline of a live handle, or None."""
        self._drop_cancelled()
        return self._queue[0][0] if self._queue else None

    def armed(self) -> list[ManualHandle]:
        """Live (not fired, not cancelled) handles in deadline order."""
        return [h for _, _, h in sorted(self._queue) if not h.cancelled]

    def run_due(self) -> int:
        """Fire every live handle whose deadline is ``<= clock()``, earliest first.

        Callbacks may schedule more; those fire too if already due. Returns how many fired.
        """
        fired = 0
        while True:
            self._drop_cancelled()
            if not self._queue or self._queue[0][0] > self._clock():
                return fired
            _, _, handle = heapq.heappop(self._queue)
            handle.fired = True
            fired += 1
            handle.callback()


# -- ThreadingTimer -----------------------------------------------------------------------------


class ThreadHandle:
    """Handle of a :class:`ThreadingTimer` callback."""

    __slots__ = ("callback", "cancelled", "deadline")

    def __init__(self, deadline: float, callback: Callback) -> None:
        self.deadline = deadline
        self.callback = callback
        self.cancelled = False

    def cancel(self) -> bool:
        """Cancel; a callback that is already running is not interrupted."""
        self.cancelled = True
        return True


class ThreadingTimer:
    """Runs callbacks on one daemon thread, started lazily. Close it when done.

    Callbacks run one at a time; an exception in one is reported through
    ``threading.excepthook`` and does not stop the timer.
    """

    def __init__(self, name: str = "delayindex-timer") -> None:
        self._name = name
        self._cond = threading.Condition()
        self._queue: list[tuple[float, int, ThreadHandle]] = []
        self._seq = itertools.count()
        self._thread: threading.Thread | None = None
        self._closed = False

    def schedule(self, delay_ms: int, callback: Callback) -> ThreadHandle:
        """Run ``callback`` on the timer thread after ``delay_ms`` milliseconds."""
        delay_ms = _check_schedule_args(delay_ms, callback)
        handle = ThreadHandle(time.monotonic() + delay_ms / 1000.0, callback)
        with self._cond:
            if self._closed:
                raise RuntimeError("ThreadingTimer is closed")
            heapq.heappush(self._queue, (handle.deadline, next(self._seq), handle))
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
                self._thread.start()
            self._cond.notify()
        return handle

    def _run(self) -> None:
        while True:
            with self._cond:
                while True:
                    if self._closed:
                        return
                    while self._queue and self._queue[0][2].cancelled:
                        heapq.heappop(self._queue)
                    if self._queue:
                        wait = self._queue[0][0] - time.monotonic()
                        if wait <= 0:
                            _, _, handle = heapq.heappop(self._queue)
                            break
                        self._cond.wait(wait)
                    else:
                        self._cond.wait()
            if not handle.cancelled:
                try:
                    handle.callback()
                except Exception:
                    exc_type, exc, tb = _exc_info()
                    threading.excepthook(
                        threading.ExceptHookArgs((exc_type, exc, tb, threading.current_thread()))
                    )

    def close(self, timeout: float | None = 5.0) -> None:
        """Drop pending callbacks and stop the thread (waits up to ``timeout`` seconds)."""
        with self._cond:
            self._closed = True
            self._queue.clear()
            self._cond.notify_all()
            thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _exc_info() -> tuple[type[BaseException], BaseException, object]:
    import sys

    exc_type, exc, tb = sys.exc_info()
    assert exc_type is not None and exc is not None
    return exc_type, exc, tb


# -- AsyncioTimer -------------------------------------------------------------------------------


class AsyncioHandle:
    """Handle of an :class:`AsyncioTimer` callback; ``cancel`` is safe from any thread."""

    __slots__ = ("_cancelled", "_handle", "_lock")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._handle: asyncio.TimerHandle | None = None
        self._cancelled = False

    def _attach(self, handle: asyncio.TimerHandle) -> None:
        with self._lock:
            if self._cancelled:
                handle.cancel()
            else:
                self._handle = handle

    def cancel(self) -> bool:
        """Cancel the callback."""
        with self._lock:
            self._cancelled = True
            if self._handle is not None:
                self._handle.cancel()
        return True

    @property
    def cancelled(self) -> bool:
        """Whether :meth:`cancel` was called."""
        return self._cancelled


class AsyncioTimer:
    """Runs callbacks on ``loop`` (default: the loop running when the timer is created)."""

    def __init__(self, loop: asyncio.AbstractEventLoop | None = None) -> None:
        self._loop = loop if loop is not None else asyncio.get_running_loop()

    def schedule(self, delay_ms: int, callback: Callback) -> AsyncioHandle:
        """Run ``callback`` on the loop after ``delay_ms`` milliseconds (thread-safe)."""
        delay_ms = _check_schedule_args(delay_ms, callback)
        handle = AsyncioHandle()

        def arm() -> None:
            handle._attach(self._loop.call_later(delay_ms / 1000.0, callback))

        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is self._loop:
            arm()
        else:
            self._loop.call_soon_threadsafe(arm)
        return handle


# -- the arming rule ----------------------------------------------------------------------------


class ArmingRule:
    """Pulsar's timer rule for one tracker: keeps at most one armed handle.

    ``on_fire(token)`` is what the armed callback calls; the tracker passes it to
    :meth:`accept_fire` under its lock and notifies the dispatcher only if that returns True.
    """

    __slots__ = ("_handle", "_on_fire", "_timer", "_token", "_tokens", "last_tick_run", "target")

    def __init__(self, timer: Timer, on_fire: Callable[[int], None]) -> None:
        if not callable(getattr(timer, "schedule", None)):
            raise TypeError("timer must have a schedule(delay_ms, callback) method")
        self._timer = timer
        self._on_fire = on_fire
        self._handle: TimerHandle | None = None
        self._token = 0
        self._tokens = itertools.count(1)
        #: Deliver time the armed handle targets; -1 when nothing is armed.
        self.target = -1
        #: When the last live fire ran (epoch ms).
        self.last_tick_run = 0

    @property
    def armed(self) -> bool:
        """Whether a handle is armed."""
        return self._handle is not None

    def cancel(self) -> None:
        """Cancel the armed handle, if any, and forget the target."""
        handle, self._handle = self._handle, None
        self._token = 0
        self.target = -1
        if handle is not None:
            handle.cancel()

    def update(self, next_time: int | None, now: int, tick_ms: int) -> None:
        """Re-arm for ``next_time`` (None: nothing tracked) as Pulsar's ``updateTimer`` does."""
        if next_time is None:
            self.cancel()
            return
        if next_time == self.target:
            return
        self.cancel()
        delay = next_time - now
        if delay <= 0:
            return  # already due: the dispatcher reads when it has permits
        delay = max(delay, self.last_tick_run + tick_ms - now)
        token = next(self._tokens)
        on_fire = self._on_fire
        self._handle = self._timer.schedule(delay, lambda: on_fire(token))
        self._token = token
        self.target = next_time

    def accept_fire(self, token: int, now: int) -> bool:
        """Record a fire; True only for the currently armed handle (stale fires do nothing)."""
        if token != self._token or self._handle is None:
            return False
        self._handle = None
        self._token = 0
        self.target = -1
        self.last_tick_run = now
        return True
