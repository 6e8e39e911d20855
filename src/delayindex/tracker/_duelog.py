"""The due log: the topic's due stream, kept until every subscription has read it.

How it works. The shared index pops due keys from its one topic index in ``(deliver_at,
ledger_id, entry_id)`` selection order and appends them here as chunks of three int64 columns.
Every key gets a sequence number (``seq``), its place in that one global order; a subscription's
progress is the ``seq`` of the next key it has not read. Chunks wholly before the slowest
subscription's ``seq`` are dropped (:meth:`DueLog.trim`), so the log holds only the keys some
subscription still has to read. ``memory`` is the set of positions of the in-memory chunks (a
compact bitmap, not a dict: a position's ``seq`` is found by a vectorized scan of the chunks
from the reader's ``seq`` on, which only a position actually in the log costs).

Spill. A slow or stopped subscription must not hold the topic's memory: once the in-memory
chunks hold more than ``memory_keys`` keys, the oldest are written to anonymous temporary files
(deleted by the OS even after a crash, so they can never become garbage) and leave memory; only a
compact bitmap of their positions (``spilled``, one bit per entry in dense ledgers) stays, and
their columns are read back when a subscription reaches them. Consecutive spilled chunks of one
file are joined (up to :data:`SPILL_CHUNK_KEYS` keys), so a stopped reader costs a few bytes per
spilled position (its bit) and almost nothing per chunk. The spill files together hold what the
slowest reader has not read (a file goes once every reader is past it).

Order. Each in-memory chunk is one pop from the topic index, in selection order; so is the log
as a whole, except after a failed segment read: the topic index defers that bucket (late, never
early) and keeps popping the others, so the deferred bucket's keys come in a later chunk, after
keys later in selection order. So the first key a reader has not read is not always its
earliest: :meth:`DueLog.min_time_from` bounds them all (each chunk keeps its least time).

Invariants (:meth:`DueLog._check`): chunks are contiguous (each starts where the previous one
ends), non-empty, spilled ones before in-memory ones, and each in-memory one in selection order
(a joined spilled chunk may hold several pops); ``start <= end``; ``memory`` holds exactly the
positions of the in-memory chunks and ``spilled`` those of the
spilled ones (a position is in the log at most once).
"""

from __future__ import annotations

import bisect
import os
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from typing import IO, Any

import numpy as np
import numpy.typing as npt

from delayindex import _impl

Int64Array = npt.NDArray[np.int64]
_EMPTY: Int64Array = np.empty(0, dtype=np.int64)
#: A spill file takes chunks until it holds this many keys (24 bytes each).
SPILL_FILE_KEYS = 1 << 20
#: Consecutive spilled chunks are joined up to this many keys (one read brings 24 bytes per key).
SPILL_CHUNK_KEYS = 1 << 16
#: A trim compacts the in-memory bitmap's emptied ledgers every this many trims.
_COMPACT_EVERY = 64


@dataclass
class _Chunk:
    base: int  # seq of the first key
    size: int
    columns: tuple[Int64Array, Int64Array, Int64Array] | None  # None: spilled
    min_time: int  # the least deliver time of its keys
    spill: _SpillFile | None = None
    offset: int = 0  # byte offset in the spill file

    @property
    def end(self) -> int:
        return self.base + self.size


class _SpillFile:
    """An anonymous temporary file of spilled chunks (closed, hence gone, once all are read)."""

    def __init__(self, directory: str | None) -> None:
        # Closed (so deleted) in DueLog.trim; an unlinked file cannot outlive a crash.
        self.file: IO[bytes] = tempfile.TemporaryFile(  # noqa: SIM115
            prefix="delayindex-duelog-", dir=directory
        )
        self.keys = 0
        self.live_chunks = 0

    def write(self, columns: tuple[Int64Array, Int64Array, Int64Array]) -> int:
        offset = self.keys * 24
        # One 24-byte record per key, so consecutive writes read back as one joined chunk.
        data = np.stack(columns, axis=1).astype("<i8", copy=False).tobytes()
        os.pwrite(self.file.fileno(), data, offset)
        self.keys += len(columns[0])
        self.live_chunks += 1
        return offset

    def read(self, offset: int, size: int) -> tuple[Int64Array, Int64Array, Int64Array]:
        data = os.pread(self.file.fileno(), size * 24, offset)
        if len(data) != size * 24:
            raise OSError(f"due-log spill file: short read ({len(data)} of {size * 24} bytes)")
        table = np.frombuffer(data, dtype="<i8").reshape(size, 3).T.astype(np.int64, order="C")
        return table[0], table[1], table[2]


