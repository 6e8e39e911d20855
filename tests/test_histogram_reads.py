"""``DelayIndex.due_histogram`` reads times alone for clean buckets, and stays exact.

A bucket whose stored copies are all tracked needs no positions for a histogram: the segments
that straddle a bin edge are read with ``get_segment_times`` (no metadata decoded or cached).
Once a cancel makes the bucket unclean, positions are read and masked as before. Every count is
checked against a brute-force model of what is tracked.
"""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import pytest

from delayindex import DelayIndex, FileStorage, ManualClock, MemoryStorage, TrackerConfig
from delayindex.errors import SnapshotCorruptError
from delayindex.snapshot.codec import decode_metadata
from delayindex.storage import _base_objects

T0 = 1_000_000
CONFIG = TrackerConfig(
    tick_ms=0,
    min_index_count_per_bucket=40,
    max_indexes_per_segment=7,
    max_time_step_per_segment_ms=300,
)


def _model_counts(model: dict[tuple[int, int], int], edges: list[int]) -> list[int]:
    times = np.array(sorted(model.values()), dtype=np.int64)
    return np.histogram(times, bins=np.array(edges))[0].tolist() if len(times) else []


def _filled(storage: Any) -> tuple[DelayIndex, dict[tuple[int, int], int]]:
    rng = random.Random(7)
    index = DelayIndex.open(storage, "h", config=CONFIG, clock=ManualClock(T0))
    model: dict[tuple[int, int], int] = {}
    for ledger in range(1, 9):
        for entry in range(60):
            when = T0 + 1_000 + rng.randrange(10_000)
            assert index.add(ledger, entry, when)
            model[ledger, entry] = when
    index.flush()
    assert len(index.buckets()) >= 4
    ahead = getattr(storage, "_readahead", None)  # FileStorage reads the seals' hints ahead:
    assert ahead is None or ahead.wait_idle(30)  # let it finish, or it decodes metadata later
    return index, model


@pytest.fixture(params=["memory", "file"])
def storage(request: pytest.FixtureRequest, tmp_path: Any) -> Any:
    return MemoryStorage() if request.param == "memory" else FileStorage(tmp_path / "s")


def _count_metadata_decodes(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    calls: list[int] = []
    real = decode_metadata  # the function _base_objects imported

    def counting(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(_base_objects, "decode_metadata", counting)
    return calls


def test_clean_buckets_are_binned_from_times_alone(
    storage: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    index, model = _filled(storage)
    storage._cache.clear()  # start cold: whatever recovery or sealing cached is gone
    decodes = _count_metadata_decodes(monkeypatch)
    rng = random.Random(3)
    for _ in range(20):
        edges = sorted(rng.sample(range(T0 + 900, T0 + 11_100), rng.randrange(2, 12)))
        assert index.due_histogram(edges).tolist() == _model_counts(model, edges)
    assert decodes == []  # no metadata decoded: the straddling segments were read as times
    assert storage.stats()["get_segments"]["calls"] > 0  # ... and they were read
    index.close()


def test_an_unclean_bucket_is_still_exact(storage: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    index, model = _filled(storage)
    storage._cache.clear()
    rng = random.Random(5)
    for position in rng.sample(sorted(model), 25):
        assert index.cancel(*position)
        del model[position]
    moved = rng.sample(sorted(model), 10)
    for ledger, entry in moved:
        when = T0 + 2_000 + rng.randrange(8_000)
        index.reschedule(ledger, entry, when)
        model[ledger, entry] = when
    decodes = _count_metadata_decodes(monkeypatch)
    for _ in range(20):
        edges = sorted(rng.sample(range(T0 + 900, T0 + 11_100), rng.randrange(2, 12)))
        assert index.due_histogram(edges).tolist() == _model_counts(model, edges)
    assert decodes  # unclean buckets need their positions, from the metadata's bitmaps
    index.close()


def test_a_damaged_straddling_segment_is_reported(storage: Any) -> None:
    index, _ = _filled(storage)
    sid = index.buckets()[0].snapshot_id
    assert sid is not None
    with storage._raw_source(sid) as src:
        data = bytearray(src.read(0, src.size))
    data[-3] ^= 0x10  # inside the last segment's checksum
    storage._raw_delete(sid)
    storage._raw_put(sid, bytes(data), may_exist=False)
    storage._cache.clear()
    storage._headers.clear()
    with pytest.raises(SnapshotCorruptError, match=sid):
        # Bins narrow enough that every segment straddles an edge: every one is read.
        index.due_histogram(list(range(T0 + 900, T0 + 11_100, 3)))
    index.close()
