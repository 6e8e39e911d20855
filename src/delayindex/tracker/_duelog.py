"""The due log: the topic's due stream, kept until every subscription has read it.

How it works. The shared index pops due keys from its one topic index in ``(deliver_at,
ledger_id, entry_id)`` selection order and appends them here as chunks of three int64 columns.
Every key gets a sequence number (``seq``), its place in that one global order; a subscription's
progress is the ``seq`` of the next key it has not read. Chunks wholly before the slowest
subscription's ``seq`` are dropped (:meth:`DueLog.trim`), so the log holds only the keys some
subscription still has to read. ``index`` maps each position in the log to its (latest) ``seq``,
so that ``contains``, ``tracked_entries`` and a re-add of a position still in the log find it
without a scan.

Invariants (:meth:`DueLog._check`): chunks are contiguous (each starts where the previous one
ends), non-empty, and their keys in selection order; ``start <= end``; ``index`` holds exactly
the positions of the kept chunks, each at its latest ``seq``.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

Int64Array = npt.NDArray[np.int64]


@dataclass(frozen=True)
class _Chunk:
    base: int  # seq of the first key
    times: Int64Array
    ledgers: Int64Array
    entries: Int64Array

    @property
    def end(self) -> int:
        return self.base + len(self.times)


class DueLog:
    """Chunks of due keys with global sequence numbers (see the module docs)."""

    def __init__(self) -> None:
        self._chunks: list[_Chunk] = []
        self._bases: list[int] = []  # chunk bases, for bisect
        self._start = 0  # seq of the oldest kept key
        self._end = 0  # seq the next appended key gets
        self.index: dict[tuple[int, int], int] = {}

    @property
    def start(self) -> int:
        """The ``seq`` of the oldest key kept."""
        return self._start

    @property
    def end(self) -> int:
        """The ``seq`` the next appended key gets (one past the newest)."""
        return self._end

    def __len__(self) -> int:
        return self._end - self._start

    @property
    def nbytes(self) -> int:
        """Bytes held by the columns and the position index (an estimate for the index)."""
        return sum(c.times.nbytes * 3 for c in self._chunks) + 120 * len(self.index)

    def append(self, times: Int64Array, ledgers: Int64Array, entries: Int64Array) -> None:
        """Append keys popped from the topic index (already in selection order)."""
        if not len(times):
            return
        chunk = _Chunk(self._end, times, ledgers, entries)
        self._chunks.append(chunk)
        self._bases.append(chunk.base)
        self.index.update(
            zip(zip(ledgers.tolist(), entries.tolist(), strict=True),
                range(chunk.base, chunk.end), strict=True)
        )  # fmt: skip
        self._end = chunk.end

    def slice(self, seq: int, limit: int) -> tuple[int, Int64Array, Int64Array, Int64Array]:
        """Up to ``limit`` keys from ``seq`` on, within one chunk: ``(seq, times, ledgers,
        entries)``; empty columns at the end of the log."""
        if seq >= self._end or limit <= 0:
            empty = np.empty(0, dtype=np.int64)
            return seq, empty, empty, empty
        chunk = self._chunks[bisect.bisect_right(self._bases, seq) - 1]
        lo = seq - chunk.base
        hi = min(lo + limit, len(chunk.times))
        return seq, chunk.times[lo:hi], chunk.ledgers[lo:hi], chunk.entries[lo:hi]

    def key_at(self, seq: int) -> tuple[int, int, int]:
        """The ``(time, ledger, entry)`` key at ``seq`` (which must be kept)."""
        chunk = self._chunks[bisect.bisect_right(self._bases, seq) - 1]
        i = seq - chunk.base
        return int(chunk.times[i]), int(chunk.ledgers[i]), int(chunk.entries[i])

    def keys_from(self, seq: int) -> Iterator[tuple[int, tuple[int, int, int]]]:
        """``(seq, key)`` for every kept key from ``seq`` on (for scans off the hot path)."""
        seq = max(seq, self._start)
        while seq < self._end:
            _, times, ledgers, entries = self.slice(seq, self._end - seq)
            for t, led, ent in zip(times.tolist(), ledgers.tolist(), entries.tolist(),
                                   strict=True):  # fmt: skip
                yield seq, (t, led, ent)
                seq += 1

    def ledgers(self) -> set[int]:
        """The distinct ledgers of the kept keys."""
        out: set[int] = set()
        for chunk in self._chunks:
            out.update(np.unique(chunk.ledgers).tolist())
        return out

    def trim(self, upto: int) -> None:
        """Drop the chunks wholly before ``upto`` (the slowest reader's ``seq``)."""
        drop = 0
        while drop < len(self._chunks) and self._chunks[drop].end <= upto:
            chunk = self._chunks[drop]
            for pos in zip(chunk.ledgers.tolist(), chunk.entries.tolist(), strict=True):
                seq = self.index.get(pos)
                if seq is not None and seq < chunk.end:
                    del self.index[pos]
            drop += 1
        if drop:
            del self._chunks[:drop]
            del self._bases[:drop]
        self._start = self._chunks[0].base if self._chunks else self._end

    def clear(self) -> None:
        """Forget every key (sequence numbers keep counting, so readers stay ordered)."""
        self._chunks.clear()
        self._bases.clear()
        self.index.clear()
        self._start = self._end

    def _check(self) -> None:
        """Assert the invariants in the module docs."""
        assert self._start <= self._end
        expected = self._start
        latest: dict[tuple[int, int], int] = {}
        previous: tuple[int, int, int] | None = None
        for chunk, base in zip(self._chunks, self._bases, strict=True):
            assert chunk.base == base == expected and len(chunk.times) > 0
            for i, key in enumerate(zip(chunk.times.tolist(), chunk.ledgers.tolist(),
                                        chunk.entries.tolist(), strict=True)):  # fmt: skip
                assert previous is None or previous < key, "keys out of selection order"
                previous = key
                latest[key[1], key[2]] = chunk.base + i
            expected = chunk.end
        assert expected == self._end
        assert latest == self.index, "position index out of step with the chunks"
