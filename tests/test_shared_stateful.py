"""Stateful test: a SharedDelayIndex with K subscriptions against K independent trackers.

Every add goes to the shared index once and to each subscription's own model tracker
(:class:`Model`: the tracker contract of API.md with DelayIndex's mark-delete, written as plainly
as possible; InMemoryTracker has no mark-delete). Each subscription polls, acknowledges and is
checked against its own model: ``poll`` returns the very same positions (selection order, then
sorted); ``len``, ``contains`` and ``tracked_entries`` agree exactly; ``next_delivery_time`` is
never later than the model's; ``has_message_available`` agrees. Positions some subscription has
received are re-added while others still hold them. The shared index uses buckets so small that
almost every step seals, loads, merges or trims. ``_check()`` runs after every step.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from delayindex import ManualClock, MemoryStorage, Position, SharedDelayIndex, TrackerConfig
from delayindex.executors import InlineExecutor
from delayindex.model import MAX_ENTRY_ID

SUBS = ("a", "b", "c")


class Model:
    """One subscription's tracker, by the contract: a dict of position -> deliver time."""

    def __init__(self, config: TrackerConfig, clock: ManualClock) -> None:
        self.tick, self.clock = config.tick_ms, clock
        self.tracked: dict[tuple[int, int], int] = {}
        self.mark: tuple[int, int] | None = None

    def _cutoff(self) -> int:
        return self.clock() + self.tick

    def add(self, ledger: int, entry: int, deliver_at: int) -> bool:
        pos = (ledger, entry)
        if self.mark is not None and pos <= self.mark:
            return True  # acknowledged: refused
        if deliver_at < 0 or deliver_at <= self._cutoff():
            self.tracked.pop(pos, None)  # a due re-add untracks
            return False
        self.tracked.setdefault(pos, deliver_at)
        return True

    def add_many(self, ledgers: Any, entries: Any, times: Any) -> Any:
        return np.array(
            [
                self.add(int(a), int(b), int(c))
                for a, b, c in zip(ledgers, entries, times, strict=True)
            ],
            dtype=np.bool_,
        )

    def _due(self) -> list[tuple[int, int, int]]:
        return sorted((t, *p) for p, t in self.tracked.items() if t <= self._cutoff())

    def poll(self, n: int) -> list[Position]:
        chosen = self._due()[: max(n, 0)]
        for _, ledger, entry in chosen:
            del self.tracked[ledger, entry]
        return sorted(Position(ledger, entry) for _, ledger, entry in chosen)

    def has_message_available(self) -> bool:
        return bool(self._due())

    def next_delivery_time(self) -> int | None:
        return min(self.tracked.values(), default=None)

    def set_mark_delete(self, ledger: int, entry: int) -> None:
        if self.mark is None or (ledger, entry) > self.mark:
            self.mark = (ledger, entry)
            self.tracked = {p: t for p, t in self.tracked.items() if p > self.mark}

    def contains(self, ledger: int, entry: int) -> bool:
        return (ledger, entry) in self.tracked

    def __len__(self) -> int:
        return len(self.tracked)

    def clear(self) -> None:
        self.tracked.clear()
        self.mark = None
T0 = 10_000
TINY = TrackerConfig(
    min_index_count_per_bucket=2,
    max_indexes_per_segment=2,
    max_time_step_per_segment_ms=20,
    max_num_buckets=2,
    tick_ms=3,
    due_log_memory_keys=3,  # almost every step spills due keys to disk and reads them back
)

subs = st.sampled_from(SUBS)
ledgers = st.integers(0, 8)
entries = st.integers(0, 4)
offsets = st.integers(-5, 60)


