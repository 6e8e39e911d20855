"""Timer protocol: Pulsar's arming rule with the 2026 fixes, and the three timer adapters."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest

from delayindex import (
    AsyncioTimer,
    InMemoryTracker,
    ManualClock,
    ManualTimer,
    ThreadingTimer,
    TrackerConfig,
)

T0 = 1_000_000


class Rig:
    """A tracker on a manual clock and timer, counting on_ready calls."""

    def __init__(self, **config: Any) -> None:
        self.clock = ManualClock(T0)
        self.timer = ManualTimer(self.clock)
        self.ready = 0
        self.tracker = InMemoryTracker(
            TrackerConfig(**config), clock=self.clock, timer=self.timer, on_ready=self.on_ready
        )

    def on_ready(self) -> None:
        self.ready += 1

    def armed(self) -> list[int]:
        return [h.deadline for h in self.timer.armed()]


def test_add_arms_one_timer_at_next_delivery() -> None:
    rig = Rig(tick_ms=100)
    rig.tracker.add(1, 0, T0 + 5000)
    assert rig.armed() == [T0 + 5000]
    rig.tracker.add(1, 1, T0 + 9000)  # later: the armed target stands
    assert rig.armed() == [T0 + 5000]
    assert len(rig.timer.history) == 1
    rig.tracker.add(1, 2, T0 + 3000)  # earlier: re-armed, old handle cancelled
    assert rig.armed() == [T0 + 3000]
    assert rig.timer.history[0].cancelled
    assert rig.tracker.stats()["timer_target"] == T0 + 3000


def test_live_fire_calls_on_ready_and_rearms_after_poll() -> None:
    rig = Rig(tick_ms=100)
    rig.tracker.add(1, 0, T0 + 5000)
    rig.tracker.add(1, 1, T0 + 7000)
    rig.clock.set(T0 + 4999)
    assert rig.timer.run_due() == 0 and rig.ready == 0
    rig.clock.set(T0 + 5000)
    assert rig.timer.run_due() == 1 and rig.ready == 1
    assert rig.armed() == []  # the fire consumed the handle
    assert rig.tracker.poll(10) == [(1, 0)]
    assert rig.armed() == [T0 + 7000]


def test_tick_floor_limits_refire_rate() -> None:
    rig = Rig(tick_ms=10_000)
    rig.tracker.add(1, 0, T0 + 20_000)
    rig.tracker.add(1, 1, T0 + 21_000)
    rig.clock.set(T0 + 20_000)
    rig.timer.run_due()  # last_tick_run = T0 + 20_000
    rig.tracker.add(2, 0, T0 + 60_000)
    assert rig.tracker.poll(1) == [(1, 0)]
    rig.clock.set(T0 + 20_500)
    rig.tracker.poll(0)
    # Armed when (1, 0) left: max(21_000 - 20_000, 20_000 + 10_000 - 20_000) = 10 s, not 1 s.
    assert rig.armed() == [T0 + 30_000]


def test_nothing_armed_when_due_or_empty() -> None:
    rig = Rig(tick_ms=0, strict=True)
    rig.tracker.add(1, 0, T0 + 10)
    rig.tracker.add(1, 1, T0 + 20)
    rig.clock.set(T0 + 30)
    rig.timer.run_due()
    assert rig.tracker.poll(1) == [(1, 0)]
    assert rig.armed() == []  # the next one is already due: no timer
    assert rig.tracker.has_message_available()
    assert rig.tracker.poll(1) == [(1, 1)]
    assert rig.armed() == []  # empty: no timer
    assert not rig.tracker.has_message_available()
    assert rig.armed() == []


def test_has_message_available_rearms_when_false() -> None:
    rig = Rig(tick_ms=0)
    rig.tracker.add(1, 0, T0 + 50)
    rig.timer.armed()[0].cancel()  # lose the handle behind the tracker's back (e.g. timer reset)
    rig.tracker._arming.target = -1  # type: ignore[union-attr]
    assert not rig.tracker.has_message_available()
    assert rig.armed() == [T0 + 50]


def test_stale_fire_does_nothing() -> None:
    rig = Rig(tick_ms=0)
    rig.tracker.add(1, 0, T0 + 5000)
    stale = rig.timer.history[0]
    rig.tracker.add(1, 1, T0 + 1000)  # supersedes the first handle
    stale.callback()  # a fire that raced with its cancellation
    assert rig.ready == 0
    assert rig.armed() == [T0 + 1000]
    assert rig.tracker.stats()["timer_target"] == T0 + 1000
    rig.clock.set(T0 + 1000)
    assert rig.timer.run_due() == 1 and rig.ready == 1


def test_cancelled_fire_does_nothing() -> None:
    rig = Rig(tick_ms=0)
    rig.tracker.add(1, 0, T0 + 5000)
    handle = rig.timer.history[0]
    rig.tracker.clear()
    assert handle.cancelled and rig.armed() == []
    handle.callback()
    assert rig.ready == 0


def test_strict_mode_does_not_stall_after_redelivery() -> None:
    """Pulsar #25996: a stale target left after a fire must not block re-arming."""
    rig = Rig(tick_ms=1000, strict=True)
    rig.tracker.add(7, 1, T0 + 1000)
    rig.clock.set(T0 + 1000)
    rig.timer.run_due()
    assert rig.tracker.poll(10) == [(7, 1)]
    rig.tracker.add(7, 1, T0 + 2500)  # the same position and a new time
    assert rig.armed() == [T0 + 2500]
    rig.clock.set(T0 + 2500)
    assert rig.timer.run_due() == 1 and rig.ready == 2
    assert rig.tracker.poll(10) == [(7, 1)]


