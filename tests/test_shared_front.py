"""The shared index's fronts (SharedFront, SubFront): native twin against pure twin, and the
"not held" rule under the topic lock alone, with threads.

A Hypothesis state machine drives native fronts over a native topic Front and core, and pure
ones over pure, with the same calls: adds (bad arguments included), two subscriptions'
``contains``, positions entering and leaving the due log's two position sets and the private
counts, marks, an unsubscribe and the close. Results, exceptions and the hooks' calls must agree,
and each side must agree with a model: a held position or a closed index goes to the hook, with
no lock held; anything else is the topic core's.
"""

from __future__ import annotations

import tempfile
import threading
from typing import Any

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from delayindex import FileStorage, ManualClock, SharedDelayIndex, _impl
from delayindex.errors import TrackerClosedError

native_module = _impl.native_module_or_none()
assert native_module is not None, "the native extension must be built for the differential test"

_BAD_IDS: list[Any] = [-1, 2**32, 2**63, True, 1.5, "1"]
ids = st.integers(0, 27).map(lambda i: i % 4 if i < 22 else _BAD_IDS[i - 22])
positions = st.tuples(st.integers(0, 3), st.integers(0, 3))
times = st.integers(-2, 62).map(lambda t: t if t <= 60 else 2**63)


class Side:
    """One twin: a topic Front over its core, the shared front, two subscription fronts."""

    def __init__(self, module: Any, bucket: bool) -> None:
        self.clock = ManualClock(0)
        self.lock = threading.Lock()
        if module is native_module:
            core_type, front_type, index_type = (
                native_module.BucketCore if bucket else native_module.TrackerCore,
                native_module.Front,
                native_module.LedgerIndex,
            )
            shared_type, sub_type = native_module.SharedFront, native_module.SubFront
        else:
            core_type = _impl.PureBucketCore if bucket else _impl.PureTrackerCore
            front_type, index_type = _impl.PureFront, _impl.PureLedgerIndex
            shared_type, sub_type = _impl.PureSharedFront, _impl.PureSubFront
        settings_: dict[str, Any] = {"tick_ms": 1, "strict": False, "fixed_delay_lookahead": 0}
        if bucket:
            settings_["min_index_count_per_bucket"] = 1000  # never asks for a seal here
        self.core = core_type(**settings_)
        self.topic = front_type(self.lock, self.clock, self.core)
        self.memory, self.spilled = index_type(), index_type()
        self.private: dict[tuple[int, int], int] = {}
        self.shared = shared_type(self.topic, self.memory, self.spilled, self.private)
        self.shared.slow_add = self.slow_add
        self.subs = [sub_type(self.shared) for _ in range(2)]
        for i, sub in enumerate(self.subs):
            sub.slow_contains = lambda ledger, entry, i=i: self.slow_contains(i, ledger, entry)
        self.calls: list[tuple[Any, ...]] = []

    def slow_add(self, ledger: int, entry: int, deliver_at: int) -> bool:
        assert not self.lock.locked()  # hooks run with no lock held
        self.calls.append(("add", ledger, entry, deliver_at))
        return (ledger + entry) % 2 == 0

    def slow_contains(self, sub: int, ledger: int, entry: int) -> bool:
        assert not self.lock.locked()
        self.calls.append(("contains", sub, ledger, entry))
        return (ledger * 3 + entry + sub) % 2 == 0

    def call(self, target: Any, name: str, *args: Any) -> Any:
        try:
            return getattr(target, name)(*args)
        except (TypeError, ValueError, OverflowError, TrackerClosedError) as exc:
            return type(exc)


