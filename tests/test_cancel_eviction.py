"""Cancels leave memory once durable (``BucketCore.evict_cancels``), and still hold.

After a ``flush()`` (and at open) the cancels of sealed buckets are dropped from the core: the
catalog's packed copy of the overrides is their only one. An add of an untracked position in an
evicted range (the dispatcher's replay), or a reschedule there, makes the core ask for them
back (``ADD_NEED_OVERRIDES``) before it answers. These tests pin that the answers are the ones
an index that never evicted would give: through ``add``, ``add_many``, ``reschedule``, a
reopen, later cancels (each note carries the evicted ones too), the mark, and a shared index's
re-add of a held position. Each runs on both builds through ``DELAYINDEX_NO_EXTENSIONS``.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from delayindex import (
    DelayIndex,
    ManualClock,
    MemoryStorage,
    Position,
    SharedDelayIndex,
    TrackerConfig,
)
from delayindex.executors import InlineExecutor

T0 = 1_000_000
CONFIG = TrackerConfig(tick_ms=0, min_index_count_per_bucket=4, max_indexes_per_segment=2)


def _open(storage: MemoryStorage, clock: ManualClock) -> DelayIndex:
    return DelayIndex.open(storage, "evict", CONFIG, clock=clock, executor=InlineExecutor())


def _fill(index: Any) -> None:
    """Ledgers 1..5, entries 0..3, due at T0 + 100 * ledger + entry: ledgers 1..4 sealed."""
    for ledger in range(1, 6):
        for entry in range(4):
            assert index.add(ledger, entry, T0 + 100 * ledger + entry)


def _in_core(index: DelayIndex) -> int:
    """Cancel overrides held by the core itself (not counting evicted ones)."""
    return int(index._core.counters()["cancel_overrides"])


def test_flush_evicts_sealed_cancels_and_a_replay_still_meets_them() -> None:
    clock, storage = ManualClock(T0), MemoryStorage()
    index = _open(storage, clock)
    try:
        _fill(index)
        cancelled = [(1, 0), (1, 2), (3, 1), (5, 3)]  # (5, 3) is in the mutable bucket
        assert all(index.cancel(*pos) for pos in cancelled)
        index.flush()
        stats = index.stats()
        assert stats["cancel_overrides"] == 4 and stats["cancel_overrides_evicted"] == 3
        assert _in_core(index) == 1 and stats["evicted_cancel_ranges"] >= 1
        index._core._check()
        # The replay: a cancelled position comes back refused (True: do not deliver). Only
        # its bucket's cancels come back (ledger 1's two); ledger 3's stays evicted.
        assert [b.start_ledger for b in index.buckets()][:4] == [1, 2, 3, 4]
        assert index.add(1, 0, T0 + 100) is True and not index.contains(1, 0)
        assert index.stats()["cancel_overrides_evicted"] == 1 and _in_core(index) == 3
        assert index.stats()["cancel_overrides"] == 4
        assert index._core.evicted_mask([1, 2, 3, 4]).tolist() == [False, False, True, False]
        index._core._check()
        assert index.add(3, 1, T0 + 301) is True and not index.contains(3, 1)
        assert index.stats()["cancel_overrides_evicted"] == 0 and _in_core(index) == 4
        assert index.stats()["cancel_overrides"] == 4
        index._core._check()
        # Everything else is delivered as if nothing had been evicted.
        clock.advance(1_000)
        got = index.poll(100)
        assert set(got) == {Position(g, e) for g in range(1, 6) for e in range(4)} - {
            Position(*p) for p in cancelled
        }
    finally:
        index.close()


def test_add_many_and_a_delivered_positions_replay_after_eviction() -> None:
    clock, storage = ManualClock(T0), MemoryStorage()
    index = _open(storage, clock)
    try:
        _fill(index)
        assert index.cancel(2, 1) and index.cancel(2, 3)
        index.flush()
        assert _in_core(index) == 0
        clock.set(T0 + 150)
        assert index.poll(10) == [Position(1, e) for e in range(4)]  # ledger 1, delivered
        # A replay re-adds the delivered ones (due: deliver again) and the cancelled ones.
        ledgers = np.array([1, 1, 2, 2, 2], dtype=np.int64)
        entries = np.array([0, 1, 1, 2, 3], dtype=np.int64)
        times = T0 + 100 * ledgers + entries
        out = index.add_many(ledgers, entries, times)
        assert out.tolist() == [False, False, True, True, True]  # 2,2 is still tracked
        assert not index.contains(2, 1) and not index.contains(2, 3) and index.contains(2, 2)
        index._core._check()
    finally:
        index.close()


def test_evicted_cancels_survive_later_notes_a_reopen_and_evict_again_at_open() -> None:
    clock, storage = ManualClock(T0), MemoryStorage()
    index = _open(storage, clock)
    _fill(index)
    assert index.cancel(1, 1) and index.cancel(4, 0)
    index.flush()  # both evicted
    assert index.cancel(3, 3)  # a later cancel: its note must carry the evicted two as well
    index.flush()
    assert index.stats()["cancel_overrides"] == 3
    stored = storage.read_manifest("evict").overrides.to_arrays()
    assert list(zip(stored[0].tolist(), stored[1].tolist(), strict=True)) == [
        (1, 1), (3, 3), (4, 0),
    ]  # fmt: skip
    index.close()
    again = _open(storage, clock)
    try:
        stats = again.stats()
        assert stats["cancel_overrides"] == 3 and stats["cancel_overrides_evicted"] == 3
        assert _in_core(again) == 0  # evicted at open: the manifest carries them
        replay = [again.add(g, e, T0 + 100 * g + e) for g in range(1, 6) for e in range(4)]
        assert [p for p, kept in zip(
            [(g, e) for g in range(1, 6) for e in range(4)], replay, strict=True
        ) if kept and not again.contains(*p)] == [(1, 1), (3, 3), (4, 0)]  # fmt: skip
        again._core._check()
    finally:
        again.close()


def test_reschedule_revives_an_evicted_cancel_and_the_mark_forgets_them() -> None:
    clock, storage = ManualClock(T0), MemoryStorage()
    index = _open(storage, clock)
    try:
        _fill(index)
        assert index.cancel(2, 0) and index.cancel(3, 2)
        index.flush()
        assert index.reschedule(2, 0, T0 + 5_000) is True  # evicted: taken back, then moved
        assert index.contains(2, 0) and not index.contains(3, 2)
        index.flush()
        assert index.stats()["cancel_overrides"] == 1
        index.set_mark_delete(3, 5)  # passes (3, 2): forgotten with the next note
        index.flush()
        assert index.stats()["cancel_overrides"] == 0
        assert index.add(3, 2, T0 + 302) is True  # acknowledged now, not cancelled
        index._core._check()
    finally:
        index.close()


def test_a_cancel_made_while_flushing_is_never_evicted(monkeypatch: pytest.MonkeyPatch) -> None:
    """The commit of a flush's note ends after another cancel: nothing is evicted then (the
    core's override generation moved), so that cancel cannot be dropped."""
    clock, storage = ManualClock(T0), MemoryStorage()
    index = _open(storage, clock)
    try:
        _fill(index)
        assert index.cancel(1, 0)
        real = index._catalog.persist_mark_delete

        def commit_then_cancel(**kwargs: Any) -> None:
            real(**kwargs)
            assert index.cancel(2, 2)  # after the note, before the eviction

        monkeypatch.setattr(index._catalog, "persist_mark_delete", commit_then_cancel)
        index.flush()
        assert _in_core(index) == 2 and index.stats()["cancel_overrides_evicted"] == 0
        monkeypatch.undo()
        index.flush()
        assert _in_core(index) == 0 and index.stats()["cancel_overrides_evicted"] == 2
        assert index.add(2, 2, T0 + 202) is True and not index.contains(2, 2)
    finally:
        index.close()


