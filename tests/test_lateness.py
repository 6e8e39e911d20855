"""The delivery lateness rule (``delayindex._lateness``): one bucket per delivery by
``now - deliver_at``, the same in the batch form, in the native and the pure cores."""

from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from delayindex import InMemoryTracker, ManualClock, TrackerConfig
from delayindex._lateness import BUCKETS, Lateness, batch, bucket_of, upper_bounds_seconds

lates = st.lists(st.integers(-50, 2**20), min_size=0, max_size=60)


def test_bucket_bounds_are_inclusive_upper_bounds() -> None:
    bounds = upper_bounds_seconds()
    assert len(bounds) == BUCKETS and bounds[-1] == float("inf")
    for late in [-3, 0, 1, 2, 3, 4, 5, 1023, 1024, 1025, 2**17, 2**17 + 1, 2**40]:
        k = bucket_of(late)
        assert max(late, 0) / 1000 <= bounds[k]
        assert k == 0 or max(late, 0) / 1000 > bounds[k - 1]


@given(lates)
def test_the_batch_form_counts_as_one_at_a_time(values: list[int]) -> None:
    one = Lateness()
    for late in values:
        one.note(late)
    many = Lateness()
    many.note_many(1_000_000, 1_000_000 - np.array(values, dtype=np.int64))
    assert (many.counts, many.total_ms) == (one.counts, one.total_ms)
    assert batch(5, np.empty(0, dtype=np.int64)) == ([0] * BUCKETS, 0)


@given(st.lists(st.integers(-100, 2**20), max_size=60))
def test_the_tracker_cores_count_by_the_rule(values: list[int]) -> None:
    """InMemoryTracker's core (native or pure, as the suite runs) against the rule; a tick of
    100 ms delivers up to 100 ms early (lateness <= 0)."""
    now = 10**9
    clock = ManualClock(0)
    tracker = InMemoryTracker(TrackerConfig(tick_ms=100), clock=clock)
    due = sorted({now - late for late in values})
    for entry, deliver_at in enumerate(due):
        assert tracker.add(1, entry, deliver_at)
    clock.set(now)
    assert len(tracker.poll(10_000)) == len(due)
    want = Lateness()
    for deliver_at in due:
        want.note(now - deliver_at)
    stats = tracker.stats()
    assert (stats["lateness"], stats["lateness_ms"]) == (want.counts, want.total_ms)
    tracker.close()
