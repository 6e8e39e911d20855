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
from typing import Any

import numpy as np
import pytest

import delayindex.tracker._recovery as recovery_module
from delayindex import DelayIndex, ManualClock, MemoryStorage, Position, TrackerConfig
from delayindex.errors import SnapshotCorruptError
from delayindex.executors import InlineExecutor
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


def _open(storage: MemoryStorage, clock: ManualClock) -> DelayIndex:
    return DelayIndex.open(storage, NAME, _config(), clock=clock, executor=InlineExecutor())


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
    assert index.contains(3, 5)  # the first call that needs membership restores them all
    assert len(restores) == 4 and not isinstance(index._core, LazyCore)
    assert len(index) == 24 and not index.contains(5, 0)
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
        store = MemoryStorage()
        for object_id in (o.id for o in storage.list_objects()):
            store.put_raw_object(object_id, storage.raw_object(object_id))
        manifest = storage.raw_manifest(NAME)
        assert manifest is not None
        store.put_raw_manifest(NAME, manifest)
        clock = ManualClock(T0)
        index = _open(store, clock)
        assert isinstance(index._core, LazyCore)
        if restore_first:
            index._finish_lazy()
        answer = call(index, clock)
        assert not isinstance(index._core, LazyCore) or name == "stats' tracked count"
        after = {**schedule, Position(2, 9): T0 + 5_000, Position(6, 0): T0 + 6_000}
        delivered = _drain(index, clock, after)
        results.append((answer, len(index), sorted(delivered.items())))
        index.close()
    assert results[0] == results[1]
    assert all(n == 1 for _, _, got in results for _, n in got)


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
    assert index.contains(1, 0)  # restores: bucket 3's bitmaps fail
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
    index = _open(storage, ManualClock(T0))
    assert len(index) == 24
    assert index.add(9, 0, T0 + 90_000)  # an add needs membership: restores first
    assert len(index) == 25 and not isinstance(index._core, LazyCore)
    tracked = index.add_many(
        np.array([1, 9], dtype=np.int64),
        np.array([0, 1], dtype=np.int64),
        np.array([T0 + 90_000, T0 + 90_000], dtype=np.int64),
    )
    assert tracked.tolist() == [True, True] and len(index) == 26  # (1, 0): already tracked
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
    """An open reads each bucket's columns only: no ledger column, no bitmap and no segment
    is decoded until a call needs them (format 5 keeps them in a part of their own)."""
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
    assert len(columns) == 4 and wholes == [3, 3, 3, 3]  # the restore decodes them, once
    assert heads == []
    sealed = {p: at for p, at in schedule.items() if p.ledger_id < 5}
    assert _drain(index, clock, sealed) == Counter(list(sealed))
    assert len(columns) == len(wholes) == 4
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
