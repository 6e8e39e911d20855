"""DelayIndex group commit: bursts of seals and deletes share manifest writes, in order.

A gated executor holds the background thread while a burst of seals queues up, so the tests do
not depend on timing: when the gate opens, the persist job finds the whole burst waiting.
Failed snapshot writes keep their bucket in memory and are retried after the backoff, on the
index's clock.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import pytest

from delayindex import DelayIndex, ManualClock, MemoryStorage, Position, TrackerConfig
from delayindex.executors import InlineExecutor

T0 = 1_000_000


class GatedExecutor(ThreadPoolExecutor):
    """One worker thread that starts running jobs only once ``gate`` is set."""

    def __init__(self) -> None:
        super().__init__(max_workers=1)
        self.gate = threading.Event()

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future[Any]:
        def gated() -> Any:
            self.gate.wait()
            return fn(*args, **kwargs)

        return super().submit(gated)


def _burst(storage: MemoryStorage, seals: int, **config: Any) -> tuple[DelayIndex, int]:
    """Seal ``seals`` buckets of 10 indexes while the writer is held; return the index and the
    manifest writes the burst took once released."""
    executor = GatedExecutor()
    settings = {"min_index_count_per_bucket": 10, "max_num_buckets": 0, **config}
    index = DelayIndex.open(
        storage, "gc", TrackerConfig(**settings), clock=ManualClock(T0), executor=executor
    )
    before = storage.stats()["commit_manifest"]["calls"]
    for ledger in range(seals + 1):  # the last ledger stays in the mutable bucket
        for entry in range(10):
            index.add(ledger, entry, T0 + 60_000 + entry)
    executor.gate.set()
    index.flush()
    return index, storage.stats()["commit_manifest"]["calls"] - before


def test_a_burst_of_seals_shares_two_manifest_writes_per_batch() -> None:
    storage = MemoryStorage()
    index, writes = _burst(storage, 200)
    stats = index.stats()
    assert stats["durable_buckets"] == 200 and stats["unpersisted"] == 10
    assert writes == 2 == stats["group_commit"]["manifest_writes"]
    assert stats["group_commit"]["batches"] == 1
    index._check()
    index.close()


def test_batches_respect_max_ops() -> None:
    storage = MemoryStorage()
    index, writes = _burst(storage, 100, group_commit_max_ops=16)
    assert index.stats()["durable_buckets"] == 100
    assert writes == 2 * 7  # ceil(100 / 16) batches
    index.close()


def test_batches_respect_max_bytes() -> None:
    storage = MemoryStorage()
    index, writes = _burst(storage, 40, group_commit_max_bytes=1)  # every bucket fills a batch
    assert index.stats()["durable_buckets"] == 40
    assert writes == 2 * 40
    index.close()


def test_group_commit_off_writes_twice_per_seal() -> None:
    storage = MemoryStorage()
    index, writes = _burst(storage, 50, group_commit_max_ops=1)
    assert index.stats()["durable_buckets"] == 50 and writes == 100
    index.close()


def test_order_is_preserved_and_acknowledged_only_when_durable() -> None:
    """Buckets become durable in seal order, each only once the manifest lists it."""
    storage = MemoryStorage()
    seen: list[list[str]] = []
    real_commit = storage.commit_manifest

    def commit(name: str, manifest: Any) -> Any:
        seen.append([b.snapshot_id for b in manifest.buckets])
        return real_commit(name, manifest)

    storage.commit_manifest = commit  # type: ignore[method-assign]
    index, _ = _burst(storage, 30, group_commit_max_ops=8)
    live = [b.snapshot_id for b in index.buckets()]
    manifest_order = [b.snapshot_id for b in storage.read_manifest("gc").buckets]
    assert live == manifest_order and len(live) == 30
    # Each commit's live list is a prefix of the final order: no bucket overtook an earlier one.
    for listed in seen:
        assert listed == manifest_order[: len(listed)]
    index.close()


def test_deletes_join_the_batch() -> None:
    """Buckets exhausted together are deleted with one pair of manifest writes."""
    storage = MemoryStorage()
    clock = ManualClock(T0)
    executor = GatedExecutor()
    config = TrackerConfig(min_index_count_per_bucket=10, max_num_buckets=0, strict=True)
    index = DelayIndex.open(storage, "gc", config, clock=clock, executor=executor)
    for ledger in range(21):
        for entry in range(10):
            index.add(ledger, entry, T0 + 1_000)
    executor.gate.set()
    index.flush()
    assert len(storage.list_objects()) == 20
    executor.gate.clear()
    clock.set(T0 + 1_000)
    delivered = index.poll(10_000)
    assert len(delivered) == 210 and delivered == sorted(delivered)
    before = storage.stats()["commit_manifest"]["calls"]
    executor.gate.set()
    index.flush()
    assert storage.list_objects() == []
    assert storage.stats()["commit_manifest"]["calls"] - before == 2
    index.close()


def test_failed_write_keeps_the_bucket_in_memory_then_retries_it() -> None:
    clock, storage = ManualClock(T0), MemoryStorage()
    config = TrackerConfig(
        min_index_count_per_bucket=2, max_num_buckets=0, delete_retry_delay_ms=5_000, strict=True
    )
    with DelayIndex.open(storage, "gc", config, clock=clock, executor=InlineExecutor()) as index:
        storage.inject_failure("create", times=4)  # every attempt of one create fails
        for ledger in (1, 1, 2):
            index.add(ledger, len(index), T0 + 60_000)  # (2, 2) seals [1, 1]
        [bucket] = index.buckets()
        assert bucket.state == "memory" and index.unpersisted() == 3
        assert index.stats()["awaiting_retry"]["creates"] == 1
        clock.advance(4_999)
        index.poll(10)
        assert index.buckets()[0].state == "memory"
        clock.advance(1)
        assert index.poll(10) == []  # the retry is due: it runs with the next group commit
        [bucket] = index.buckets()
        assert bucket.state == "durable" and index.unpersisted() == 1
        assert storage.read_manifest("gc").live_ids() == {bucket.snapshot_id}
        clock.set(T0 + 60_000)
        assert index.poll(10) == [Position(1, 0), Position(1, 1), Position(2, 2)]
        index._check()


def test_failed_first_commit_defers_deletes_of_live_buckets() -> None:
    clock, storage = ManualClock(T0), MemoryStorage()
    config = TrackerConfig(
        min_index_count_per_bucket=1, max_num_buckets=0, delete_retry_delay_ms=1_000, strict=True
    )
    with DelayIndex.open(storage, "gc", config, clock=clock, executor=InlineExecutor()) as index:
        index.add(1, 0, T0 + 10)
        index.add(2, 0, T0 + 10)  # seals [1, 1]
        [bucket] = index.buckets()
        assert bucket.state == "durable"
        clock.set(T0 + 10)
        storage.inject_failure("manifest", times=8)  # the batch's commit and its re-read fail
        assert index.poll(10) == [Position(1, 0), Position(2, 0)]
        assert storage.read_manifest("gc").live_ids() == {bucket.snapshot_id}
        assert index.stats()["awaiting_retry"]["deletes"] == 1
        clock.advance(1_000)
        index.poll(10)
        assert storage.list_objects() == [] and storage.read_manifest("gc").buckets == ()


@pytest.mark.parametrize("seals", [1, 7])
def test_writer_status_is_persisted_for_inspect(seals: int) -> None:
    storage = MemoryStorage()
    index, _ = _burst(storage, seals)
    status = storage.read_manifest("gc").writer_status
    assert status is not None and status.as_of_ms == T0
    assert status.unpersisted >= 10  # at least the mutable bucket, at the time of the commit
    index.close()


def test_close_records_what_the_writer_left_unpersisted() -> None:
    """The last commit's status said what was in flight then; close records the final figure
    (the mutable bucket, lost with the process) and its time, once."""
    storage, clock = MemoryStorage(), ManualClock(T0)
    config = TrackerConfig(min_index_count_per_bucket=10, max_num_buckets=0)
    index = DelayIndex.open(storage, "gc", config, clock=clock, executor=InlineExecutor())
    for ledger in range(3):
        for entry in range(10 if ledger < 2 else 4):
            index.add(ledger, entry, T0 + 60_000 + entry)
    index.flush()
    clock.set(T0 + 5_000)
    commits = storage.stats()["commit_manifest"]["calls"]
    index.close()
    status = storage.read_manifest("gc").writer_status
    assert status is not None
    assert (status.unpersisted, status.memory_mode_buckets, status.as_of_ms) == (4, 0, T0 + 5_000)
    assert storage.stats()["commit_manifest"]["calls"] == commits + 1
    # A reopen that changes nothing and closes at once records an empty writer, no more.
    with DelayIndex.open(storage, "gc", config, clock=clock, executor=InlineExecutor()):
        pass
    status = storage.read_manifest("gc").writer_status
    assert status is not None and status.unpersisted == 0
