"""Merges fold the cancels of their range into the merged snapshot (snapshot format 3).

A durable cancel must outlive the dispatcher's replay until the mark-delete passes it. Before
a merge it lives in the manifest (and, until a flush evicts it, in the core's memory); a merge
moves the cancels of its range into the merged bucket's snapshot, so they leave both, and an
add of an untracked position in that range asks for them back (``ADD_NEED_OVERRIDES``). These
tests pin that every answer is still the one an index that never folded would give: replay
before and after a reopen, a reschedule after the fold, a second merge, a folded bucket that
is delivered in full or wholly due at open, a cancel made while the merge ran, and a folded
set that cannot be read. Each runs on both builds through ``DELAYINDEX_NO_EXTENSIONS``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from delayindex import DelayIndex, FileStorage, ManualClock, MemoryStorage, TrackerConfig
from delayindex.errors import SnapshotCorruptError
from delayindex.executors import InlineExecutor

T0 = 1_000_000
CONFIG = TrackerConfig(
    tick_ms=0, min_index_count_per_bucket=4, max_indexes_per_segment=2, max_num_buckets=2
)
CANCELLED = [(1, 0), (1, 2), (2, 1)]


def _open(storage: MemoryStorage, clock: ManualClock) -> DelayIndex:
    return DelayIndex.open(storage, "fold", CONFIG, clock=clock, executor=InlineExecutor())


def _due(ledger: int, entry: int) -> int:
    return T0 + 100 * ledger + entry


def _add_ledgers(index: DelayIndex, ledgers: range) -> None:
    for ledger in ledgers:
        for entry in range(4):
            assert index.add(ledger, entry, _due(ledger, entry))


def _folded_index(storage: MemoryStorage, clock: ManualClock) -> DelayIndex:
    """Ledgers 1..6 added; CANCELLED cancelled and flushed while ledgers 1 and 2 were the two
    sealed buckets; adding 4..6 went over the bound of 2, so a merge took ledgers 1..4."""
    index = _open(storage, clock)
    _add_ledgers(index, range(1, 4))
    assert all(index.cancel(*pos) for pos in CANCELLED)
    index.flush()
    _add_ledgers(index, range(4, 7))
    index.flush()
    return index


def _in_core(index: DelayIndex) -> int:
    return int(index._core.counters()["cancel_overrides"])


def _manifest_cancels(storage: MemoryStorage) -> list[tuple[int, int]]:
    ledgers, entries, *_ = storage.read_manifest("fold").overrides.to_arrays()
    return list(zip(ledgers.tolist(), entries.tolist(), strict=True))


def _replay(index: DelayIndex, positions: list[tuple[int, int]]) -> None:
    """The dispatcher's replay: each position again with its original time."""
    for pos in positions:
        assert index.add(*pos, _due(*pos))  # refused or tracked: never "deliver now"


def _everything(last_ledger: int) -> list[tuple[int, int]]:
    return [(ledger, entry) for ledger in range(1, last_ledger + 1) for entry in range(4)]


def _drain(index: DelayIndex, clock: ManualClock) -> list[tuple[int, int]]:
    clock.set(T0 + 10_000)
    return [(p.ledger_id, p.entry_id) for p in index.poll(10_000)]


def test_a_merge_folds_its_range_cancels_out_of_memory_and_manifest() -> None:
    clock, storage = ManualClock(T0), MemoryStorage()
    index = _folded_index(storage, clock)
    try:
        merged = [b for b in index._buckets.values() if b.folded]
        assert [(b.start, b.end, b.folded) for b in merged] == [(1, 4, 3)]
        stats = index.stats()
        assert stats["cancel_overrides_folded"] == 3
        assert stats["cancel_overrides"] == 0 and _in_core(index) == 0
        assert _manifest_cancels(storage) == []  # the merged snapshot holds them now
        _replay(index, CANCELLED)
        assert not any(index.contains(*pos) for pos in CANCELLED)
        index._core._check()
    finally:
        index.close()
    index = _open(storage, clock)
    try:
        assert index._core.evicted_ranges() == [(1, 4)]
        _replay(index, _everything(6))  # ledger 6 was in the memory-only bucket
        assert not any(index.contains(*pos) for pos in CANCELLED)
        delivered = _drain(index, clock)
        assert sorted(delivered) == sorted(set(_everything(6)) - set(CANCELLED))
    finally:
        index.close()


