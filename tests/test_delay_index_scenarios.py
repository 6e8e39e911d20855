"""Scenario tests for DelayIndex, one (or a few) per Pulsar PIP-195 bug it must not repeat.

Each test is named after the Pulsar issue of the reference notes (§5.1, bucket tracker) and its
docstring says what Pulsar got wrong and what DelayIndex guarantees instead. Settings are tiny
(three indexes seal a bucket, two indexes or 100 ms per segment) so that every scenario seals,
loads, merges and deletes with a handful of messages. Background work runs inline
(``InlineExecutor``) or under a test executor that holds jobs until told, so everything is
deterministic; the only real thread is in the ``contains`` concurrency test.
"""

from __future__ import annotations

import contextlib
import itertools
import threading
from collections import Counter
from collections.abc import Callable, Iterable
from concurrent.futures import Executor, Future
from pathlib import Path
from typing import Any

import pytest

import delayindex.tracker.delay_index as delay_index_module
from delayindex import (
    DelayIndex,
    FileStorage,
    ManualClock,
    ManualTimer,
    MemoryStorage,
    Position,
    RecoveryError,
    StorageError,
    TrackerConfig,
)
from delayindex.executors import InlineExecutor
from delayindex.snapshot.format import build_snapshot
from delayindex.storage.base import SnapshotStorage
from delayindex.storage.manifest import BucketRecord
from delayindex.tracker.delay_index import resolve_overlaps, select_merge_window

T0 = 1_000_000
NAME = "scn"
TICK = 10
MAX_ENTRY = 2**32 - 1
Schedule = dict[Position, int]


# -- helpers --------------------------------------------------------------------------------------


def tiny(**overrides: Any) -> TrackerConfig:
    """Three indexes seal a bucket; segments hold 2 indexes or span 100 ms; no merge."""
    settings: dict[str, Any] = {
        "min_index_count_per_bucket": 3,
        "max_indexes_per_segment": 2,
        "max_time_step_per_segment_ms": 100,
        "max_num_buckets": 0,
        "tick_ms": TICK,
    }
    settings.update(overrides)
    return TrackerConfig(**settings)


def open_index(
    storage: SnapshotStorage,
    clock: ManualClock,
    config: TrackerConfig | None = None,
    *,
    executor: Executor | None = None,
    **kwargs: Any,
) -> DelayIndex:
    return DelayIndex.open(
        storage,
        NAME,
        config if config is not None else tiny(),
        clock=clock,
        executor=executor if executor is not None else InlineExecutor(),
        **kwargs,
    )


def add_ledger(
    index: DelayIndex, ledger: int, first_time: int, count: int = 5, spacing: int = 10
) -> Schedule:
    """Add ``count`` entries of ``ledger`` due at ``first_time + i * spacing``; all tracked."""
    schedule: Schedule = {}
    for entry in range(count):
        at = first_time + entry * spacing
        assert index.add(ledger, entry, at) is True, (ledger, entry, at)
        schedule[Position(ledger, entry)] = at
    return schedule


def seal_ledgers(
    index: DelayIndex, ledgers: Iterable[int], first_time: int, count: int = 5
) -> Schedule:
    """One bucket per ledger (5 indexes in 50 ms -> segments of 2, 2, 1), plus one more message
    on the next ledger, which seals the last of them and stays in the mutable bucket."""
    schedule: Schedule = {}
    last = 0
    for n, ledger in enumerate(ledgers):
        schedule.update(add_ledger(index, ledger, first_time + n * 1000, count))
        last = ledger
    closing = Position(last + 1, 0)
    schedule[closing] = first_time + 100_000
    assert index.add(closing.ledger_id, closing.entry_id, schedule[closing]) is True
    return schedule


def drain(
    index: DelayIndex, clock: ManualClock, schedule: Schedule, *, strict: bool = False
) -> Counter[Position]:
    """Walk the clock through every scheduled time, polling everything due at each step.

    Asserts that nothing is delivered before its time (``deliver_at <= now`` when strict, else
    ``<= now + tick``) and that nothing unscheduled is delivered. Returns delivery counts.
    """
    delivered: Counter[Position] = Counter()
    times = sorted(set(schedule.values()))
    for at in [*times, times[-1] + 1_000_000] if times else []:
        if at > clock():
            clock.set(at)
        while True:
            got = index.poll(1000)
            if not got:
                break
            now = clock()
            cutoff = now if strict else now + index.stats()["tick_ms"]
            for p in got:
                assert p in schedule, f"delivered {p}, which was never scheduled"
                assert schedule[p] <= cutoff, f"{p} due {schedule[p]} delivered early at {now}"
            delivered.update(got)
    index._check()
    return delivered


def assert_exactly_once(delivered: Counter[Position], expected: Iterable[Position]) -> None:
    expected = set(expected)
    assert set(delivered) == expected, (
        f"missing {sorted(expected - set(delivered))}, extra {sorted(set(delivered) - expected)}"
    )
    doubles = {p: n for p, n in delivered.items() if n != 1}
    assert not doubles, f"delivered more than once: {doubles}"


def object_ids(storage: SnapshotStorage) -> set[str]:
    return {o.id for o in storage.list_objects()}


def assert_no_orphans(storage: SnapshotStorage) -> None:
    """Every stored object is referenced by the manifest (live, pending delete, dead letter),
    and no create is left half done once the index has flushed."""
    manifest = storage.read_manifest(NAME)
    orphans = object_ids(storage) - manifest.referenced_ids()
    assert not orphans, f"orphaned snapshot objects: {sorted(orphans)}"
    assert [i for i in manifest.intents if i.kind == "create"] == []


def consume_faults(storage: MemoryStorage, op: str) -> None:
    """Use up injected failures of ``op`` (each call of a nonexistent delete takes up to 4)."""
    assert op == "delete"
    while storage.pending_failures(op):
        with contextlib.suppress(StorageError):
            storage.delete("no-such-object")


def ranges(index: DelayIndex) -> list[tuple[int, int]]:
    return [(b.start_ledger, b.end_ledger) for b in index.buckets()]


class HeldExecutor(Executor):
    """Records submitted jobs and runs them only when told (``run_one``/``run_all``)."""

    def __init__(self) -> None:
        self.jobs: list[tuple[Callable[[], Any], Future[Any]]] = []
        self.submitted = 0

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future[Any]:
        future: Future[Any] = Future()
        self.jobs.append((lambda: fn(*args, **kwargs), future))
        self.submitted += 1
        return future

    def run_one(self) -> None:
        job, future = self.jobs.pop(0)
        try:
            future.set_result(job())
        except BaseException as exc:
            future.set_exception(exc)

    def run_all(self) -> None:
        while self.jobs:
            self.run_one()

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        self.run_all()


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(T0)


@pytest.fixture
def storage() -> MemoryStorage:
    return MemoryStorage()


# -- #17677 / #22802: no orphaned snapshot objects ------------------------------------------------


