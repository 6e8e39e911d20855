"""Differential stateful test: native TrackerCore vs pure TrackerCore vs a plain dict model.

The model is the contract written as directly as possible: a dict position -> deliver_at.
Small id and time domains force duplicates, due re-adds of tracked positions, stale heap nodes
and timestamp ties, which is where trackers go wrong (Pulsar #25681, #26230, #26251).
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

import numpy as np
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from delayindex import _impl

_native = _impl.native_module_or_none()
assert _native is not None, "the native extension must be built for the differential test"
native_module: ModuleType = _native  # declared narrowed: functions see the declared type

ledgers = st.integers(0, 3)
entries = st.integers(0, 4)
times = st.one_of(st.integers(-2, 40), st.sampled_from([-(2**63), 2**63 - 1]))
small_now = st.integers(0, 40)


class Model:
    """The tracker contract as a dict, with fixed-delay detection per Pulsar §1.6."""

    def __init__(self, tick: int, strict: bool, lookahead: int) -> None:
        self.tick, self.strict, self.lookahead = tick, strict, lookahead
        self.tracked: dict[tuple[int, int], int] = {}
        self.fixed, self.highest = True, 0
        self.cancelled: set[tuple[int, int]] = set()
        self.moved: dict[tuple[int, int], int] = {}

    def cutoff(self, now: int) -> int:
        return now if self.strict else min(now + self.tick, 2**63 - 1)

    def add(self, ledger: int, entry: int, t: int, now: int) -> int:
        if (ledger, entry) in self.cancelled:
            return 5  # ADD_CANCELLED: refused
        t = self.moved.get((ledger, entry), t)
        if t < 0 or t <= self.cutoff(now):
            self.fixed = False
            self.tracked.pop((ledger, entry), None)
            return 0
        code = 2 if (ledger, entry) in self.tracked else 1
        self.tracked.setdefault((ledger, entry), t)
        if t < self.highest - self.tick:
            self.fixed = False
        self.highest = max(self.highest, t)
        return code

    def poll(self, n: int, now: int) -> list[tuple[int, int]]:
        if n <= 0:
            return []
        cutoff = self.cutoff(now)
        due = sorted((t, lg, e) for (lg, e), t in self.tracked.items() if t <= cutoff)[:n]
        for _, lg, e in due:
            del self.tracked[(lg, e)]
        if not self.tracked:
            self.fixed, self.highest = True, 0
        return sorted((lg, e) for _, lg, e in due)

    def next_time(self) -> int | None:
        return min(self.tracked.values(), default=None)

    def cancel(self, ledger: int, entry: int) -> bool:
        if (ledger, entry) not in self.tracked:
            return False
        del self.tracked[ledger, entry]
        self.cancelled.add((ledger, entry))
        self.moved.pop((ledger, entry), None)
        return True

    def reschedule(self, ledger: int, entry: int, t: int, now: int) -> int:
        self.cancelled.discard((ledger, entry))
        self.tracked.pop((ledger, entry), None)
        self.moved[ledger, entry] = t
        return self.add(ledger, entry, t, now)

    def live(self, start: int, end: int) -> list[tuple[int, int, int]]:
        return sorted((t, lg, e) for (lg, e), t in self.tracked.items() if start <= t < end)


class CoreMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.cores: list[Any] = []
        self.model: Model

    @initialize(tick=st.integers(0, 5), strict=st.booleans(), lookahead=st.integers(0, 3))
    def build(self, tick: int, strict: bool, lookahead: int) -> None:
        self.cores = [
            native_module.TrackerCore(tick, strict, lookahead),
            _impl.PureTrackerCore(tick, strict, lookahead),
        ]
        self.model = Model(tick, strict, lookahead)

    def same(self, results: list[Any], expected: Any) -> None:
        assert results[0] == results[1], f"native {results[0]!r} != pure {results[1]!r}"
        assert results[0] == expected, f"cores {results[0]!r} != model {expected!r}"

    @rule(ledger=ledgers, entry=entries, t=times, now=small_now)
    def add(self, ledger: int, entry: int, t: int, now: int) -> None:
        self.same(
            [c.add(ledger, entry, t, now) for c in self.cores],
            self.model.add(ledger, entry, t, now),
        )

    @rule(
        batch=st.lists(st.tuples(ledgers, entries, times), max_size=25),
        now=small_now,
    )
    def add_many(self, batch: list[tuple[int, int, int]], now: int) -> None:
        cols = [np.array([b[i] for b in batch], dtype=np.int64) for i in range(3)]
        results = [c.add_many(*cols, now).tolist() for c in self.cores]
        expected = [self.model.add(lg, e, t, now) != 0 for lg, e, t in batch]
        self.same(results, expected)

    @rule(ledger=ledgers, entry=entries)
    def cancel(self, ledger: int, entry: int) -> None:
        self.same([c.cancel(ledger, entry) for c in self.cores], self.model.cancel(ledger, entry))

    @rule(batch=st.lists(st.tuples(ledgers, entries), max_size=10))
    def cancel_many(self, batch: list[tuple[int, int]]) -> None:
        cols = [np.array([b[i] for b in batch], dtype=np.int64) for i in range(2)]
        results = [c.cancel_many(*cols).tolist() for c in self.cores]
        self.same(results, [self.model.cancel(lg, e) for lg, e in batch])

    @rule(ledger=ledgers, entry=entries, t=times, now=small_now)
    def reschedule(self, ledger: int, entry: int, t: int, now: int) -> None:
        self.same(
            [c.reschedule(ledger, entry, t, now) for c in self.cores],
            self.model.reschedule(ledger, entry, t, now),
        )

    @rule(start=st.integers(-5, 45), width=st.integers(0, 50))
    def browse(self, start: int, width: int) -> None:
        end = start + width
        keys = [c.live_keys(start, end - 1) for c in self.cores]
        self.same(
            [sorted(zip(*(k.tolist() for k in key), strict=True)) for key in keys],
            self.model.live(start, end),
        )
        edges = np.array(sorted({start, end, (start + end) // 2, end + 3}), dtype=np.int64)
        want = [
            sum(1 for t in self.model.tracked.values() if lo <= t < hi)
            for lo, hi in zip(edges[:-1].tolist(), edges[1:].tolist(), strict=True)
        ]
        self.same([c.due_histogram(edges).tolist() for c in self.cores], want)

    @rule(n=st.integers(-1, 8), now=small_now)
    def poll(self, n: int, now: int) -> None:
        results = [[tuple(p) for p in c.poll(n, now)] for c in self.cores]
        self.same(results, self.model.poll(n, now))

    @rule(now=small_now)
    def has_due(self, now: int) -> None:
        cutoff = self.model.cutoff(now)
        nxt = self.model.next_time()
        self.same([c.has_due(now) for c in self.cores], nxt is not None and nxt <= cutoff)

    @rule(now=small_now)
    def should_pause(self, now: int) -> None:
        m = self.model
        nxt = m.next_time()
        expected = (
            m.lookahead > 0
            and m.fixed
            and len(m.tracked) >= m.lookahead
            and not (nxt is not None and nxt <= m.cutoff(now))
        )
        self.same([c.should_pause(now) for c in self.cores], expected)

    @rule()
    def next_time(self) -> None:
        self.same([c.next_time() for c in self.cores], self.model.next_time())

    @rule(ledger=ledgers, entry=entries)
    def contains(self, ledger: int, entry: int) -> None:
        self.same(
            [c.contains(ledger, entry) for c in self.cores], (ledger, entry) in self.model.tracked
        )

    @rule(tick=st.integers(0, 5))
    def set_tick(self, tick: int) -> None:
        for core in self.cores:
            core.tick_ms = tick
        self.model.tick = tick

    @rule()
    def compact(self) -> None:
        for core in self.cores:
            core.compact()

    @rule()
    def clear(self) -> None:
        for core in self.cores:
            core.clear()
        self.model.tracked.clear()
        self.model.cancelled.clear()
        self.model.moved.clear()
        self.model.fixed, self.model.highest = True, 0

    @invariant()
    def consistent(self) -> None:
        if not self.cores:
            return
        for core in self.cores:
            core._check()
        native, pure = (c.counters() for c in self.cores)
        assert native == pure, f"counters differ: {native} != {pure}"
        assert len(self.cores[0]) == len(self.model.tracked)


TestCoreStateful = CoreMachine.TestCase
TestCoreStateful.settings = settings(stateful_step_count=60)  # examples: the loaded profile
