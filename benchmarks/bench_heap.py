"""Heap benchmarks: delayindex's ``TripleHeap`` (native and pure) against ``heapq``, a
``SortedList`` and the whole ``InMemoryTracker`` doing the same pushes and pops.

Groups (``<n>`` from the tier or ``--bench-sizes``, e.g. ``1e5``):

``heap-push-pop-<n>``
    Per-call API: push ``n`` random ``(time, ledger, entry)`` triples one call at a time into a
    fresh structure, then pop all of them, collecting what comes out in a list. Rows:
    ``TripleHeap`` (native Cython, kind ``triple_heap``), ``PureTripleHeap`` (the pure-Python
    twin, ``triple_heap-pure``), the reference ``heapq.heappush``/``heappop`` on a list of
    tuples, ``SortedList.add``/``pop(0)``, and ``InMemoryTracker`` (native and pure build)
    with ``add`` then ``poll(1)`` per message on a manual clock (strict mode): the cost of a
    whole deduplicating tracker over a bare heap. Times are random in ``[1, 1e12)``, ledgers in
    ``[0, 1e5)``, entries ``arange(n)``; every row gets the same pre-converted Python lists.
``heap-batch-<largest n>``
    Batch API: ``push_many`` of the int64 arrays, then ``pop_due(cutoff, 1000)`` until empty
    (native and pure), against ``heapq`` (``list(zip(...))`` + ``heapify``, then popping batches
    of at most 1000 heads with ``time <= cutoff``), ``SortedList`` (built from the tuples, then
    slices of 1000 cut off the front) and ``InMemoryTracker.add_many`` + ``poll(1000)``.

Redis has no row here: a heap microbenchmark over a network round trip measures the network;
the tracker groups have the Redis rows.

Every round starts from a fresh structure made by the pedantic ``setup`` (not timed); the popped
output is returned so that freeing it is not timed either, and the last round's output is
checked against the sorted triples outside the timed region.

Run::

    pytest benchmarks/bench_heap.py --benchmark-enable
"""

from __future__ import annotations

from heapq import heapify, heappop, heappush
from typing import Any

import numpy as np
import pytest
from sortedcontainers import SortedList
from support import record, record_rate, rounds_for, slowed

from delayindex import InMemoryTracker, ManualClock, TrackerConfig
from delayindex._impl import NATIVE, PureTripleHeap, TripleHeap

BATCH = 1000
STRICT = TrackerConfig(tick_ms=0, strict=True)
HEAPS: dict[str, Any] = {"triple_heap": TripleHeap, "triple_heap-pure": PureTripleHeap}
PUSH_POP_KINDS = ["triple_heap", "triple_heap-pure", "heapq", "sortedlist", "in_memory",
                  "in_memory-pure"]  # fmt: skip


def _push_pop_triple_heap(
    heap: Any, times: list[int], ledgers: list[int], entries: list[int]
) -> list[tuple[int, int, int]]:
    push = heap.push
    for time, ledger, entry in zip(times, ledgers, entries, strict=True):
        push(time, ledger, entry)
    pop = heap.pop
    return [pop() for _ in range(len(times))]


def _push_pop_heapq(
    heap: list[tuple[int, int, int]], times: list[int], ledgers: list[int], entries: list[int]
) -> list[tuple[int, int, int]]:
    for triple in zip(times, ledgers, entries, strict=True):
        heappush(heap, triple)
    return [heappop(heap) for _ in range(len(times))]


def _push_pop_sortedlist(
    items: SortedList, times: list[int], ledgers: list[int], entries: list[int]
) -> list[tuple[int, int, int]]:
    add = items.add
    for triple in zip(times, ledgers, entries, strict=True):
        add(triple)
    pop = items.pop
    return [pop(0) for _ in range(len(times))]


def _push_pop_tracker(
    tracker: Any, clock: ManualClock, times: list[int], ledgers: list[int], entries: list[int]
) -> list[tuple[int, int]]:
    add = tracker.add
    for time, ledger, entry in zip(times, ledgers, entries, strict=True):
        add(ledger, entry, time)
    clock.set(10**12)
    poll = tracker.poll
    return [poll(1)[0] for _ in range(len(times))]


@pytest.mark.parametrize("kind", PUSH_POP_KINDS)
def test_push_pop(benchmark: Any, triples: Any, size_id: str, env: Any, kind: str) -> None:
    if kind == "triple_heap" and not NATIVE:
        pytest.skip("native extension not in use (DELAYINDEX_NO_EXTENSIONS or no build)")
    record(benchmark, f"heap-push-pop-{size_id}", kind, size=len(triples))
    columns = (triples.time_list, triples.ledger_list, triples.entry_list)
    target: Any
    if kind in HEAPS:
        heap_class = HEAPS[kind]
        target = _push_pop_triple_heap

        def setup() -> tuple[tuple[Any, ...], dict[str, Any]]:
            return (heap_class(), *columns), {}
    elif kind == "heapq":
        target = _push_pop_heapq

        def setup() -> tuple[tuple[Any, ...], dict[str, Any]]:
            return ([], *columns), {}
    elif kind == "sortedlist":
        target = _push_pop_sortedlist

        def setup() -> tuple[tuple[Any, ...], dict[str, Any]]:
            return (SortedList(), *columns), {}
    else:
        benchmark.extra_info["label"] += " add + poll(1)"
        target = _push_pop_tracker

        def setup() -> tuple[tuple[Any, ...], dict[str, Any]]:
            clock = ManualClock(0)
            return (InMemoryTracker(STRICT, clock=clock), clock, *columns), {}

    popped = benchmark.pedantic(
        slowed(kind, target), setup=setup, rounds=rounds_for(len(triples), kind), iterations=1
    )
    record_rate(benchmark, len(triples))
    if kind.startswith("in_memory"):
        assert popped == [(ledger, entry) for _, ledger, entry in triples.expected]
    else:
        assert popped == triples.expected