@pytest.mark.parametrize(
    ("op", "times", "after"),
    [
        ("create", 4, False),
        ("create", 4, True),
        ("create", 3, True),
        ("manifest", 4, False),
        ("manifest", 1, True),
        ("delete", 4, False),
    ],
    ids=[
        "create-fails",
        "create-lost-acks",
        "create-retried",
        "manifest-fails",
        "manifest-lost-ack",
        "delete-fails",
    ],
)
def test_17677_22802_no_orphan_snapshot_objects_after_failures(
    storage: MemoryStorage, clock: ManualClock, op: str, times: int, after: bool
) -> None:
    """Pulsar orphaned snapshots on failed create/delete; every object we keep is referenced."""
    index = open_index(storage, clock)
    storage.inject_failure(op, times=times, after=after)
    schedule = seal_ledgers(index, [1, 2], T0 + 1000)
    index.flush()
    index._check()
    assert_no_orphans(storage)
    assert len(index) == len(schedule)
    delivered = drain(index, clock, schedule)
    index.flush()
    assert_exactly_once(delivered, schedule)
    assert_no_orphans(storage)
    assert storage.pending_failures(op) == 0
    index.close()
    reopened = open_index(storage, clock)
    reopened.flush()
    manifest = storage.read_manifest(NAME)
    assert object_ids(storage) == set(manifest.live_ids()) == manifest.referenced_ids() == set()
    assert len(reopened) == 0
    reopened.close()


# -- #19138 / #6403: dedup on add after recovery --------------------------------------------------


def test_19138_6403_readd_after_recovery_is_deduplicated(
    storage: MemoryStorage, clock: ManualClock
) -> None:
    """Pulsar risked double delivery of re-read recovered indexes; a re-add is counted once."""
    index = open_index(storage, clock)
    schedule = seal_ledgers(index, [1, 2], T0 + 10_000)
    index.close()
    index = open_index(storage, clock)
    durable = {p for p in schedule if p.ledger_id in (1, 2)}
    assert len(index) == len(durable)
    assert all(index.contains(*p) for p in durable)
    for p in sorted(schedule):  # the dispatcher re-reads the whole backlog from its cursor
        assert index.add(p.ledger_id, p.entry_id, schedule[p]) is True
    assert len(index) == len(schedule)
    for p in sorted(durable):  # and reads it once more: still no double count
        assert index.add(p.ledger_id, p.entry_id, schedule[p]) is True
    assert len(index) == len(schedule)
    assert_exactly_once(drain(index, clock, schedule), schedule)
    index.close()


# -- #19577: retries, memory mode, load rollback --------------------------------------------------


def test_19577_create_failing_four_times_downgrades_to_memory_mode(
    storage: MemoryStorage, clock: ManualClock
) -> None:
    """Pulsar downgrades a failed create to memory; ours too: unpersisted, still delivered once."""
    config = tiny(pause_on_unpersisted=True, max_unpersisted_indexes=4)
    index = open_index(storage, clock, config)
    storage.inject_failure("create", times=4)
    schedule = seal_ledgers(index, [1], T0 + 1000)
    index.flush()
    assert index.should_pause_all_deliveries()  # 6 indexes only in memory > 4
    stats = index.stats()
    assert stats["memory_mode_buckets"] == 1
    assert stats["ops"]["create"]["failed"] == 1
    assert stats["unpersisted"] >= 5
    [bucket] = index.buckets()
    assert (bucket.state, bucket.snapshot_id) == ("memory", None)
    assert object_ids(storage) == set()
    assert len(index) == len(schedule)
    assert_exactly_once(drain(index, clock, schedule), schedule)
    assert index.buckets() == []
    assert not index.should_pause_all_deliveries()
    index.close()


def test_19577_create_succeeds_on_the_fourth_attempt(
    storage: MemoryStorage, clock: ManualClock
) -> None:
    """Pulsar retries 3 times (4 attempts); three failures then success give a durable bucket."""
    config = tiny(pause_on_unpersisted=True, max_unpersisted_indexes=4)
    index = open_index(storage, clock, config)
    storage.inject_failure("create", times=3)
    seal_ledgers(index, [1], T0 + 1000)
    index.flush()
    assert not index.should_pause_all_deliveries()  # only the mutable bucket's 1 index
    assert index.stats()["memory_mode_buckets"] == 0
    [bucket] = index.buckets()
    assert bucket.state == "durable"
    assert object_ids(storage) == {bucket.snapshot_id}
    index.close()


def test_19577_segment_load_failure_backs_off_and_retries_later(
    storage: MemoryStorage, clock: ManualClock
) -> None:
    """Pulsar testWithBkException: a failed load rolls back; we lose nothing, and the bucket's
    read is retried after its backoff (not on every poll) while the others keep delivering."""
    index = open_index(storage, clock)
    schedule = seal_ledgers(index, [1], T0 + 1000)  # segments (1,0)(1,1) | (1,2)(1,3) | (1,4)
    index.flush()
    [bucket] = index.buckets()
    # Durable: nothing of it stays in memory; segment 1 is read back when it comes due.
    assert (bucket.num_segments, bucket.loaded_segment) == (3, 0)
    clock.set(T0 + 1020)  # cutoff T0 + 1030: segments 1 and 2 are due
    storage.inject_failure("get_segments", times=4)
    assert index.poll(100) == []  # the load failed: nothing delivered, nothing lost
    assert index.buckets()[0].loaded_segment == 0
    stats = index.stats()
    assert stats["ops"]["load"]["failed"] == 1
    assert stats["retrying_loads"] == {bucket.snapshot_id: 1}
    assert stats["health"] == "degraded"
    assert len(index) == 6  # the bucket's 5 and (2, 0) in the mutable bucket
    assert all(index.contains(1, e) for e in range(5))
    # Not retried on every poll (no retry storm): the bucket waits for its backoff.
    assert not index.has_message_available()
    assert index.poll(100) == []
    assert index.stats()["ops"]["load"]["failed"] == 1
    retry_at = index.next_delivery_time()
    assert retry_at is not None and retry_at > T0 + 1030
    clock.set(retry_at)
    assert index.poll(100) == [Position(1, e) for e in range(5)]  # late, never early
    assert index.stats()["retrying_loads"] == {}
    assert index.stats()["health"] == "ok"
    rest = {Position(2, 0): schedule[Position(2, 0)]}
    assert_exactly_once(drain(index, clock, rest), rest)
    index.close()


# -- #19615 / #26251: merge keeps every segment ---------------------------------------------------


