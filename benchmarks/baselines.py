"""Baseline trackers and workload helpers shared by the benchmark suite.

This is not a benchmark module: ``conftest.py`` puts this directory on ``sys.path`` and imports
it (with ``--import-mode=importlib`` benchmark modules cannot import each other), and the memory
probe of ``bench_memory.py`` runs :func:`probe_main` in a fresh interpreter.

The baselines are what a careful Python programmer would write instead of using delayindex: a
``heapq`` heap of ``(deliver_at, ledger, entry)`` tuples (or a ``SortedList`` of them) plus a
``set`` of ``(ledger, entry)`` tuples as the dedup index, or a Redis sorted set. They implement
the subset of the tracker API that the benchmarks use (``add``, ``contains``, ``poll``, ``len``
and DelayIndex's ``tracked_entries``) with the same semantics on the benchmark workloads:

* ``add`` returns False (deliver now) when ``deliver_at < 0`` or ``deliver_at <= now + tick``,
  also untracking the position; re-adding a tracked position is a no-op returning True.
* ``poll(n)`` removes up to ``n`` positions with ``deliver_at <= now + tick`` in
  ``(deliver_at, ledger, entry)`` order and returns them sorted by position, as ``Position``
  named tuples, like ``InMemoryTracker.poll``.
* ``tracked_entries(ledger, first, last)`` lists the tracked entry ids of the ledger in the
  closed range, in order (a list: a set-based baseline has no cheaper answer than probing).
* ``len()`` is the number of distinct tracked positions.

Like ``InMemoryTracker``, every mutating or querying method of the in-process baselines takes a
``threading.Lock``: the real tracker must be callable from dispatcher, reader and timer threads,
so an equivalent baseline has to pay for the same (uncontended) lock or the comparison would not
be fair.

:class:`RedisZsetTracker` keeps the positions in a Redis ZSET (member: the position packed in
12 big-endian bytes, so member order is position order; score: ``deliver_at``) and pipelines:
``add`` queues ``ZADD NX`` and sends :data:`RedisZsetTracker.PIPELINE` commands per round trip
(every query first sends what is queued), ``add_many`` sends one ``ZADD`` of up to 1000 members
per command, ``contains_many`` and ``tracked_entries`` use ``ZMSCORE``, and ``poll`` is one Lua
script (``ZRANGEBYSCORE ... LIMIT`` then ``ZREM``), atomic on the server.

Known simplification (never triggered by the benchmark workloads, whose positions are unique):
a due re-add untracks a position but leaves its old node in the heap; if that position is later
tracked again the old node can deliver it at the old, earlier time. InMemoryTracker purges the
old node instead.
"""

from __future__ import annotations

import gc
import json
import os
import struct
import sys
import tempfile
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from heapq import heappop, heappush
from typing import Any

import numpy as np
import numpy.typing as npt
from sortedcontainers import SortedList

from delayindex import NATIVE, DelayIndex, FileStorage, InMemoryTracker, ManualClock, Position
from delayindex._memory import release_free_memory, tune_allocator
from delayindex.dump import iter_generated

Int64Array = npt.NDArray[np.int64]
Clock = Callable[[], int]

__all__ = [
    "HeapqSetTracker",
    "RedisZsetTracker",
    "SortedListSetTracker",
    "delayed_subset",
    "probe_main",
]


class _SetTracker:
    """What the in-process baselines share: the clock, the ``set`` of tracked positions that is
    their dedup index, and the methods that only read it. Subclasses keep the ordered
    ``(deliver_at, ledger, entry)`` structure and write their own ``add`` and ``poll``, each
    inline in one method (no per-call hook): a baseline slowed by indirection would flatter
    delayindex."""

    __slots__ = ("_clock", "_lock", "_positions", "_tick_ms")

    def __init__(self, clock: Clock, tick_ms: int = 1000) -> None:
        self._clock = clock
        self._tick_ms = tick_ms
        self._positions: set[tuple[int, int]] = set()
        self._lock = threading.Lock()

    def contains(self, ledger_id: int, entry_id: int) -> bool:
        """Whether the position is tracked and not yet delivered."""
        with self._lock:
            return (ledger_id, entry_id) in self._positions

    def cancel(self, ledger_id: int, entry_id: int) -> bool:
        """Untrack the position; its node is skipped lazily when it reaches the head (``poll``
        skips positions not in the set). True if it was tracked."""
        with self._lock:
            position = (ledger_id, entry_id)
            if position in self._positions:
                self._positions.remove(position)
                return True
            return False

    def due_histogram(self, edges: Sequence[int]) -> Int64Array:
        """Tracked positions per ``[edges[i], edges[i+1])``: a scan of the ordered structure
        that skips the untracked nodes."""
        with self._lock:
            positions = self._positions
            times = [t for t, ledger, entry in self._ordered() if (ledger, entry) in positions]
        counts, _ = np.histogram(np.array(times, dtype=np.int64), bins=np.asarray(edges))
        return counts.astype(np.int64)

    def _ordered(self) -> Iterable[tuple[int, int, int]]:
        raise NotImplementedError

    def tracked_entries(self, ledger_id: int, first_entry: int, last_entry: int) -> list[int]:
        """Tracked entry ids of ``ledger_id`` in ``[first_entry, last_entry]``, in order."""
        with self._lock:
            positions = self._positions
            return [
                entry
                for entry in range(first_entry, last_entry + 1)
                if (ledger_id, entry) in positions
            ]

    def __len__(self) -> int:
        """Number of tracked, undelivered positions."""
        return len(self._positions)


