"""Heap benchmarks: delayindex's ``TripleHeap`` (native and pure) against raw ``heapq``.

Groups (``<n>`` from ``--bench-sizes``, e.g. ``1e5`` and ``1e6``):

``heap-push-pop-<n>``
    Per-call API: push ``n`` random ``(time, ledger, entry)`` triples one call at a time into a
    fresh heap, then pop all of them, collecting the popped tuples in a list. Compared:
    ``TripleHeap`` (native Cython), ``PureTripleHeap`` (the pure-Python twin) and the baseline
    ``heapq.heappush``/``heappop`` on a list of tuples. Times are random in ``[0, 1e12)``,
    ledgers in ``[0, 1e5)``, entries ``arange(n)``; every variant gets the same triples as
    pre-converted Python lists.
``heap-batch-<largest n>``
    Batch API: native ``push_many`` of the int64 arrays, then ``pop_due(cutoff, 1000)`` until
    empty, against the ``heapq`` equivalent (``list(zip(...))`` + ``heapify``, then popping
    batches of at most 1000 heads with ``time <= cutoff``).

Every round starts from a fresh heap made by the pedantic ``setup`` (not timed); the popped
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

from delayindex._impl import NATIVE, PureTripleHeap, TripleHeap

BATCH = 1000
ROUNDS = 3
#: The pure twin takes several seconds per round at this size and above: one round only.
PURE_ONE_ROUND_FROM = 1_000_000

HEAPS: dict[str, Any] = {"native": TripleHeap, "pure": PureTripleHeap}


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


@pytest.mark.parametrize("impl", ["native", "pure"])
def test_push_pop_triple_heap(benchmark: Any, triples: Any, size_id: str, impl: str) -> None:
    if impl == "native" and not NATIVE:
        pytest.skip("native extension not in use (DELAYINDEX_NO_EXTENSIONS or no build)")
    heap_class = HEAPS[impl]
    benchmark.group = f"heap-push-pop-{size_id}"
    benchmark.extra_info["label"] = impl
    rounds = 1 if impl == "pure" and len(triples) >= PURE_ONE_ROUND_FROM else ROUNDS

    def setup() -> tuple[tuple[Any, ...], dict[str, Any]]:
        return (heap_class(), triples.time_list, triples.ledger_list, triples.entry_list), {}

    popped = benchmark.pedantic(_push_pop_triple_heap, setup=setup, rounds=rounds, iterations=1)
    assert popped == triples.expected


def test_push_pop_heapq(benchmark: Any, triples: Any, size_id: str) -> None:
    benchmark.group = f"heap-push-pop-{size_id}"
    benchmark.extra_info["label"] = "heapq"

    def setup() -> tuple[tuple[Any, ...], dict[str, Any]]:
        return ([], triples.time_list, triples.ledger_list, triples.entry_list), {}

    popped = benchmark.pedantic(_push_pop_heapq, setup=setup, rounds=ROUNDS, iterations=1)
    assert popped == triples.expected


# -- batch API --------------------------------------------------------------------------------


def _batch_native(
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


@pytest.fixture
def batch_triples(triples_cache: Any, max_size: int) -> Any:
    return triples_cache(max_size)


def test_batch_native(benchmark: Any, batch_triples: Any, max_size_id: str) -> None:
    if not NATIVE:
        pytest.skip("native extension not in use (DELAYINDEX_NO_EXTENSIONS or no build)")
    data = batch_triples
    cutoff = int(data.times.max())
    benchmark.group = f"heap-batch-{max_size_id}"
    benchmark.extra_info["label"] = "native"

    def setup() -> tuple[tuple[Any, ...], dict[str, Any]]:
        return (TripleHeap(), data.times, data.ledgers, data.entries, cutoff), {}

    batches = benchmark.pedantic(_batch_native, setup=setup, rounds=ROUNDS, iterations=1)
    assert all(len(batch[0]) == BATCH for batch in batches[:-1])
    times, ledgers, entries = (np.concatenate(column) for column in zip(*batches, strict=True))
    expected = data.expected
    assert len(times) == len(expected)
    assert list(zip(times.tolist(), ledgers.tolist(), entries.tolist(), strict=True)) == expected


def test_batch_heapq(benchmark: Any, batch_triples: Any, max_size_id: str) -> None:
    data = batch_triples
    cutoff = int(data.times.max())
    benchmark.group = f"heap-batch-{max_size_id}"
    benchmark.extra_info["label"] = "heapq"

    def setup() -> tuple[tuple[Any, ...], dict[str, Any]]:
        return (data.time_list, data.ledger_list, data.entry_list, cutoff), {}

    batches = benchmark.pedantic(_batch_heapq, setup=setup, rounds=ROUNDS, iterations=1)
    assert all(len(batch) == BATCH for batch in batches[:-1])
    assert [triple for batch in batches for triple in batch] == data.expected
