"""Lazy restores after an open (issue 18 item 3; ``tracker/_lazy_restore.py``).

A reopened index defers each recovered bucket's positions to the first call that needs
membership. These tests check that no call can tell: for every public call made first, the
answer and everything delivered afterwards equal those of an index whose positions were all
restored at open; ``len`` is exact before; close and clear restore nothing; what recovery
applies at open (the mark, stored cancels) still sees the positions it needs; and bitmaps that
fail only when restored quarantine their bucket then.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import Executor
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import delayindex.tracker._recovery as recovery_module
from delayindex import DelayIndex, ManualClock, MemoryStorage, Position, TrackerConfig
from delayindex.errors import SnapshotCorruptError
from delayindex.executors import InlineExecutor, ManualExecutor
from delayindex.snapshot import codec
from delayindex.snapshot.blocks import DeferredBlock, LazyPositions
from delayindex.snapshot.format import SnapshotMetadata
from delayindex.tracker._lazy_restore import LazyCore

T0 = 1_000_000
NAME = "lazy"
TICK = 10
Schedule = dict[Position, int]


def _config() -> TrackerConfig:
    return TrackerConfig(
        min_index_count_per_bucket=4,
        max_indexes_per_segment=2,
        max_time_step_per_segment_ms=100,
        max_num_buckets=0,
        tick_ms=TICK,
    )


def _open(
    storage: MemoryStorage, clock: ManualClock, executor: Executor | None = None
) -> DelayIndex:
    """Open with ``executor``, by default an InlineExecutor: its jobs (the background restore
    among them) run on the caller's thread after each call that submits them."""
    executor = InlineExecutor() if executor is None else executor
    return DelayIndex.open(storage, NAME, _config(), clock=clock, executor=executor)


def _built() -> tuple[MemoryStorage, Schedule]:
    """A closed store: four sealed buckets (ledgers 1-4, six messages each, interleaved in
    time) and the mutable bucket's one message (lost at close, as designed)."""
    storage, clock = MemoryStorage(), ManualClock(T0)
    index = _open(storage, clock)
    schedule: Schedule = {}
    for ledger in range(1, 5):
        for entry in range(6):
            at = T0 + 1_000 + ledger * 7 + entry * 40
            assert index.add(ledger, entry, at)
            schedule[Position(ledger, entry)] = at
    assert index.add(5, 0, T0 + 50_000)
    index.close()
    return storage, schedule


def _copy(storage: MemoryStorage) -> MemoryStorage:
    """An independent copy of a closed store: its objects and manifest."""
    copy = MemoryStorage()
    for object_id in (o.id for o in storage.list_objects()):
        copy.put_raw_object(object_id, storage.raw_object(object_id))
    manifest = storage.raw_manifest(NAME)
    assert manifest is not None
    copy.put_raw_manifest(NAME, manifest)
    return copy


def _drain(index: DelayIndex, clock: ManualClock, schedule: Schedule) -> Counter[Position]:
    delivered: Counter[Position] = Counter()
    for at in [*sorted(set(schedule.values())), T0 + 10_000_000]:
        clock.set(max(at, clock()))
        while got := index.poll(1000):
            for p in got:
                assert schedule[p] <= clock() + TICK, f"{p} delivered early"
            delivered.update(got)
            index._check()
    return delivered


