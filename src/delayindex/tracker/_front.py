"""What both trackers' public fronts share: the clock check, the timer wiring, and the small
members of the contract that do not depend on how messages are stored.

A front holds a core (``TrackerCore`` or ``BucketCore``, or the closed stand-in), a clock, one
lock guarding every public method, and an optional :class:`~delayindex.timers.ArmingRule`.
"""

from __future__ import annotations

import threading
from abc import ABC, abstractmethod
from collections.abc import Callable
from types import TracebackType
from typing import Any, Self

from delayindex import _impl
from delayindex._ints import as_count
from delayindex.clock import Clock
from delayindex.config import TrackerConfig
from delayindex.timers import ArmingRule

__all__ = ["TrackerFront", "as_count"]


class TrackerFront(ABC):
    """Base of :class:`~delayindex.InMemoryTracker` and :class:`~delayindex.DelayIndex`."""

    _config: TrackerConfig
    _clock: Clock
    _core: Any
    _lock: threading.Lock
    _arming: ArmingRule | None
    _on_ready: Callable[[], object] | None
    _closed: bool
    _front: _impl.Front  # the native (or pure) Front; see _bind_front

    @abstractmethod
    def contains(self, ledger_id: int, entry_id: int) -> bool:
        """Whether the position is tracked and not yet delivered."""

    @abstractmethod
    def close(self) -> None:
        """Release the tracker."""

    def _bind_front(self) -> None:
        """Make the front's ``add`` and ``contains`` this tracker's own: no Python frame per
        call. The methods below document them; a bad argument or clock value is named by
        :meth:`_diagnose_call`, the front's ``diagnose`` hook."""
        front = self._front
        front.diagnose = self._diagnose_call
        # Instance attributes shadow the class's methods (which keep the docs and types).
        vars(self).update(add=front.add, contains=front.contains)

    def _diagnose_call(self, *args: object) -> None:
        """Raise the clear error of a bad ``(ledger_id, entry_id[, deliver_at])`` call, or of
        a bad clock value for an add (the front re-raises its own error otherwise)."""
        from delayindex.tracker.in_memory import _diagnose  # in_memory imports this module

        _diagnose(**dict(zip(("ledger_id", "entry_id", "deliver_at"), args, strict=False)))
        if len(args) == 3:
            self._now()

    def _now(self) -> int:
        now = self._clock()
        if type(now) is not int and (isinstance(now, bool) or not isinstance(now, int)):
            raise TypeError(f"clock() must return int epoch ms, got {type(now).__name__}")
        return now

    def _rearm(self, now: int) -> None:
        # Caller holds the lock.
        if self._arming is not None:
            self._arming.update(self._core.next_time(), now, self._core.tick_ms)

    def _on_timer(self, token: int) -> None:
        with self._lock:
            if self._arming is None or not self._arming.accept_fire(token, self._now()):
                return
        if self._on_ready is not None:
            self._on_ready()

    def __contains__(self, position: object) -> bool:
        """``(ledger_id, entry_id) in tracker``."""
        if not isinstance(position, tuple) or len(position) != 2:
            return False
        return self.contains(position[0], position[1])

    def reset_tick_time(self, tick_ms: int) -> None:
        """Use ``tick_ms`` from now on (cutoff slack and minimum re-trigger interval)."""
        if isinstance(tick_ms, bool) or not isinstance(tick_ms, int):
            raise TypeError(f"tick_ms must be an int, got {type(tick_ms).__name__}")
        if not 0 <= tick_ms < 2**62:
            raise ValueError(f"tick_ms must be in [0, 2**62), got {tick_ms}")
        with self._lock:
            self._core.tick_ms = tick_ms

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called."""
        return self._closed

    @property
    def config(self) -> TrackerConfig:
        """The configuration this tracker was created with."""
        return self._config

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