def test_a_reschedule_after_the_fold_beats_the_folded_cancel() -> None:
    clock, storage = ManualClock(T0), MemoryStorage()
    index = _folded_index(storage, clock)
    try:
        assert index.reschedule(1, 0, T0 + 50)  # revives a folded cancel
        index.flush()
    finally:
        index.close()
    index = _open(storage, clock)
    try:
        _replay(index, CANCELLED)  # (1, 0) with its original time: the move wins
        assert index.contains(1, 0)
        assert not index.contains(1, 2) and not index.contains(2, 1)
        clock.set(T0 + 60)
        assert [(p.ledger_id, p.entry_id) for p in index.poll(100)] == [(1, 0)]
        assert (1, 0) not in _drain(index, clock)
    finally:
        index.close()


def test_a_second_merge_carries_the_first_ones_folds() -> None:
    clock, storage = ManualClock(T0), MemoryStorage()
    index = _folded_index(storage, clock)
    try:
        assert index.cancel(5, 1)
        index.flush()
        _add_ledgers(index, range(7, 12))  # more buckets: the merged one merges again
        index.flush()
        folded = sorted((b.start, b.end, b.folded) for b in index._buckets.values() if b.folded)
        assert len(folded) == 1 and folded[0][0] == 1 and folded[0][2] == 4, folded
        assert _manifest_cancels(storage) == [] and _in_core(index) == 0
    finally:
        index.close()
    index = _open(storage, clock)
    try:
        _replay(index, _everything(11))
        assert not any(index.contains(*pos) for pos in [*CANCELLED, (5, 1)])
        delivered = _drain(index, clock)
        assert sorted(delivered) == sorted(set(_everything(11)) - {*CANCELLED, (5, 1)})
    finally:
        index.close()


def test_a_folded_bucket_delivered_in_full_hands_its_cancels_back() -> None:
    """Its object is deleted above the mark: the cancels go back to the manifest first."""
    clock, storage = ManualClock(T0), MemoryStorage()
    index = _folded_index(storage, clock)
    try:
        clock.set(_due(4, 3))
        assert len(index.poll(1000)) == 16 - 3  # all of ledgers 1..4 but the cancelled
        index.flush()
        assert not any(b.folded for b in index._buckets.values())
        assert sorted(_manifest_cancels(storage)) == sorted(CANCELLED)
    finally:
        index.close()
    index = _open(storage, clock)
    try:
        _replay(index, CANCELLED)
        assert not any(index.contains(*pos) for pos in CANCELLED)
    finally:
        index.close()


def test_a_folded_bucket_wholly_due_at_open_hands_its_cancels_back() -> None:
    clock, storage = ManualClock(T0), MemoryStorage()
    index = _folded_index(storage, clock)
    index.close()
    clock.set(_due(4, 3))  # every message of the merged bucket is due: open drops it
    index = _open(storage, clock)
    try:
        assert not any(b.folded for b in index._buckets.values())
        _replay(index, CANCELLED)
        assert not any(index.contains(*pos) for pos in CANCELLED)
        index.flush()
        assert sorted(_manifest_cancels(storage)) == sorted(CANCELLED)
    finally:
        index.close()