def test_19615_26251_merge_keeps_all_segments_including_the_loaded_one(
    storage: MemoryStorage, clock: ManualClock
) -> None:
    """Pulsar's merge dropped the loaded segment 1; ours keeps every index across a reopen."""
    index = open_index(storage, clock, tiny(max_num_buckets=1))
    schedule = seal_ledgers(index, [1, 2], T0 + 10_000)
    index.flush()
    merge_ops = index.stats()["ops"]["merge"]
    assert (merge_ops["succeeded"], merge_ops["failed"]) == (1, 0)
    [merged] = index.buckets()
    assert (merged.start_ledger, merged.end_ledger, merged.num_messages) == (1, 2, 10)
    assert object_ids(storage) == {merged.snapshot_id}
    assert_no_orphans(storage)
    durable = {p for p in schedule if p.ledger_id in (1, 2)}
    index.close()
    index = open_index(storage, clock)
    assert len(index) == len(durable)
    lost = {p for p in durable if not index.contains(*p)}
    assert not lost, f"lost by the merge: {sorted(lost)}"
    expected = {p: schedule[p] for p in durable}
    assert_exactly_once(drain(index, clock, expected), expected)
    index.close()


# -- #19706: segment cut rules --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("max_indexes", "offsets", "counts"),
    [
        (2, [0, 10, 20, 30, 40], [2, 2, 1]),  # by count
        (-1, [0, 200, 400], [1, 1, 1]),  # by time step
        (-1, [0, 99, 100], [2, 1]),  # a segment spans [T, T + step - 1]
        (2, [0, 10, 20, 150, 300], [2, 1, 1, 1]),  # both rules
        (-1, [0, 10, 20, 30, 40], [5]),  # no count limit
    ],
    ids=["count", "time", "time-boundary", "both", "unlimited"],
)
def test_19706_segments_cut_by_count_and_time_step(
    storage: MemoryStorage, clock: ManualClock, max_indexes: int, offsets: list[int],
    counts: list[int],
) -> None:  # fmt: skip
    """Pulsar cut segments by time only at first; we cut by count and by [T, T + step - 1]."""
    index = open_index(storage, clock, tiny(max_indexes_per_segment=max_indexes))
    for entry, offset in enumerate(offsets):
        assert index.add(1, entry, T0 + 1000 + offset)
    assert index.add(2, 0, T0 + 100_000)
    index.flush()
    [bucket] = index.buckets()
    assert bucket.num_segments == len(counts)
    assert bucket.num_messages == len(offsets)
    assert bucket.snapshot_id is not None
    assert storage.get_metadata(bucket.snapshot_id).counts.tolist() == counts
    index.close()


# -- #20075 / #26401 / #21595: clear always completes ---------------------------------------------


def test_20075_clear_completes_while_deletes_fail(
    storage: MemoryStorage, clock: ManualClock
) -> None:
    """Pulsar's clear future never completed; ours returns while deletes fail, keeping intents."""
    index = open_index(storage, clock)
    schedule = seal_ledgers(index, [1, 2], T0 + 1000)
    index.flush()
    ids = {b.snapshot_id for b in index.buckets()}
    assert len(ids) == 2
    storage.inject_failure("delete", times=1000)
    index.clear()
    assert len(index) == 0
    assert index.buckets() == []
    assert not any(index.contains(*p) for p in schedule)
    manifest = storage.read_manifest(NAME)
    assert manifest.live_ids() == frozenset()
    assert ids <= manifest.referenced_ids()
    assert_no_orphans(storage)
    stats = index.stats()
    assert ids <= set(stats["pending_deletes"]) | set(stats["dead_letters"])
    again = seal_ledgers(index, [1, 2], T0 + 10_000)  # the same ledgers, sealed anew
    index.flush()
    assert ranges(index) == [(1, 1), (2, 2)]
    assert all(b.state == "durable" for b in index.buckets())
    assert_no_orphans(storage)
    index.close()
    consume_faults(storage, "delete")
    reopened = open_index(storage, clock)
    reopened.flush()
    manifest = storage.read_manifest(NAME)
    assert object_ids(storage) == set(manifest.live_ids()) == manifest.referenced_ids()
    assert len(manifest.live_ids()) == 2 and not ids & manifest.referenced_ids()
    durable = {p: t for p, t in again.items() if p.ledger_id in (1, 2)}
    assert len(reopened) == len(durable)
    assert_exactly_once(drain(reopened, clock, durable), durable)
    reopened.close()


def test_20075_26401_clear_with_inflight_background_work_leaves_nothing(
    storage: MemoryStorage, clock: ManualClock
) -> None:
    """Pulsar's clear raced in-flight creates/merges; ours waits and leaves nothing behind."""
    index = open_index(storage, clock, tiny(max_num_buckets=2), executor=None)  # own thread
    seal_ledgers(index, range(1, 9), T0 + 10_000)
    index.clear()
    assert len(index) == 0
    assert index.buckets() == []
    index.flush()
    assert object_ids(storage) == set()
    assert storage.read_manifest(NAME).referenced_ids() == frozenset()
    index.close()
    reopened = open_index(storage, clock)
    assert len(reopened) == 0
    reopened.close()


def test_26401_failed_merge_create_keeps_its_sources(
    storage: MemoryStorage, clock: ManualClock
) -> None:
    """Pulsar deleted merge sources even when the merged create failed; ours keeps them durable."""
    executor = HeldExecutor()
    index = open_index(storage, clock, tiny(max_num_buckets=1), executor=executor)
    schedule = seal_ledgers(index, [1], T0 + 10_000)
    executor.run_all()  # bucket [1, 1] durable
    schedule.update(seal_ledgers(index, [2], T0 + 20_000))  # seals [2, 2]
    executor.run_one()  # its create; the merge is queued next
    assert [b.state for b in index.buckets()] == ["merging", "merging"]
    storage.inject_failure("create", times=4)
    executor.run_all()
    assert storage.pending_failures("create") == 0
    stats = index.stats()
    assert stats["ops"]["merge"]["failed"] == 1
    buckets = index.buckets()
    assert [(b.start_ledger, b.end_ledger, b.state) for b in buckets] == [
        (1, 1, "durable"),
        (2, 2, "durable"),
    ]
    live = {b.snapshot_id for b in buckets}
    assert set(storage.read_manifest(NAME).live_ids()) == live
    assert object_ids(storage) == live
    durable = {p for p in schedule if p.ledger_id in (1, 2)}
    assert all(index.contains(*p) for p in durable)
    index.close()
    index = open_index(storage, clock)
    assert len(index) == len(durable)
    expected = {p: schedule[p] for p in durable}
    assert_exactly_once(drain(index, clock, expected), expected)
    index.close()


def test_21595_cleanup_handles_missing_or_empty_state(
    storage: MemoryStorage, clock: ManualClock
) -> None:
    """Pulsar's cleanup NPE'd on missing state; our clear/close complete on empty or gone state."""
    empty = open_index(storage, clock)
    empty.clear()
    empty.clear()
    empty.close()
    index = open_index(storage, clock)
    seal_ledgers(index, [1, 2], T0 + 1000)
    index.flush()
    for snapshot_id in object_ids(storage):
        storage.delete(snapshot_id)  # gone behind the index's back
    index.clear()
    index.flush()
    stats = index.stats()
    assert stats["pending_deletes"] == [] and stats["dead_letters"] == []
    assert storage.read_manifest(NAME).referenced_ids() == frozenset()
    assert len(index) == 0
    index.close()
    index.close()
    reopened = open_index(storage, clock)
    assert len(reopened) == 0 and reopened.buckets() == []
    reopened.close()