class HeapqSetTracker(_SetTracker):
    """``heapq`` of ``(deliver_at, ledger, entry)`` tuples + ``set`` of positions, one lock.

    Args:
        clock: zero-argument callable returning epoch ms (the same one given to the tracker
            it is compared with).
        tick_ms: non-strict cutoff slack, as in ``TrackerConfig.tick_ms``.
    """

    __slots__ = ("_heap",)

    def _ordered(self) -> Iterable[tuple[int, int, int]]:
        return self._heap

    def __init__(self, clock: Clock, tick_ms: int = 1000) -> None:
        super().__init__(clock, tick_ms)
        self._heap: list[tuple[int, int, int]] = []

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


class SortedListSetTracker(_SetTracker):
    """``SortedList`` of ``(deliver_at, ledger, entry)`` tuples + ``set`` of positions, one lock.

    Same API, arguments and semantics as :class:`HeapqSetTracker`.
    """

    __slots__ = ("_items",)

    def _ordered(self) -> Iterable[tuple[int, int, int]]:
        return self._items

    def __init__(self, clock: Clock, tick_ms: int = 1000) -> None:
        super().__init__(clock, tick_ms)
        self._items: SortedList = SortedList()

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


def delayed_subset(n: int) -> tuple[Int64Array, Int64Array, Int64Array]:
    """The first ``n`` delayed messages of the topic ``delayindex gen-dump`` writes by default.

    The rows come from :func:`delayindex.dump.iter_generated` with its defaults (1000 entries
    per ledger from ledger 1, half the messages delayed, the realistic delay mix, seed 7): the
    delayed rows of ``delayindex gen-dump OUT --messages M`` for a large enough ``M``.

    Returns:
        ``(ledger_ids, entry_ids, deliver_at)`` as new C-contiguous int64 arrays of length ``n``
        (unique positions in increasing order; deliver times from the realistic delay mix).
    """
    total = int(n * 2.2) + 1000  # half the messages are delayed; leave a wide margin
    while True:
        parts: list[tuple[Int64Array, Int64Array, Int64Array]] = []
        found = 0
        for chunk in iter_generated(total):  # a shorter dump is a prefix of a longer one
            mask = chunk.delayed_mask
            parts.append((chunk.ledger_ids[mask], chunk.entry_ids[mask], chunk.deliver_at[mask]))
            found += len(parts[-1][0])
            if found >= n:
                columns = (np.concatenate(column)[:n] for column in zip(*parts, strict=True))
                ledgers, entries, deliver_at = (np.ascontiguousarray(c) for c in columns)
                return ledgers, entries, deliver_at
        total *= 2