def test_a_cancel_while_the_merge_runs_keeps_every_copy() -> None:
    """Cancels made between the merge taking the range's cancels and its commit: the core
    and the manifest keep theirs (the folded copy is then a duplicate, harmless)."""
    clock, storage = ManualClock(T0), MemoryStorage()
    index = _open(storage, clock)
    try:
        _add_ledgers(index, range(1, 4))
        assert all(index.cancel(*pos) for pos in CANCELLED)
        index.flush()
        take = index._fold_for_merge

        def racing(sources: list[Any]) -> tuple[bytes, int]:
            out = take(sources)
            assert index.cancel(3, 3)  # a sealed bucket not in this merge: the gen moves
            return out

        index._fold_for_merge = racing  # type: ignore[method-assign]
        _add_ledgers(index, range(4, 7))
        index._fold_for_merge = take  # type: ignore[method-assign]
        index.flush()
        assert any(b.folded for b in index._buckets.values())
        assert set(CANCELLED) <= set(_manifest_cancels(storage))
        _replay(index, [*CANCELLED, (3, 3)])
        assert not any(index.contains(*pos) for pos in [*CANCELLED, (3, 3)])
    finally:
        index.close()
    index = _open(storage, clock)
    try:
        _replay(index, [*CANCELLED, (3, 3)])
        assert not any(index.contains(*pos) for pos in [*CANCELLED, (3, 3)])
    finally:
        index.close()


def test_folded_cancels_that_do_not_read_refuse_only_their_range(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clock, storage = ManualClock(T0), MemoryStorage()
    index = _folded_index(storage, clock)
    try:
        (merged,) = [b for b in index._buckets.values() if b.folded]
        real = storage.get_metadata

        def damaged(snapshot_id: str, **kwargs: Any) -> Any:
            if snapshot_id == merged.snapshot_id:
                raise SnapshotCorruptError(f"{snapshot_id}: entry 0 checksum mismatch")
            return real(snapshot_id, **kwargs)

        monkeypatch.setattr(storage, "get_metadata", damaged)
        with pytest.raises(SnapshotCorruptError, match="checksum"):
            index.add(1, 0, _due(1, 0))  # may be cancelled: neither added nor delivered
        assert not index.contains(1, 0)
        assert any("cannot be read" in w for w in index.stats()["warnings"])
        assert index.add(6, 9, _due(6, 9)) and index.contains(6, 9)  # elsewhere: as usual
        monkeypatch.setattr(storage, "get_metadata", real)  # it reads again: as before
        _replay(index, CANCELLED)
        assert not any(index.contains(*pos) for pos in CANCELLED)
    finally:
        index.close()


def test_a_damaged_folded_bucket_refuses_replayed_adds_in_its_range(tmp_path: Path) -> None:
    """The manifest records how many cancels a bucket folded, so a damaged one is known to
    hold cancels it cannot read: a replayed add of an untracked position in its ledgers raises
    (it may be cancelled) until the operator releases the bucket."""
    clock = ManualClock(T0)
    with FileStorage(tmp_path / "store") as storage:
        index = DelayIndex.open(storage, "fold", CONFIG, clock=clock, executor=InlineExecutor())
        _add_ledgers(index, range(1, 4))
        assert all(index.cancel(*pos) for pos in CANCELLED)
        index.flush()
        _add_ledgers(index, range(4, 7))
        index.close()
        (merged,) = [b for b in storage.read_manifest("fold").buckets if b.folded_cancels]
        assert (merged.start_ledger, merged.end_ledger, merged.folded_cancels) == (1, 4, 3)
        path = storage.object_path(merged.snapshot_id)
    data = bytearray(path.read_bytes())
    data[40] ^= 1  # the metadata entry: its checksum no longer matches
    path.write_bytes(bytes(data))
    with FileStorage(tmp_path / "store") as storage:
        index = DelayIndex.open(storage, "fold", CONFIG, clock=clock, executor=InlineExecutor())
        try:
            (quarantine,) = index.quarantined()
            assert (quarantine.start_ledger, quarantine.end_ledger) == (1, 4)
            [record] = storage.read_manifest("fold").quarantined
            assert record.folded_cancels == 3
            with pytest.raises(SnapshotCorruptError):
                index.add(1, 0, _due(1, 0))
            assert not index.contains(1, 0)
            assert index.add(5, 3, _due(5, 3)) and index.contains(5, 3)  # elsewhere: as usual
            index.release_quarantined()
            assert any("cancels folded into it are lost" in w for w in index.stats()["warnings"])
            assert index.add(1, 0, _due(1, 0)) and index.contains(1, 0)  # the operator's call
        finally:
            index.close()
