"""SharedDelayIndex: lifecycle, durability and the per-subscription views (deterministic cases;
the stateful test against K model trackers is tests/test_shared_stateful.py)."""

from __future__ import annotations

import numpy as np
import pytest

from delayindex import (
    FileStorage,
    ManualClock,
    MemoryStorage,
    Position,
    SharedDelayIndex,
    TrackerClosedError,
    TrackerConfig,
)
from delayindex.executors import InlineExecutor, ManualExecutor
from delayindex.storage.manifest import SubscriptionRecord

T0 = 1_000_000
TINY = TrackerConfig(
    min_index_count_per_bucket=2,
    max_indexes_per_segment=2,
    max_time_step_per_segment_ms=50,
    max_num_buckets=2,
    tick_ms=10,
)


def _open(storage: object, clock: ManualClock) -> SharedDelayIndex:
    return SharedDelayIndex.open(storage, "topic", TINY, clock=clock, executor=InlineExecutor())  # type: ignore[arg-type]


def _fill(shared: SharedDelayIndex, ledgers: range, offset: int = 100) -> None:
    for ledger in ledgers:
        for entry in range(3):
            assert shared.add(ledger, entry, T0 + offset + ledger * 10 + entry)


def _pairs(positions: list[Position]) -> list[tuple[int, int]]:
    return [(p.ledger_id, p.entry_id) for p in positions]


def test_each_subscription_receives_every_position_once_in_selection_order() -> None:
    clock = ManualClock(T0)
    with _open(MemoryStorage(), clock) as shared:
        a, b = shared.subscribe("a"), shared.subscribe("b")
        _fill(shared, range(1, 8))
        clock.advance(1000)
        got_a = [p for _ in range(30) for p in a.poll(2)]
        got_b = b.poll(1000)
        assert sorted(got_a) == got_b and len(got_b) == 21
        assert len(set(got_a)) == 21  # exactly once
        shared._check()
        assert len(shared) == 0 and shared.stats()["due_log"] == 0


def test_a_mark_filters_only_its_own_subscription_and_the_topic_trims_at_the_lowest() -> None:
    clock = ManualClock(T0)
    with _open(MemoryStorage(), clock) as shared:
        a, b = shared.subscribe("a"), shared.subscribe("b")
        _fill(shared, range(1, 8))
        shared.flush()
        a.set_mark_delete(4, 2)
        assert shared._topic.mark_delete is None  # b has acknowledged nothing
        assert len(a) == 9 and len(b) == 21 and not a.contains(3, 0) and b.contains(3, 0)
        b.set_mark_delete(2, 2)
        assert shared._topic.mark_delete == (2, 2)  # the lowest subscription mark
        clock.advance(1000)
        assert _pairs(a.poll(100))[0] == (5, 0)
        assert _pairs(b.poll(100))[0] == (3, 0)
        shared._check()


@pytest.mark.parametrize("kind", ["memory", "file"])
def test_subscriptions_and_marks_survive_a_reopen(kind: str, tmp_path: object) -> None:
    clock = ManualClock(T0)
    storage = MemoryStorage() if kind == "memory" else FileStorage(tmp_path)  # type: ignore[arg-type]
    with _open(storage, clock) as shared:
        a, b, c = (shared.subscribe(n) for n in "abc")
        _fill(shared, range(1, 8), offset=10_000)
        a.set_mark_delete(3, 2)
        b.set_mark_delete(5, 0)
        shared.unsubscribe("c")
        with pytest.raises(TrackerClosedError):
            c.poll(1)
    with _open(storage, clock) as shared:
        assert shared.subscriptions() == ["a", "b"]
        a, b = shared.subscribe("a"), shared.subscribe("b")
        assert a.mark_delete == (3, 2) and b.mark_delete == (5, 0)
        assert shared._topic.mark_delete == (3, 2)
        # The sealed buckets come back; each subscription receives what it had not acknowledged.
        everything = [(led, ent) for led in range(1, 8) for ent in range(3)]
        recovered = {p for p in everything if shared._topic.contains(*p)}
        clock.advance(100_000)
        assert set(_pairs(a.poll(100))) == {p for p in recovered if p > (3, 2)}
        assert set(_pairs(b.poll(100))) == {p for p in recovered if p > (5, 0)}
        assert recovered and all(p > (3, 2) for p in recovered)
        shared._check()