@pytest.fixture
def restores(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """The snapshot ids whose positions are restored, in order."""
    seen: list[str] = []
    real = recovery_module._restore_live

    def spy(core: Any, metadata: SnapshotMetadata, first: int, name: str) -> None:
        seen.append(name)
        real(core, metadata, first, name)

    monkeypatch.setattr(recovery_module, "_restore_live", spy)
    yield seen


def test_an_open_restores_nothing_and_len_is_exact(restores: list[str]) -> None:
    storage, _ = _built()
    clock = ManualClock(T0)
    index = _open(storage, clock)
    assert isinstance(index._core, LazyCore) and restores == []
    assert len(index) == 24  # the four sealed buckets, not the lost mutable message
    index._check()  # the lazy buckets' invariants, no restore
    assert restores == [] and len(index) == 24
    assert index.contains(3, 5)  # restores the bucket of ledger 3 only
    assert len(restores) == 1 and isinstance(index._core, LazyCore)
    assert len(index) == 24 and not index.contains(5, 0)  # above every lazy bucket
    index._check()
    assert not index.contains(1, 9) and len(restores) == 2
    assert index.cancel(2, 0) and len(restores) == 3 and len(index) == 23
    index._check()
    assert index.add(4, 0, T0 + 9_000) is True  # a duplicate: the bucket's restored first
    assert len(restores) == 4 and not isinstance(index._core, LazyCore) and len(index) == 23
    index._check()
    index.close()


def _first_calls() -> dict[str, Callable[[DelayIndex, ManualClock], object]]:
    def poll_due(index: DelayIndex, clock: ManualClock) -> object:
        clock.set(T0 + 1_200)
        return sorted(index.poll(5))

    return {
        "contains tracked": lambda ix, _: ix.contains(2, 3),
        "contains untracked": lambda ix, _: ix.contains(2, 9),
        "add of a tracked position": lambda ix, _: ix.add(2, 3, T0 + 5_000),
        "add of a new position": lambda ix, _: ix.add(2, 9, T0 + 5_000),
        "add_many with a tracked one": lambda ix, _: ix.add_many(
            [1, 6], [0, 0], [T0 + 5_000, T0 + 6_000]
        ).tolist(),
        "cancel": lambda ix, _: ix.cancel(3, 2),
        "tracked_entries": lambda ix, _: sorted(ix.tracked_entries(4, 0, 10)),
        "poll of due ones": poll_due,
        "has_message_available": lambda ix, _: ix.has_message_available(),
        "next_delivery_time": lambda ix, _: ix.next_delivery_time(),
        "set_mark_delete": lambda ix, _: ix.set_mark_delete(2, 2),
        "stats' tracked count": lambda ix, _: ix.stats()["tracked"],
    }


@pytest.mark.parametrize("name", sorted(_first_calls()))
def test_any_first_call_answers_as_after_a_full_restore(name: str) -> None:
    call = _first_calls()[name]
    storage, schedule = _built()
    results = []
    for restore_first in (True, False):
        clock = ManualClock(T0)
        index = _open(_copy(storage), clock)
        assert isinstance(index._core, LazyCore)
        if restore_first:
            index._finish_lazy()
        answer = call(index, clock)
        index._check()
        after = {**schedule, Position(2, 9): T0 + 5_000, Position(6, 0): T0 + 6_000}
        delivered = _drain(index, clock, after)
        results.append((answer, len(index), sorted(delivered.items())))
        index.close()
    assert results[0] == results[1]
    assert all(n == 1 for _, _, got in results for _, n in got)


def test_stats_restore_nothing_and_count_the_lazy_buckets(restores: list[str]) -> None:
    """A ``stats()`` (a metrics scrape) right after an open restores nothing (it would hold
    the lock for the whole restore), yet ``tracked`` is exact; ``lazy_buckets`` counts the
    buckets still to restore."""
    storage, schedule = _built()
    index = _open(storage, ManualClock(T0), ManualExecutor())
    stats = index.stats()
    assert restores == [] and isinstance(index._core, LazyCore)
    assert (stats["tracked"], stats["lazy_buckets"], stats["ledgers"]) == (24, 4, 0)
    assert index.contains(2, 3)
    stats = index.stats()
    assert (stats["tracked"], stats["lazy_buckets"], stats["ledgers"]) == (24, 3, 1)
    index._finish_lazy()
    stats = index.stats()
    assert (stats["tracked"], stats["lazy_buckets"], stats["ledgers"]) == (24, 0, 4)
    assert len(restores) == 4 and len(index) == len(schedule)
    index.close()


def test_close_and_clear_restore_nothing_and_lose_nothing(restores: list[str]) -> None:
    storage, schedule = _built()
    _open(storage, ManualClock(T0)).close()
    assert restores == []
    clock = ManualClock(T0)
    index = _open(storage, clock)
    sealed = {p: t for p, t in schedule.items() if p.ledger_id <= 4}
    delivered = _drain(index, clock, sealed)
    assert set(delivered) == set(sealed) and all(n == 1 for n in delivered.values())
    index.close()
    storage2, _ = _built()
    restores.clear()
    index = _open(storage2, ManualClock(T0))
    index.clear()
    assert restores == [] and len(index) == 0 and not index.contains(1, 0)
    index.close()


def test_buckets_under_the_mark_or_with_stored_cancels_are_restored_at_open(
    restores: list[str],
) -> None:
    storage, schedule = _built()
    clock = ManualClock(T0)
    index = _open(storage, clock)
    ids = {b.start_ledger: str(b.snapshot_id) for b in index.buckets()}
    index.set_mark_delete(2, 1)  # bucket 1 wholly, bucket 2 in part
    assert index.cancel(3, 4)  # a stored override in bucket 3
    index.close()
    restores.clear()
    index = _open(storage, clock)
    assert sorted(restores) == sorted([ids[2], ids[3]])  # 1 is trimmed; 4 waits
    assert isinstance(index._core, LazyCore)
    assert len(index) == 24 - 6 - 2 - 1
    assert not index.contains(2, 1) and index.contains(2, 2) and not index.contains(3, 4)
    expected = {p for p in schedule if p.ledger_id in (2, 3, 4) and p not in (Position(3, 4),)} - {
        Position(2, 0),
        Position(2, 1),
    }
    delivered = _drain(index, clock, schedule)
    assert set(delivered) == expected and all(n == 1 for n in delivered.values())
    index.close()


def test_bitmaps_damaged_when_restored_quarantine_their_bucket_then(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    storage, schedule = _built()
    clock = ManualClock(T0)
    index = _open(storage, clock)
    bad = index.buckets()[2]
    assert bad.snapshot_id is not None
    real = recovery_module._restore_live

    def failing(core: Any, metadata: SnapshotMetadata, first: int, name: str) -> None:
        if name == bad.snapshot_id:
            raise SnapshotCorruptError(f"{name}: bad bitmaps: injected")
        real(core, metadata, first, name)

    monkeypatch.setattr(recovery_module, "_restore_live", failing)
    assert len(index) == 24 and index.quarantined() == []
    assert index.contains(1, 0)  # restores bucket 1 only: bucket 3's damage waits
    assert index.quarantined() == [] and len(index) == 24
    assert not index.contains(3, 0)  # restores bucket 3: its bitmaps fail
    [info] = index.quarantined()
    assert (info.snapshot_id, info.positions_known, info.num_messages) == (
        bad.snapshot_id,
        False,
        6,
    )
    assert "injected" in info.reason and len(index) == 18
    assert any(bad.snapshot_id in w for w in index.stats()["problems"])
    expected = {p for p in schedule if p.ledger_id in (1, 2, 4)}
    delivered = _drain(index, clock, schedule)
    assert set(delivered) == expected and all(n == 1 for n in delivered.values())
    index.close()


def test_len_stays_exact_as_adds_arrive_before_the_restore() -> None:
    storage, _ = _built()
    executor = ManualExecutor()  # the background restore waits for run_pending
    index = _open(storage, ManualClock(T0), executor)
    assert len(index) == 24
    assert index.add(9, 0, T0 + 90_000)  # above every lazy bucket: nothing restored
    assert len(index) == 25 and len(index._lazy) == 4
    tracked = index.add_many(
        np.array([1, 9], dtype=np.int64),
        np.array([0, 1], dtype=np.int64),
        np.array([T0 + 90_000, T0 + 90_000], dtype=np.int64),
    )
    assert tracked.tolist() == [True, True] and len(index) == 26  # (1, 0): already tracked
    # Bucket 1 was restored for the batch (it touches ledger 1), not those between 1 and 9.
    assert [start for start, _, _ in index._lazy_spans] == [2, 3, 4]
    index._check()
    executor.run_pending()  # the background restore: on a synchronous executor, all at once
    assert index._lazy == {} and not isinstance(index._core, LazyCore) and len(index) == 26
    index._check()
    index.close()


def test_len_from_another_thread_during_a_restore_is_exact(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``len`` takes no tracker lock: while a restore is under way in another thread (one
    bucket's positions in the core, not yet out of the lazy count), it waits for it rather
    than count those positions twice."""
    storage, _ = _built()
    index = _open(storage, ManualClock(T0))
    real = recovery_module._restore_live
    paused, resume = threading.Event(), threading.Event()

    def pausing(core: Any, metadata: SnapshotMetadata, first: int, name: str) -> None:
        real(core, metadata, first, name)
        if not paused.is_set():  # after the first bucket's positions are in the core
            paused.set()
            assert resume.wait(10)

    monkeypatch.setattr(recovery_module, "_restore_live", pausing)
    restoring = threading.Thread(target=index.contains, args=(1, 0))
    restoring.start()
    assert paused.wait(10)
    counted: list[int] = []
    counting = threading.Thread(target=lambda: counted.append(len(index)))
    counting.start()
    counting.join(0.2)
    resume.set()
    restoring.join(10)
    counting.join(10)
    assert counted == [24]
    index.close()


def test_an_open_decodes_no_positions(monkeypatch: pytest.MonkeyPatch) -> None:
    """An open reads each bucket's columns only: no ledger column, no entry and no segment
    is decoded until a call needs them (format 6 keeps them in a part of their own, decoded
    whole: no format 5 head or deferred block is involved)."""
    storage, schedule = _built()
    columns: list[int] = []
    heads: list[int] = []
    wholes: list[int] = []
    real_bitmaps, real_head, real_get = (
        LazyPositions._bitmaps,
        DeferredBlock.head,
        DeferredBlock.get,
    )

    def spy_bitmaps(self: LazyPositions) -> Any:
        if self._block is None:
            columns.append(self.packed_bytes)
        return real_bitmaps(self)

    def spy_head(self: DeferredBlock, n: int) -> Any:
        if not self.loaded:
            heads.append(n)
        return real_head(self, n)

    def spy_get(self: DeferredBlock) -> Any:
        if not self.loaded:
            wholes.append(self.count)
        return real_get(self)

    monkeypatch.setattr(LazyPositions, "_bitmaps", spy_bitmaps)
    monkeypatch.setattr(DeferredBlock, "head", spy_head)
    monkeypatch.setattr(DeferredBlock, "get", spy_get)
    reads = storage.stats()["get_segments"]["calls"]
    clock = ManualClock(T0)
    index = _open(storage, clock)
    assert len(index) == len(schedule)  # exact, from the columns
    assert (columns, heads, wholes) == ([], [], [])
    assert storage.stats()["get_segments"]["calls"] == reads  # no segment read either
    assert index.contains(3, 5)
    assert len(columns) == 1  # bucket 3's restore decodes them, once
    sealed = {p: at for p, at in schedule.items() if p.ledger_id < 5}
    assert _drain(index, clock, sealed) == Counter(list(sealed))
    assert len(columns) == 4 and heads == wholes == []
    index.close()


@pytest.mark.parametrize("version", [1, 2, 4, 5])
@pytest.mark.parametrize("first_call", ["contains", "poll"])
def test_a_store_of_an_older_format_opens_lazily_and_delivers_exactly_once(
    version: int, first_call: str
) -> None:
    """Objects written before format 5 (a store from an earlier release) recover the same way:
    no segment read at open, positions restored by the first call that needs them, each
    placeholder read when due, every message delivered once."""
    storage, schedule = _built()
    for info in storage.list_objects():
        metadata, segments = codec.decode_snapshot(storage.raw_object(info.id), info.id)
        old = SnapshotMetadata(
            metadata.start_ledger, metadata.end_ledger, metadata.mins, metadata.maxs,
            metadata.counts, metadata.ledger_offsets, metadata.ledgers, metadata.block, version,
            index_name=metadata.index_name, generation=metadata.generation,
        )  # fmt: skip
        data = codec.encode_snapshot(old, segments)
        assert codec.decode_snapshot(data, info.id)[0].format_version == version
        storage.put_raw_object(info.id, data)
    reads = storage.stats()["get_segments"]["calls"]
    clock = ManualClock(T0)
    index = _open(storage, clock)
    assert storage.stats()["get_segments"]["calls"] == reads
    assert isinstance(index._core, LazyCore) and len(index) == len(schedule)
    if first_call == "contains":
        assert index.contains(2, 3) and not index.contains(2, 6)
    assert _drain(index, clock, schedule) == Counter(list(schedule))
    assert len(index) == 0 and index.quarantined() == []
    index.close()


_ledgers = st.integers(0, 7)  # 1-4 are the lazy buckets' ledgers
_entries = st.integers(0, 8)
_offsets = st.integers(0, 3_000)
_calls = st.one_of(
    st.tuples(st.just("contains"), _ledgers, _entries),
    st.tuples(st.just("add"), _ledgers, _entries, _offsets),
    st.tuples(st.just("add_many"), st.lists(st.tuples(_ledgers, _entries, _offsets), max_size=4)),
    st.tuples(st.just("cancel"), _ledgers, _entries),
    st.tuples(st.just("tracked_entries"), _ledgers),
    st.tuples(st.just("poll"), st.integers(0, 8)),
    st.tuples(st.just("advance"), st.integers(0, 600)),
    st.tuples(st.just("set_mark_delete"), _ledgers, _entries),
    st.tuples(st.just("next_delivery_time")),
    st.tuples(st.just("stats")),
    st.tuples(st.just("run_pending")),
)
# The stats a lazy index must answer as a restored one (``ledgers`` counts restored ledgers,
# ``lazy_buckets`` the others, and the memory held differs).
_STATS_COMPARED = (
    "tracked", "buckets", "quarantined_buckets", "cancel_overrides", "reschedule_overrides",
    "unpersisted", "health",
)  # fmt: skip


def _call(index: DelayIndex, clock: ManualClock, call: tuple[Any, ...]) -> object:
    """Make ``call`` on ``index``; its answer, or the type of the error it raised."""
    name, *args = call
    try:
        if name == "run_pending":  # the jobs: persists, merges, the background restore
            executor = index._executor
            assert isinstance(executor, ManualExecutor)
            executor.run_pending()
            return None
        if name == "advance":
            clock.advance(args[0])
            return None
        if name == "add":
            return index.add(args[0], args[1], clock() + args[2])
        if name == "add_many":
            rows = args[0]
            return index.add_many(
                [r[0] for r in rows], [r[1] for r in rows], [clock() + r[2] for r in rows]
            ).tolist()
        if name == "tracked_entries":
            return list(index.tracked_entries(args[0], 0, 100))
        if name == "poll":
            return sorted(index.poll(args[0]))
        if name == "stats":
            stats = index.stats()
            return {key: stats[key] for key in _STATS_COMPARED}
        return getattr(index, name)(*args)
    except Exception as exc:  # the same error from both, or the test fails
        return type(exc)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(calls=st.lists(_calls, max_size=25))
def test_a_lazy_index_answers_every_call_as_a_restored_one(calls: list[tuple[Any, ...]]) -> None:
    """Differential: one copy of a store opens lazily, the other restores everything at open;
    every call answers the same in both, ``len`` agrees after each, the lazy one's invariants
    hold throughout, and both deliver the same messages once when drained."""
    storage, _ = _built()
    pair = []
    for restore_at_open in (False, True):
        clock = ManualClock(T0)
        index = _open(_copy(storage), clock, ManualExecutor())
        if restore_at_open:
            index._finish_lazy()
        pair.append((index, clock))
    (lazy, lazy_clock), (full, full_clock) = pair
    for call in calls:
        assert _call(lazy, lazy_clock, call) == _call(full, full_clock, call), call
        assert len(lazy) == len(full)
        lazy._check()
    drained = []
    for index, clock in pair:
        clock.set(T0 + 10_000_000)
        delivered: Counter[Position] = Counter()
        while got := index.poll(1000):
            delivered.update(got)
        drained.append(delivered)
        assert len(index) == 0
        index.close()
    assert drained[0] == drained[1] and set(drained[0].values()) <= {1}


def test_the_first_restore_queues_the_rest_in_the_background() -> None:
    """With a threaded executor, the first call that restores a bucket queues a job that
    restores the others, one per lock hold; once it is done the front has the real core
    back (native calls again), and nothing was restored twice or lost."""
    storage, schedule = _built()
    clock = ManualClock(T0)
    index = DelayIndex.open(storage, NAME, _config(), clock=clock)  # its own writer thread
    assert isinstance(index._core, LazyCore) and index._front.core is index._core
    assert index.contains(2, 3)  # restores bucket 2, queues the rest
    assert 0 < len(index._lazy) < 4
    index.flush()  # waits for queued jobs: the background restore among them
    assert index._lazy == {} and not isinstance(index._core, LazyCore)
    assert index._front.core is index._core and len(index) == len(schedule)
    index._check()
    assert _drain(index, clock, schedule) == Counter(list(schedule))
    index.close()


def test_a_seal_and_a_merge_after_an_open_restore_only_the_merged_buckets(
    restores: list[str],
) -> None:
    """Seals restore nothing; a merge restores its lazy sources (its filter needs their
    positions) before any other bucket, which only the background restore then restores
    (here on the caller's thread: an InlineExecutor); everything is still delivered once."""
    storage, schedule = _built()
    clock = ManualClock(T0)
    config = _config().replace(max_num_buckets=5)
    index = DelayIndex.open(storage, NAME, config, clock=clock, executor=InlineExecutor())
    ids = {b.start_ledger: str(b.snapshot_id) for b in index.buckets()}
    added = {Position(ledger, entry): T0 + 2_000 + entry for ledger in (6, 7) for entry in range(4)}
    for p, at in added.items():
        assert index.add(p.ledger_id, p.entry_id, at)
    assert restores == [] and len(index.buckets()) == 5  # one seal so far: nothing restored
    assert index.add(8, 0, T0 + 3_000)  # seals [7]: six buckets, one over the bound
    index.flush()
    [(low, high)] = [
        (b.start_ledger, b.end_ledger) for b in index.buckets() if b.start_ledger < b.end_ledger
    ]  # the merged bucket
    merged = [ledger for ledger in ids if low <= ledger <= high]
    unmerged = sorted(set(ids) - set(merged))
    assert merged and unmerged  # then the background restore
    assert sorted(restores) == sorted(ids.values())
    assert sorted(restores[: len(merged)]) == sorted(ids[ledger] for ledger in merged)
    assert index._lazy == {}
    index._check()
    everything = {**schedule, **added, Position(8, 0): T0 + 3_000}
    assert _drain(index, clock, everything) == Counter(list(everything))
    index.close()


def test_an_unexpected_restore_error_leaves_the_bucket_lazy_and_len_exact(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An error other than damage (a bug, memory) reaches the caller; the bucket stays lazy,
    ``len`` stays exact, and a later call restores it."""
    storage, schedule = _built()
    clock = ManualClock(T0)
    index = _open(storage, clock)
    real = recovery_module._restore_live

    def failing(core: Any, metadata: SnapshotMetadata, first: int, name: str) -> None:
        raise MemoryError("injected")

    monkeypatch.setattr(recovery_module, "_restore_live", failing)
    with pytest.raises(MemoryError, match="injected"):
        index.contains(2, 3)
    assert [start for start, _, _ in index._lazy_spans] == [1, 2, 3, 4] and len(index) == 24
    index._check()
    monkeypatch.setattr(recovery_module, "_restore_live", real)
    assert index.contains(2, 3) and len(index._lazy) == 3 and index.quarantined() == []
    assert _drain(index, clock, schedule) == Counter(list(schedule))
    index.close()


def test_every_routed_name_is_a_call_of_both_cores() -> None:
    """The routing tables name real members of the core: a typo would route nothing."""
    from delayindex import _impl
    from delayindex._pure.bucket import BucketCore as PureBucketCore
    from delayindex.tracker import _lazy_restore as routing

    names = [
        *routing._BY_LEDGERS, *routing._BY_SOURCE, *routing._MEMBERSHIP_FREE,
        *routing._MEMBERSHIP_FREE_ATTRIBUTES,
    ]  # fmt: skip
    assert len(names) == len(set(names))
    for cls in {_impl.BucketCore, PureBucketCore}:
        core = cls(**_config().bucket_core_settings())
        missing = [name for name in names if not hasattr(core, name)]
        assert missing == [], f"{cls.__module__}.{cls.__name__} has no {missing}"
        assert all(name in vars(LazyCore) for name in names)
