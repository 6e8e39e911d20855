"""Baseline trackers and workload helpers shared by the benchmark suite.

This is not a benchmark module: ``conftest.py`` puts this directory on ``sys.path`` and imports
it (with ``--import-mode=importlib`` benchmark modules cannot import each other), and the memory
probe of ``bench_memory.py`` runs :func:`probe_main` in a fresh interpreter.

The baselines are what a careful Python programmer would write instead of using delayindex: a
``heapq`` heap of ``(deliver_at, ledger, entry)`` tuples (or a ``SortedList`` of them) plus a
``set`` of ``(ledger, entry)`` tuples as the dedup index. They implement the subset of the
:class:`delayindex.InMemoryTracker` API that the benchmarks use (``add``, ``contains``, ``poll``
and ``len``) with the same semantics on the benchmark workloads:

* ``add`` returns False (deliver now) when ``deliver_at < 0`` or ``deliver_at <= now + tick``,
  also untracking the position; re-adding a tracked position is a no-op returning True.
* ``poll(n)`` removes up to ``n`` positions with ``deliver_at <= now + tick`` in
  ``(deliver_at, ledger, entry)`` order and returns them sorted by position, as ``Position``
  named tuples, like ``InMemoryTracker.poll``.
* ``len()`` is the number of distinct tracked positions.

Like ``InMemoryTracker``, every mutating or querying method takes a ``threading.Lock``: the real
tracker must be callable from dispatcher, reader and timer threads, so an equivalent baseline
has to pay for the same (uncontended) lock or the comparison would not be fair.

Known simplification (never triggered by the benchmark workloads, whose positions are unique):
a due re-add untracks a position but leaves its old node in the heap; if that position is later
tracked again the old node can deliver it at the old, earlier time. InMemoryTracker purges the
old node instead.
"""

from __future__ import annotations

import gc
import json
import os
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator, Sequence
from heapq import heappop, heappush
from typing import Any

import numpy as np
import numpy.typing as npt
from sortedcontainers import SortedList

from delayindex import DelayIndex, FileStorage, InMemoryTracker, ManualClock, Position
from delayindex._memory import release_free_memory
from delayindex.workload import generate

Int64Array = npt.NDArray[np.int64]
Clock = Callable[[], int]

__all__ = [
    "HeapqSetTracker",
    "SortedListSetTracker",
    "delayed_subset",
    "probe_main",
]


class HeapqSetTracker:
    """``heapq`` of ``(deliver_at, ledger, entry)`` tuples + ``set`` of positions, one lock.

    Args:
        clock: zero-argument callable returning epoch ms (the same one given to the tracker
            it is compared with).
        tick_ms: non-strict cutoff slack, as in ``TrackerConfig.tick_ms``.
    """

    __slots__ = ("_clock", "_heap", "_lock", "_positions", "_tick_ms")

    def __init__(self, clock: Clock, tick_ms: int = 1000) -> None:
        self._clock = clock
        self._tick_ms = tick_ms
        self._heap: list[tuple[int, int, int]] = []
        self._positions: set[tuple[int, int]] = set()
        self._lock = threading.Lock()

    def add(self, ledger_id: int, entry_id: int, deliver_at: int) -> bool:
        """Track the position until ``deliver_at``; False means "deliver it now"."""
        with self._lock:
            position = (ledger_id, entry_id)
            if deliver_at < 0 or deliver_at <= self._clock() + self._tick_ms:
                self._positions.discard(position)
                return False
            if position in self._positions:
                return True
            self._positions.add(position)
            heappush(self._heap, (deliver_at, ledger_id, entry_id))
            return True

    def contains(self, ledger_id: int, entry_id: int) -> bool:
        """Whether the position is tracked and not yet delivered."""
        with self._lock:
            return (ledger_id, entry_id) in self._positions

    def poll(self, max_messages: int) -> list[Position]:
        """Remove and return up to ``max_messages`` due positions, sorted by position."""
        with self._lock:
            cutoff = self._clock() + self._tick_ms
            heap = self._heap
            positions = self._positions
            out: list[Position] = []
            while len(out) < max_messages and heap and heap[0][0] <= cutoff:
                _, ledger_id, entry_id = heappop(heap)
                position = Position(ledger_id, entry_id)
                if position in positions:  # else a stale node left by a due re-add
                    positions.remove(position)
                    out.append(position)
            out.sort()
            return out

    def __len__(self) -> int:
        """Number of tracked, undelivered positions."""
        return len(self._positions)


class SortedListSetTracker:
    """``SortedList`` of ``(deliver_at, ledger, entry)`` tuples + ``set`` of positions, one lock.

    Same API and semantics as :class:`HeapqSetTracker`; kept for comparisons that need ordered
    iteration (not used by the default suite). Deliberately a near-copy rather than a shared
    base: routing the baselines through extra indirection would slow them and flatter delayindex.
    """

    __slots__ = ("_clock", "_items", "_lock", "_positions", "_tick_ms")

    def __init__(self, clock: Clock, tick_ms: int = 1000) -> None:
        self._clock = clock
        self._tick_ms = tick_ms
        self._items: SortedList = SortedList()
        self._positions: set[tuple[int, int]] = set()
        self._lock = threading.Lock()

    def add(self, ledger_id: int, entry_id: int, deliver_at: int) -> bool:
        """Track the position until ``deliver_at``; False means "deliver it now"."""
        with self._lock:
            position = (ledger_id, entry_id)
            if deliver_at < 0 or deliver_at <= self._clock() + self._tick_ms:
                self._positions.discard(position)
                return False
            if position in self._positions:
                return True
            self._positions.add(position)
            self._items.add((deliver_at, ledger_id, entry_id))
            return True

    def contains(self, ledger_id: int, entry_id: int) -> bool:
        """Whether the position is tracked and not yet delivered."""
        with self._lock:
            return (ledger_id, entry_id) in self._positions

    def poll(self, max_messages: int) -> list[Position]:
        """Remove and return up to ``max_messages`` due positions, sorted by position."""
        with self._lock:
            cutoff = self._clock() + self._tick_ms
            items = self._items
            positions = self._positions
            out: list[Position] = []
            while len(out) < max_messages and items and items[0][0] <= cutoff:
                _, ledger_id, entry_id = items.pop(0)
                position = Position(ledger_id, entry_id)
                if position in positions:
                    positions.remove(position)
                    out.append(position)
            out.sort()
            return out

    def __len__(self) -> int:
        """Number of tracked, undelivered positions."""
        return len(self._positions)


