"""InMemoryTracker: Pulsar's in-memory delayed-delivery tracker, exact and deduplicated.

How it works. The state lives in a ``TrackerCore`` (native or pure, chosen by
``delayindex._impl``): a flat 24-byte-per-message heap ordered by ``(deliver_at, ledger, entry)``
and one roaring bitmap per ledger as the dedup index. Unlike Pulsar 4.1+ it keeps exact
timestamps (no time bucketing), and unlike Pulsar 2.4-4.0 it deduplicates, so ``len()`` is the
number of distinct tracked positions. This class joins the core to a clock, a timer and a lock;
the core itself never reads time.

Thread safety: one lock guards every public method, so ``contains`` may be called from reader
threads and timer callbacks may arrive on another thread. ``on_ready`` is called without the lock
held, so it may call back into the tracker.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import numpy.typing as npt

from delayindex import _impl, _registry
from delayindex._browse import histogram_edges, select_pending, time_range
from delayindex._ints import int64_array
from delayindex.clock import Clock
from delayindex.config import TrackerConfig
from delayindex.errors import TrackerClosedError
from delayindex.model import ADD_DELIVER, MAX_ENTRY_ID, MAX_TIME, MIN_TIME, Position
from delayindex.timers import ArmingRule, Timer
from delayindex.tracker._front import TrackerFront, as_count

_DEFAULT_CONFIG = TrackerConfig()
_INT_LIKE = "integer"


class InMemoryTracker(TrackerFront):
    """Single-heap delayed-message tracker (Pulsar's in-memory tracker; reference and fallback).

    Args:
        config: tick, strict mode and fixed-delay lookahead are used; bucket settings are not.
        clock: zero-argument callable returning epoch ms as ``int`` (default: wall clock).
        timer: optional :class:`~delayindex.timers.Timer`; when given, the tracker keeps one
            handle armed by Pulsar's rule and calls ``on_ready()`` when a live one fires.
        on_ready: called (without the tracker's lock) when armed messages may be due.

    Example:
        >>> from delayindex import InMemoryTracker, ManualClock
        >>> clock = ManualClock(0)
        >>> tracker = InMemoryTracker(clock=clock)
        >>> tracker.add(1, 0, 5_000), tracker.add(1, 1, -1)
        (True, False)
        >>> _ = clock.set(4_000)
        >>> tracker.poll(10)
        [Position(ledger_id=1, entry_id=0)]
    """

    def __init__(
        self,
        config: TrackerConfig = _DEFAULT_CONFIG,
        *,
        clock: Clock | None = None,
        timer: Timer | None = None,
        on_ready: Callable[[], object] | None = None,
    ) -> None:
        if not isinstance(config, TrackerConfig):
            raise TypeError(f"config must be a TrackerConfig, got {type(config).__name__}")
        if clock is not None and not callable(clock):
            raise TypeError("clock must be a zero-argument callable returning epoch ms")
        if on_ready is not None and not callable(on_ready):
            raise TypeError("on_ready must be callable")
        self._config = config
        self._clock: Clock = clock if clock is not None else _impl.wall_clock_ms
        self._core: Any = _impl.TrackerCore(**config.core_settings())
        self._lock = _impl.Lock()  # the native fronts take it from C
        self._arming = ArmingRule(timer, self._on_timer) if timer is not None else None
        self._front = _impl.Front(self._lock, self._clock, self._core)
        self._front.arming = self._arming
        self._bind_front()
        self._on_ready = on_ready
        self._closed = False
        _registry.enroll(self)

    # -- time ---------------------------------------------------------------------------------

    # -- adding -------------------------------------------------------------------------------

    def add(self, ledger_id: int, entry_id: int, deliver_at: int) -> bool:
        """Track a message until ``deliver_at`` (epoch ms).

        Returns True when the message is now tracked (do not deliver it yet), False when it
        should be delivered now: ``deliver_at < 0`` (not delayed) or already due. A due re-add of
        a tracked position untracks it and returns False; a re-add of a tracked, not-due position
        is a no-op returning True. O(log n).

        Raises:
            ValueError: an id is out of range (``0 <= ledger_id < 2**63``,
                ``0 <= entry_id < 2**32``) or ``deliver_at`` does not fit int64.
            TypeError: an argument is not an int.
        """
        # Each instance calls the front's add directly (_bind_front): lock, clock, core, timer
        # re-arm in one native call.
        return self._front.add(ledger_id, entry_id, deliver_at)

    def add_many(
        self, ledger_ids: object, entry_ids: object, deliver_ats: object
    ) -> npt.NDArray[np.bool_]:
        """:meth:`add` each ``(ledger_ids[i], entry_ids[i], deliver_ats[i])`` in order.

        Accepts sequences of ints or integer numpy arrays of equal length. Everything is
        validated before anything changes. Returns a bool array (True = tracked).

        Raises:
            ValueError: lengths differ, an id is out of range, or a value does not fit int64.
            TypeError: a value is not an integer (floats and bools are rejected).
        """
        ledgers = as_int64_array(ledger_ids, "ledger_ids")
        entries = as_int64_array(entry_ids, "entry_ids")
        deliver = as_int64_array(deliver_ats, "deliver_ats")
        with self._lock:
            now = self._now()
            tracked = self._core.add_many(ledgers, entries, deliver, now)
            if self._arming is not None and len(tracked):
                self._rearm(now)
            return tracked  # type: ignore[no-any-return]

    # -- cancel, reschedule, browse -----------------------------------------------------------

    def cancel(self, ledger_id: int, entry_id: int) -> bool:
        """Untrack a scheduled message for good: it is never delivered, and a later ``add`` of
        the same position is refused (returns True: do not deliver) until :meth:`clear`.

        Returns True if the position was tracked, False otherwise (nothing changes). O(1): the
        heap node stays behind and is skipped when it reaches the head.

        Raises:
            ValueError: an id is out of range. TypeError: an id is not an int.
            TrackerClosedError: the tracker is closed.
        """
        try:
            return self._front.cancel(ledger_id, entry_id)
        except (TypeError, OverflowError):
            _diagnose(ledger_id=ledger_id, entry_id=entry_id)
            raise

    def cancel_many(self, ledger_ids: object, entry_ids: object) -> npt.NDArray[np.bool_]:
        """:meth:`cancel` each ``(ledger_ids[i], entry_ids[i])``; everything is validated
        before anything changes. Returns a bool array (True = it was tracked).

        Raises:
            ValueError: lengths differ or an id is out of range. TypeError: a value is not an
            integer. TrackerClosedError: the tracker is closed.
        """
        ledgers = as_int64_array(ledger_ids, "ledger_ids")
        entries = as_int64_array(entry_ids, "entry_ids")
        with self._lock:
            return self._core.cancel_many(ledgers, entries)  # type: ignore[no-any-return]

    def reschedule(self, ledger_id: int, entry_id: int, deliver_at: int) -> bool:
        """Move a position, tracked or not, to ``deliver_at``; a later ``add`` of it keeps the
        new time (until :meth:`clear`), and a cancelled one is scheduled again.

        Returns what :meth:`add` returns for the new time: True (tracked), False (due now: it
        is untracked, deliver it).

        Raises:
            ValueError: an id is out of range or ``deliver_at`` does not fit int64.
            TypeError: an argument is not an int. TrackerClosedError: the tracker is closed.
        """
        with self._lock:
            now = self._clock()
            try:
                code = self._core.reschedule(ledger_id, entry_id, deliver_at, now)
            except (TypeError, OverflowError):
                _diagnose(ledger_id=ledger_id, entry_id=entry_id, deliver_at=deliver_at)
                self._now()
                raise
            self._rearm(now)
            return bool(code != ADD_DELIVER)

    def pending(
        self, start_ms: int | None = None, end_ms: int | None = None, limit: int = 1000
    ) -> list[tuple[int, Position]]:
        """Up to ``limit`` tracked positions with ``start_ms <= deliver_at < end_ms`` (None:
        unbounded), in ``(deliver_at, position)`` order, as ``(deliver_at, Position)`` pairs.
        Nothing is removed. O(n) in the tracked messages.

        Raises:
            TypeError: a bound or ``limit`` is not an int. ValueError: a bound beyond int64.
        """
        bounds = time_range(start_ms, end_ms)
        as_count(limit, "limit")
        with self._lock:
            if bounds is None or self._closed:
                return []
            times, ledgers, entries = self._core.live_keys(*bounds)
        return select_pending(times, ledgers, entries, limit)

    def due_histogram(self, edges: object) -> npt.NDArray[np.int64]:
        """Exact count of tracked positions per ``[edges[i], edges[i+1])``; ``edges`` are
        strictly increasing ints (at least two). O(n) in the tracked messages.

        Raises:
            TypeError: an edge is not an integer. ValueError: fewer than two edges, not
            strictly increasing, or beyond int64.
        """
        bins = histogram_edges(edges)
        with self._lock:
            if self._closed:
                return np.zeros(len(bins) - 1, dtype=np.int64)
            return self._core.due_histogram(bins)  # type: ignore[no-any-return]

    # -- delivering ---------------------------------------------------------------------------

    def has_message_available(self) -> bool:
        """Whether some tracked message is due (False once closed). When not, (re)arms the timer
        (Pulsar #10078)."""
        with self._lock:
            if self._closed:
                return False
            now = self._now()
            due = bool(self._core.has_due(now))
            if not due:
                self._rearm(now)
            return due

    def poll(self, max_messages: int) -> list[Position]:
        """Remove and return up to ``max_messages`` due positions.

        Positions are selected in ``(deliver_at, ledger_id, entry_id)`` order and returned
        sorted by position. ``max_messages <= 0`` returns ``[]``. Re-arms the timer.
        """
        max_messages = as_count(max_messages)
        try:  # one call into the front: lock, clock, core, timer re-arm
            return self._front.poll(max_messages)
        except TypeError:
            self._now()  # names a bad clock value
            raise

    def next_delivery_time(self) -> int | None:
        """Smallest tracked ``deliver_at``, or None when nothing is tracked."""
        with self._lock:
            return self._core.next_time()  # type: ignore[no-any-return]

    def contains(self, ledger_id: int, entry_id: int) -> bool:
        """Whether the position is tracked and not yet delivered. Safe from other threads."""
        # Each instance calls the front's contains directly (_bind_front).
        return self._front.contains(ledger_id, entry_id)

    def __len__(self) -> int:
        """Number of tracked, undelivered positions (exact)."""
        return len(self._core)

    def should_pause_all_deliveries(self) -> bool:
        """Pulsar's fixed-delay detection: pause cursor reads while delays look fixed.

        True when lookahead > 0, every message so far had (nearly) the same delay, at least
        ``fixed_delay_lookahead`` are tracked and none is due.
        """
        with self._lock:
            now = self._now()
            pause = bool(self._core.should_pause(now))
            if not self._core.has_due(now):
                self._rearm(now)
            return pause

    # -- housekeeping -------------------------------------------------------------------------

    def memory_usage_bytes(self) -> int:
        """Resident estimate: heap array (capacity x 24 B) + bitmaps + index containers."""
        with self._lock:
            return self._core.memory_bytes()  # type: ignore[no-any-return]

    def stats(self) -> dict[str, Any]:
        """Counters and gauges: tracked, added, duplicates, delivered, memory, timer state, ..."""
        with self._lock:
            out: dict[str, Any] = dict(self._core.counters())
            out.update(
                implementation=_impl.IMPLEMENTATION,
                build=_impl.BUILD,
                memory_bytes=self._core.memory_bytes(),
                tick_ms=self._core.tick_ms,
                strict=self._config.strict,
                timer_armed=self._arming is not None and self._arming.armed,
                timer_target=self._arming.target if self._arming is not None else -1,
                closed=self._closed,
            )
            return out

    def clear(self) -> None:
        """Drop every tracked message, the cancel and reschedule overrides, and cancel the
        timer."""
        with self._lock:
            self._core.clear()
            if self._arming is not None:
                self._arming.cancel()

    def close(self) -> None:
        """Cancel the timer and release memory. Idempotent; later adds and polls raise."""
        with self._lock:
            if self._closed:
                return
            self._closed = self._front.closed = True
            _registry.withdraw(self)
            if self._arming is not None:
                self._arming.cancel()
            self._core.clear()
            self._core = self._front.core = _ClosedCore(self._core)

    def __repr__(self) -> str:
        state = "closed" if self._closed else f"tracked={len(self)}"
        return f"<InMemoryTracker {state} tick_ms={self._core.tick_ms}>"


class _ClosedCore:
    """Stands in for a core after close (either tracker's): queries see an empty tracker,
    changes raise TrackerClosedError."""

    def __init__(self, old: Any) -> None:
        self.tick_ms = old.tick_ms
        self._counters = old.counters()

    def _closed(self, *args: object) -> Any:
        raise TrackerClosedError("the tracker is closed")

    add = add_many = poll = cancel = cancel_many = reschedule = _closed

    def contains(self, ledger: int, entry: int) -> bool:
        return False

    def has_due(self, now: int) -> bool:
        return False

    def should_pause(self, now: int) -> bool:
        return False

    def next_time(self) -> None:
        return None

    def __len__(self) -> int:
        return 0

    def clear(self) -> None:
        pass

    def memory_bytes(self) -> int:
        return 0

    def index_bitmap(self, ledger: int, first: int = 0, last: int = 0) -> None:
        return None

    def counters(self) -> dict[str, Any]:
        return dict(self._counters)

    def _check(self) -> None:
        pass


# -- argument checking (kept off the hot path: called only once a fast call has failed) ---------


def _diagnose(**values: object) -> None:
    """Raise a clear TypeError/ValueError naming the first bad argument, if any."""
    bounds = {
        "ledger_id": (0, 2**63 - 1),
        "entry_id": (0, MAX_ENTRY_ID),
        "deliver_at": (MIN_TIME, MAX_TIME),
    }
    for name, value in values.items():
        if isinstance(value, bool):
            raise TypeError(f"{name} must be an int, got bool")
        if not isinstance(value, int):
            try:
                value = value.__index__()  # type: ignore[attr-defined]
            except AttributeError:
                raise TypeError(f"{name} must be an int, got {type(value).__name__}") from None
        low, high = bounds[name]
        if not low <= value <= high:
            raise ValueError(f"{name} must be in [{low}, {high}], got {value}")


def as_int64_array(values: object, name: str) -> npt.NDArray[np.int64]:
    """Convert a sequence or integer array to a 1-d C-contiguous int64 array, strictly.

    Raises ``TypeError`` for floats, bools or other non-integers and ``ValueError`` for values
    outside int64 or a shape that is not 1-d (see :func:`delayindex._ints.int64_array`).
    """
    if not isinstance(values, np.ndarray) and (
        isinstance(values, str | bytes) or not hasattr(values, "__len__")
    ):
        raise TypeError(f"{name} must be a sequence of ints or an int64 array")
    return int64_array(values, name)