class RedisZsetTracker:
    """A Redis sorted set as a delayed-message tracker, with pipelining (see the module doc).

    Args:
        client: a ``redis.Redis`` client; the tracker owns key ``key`` (deleted on creation).
        clock: zero-argument callable returning epoch ms.
        tick_ms: non-strict cutoff slack, as in ``TrackerConfig.tick_ms``.
        key: the ZSET's key.
    """

    #: Commands queued per round trip by ``add``; members per ``ZADD``/``ZMSCORE`` command.
    PIPELINE = 1000
    _POLL = """
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1], 'LIMIT', 0, tonumber(ARGV[2]))
if #due > 0 then redis.call('ZREM', KEYS[1], unpack(due)) end
return due
"""
    _PACK = struct.Struct(">qI")

    def __init__(
        self, client: Any, clock: Clock, tick_ms: int = 1000, key: str = "delayed"
    ) -> None:
        self._client = client
        self._clock = clock
        self._tick_ms = tick_ms
        self._key = key
        client.delete(key)
        self._pipe = client.pipeline(transaction=False)
        self._queued = 0
        self._poll_script = client.register_script(self._POLL)

    def _member(self, ledger_id: int, entry_id: int) -> bytes:
        return self._PACK.pack(ledger_id, entry_id)

    def add(self, ledger_id: int, entry_id: int, deliver_at: int) -> bool:
        """Queue the position until ``deliver_at``; False means "deliver it now"."""
        if deliver_at < 0 or deliver_at <= self._clock() + self._tick_ms:
            self._pipe.zrem(self._key, self._PACK.pack(ledger_id, entry_id))
            tracked = False
        else:
            self._pipe.zadd(self._key, {self._PACK.pack(ledger_id, entry_id): deliver_at}, nx=True)
            tracked = True
        self._queued += 1
        if self._queued >= self.PIPELINE:
            self.sync()
        return tracked

    def add_many(
        self, ledger_ids: Int64Array, entry_ids: Int64Array, deliver_ats: Int64Array
    ) -> None:
        """Track every row that is not due: one ``ZADD NX`` per 1000 rows, ten per round trip."""
        cutoff = self._clock() + self._tick_ms
        pack = self._PACK.pack
        pipe = self._pipe
        for start in range(0, len(ledger_ids), self.PIPELINE):
            stop = start + self.PIPELINE
            rows = zip(
                ledger_ids[start:stop].tolist(),
                entry_ids[start:stop].tolist(),
                deliver_ats[start:stop].tolist(),
                strict=True,
            )
            mapping = {pack(ledger, entry): at for ledger, entry, at in rows if at > cutoff}
            if mapping:
                pipe.zadd(self._key, mapping, nx=True)
                self._queued += 1
                if self._queued >= 10:
                    self.sync()
        self.sync()

    def sync(self) -> None:
        """Send every queued command (one round trip)."""
        if self._queued:
            self._pipe.execute()
            self._queued = 0

    def contains(self, ledger_id: int, entry_id: int) -> bool:
        """Whether the position is tracked (one round trip)."""
        self.sync()
        return self._client.zscore(self._key, self._member(ledger_id, entry_id)) is not None

    def contains_many(self, ledger_ids: Sequence[int], entry_ids: Sequence[int]) -> int:
        """How many of the positions are tracked: ``ZMSCORE`` of 1000 members per command."""
        self.sync()
        pack = self._PACK.pack
        hits = 0
        for start in range(0, len(ledger_ids), self.PIPELINE):
            stop = start + self.PIPELINE
            members = [
                pack(ledger, entry)
                for ledger, entry in zip(ledger_ids[start:stop], entry_ids[start:stop], strict=True)
            ]
            self._pipe.zmscore(self._key, members)
            self._queued += 1
            if self._queued >= 10:
                hits += sum(s is not None for scores in self._pipe.execute() for s in scores)
                self._queued = 0
        if self._queued:
            hits += sum(s is not None for scores in self._pipe.execute() for s in scores)
            self._queued = 0
        return hits

    def poll(self, max_messages: int) -> list[Position]:
        """Remove and return up to ``max_messages`` due positions, sorted by position."""
        self.sync()
        cutoff = self._clock() + self._tick_ms
        due = self._poll_script(keys=[self._key], args=[cutoff, max_messages])
        unpack = self._PACK.unpack
        return sorted(Position(*unpack(member)) for member in due)

    def tracked_entries(self, ledger_id: int, first_entry: int, last_entry: int) -> list[int]:
        """Tracked entry ids of ``ledger_id`` in ``[first_entry, last_entry]`` (one ZMSCORE)."""
        self.sync()
        entries = range(first_entry, last_entry + 1)
        pack = self._PACK.pack
        scores = self._client.zmscore(self._key, [pack(ledger_id, e) for e in entries])
        return [e for e, score in zip(entries, scores, strict=True) if score is not None]

    def __len__(self) -> int:
        """Number of tracked positions (ZCARD)."""
        self.sync()
        return int(self._client.zcard(self._key))

    def close(self) -> None:
        """Drop the key."""
        self.sync()
        self._client.delete(self._key)


# -- memory probe (runs in a fresh interpreter, see bench_memory.py) -------------------------------

#: Memory probe variants: how the tracker is built and filled.
PROBE_VARIANTS: tuple[str, ...] = (
    "delay_index-add_many",
    "delay_index-add_many-tuned",
    "delay_index-pure-add_many",
    "in_memory-add_many",
    "in_memory-add",
    "in_memory-pure-add_many",
    "heapq",
    "sortedlist",
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
    if "-pure" in variant and NATIVE:
        raise SystemExit(f"{variant} needs DELAYINDEX_NO_EXTENSIONS=1 (the pure build)")
    if variant.endswith("-tuned"):
        tune_allocator()  # before the workload allocates: the process's malloc settings
        variant_kind = variant.removesuffix("-tuned")
    else:
        variant_kind = variant
    columns = delayed_subset(n)
    clock = ManualClock(0)  # every realistic deliver_at (year 2026) is far in its future
    store = tempfile.TemporaryDirectory(prefix="delayindex-probe-")
    tracker: Any
    if variant == "heapq":
        tracker = HeapqSetTracker(clock)
    elif variant == "sortedlist":
        tracker = SortedListSetTracker(clock)
    elif variant.startswith("delay_index"):
        tracker = DelayIndex.open(FileStorage(store.name), "probe", clock=clock)
    else:
        tracker = InMemoryTracker(clock=clock)
    # Both readings come after a collection and after freed heap pages went back to the OS, so
    # garbage from generating the workload (or from the trackers' temporaries) counts for no one.
    gc.collect()
    release_free_memory()
    before = _rss_bytes()
    if variant_kind.endswith("add_many"):
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
    store.cleanup()
    sys.stdout.write(json.dumps(result) + "\n")