# -- #22716: a restart preserves delays -----------------------------------------------------------


@pytest.mark.parametrize("kind", ["memory", "file"])
def test_22716_restart_preserves_delays(clock: ManualClock, tmp_path: Path, kind: str) -> None:
    """Pulsar users saw delays ignored after a restart; after reopen nothing is delivered early."""

    def make_storage() -> SnapshotStorage:
        return MemoryStorage() if kind == "memory" else FileStorage(tmp_path / "store")

    first = make_storage()
    index = open_index(first, clock)
    schedule = seal_ledgers(index, [1, 2, 3], T0 + 60_000)
    index.close()
    durable = {p: t for p, t in schedule.items() if p.ledger_id <= 3}
    clock.set(T0 + 30_000)
    storage = first if kind == "memory" else make_storage()  # a new process, the same files
    index = open_index(storage, clock)
    assert len(index) == len(durable)
    assert index.poll(1000) == []
    assert not index.has_message_available()
    next_time = index.next_delivery_time()
    assert next_time is not None and next_time >= min(durable.values())
    assert_exactly_once(drain(index, clock, durable), durable)
    index.close()


def test_22716_reopen_skips_fully_due_segments_and_keeps_later_ones(
    storage: MemoryStorage, clock: ManualClock
) -> None:
    """Recovery skips fully due segments (re-added as due) and never delivers the rest early."""
    index = open_index(storage, clock)
    schedule = seal_ledgers(index, [1], T0 + 1000)  # (1,0)(1,1) | (1,2)(1,3) | (1,4)
    index.close()
    clock.set(T0 + 1015)  # cutoff T0 + 1025: segment 1 (max T0 + 1010) is fully due
    index = open_index(storage, clock)
    assert not index.contains(1, 0) and not index.contains(1, 1)
    assert all(index.contains(1, e) for e in (2, 3, 4))
    assert len(index) == 3
    assert index.add(1, 0, schedule[Position(1, 0)]) is False  # re-read: deliver now
    assert index.add(1, 1, schedule[Position(1, 1)]) is False
    assert index.add(1, 3, schedule[Position(1, 3)]) is True  # re-read: already tracked
    assert len(index) == 3
    later = {p: schedule[p] for p in (Position(1, 2), Position(1, 3), Position(1, 4))}
    assert_exactly_once(drain(index, clock, later), later)
    index.close()


# -- #23190 / #24014: contains from other threads -------------------------------------------------


def test_23190_24014_contains_from_another_thread_while_adding(
    storage: MemoryStorage, clock: ManualClock
) -> None:
    """Pulsar's containsMessage was unsynchronized; ours is consistent from any thread."""
    index = open_index(storage, clock, tiny(max_num_buckets=2), executor=None)  # own thread
    far = T0 + 10**9
    anchors = [Position(0, e) for e in range(5)]
    for p in anchors:  # never due during the test; sealed, then merged as ledgers go by
        assert index.add(p.ledger_id, p.entry_id, far)
    never = [Position(10**6, e) for e in range(5)]
    errors: list[BaseException] = []
    calls = [0]
    started = threading.Event()
    stop = threading.Event()

    def reader() -> None:
        started.set()
        try:
            while not stop.is_set():
                for p in anchors:
                    assert index.contains(*p), f"anchor {p} not tracked"
                for p in never:
                    assert not index.contains(*p), f"{p} tracked but never added"
                assert len(index) >= len(anchors)
                assert set(index.tracked_entries(0, 0, 10)) == set(range(5))
                calls[0] += 1
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=reader, name="contains-reader", daemon=True)
    thread.start()
    assert started.wait(5)
    try:
        for ledger in range(1, 200):
            for entry in range(4):
                index.add(ledger, entry, clock() + 50 + 10 * entry)
            clock.advance(20)
            for p in index.poll(7):
                assert not index.contains(*p)
            if calls[0] == 0:
                threading.Event().wait(0.001)  # tiny bounded yield so the reader gets going
    finally:
        stop.set()
        thread.join(10)
    assert not thread.is_alive()
    assert not errors, errors[0]
    assert calls[0] > 0
    index.flush()
    index._check()
    assert index.stats()["ops"]["create"]["succeeded"] > 0  # seals ran in the background
    assert all(index.contains(*p) for p in anchors)
    index.close()


# -- #24603: sealing is not done in-line ----------------------------------------------------------


