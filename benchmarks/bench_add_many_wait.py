"""What a large ``add_many`` costs the other threads of a dispatcher.

``add-many-wait-<n>``
    One ``add_many`` of the first ``n`` delayed messages (the largest size of the tier or of
    ``--bench-sizes``) into a fresh tracker, while a second thread calls ``contains`` every
    0.5 ms, as a dispatcher's delivery or acknowledgement thread does. Timed: the ``add_many``.
    ``extra_info``: the reader's longest and p99 call (``max_wait_ms``, ``p99_wait_ms``: how
    long it waited for the tracker's lock) and its number of calls. Rows, in the same run, for
    InMemoryTracker and DelayIndex (native build): ``slices`` (the trackers' default, the lock
    taken per ``ADD_MANY_SLICE_ROWS`` rows) and ``one piece`` (the slice as large as the batch,
    as before session 21: the lock held for the whole batch). Not gated: the reader's calls are
    part of the time.

Run::

    pytest benchmarks/bench_add_many_wait.py --benchmark-enable --bench-sizes 1000000
"""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
from support import record, record_rate

from delayindex import DelayIndex, InMemoryTracker, ManualClock, MemoryStorage
from delayindex.tracker import _front

pytestmark = pytest.mark.full_tier

READER_PAUSE_S = 0.0005
ROWS = {
    "in_memory-slices": ("in_memory", "InMemoryTracker add_many, in slices (default)", True),
    "in_memory-one_piece": ("in_memory", "InMemoryTracker add_many, in one piece", False),
    "delay_index-slices": ("delay_index", "DelayIndex add_many, in slices (default)", True),
    "delay_index-one_piece": ("delay_index", "DelayIndex add_many, in one piece", False),
}


def _add_beside_a_reader(tracker: Any, data: Any) -> tuple[float, list[float]]:
    """``add_many`` of ``data`` while another thread calls ``contains``: (seconds, waits)."""
    stop = threading.Event()
    waits: list[float] = []

    def read() -> None:
        contains = tracker.contains
        while not stop.is_set():
            started = time.perf_counter()
            contains(0, 0)
            waits.append(time.perf_counter() - started)
            time.sleep(READER_PAUSE_S)

    reader = threading.Thread(target=read)
    reader.start()
    time.sleep(0.01)  # the reader is running
    started = time.perf_counter()
    tracker.add_many(data.ledgers, data.entries, data.deliver_at)
    seconds = time.perf_counter() - started
    stop.set()
    reader.join()
    return seconds, waits


@pytest.mark.parametrize("row", ROWS)
def test_add_many_wait(
    benchmark: Any,
    delayed_cache: Any,
    max_size: int,
    max_size_id: str,
    row: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    kind, label, sliced = ROWS[row]
    data = delayed_cache(max_size)
    if not sliced:
        monkeypatch.setattr(_front, "ADD_MANY_SLICE_ROWS", len(data) + 1)
    record(benchmark, f"add-many-wait-{max_size_id}", kind, label, size=len(data))
    benchmark.extra_info["ungated"] = "a reader thread's calls are part of the time"
    trackers: list[Any] = []

    def setup() -> tuple[tuple[Any, ...], dict[str, Any]]:
        clock = ManualClock(data.now_ms)
        tracker: Any
        if kind == "delay_index":
            tracker = DelayIndex.open(MemoryStorage(), "wait", clock=clock)
        else:
            tracker = InMemoryTracker(clock=clock)
        trackers.append(tracker)
        return (tracker, data), {}

    waits: list[float] = []

    def timed(tracker: Any, batch: Any) -> float:
        seconds, round_waits = _add_beside_a_reader(tracker, batch)
        waits.extend(round_waits)
        return seconds

    benchmark.pedantic(timed, setup=setup, rounds=3, iterations=1)
    for tracker in trackers:
        assert len(tracker) == len(data)
        tracker.close()
    record_rate(benchmark, len(data))
    waits.sort()
    benchmark.extra_info["max_wait_ms"] = round(waits[-1] * 1e3, 3)
    benchmark.extra_info["p99_wait_ms"] = round(waits[int(len(waits) * 0.99)] * 1e3, 3)
    benchmark.extra_info["reader_calls"] = len(waits)
