"""Tracker benchmarks: ``DelayIndex`` and ``InMemoryTracker`` against ``heapq`` + ``set``.

Inputs are the first ``n`` delayed messages of the realistic workload
(``delayindex.workload.generate``: 1000 entries per ledger, half the messages delayed, delays
70 % 1-60 s, 25 % 1-60 min, 5 % 1-10 days), with deliver times shifted more than a day past the
session's start so that every message is tracked. The baseline is
``baselines.HeapqSetTracker``: same API subset, same semantics, same lock discipline.
``DelayIndex`` runs with default settings (50 000-index buckets, 5 000-index segments, 50
buckets before merging) on a FileStorage in a fresh temporary directory, with its background
executor: sealing, encoding, writing and merging happen during the timed adds, as in
production. Its poll and contains groups are prefilled with ``add_many`` and ``flush()``: the
sealed buckets are durable, so the drain loads every later segment from disk.

Groups (``<n>`` from ``--bench-sizes``):

``tracker-add-<n>``
    Per-call ``add`` of all ``n`` messages into a fresh tracker using the (native) wall clock.
``tracker-add-many-<n>``
    ``InMemoryTracker.add_many`` on the int64 arrays; the baseline (which has no batch API) is
    per-call ``HeapqSetTracker.add`` again.
``tracker-poll-<n>``
    A tracker prefilled in the (untimed) setup with a ``ManualClock``; timed: move the clock
    past the last deliver time and ``poll(1000)`` until empty. All ``n`` must come out.
``tracker-contains-<n>``
    A prefilled tracker; timed: ``contains`` for every tracked position (all hits).

Every timed loop is the same plain ``for`` loop over pre-converted Python lists for both
trackers. Run::

    pytest benchmarks/bench_tracker.py --benchmark-enable
"""

from __future__ import annotations

from typing import Any

import pytest

from delayindex import ManualClock, wall_clock_ms

BATCH = 1000
ROUNDS = 3

#: Benchmarked tracker kinds (see conftest.TRACKER_FACTORIES); "heapq" is the baseline.
KINDS = ["delay_index", "in_memory", "heapq"]
LABELS = {"delay_index": "DelayIndex", "in_memory": "InMemoryTracker", "heapq": "heapq+set"}


def _close(tracker: Any) -> None:
    if hasattr(tracker, "flush"):
        tracker.flush()
        tracker.close()


def _add_each(tracker: Any, ledgers: list[int], entries: list[int], deliver_ats: list[int]) -> Any:
    add = tracker.add
    for ledger_id, entry_id, deliver_at in zip(ledgers, entries, deliver_ats, strict=True):
        add(ledger_id, entry_id, deliver_at)
    return tracker  # freed after the timer stops


def _add_many(tracker: Any, ledgers: Any, entries: Any, deliver_ats: Any) -> Any:
    tracker.add_many(ledgers, entries, deliver_ats)
    return tracker


def _drain(tracker: Any, clock: ManualClock, far_future_ms: int) -> tuple[int, int]:
    clock.set(far_future_ms)
    polled = 0
    while batch := tracker.poll(BATCH):
        polled += len(batch)
    return polled, len(tracker)


def _contains_each(tracker: Any, ledgers: list[int], entries: list[int]) -> int:
    contains = tracker.contains
    hits = 0
    for ledger_id, entry_id in zip(ledgers, entries, strict=True):
        if contains(ledger_id, entry_id):
            hits += 1
    return hits


@pytest.mark.parametrize("kind", KINDS)
def test_add(benchmark: Any, delayed: Any, size_id: str, make_tracker: Any, kind: str) -> None:
    benchmark.group = f"tracker-add-{size_id}"
    benchmark.extra_info["label"] = LABELS[kind]

    def setup() -> tuple[tuple[Any, ...], dict[str, Any]]:
        tracker = make_tracker(kind, wall_clock_ms)
        return (tracker, delayed.ledger_list, delayed.entry_list, delayed.deliver_list), {}

    tracker = benchmark.pedantic(_add_each, setup=setup, rounds=ROUNDS, iterations=1)
    assert len(tracker) == len(delayed)
    _close(tracker)


@pytest.mark.parametrize("kind", KINDS)
def test_add_many(benchmark: Any, delayed: Any, size_id: str, make_tracker: Any, kind: str) -> None:
    benchmark.group = f"tracker-add-many-{size_id}"
    if kind != "heapq":
        benchmark.extra_info["label"] = f"{LABELS[kind]}.add_many"
        target: Any = _add_many
        columns = (delayed.ledgers, delayed.entries, delayed.deliver_at)
    else:
        benchmark.extra_info["label"] = f"{LABELS[kind]} per-call add"
        target = _add_each
        columns = (delayed.ledger_list, delayed.entry_list, delayed.deliver_list)

    def setup() -> tuple[tuple[Any, ...], dict[str, Any]]:
        return (make_tracker(kind, wall_clock_ms), *columns), {}

    tracker = benchmark.pedantic(target, setup=setup, rounds=ROUNDS, iterations=1)
    assert len(tracker) == len(delayed)
    _close(tracker)


@pytest.mark.parametrize("kind", KINDS)
def test_poll(
    benchmark: Any, delayed: Any, size_id: str, make_tracker: Any, prefill: Any, kind: str
) -> None:
    benchmark.group = f"tracker-poll-{size_id}"
    benchmark.extra_info["label"] = LABELS[kind]

    def setup() -> tuple[tuple[Any, ...], dict[str, Any]]:
        clock = ManualClock(delayed.now_ms)
        tracker = make_tracker(kind, clock)
        prefill(tracker, delayed)
        return (tracker, clock, delayed.far_future_ms), {}

    polled, left = benchmark.pedantic(_drain, setup=setup, rounds=ROUNDS, iterations=1)
    assert (polled, left) == (len(delayed), 0)


@pytest.mark.parametrize("kind", KINDS)
def test_contains(
    benchmark: Any,
    delayed: Any,
    size_id: str,
    make_tracker: Any,
    prefill: Any,
    manual_clock: ManualClock,
    kind: str,
) -> None:
    benchmark.group = f"tracker-contains-{size_id}"
    benchmark.extra_info["label"] = LABELS[kind]
    tracker = make_tracker(kind, manual_clock)
    prefill(tracker, delayed)

    hits = benchmark.pedantic(
        _contains_each,
        args=(tracker, delayed.ledger_list, delayed.entry_list),
        rounds=ROUNDS,
        iterations=1,
    )
    assert hits == len(delayed)
    _close(tracker)