def test_a_shared_index_re_add_of_a_held_position_meets_an_evicted_cancel() -> None:
    clock, storage = ManualClock(T0), MemoryStorage()
    shared = SharedDelayIndex.open(
        storage, "shared", CONFIG, clock=clock, executor=InlineExecutor()
    )
    try:
        fast, slow = shared.subscribe("fast"), shared.subscribe("slow")
        _fill(shared)
        clock.set(T0 + 150)
        assert len(fast.poll(100)) == 4  # ledger 1 is now held in the due log for "slow"
        assert shared.cancel(1, 2) and shared.cancel(2, 1)
        shared.flush()
        assert shared.stats()["cancel_overrides_evicted"] >= 1
        # "fast" re-adds (1, 2) (its own replay): a cancel holds for every subscription.
        assert shared.add(1, 2, T0 + 102) is True
        assert not slow.contains(1, 2) and Position(1, 2) not in slow.poll(100)
        shared._check()
    finally:
        shared.close()


def test_after_eviction_a_seals_commit_still_carries_a_new_cancel() -> None:
    """The seal leaves the note (which joins the evicted cancels) to its persist job, off the
    add path; that job's commit carries the new cancel together with the evicted ones."""
    clock, storage = ManualClock(T0), MemoryStorage()
    index = _open(storage, clock)
    try:
        _fill(index)
        assert index.cancel(1, 1)
        index.flush()
        assert _in_core(index) == 0
        assert index.cancel(2, 2)  # after the eviction: only in memory
        for entry in range(4):  # ledger 6 seals ledger 5's bucket; the persist job commits
            assert index.add(6, entry, T0 + 600 + entry)
        stored = storage.read_manifest("evict").overrides.to_arrays()
        assert list(zip(stored[0].tolist(), stored[1].tolist(), strict=True)) == [(1, 1), (2, 2)]
        assert index.stats()["cancel_overrides"] == 2
    finally:
        index.close()


def test_a_replay_at_the_largest_ledger_ids_restores_its_span() -> None:
    """Per-bucket restores next to the largest ledger id: each replay takes back its own
    bucket's cancel only, and every answer is the same as without eviction."""
    top = 2**63 - 1
    clock, storage = ManualClock(T0), MemoryStorage()
    index = _open(storage, clock)
    try:
        for ledger in range(top - 4, top + 1):
            for entry in range(4):
                assert index.add(ledger, entry, T0 + 100 + entry)
        assert index.cancel(top - 1, 2) and index.cancel(top - 3, 0)
        index.flush()
        assert _in_core(index) == 0 and index.stats()["cancel_overrides_evicted"] == 2
        # Ledger top - 1's bucket comes back; top - 3's cancel stays evicted.
        assert index.add(top - 1, 2, T0 + 102) is True and not index.contains(top - 1, 2)
        assert _in_core(index) == 1 and index.stats()["cancel_overrides"] == 2
        assert index.add(top - 3, 0, T0 + 100) is True and not index.contains(top - 3, 0)
        assert _in_core(index) == 2
        index._core._check()
        clock.advance(1_000)
        assert len(index.poll(100)) == 18
    finally:
        index.close()
