"""Cancel and browse benchmarks: ``DelayIndex`` (prefilled with ``add_many`` and ``flush()``: its
sealed buckets are durable on FileStorage, so a browse reads their unloaded segments) and
``InMemoryTracker`` (native and pure build) against ``heapq`` +
``set`` and ``SortedList`` + ``set``, whose ``cancel`` removes the position from the set and
lets ``poll`` skip its node lazily (the cheapest correct cancel those structures allow).

Inputs are the tracker benchmarks' delayed messages (``bench_tracker.py``). Groups (``<n>`` from
the tier or ``--bench-sizes``):

``cancel-<n>``
    A prefilled tracker (untimed setup); timed: per-call ``cancel`` of every second message
    (``n / 2`` calls, all hits). The rate is cancels per second.
``cancel-many-<n>``
    The same half cancelled with ``cancel_many`` on int64 arrays of 1000 positions per call;
    the baselines, which have no batch call, cancel per call.
``due-histogram-<n>``
    A prefilled tracker; timed: ``due_histogram`` with 100 equal bins over the whole range of
    deliver times (exact counts; the baselines scan their structure and skip untracked nodes).

Run::

    pytest benchmarks/bench_cancel.py --benchmark-enable
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from support import record, record_rate, rounds_for, slowed

from delayindex import ManualClock

CANCEL_KINDS = ["delay_index", "in_memory", "in_memory-pure", "heapq", "sortedlist"]
BATCH = 1000
BINS = 100


def _cancel_each(tracker: Any, ledgers: list[int], entries: list[int]) -> int:
    cancel = tracker.cancel
    hits = 0
    for ledger_id, entry_id in zip(ledgers, entries, strict=True):
        hits += cancel(ledger_id, entry_id)
    return hits


def _cancel_batches(tracker: Any, ledgers: Any, entries: Any) -> int:
    hits = 0
    for start in range(0, len(ledgers), BATCH):
        hits += int(
            tracker.cancel_many(
                ledgers[start : start + BATCH], entries[start : start + BATCH]
            ).sum()
        )
    return hits


def _half(delayed: Any) -> tuple[Any, Any]:
    return delayed.ledgers[::2].copy(), delayed.entries[::2].copy()


@pytest.mark.parametrize("kind", CANCEL_KINDS)
def test_cancel(
    benchmark: Any, delayed: Any, size_id: str, env: Any, prefill: Any, kind: str
) -> None:
    record(benchmark, f"cancel-{size_id}", kind, size=len(delayed))
    ledgers, entries = _half(delayed)
    ledger_list, entry_list = ledgers.tolist(), entries.tolist()

    def setup() -> tuple[tuple[Any, ...], dict[str, Any]]:
        tracker = env.make(kind, ManualClock(delayed.now_ms))
        prefill(tracker, delayed)
        return (tracker, ledger_list, entry_list), {}

    hits = benchmark.pedantic(
        slowed(kind, _cancel_each),
        setup=setup,
        rounds=rounds_for(len(delayed), kind),
        iterations=1,
    )
    record_rate(benchmark, len(ledger_list))
    assert hits == len(ledger_list)


@pytest.mark.parametrize("kind", CANCEL_KINDS)
def test_cancel_many(
    benchmark: Any, delayed: Any, size_id: str, env: Any, prefill: Any, kind: str
) -> None:
    batched = kind.startswith(("in_memory", "delay_index"))
    label = None if batched else f"{kind} per-call cancel (no batch call)"
    record(benchmark, f"cancel-many-{size_id}", kind, label, size=len(delayed))
    ledgers, entries = _half(delayed)
    args: tuple[Any, Any] = (ledgers, entries) if batched else (ledgers.tolist(), entries.tolist())

    def setup() -> tuple[tuple[Any, ...], dict[str, Any]]:
        tracker = env.make(kind, ManualClock(delayed.now_ms))
        prefill(tracker, delayed)
        return (tracker, *args), {}

    target = _cancel_batches if batched else _cancel_each
    hits = benchmark.pedantic(
        slowed(kind, target), setup=setup, rounds=rounds_for(len(delayed), kind), iterations=1
    )
    record_rate(benchmark, len(ledgers))
    assert hits == len(ledgers)


@pytest.mark.parametrize("kind", CANCEL_KINDS)
def test_due_histogram(
    benchmark: Any, delayed: Any, size_id: str, env: Any, prefill: Any, kind: str
) -> None:
    record(benchmark, f"due-histogram-{size_id}", kind, size=len(delayed), bins=BINS)
    tracker = env.make(kind, ManualClock(delayed.now_ms))
    prefill(tracker, delayed)
    edges = np.linspace(
        int(delayed.deliver_at.min()), int(delayed.deliver_at.max()) + 1, BINS + 1
    ).astype(np.int64)
    edges = np.unique(edges)
    counts = benchmark.pedantic(
        slowed(kind, tracker.due_histogram),
        args=(edges,),
        rounds=rounds_for(len(delayed), kind),
        iterations=1,
    )
    assert int(counts.sum()) == len(delayed)
