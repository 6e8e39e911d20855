"""DelayIndex benchmarks that have no in-memory counterpart: reopen versus replay, seal latency.

Inputs: the first ``n`` delayed messages of the gen-dump workload (``n`` = the largest size of
the tier or of ``--bench-sizes``; the full tier reaches the acceptance size 1e7), shifted a day
into the future so all of them are tracked.

``reopen-<n>``
    Setup (untimed, once per session): a DelayIndex with default settings on FileStorage ingests
    the ``n`` messages with ``add_many``, flushes and closes. Timed: ``DelayIndex.open`` of that
    store, ``len`` and ``close``, native and on the pure build. Recovery reads each bucket's
    metadata columns and no segment (each is read when due); the positions are restored by
    the first call that needs them, a bucket at a time (``tracker/_lazy_restore.py``), so
    ``extra_info["first_call_s"]`` is what an open and a first ``contains`` take (best of
    three, untimed by the benchmark), ``extra_info["restore_s"]`` the part of it that call
    paid (one bucket's restore) and ``extra_info["all_restored_s"]`` the time until the
    background job that call queued has restored every other bucket too. Compared, in the
    same group, with what a restart costs without snapshots: replaying the same messages into
    ``InMemoryTracker`` per message (``add``, as a dispatcher re-reading its backlog does) and
    in batches (``add_many``, native and pure build), and into the heapq (reference) and
    SortedList baselines. Each
    replay's ``extra_info["reopen_speedup"]`` is its time over the native reopen's. From 10 M
    messages on, the reopen must be at least 10x faster than the per-message replay (asserted;
    smaller indexes are dominated by fixed costs). The replays leave out re-reading the messages
    from the topic, which a real replay also pays. Redis has no row: its restart is a server
    reload, not something this process does.
``seal-latency-<n>``
    Sustained per-call ``add`` of the ``n`` messages at default settings (a seal every 50 000
    indexes, background encoding, writing and merging) with the wall clock. Each call is timed;
    ``extra_info`` reports the longest call (``max_add_ms``), the 99.99th percentile and the
    seal count. InMemoryTracker (native and pure), DelayIndex on the pure build, heapq and
    SortedList run the same loop for comparison (their longest calls are heap reallocations and
    GC pauses); the benchmark's time is the whole timed loop. Rows are streamed from the int64
    arrays 4096 at a time, as a dispatcher reading its topic holds them.
``fill-scaling-<n>``
    ``add_many`` + ``flush`` of ``n`` messages against ``n / 10`` (before and after), each in a
    fresh process (``scale_probe.py``), on each build: ``extra_info["ratio"]`` (linear: 10; the
    pure build's bar at 1e7: 12) and each thread's CPU seconds.

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
from support import KIND_LABELS, record, record_rate, rounds_for, run_probe, slowed

from delayindex import DelayIndex, FileStorage, InMemoryTracker, ManualClock

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


def _reopen_then_contains(path: Path, data: Any) -> tuple[float, float, float]:
    """Seconds to open the store; to open it and answer a first ``contains`` (which restores
    one bucket); and until the background job has restored the others too."""
    started = time.perf_counter()
    index = DelayIndex.open(FileStorage(path), "bench", clock=ManualClock(data.now_ms))
    opened = time.perf_counter() - started
    assert index.contains(int(data.ledgers[0]), int(data.entries[0]))
    answered = time.perf_counter() - started
    index.flush()  # waits for the background restore
    restored = time.perf_counter() - started
    index.close()
    return opened, answered, restored


def _replay_in_memory(data: Any) -> int:
    tracker = InMemoryTracker(clock=ManualClock(data.now_ms))
    tracker.add_many(data.ledgers, data.entries, data.deliver_at)
    return len(tracker)


def _replay_each(tracker: Any, data: Any) -> int:
    add = tracker.add
    for ledger_id, entry_id, deliver_at in zip(
        data.ledger_list, data.entry_list, data.deliver_list, strict=True
    ):
        add(ledger_id, entry_id, deliver_at)
    return len(tracker)


#: (kind, mode, label) of the reopen group's rows; heapq is the reference.
REOPEN_ROWS = [
    ("delay_index", "reopen", "DelayIndex.open (FileStorage)"),
    ("delay_index-pure", "reopen", "DelayIndex.open (FileStorage, pure build)"),
    ("in_memory", "replay-add_many", "replay into InMemoryTracker.add_many"),
    ("in_memory", "replay-add", "replay into InMemoryTracker.add (per message)"),
    ("in_memory-pure", "replay-add_many", "replay into InMemoryTracker.add_many (pure build)"),
    ("heapq", "replay", "replay into heapq+set"),
    ("sortedlist", "replay", "replay into SortedList+set"),
]


@pytest.mark.parametrize(
    ("kind", "mode", "label"), REOPEN_ROWS, ids=[f"{k}-{m}" for k, m, _ in REOPEN_ROWS]
)
def test_reopen(
    benchmark: Any,
    reopen_store: tuple[Path, Any],
    max_size_id: str,
    env: Any,
    kind: str,
    mode: str,
    label: str,
    request: pytest.FixtureRequest,
) -> None:
    path, data = reopen_store
    record(benchmark, f"reopen-{max_size_id}", kind, label, size=len(data))
    times = request.config.stash.setdefault(_REOPEN_KEY, {})
    rounds = rounds_for(len(data), kind)
    if mode == "reopen":
        # A reopen at 1e5 takes milliseconds of file reads: a short write-back stall of the
        # file system slowed all of three rounds once (x1.6); fifteen rounds ride it out.
        reopen_rounds = 15 if len(data) < 1_000_000 else 3
        tracked = benchmark.pedantic(
            slowed(kind, _reopen), args=(path, data.now_ms), rounds=reopen_rounds, iterations=1
        )
        # Everything but the never-persisted last mutable bucket (one bucket's worth plus at
        # most one ledger) comes back.
        assert len(data) - 51_000 <= tracked <= len(data)
        benchmark.extra_info["recovered"] = tracked
        first = [_reopen_then_contains(path, data) for _ in range(3)]
        benchmark.extra_info["first_call_s"] = round(min(f[1] for f in first), 4)
        benchmark.extra_info["restore_s"] = round(min(f[1] - f[0] for f in first), 4)
        benchmark.extra_info["all_restored_s"] = round(min(f[2] for f in first), 4)
        if kind == "delay_index":
            times["reopen"] = benchmark.stats.stats.min
        return
    if mode == "replay-add_many":
        tracked = benchmark.pedantic(
            slowed(kind, _replay_in_memory), args=(data,), rounds=rounds, iterations=1
        )
    else:

        def setup() -> tuple[tuple[Any, ...], dict[str, Any]]:
            return (env.make(kind, ManualClock(data.now_ms)), data), {}

        tracked = benchmark.pedantic(
            slowed(kind, _replay_each), setup=setup, rounds=rounds, iterations=1
        )
    record_rate(benchmark, len(data))
    assert tracked == len(data)
    if "reopen" in times:
        ratio = benchmark.stats.stats.min / times["reopen"]
        benchmark.extra_info["reopen_speedup"] = round(ratio, 1)
        # A dispatcher replays its backlog message by message as it re-reads it: the per-call
        # replay is the bar (>= 10x from 10 M messages; small indexes are fixed-cost bound).
        if mode == "replay-add" and len(data) >= ACCEPTANCE_SIZE:
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


SEAL_KINDS = ["delay_index", "delay_index-pure", "in_memory", "in_memory-pure", "heapq",
              "sortedlist"]  # fmt: skip


@pytest.mark.parametrize("kind", SEAL_KINDS)
def test_seal_latency(
    benchmark: Any, delayed_cache: Any, max_size: int, max_size_id: str, env: Any, kind: str
) -> None:
    data = delayed_cache(max_size)
    label = KIND_LABELS[kind]
    if kind.startswith("delay_index"):
        label += " (default settings, FileStorage)"
    record(benchmark, f"seal-latency-{max_size_id}", kind, label, size=len(data))
    made: list[Any] = []

    def setup() -> tuple[tuple[Any, ...], dict[str, Any]]:
        made.append(env.make(kind))
        return (made[-1], data), {}

    figures = benchmark.pedantic(
        slowed(kind, _timed_adds), setup=setup, rounds=rounds_for(len(data), kind), iterations=1
    )
    record_rate(benchmark, len(data))
    tracker = made[-1]
    assert len(tracker) == len(data)
    benchmark.extra_info.update(figures)
    if isinstance(tracker, DelayIndex):
        tracker.flush()
        stats = tracker.stats()
        benchmark.extra_info["seals"] = stats["ops"]["create"]["succeeded"]
        benchmark.extra_info["merges"] = stats["ops"]["merge"]["succeeded"]


SCALE_PROBE = "import runpy; runpy.run_module('scale_probe', run_name='__main__')"
#: Issue 18 item 5: the pure build's fill of 10x the messages within this many times the time.
SCALE_BAR = 12.0


@pytest.mark.parametrize("build", ["pure", "native"])
def test_fill_scaling(benchmark: Any, max_size: int, max_size_id: str, build: str) -> None:
    """``fill-scaling-<n>``: ``add_many`` + ``flush`` of n messages against n / 10, each in a
    fresh process (``scale_probe.py``; FileStorage, default settings, the writer's seals,
    snapshots and merges included). The small fill runs before and after the large one and
    their mean is the baseline, so a drift of the machine's speed shows on both sides.
    ``extra_info["ratio"]`` is the large fill's time over the small one's (linear: 10; the bar
    for the pure build at 1e7: 12); the time is the three probes' run."""
    pure = build == "pure"
    large, small = max_size, max(max_size // 10, 1)
    kind = "delay_index-pure" if pure else "delay_index"
    record(benchmark, f"fill-scaling-{max_size_id}", kind,
           f"{KIND_LABELS[kind]}: add_many + flush of n against n/10", size=large,
           ungated="three probes' run; the figure is the ratio in extra_info")  # fmt: skip

    def run() -> list[dict[str, Any]]:
        return [run_probe(SCALE_PROBE, [str(n)], pure=pure) for n in (small, large, small)]

    before, big, after = benchmark.pedantic(run, rounds=1, iterations=1)
    assert (before["tracked"], big["tracked"], after["tracked"]) == (small, large, small)
    baseline = (before["seconds"] + after["seconds"]) / 2
    info = benchmark.extra_info
    info["small_s"] = [round(before["seconds"], 3), round(after["seconds"], 3)]
    info["large_s"] = round(big["seconds"], 3)
    info["ratio"] = round(big["seconds"] / baseline, 2)
    info["bar"] = SCALE_BAR if pure else None
    info["large_cpu_s"] = {"main": big["main_cpu_s"], "writer": big["writer_cpu_s"]}
    info["large_flush_s"] = round(big["flush_s"], 3)
