"""DelayIndex benchmarks that have no in-memory counterpart: reopen versus replay, seal latency.

Inputs: the first ``n`` delayed messages of the realistic workload (``n`` = the largest
``--bench-sizes``; use ``--bench-sizes 10000000`` for the acceptance figures), shifted a day into
the future so all of them are tracked.

``reopen-<n>``
    Setup (untimed, once per session): a DelayIndex with default settings on FileStorage ingests
    the ``n`` messages with ``add_many``, flushes and closes. Timed: ``DelayIndex.open`` of that
    store, ready to poll (recovery: metadata, bitmaps of live segments, first live segment of
    every bucket). Compared, in the same group, with what a restart costs without snapshots:
    replaying the same messages into ``InMemoryTracker`` per message (``add``, as a dispatcher
    re-reading its backlog does) and in batches (``add_many``), and into the ``heapq`` baseline.
    Each replay's ``extra_info["reopen_speedup"]`` is its time over the reopen's. From 10 M
    messages on, the reopen must be at least 10x faster than the per-message replay (asserted;
    smaller indexes are dominated by fixed costs). The replays leave out re-reading the messages
    from the topic, which a real replay also pays.
``seal-latency-<n>``
    Sustained per-call ``add`` of the ``n`` messages at default settings (a seal every 50 000
    indexes, background encoding, writing and merging) with the wall clock. Each call is timed;
    ``extra_info`` reports the longest call (``max_add_ms``), the 99.99th percentile and the
    seal count. InMemoryTracker and heapq run the same loop for comparison (their longest calls
    are heap reallocations and GC pauses). Rows are streamed from the int64 arrays 4096 at a
    time, as a dispatcher reading its topic holds them.

Run::

    pytest benchmarks/bench_delay_index.py --benchmark-enable --bench-sizes 10000000
"""

from __future__ import annotations

import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from delayindex import DelayIndex, FileStorage, InMemoryTracker, ManualClock, wall_clock_ms

BATCH_ROWS = 100_000
STREAM_ROWS = 4096
#: The size at which the reopen speed-up (>= 10x an in-memory replay) is asserted.
ACCEPTANCE_SIZE = 10_000_000


@pytest.fixture(scope="session")
def reopen_store(delayed_cache: Any, max_size: int) -> Iterator[tuple[Path, Any]]:
    """A FileStorage directory holding the index of the largest input, closed."""
    data = delayed_cache(max_size)
    path = Path(tempfile.mkdtemp(prefix="delayindex-reopen-"))
    clock = ManualClock(data.now_ms)
    index = DelayIndex.open(FileStorage(path), "bench", clock=clock)
    for start in range(0, len(data), BATCH_ROWS):
        stop = start + BATCH_ROWS
        index.add_many(
            data.ledgers[start:stop], data.entries[start:stop], data.deliver_at[start:stop]
        )
    index.close()  # flushes: every sealed bucket is durable; the mutable bucket is not
    yield path, data
    shutil.rmtree(path, ignore_errors=True)


def _reopen(path: Path, now_ms: int) -> int:
    index = DelayIndex.open(FileStorage(path), "bench", clock=ManualClock(now_ms))
    tracked = len(index)
    index.close()
    return tracked


def _replay_in_memory(data: Any) -> int:
    tracker = InMemoryTracker(clock=ManualClock(data.now_ms))
    tracker.add_many(data.ledgers, data.entries, data.deliver_at)
    return len(tracker)


def _replay_in_memory_each(data: Any) -> int:
    tracker = InMemoryTracker(clock=ManualClock(data.now_ms))
    add = tracker.add
    for ledger_id, entry_id, deliver_at in zip(
        data.ledger_list, data.entry_list, data.deliver_list, strict=True
    ):
        add(ledger_id, entry_id, deliver_at)
    return len(tracker)


def _replay_heapq(data: Any, make_tracker: Any) -> int:
    tracker = make_tracker("heapq", ManualClock(data.now_ms))
    add = tracker.add
    for ledger_id, entry_id, deliver_at in zip(
        data.ledger_list, data.entry_list, data.deliver_list, strict=True
    ):
        add(ledger_id, entry_id, deliver_at)
    return len(tracker)


REOPEN_KINDS = [
    "delay_index-reopen",
    "in_memory-replay-add_many",
    "in_memory-replay-add",
    "heapq-replay",
]
REOPEN_LABELS = {
    "delay_index-reopen": "DelayIndex.open (FileStorage)",
    "in_memory-replay-add_many": "replay into InMemoryTracker.add_many",
    "in_memory-replay-add": "replay into InMemoryTracker.add (per message)",
    "heapq-replay": "replay into heapq+set",
}