def test_close_cancels_timer() -> None:
    rig = Rig()
    rig.tracker.add(1, 0, T0 + 5000)
    handle = rig.timer.history[0]
    rig.tracker.close()
    assert handle.cancelled
    handle.callback()
    assert rig.ready == 0


def test_on_ready_may_reenter_tracker() -> None:
    clock = ManualClock(T0)
    timer = ManualTimer(clock)
    delivered: list[Any] = []
    tracker: InMemoryTracker

    def on_ready() -> None:
        delivered.extend(tracker.poll(100))

    tracker = InMemoryTracker(TrackerConfig(tick_ms=0), clock=clock, timer=timer, on_ready=on_ready)
    tracker.add(3, 3, T0 + 10)
    clock.set(T0 + 10)
    timer.run_due()
    assert delivered == [(3, 3)]


# -- ManualTimer --------------------------------------------------------------------------------


def test_manual_timer_order_cascade_and_validation() -> None:
    clock = ManualClock(0)
    timer = ManualTimer(clock)
    log: list[str] = []
    timer.schedule(20, lambda: log.append("b"))

    def a_then_a2() -> None:
        log.append("a")
        timer.schedule(0, lambda: log.append("a2"))

    timer.schedule(10, a_then_a2)
    cancelled = timer.schedule(15, lambda: log.append("never"))
    assert cancelled.cancel()
    assert timer.next_deadline() == 10
    clock.set(25)
    assert timer.run_due() == 3
    assert log == ["a", "b", "a2"]  # a2 was armed at 25 (now + 0), after b's 20
    assert not timer.history[0].cancel()  # already fired
    with pytest.raises(ValueError):
        timer.schedule(-1, lambda: None)
    with pytest.raises(TypeError):
        timer.schedule(1.5, lambda: None)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        timer.schedule(1, "not callable")  # type: ignore[arg-type]


# -- ThreadingTimer -----------------------------------------------------------------------------


def test_threading_timer_fires_cancels_and_survives_errors(monkeypatch: pytest.MonkeyPatch) -> None:
    errors: list[BaseException | None] = []
    monkeypatch.setattr(threading, "excepthook", lambda args: errors.append(args.exc_value))
    with ThreadingTimer() as timer:
        fired = threading.Event()
        never = threading.Event()
        timer.schedule(1, lambda: 1 / 0)
        timer.schedule(5, fired.set)
        timer.schedule(20, never.set).cancel()
        assert fired.wait(5)
        assert not never.wait(0.2)
    assert len(errors) == 1 and isinstance(errors[0], ZeroDivisionError)
    with pytest.raises(RuntimeError):
        timer.schedule(1, lambda: None)


def test_tracker_with_threading_timer_wakes_dispatcher() -> None:
    ready = threading.Event()
    with ThreadingTimer() as timer:
        tracker = InMemoryTracker(TrackerConfig(tick_ms=0), timer=timer, on_ready=ready.set)
        from delayindex import wall_clock_ms

        assert tracker.add(1, 1, wall_clock_ms() + 30)
        assert ready.wait(5)
        assert tracker.has_message_available()
        assert tracker.poll(10) == [(1, 1)]
        tracker.close()


# -- AsyncioTimer -------------------------------------------------------------------------------


def test_asyncio_timer_same_and_other_thread() -> None:
    async def main() -> list[str]:
        loop = asyncio.get_running_loop()
        timer = AsyncioTimer()
        log: list[str] = []
        done = asyncio.Event()
        timer.schedule(1, lambda: log.append("loop"))
        timer.schedule(2, lambda: log.append("never")).cancel()

        def from_thread() -> None:
            def log_and_finish() -> None:
                log.append("thread")
                done.set()

            timer.schedule(5, log_and_finish)

        await loop.run_in_executor(None, from_thread)
        await asyncio.wait_for(done.wait(), 5)
        await asyncio.sleep(0.01)
        return log

    assert asyncio.run(main()) == ["loop", "thread"]


def test_asyncio_timer_needs_loop() -> None:
    with pytest.raises(RuntimeError):
        AsyncioTimer()