class SharedMachine(RuleBasedStateMachine):
    """K subscriptions of one shared index, each against its own InMemoryTracker."""

    @initialize()
    def start(self) -> None:
        self.clock = ManualClock(T0)
        self.shared = SharedDelayIndex.open(
            MemoryStorage(), "topic", TINY, clock=self.clock, executor=InlineExecutor()
        )
        self.views = {name: self.shared.subscribe(name) for name in SUBS}
        self.models = {name: Model(TINY, self.clock) for name in SUBS}
        self.delivered: list[tuple[int, int]] = []

    def teardown(self) -> None:
        if hasattr(self, "shared"):
            self.shared.close()

    def _lowest_mark_model(self) -> Model:
        marks = {name: self.views[name].mark_delete for name in SUBS}
        if any(m is None for m in marks.values()):
            name = next(n for n in SUBS if marks[n] is None)
        else:
            name = min(SUBS, key=lambda n: marks[n])  # type: ignore[arg-type,return-value]
        return self.models[name]

    @rule(ledger=ledgers, entry=entries, offset=offsets)
    def add(self, ledger: int, entry: int, offset: int) -> None:
        deliver_at = self.clock() + offset
        want = self._lowest_mark_model().add(ledger, entry, deliver_at)
        for name in SUBS:
            if self.models[name] is not self._lowest_mark_model():
                self.models[name].add(ledger, entry, deliver_at)
        assert self.shared.add(ledger, entry, deliver_at) is want

    @rule(batch=st.lists(st.tuples(ledgers, entries, offsets), min_size=1, max_size=8))
    def add_many(self, batch: list[tuple[int, int, int]]) -> None:
        now = self.clock()
        cols = [np.array(c, dtype=np.int64) for c in zip(*batch, strict=True)]
        cols[2] = cols[2] + now
        lowest = self._lowest_mark_model()
        want = lowest.add_many(*cols)
        for model in self.models.values():
            if model is not lowest:
                model.add_many(*cols)
        assert self.shared.add_many(*cols).tolist() == want.tolist()

    @rule(dt=st.integers(0, 25))
    def advance(self, dt: int) -> None:
        self.clock.advance(dt)

    @rule(name=subs, n=st.integers(0, 6))
    def poll(self, name: str, n: int) -> None:
        want = self.models[name].poll(n)
        assert self.views[name].poll(n) == want, name
        self.delivered.extend((p.ledger_id, p.entry_id) for p in want)

    @precondition(lambda self: bool(getattr(self, "delivered", None)))
    @rule(data=st.data(), offset=offsets)
    def readd_delivered(self, data: st.DataObject, offset: int) -> None:
        """Re-add a position some subscription has received (others may still hold it)."""
        ledger, entry = data.draw(st.sampled_from(self.delivered[-12:]))
        self.add(ledger, entry, offset)

    @rule(name=subs, ledger=ledgers, entry=entries)
    def set_mark_delete(self, name: str, ledger: int, entry: int) -> None:
        self.models[name].set_mark_delete(ledger, entry)
        self.views[name].set_mark_delete(ledger, entry)

    @rule(name=subs)
    def has_message_available(self, name: str) -> None:
        want = self.models[name].has_message_available()
        assert self.views[name].has_message_available() is want, name

    @precondition(lambda self: hasattr(self, "shared"))
    @rule()
    def clear(self) -> None:
        self.shared.clear()
        for model in self.models.values():
            model.clear()

    @invariant()
    def agrees(self) -> None:
        if not hasattr(self, "shared"):
            return
        self.shared._check()
        everyone: set[tuple[int, int]] = set()
        for name in SUBS:
            view, model = self.views[name], self.models[name]
            assert len(view) == len(model), name
            mine = set()
            for ledger in range(0, 9):
                got = list(view.tracked_entries(ledger, 0, MAX_ENTRY_ID))
                want = [e for e in range(5) if model.contains(ledger, e)]
                assert got == want, (name, ledger)
                mine |= {(ledger, e) for e in got}
                for entry in range(0, 5):
                    assert view.contains(ledger, entry) is (entry in want)
            everyone |= mine
            nxt, bound = view.next_delivery_time(), model.next_delivery_time()
            if bound is None:
                assert len(view) == 0
            else:
                assert nxt is not None and nxt <= bound, (name, nxt, bound)
        assert len(self.shared) == len(everyone)


TestShared = SharedMachine.TestCase


def test_two_subscriptions_share_one_index() -> None:
    clock = ManualClock(T0)
    with SharedDelayIndex.open(
        MemoryStorage(), "t", TINY, clock=clock, executor=InlineExecutor()
    ) as shared:
        a, b = shared.subscribe("a"), shared.subscribe("b")
        for ledger in range(1, 6):
            for entry in range(3):
                assert shared.add(ledger, entry, T0 + 100 + ledger * 10 + entry)
        assert len(shared) == len(a) == len(b) == 15
        clock.advance(200)
        assert len(a.poll(4)) == 4 and len(a) == 11 and len(b) == 15
        assert len(b.poll(100)) == 15 and len(b) == 0
        a.set_mark_delete(3, 1)
        assert [(p.ledger_id, p.entry_id) for p in a.poll(100)] == [
            (3, 2), (4, 0), (4, 1), (4, 2), (5, 0), (5, 1), (5, 2)
        ]  # fmt: skip
        shared._check()
        assert shared.stats()["due_log"] == 0  # every reader is past every key