class DueLog:
    """Chunks of due keys with global sequence numbers (see the module docs)."""

    def __init__(self, memory_keys: int = 16_384, spill_dir: str | None = None) -> None:
        self.memory_keys = memory_keys
        self._spill_dir = spill_dir
        self._chunks: list[_Chunk] = []
        self._bases: list[int] = []  # chunk bases, for bisect
        self._start = 0  # seq of the oldest kept key
        self._end = 0  # seq the next appended key gets
        self._in_memory = 0  # keys of in-memory chunks
        self._first_memory = 0  # index of the first in-memory chunk
        self._spill: _SpillFile | None = None  # the file new spills go to
        self._cache: tuple[int, tuple[Int64Array, Int64Array, Int64Array]] | None = None
        self._trims = 0
        #: Positions of the in-memory chunks.
        self.memory: Any = _impl.LedgerIndex()
        #: Positions of the spilled chunks.
        self.spilled: Any = _impl.LedgerIndex()
        #: No kept key has a larger ledger (a bound: it does not shrink when keys go).
        self.max_ledger = -1

    @property
    def start(self) -> int:
        """The ``seq`` of the oldest key kept."""
        return self._start

    @property
    def end(self) -> int:
        """The ``seq`` the next appended key gets (one past the newest)."""
        return self._end

    @property
    def spill_start(self) -> int:
        """The ``seq`` of the first in-memory key (keys before it are spilled)."""
        if self._first_memory < len(self._chunks):
            return self._chunks[self._first_memory].base
        return self._end

    def __len__(self) -> int:
        return self._end - self._start

    @property
    def spilled_keys(self) -> int:
        """Keys kept in spill files."""
        return self.spill_start - self._start

    @property
    def nbytes(self) -> int:
        """Resident bytes: in-memory columns, both position bitmaps and the chunk records
        (estimated at 160 bytes each)."""
        return (
            self._in_memory * 24
            + int(self.memory.memory_bytes())
            + int(self.spilled.memory_bytes())
            + 160 * len(self._chunks)
        )

    # -- writing ---------------------------------------------------------------------------------

    def append(self, times: Int64Array, ledgers: Int64Array, entries: Int64Array) -> None:
        """Append keys popped from the topic index (one pop: in selection order)."""
        self.append_unspilled(times, ledgers, entries)
        self.spill_excess()

    def append_unspilled(self, times: Int64Array, ledgers: Int64Array, entries: Int64Array) -> None:
        """:meth:`append`, leaving the spill to :meth:`spill_excess` (the shared index appends
        under the topic index's lock and spills, which writes a file, after it)."""
        if not len(times):
            return
        chunk = _Chunk(self._end, len(times), (times, ledgers, entries), int(times.min()))
        self.max_ledger = max(self.max_ledger, int(ledgers.max()))
        self._chunks.append(chunk)
        self._bases.append(chunk.base)
        self.memory.add_many(ledgers, entries)
        self._end = chunk.end
        self._in_memory += chunk.size

    def spill_excess(self) -> None:
        """Spill the oldest in-memory chunks while more than ``memory_keys`` keys are in
        memory (the newest chunk always stays)."""
        while self._in_memory > self.memory_keys and self._first_memory < len(self._chunks) - 1:
            self._spill_oldest()

    def _spill_oldest(self) -> None:
        chunk = self._chunks[self._first_memory]
        assert chunk.columns is not None
        if self._spill is None or self._spill.keys >= SPILL_FILE_KEYS:
            self._spill = _SpillFile(self._spill_dir)
        offset = self._spill.write(chunk.columns)
        _, ledgers, entries = chunk.columns
        # Into the spilled set first: a front reading without the shared lock must never see
        # a log position in neither set (see SharedFront).
        self.spilled.add_many(ledgers, entries)
        self.memory.discard_many(ledgers, entries)
        self._in_memory -= chunk.size
        previous = self._chunks[self._first_memory - 1] if self._first_memory else None
        if (
            previous is not None
            and previous.spill is self._spill
            and previous.offset + previous.size * 24 == offset
            and previous.size + chunk.size <= SPILL_CHUNK_KEYS
        ):  # join: the chunk's keys follow the previous spilled chunk's in the same file
            self._spill.live_chunks -= 1
            previous.size += chunk.size
            previous.min_time = min(previous.min_time, chunk.min_time)
            if self._cache is not None and self._cache[0] == previous.base:
                self._cache = None
            del self._chunks[self._first_memory]
            del self._bases[self._first_memory]
            return
        chunk.offset, chunk.spill, chunk.columns = offset, self._spill, None
        self._first_memory += 1

    # -- reading ---------------------------------------------------------------------------------

    def _columns(self, i: int) -> tuple[Int64Array, Int64Array, Int64Array]:
        chunk = self._chunks[i]
        if chunk.columns is not None:
            return chunk.columns
        if self._cache is not None and self._cache[0] == chunk.base:
            return self._cache[1]
        assert chunk.spill is not None
        columns = chunk.spill.read(chunk.offset, chunk.size)
        self._cache = (chunk.base, columns)
        return columns

    def _chunk_at(self, seq: int) -> int:
        return bisect.bisect_right(self._bases, seq) - 1

    def slice(self, seq: int, limit: int) -> tuple[int, Int64Array, Int64Array, Int64Array]:
        """Up to ``limit`` keys from ``seq`` on, within one chunk: ``(seq, times, ledgers,
        entries)``; empty columns at the end of the log."""
        seq = max(seq, self._start)
        if seq >= self._end or limit <= 0:
            return seq, _EMPTY, _EMPTY, _EMPTY
        i = self._chunk_at(seq)
        times, ledgers, entries = self._columns(i)
        lo = seq - self._chunks[i].base
        hi = min(lo + limit, self._chunks[i].size)
        return seq, times[lo:hi], ledgers[lo:hi], entries[lo:hi]

    def key_at(self, seq: int) -> tuple[int, int, int]:
        """The ``(time, ledger, entry)`` key at ``seq`` (which must be kept)."""
        _, times, ledgers, entries = self.slice(seq, 1)
        return int(times[0]), int(ledgers[0]), int(entries[0])

    def columns_from(self, seq: int) -> Iterator[tuple[int, Int64Array, Int64Array, Int64Array]]:
        """``(seq, times, ledgers, entries)`` per chunk from ``seq`` on (for vectorized scans)."""
        seq = max(seq, self._start)
        while seq < self._end:
            part = self.slice(seq, self._end - seq)
            yield part
            seq += len(part[1])

    def min_time_from(self, seq: int) -> int | None:
        """A lower bound of the deliver times of the keys from ``seq`` on (None: no key):
        exact within the chunk holding ``seq`` when it is in memory, then each later chunk's
        least time (a late-loaded bucket's keys can follow later ones: see "Order")."""
        seq = max(seq, self._start)
        if seq >= self._end:
            return None
        i = self._chunk_at(seq)
        chunk = self._chunks[i]
        if chunk.columns is not None:
            best = int(chunk.columns[0][seq - chunk.base :].min())
        else:
            best = chunk.min_time
        for later in self._chunks[i + 1 :]:
            best = min(best, later.min_time)
        return best

    def keys_from(self, seq: int) -> Iterator[tuple[int, tuple[int, int, int]]]:
        """``(seq, key)`` for every kept key from ``seq`` on (stop early: spilled chunks are read
        as they are reached)."""
        for base, times, ledgers, entries in self.columns_from(seq):
            keys = zip(times.tolist(), ledgers.tolist(), entries.tolist(), strict=True)
            for offset, key in enumerate(keys):
                yield base + offset, key

    def _where(self, pos: tuple[int, int]) -> int:
        """0: not in the log; 1: in memory; 2: spilled. A bad position is not in the log (the
        caller's validation reports it)."""
        try:
            if self.memory.contains(*pos):
                return 1
            return 2 if self.spilled.contains(*pos) else 0
        except (OverflowError, TypeError, ValueError):
            return 0

    def holds(self, pos: tuple[int, int]) -> bool:
        """Whether ``pos`` is in the log (in memory or spilled)."""
        return self._where(pos) != 0

    def _find(self, pos: tuple[int, int], where: int, seq: int) -> int | None:
        """The ``seq`` of ``pos`` (known to be in the log, ``where`` as from :meth:`_where`) if
        it is at ``seq`` or later, else None. Scans only the chunks of its kind."""
        seq = max(seq, self._start if where == 2 else self.spill_start)
        limit = self.spill_start if where == 2 else self._end
        ledger, entry = pos
        for base, _, ledgers, entries in self.columns_from(seq):
            if base >= limit:
                break
            hits = np.flatnonzero((ledgers == ledger) & (entries == entry))
            if len(hits):
                return base + int(hits[0])
        return None

    def seq_of(self, pos: tuple[int, int]) -> int | None:
        """The ``seq`` of ``pos`` in the log, or None (a spilled one is searched on disk)."""
        where = self._where(pos)
        if not where:
            return None
        seq = self._find(pos, where, self._start)
        assert seq is not None, f"{pos} is in the log's bitmap but in none of its chunks"
        return seq

    def pending_from(self, pos: tuple[int, int], seq: int) -> bool:
        """Whether ``pos`` is in the log at ``seq`` or later."""
        where = self._where(pos)
        if not where or seq >= self._end:
            return False
        if seq <= (self._start if where == 2 else self.spill_start):
            return True  # every key of its kind is at seq or later
        return self._find(pos, where, seq) is not None

    def ledgers(self) -> set[int]:
        """The distinct ledgers of the kept keys."""
        return set(self.spilled.ledgers()) | set(self.memory.ledgers())

    # -- dropping --------------------------------------------------------------------------------

    def trim(self, upto: int) -> None:
        """Drop the chunks wholly before ``upto`` (the slowest reader's ``seq``)."""
        drop = 0
        while drop < len(self._chunks) and self._chunks[drop].end <= upto:
            chunk = self._chunks[drop]
            _, ledgers, entries = self._columns(drop)
            if chunk.columns is not None:
                self.memory.discard_many(ledgers, entries)
                self._in_memory -= chunk.size
            else:
                self.spilled.discard_many(ledgers, entries)
                assert chunk.spill is not None
                chunk.spill.live_chunks -= 1
                if chunk.spill.live_chunks == 0 and chunk.spill is not self._spill:
                    chunk.spill.file.close()  # every chunk in it is read: the file goes
                    self.spilled.compact()
            drop += 1
        if drop:
            self._trims += 1
            if self._trims % _COMPACT_EVERY == 0:
                self.memory.compact()
            del self._chunks[:drop]
            del self._bases[:drop]
            self._first_memory = max(self._first_memory - drop, 0)
            self._cache = None
        self._start = self._chunks[0].base if self._chunks else self._end
        if not self._chunks and self._spill is not None:
            self._spill.file.close()
            self._spill = None

    def clear(self) -> None:
        """Forget every key (sequence numbers keep counting, so readers stay ordered)."""
        self.trim(self._end)

    def close(self) -> None:
        """Drop everything and close the spill files."""
        self.clear()

    def _check(self) -> None:
        """Assert the invariants in the module docs."""
        assert self._start <= self._end
        expected = self._start
        in_memory: dict[tuple[int, int], int] = {}
        spilled: set[tuple[int, int]] = set()
        for i, (chunk, base) in enumerate(zip(self._chunks, self._bases, strict=True)):
            assert chunk.base == base == expected and chunk.size > 0
            assert (chunk.columns is None) == (i < self._first_memory), "spilled after in-memory"
            times, ledgers, entries = self._columns(i)
            assert chunk.min_time == int(times.min()), "a chunk's least time is stale"
            keys = zip(times.tolist(), ledgers.tolist(), entries.tolist(), strict=True)
            previous: tuple[int, int, int] | None = None  # across chunks: see "Order"
            for offset, key in enumerate(keys):
                if chunk.columns is not None:  # one pop (joined spilled chunks: several)
                    assert previous is None or previous < key, "keys out of selection order"
                previous = key
                if chunk.columns is None:
                    spilled.add((key[1], key[2]))
                else:
                    in_memory[key[1], key[2]] = chunk.base + offset
            expected = chunk.end
        assert expected == self._end
        assert len(self.memory) == len(in_memory), "in-memory bitmap out of step with the chunks"
        assert all(self.memory.contains(*pos) for pos in in_memory)
        assert len(in_memory) + len(spilled) == len(self), "a position is in the log twice"
        assert len(self.spilled) == len(spilled)
        assert all(self.spilled.contains(*pos) for pos in spilled)
        assert self._in_memory == len(in_memory)
