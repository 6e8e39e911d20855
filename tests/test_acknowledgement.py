"""Acknowledgement (API.md, "Acknowledgement"): a position at or below the mark-delete is never
delivered, whichever way it arrived, and ``len`` does not count it.

Before the fix an add at or below the mark was tracked: delivered from the mutable bucket, but
silently dropped (still counted until the trim) once its bucket was sealed below the mark.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from delayindex import DelayIndex, ManualClock, MemoryStorage, Position, TrackerConfig
from delayindex.executors import InlineExecutor

T0 = 1_000_000
DUE = T0 + 10_000
NAME = "acks"


@pytest.fixture
def storage() -> MemoryStorage:
    return MemoryStorage()


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(T0)


@pytest.fixture
def open_index(storage: MemoryStorage, clock: ManualClock) -> Iterator[Any]:
    opened: list[DelayIndex] = []

    def make(**config: Any) -> DelayIndex:
        settings = {"min_index_count_per_bucket": 1, "max_num_buckets": 0, **config}
        index = DelayIndex.open(
            storage, NAME, TrackerConfig(**settings), clock=clock, executor=InlineExecutor()
        )
        opened.append(index)
        return index

    yield make
    for index in opened:
        index.close()


def drain(index: DelayIndex, clock: ManualClock) -> list[Position]:
    clock.set(DUE + 10**6)
    return index.poll(10**6)


@pytest.mark.parametrize("deliver_at", [DUE, -1, T0, T0 - 5])
def test_add_below_the_mark_in_the_mutable_bucket(
    open_index: Any, clock: ManualClock, deliver_at: int
) -> None:
    """Delayed, not delayed or due: True (do not deliver), nothing tracked."""
    index = open_index()
    assert index.add(7, 9, DUE)  # the mutable bucket is [7, 7]
    index.set_mark_delete(7, 5)
    for entry in (0, 5):
        assert index.add(7, entry, deliver_at) is True
        assert not index.contains(7, entry)
    assert index.add(7, 6, DUE) is True  # just above the mark: tracked
    assert len(index) == 2
    assert index.stats()["acked_on_add"] == 2
    assert drain(index, clock) == [Position(7, 6), Position(7, 9)]
    index._check()


def test_add_below_the_mark_whose_bucket_seals(open_index: Any, clock: ManualClock) -> None:
    """Added after the mark into a bucket that then seals below it: refused, not counted."""
    index = open_index()
    index.set_mark_delete(5, 0)
    assert index.add(1, 0, DUE)
    assert index.add(2, 0, DUE)  # would seal [1, 1] below the mark
    assert index.add(6, 0, DUE)  # tracked
    assert len(index) == 1 and len(index.tracked_entries(1, 0, 10)) == 0
    assert drain(index, clock) == [Position(6, 0)]
    index._check()


def test_add_below_the_mark_in_a_sealed_bucket(open_index: Any, clock: ManualClock) -> None:
    """Added before the mark into a bucket sealed since (a straddling bucket is kept), then
    re-added after the mark: neither copy is delivered."""
    index = open_index()
    assert index.add(1, 0, DUE) and index.add(1, 1, DUE)
    assert index.add(2, 0, DUE)  # seals [1, 1]
    assert len(index.buckets()) == 1
    index.set_mark_delete(1, 0)  # straddles [1, 1]: kept, (1, 0) untracked
    assert index.add(1, 0, DUE) is True  # re-added: refused
    assert index.add(1, 0, T0) is True  # due: still not delivered
    assert len(index) == 2 and not index.contains(1, 0)
    assert drain(index, clock) == [Position(1, 1), Position(2, 0)]
    index._check()


def test_add_below_the_mark_into_the_direct_heap(open_index: Any, clock: ManualClock) -> None:
    """Non-monotonic adds (inside a sealed range, or below the mutable bucket) go to the direct
    heap; at or below the mark they are refused there too."""
    index = open_index()
    assert index.add(10, 1, DUE)
    assert index.add(20, 1, DUE)  # seals [10, 10]
    index.set_mark_delete(15, 0)
    before = index.stats()["direct_adds"]
    assert index.add(10, 0, DUE)  # inside the sealed range
    assert index.add(12, 0, -1)  # below the mutable bucket, not delayed
    assert index.add(15, 0, T0)  # the mark itself, due
    assert index.add(15, 1, DUE)  # above: tracked in the direct heap
    assert index.stats()["direct_adds"] == before + 1
    assert len(index) == 2
    assert drain(index, clock) == [Position(15, 1), Position(20, 1)]
    index._check()


def test_add_many_below_the_mark(open_index: Any, clock: ManualClock) -> None:
    index = open_index()
    index.set_mark_delete(3, 3)
    out = index.add_many([1, 3, 3, 3, 4], [0, 3, 3, 4, 0], [DUE, -1, DUE, T0, DUE])
    # (3, 4) is due: deliver it now (False); the rest below the mark: True, untracked.
    assert out.tolist() == [True, True, True, False, True]
    assert len(index) == 1 and index.stats()["acked_on_add"] == 3
    assert drain(index, clock) == [Position(4, 0)]


def test_add_below_the_mark_after_a_reopen(open_index: Any, clock: ManualClock) -> None:
    """The mark is persisted in the manifest and applied again at open."""
    index = open_index()
    for ledger in (1, 2, 3):
        assert index.add(ledger, 0, DUE)
    index.set_mark_delete(2, 0)
    index.close()
    index = open_index()
    assert index.mark_delete == (2, 0)
    for ledger in (1, 2):
        assert index.add(ledger, 0, DUE) is True  # the dispatcher replays from an old cursor
        assert index.add(ledger, 0, -1) is True
    assert index.add_many(np.array([1, 2]), np.array([0, 0]), np.array([DUE, T0])).all()
    assert len(index) == 0  # the mutable bucket [3, 3] was memory-only: replayed below
    assert index.add(3, 0, DUE) is True
    assert len(index) == 1
    assert drain(index, clock) == [Position(3, 0)]


def test_clear_is_a_rewind(open_index: Any, clock: ManualClock) -> None:
    """After ``clear`` the old mark no longer applies: re-added positions are tracked."""
    index = open_index()
    index.set_mark_delete(5, 0)
    assert index.add(4, 0, DUE) and len(index) == 0
    index.clear()
    assert index.mark_delete is None
    assert index.add(4, 0, DUE) and len(index) == 1
    assert index.add(4, 1, -1) is False  # not delayed, no mark: deliver now
    assert drain(index, clock) == [Position(4, 0)]
