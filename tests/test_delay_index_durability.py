"""DelayIndex durability: failed deletes retried on the index's clock, dead letters, backpressure.

Everything runs on a ManualClock with an InlineExecutor, so no test sleeps: a delete's backoff
runs out when the clock is moved past it, and the retry happens on the next ``poll``.
"""

from __future__ import annotations

from typing import Any

from delayindex import DelayIndex, ManualClock, MemoryStorage, Position, TrackerConfig
from delayindex.executors import InlineExecutor

T0 = 1_000_000
DUE = T0 + 10_000


def _open(storage: MemoryStorage, clock: ManualClock, **config: Any) -> DelayIndex:
    settings = {"min_index_count_per_bucket": 1, "max_num_buckets": 0, **config}
    return DelayIndex.open(
        storage, "dur", TrackerConfig(**settings), clock=clock, executor=InlineExecutor()
    )


def _exhaust_one_bucket(index: DelayIndex, clock: ManualClock) -> str:
    """Seal bucket [1, 1], then deliver everything so that it is exhausted and deleted."""
    assert index.add(1, 0, DUE) and index.add(2, 0, DUE)  # (2, 0) seals [1, 1]
    index.flush()
    [bucket] = index.buckets()
    assert bucket.snapshot_id is not None
    clock.set(DUE)
    assert index.poll(10) == [Position(1, 0), Position(2, 0)]
    return bucket.snapshot_id


def test_failed_delete_is_retried_after_its_backoff_on_the_index_clock() -> None:
    clock, storage = ManualClock(T0), MemoryStorage()
    with _open(storage, clock, delete_retry_delay_ms=60_000) as index:
        storage.inject_failure("delete", times=4)  # one delete fails after all its attempts
        snapshot_id = _exhaust_one_bucket(index, clock)
        assert index.stats()["pending_deletes"] == [snapshot_id]
        assert [o.id for o in storage.list_objects()] == [snapshot_id]
        calls = storage.stats()["delete"]["calls"]
        clock.advance(59_999)
        assert index.poll(10) == []
        assert storage.stats()["delete"]["calls"] == calls  # backoff not over: no attempt
        clock.advance(1)
        assert index.poll(10) == []
        assert index.stats()["pending_deletes"] == []
        assert storage.list_objects() == []
        assert storage.read_manifest("dur").intents == ()


def test_delete_that_keeps_failing_moves_to_the_dead_letters() -> None:
    clock, storage = ManualClock(T0), MemoryStorage()
    with _open(storage, clock, delete_retry_delay_ms=10, max_delete_attempts=3) as index:
        storage.inject_failure("delete", times=4 * 3)  # every attempt of three deletes fails
        snapshot_id = _exhaust_one_bucket(index, clock)
        for _ in range(6):  # backoff 10, 20, ... ms: move well past each
            clock.advance(1_000)
            index.poll(10)
        stats = index.stats()
        assert stats["pending_deletes"] == []
        assert stats["dead_letters"] == [snapshot_id]
        # Kept, never forgotten: the object and its dead letter both stay.
        assert [o.id for o in storage.list_objects()] == [snapshot_id]
        assert [d.snapshot_id for d in storage.read_manifest("dur").dead_letters] == [snapshot_id]


def test_backpressure_while_indexes_live_only_in_memory() -> None:
    clock, storage = ManualClock(T0), MemoryStorage()
    with _open(
        storage,
        clock,
        min_index_count_per_bucket=3,
        pause_on_unpersisted=True,
        max_unpersisted_indexes=2,
        fixed_delay_lookahead=0,
    ) as index:
        for entry in range(3):
            assert index.add(1, entry, DUE)
        assert index.should_pause_all_deliveries()  # 3 in the mutable bucket > 2
        assert index.stats()["blocked_on_persistence"] is True
        assert index.add(2, 0, DUE)  # seals [1, 1]; its snapshot is written at once
        index.flush()
        assert index.stats()["unpersisted"] == 1
        assert not index.should_pause_all_deliveries()
        assert index.stats()["blocked_on_persistence"] is False