def test_unsubscribe_releases_what_only_it_held() -> None:
    clock = ManualClock(T0)
    with _open(MemoryStorage(), clock) as shared:
        a = shared.subscribe("a")
        shared.subscribe("b")
        _fill(shared, range(1, 5))
        clock.advance(1000)
        assert len(a.poll(100)) == 12
        assert shared.stats()["due_log"] == 12  # held for b
        shared.unsubscribe("b")
        assert shared.stats()["due_log"] == 0 and len(shared) == 0
        with pytest.raises(KeyError):
            shared.unsubscribe("b")
        shared._check()


def test_a_new_subscription_receives_what_the_topic_still_tracks() -> None:
    clock = ManualClock(T0)
    with _open(MemoryStorage(), clock) as shared:
        a = shared.subscribe("a")
        _fill(shared, range(1, 3))
        _fill(shared, range(3, 5), offset=5000)
        clock.advance(1000)
        assert len(a.poll(100)) == 6
        late = shared.subscribe("late")
        assert len(late) == 6 and not late.contains(1, 0) and late.contains(3, 0)
        clock.advance(10_000)
        assert _pairs(late.poll(100)) == _pairs(a.poll(100))
        shared._check()


def test_clear_resets_every_subscription_and_survives_a_reopen() -> None:
    clock = ManualClock(T0)
    storage = MemoryStorage()
    with _open(storage, clock) as shared:
        a = shared.subscribe("a")
        _fill(shared, range(1, 5), offset=10_000)
        a.set_mark_delete(2, 0)
        shared.clear()
        assert len(a) == 0 and a.mark_delete is None
        assert shared.add(1, 0, T0 + 50_000)  # the rewind: below the old mark, tracked again
    with _open(storage, clock) as shared:
        assert shared.subscribe("a").mark_delete is None


def test_a_clear_is_durable_for_the_subscriptions_too(tmp_path: object) -> None:
    """DelayIndex.clear() persists its mark reset at once ("an old mark must not return"); a
    crash right after SharedDelayIndex.clear() must not bring a subscription's old mark back,
    or it never receives what the rewind re-adds at or below that mark."""
    clock = ManualClock(T0)
    storage = FileStorage(tmp_path)  # type: ignore[arg-type]
    shared = _open(storage, clock)
    a = shared.subscribe("a")
    _fill(shared, range(1, 8), offset=10_000)
    a.set_mark_delete(4, 2)
    shared.clear()
    assert shared.add(3, 0, T0 + 50_000)  # the rewind re-adds below the old mark
    storage.close()  # the process dies: the index is never closed, the lock goes with it
    with _open(FileStorage(tmp_path), clock) as reopened:  # type: ignore[arg-type]
        a = reopened.subscribe("a")
        assert reopened.add(3, 0, T0 + 50_000)  # the dispatcher's replay
        assert a.mark_delete is None
        clock.advance(100_000)
        assert _pairs(a.poll(10)) == [(3, 0)]


def test_a_commit_between_the_two_notes_keeps_the_topic_mark_the_lowest(tmp_path: object) -> None:
    clock = ManualClock(T0)
    storage = FileStorage(tmp_path)  # type: ignore[arg-type]
    executor = ManualExecutor()
    shared = SharedDelayIndex.open(storage, "topic", TINY, clock=clock, executor=executor)
    a = shared.subscribe("a")
    _fill(shared, range(1, 10), offset=10_000)  # seals queued for the background
    note = shared._topic._note_subscriptions

    def note_then_persist(records: tuple[SubscriptionRecord, ...]) -> None:
        note(records)
        executor.run_pending()  # the background thread's turn comes right now

    shared._topic._note_subscriptions = note_then_persist  # type: ignore[method-assign]
    a.set_mark_delete(4, 2)
    stored = storage.read_manifest("topic")
    assert stored.subscriptions == (SubscriptionRecord("a", (4, 2)),)  # the commit landed
    storage.close()  # the process dies
    with _open(FileStorage(tmp_path), clock) as reopened:  # type: ignore[arg-type]
        assert reopened.subscribe("a").mark_delete == (4, 2)
        reopened._check()


