"""The tracker front (lock, clock, core dispatch, hooks): native twin against pure twin.

A Hypothesis state machine drives a native ``Front`` over native cores and a pure ``Front``
over pure cores with the same calls: adds (including bad arguments, due and not-delayed
messages, and adds the bucket core answers with "seal first"), contains, cancels, the clock
moving, and the core swapped for the closed stand-in. Results, exceptions, the timer hook's
calls, the seal hook's calls and the queued-job submissions must agree, and each front must
agree with the model the core stateful tests check (tests/test_core_stateful.py): a dict of
tracked positions.
"""

from __future__ import annotations

import threading
from collections import deque
from types import ModuleType
from typing import Any

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from delayindex import ManualClock, _impl
from delayindex.errors import TrackerClosedError
from delayindex.tracker.in_memory import _ClosedCore

_native = _impl.native_module_or_none()
assert _native is not None, "the native extension must be built for the differential test"
native_module: ModuleType = _native  # declared narrowed: functions see the declared type

_BAD_IDS: list[Any] = [-1, 2**32, 2**63, True, 1.5, "1"]
# Mostly valid (shrinking towards them), so that adds, polls and cancels meet tracked messages.
ids = st.integers(0, 29).map(lambda i: i % 4 if i < 24 else _BAD_IDS[i - 24])
times = st.integers(-2, 66).map(lambda t: t if t <= 60 else [2**63, None][t % 2])


class Arming:
    """Records the front's timer updates (an ArmingRule stand-in)."""

    def __init__(self) -> None:
        self.target = -1
        self.calls: list[tuple[Any, int, int]] = []

    def update(self, next_time: int | None, now: int, tick: int) -> None:
        self.calls.append((next_time, now, tick))
        self.target = -1 if next_time is None else next_time


class Side:
    """One twin: its front, core, clock and hooks."""

    def __init__(self, front_type: Any, core: Any, bucket: bool) -> None:
        self.clock = ManualClock(0)
        self.core = core
        self.lock = threading.Lock()
        self.front = front_type(self.lock, self.clock, core)
        self.arming = Arming()
        self.front.arming = self.arming
        self.queued: deque[int] = deque()
        self.front.queued = self.queued
        self.submitted = 0
        self.front.submit = self.submit
        self.seals = 0
        self.sid = 0
        if bucket:
            self.front.seal = self.seal

    def submit(self) -> None:
        assert not self.lock.locked()  # submitted after the lock is released
        self.submitted += len(self.queued)
        self.queued.clear()

    def seal(self) -> None:
        assert self.lock.locked()  # sealed under the lock
        self.seals += 1
        self.core.seal(self.sid)
        self.sid += 1
        self.queued.append(self.sid)  # a job for after the lock: submit must run

    def call(self, name: str, *args: Any) -> Any:
        try:
            return getattr(self.front, name)(*args)
        except (TypeError, ValueError, OverflowError, TrackerClosedError) as exc:
            return type(exc)


def _cores(bucket: bool) -> tuple[Any, Any]:
    if bucket:
        settings_: dict[str, Any] = {
            "tick_ms": 1,
            "strict": False,
            "fixed_delay_lookahead": 0,
            "min_index_count_per_bucket": 3,
        }
        return native_module.BucketCore(**settings_), _impl.PureBucketCore(**settings_)
    return (
        native_module.TrackerCore(tick_ms=1, strict=False, fixed_delay_lookahead=0),
        _impl.PureTrackerCore(tick_ms=1, strict=False, fixed_delay_lookahead=0),
    )


