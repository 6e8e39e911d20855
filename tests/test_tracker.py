"""Tracker contract suite: the behaviour API.md promises for every tracker.

Each test takes the ``make`` fixture, which builds a tracker on a ManualClock; new tracker kinds
(DelayIndex) join by adding a param. ``_check`` on the core is called after each step.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Self

import numpy as np
import pytest

from delayindex import (
    DelayIndex,
    DelayIndexError,
    FileStorage,
    InMemoryTracker,
    ManualClock,
    MemoryStorage,
    Position,
    SharedDelayIndex,
    TrackerClosedError,
    TrackerConfig,
)
from delayindex.executors import InlineExecutor

T0 = 1_000_000
Factory = Callable[..., Any]


def _in_memory(clock: ManualClock, tmp_path: Path, **config: Any) -> InMemoryTracker:
    return InMemoryTracker(TrackerConfig(**config), clock=clock)


def _delay_index(clock: ManualClock, tmp_path: Path, **config: Any) -> DelayIndex:
    """Default bucket settings on MemoryStorage: mostly the mutable bucket."""
    return DelayIndex.open(
        MemoryStorage(), "contract", TrackerConfig(**config), clock=clock,
        executor=InlineExecutor(),
    )  # fmt: skip


#: Bucket settings so small that every contract test seals, loads, merges and deletes.
TINY = {
    "min_index_count_per_bucket": 2,
    "max_indexes_per_segment": 2,
    "max_time_step_per_segment_ms": 50,
    "max_num_buckets": 2,
}


def _delay_index_tiny(clock: ManualClock, tmp_path: Path, **config: Any) -> DelayIndex:
    """Tiny buckets on FileStorage with the default background thread."""
    return DelayIndex.open(
        FileStorage(tmp_path / f"store-{len(list(tmp_path.iterdir()))}"), "contract",
        TrackerConfig(**{**TINY, **config}), clock=clock,
    )  # fmt: skip


def _delay_index_tiny_inline(clock: ManualClock, tmp_path: Path, **config: Any) -> DelayIndex:
    """Tiny buckets on MemoryStorage, background work run inline (deterministic)."""
    return DelayIndex.open(
        MemoryStorage(), "contract", TrackerConfig(**{**TINY, **config}), clock=clock,
        executor=InlineExecutor(),
    )  # fmt: skip


class _OneSubscription:
    """A shared index with one subscription, seen as one tracker: the index's ``add`` and the
    subscription's reads (the issue's "a Subscription plus the index's add")."""

    # Two of the methods bound in __init__, declared for the type checker.
    flush: Callable[[], None]
    _check: Callable[[], None]

    def __init__(self, shared: SharedDelayIndex) -> None:
        self.shared = shared
        self.sub = shared.subscribe("only")
        for name in ("add", "add_many", "flush", "close", "clear", "stats", "reset_tick_time",
                     "memory_usage_bytes", "_check"):  # fmt: skip
            setattr(self, name, getattr(shared, name))
        for name in ("poll", "has_message_available", "next_delivery_time", "contains",
                     "set_mark_delete", "tracked_entries",
                     "should_pause_all_deliveries"):  # fmt: skip
            setattr(self, name, getattr(self.sub, name))

    def __len__(self) -> int:
        return len(self.sub)

    def __contains__(self, position: object) -> bool:
        return position in self.sub

    @property
    def closed(self) -> bool:
        return self.shared.closed

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shared.close()


def _shared_tiny_inline(clock: ManualClock, tmp_path: Path, **config: Any) -> _OneSubscription:
    """A one-subscription shared index with tiny buckets, background work inline."""
    return _OneSubscription(SharedDelayIndex.open(
        MemoryStorage(), "contract", TrackerConfig(**{**TINY, **config}), clock=clock,
        executor=InlineExecutor(),
    ))  # fmt: skip


def _shared_tiny(clock: ManualClock, tmp_path: Path, **config: Any) -> _OneSubscription:
    """A one-subscription shared index with tiny buckets on FileStorage and its own thread."""
    return _OneSubscription(SharedDelayIndex.open(
        FileStorage(tmp_path / f"store-{len(list(tmp_path.iterdir()))}"), "contract",
        TrackerConfig(**{**TINY, **config}), clock=clock,
    ))  # fmt: skip


KINDS: dict[str, Callable[..., Any]] = {
    "shared_tiny": _shared_tiny,
    "shared_tiny_inline": _shared_tiny_inline,
    "in_memory": _in_memory,
    "delay_index": _delay_index,
    "delay_index_tiny": _delay_index_tiny,
    "delay_index_tiny_inline": _delay_index_tiny_inline,
}


@pytest.fixture(params=sorted(KINDS))
def make(request: pytest.FixtureRequest, clock: ManualClock, tmp_path: Path) -> Iterator[Factory]:
    """``make(**config)`` builds a tracker of each kind on the shared manual clock."""
    built: list[Any] = []

    def factory(**config: Any) -> Any:
        tracker = KINDS[request.param](clock, tmp_path, **config)
        built.append(tracker)
        return tracker

    yield factory
    for tracker in built:
        if not tracker.closed:
            check(tracker)
        tracker.close()


def check(tracker: Any) -> None:
    """Run the invariants (DelayIndex also checks its bucket table against the manifest)."""
    if isinstance(tracker, DelayIndex | _OneSubscription):
        tracker.flush()
        tracker._check()
    else:
        tracker._core._check()


# -- add ----------------------------------------------------------------------------------------


def test_add_not_delayed_or_due_returns_false(make: Factory, clock: ManualClock) -> None:
    tracker = make(tick_ms=1000)
    assert tracker.add(1, 0, -1) is False
    assert tracker.add(1, 1, T0 - 5) is False
    assert tracker.add(1, 2, T0 + 1000) is False  # within the tick: due (non-strict)
    assert tracker.add(1, 3, T0 + 1001) is True
    assert len(tracker) == 1
    assert tracker.contains(1, 3) and not tracker.contains(1, 2)
    check(tracker)


def test_strict_cutoff_is_now(make: Factory) -> None:
    tracker = make(tick_ms=1000, strict=True)
    assert tracker.add(1, 0, T0) is False
    assert tracker.add(1, 1, T0 + 1) is True
    assert not tracker.has_message_available()


def test_duplicate_add_counted_once(make: Factory) -> None:
    tracker = make()
    assert tracker.add(5, 7, T0 + 10_000) is True
    assert tracker.add(5, 7, T0 + 10_000) is True
    assert tracker.add(5, 7, T0 + 50_000) is True  # no-op: the first deliver time stands
    assert len(tracker) == 1
    assert tracker.next_delivery_time() == T0 + 10_000
    assert tracker.stats()["duplicates"] == 2
    check(tracker)


def test_due_readd_untracks_and_returns_false(make: Factory, clock: ManualClock) -> None:
    tracker = make()
    assert tracker.add(5, 7, T0 + 10_000)
    assert tracker.add(5, 7, T0) is False
    assert len(tracker) == 0 and not tracker.contains(5, 7)
    check(tracker)
    # The stale heap node must never resurface, even when the position is tracked again later.
    assert tracker.add(5, 7, T0 + 60_000)
    check(tracker)
    clock.set(T0 + 30_000)
    assert tracker.poll(10) == []
    clock.set(T0 + 60_000)
    assert tracker.poll(10) == [Position(5, 7)]
    assert len(tracker) == 0
    check(tracker)


def test_due_readd_of_untracked_position_does_not_count(make: Factory) -> None:
    tracker = make()
    assert tracker.add(1, 1, -1) is False
    assert len(tracker) == 0
    assert tracker.stats()["untracked_on_due_add"] == 0


@pytest.mark.parametrize(
    ("args", "error"),
    [
        ((-1, 0, T0 + 5000), ValueError),
        ((0, -1, T0 + 5000), ValueError),
        ((0, 2**32, T0 + 5000), ValueError),
        ((2**63, 0, T0 + 5000), ValueError),
        ((0, 0, 2**63), ValueError),
        ((1.0, 0, T0 + 5000), TypeError),
        ((1, "0", T0 + 5000), TypeError),
        ((1, 0, float(T0 + 5000)), TypeError),
        ((None, 0, T0 + 5000), TypeError),
        ((True, 0, T0 + 5000), TypeError),
        ((1, False, T0 + 5000), TypeError),
        ((1, 0, True), TypeError),
        ((np.bool_(True), 0, T0 + 5000), TypeError),
    ],
)
def test_bad_add_raises_and_changes_nothing(
    make: Factory, args: tuple[Any, ...], error: type
) -> None:
    tracker = make()
    tracker.add(3, 3, T0 + 9000)
    before = tracker.stats()
    with pytest.raises(error):
        tracker.add(*args)
    after = tracker.stats()
    assert after["tracked"] == before["tracked"] == 1
    assert after["add_calls"] == before["add_calls"]
    check(tracker)


def test_boundary_ids_accepted(make: Factory) -> None:
    tracker = make()
    assert tracker.add(2**63 - 1, 2**32 - 1, T0 + 5000)
    assert tracker.add(0, 0, T0 + 5000)
    assert tracker.contains(2**63 - 1, 2**32 - 1)
    check(tracker)


def test_numpy_scalars_accepted(make: Factory) -> None:
    tracker = make()
    assert tracker.add(np.int64(4), np.int32(2), np.int64(T0 + 5000))
    assert tracker.contains(np.int64(4), 2)


# -- add_many -----------------------------------------------------------------------------------


def test_add_many_matches_add(make: Factory, clock: ManualClock) -> None:
    rng = np.random.default_rng(7)
    n = 2000
    ledgers = rng.integers(0, 20, n)
    entries = rng.integers(0, 50, n)
    times = rng.integers(T0 - 2000, T0 + 20_000, n)
    times[rng.random(n) < 0.1] = -1
    one, many = make(), make()
    expected = [
        one.add(int(a), int(b), int(c)) for a, b, c in zip(ledgers, entries, times, strict=True)
    ]
    got = many.add_many(ledgers, entries, times)
    assert got.dtype == np.bool_ and got.tolist() == expected
    assert len(one) == len(many)
    clock.set(T0 + 30_000)
    assert one.poll(10**6) == many.poll(10**6)
    check(one)
    check(many)


def test_add_many_accepts_lists_and_uint(make: Factory) -> None:
    tracker = make()
    got = tracker.add_many([1, 1], [0, 1], [T0 + 5000, -1])
    assert got.tolist() == [True, False]
    got = tracker.add_many(
        np.array([2], dtype=np.uint32), np.array([3], dtype=np.uint64), np.array([T0 + 5000])
    )
    assert got.tolist() == [True]
    assert tracker.add_many([], [], []).tolist() == []


@pytest.mark.parametrize(
    ("ledgers", "entries", "times", "error"),
    [
        ([1, 2], [1], [T0 + 5000, T0 + 5000], ValueError),
        ([1, -2], [1, 1], [T0 + 5000, T0 + 5000], ValueError),
        ([1, 2], [1, 2**32], [T0 + 5000, T0 + 5000], ValueError),
        ([1, 2**64], [1, 1], [T0 + 5000, T0 + 5000], ValueError),
        ([1.0, 2.0], [1, 1], [T0 + 5000, T0 + 5000], TypeError),
        ([True, False], [1, 1], [T0 + 5000, T0 + 5000], TypeError),
        ([[1], [2]], [1, 1], [T0 + 5000, T0 + 5000], ValueError),
        ("ab", [1, 1], [T0 + 5000, T0 + 5000], TypeError),
    ],
)
def test_bad_add_many_changes_nothing(
    make: Factory, ledgers: Any, entries: Any, times: Any, error: type
) -> None:
    tracker = make()
    tracker.add(9, 9, T0 + 9000)
    with pytest.raises(error):
        tracker.add_many(ledgers, entries, times)
    assert len(tracker) == 1
    assert not tracker.contains(1, 1)
    check(tracker)


# -- poll ---------------------------------------------------------------------------------------


def test_poll_selects_by_time_returns_sorted(make: Factory, clock: ManualClock) -> None:
    tracker = make(tick_ms=0)
    tracker.add(9, 1, T0 + 100)
    tracker.add(1, 5, T0 + 300)
    tracker.add(1, 2, T0 + 200)
    tracker.add(3, 0, T0 + 100)
    clock.set(T0 + 1000)
    first = tracker.poll(3)
    assert first == [Position(1, 2), Position(3, 0), Position(9, 1)]
    assert all(type(p) is Position for p in first)
    assert tracker.poll(3) == [Position(1, 5)]
    assert tracker.poll(3) == []
    check(tracker)


def test_poll_ties_break_by_position(make: Factory, clock: ManualClock) -> None:
    tracker = make(tick_ms=0)
    for ledger, entry in [(5, 5), (5, 1), (2, 9), (7, 0)]:
        tracker.add(ledger, entry, T0 + 100)
    clock.set(T0 + 100)
    assert tracker.poll(2) == [Position(2, 9), Position(5, 1)]


def test_poll_respects_cutoff_and_tick(make: Factory, clock: ManualClock) -> None:
    tracker = make(tick_ms=1000)
    tracker.add(1, 0, T0 + 5000)
    tracker.add(1, 1, T0 + 6500)
    clock.set(T0 + 3999)
    assert not tracker.has_message_available() and tracker.poll(10) == []
    clock.set(T0 + 4000)  # cutoff = now + tick = deliver_at
    assert tracker.has_message_available()
    assert tracker.poll(10) == [Position(1, 0)]
    tracker.reset_tick_time(0)
    clock.set(T0 + 6499)
    assert tracker.poll(10) == []
    clock.set(T0 + 6500)
    assert tracker.poll(10) == [Position(1, 1)]


@pytest.mark.parametrize("max_messages", [0, -5])
def test_poll_nonpositive_returns_empty(
    make: Factory, clock: ManualClock, max_messages: int
) -> None:
    tracker = make()
    tracker.add(1, 0, T0 + 5000)
    clock.set(T0 + 10_000)
    assert tracker.poll(max_messages) == []
    assert len(tracker) == 1


def test_poll_rejects_non_int(make: Factory) -> None:
    tracker = make()
    with pytest.raises(TypeError):
        tracker.poll(1.5)
    with pytest.raises(TypeError):
        tracker.poll(True)


class _Three:
    def __index__(self) -> int:
        return 3


@pytest.mark.parametrize(
    ("max_messages", "expected"),
    [(np.int64(5), 3), (np.uint8(2), 2), (np.int32(-1), 0), (_Three(), 3), (np.int64(0), 0)],
)
def test_poll_accepts_any_integral(
    make: Factory, clock: ManualClock, max_messages: Any, expected: int
) -> None:
    tracker = make()
    for entry in range(3):
        tracker.add(1, entry, T0 + 5000)
    clock.set(T0 + 10_000)
    assert tracker.poll(max_messages) == [Position(1, e) for e in range(expected)]
    with pytest.raises(TypeError, match="max_messages"):
        tracker.poll(np.bool_(True))


def test_poll_huge_max(make: Factory, clock: ManualClock) -> None:
    tracker = make()
    tracker.add(1, 0, T0 + 5000)
    clock.set(T0 + 10_000)
    assert tracker.poll(10**30) == [Position(1, 0)]


def test_next_delivery_time(make: Factory, clock: ManualClock) -> None:
    tracker = make()
    assert tracker.next_delivery_time() is None
    tracker.add(1, 0, T0 + 7000)
    tracker.add(1, 1, T0 + 5000)
    assert tracker.next_delivery_time() == T0 + 5000
    tracker.add(1, 1, T0)  # untrack the head: the stale node must not be reported
    assert tracker.next_delivery_time() == T0 + 7000
    clock.set(T0 + 7000)
    tracker.poll(10)
    assert tracker.next_delivery_time() is None


def test_large_random_drain_is_exact(make: Factory, clock: ManualClock) -> None:
    rng = np.random.default_rng(11)
    n = 20_000
    ledgers = rng.integers(0, 40, n)
    entries = rng.integers(0, 2000, n)
    times = rng.integers(T0 + 1001, T0 + 100_000, n)
    tracker = make(tick_ms=0)
    tracker.add_many(ledgers, entries, times)
    model: dict[tuple[int, int], int] = {}
    for pos_l, pos_e, t in zip(ledgers.tolist(), entries.tolist(), times.tolist(), strict=True):
        model.setdefault((pos_l, pos_e), t)
    assert len(tracker) == len(model)
    order = sorted((t, lg, e) for (lg, e), t in model.items())
    clock.set(T0 + 100_000)
    drained: list[Position] = []
    batch_sizes = iter([1, 7, 1000, 3, 10**9])
    while True:
        size = next(batch_sizes, 500)
        out = tracker.poll(size)
        if not out:
            break
        assert out == sorted(out)
        expected = sorted(Position(lg, e) for _, lg, e in order[len(drained) : len(drained) + size])
        assert out == expected
        drained.extend(out)
    assert len(drained) == len(model) and len(tracker) == 0
    check(tracker)


# -- fixed-delay detection ----------------------------------------------------------------------


def test_fixed_delay_detection(make: Factory, clock: ManualClock) -> None:
    tracker = make(fixed_delay_lookahead=3, tick_ms=1000)
    for i in range(2):
        assert tracker.add(1, i, T0 + 60_000 + i)
    assert not tracker.should_pause_all_deliveries()  # below the lookahead
    tracker.add(1, 2, T0 + 60_002)
    assert tracker.should_pause_all_deliveries()
    clock.set(T0 + 59_002)  # the head is due: never pause while something is deliverable
    assert not tracker.should_pause_all_deliveries()
    clock.set(T0)
    tracker.add(1, 3, T0 + 58_000)  # older than highest - tick: delays are not fixed
    assert not tracker.should_pause_all_deliveries()
    clock.set(T0 + 100_000)
    tracker.poll(100)  # emptied: detection resets
    assert len(tracker) == 0
    for i in range(3):
        tracker.add(2, i, T0 + 200_000)
    assert tracker.should_pause_all_deliveries()


def test_rejected_add_disables_fixed_delay(make: Factory) -> None:
    tracker = make(fixed_delay_lookahead=1)
    tracker.add(1, 0, T0 + 60_000)
    assert tracker.should_pause_all_deliveries()
    tracker.add(1, 1, -1)
    assert not tracker.should_pause_all_deliveries()


def test_fixed_delay_disabled_by_zero_lookahead(make: Factory) -> None:
    tracker = make(fixed_delay_lookahead=0)
    tracker.add(1, 0, T0 + 60_000)
    assert not tracker.should_pause_all_deliveries()


# -- housekeeping -------------------------------------------------------------------------------


def test_reset_tick_time_validation(make: Factory) -> None:
    tracker = make()
    with pytest.raises(ValueError):
        tracker.reset_tick_time(-1)
    with pytest.raises(TypeError):
        tracker.reset_tick_time(1.5)
    tracker.reset_tick_time(5)
    assert tracker.stats()["tick_ms"] == 5


def test_clear(make: Factory, clock: ManualClock) -> None:
    tracker = make()
    tracker.add_many([1, 2, 3], [1, 2, 3], [T0 + 5000] * 3)
    tracker.clear()
    assert len(tracker) == 0 and tracker.next_delivery_time() is None
    assert not tracker.contains(1, 1)
    assert tracker.add(1, 1, T0 + 5000)
    check(tracker)


def test_memory_usage_grows_and_is_honest(make: Factory) -> None:
    tracker = make()
    empty = tracker.memory_usage_bytes()
    n = 50_000
    tracker.add_many(np.full(n, 3), np.arange(n), np.full(n, T0 + 10_000))
    used = tracker.memory_usage_bytes()
    assert used - empty >= 24 * n * 0.9  # at least the heap nodes


def test_stats_keys(make: Factory) -> None:
    stats = make().stats()
    for key in ("tracked", "added", "duplicates", "delivered", "memory_bytes", "timer_armed"):
        assert key in stats


def test_close_and_context_manager(make: Factory, clock: ManualClock) -> None:
    tracker = make()
    with tracker as same:
        assert same is tracker
        tracker.add(1, 1, T0 + 5000)
    assert tracker.closed
    assert len(tracker) == 0 and not tracker.contains(1, 1)
    assert tracker.next_delivery_time() is None
    clock.set(T0 + 10_000)
    assert tracker.has_message_available() is False  # like contains: no error once closed
    with pytest.raises(TrackerClosedError):
        tracker.add(1, 2, T0 + 5000)
    with pytest.raises(DelayIndexError):
        tracker.poll(1)
    with pytest.raises(TrackerClosedError):
        tracker.add_many([1], [1], [T0 + 5000])
    tracker.close()  # idempotent


def test_contains_validation(make: Factory) -> None:
    tracker = make()
    with pytest.raises(ValueError, match="ledger_id"):
        tracker.contains(-1, 0)
    with pytest.raises(ValueError, match="entry_id"):
        tracker.contains(0, 2**32)
    with pytest.raises(TypeError, match="ledger_id"):
        tracker.contains(0.5, 0)
    with pytest.raises(TypeError, match="ledger_id"):
        tracker.contains(True, 0)
    with pytest.raises(TypeError, match="entry_id"):
        tracker.contains(0, "1")
    with pytest.raises((ValueError, OverflowError), match="ledger_id"):
        tracker.contains(2**64, 0)
    assert (1, 1) not in tracker


@pytest.mark.parametrize(
    ("args", "name"),
    [((True, 0, T0 + 5000), "ledger_id"), ((1, 0.5, T0 + 5000), "entry_id"),
     ((1, 0, "soon"), "deliver_at"), ((2**64, 0, T0 + 5000), "ledger_id"),
     ((1, 0, 2**64), "deliver_at")],
)  # fmt: skip
def test_bad_add_names_the_argument(make: Factory, args: tuple[Any, ...], name: str) -> None:
    """The front converts the arguments natively; its diagnose hook names the bad one."""
    with pytest.raises((TypeError, ValueError, OverflowError), match=name):
        make().add(*args)


def test_bad_clock_value_raises_type_error() -> None:
    tracker = InMemoryTracker(clock=lambda: 1.5)  # type: ignore[arg-type, return-value]
    with pytest.raises(TypeError, match="clock"):
        tracker.add(1, 1, 5000)


def test_constructor_validation() -> None:
    with pytest.raises(TypeError):
        InMemoryTracker(config={"tick_ms": 5})  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        InMemoryTracker(clock=5)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        InMemoryTracker(timer=object())  # type: ignore[arg-type]