# -- batch API --------------------------------------------------------------------------------


def _batch_triple_heap(
    heap: Any, times: np.ndarray, ledgers: np.ndarray, entries: np.ndarray, cutoff: int
) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    heap.push_many(times, ledgers, entries)
    batches = []
    while heap:
        batches.append(heap.pop_due(cutoff, BATCH))
    return batches


def _batch_heapq(
    times: list[int], ledgers: list[int], entries: list[int], cutoff: int
) -> list[list[tuple[int, int, int]]]:
    heap = list(zip(times, ledgers, entries, strict=True))
    heapify(heap)
    batches = []
    while heap and heap[0][0] <= cutoff:
        batch = []
        while len(batch) < BATCH and heap and heap[0][0] <= cutoff:
            batch.append(heappop(heap))
        batches.append(batch)
    return batches


def _batch_sortedlist(
    times: list[int], ledgers: list[int], entries: list[int], cutoff: int
) -> list[list[tuple[int, int, int]]]:
    items = SortedList(zip(times, ledgers, entries, strict=True))
    batches = []
    while items and items[0][0] <= cutoff:
        stop = min(BATCH, items.bisect_right((cutoff, 2**63, 2**63)))
        batches.append(list(items.islice(0, stop)))
        del items[:stop]
    return batches


def _batch_tracker(
    tracker: Any, clock: ManualClock, times: np.ndarray, ledgers: np.ndarray,
    entries: np.ndarray, cutoff: int,
) -> list[list[tuple[int, int]]]:  # fmt: skip
    tracker.add_many(ledgers, entries, times)
    clock.set(cutoff)
    batches = []
    while batch := tracker.poll(BATCH):
        batches.append(batch)
    return batches


BATCH_KINDS = ["triple_heap", "triple_heap-pure", "heapq", "sortedlist", "in_memory",
               "in_memory-pure"]  # fmt: skip
BATCH_LABELS = {
    "triple_heap": "TripleHeap push_many + pop_due",
    "triple_heap-pure": "TripleHeap (pure) push_many + pop_due",
    "heapq": "heapq heapify + heappop",
    "sortedlist": "SortedList + slices",
    "in_memory": "InMemoryTracker add_many + poll(1000)",
    "in_memory-pure": "InMemoryTracker (pure build) add_many + poll(1000)",
}


@pytest.fixture
def batch_triples(triples_cache: Any, max_size: int) -> Any:
    return triples_cache(max_size)


@pytest.mark.parametrize("kind", BATCH_KINDS)
def test_batch(benchmark: Any, batch_triples: Any, max_size_id: str, env: Any, kind: str) -> None:
    if kind == "triple_heap" and not NATIVE:
        pytest.skip("native extension not in use (DELAYINDEX_NO_EXTENSIONS or no build)")
    data = batch_triples
    cutoff = int(data.times.max())
    record(benchmark, f"heap-batch-{max_size_id}", kind, BATCH_LABELS[kind], size=len(data))
    target: Any
    if kind in HEAPS:
        heap_class = HEAPS[kind]
        target = _batch_triple_heap

        def setup() -> tuple[tuple[Any, ...], dict[str, Any]]:
            return (heap_class(), data.times, data.ledgers, data.entries, cutoff), {}
    elif kind in ("heapq", "sortedlist"):
        target = _batch_heapq if kind == "heapq" else _batch_sortedlist

        def setup() -> tuple[tuple[Any, ...], dict[str, Any]]:
            return (data.time_list, data.ledger_list, data.entry_list, cutoff), {}
    else:
        target = _batch_tracker

        def setup() -> tuple[tuple[Any, ...], dict[str, Any]]:
            clock = ManualClock(0)
            tracker = InMemoryTracker(STRICT, clock=clock)
            return (tracker, clock, data.times, data.ledgers, data.entries, cutoff), {}

    batches = benchmark.pedantic(
        slowed(kind, target), setup=setup, rounds=rounds_for(len(data), kind), iterations=1
    )
    record_rate(benchmark, len(data))
    if kind in HEAPS:
        assert all(len(batch[0]) == BATCH for batch in batches[:-1])
        columns = (np.concatenate(column) for column in zip(*batches, strict=True))
        times, ledgers, entries = columns
        got = list(zip(times.tolist(), ledgers.tolist(), entries.tolist(), strict=True))
        assert got == data.expected
    elif kind in ("heapq", "sortedlist"):
        assert all(len(batch) == BATCH for batch in batches[:-1])
        assert [triple for batch in batches for triple in batch] == data.expected
    else:
        # poll returns each batch sorted by position; batches follow deliver-time order.
        assert all(len(batch) == BATCH for batch in batches[:-1])
        expected = [(ledger, entry) for _, ledger, entry in data.expected]
        for i, batch in enumerate(batches):
            assert batch == sorted(expected[i * BATCH : (i + 1) * BATCH])