class FrontTwins(RuleBasedStateMachine):
    """Native and pure fronts, each over its own core, against a dict model."""

    @initialize(bucket=st.booleans())
    def start(self, bucket: bool) -> None:
        native_core, pure_core = _cores(bucket)
        self.native = Side(native_module.Front, native_core, bucket)
        self.pure = Side(_impl.PureFront, pure_core, bucket)
        self.bucket = bucket
        self.model: dict[tuple[int, int], int] = {}
        self.cancelled: set[tuple[int, int]] = set()
        self.closed = False
        self.steps = 0

    def _both(self, name: str, *args: Any) -> Any:
        self.steps += 1
        got = self.native.call(name, *args)
        assert self.pure.call(name, *args) == got, name
        return got

    @rule(ledger=ids, entry=ids, deliver_at=times)
    def add(self, ledger: Any, entry: Any, deliver_at: Any) -> None:
        got = self._both("add", ledger, entry, deliver_at)
        if self.closed or not isinstance(got, bool):
            return
        position = (ledger, entry)
        if position in self.cancelled:  # refused: do not deliver, not tracked
            assert got is True
        elif deliver_at < 0 or deliver_at <= self.native.clock() + 1:  # tick 1: due
            self.model.pop(position, None)
            assert got is False
        else:
            self.model.setdefault(position, deliver_at)
            assert got is True

    @rule(ledger=ids, entry=ids)
    def contains(self, ledger: Any, entry: Any) -> None:
        got = self._both("contains", ledger, entry)
        if isinstance(got, bool):
            assert got == (not self.closed and (ledger, entry) in self.model)

    @rule(ledger=ids, entry=ids)
    def cancel(self, ledger: Any, entry: Any) -> None:
        got = self._both("cancel", ledger, entry)
        if isinstance(got, bool):
            assert got == ((ledger, entry) in self.model)
            if got:
                del self.model[ledger, entry]
                self.cancelled.add((ledger, entry))

    @rule(n=st.one_of(st.integers(-1, 5), st.just(2**63 - 1)))
    def poll(self, n: int) -> None:
        got = self._both("poll", n)
        if not isinstance(got, list):
            assert self.closed and got is TrackerClosedError
            return
        cutoff = self.native.clock() + 1  # tick 1
        due = sorted((t, lg, e) for (lg, e), t in self.model.items() if t <= cutoff)
        want = sorted((lg, e) for _, lg, e in due[: max(n, 0)])
        assert got == want
        for position in got:
            del self.model[position]

    @rule(ledger=ids, first=ids, last=ids)
    def tracked_entries(self, ledger: Any, first: Any, last: Any) -> None:
        if not self.bucket:
            return  # InMemoryTracker's core has no index bitmap (nor the tracker the call)
        got = self._both("tracked_entries", ledger, first, last)
        if isinstance(got, type):
            return
        want = set()
        if not self.closed:
            want = {e for (lg, e) in self.model if lg == ledger and first <= e <= last}
        assert set(got) == want

    @rule(step=st.integers(0, 30))
    def advance(self, step: int) -> None:
        self.native.clock.advance(step)
        self.pure.clock.advance(step)
        # Due messages stay tracked until polled: the model only forgets them on a due re-add.
        if not self.closed:
            assert self.native.core.next_time() == self.pure.core.next_time()

    @precondition(lambda self: self.steps >= 25)  # late: the other rules need an open front
    @rule()
    def close(self) -> None:
        for side in (self.native, self.pure):
            side.front.closed = True
            side.core = side.front.core = _ClosedCore(side.core)
        self.closed = True

    @invariant()
    def agree(self) -> None:
        if not hasattr(self, "native"):
            return
        for side in (self.native, self.pure):
            assert not side.lock.locked()
            side.front._check()
        assert self.native.arming.calls == self.pure.arming.calls
        assert (self.native.seals, self.native.submitted) == (self.pure.seals, self.pure.submitted)
        assert self.native.submitted == self.native.seals  # every queued job was submitted
        if not self.closed:
            assert len(self.native.core) == len(self.pure.core) == len(self.model)


TestFrontTwins = FrontTwins.TestCase
TestFrontTwins.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)


@pytest.mark.parametrize("front_type", [native_module.Front, _impl.PureFront])
def test_front_reads_a_wall_clock_and_a_given_clock_alike(front_type: Any) -> None:
    core = _impl.PureTrackerCore(tick_ms=0, strict=True, fixed_delay_lookahead=0)
    if front_type is native_module.Front:
        core = native_module.TrackerCore(tick_ms=0, strict=True, fixed_delay_lookahead=0)
    now = _impl.wall_clock_ms()
    wall = front_type(threading.Lock(), _impl.wall_clock_ms, core)
    assert wall.add(1, 0, now - 1) is False  # due by the wall clock
    assert wall.add(1, 1, now + 60_000) is True
    assert wall.contains(1, 1) and not wall.contains(1, 0)


@pytest.mark.parametrize("front_type", [native_module.Front, _impl.PureFront])
def test_front_names_a_bad_clock_value_and_releases_the_lock(front_type: Any) -> None:
    lock = threading.Lock()
    core = native_module.TrackerCore(tick_ms=0, strict=True, fixed_delay_lookahead=0)
    front = front_type(lock, lambda: 1.5, core)
    with pytest.raises(TypeError):
        front.add(1, 0, 10)
    assert not lock.locked() and len(core) == 0
    with pytest.raises(TypeError, match="callable"):
        front_type(lock, 5, core)