def _with_failed_create(storage: MemoryStorage, clock: ManualClock, **config: Any) -> DelayIndex:
    """An index pausing above 2 unpersisted indexes whose first bucket's create has failed:
    (1, 0), (1, 1) sealed as [1, 1] and kept in memory, (2, 0) in the mutable bucket."""
    index = _open(
        storage,
        clock,
        min_index_count_per_bucket=2,
        pause_on_unpersisted=True,
        max_unpersisted_indexes=2,
        fixed_delay_lookahead=0,
        **config,
    )
    storage.inject_failure("create", times=4)
    for ledger, entry in [(1, 0), (1, 1), (2, 0)]:  # (2, 0) seals [1, 1]: its create fails
        assert index.add(ledger, entry, DUE)
    return index


def test_backpressure_stays_while_creates_fail() -> None:
    clock, storage = ManualClock(T0), MemoryStorage()
    with _with_failed_create(storage, clock) as index:
        index.flush()
        assert index.stats()["memory_mode_buckets"] == 1
        assert index.stats()["unpersisted"] == 3
        assert index.should_pause_all_deliveries()
        clock.set(DUE)
        assert len(index.poll(10)) == 3  # memory mode: still delivered
        assert not index.should_pause_all_deliveries()


def test_clear_persists_the_mark_reset_at_once() -> None:
    clock, storage = ManualClock(T0), MemoryStorage()
    with _open(storage, clock) as index:
        index.set_mark_delete(5, 0)
    assert storage.read_manifest("dur").mark_delete == (5, 0)  # persisted by close
    with _open(storage, clock) as index:
        assert index.mark_delete == (5, 0)
        index.clear()  # nothing to delete: no other commit would carry the reset
        assert storage.read_manifest("dur").mark_delete is None
        assert index.mark_delete is None


def test_backpressure_clears_when_the_failed_write_is_retried() -> None:
    clock, storage = ManualClock(T0), MemoryStorage()
    with _with_failed_create(storage, clock, delete_retry_delay_ms=1_000) as index:
        assert index.should_pause_all_deliveries() and index.unpersisted() == 3
        clock.advance(1_000)  # the retry's backoff is over; nothing is due yet
        assert index.poll(10) == []
        assert index.stats()["memory_mode_buckets"] == 0
        assert index.unpersisted() == 1  # only the mutable bucket's (2, 0)
        assert not index.should_pause_all_deliveries()
        assert index.stats()["blocked_on_persistence"] is False
        status = storage.read_manifest("dur").writer_status
        assert status is not None and status.unpersisted == 1  # recorded by the retry's commit


def test_memory_usage_counts_the_metadata_the_storage_caches_after_a_reopen() -> None:
    """Recovery leaves each bucket's decoded metadata in the storage's read cache:
    ``memory_usage_bytes()`` counts it (``stats()["metadata_cache_bytes"]``), and without the
    cache (``metadata_cache_size=0``) the estimate is smaller by exactly that."""
    usage: dict[int, tuple[int, int]] = {}
    for cache_size in (128, 0):
        clock, storage = ManualClock(T0), MemoryStorage(metadata_cache_size=cache_size)
        with _open(storage, clock) as index:
            for ledger in range(1, 6):
                index.add_many([ledger] * 50, list(range(50)), [DUE + e for e in range(50)])
            index.flush()
            assert index.stats()["metadata_cache_bytes"] == 0  # writing caches nothing
        with _open(storage, clock) as index:
            ids = [b.snapshot_id for b in index.buckets() if b.snapshot_id is not None]
            assert len(ids) == 4  # ledgers 1-4 sealed; ledger 5 is the mutable bucket
            # First: a get_metadata decodes the positions of the (cached) metadata it returns.
            held = sum(storage.get_metadata(i).nbytes for i in ids)
            cached = index.stats()["metadata_cache_bytes"]
            usage[cache_size] = (index.memory_usage_bytes(), cached)
            assert index.stats()["memory_bytes"] == usage[cache_size][0]  # the metric's value
            if cache_size:
                assert cached == held > 0
            else:
                assert cached == 0
    assert usage[128][0] - usage[0][0] == usage[128][1]