class SharedFrontTwins(RuleBasedStateMachine):
    """Native and pure shared fronts against a model of held positions and the topic core."""

    @initialize(bucket=st.booleans())
    def start(self, bucket: bool) -> None:
        self.native = Side(native_module, bucket)
        self.pure = Side(None, bucket)
        self.tracked: dict[tuple[int, int], int] = {}
        self.held: dict[tuple[int, int], str] = {}  # position -> "memory" | "spilled" | "private"
        self.marks: list[tuple[int, int] | None] = [None, None]
        self.detached = [False, False]
        self.closed = False

    def _both(self, which: int | None, name: str, *args: Any) -> Any:
        got = [
            side.call(side.shared if which is None else side.subs[which], name, *args)
            for side in (self.native, self.pure)
        ]
        assert got[0] == got[1], (name, args, got)
        return got[0]

    @rule(ledger=ids, entry=ids, deliver_at=times)
    def add(self, ledger: Any, entry: Any, deliver_at: int) -> None:
        before = len(self.native.calls)
        got = self._both(None, "add", ledger, entry, deliver_at)
        if not isinstance(got, bool):
            return
        position = (ledger, entry)
        if self.closed or position in self.held:
            assert self.native.calls[before:] == [("add", ledger, entry, deliver_at)]
            assert got is ((ledger + entry) % 2 == 0)
            return
        assert len(self.native.calls) == before
        if deliver_at < 0 or deliver_at <= self.native.clock() + 1:
            self.tracked.pop(position, None)
            assert got is False
        else:
            self.tracked.setdefault(position, deliver_at)
            assert got is True

    @rule(sub=st.integers(0, 1), ledger=ids, entry=ids)
    def contains(self, sub: int, ledger: Any, entry: Any) -> None:
        before = len(self.native.calls)
        got = self._both(sub, "contains", ledger, entry)
        if not isinstance(got, bool):
            return
        position = (ledger, entry)
        mark = self.marks[sub]
        if self.closed or self.detached[sub] or (mark is not None and position <= mark):
            assert got is False and len(self.native.calls) == before
        elif position in self.held:
            assert self.native.calls[before:] == [("contains", sub, ledger, entry)]
        else:
            assert got == (position in self.tracked) and len(self.native.calls) == before

    @rule(sub=st.integers(0, 1))
    def contains_next_to_the_mark(self, sub: int) -> None:
        """``contains`` at the mark and next to it (the acknowledgement's boundary)."""
        mark = self.marks[sub]
        if mark is not None:
            for entry in (mark[1] - 1, mark[1], mark[1] + 1):
                if entry >= 0:
                    self.contains(sub, mark[0], entry)

    @rule(sub=st.integers(0, 1), data=st.data())
    def mark_a_tracked_position(self, sub: int, data: st.DataObject) -> None:
        if self.tracked:
            self.set_mark(sub, data.draw(st.sampled_from(sorted(self.tracked))))

    @rule(position=positions, where=st.sampled_from(["memory", "spilled", "private"]))
    def hold(self, position: tuple[int, int], where: str) -> None:
        """A poll moved the position into the log (one of its bitmaps), or a re-add into a
        private heap (whether the core still has it does not matter: held goes to the hook)."""
        if position in self.held:
            return
        for side in (self.native, self.pure):
            if where == "private":
                side.private[position] = 1
            else:
                getattr(side, where).add(*position)
        self.held[position] = where

    @rule(position=positions)
    def release(self, position: tuple[int, int]) -> None:
        where = self.held.pop(position, None)
        if where is None:
            return
        for side in (self.native, self.pure):
            if where == "private":
                del side.private[position]
            else:
                getattr(side, where).discard(*position)

    @rule(sub=st.integers(0, 1), mark=st.one_of(st.none(), positions))
    def set_mark(self, sub: int, mark: tuple[int, int] | None) -> None:
        for side in (self.native, self.pure):
            side.subs[sub].mark = mark
            assert side.subs[sub].mark == mark
        self.marks[sub] = mark

    @rule(sub=st.integers(0, 1))
    def detach(self, sub: int) -> None:
        for side in (self.native, self.pure):
            side.subs[sub].detached = True
        self.detached[sub] = True

    @rule(step=st.integers(0, 30))
    def advance(self, step: int) -> None:
        for side in (self.native, self.pure):
            side.clock.advance(step)

    @rule()
    def close(self) -> None:
        for side in (self.native, self.pure):
            side.shared.closed = True
        self.closed = True

    @rule(ledger=ids, entry=ids)
    def is_held(self, ledger: Any, entry: Any) -> None:
        got = self._both(None, "is_held", ledger, entry)
        if isinstance(got, bool):
            assert got == ((ledger, entry) in self.held)

    @invariant()
    def agree(self) -> None:
        if not hasattr(self, "native"):
            return
        for side in (self.native, self.pure):
            assert not side.lock.locked()
            side.shared._check()
            for sub in side.subs:
                sub._check()
        assert self.native.calls == self.pure.calls
        assert len(self.native.core) == len(self.pure.core)


TestSharedFrontTwins = SharedFrontTwins.TestCase
TestSharedFrontTwins.settings = settings(stateful_step_count=40)  # examples: the profile


@pytest.mark.parametrize("module", [native_module, None], ids=["native", "pure"])
def test_fronts_refuse_missing_parts(module: Any) -> None:
    side = Side(module, bucket=False)
    shared_type = type(side.shared)
    with pytest.raises(TypeError):
        shared_type(None, side.memory, side.spilled, side.private)
    with pytest.raises(TypeError):
        type(side.subs[0])(None)
    with pytest.raises(TypeError):
        side.subs[0].mark = ("a", 1)


def test_a_subscription_never_loses_a_position_while_another_polls() -> None:
    """Subscription ``idle`` never polls: every position stays in its ``contains`` while
    ``busy`` polls from another thread, which moves the keys from the topic index into the due
    log. Were the keys appended to the log after the topic lock is released, ``contains`` could
    see a position in neither (the fronts read without the shared lock)."""
    n = 20_000
    clock = ManualClock(1_000)
    with tempfile.TemporaryDirectory() as tmp:
        shared = SharedDelayIndex.open(FileStorage(tmp), "t", clock=clock)
        try:
            busy, idle = shared.subscribe("busy"), shared.subscribe("idle")
            for entry in range(n):
                assert shared.add(1, entry, 100_000 + entry)
            clock.set(10**9)
            done = threading.Event()
            polled: list[int] = []

            def poll() -> None:
                while batch := busy.poll(7):
                    polled.append(len(batch))
                done.set()

            thread = threading.Thread(target=poll)
            thread.start()
            misses = 0
            rounds = 0
            while not done.is_set() or rounds == 0:
                rounds += 1
                for entry in range(0, n, 97):
                    if not idle.contains(1, entry):
                        misses += 1
            thread.join()
            assert sum(polled) == n
            assert misses == 0
            assert all(idle.contains(1, entry) for entry in range(n))
            shared._check()
        finally:
            shared.close()