def test_bad_names_and_closed_views() -> None:
    clock = ManualClock(T0)
    shared = _open(MemoryStorage(), clock)
    with pytest.raises(TypeError):
        shared.subscribe(5)  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        shared.subscribe("")
    with pytest.raises(TypeError):
        shared.subscribe("x" * 1000)
    assert shared.subscriptions() == []  # nothing half-made
    a = shared.subscribe("a")
    # Bad positions are named, by the front's diagnose hook (no Python frame around it).
    for ledger, entry, match in ((True, 1, "ledger_id"), (1, 1.5, "entry_id"),
                                 (2**64, 1, "ledger_id"), (1, -1, "entry_id")):  # fmt: skip
        with pytest.raises((TypeError, ValueError), match=match):
            a.contains(ledger, entry)  # type: ignore[arg-type]  # a bool or float id on purpose
        with pytest.raises((TypeError, ValueError), match=match):
            shared.add(ledger, entry, T0 + 10)  # type: ignore[arg-type]  # (as above)
    shared.close()
    assert len(a) == 0 and not a.contains(1, 1) and a.next_delivery_time() is None
    with pytest.raises(TrackerClosedError):
        a.poll(1)
    with pytest.raises(TrackerClosedError):
        shared.add(1, 1, T0 + 10)
    shared.close()  # idempotent


def test_a_stopped_subscription_spills_to_disk_instead_of_holding_memory() -> None:
    clock = ManualClock(T0)
    config = TINY.replace(due_log_memory_keys=100, min_index_count_per_bucket=500)
    with SharedDelayIndex.open(
        MemoryStorage(), "topic", config, clock=clock, executor=InlineExecutor()
    ) as shared:
        a, stopped = shared.subscribe("a"), shared.subscribe("stopped")
        for ledger in range(1, 51):
            times = T0 + 100 + (np.arange(100) * 7919 + ledger * 31) % 5000
            shared.add_many(np.full(100, ledger), np.arange(100), times)
        clock.advance(10_000)
        got_a = [p for _ in range(60) for p in a.poll(100)]
        assert len(got_a) == 5000 and len(a) == 0
        stats = shared.stats()
        assert stats["due_log"] == 5000 and stats["due_log_spilled"] >= 4800
        assert len(shared._log.memory) <= 200  # the in-memory part stays near the budget
        # The stopped subscription still sees all of it, exactly.
        assert len(stopped) == 5000 and len(shared) == 5000
        assert stopped.contains(7, 42) and not a.contains(7, 42)
        assert list(stopped.tracked_entries(7, 0, 99)) == list(range(100))
        stopped.set_mark_delete(10, 99)  # acknowledges 1000 of them
        assert len(stopped) == 4000 and not stopped.contains(7, 42)
        shared._check()
        # It catches up: everything once, in the same selection order as `a` received it.
        got = [p for _ in range(50) for p in stopped.poll(100)]
        assert sorted(got) == sorted(p for p in got_a if p > Position(10, 99))
        assert shared.stats()["due_log"] == 0 and shared._log._spill is None  # files closed
        shared._check()


def test_the_last_unsubscribe_keeps_what_the_topic_tracks_for_a_later_subscription() -> None:
    clock = ManualClock(T0)
    with _open(MemoryStorage(), clock) as shared:
        a = shared.subscribe("a")
        _fill(shared, range(1, 11))  # 30 positions
        clock.advance(150)  # some are due
        got_a = set(a.poll(2))
        shared.unsubscribe("a")
        assert shared.subscriptions() == []
        left = len(shared)  # what the topic index still tracks (due or not)
        assert 0 < left <= 30 - len(got_a)
        shared._check()
        c = shared.subscribe("c")
        assert len(c) == left
        clock.advance(10_000)
        got_c = [p for _ in range(40) for p in c.poll(5)]
        assert len(got_c) == len(set(got_c)) == left and not got_a & set(got_c)
        shared._check()


def test_cancel_and_reschedule_reach_positions_the_due_log_holds() -> None:
    clock = ManualClock(T0)
    with _open(MemoryStorage(), clock) as shared:
        a, b = shared.subscribe("a"), shared.subscribe("b")
        _fill(shared, range(1, 4))  # 9 positions, T0 + 110 ... T0 + 132
        clock.advance(200)
        got_a = a.poll(100)
        assert len(got_a) == 9 and len(shared._log) == 9  # b has not read them yet
        assert shared.cancel(2, 1) is True  # b still had it
        assert shared.add(2, 1, T0 + 500) is True and not b.contains(2, 1)  # refused
        assert shared.reschedule(3, 2, T0 + 1_000) is True
        assert shared.cancel(99, 0) is False
        got_b = b.poll(100)
        assert Position(2, 1) not in got_b and Position(3, 2) not in got_b and len(got_b) == 7
        assert a.poll(100) == [] and b.poll(100) == []
        clock.advance(1_000)  # (3, 2) at its new time, for both (a had received it: a new copy)
        assert a.poll(100) == [Position(3, 2)] and b.poll(100) == [Position(3, 2)]
        assert shared.stats()["cancel_overrides"] == 1
        shared._check()


