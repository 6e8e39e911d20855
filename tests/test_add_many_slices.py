"""``add_many`` in slices: the trackers take their lock once per ``ADD_MANY_SLICE_ROWS`` rows, so
another thread's ``poll`` or ``contains`` waits for one slice, not for a whole large batch.

Pinned here, on both trackers (and on both builds, as the suite runs twice): the lock is taken
once per slice; a bad row anywhere still changes nothing (the whole batch is checked first); and
a batch added in slices leaves the same state as in one piece, seals mid-batch included. How
long another thread waits is a timing claim: ``benchmarks/bench_add_many_wait.py``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from delayindex import DelayIndex, InMemoryTracker, ManualClock, MemoryStorage, TrackerConfig
from delayindex.executors import InlineExecutor
from delayindex.tracker import _front

START_MS = 1_000_000


class CountingLock:
    """The tracker's lock, counting the ``with`` blocks entered through it (the native fronts
    keep their own reference to the real lock, which stays the one mutual exclusion)."""

    def __init__(self, lock: Any) -> None:
        self.lock = lock
        self.entered = 0

    def __enter__(self) -> Any:
        self.entered += 1
        return self.lock.__enter__()

    def __exit__(self, *exc: object) -> Any:
        return self.lock.__exit__(*exc)


def _in_memory(config: TrackerConfig) -> Any:
    return InMemoryTracker(config, clock=ManualClock(START_MS))


def _delay_index(config: TrackerConfig) -> Any:
    return DelayIndex.open(
        MemoryStorage(), "slices", config, clock=ManualClock(START_MS), executor=InlineExecutor()
    )


TRACKERS: dict[str, Callable[[TrackerConfig], Any]] = {
    "in_memory": _in_memory,
    "delay_index": _delay_index,
}
#: Small buckets, so a 50-row batch seals in the middle of slices.
SMALL = TrackerConfig(min_index_count_per_bucket=3, max_num_buckets=0)


def _batch(rows: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``rows`` delayed messages over a few ledgers, in ledger order, with some duplicates."""
    rng = np.random.default_rng(7)
    ledgers = np.repeat(np.arange(rows // 5 + 1), 5)[:rows].astype(np.int64)
    entries = (np.arange(rows) % 5).astype(np.int64)
    entries[rows // 2] = entries[rows // 2 - 1]  # a duplicate of the row before
    ledgers[rows // 2] = ledgers[rows // 2 - 1]
    times = START_MS + 1000 + rng.integers(0, 100_000, rows).astype(np.int64)
    return ledgers, entries, times


@pytest.mark.parametrize("kind", TRACKERS)
def test_the_lock_is_taken_once_per_slice(kind: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_front, "ADD_MANY_SLICE_ROWS", 4)
    tracker = TRACKERS[kind](TrackerConfig())
    counting = CountingLock(tracker._lock)
    tracker._lock = counting
    ledgers, entries, times = _batch(10)
    tracked = tracker.add_many(ledgers, entries, times)
    assert counting.entered == 3  # rows 0-3, 4-7, 8-9
    assert tracked.tolist() == [True] * 10 and len(tracker) == 9  # one duplicate
    counting.entered = 0
    tracker.add_many([], [], [])
    assert counting.entered == 1  # an empty batch is one empty slice
    tracker._lock = counting.lock
    tracker.close()


@pytest.mark.parametrize("kind", TRACKERS)
def test_a_bad_row_in_a_later_slice_changes_nothing(
    kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_front, "ADD_MANY_SLICE_ROWS", 4)
    tracker = TRACKERS[kind](TrackerConfig())
    ledgers, entries, times = _batch(10)
    entries[9] = 2**32  # not an entry id
    with pytest.raises(ValueError, match=r"element 9: bad position"):
        tracker.add_many(ledgers, entries, times)
    with pytest.raises(ValueError, match="equal length"):
        tracker.add_many(ledgers, entries[:9], times)
    assert len(tracker) == 0
    tracker.close()


@pytest.mark.parametrize("kind", TRACKERS)
def test_slices_leave_the_state_one_piece_leaves(
    kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Seals at every third message: the slices (of four rows) cut across them."""
    ledgers, entries, times = _batch(50)
    states = []
    for size in (4, 10**6):
        monkeypatch.setattr(_front, "ADD_MANY_SLICE_ROWS", size)
        tracker = TRACKERS[kind](SMALL)
        tracked = tracker.add_many(ledgers, entries, times)
        buckets = [(b.start_ledger, b.end_ledger) for b in getattr(tracker, "buckets", list)()]
        tracker._clock.set(START_MS + 10**6)
        delivered = tracker.poll(1000)
        states.append((tracked.tolist(), buckets, delivered))
        tracker.close()
    assert states[0] == states[1]
    assert len(states[0][2]) == 49
    if kind == "delay_index":
        assert len(states[0][1]) > 4  # sealed mid-batch, across the slices
