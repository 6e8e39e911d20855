"""Tracker benchmarks: ``DelayIndex`` and ``InMemoryTracker`` (native and pure build) against
``heapq`` + ``set``, ``SortedList`` + ``set`` and a Redis ZSET.

Inputs are the first ``n`` delayed messages of the ``gen-dump`` topic
(``delayindex.dump.iter_generated``: 1000 entries per ledger, half the messages delayed, delays
70 % 1-60 s, 25 % 1-60 min, 5 % 1-10 days), with deliver times shifted more than a day past the
session's start so that every message is tracked. The baselines (``baselines.py``) have the same
API subset, the same semantics and the same lock discipline. ``DelayIndex`` runs with default
settings (50 000-index buckets, 5 000-index segments, 50 buckets before merging) on a
FileStorage in a fresh temporary directory, with its background executor: sealing, encoding,
writing and merging happen during the timed adds, as in production. Its poll, contains and
tracked-entries groups are prefilled with ``add_many`` and ``flush()``: the sealed buckets are
durable, so the drain loads every later segment from disk. The ``-pure`` rows run the same code
on the pure-Python build (``support.pure_build``).

Groups (``<n>`` from the tier or ``--bench-sizes``; every row has the same ``n`` messages):

``tracker-add-<n>``
    Per-call ``add`` of all ``n`` messages into a fresh tracker using the wall clock. Redis
    queues ``ZADD NX`` and sends 1000 per round trip (the last batch is sent inside the timer).
``tracker-add-many-<n>``
    ``add_many`` on the int64 arrays (Redis: one ``ZADD`` of 1000 members per command, ten
    commands per round trip); heapq and SortedList, which have no batch API, use per-call
    ``add`` again.
``tracker-poll-<n>``
    A tracker prefilled in the (untimed) setup with a ``ManualClock``; timed: move the clock
    past the last deliver time and ``poll(1000)`` until empty. All ``n`` must come out.
``tracker-contains-<n>``
    A prefilled tracker; timed: ``contains`` for every tracked position (all hits). Redis:
    ``ZMSCORE`` of 1000 positions per command, ten per round trip (one round trip per call
    would measure the network).
``tracker-tracked-entries-<n>``
    A prefilled tracker; timed: what a dispatcher asks before reading a batch of entries:
    ``tracked_entries(ledger, first, first + 99)`` for every window of 100 entries of every
    ledger of the input (the result lists every tracked message exactly once). InMemoryTracker
    has no ``tracked_entries``: its rows call ``contains`` for each entry of the window; heapq
    and SortedList probe their set; Redis sends one ``ZMSCORE`` per window.

The per-call ``add`` and ``contains`` groups also time the *inline* heapq + set loop (kind
``heapq-inline``): the same loop with the dedup and the push (or the membership test) written
in its body, with no call, lock or clock per message: what a dispatcher would write without a
tracker, and the bar of the per-call front (issue 18: ``add`` >= 1.5x, ``contains`` >= 1.2x).
``front-interleaved-<n>`` measures that bar where single rows are too noisy: every tracker's
``add`` and ``contains`` and the inline loops, interleaved round by round in one fresh process
(``percall_probe.py``); the ratios are in ``extra_info["vs_inline"]`` (the row's time is the
probe's run, not gated).

Every timed loop is the same plain ``for`` loop over pre-converted Python lists for every
tracker. Run::

    pytest benchmarks/bench_tracker.py --benchmark-enable
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from support import (
    KIND_LABELS,
    TRACKER_KINDS,
    add_each,
    add_inline,
    contains_each,
    contains_inline,
    record,
    record_rate,
    rounds_for,
    run_probe,
    slowed,
)

from delayindex import ManualClock

BATCH = 1000
#: Entries a dispatcher reads per batch (Pulsar's default dispatcher read batch is 100).
READ_WINDOW = 100


def _add_many(tracker: Any, ledgers: Any, entries: Any, deliver_ats: Any) -> Any:
    tracker.add_many(ledgers, entries, deliver_ats)
    return tracker


def _drain(tracker: Any, clock: ManualClock, far_future_ms: int) -> tuple[int, int]:
    clock.set(far_future_ms)
    polled = 0
    while batch := tracker.poll(BATCH):
        polled += len(batch)
    return polled, len(tracker)


def _contains_many(tracker: Any, ledgers: list[int], entries: list[int]) -> int:
    return int(tracker.contains_many(ledgers, entries))


def _tracked_entries(tracker: Any, windows: list[tuple[int, int, int]]) -> int:
    tracked_entries = tracker.tracked_entries
    found = 0
    for ledger_id, first, last in windows:
        found += len(tracked_entries(ledger_id, first, last))
    return found


def _tracked_by_contains(tracker: Any, windows: list[tuple[int, int, int]]) -> int:
    contains = tracker.contains
    found = 0
    for ledger_id, first, last in windows:
        found += len([entry for entry in range(first, last + 1) if contains(ledger_id, entry)])
    return found


@pytest.mark.parametrize("kind", TRACKER_KINDS)
def test_add(benchmark: Any, delayed: Any, size_id: str, env: Any, kind: str) -> None:
    record(benchmark, f"tracker-add-{size_id}", kind, size=len(delayed))

    def setup() -> tuple[tuple[Any, ...], dict[str, Any]]:
        tracker = env.make(kind)
        return (tracker, delayed.ledger_list, delayed.entry_list, delayed.deliver_list), {}

    rounds = rounds_for(len(delayed), kind)
    tracker = benchmark.pedantic(slowed(kind, add_each), setup=setup, rounds=rounds, iterations=1)
    record_rate(benchmark, len(delayed))
    assert len(tracker) == len(delayed)


@pytest.mark.parametrize("kind", TRACKER_KINDS)
def test_add_many(benchmark: Any, delayed: Any, size_id: str, env: Any, kind: str) -> None:
    group = f"tracker-add-many-{size_id}"
    target: Any
    if kind in ("heapq", "sortedlist"):
        record(benchmark, group, kind, f"{KIND_LABELS[kind]} per-call add", size=len(delayed))
        target = add_each
        columns: tuple[Any, ...] = (delayed.ledger_list, delayed.entry_list, delayed.deliver_list)
    else:
        record(benchmark, group, kind, f"{KIND_LABELS[kind]} add_many", size=len(delayed))
        target = _add_many
        columns = (delayed.ledgers, delayed.entries, delayed.deliver_at)

    def setup() -> tuple[tuple[Any, ...], dict[str, Any]]:
        return (env.make(kind), *columns), {}

    rounds = rounds_for(len(delayed), kind)
    tracker = benchmark.pedantic(slowed(kind, target), setup=setup, rounds=rounds, iterations=1)
    record_rate(benchmark, len(delayed))
    assert len(tracker) == len(delayed)


@pytest.mark.parametrize("kind", TRACKER_KINDS)
def test_poll(
    benchmark: Any, delayed: Any, size_id: str, env: Any, prefill: Any, kind: str
) -> None:
    record(benchmark, f"tracker-poll-{size_id}", kind, size=len(delayed))

    def setup() -> tuple[tuple[Any, ...], dict[str, Any]]:
        clock = ManualClock(delayed.now_ms)
        tracker = env.make(kind, clock)
        prefill(tracker, delayed)
        return (tracker, clock, delayed.far_future_ms), {}

    rounds = rounds_for(len(delayed), kind)
    polled, left = benchmark.pedantic(slowed(kind, _drain), setup=setup, rounds=rounds,
                                      iterations=1)  # fmt: skip
    record_rate(benchmark, len(delayed))
    assert (polled, left) == (len(delayed), 0)


@pytest.mark.parametrize("kind", TRACKER_KINDS)
def test_contains(
    benchmark: Any, delayed: Any, size_id: str, env: Any, prefill: Any, kind: str
) -> None:
    label = "Redis ZMSCORE, 1000 per command" if kind == "redis" else None
    record(benchmark, f"tracker-contains-{size_id}", kind, label, size=len(delayed))
    tracker = env.make(kind, ManualClock(delayed.now_ms))
    prefill(tracker, delayed)
    target = _contains_many if kind == "redis" else contains_each

    hits = benchmark.pedantic(
        slowed(kind, target),
        args=(tracker, delayed.ledger_list, delayed.entry_list),
        rounds=rounds_for(len(delayed), kind),
        iterations=1,
    )
    record_rate(benchmark, len(delayed))
    assert hits == len(delayed)


def test_add_inline_baseline(benchmark: Any, delayed: Any, size_id: str) -> None:
    kind = "heapq-inline"
    record(benchmark, f"tracker-add-{size_id}", kind, size=len(delayed))
    columns = (delayed.ledger_list, delayed.entry_list, delayed.deliver_list)
    heap, positions = benchmark.pedantic(
        slowed(kind, add_inline), args=columns, rounds=rounds_for(len(delayed), kind),
        iterations=1,
    )  # fmt: skip
    record_rate(benchmark, len(delayed))
    assert len(heap) == len(positions) == len(delayed)


def test_contains_inline_baseline(benchmark: Any, delayed: Any, size_id: str) -> None:
    kind = "heapq-inline"
    record(benchmark, f"tracker-contains-{size_id}", kind, size=len(delayed))
    positions = set(zip(delayed.ledger_list, delayed.entry_list, strict=True))
    hits = benchmark.pedantic(
        slowed(kind, contains_inline),
        args=(positions, delayed.ledger_list, delayed.entry_list),
        rounds=rounds_for(len(delayed), kind),
        iterations=1,
    )
    record_rate(benchmark, len(delayed))
    assert hits == len(delayed)


def read_windows(delayed: Any, entries_per_ledger: int = 1000) -> list[tuple[int, int, int]]:
    """``(ledger, first, last)`` for every window of READ_WINDOW entries of every input ledger."""
    ledgers = np.unique(delayed.ledgers).tolist()
    starts = range(0, entries_per_ledger, READ_WINDOW)
    return [(ledger, first, first + READ_WINDOW - 1) for ledger in ledgers for first in starts]


@pytest.mark.parametrize("kind", TRACKER_KINDS)
def test_tracked_entries(
    benchmark: Any, delayed: Any, size_id: str, env: Any, prefill: Any, kind: str
) -> None:
    label = None
    target = _tracked_entries
    if kind.startswith("in_memory"):
        label = f"{KIND_LABELS[kind]} contains per entry"
        target = _tracked_by_contains
    record(benchmark, f"tracker-tracked-entries-{size_id}", kind, label, size=len(delayed),
           window=READ_WINDOW)  # fmt: skip
    tracker = env.make(kind, ManualClock(delayed.now_ms))
    prefill(tracker, delayed)
    windows = read_windows(delayed)
    assert int(delayed.entries.max()) < 1000  # the generator's ledgers hold 1000 entries

    found = benchmark.pedantic(
        slowed(kind, target),
        args=(tracker, windows),
        rounds=rounds_for(len(delayed), kind),
        iterations=1,
    )
    record_rate(benchmark, len(delayed))
    assert found == len(delayed)


PERCALL_PROBE = "import runpy; runpy.run_module('percall_probe', run_name='__main__')"
#: Rounds of each loop in the interleaved probe.
PERCALL_ROUNDS = 7


def test_per_call_interleaved(benchmark: Any, size: int, size_id: str) -> None:
    """The bar of the per-call fronts, trustworthy on a noisy machine: ``add`` and
    ``contains`` of every tracker against the inline loop, interleaved round by round in one
    fresh process (``percall_probe.py``; at most 1e6 messages, the probe times 21 fresh fills).
    The time is the probe's run; the figures are ``extra_info["vs_inline"]``."""
    n = min(size, 1_000_000)
    record(benchmark, f"front-interleaved-{size_id}", None,
           "per-call add/contains of each tracker over the inline loop, interleaved", size=n,
           ungated="a probe's run; its figures are the ratios in vs_inline")  # fmt: skip
    result = benchmark.pedantic(
        run_probe, args=(PERCALL_PROBE, [str(n), str(PERCALL_ROUNDS)]), rounds=1, iterations=1
    )
    benchmark.extra_info["vs_inline"] = result["vs_inline"]
    benchmark.extra_info["best_ms"] = result["best_ms"]
    assert result["n"] == n and all(ratio > 0 for ratio in result["vs_inline"].values())