def test_a_deferred_read_comes_late_and_the_due_log_stays_consistent() -> None:
    """A failed segment read defers its bucket (late, never early) while the others deliver, so
    its keys reach the due log after keys later in selection order. Found by the stateful test:
    the due log's self-check demanded one global order across pops and failed on a correct
    index; it now checks each pop's order."""
    clock = ManualClock(T0)
    storage = MemoryStorage()
    config = TINY.replace(max_num_buckets=0, tick_ms=0, load_retry_delay_ms=100)
    with SharedDelayIndex.open(
        storage, "topic", config, clock=clock, executor=InlineExecutor()
    ) as shared:
        a, b = shared.subscribe("a"), shared.subscribe("b")
        for entry in range(6):  # bucket [1, 1]: three segments, due first
            assert shared.add(1, entry, T0 + 10 + entry)
        for entry in range(3):  # bucket [2, 2]
            assert shared.add(2, entry, T0 + 20 + entry)
        assert shared.add(3, 0, T0 + 30)  # seals [2, 2]; stays in the mutable bucket
        clock.advance(100)
        storage.inject_failure("get_segments", times=4)  # every attempt of one read fails
        assert _pairs(a.poll(100)) == [(2, 0), (2, 1), (2, 2), (3, 0)]
        assert list(shared.stats()["retrying_loads"].values()) == [1]
        shared._check()
        assert a.poll(100) == []  # waits for its backoff
        clock.advance(100)
        assert _pairs(a.poll(100)) == [(1, e) for e in range(6)]  # late, once
        shared._check()
        assert _pairs(b.poll(100)) == sorted(
            [(1, e) for e in range(6)] + [(2, 0), (2, 1), (2, 2), (3, 0)]
        )
        assert len(shared) == 0 and shared.stats()["due_log"] == 0
        shared._check()


def test_a_re_add_of_a_rescheduled_held_position_keeps_the_new_time() -> None:
    clock = ManualClock(T0)
    with _open(MemoryStorage(), clock) as shared:
        a, _b = shared.subscribe("a"), shared.subscribe("b")
        _fill(shared, range(1, 2))  # (1, 0..2) at T0 + 110 ... 112
        clock.advance(200)
        assert len(a.poll(100)) == 3  # b has not read them: the due log holds them
        assert shared.reschedule(1, 1, T0 + 5_000) is True  # new copies for a and b
        c = shared.subscribe("c")  # holds no copy of (1, 1)
        # The dispatcher's replay re-adds (1, 1) with its original time: c tracks it at the
        # rescheduled time (as its own DelayIndex would), not at the original, due one.
        assert shared.add(1, 1, T0 + 111) is True
        assert c.contains(1, 1) and c.poll(100) == []
        clock.advance(5_000)
        assert c.poll(100) == [Position(1, 1)]
        assert a.poll(100) == [Position(1, 1)]
        shared._check()


def test_a_held_position_cancelled_then_rescheduled_is_delivered_after_a_reopen() -> None:
    """A reschedule revives a cancelled position, held ones too: the cancel override must not
    outlive it (it did, and the replay's add after a reopen was refused: the message lost)."""
    t0 = 1_000_000
    config = TrackerConfig(tick_ms=0, min_index_count_per_bucket=4, max_indexes_per_segment=2)
    clock, storage = ManualClock(t0), MemoryStorage()

    def open_shared() -> SharedDelayIndex:
        return SharedDelayIndex.open(storage, "s", config, clock=clock, executor=InlineExecutor())

    shared = open_shared()
    fast, _ = shared.subscribe("fast"), shared.subscribe("slow")
    for ledger in range(1, 6):
        for entry in range(4):
            shared.add(ledger, entry, t0 + 100 * ledger + entry)
    clock.set(t0 + 150)
    assert len(fast.poll(100)) == 4  # ledger 1 is held in the due log for "slow"
    assert shared.cancel(1, 2) and shared.reschedule(1, 2, t0 + 5_000)
    assert shared._topic._core.override_of(1, 2) == t0 + 5_000
    shared.flush()
    shared.close()
    shared = open_shared()
    try:
        slow = shared.subscribe("slow")
        assert shared.add(1, 2, t0 + 102) is True  # the replay: tracked at the new time
        assert slow.contains(1, 2)
        clock.set(t0 + 6_000)
        assert Position(1, 2) in slow.poll(1_000)
    finally:
        shared.close()