def delayed_subset(n: int, *, seed: int = 0) -> tuple[Int64Array, Int64Array, Int64Array]:
    """The first ``n`` delayed messages of the realistic workload ``generate(..., seed=seed)``.

    Returns:
        ``(ledger_ids, entry_ids, deliver_at)`` as new C-contiguous int64 arrays of length ``n``
        (unique positions in increasing order; deliver times from the realistic delay mix).
    """
    total = int(n * 2.1) + 1000  # half the messages are delayed; leave a wide margin
    while True:
        workload = generate(total, seed=seed)
        index = np.flatnonzero(workload.delayed_mask)
        if len(index) >= n:
            break
        total *= 2
    index = index[:n]
    return workload.ledger_ids[index], workload.entry_ids[index], workload.deliver_at[index]


# -- memory probe (runs in a fresh interpreter, see bench_memory.py) -------------------------------

#: Memory probe variants: how the tracker is built and filled.
PROBE_VARIANTS: tuple[str, ...] = (
    "delay_index-add_many",
    "in_memory-add_many",
    "in_memory-add",
    "heapq",
)

_STREAM_CHUNK = 4096
#: Rows per add_many call: a dispatcher hands over batches, not the whole backlog at once.
_BATCH_ROWS = 100_000


def _rss_bytes() -> int:
    """Resident set size of this process: resident pages (``/proc/self/statm``) x page size."""
    with open("/proc/self/statm", encoding="ascii") as statm:
        resident_pages = int(statm.read().split()[1])
    return resident_pages * os.sysconf("SC_PAGE_SIZE")


def _stream(columns: Sequence[Int64Array]) -> Iterator[tuple[int, ...]]:
    """Yield rows of Python ints, converting ``_STREAM_CHUNK`` rows at a time.

    Per-call adds get fresh int objects the way a dispatcher would hand them over, instead of
    ints owned by pre-converted input lists: a tracker that keeps references (the heapq
    baseline) is charged for the ints it keeps alive, and nothing else is. The transient chunk
    costs about 1 MB in total, i.e. ~1 byte per message at 10**6 messages.
    """
    for start in range(0, len(columns[0]), _STREAM_CHUNK):
        chunk = [column[start : start + _STREAM_CHUNK].tolist() for column in columns]
        yield from zip(*chunk, strict=True)


def probe_main(argv: Sequence[str]) -> None:
    """Measure resident bytes per tracked message; prints one JSON object.

    ``argv`` is ``[variant, n]`` with ``variant`` one of :data:`PROBE_VARIANTS`. The workload is
    generated and sliced before the first RSS reading; then ``n`` delayed messages are added,
    ``gc.collect()`` runs and RSS is read again. Meant to run alone in a fresh interpreter.
    """
    variant, n = argv[0], int(argv[1])
    if variant not in PROBE_VARIANTS:
        raise SystemExit(f"unknown variant {variant!r}; expected one of {PROBE_VARIANTS}")
    columns = delayed_subset(n)
    clock = ManualClock(0)  # every realistic deliver_at (year 2026) is far in its future
    tracker: Any
    if variant == "heapq":
        tracker = HeapqSetTracker(clock)
    elif variant.startswith("delay_index"):
        tracker = DelayIndex.open(
            FileStorage(tempfile.mkdtemp(prefix="delayindex-probe-")), "probe", clock=clock
        )
    else:
        tracker = InMemoryTracker(clock=clock)
    # Both readings come after a collection and after freed heap pages went back to the OS, so
    # garbage from generating the workload (or from the trackers' temporaries) counts for no one.
    gc.collect()
    release_free_memory()
    before = _rss_bytes()
    if variant.endswith("add_many"):
        for start in range(0, n, _BATCH_ROWS):
            tracker.add_many(*(column[start : start + _BATCH_ROWS] for column in columns))
    else:
        add = tracker.add
        for ledger_id, entry_id, deliver_at in _stream(columns):
            add(ledger_id, entry_id, deliver_at)
    if isinstance(tracker, DelayIndex):
        tracker.flush()
    gc.collect()
    release_free_memory()
    after = _rss_bytes()
    tracked = len(tracker)
    if tracked != n:
        raise SystemExit(f"tracked {tracked} of {n} messages")
    result: dict[str, object] = {
        "variant": variant,
        "tracked": tracked,
        "rss_bytes_per_msg": (after - before) / tracked,
    }
    if isinstance(tracker, InMemoryTracker | DelayIndex):
        result["reported_bytes_per_msg"] = tracker.memory_usage_bytes() / tracked
    if isinstance(tracker, DelayIndex):
        result["buckets"] = len(tracker.buckets())
        tracker.close()
    sys.stdout.write(json.dumps(result) + "\n")
