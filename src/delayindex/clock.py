"""Clocks: zero-argument callables returning epoch milliseconds as ``int``.

The tracker never reads time on its own; it calls the clock it was given. ``wall_clock_ms`` is the
default; :class:`ManualClock` makes tests and simulations deterministic.
"""

from __future__ import annotations

import time
from collections.abc import Callable

Clock = Callable[[], int]


def wall_clock_ms() -> int:
    """Return the current wall-clock time in epoch milliseconds."""
    return time.time_ns() // 1_000_000


class ManualClock:
    """A clock that only moves when told to.

    >>> clock = ManualClock(start_ms=1_000)
    >>> clock.advance(500)
    1500
    >>> clock()
    1500
    """

    __slots__ = ("_now",)

    def __init__(self, start_ms: int = 0) -> None:
        self._now = _as_ms(start_ms, "start_ms")

    def __call__(self) -> int:
        """Return the current time in epoch milliseconds."""
        return self._now

    def set(self, ms: int) -> int:
        """Jump to ``ms`` (it may move backwards, to test clock skew) and return it."""
        self._now = _as_ms(ms, "ms")
        return self._now

    def advance(self, ms: int) -> int:
        """Move forward by ``ms >= 0`` milliseconds and return the new time."""
        ms = _as_ms(ms, "ms")
        if ms < 0:
            raise ValueError(f"advance() needs ms >= 0, got {ms}")
        self._now += ms
        return self._now

    def __repr__(self) -> str:
        return f"ManualClock({self._now})"


def _as_ms(value: object, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int of epoch milliseconds, got {type(value).__name__}")
    return value