@pytest.mark.parametrize("kind", REOPEN_KINDS)
def test_reopen(
    benchmark: Any,
    reopen_store: tuple[Path, Any],
    max_size_id: str,
    make_tracker: Any,
    kind: str,
    request: pytest.FixtureRequest,
) -> None:
    path, data = reopen_store
    benchmark.group = f"reopen-{max_size_id}"
    benchmark.extra_info["label"] = REOPEN_LABELS[kind]
    times = request.config.stash.setdefault(_REOPEN_KEY, {})
    if kind == "delay_index-reopen":
        tracked = benchmark.pedantic(_reopen, args=(path, data.now_ms), rounds=3, iterations=1)
        # Everything but the never-persisted last mutable bucket (one bucket's worth plus at
        # most one ledger) comes back.
        assert len(data) - 51_000 <= tracked <= len(data)
        benchmark.extra_info["recovered"] = tracked
        times[kind] = benchmark.stats.stats.min
        return
    if kind == "heapq-replay":
        tracked = benchmark.pedantic(
            _replay_heapq, args=(data, make_tracker), rounds=1, iterations=1
        )
    else:
        target = _replay_in_memory if kind.endswith("add_many") else _replay_in_memory_each
        tracked = benchmark.pedantic(target, args=(data,), rounds=3, iterations=1)
    assert tracked == len(data)
    if "delay_index-reopen" in times:
        ratio = benchmark.stats.stats.min / times["delay_index-reopen"]
        benchmark.extra_info["reopen_speedup"] = round(ratio, 1)
        # A dispatcher replays its backlog message by message as it re-reads it: the per-call
        # replay is the bar (>= 10x from 10 M messages; small indexes are fixed-cost bound).
        if kind == "in_memory-replay-add" and len(data) >= ACCEPTANCE_SIZE:
            assert ratio >= 10, f"reopen is only {ratio:.1f}x faster than a replay"


_REOPEN_KEY = pytest.StashKey[dict[str, float]]()


def _timed_adds(tracker: Any, data: Any) -> dict[str, Any]:
    """Per-call add of every message, timing each call; returns latency figures.

    Rows are converted to Python ints 4096 at a time, as a dispatcher reading its topic would
    hold them: a process that kept the whole backlog as 30 M Python objects would make every
    full garbage collection (whoever triggers it) walk them, which measures the input, not the
    tracker.
    """
    add = tracker.add
    clock = time.perf_counter_ns
    latencies = np.empty(len(data), dtype=np.int64)
    i = 0
    for row in range(0, len(data), STREAM_ROWS):
        chunk = slice(row, row + STREAM_ROWS)
        for ledger_id, entry_id, deliver_at in zip(
            data.ledgers[chunk].tolist(),
            data.entries[chunk].tolist(),
            data.deliver_at[chunk].tolist(),
            strict=True,
        ):
            start = clock()
            add(ledger_id, entry_id, deliver_at)
            latencies[i] = clock() - start
            i += 1
    return {
        "max_add_ms": round(float(latencies.max()) / 1e6, 3),
        "p9999_add_ms": round(float(np.percentile(latencies, 99.99)) / 1e6, 3),
        "adds_over_5ms": int((latencies > 5_000_000).sum()),
    }


@pytest.mark.parametrize("kind", ["delay_index", "in_memory", "heapq"])
def test_seal_latency(
    benchmark: Any, delayed_cache: Any, max_size: int, max_size_id: str, make_tracker: Any,
    kind: str,
) -> None:  # fmt: skip
    data = delayed_cache(max_size)
    benchmark.group = f"seal-latency-{max_size_id}"
    benchmark.extra_info["label"] = {
        "delay_index": "DelayIndex (default settings, FileStorage)",
        "in_memory": "InMemoryTracker",
        "heapq": "heapq+set",
    }[kind]
    made: list[Any] = []

    def setup() -> tuple[tuple[Any, ...], dict[str, Any]]:
        tracker = make_tracker(kind, wall_clock_ms)
        made.append(tracker)
        return (tracker, data), {}

    figures = benchmark.pedantic(_timed_adds, setup=setup, rounds=1, iterations=1)
    tracker = made[-1]
    assert len(tracker) == len(data)
    benchmark.extra_info.update(figures)
    if isinstance(tracker, DelayIndex):
        tracker.flush()
        stats = tracker.stats()
        benchmark.extra_info["seals"] = stats["ops"]["create"]["succeeded"]
        benchmark.extra_info["merges"] = stats["ops"]["merge"]["succeeded"]
        tracker.close()