def test_24603_seal_encodes_off_the_caller_thread(
    storage: MemoryStorage, clock: ManualClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Pulsar encoded snapshots in addMessage (1.5 s stalls); ours encodes on the executor."""
    built: list[str] = []
    real_build = build_snapshot  # the function delay_index_module imported

    def spy(*args: Any, **kwargs: Any) -> Any:
        built.append(threading.current_thread().name)
        return real_build(*args, **kwargs)

    monkeypatch.setattr(delay_index_module, "build_snapshot", spy)
    executor = HeldExecutor()
    index = open_index(storage, clock, executor=executor)
    manifest_before = storage.read_manifest(NAME)
    schedule = seal_ledgers(index, [1], T0 + 1000)  # the last add seals [1, 1]
    assert built == []
    assert executor.submitted == 1 and len(executor.jobs) == 1
    [bucket] = index.buckets()
    assert (bucket.start_ledger, bucket.end_ledger, bucket.state) == (1, 1, "creating")
    assert object_ids(storage) == set()
    assert storage.read_manifest(NAME) == manifest_before
    assert index.stats()["unpersisted"] == len(schedule)
    clock.set(T0 + 1040)
    assert index.poll(100) == [Position(1, e) for e in range(5)]
    assert built == []
    executor.run_all()
    assert len(built) == 1
    assert index.buckets() == []  # created, found exhausted, retired
    assert object_ids(storage) == set()
    assert_no_orphans(storage)
    assert len(index) == 1
    index.close()


# -- #25371: non-monotonic ledgers ----------------------------------------------------------------


def test_25371_non_monotonic_ledgers_go_to_the_direct_heap(
    storage: MemoryStorage, clock: ManualClock
) -> None:
    """Pulsar threw on non-monotonic ledgers; ours routes them to the direct heap, in order."""
    index = open_index(storage, clock)
    schedule: Schedule = {}

    def add(ledger: int, entry: int, at: int) -> None:
        assert index.add(ledger, entry, at) is True
        schedule[Position(ledger, entry)] = at

    for e in range(3):
        add(5, e, T0 + 1000 + 100 * e)  # mutable [5, 5]
    add(3, 0, T0 + 1050)  # below the mutable end
    add(6, 0, T0 + 1500)  # seals [5, 5]
    add(5, 7, T0 + 1150)  # inside the sealed range
    add(4, 1, T0 + 1250)  # below the mutable end again
    index.flush()
    index._check()
    assert ranges(index) == [(5, 5)]
    stats = index.stats()
    assert stats["direct_adds"] == 3
    assert index.add(5, 7, T0 + 1150) is True  # a direct index is deduplicated too
    assert len(index) == len(schedule) == 7
    order: list[Position] = []
    clock.set(T0 + 2000)
    while batch := index.poll(1):
        order.extend(batch)
    assert order == sorted(schedule, key=lambda p: (schedule[p], p))
    assert len(index) == 0
    index.close()


# -- #25984 / #26240 / #26260: mark-delete trims --------------------------------------------------


def test_25984_26240_mark_delete_trims_only_buckets_wholly_below_the_mark(
    storage: MemoryStorage, clock: ManualClock
) -> None:
    """Pulsar's trim deleted a bucket straddling the mark ledger; ours trims only those below it."""
    index = open_index(storage, clock)
    schedule: Schedule = {}
    for ledger, entry in [(1, 0), (1, 1), (1, 2), (2, 0), (2, 1), (3, 0), (3, 1), (4, 0)]:
        schedule[Position(ledger, entry)] = T0 + 1000 * ledger + entry
        assert index.add(ledger, entry, schedule[Position(ledger, entry)])
    index.flush()
    assert ranges(index) == [(1, 1), (2, 3)]
    first, straddling = (b.snapshot_id for b in index.buckets())
    index.set_mark_delete(2, 0)  # [1, 1] is wholly below ledger 2; [2, 3] starts at it
    index.flush()
    assert ranges(index) == [(2, 3)]
    assert object_ids(storage) == {straddling}
    assert first not in storage.read_manifest(NAME).referenced_ids()
    index.set_mark_delete(3, 0)  # [2, 3] straddles ledger 3: kept
    index.flush()
    assert ranges(index) == [(2, 3)]
    assert object_ids(storage) == {straddling}
    acked = {Position(1, 0), Position(1, 1), Position(1, 2), Position(2, 0), Position(2, 1)}
    acked.add(Position(3, 0))
    assert not any(index.contains(*p) for p in acked)
    assert index.contains(3, 1) and len(index) == 2
    assert_exactly_once(drain(index, clock, schedule), {Position(3, 1), Position(4, 0)})
    index.close()


def test_26260_mark_delete_during_create_trims_once_the_create_is_done(
    storage: MemoryStorage, clock: ManualClock
) -> None:
    """Pulsar's trim raced snapshot creation; ours deletes a bucket below the mark once written."""
    executor = HeldExecutor()
    index = open_index(storage, clock, executor=executor)
    seal_ledgers(index, [1], T0 + 1000)
    assert index.add(2, 5, T0 + 100_000) is True
    assert [b.state for b in index.buckets()] == ["creating"]
    index.set_mark_delete(2, 0)
    assert ranges(index) == [(1, 1)]  # not deleted while its create is in flight
    assert len(index) == 1 and index.contains(2, 5) and not index.contains(1, 0)
    executor.run_all()
    assert index.buckets() == []
    assert object_ids(storage) == set()
    assert storage.read_manifest(NAME).referenced_ids() == frozenset()
    index.close()


def test_26260_mark_delete_during_a_merge_trims_once_the_merge_is_done(
    storage: MemoryStorage, clock: ManualClock
) -> None:
    """A mark-delete during a merge must not race it; afterwards nothing acked is kept."""
    executor = HeldExecutor()
    index = open_index(storage, clock, tiny(max_num_buckets=1), executor=executor)
    seal_ledgers(index, [1], T0 + 10_000)
    executor.run_all()
    seal_ledgers(index, [2], T0 + 20_000)
    assert index.add(3, 5, T0 + 500_000) is True
    executor.run_one()  # [2, 2] durable; the merge of [1, 1] and [2, 2] is queued
    assert [b.state for b in index.buckets()] == ["merging", "merging"]
    index.set_mark_delete(3, 0)
    assert len(index) == 1 and index.contains(3, 5)
    executor.run_all()
    assert index.buckets() == []
    assert object_ids(storage) == set()
    assert storage.read_manifest(NAME).referenced_ids() == frozenset()
    index._check()
    clock.set(T0 + 500_000)
    assert index.poll(100) == [Position(3, 5)]
    index.close()


# -- #26080: next_delivery_time with everything filtered ------------------------------------------


def test_26080_next_delivery_time_is_none_when_everything_is_filtered(
    storage: MemoryStorage, clock: ManualClock
) -> None:
    """Pulsar's nextDeliveryTime threw with all filtered; ours returns None and never raises."""
    index = open_index(storage, clock)
    for entry in range(3):
        assert index.add(9, entry, T0 + 1000 + entry)
    index.set_mark_delete(9, 2)  # heap nodes remain, none is tracked
    assert len(index) == 0
    assert index.next_delivery_time() is None
    assert not index.has_message_available()
    assert index.poll(10) == []
    assert index.add(10, 0, T0 + 5000) is True
    assert index.add(10, 0, -1) is False  # a due re-add untracks it
    assert index.next_delivery_time() is None
    index.close()


def test_26080_straddling_bucket_with_every_index_acknowledged_drains_quietly(
    storage: MemoryStorage, clock: ManualClock
) -> None:
    """#26080 with a live bucket: filtered segments load and skip; ends None, bucket retired."""
    index = open_index(storage, clock)
    for ledger, entry in [(1, 0), (1, 1), (2, 0), (2, 1), (2, 2)]:
        assert index.add(ledger, entry, T0 + 1000 + 10 * (2 * ledger + entry))
    assert index.add(3, 0, T0 + 9000)
    index.flush()
    assert ranges(index) == [(1, 2)]
    index.set_mark_delete(2, 2)  # every index of [1, 2] acknowledged; the bucket straddles 2
    assert ranges(index) == [(1, 2)]
    assert len(index) == 1
    next_time = index.next_delivery_time()
    assert next_time is not None and next_time <= T0 + 9000
    delivered = drain(index, clock, {Position(3, 0): T0 + 9000, Position(1, 0): T0 + 1020})
    assert_exactly_once(delivered, {Position(3, 0)})
    assert index.next_delivery_time() is None
    assert len(index) == 0
    index.flush()
    assert index.buckets() == []
    assert object_ids(storage) == set()
    index.close()


# -- #26230: expired re-add of a tracked but not loaded position ----------------------------------


def test_26230_expired_readd_of_tracked_unloaded_position_returns_false(
    storage: MemoryStorage, clock: ManualClock
) -> None:
    """Pulsar returned true for a due re-add of an unloaded position; ours returns False."""
    index = open_index(storage, clock)
    schedule = seal_ledgers(index, [1], T0 + 1000)  # (1,3) in segment 2, (1,4) in segment 3
    index.flush()
    assert index.buckets()[0].loaded_segment == 0  # nothing loaded: all of it is on disk
    assert index.contains(1, 4)
    assert index.add(1, 4, clock()) is False
    assert not index.contains(1, 4)
    assert index.add(1, 3, -1) is False
    assert not index.contains(1, 3)
    assert len(index) == len(schedule) - 2
    rest = {p: t for p, t in schedule.items() if p not in {Position(1, 3), Position(1, 4)}}
    assert_exactly_once(drain(index, clock, schedule), rest)
    index.close()


def test_26230_expired_readd_after_reopen_returns_false(
    storage: MemoryStorage, clock: ManualClock
) -> None:
    """Pulsar testRecoverThenExpireAddMessage: after a reopen a due re-add returns False too."""
    index = open_index(storage, clock)
    schedule = seal_ledgers(index, [1], T0 + 1000)
    index.close()
    index = open_index(storage, clock)
    durable = {p: t for p, t in schedule.items() if p.ledger_id == 1}
    assert len(index) == len(durable)
    assert index.contains(1, 4)
    assert index.add(1, 4, T0 - 5) is False
    assert not index.contains(1, 4)
    assert len(index) == len(durable) - 1
    rest = {p: t for p, t in durable.items() if p != Position(1, 4)}
    assert_exactly_once(drain(index, clock, durable), rest)
    index.close()


# -- #26241 / #26242 / #19873 / #20155: merge selection -------------------------------------------


@pytest.mark.parametrize("max_num_buckets", [1, 2, 3])
def test_26241_26242_merge_works_with_small_max_num_buckets(
    storage: MemoryStorage, clock: ManualClock, max_num_buckets: int
) -> None:
    """Pulsar's merge threw for maxNumBuckets 1-3; ours merges and loses nothing."""
    index = open_index(storage, clock, tiny(max_num_buckets=max_num_buckets))
    schedule = seal_ledgers(index, range(1, max_num_buckets + 2), T0 + 10_000)
    index.flush()
    index._check()
    merge_ops = index.stats()["ops"]["merge"]
    assert merge_ops["succeeded"] >= 1 and merge_ops["failed"] == 0
    assert 1 <= len(index.buckets()) <= max_num_buckets
    assert len(index) == len(schedule)
    assert sum(b.num_messages for b in index.buckets()) == len(schedule) - 1
    assert_no_orphans(storage)
    assert_exactly_once(drain(index, clock, schedule), schedule)
    index.close()


def test_20155_merge_disabled_when_max_num_buckets_is_not_positive(
    storage: MemoryStorage, clock: ManualClock
) -> None:
    """Pulsar made merging optional; with max_num_buckets <= 0 we never merge."""
    index = open_index(storage, clock, tiny(max_num_buckets=-1))
    seal_ledgers(index, range(1, 7), T0 + 10_000)
    index.flush()
    assert len(index.buckets()) == 6
    assert index.stats()["ops"]["merge"]["succeeded"] == 0
    index.close()


E = True  # eligible


@pytest.mark.parametrize(
    ("candidates", "merge_num", "expected"),
    [
        ([], 4, None),
        ([(E, 1, 10)], 4, None),
        ([(E, 1, 10), (E, 1, 20)], 4, (0, 2)),  # #26241: fewer buckets than MAX_MERGE_NUM
        ([(E, 1, 10), (E, 1, 20), (E, 1, 30)], 4, (0, 3)),
        ([(E, 9, 10), (E, 1, 20), (E, 1, 30), (E, 1, 40), (E, 1, 50)], 4, (1, 4)),
        ([(E, 1, 10), (False, 1, 20), (E, 1, 30), (E, 1, 40)], 4, (2, 2)),
        ([(E, 1, 10), (False, 1, 20), (E, 1, 30)], 4, None),
        ([(E, 1, 500), (E, 1, 400), (E, 1, 100)], 2, (1, 2)),  # tie: earliest next segment
        ([(E, 1, 100), (E, 1, 900), (E, 1, 100)], 2, (0, 2)),  # full tie: leftmost
        ([(E, 5, 10), (E, 5, 20), (E, 1, 900), (E, 1, 900)], 2, (2, 2)),  # fewest messages
        ([(E, 1, 10), (E, 1, 20)], 1, None),
    ],
)
def test_26242_select_merge_window(
    candidates: list[tuple[bool, int, int]], merge_num: int, expected: tuple[int, int] | None
) -> None:
    """Pulsar's selectMergedBuckets threw and was off by one; ours picks 4, 3, then 2 buckets."""
    assert select_merge_window(candidates, merge_num) == expected


# -- #26251: one dedup index, no double delivery --------------------------------------------------


def test_26251_len_equals_dedup_index_and_duplicates_never_double_deliver(
    storage: MemoryStorage, clock: ManualClock
) -> None:
    """Pulsar's count drifted and duplicates double-delivered; our len is the dedup index."""
    index = open_index(storage, clock)

    def check_len() -> None:
        cardinality = sum(len(index.tracked_entries(ledger, 0, MAX_ENTRY)) for ledger in range(9))
        assert len(index) == cardinality == index.stats()["tracked"]

    schedule = seal_ledgers(index, [1, 2], T0 + 1000)
    index.flush()
    check_len()
    for p, at in list(schedule.items()):  # duplicates with the same, a later, an earlier time
        for dup in (at, at + 500, at - 500):
            assert index.add(p.ledger_id, p.entry_id, dup) is True
    check_len()
    assert len(index) == len(schedule)
    assert index.add(1, 4, -1) is False  # (1,4) in bucket [1,1]'s unloaded segment 3
    check_len()
    assert index.add(1, 4, T0 + 5000) is True  # tracked again, later: one copy, new time
    schedule[Position(1, 4)] = T0 + 5000
    check_len()
    assert index.add(3, 9, T0 + 1015) is True  # the mutable bucket, then a duplicate
    assert index.add(3, 9, T0 + 1005) is True
    schedule[Position(3, 9)] = T0 + 1015
    check_len()
    delivered = drain(index, clock, schedule)
    assert_exactly_once(delivered, schedule)
    check_len()
    assert len(index) == 0
    index.close()


# -- #25996 / #26012: strict mode -----------------------------------------------------------------


def test_25996_26012_strict_mode_never_delivers_early_and_never_stalls(
    storage: MemoryStorage, clock: ManualClock
) -> None:
    """Pulsar's strict mode was early and stalled; ours is never early and keeps a timer armed."""
    timer = ManualTimer(clock)
    fired: list[int] = []
    index = open_index(
        storage, clock, tiny(strict=True), timer=timer, on_ready=lambda: fired.append(clock())
    )
    assert index.add(50, 0, T0 + 500) is True
    assert [h.deadline for h in timer.armed()] == [T0 + 500]
    assert index.add(50, 1, T0 + 200) is True  # earlier: re-armed, the old handle cancelled
    assert [h.deadline for h in timer.armed()] == [T0 + 200]
    schedule: Schedule = {Position(50, 0): T0 + 500, Position(50, 1): T0 + 200}
    for n, ledger in enumerate(range(51, 55)):  # sealed buckets with several segments
        schedule.update(add_ledger(index, ledger, T0 + 1000 + 7 * n, count=5, spacing=33))
    index.flush()
    assert len(index.buckets()) >= 3
    delivered: Counter[Position] = Counter()
    for _ in range(10_000):
        got = index.poll(1000)
        for p in got:
            assert schedule[p] <= clock(), f"{p} due {schedule[p]} delivered at {clock()}"
        delivered.update(got)
        if len(index) == 0:
            break
        if index.has_message_available():
            continue
        armed = timer.armed()
        assert armed, f"stalled at {clock()}: {len(index)} tracked, no timer armed"
        assert len(armed) == 1
        before = len(fired)
        clock.set(armed[0].deadline)
        assert timer.run_due() == 1
        assert len(fired) == before + 1
    assert_exactly_once(delivered, schedule)
    assert timer.armed() == []
    index.close()


# -- recovery: missing, corrupt and overlapping snapshots -----------------------------------------


def test_22802_missing_snapshot_quarantines_the_bucket_loudly(
    storage: MemoryStorage, clock: ManualClock
) -> None:
    """Pulsar recovery could fail on a missing snapshot; ours quarantines that bucket only:
    reported with its range (the replay re-adds it), the other bucket delivers."""
    index = open_index(storage, clock)
    schedule = seal_ledgers(index, [1, 2], T0 + 10_000)
    missing, kept = (b.snapshot_id for b in index.buckets())
    assert missing is not None and kept is not None
    index.close()
    storage.delete(missing)
    index = open_index(storage, clock)
    assert ranges(index) == [(1, 1), (2, 2)]
    [info] = index.quarantined()
    assert (info.snapshot_id, info.start_ledger, info.end_ledger) == (missing, 1, 1)
    assert (info.num_messages, info.positions_known) == (5, False)
    assert "missing" in info.reason
    assert [b.state for b in index.buckets()] == ["quarantined", "durable"]
    assert any(missing in w for w in index.stats()["warnings"])
    assert index.stats()["health"] == "degraded"
    assert not any(index.contains(1, e) for e in range(5))  # lost with the object
    assert all(index.contains(2, e) for e in range(5))
    index.flush()
    manifest = storage.read_manifest(NAME)
    assert missing not in manifest.live_ids()
    record = manifest.quarantine(missing)
    assert record is not None and record.active
    assert set(manifest.live_ids()) == {kept}
    expected = {p: t for p, t in schedule.items() if p.ledger_id == 2}
    assert_exactly_once(drain(index, clock, expected), expected)
    # The dispatcher's replay re-adds the lost range; it is delivered on time.
    replay = {p: t for p, t in schedule.items() if p.ledger_id == 1}
    clock.set(T0)
    for p, t in replay.items():
        assert index.add(p.ledger_id, p.entry_id, t)
    assert_exactly_once(drain(index, clock, replay), replay)
    assert index.release_quarantined() == 0
    assert index.quarantined() == []
    index.close()


@pytest.mark.parametrize("damage", ["magic", "middle", "last-byte"])
def test_22735_19394_damaged_snapshot_is_quarantined_and_the_rest_recovers(
    storage: MemoryStorage, clock: ManualClock, damage: str
) -> None:
    """Pulsar's failed recovery leaked or failed the whole topic; ours quarantines the damaged
    bucket, keeps its object untouched, and recovers and delivers every other bucket. Damage
    in the header or the metadata is found at open; in a segment (the last byte), when that
    segment is read (an open reads none): its bucket's messages wait meanwhile."""
    config = tiny(max_indexes_per_segment=-1, max_time_step_per_segment_ms=10_000)
    index = open_index(storage, clock, config)
    schedule = seal_ledgers(index, [1, 2], T0 + 10_000)
    bad, good = (b.snapshot_id for b in index.buckets())
    assert bad is not None and good is not None
    assert [b.num_segments for b in index.buckets()] == [1, 1]
    index.close()
    original = storage.raw_object(bad)
    at = {"magic": 0, "middle": len(original) // 2, "last-byte": len(original) - 1}[damage]
    flipped = bytearray(original)
    flipped[at] ^= 0x40
    storage.put_raw_object(bad, bytes(flipped))
    index = open_index(storage, clock, config)
    if damage == "last-byte":  # a segment's: found when the segment is read
        assert index.quarantined() == [] and len(index) == 10
    else:
        [info] = index.quarantined()
        assert info.snapshot_id == bad and bad in index.stats()["warnings"][-1]
    assert storage.raw_object(bad) == bytes(flipped)  # kept, untouched
    expected = {p: t for p, t in schedule.items() if p.ledger_id == 2}
    assert_exactly_once(drain(index, clock, expected), expected)
    [info] = index.quarantined()
    assert info.snapshot_id == bad and any(bad in w for w in index.stats()["warnings"])
    index.close()
    assert storage.raw_object(bad) == bytes(flipped)


def test_22735_unreadable_metadata_at_open_raises_naming_it_and_changes_nothing(
    storage: MemoryStorage, clock: ManualClock
) -> None:
    """A transient read failure at open is not damage: RecoveryError naming it, no change."""
    config = tiny(max_indexes_per_segment=-1, max_time_step_per_segment_ms=10_000)
    index = open_index(storage, clock, config)
    seal_ledgers(index, [1, 2], T0 + 10_000)
    bad = index.buckets()[0].snapshot_id
    assert bad is not None
    index.close()
    storage.inject_failure("get_metadata", times=4)
    objects_before = {o.id: storage.raw_object(o.id) for o in storage.list_objects()}
    manifest_before = storage.raw_manifest(NAME)
    with pytest.raises(RecoveryError) as info:
        open_index(storage, clock, config)
    assert bad in str(info.value)
    assert {o.id: storage.raw_object(o.id) for o in storage.list_objects()} == objects_before
    assert storage.raw_manifest(NAME) == manifest_before
    index = open_index(storage, clock, config)  # the storage answers again: both recover
    assert ranges(index) == [(1, 1), (2, 2)]
    assert len(index) == 10
    index.close()


def test_an_open_reads_no_segment_and_an_unreadable_first_one_holds_back_its_bucket_only(
    storage: MemoryStorage, clock: ManualClock
) -> None:
    """An open reads no segment: each bucket's first live segment is read when due. A
    transient failure reading it then is not damage: that bucket's segment is read again with
    the loads' backoff, reported meanwhile, and every other bucket delivers."""
    config = tiny(max_indexes_per_segment=-1, max_time_step_per_segment_ms=10_000)
    index = open_index(storage, clock, config)
    schedule = seal_ledgers(index, [1, 2], T0 + 10_000)
    bad = index.buckets()[0].snapshot_id
    assert bad is not None
    index.close()
    reads = storage.stats()["get_segments"]["calls"]
    index = open_index(storage, clock, config)
    assert ranges(index) == [(1, 1), (2, 2)] and len(index) == 10
    assert storage.stats()["get_segments"]["calls"] == reads  # an open reads no segment
    assert [b.loaded_segment for b in index.buckets()] == [0, 0]  # placeholders: read when due
    storage.inject_failure("get_segments", times=4)  # every attempt of the first read
    clock.set(max(schedule.values()))
    first = index.poll(100)
    stats = index.stats()
    assert stats["retrying_loads"] == {bad: 1} and bad in stats["warnings"][-1]
    assert index.quarantined() == []  # not damage
    assert {p.ledger_id for p in first} == {2}  # the other bucket delivers meanwhile
    durable = {p: t for p, t in schedule.items() if p.ledger_id == 1}
    assert_exactly_once(drain(index, clock, durable), durable)  # the storage answers again
    assert index.stats()["retrying_loads"] == {}
    assert not any(bad in w for w in index.stats()["problems"])
    index.close()


def _record(start: int, end: int, tag: str) -> BucketRecord:
    return BucketRecord(start, end, f"s-{tag}", num_messages=1, num_segments=1, snapshot_bytes=1)


def test_26240_resolve_overlaps_enclosing_bucket_wins_in_any_order() -> None:
    """A crashed Pulsar merge left merged and source buckets; the enclosing one always wins."""
    merged = _record(1, 4, "merged")
    sources = [_record(1, 2, "a"), _record(3, 4, "b")]
    other = _record(6, 9, "other")
    for order in itertools.permutations([merged, *sources, other]):
        kept, dropped = resolve_overlaps(list(order))
        assert kept == [merged, other]
        assert sorted(dropped, key=lambda r: r.snapshot_id) == sources


def test_26240_resolve_overlaps_truncated_keys_bigger_bucket_seen_first() -> None:
    """Pulsar compared clipped keys and split a bigger bucket seen first; we compare full ranges."""
    big, small = _record(1, 10, "big"), _record(5, 6, "small")
    kept, dropped = resolve_overlaps([big, small])
    assert kept == [big] and dropped == [small]
    assert (kept[0].start_ledger, kept[0].end_ledger) == (1, 10)
    partial = _record(8, 12, "partial")  # overlaps but neither encloses: the bigger stays whole
    kept, dropped = resolve_overlaps([big, partial, small])
    assert kept == [big]
    assert set(dropped) == {partial, small}


def test_26240_resolve_overlaps_keeps_disjoint_ranges_and_never_overlaps() -> None:
    """Pulsar could keep overlapping buckets; our kept ranges are disjoint and nothing is lost."""
    assert resolve_overlaps([_record(1, 1, "a"), _record(2, 3, "b")]) == (
        [_record(1, 1, "a"), _record(2, 3, "b")],
        [],
    )
    spans = [(1, 3), (2, 5), (4, 4), (1, 9), (6, 7), (8, 8), (10, 12), (11, 11), (3, 3)]
    for size in (2, 3, 4):
        for combo in itertools.combinations(range(len(spans)), size):
            records = [_record(*spans[i], str(i)) for i in combo]
            kept, dropped = resolve_overlaps(records)
            assert sorted(kept + dropped, key=lambda r: r.snapshot_id) == sorted(
                records, key=lambda r: r.snapshot_id
            )
            for a, b in itertools.pairwise(kept):
                assert a.end_ledger < b.start_ledger, (kept, records)
            for d in dropped:  # a dropped bucket is enclosed by, or clashes with, a kept one
                assert any(
                    k.start_ledger <= d.end_ledger and d.start_ledger <= k.end_ledger for k in kept
                ), (d, kept)


# -- #25990 / #26117: stats and bitmaps -----------------------------------------------------------


def test_25990_snapshot_bytes_track_the_live_objects(
    storage: MemoryStorage, clock: ManualClock
) -> None:
    """Pulsar's stats kept lengths of removed buckets; our snapshot_bytes match live objects."""
    index = open_index(storage, clock, tiny(max_num_buckets=2))

    def check() -> None:
        index.flush()
        sizes = {o.id: o.size for o in storage.list_objects()}
        live = storage.read_manifest(NAME).live_ids()
        assert index.stats()["snapshot_bytes"] == sum(b.snapshot_bytes for b in index.buckets())
        assert index.stats()["snapshot_bytes"] == sum(sizes[i] for i in live)

    schedule = seal_ledgers(index, range(1, 6), T0 + 1000)
    check()
    clock.set(T0 + 2020)
    index.poll(1000)
    check()
    index.set_mark_delete(3, 0)
    check()
    drain(index, clock, schedule)
    check()
    assert index.stats()["snapshot_bytes"] == 0
    index.close()


def test_26117_tracked_entries_is_a_copy_and_entry_ids_are_32_bit(
    storage: MemoryStorage, clock: ManualClock
) -> None:
    """Pulsar shared live bitmaps and took bad ids; tracked_entries is a copy, ids are 32-bit."""
    index = open_index(storage, clock)
    assert index.add(1, MAX_ENTRY, T0 + 1000)
    assert index.add(1, 5, T0 + 1000)
    bitmap = index.tracked_entries(1, 0, MAX_ENTRY)
    assert set(bitmap) == {5, MAX_ENTRY}
    bitmap.clear()
    assert index.contains(1, 5) and index.contains(1, MAX_ENTRY)
    assert set(index.tracked_entries(1, 6, MAX_ENTRY)) == {MAX_ENTRY}
    with pytest.raises(ValueError):
        index.add(1, MAX_ENTRY + 1, T0 + 1000)
    with pytest.raises(ValueError):
        index.add(1, -1, T0 + 1000)
    assert len(index) == 2
    index.close()


# -- #20086: one load per segment -----------------------------------------------------------------


def test_20086_each_segment_is_loaded_exactly_once(
    storage: MemoryStorage, clock: ManualClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Pulsar's stale sentinels caused repeated loads; we read each unloaded segment once."""
    reads: list[tuple[str, int, int]] = []
    real_read = storage.get_segment_arrays

    def spy(snapshot_id: str, first: int, last: int) -> Any:
        reads.append((snapshot_id, first, last))
        return real_read(snapshot_id, first, last)

    index = open_index(storage, clock)
    schedule = seal_ledgers(index, [1, 2], T0 + 1000)
    index.flush()
    buckets = index.buckets()
    # Durable buckets keep nothing in memory: every segment is read when it comes due.
    assert [(b.num_segments, b.loaded_segment) for b in buckets] == [(3, 0), (3, 0)]
    monkeypatch.setattr(storage, "get_segment_arrays", spy)
    delivered: Counter[Position] = Counter()
    for at in sorted(set(schedule.values())):
        clock.set(at)
        while got := index.poll(1):
            delivered.update(got)
    assert_exactly_once(delivered, schedule)
    for b in buckets:
        segments = [s for sid, first, last in reads if sid == b.snapshot_id
                    for s in range(first, last + 1)]  # fmt: skip
        assert sorted(segments) == [1, 2, 3], (b.snapshot_id, reads)
    loads = index.stats()["ops"]["load"]
    assert loads["failed"] == 0 and 2 <= loads["succeeded"] <= 6
    index.close()
