"""Read-only queries over the pure ``BucketCore``'s dedup index (a mixin; the native twin has
them in ``cython/delayindex/_bucket_state.pxi``)."""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt
from pyroaring import BitMap

from delayindex._pure.heap import TripleHeap
from delayindex._pure.index import LedgerIndex
from delayindex._sortkeys import position_order
from delayindex.model import MAX_ENTRY_ID

Int64Array = npt.NDArray[np.int64]


def _column(values: object) -> Int64Array:
    return np.ascontiguousarray(np.asarray(values), dtype=np.int64)


class BucketQueries:
    """``index_bitmap``, ``tracked_mask``, ``tracked_mask_order``, ``tracked_in_range``,
    ``count_upto``, ``live_keys`` and ``authoritative_mask``."""

    _index: LedgerIndex
    _shadow: set[tuple[int, int]]
    _mutable: TripleHeap
    _direct: TripleHeap
    _sources: dict[int, Any]

    def index_bitmap(self, ledger: int, first: int = 0, last: int = MAX_ENTRY_ID) -> BitMap | None:
        """A new BitMap of ``ledger``'s tracked entries in ``[first, last]``, or None when the
        ledger has none at all."""
        if self._index.ledger_count(ledger) == 0:
            return None
        return self._index.bitmap(ledger, first, last)

    def live_keys(self, first: int, last: int) -> tuple[Int64Array, Int64Array, Int64Array]:
        """``(times, ledgers, entries)`` of the tracked positions in memory (mutable and
        direct heaps, segment sources from their cursors) with ``first <= time <= last``, in no
        particular order; segments still in storage are the caller's."""
        parts = [self._mutable.to_arrays()]
        for src in self._sources.values():
            if src.heap is not None:
                parts.append(src.heap.to_arrays())
            else:
                start = src.pos
                parts.append(
                    (
                        _column(src.times[start:]),
                        _column(src.ledgers[start:]),
                        _column(src.entries[start:]),
                    )
                )
        return live_rows(
            self.tracked_mask, self._shadow, parts, self._direct.to_arrays(), first, last
        )

    def ledger_counts(self) -> tuple[Int64Array, Int64Array]:
        """``(ledgers, counts)``: the tracked positions per ledger, ledgers ascending."""
        return self._index.ledger_counts()

    def authoritative_mask(self, ledgers: Int64Array, entries: Int64Array) -> Any:
        """For segment copies read from storage: tracked and not shadowed by a direct copy."""
        live = self.tracked_mask(ledgers, entries)
        if self._shadow:
            live &= np.array(
                [pos not in self._shadow
                 for pos in zip(_column(ledgers).tolist(), _column(entries).tolist(), strict=True)],
                dtype=np.bool_,
            )  # fmt: skip
        return live

    def tracked_mask(self, ledgers: Int64Array, entries: Int64Array) -> npt.NDArray[np.bool_]:
        """For each position, whether it is tracked."""
        return self._index.contains_many(ledgers, entries)

    def tracked_mask_order(self, ledgers: Int64Array, entries: Int64Array) -> Any:
        """An order of these rows in which slices of them cost :meth:`tracked_mask` least, or
        None when any order does as well (reads no state). Here position order: a call copies
        each ledger's members out of its bitmap, so a slice of time-ordered rows (a merge's)
        would copy nearly every ledger of the range, and one in position order only a few."""
        return position_order(ledgers, entries)

    def tracked_in_range(self, start: int, end: int) -> tuple[Int64Array, Int64Array]:
        """Tracked positions of ledgers ``start..end`` whose authoritative copy is not in the
        direct heap, as ``(ledgers, entries)`` int64 arrays in position order."""
        ls: list[int] = []
        es: list[int] = []
        for ledger in self._index.ledgers():
            if start <= ledger <= end:
                entries = [e for e in self._index.bitmap(ledger) if (ledger, e) not in self._shadow]
                ls.extend([ledger] * len(entries))
                es.extend(entries)
        return np.array(ls, dtype=np.int64), np.array(es, dtype=np.int64)

    def count_upto(self, ledger: int, entry: int) -> int:
        """How many tracked positions are ``<= (ledger, entry)``."""
        total = 0
        for led in self._index.ledgers():
            if led < ledger:
                total += self._index.ledger_count(led)
            elif led == ledger and entry >= 0:
                total += len(self._index.bitmap(led, 0, entry))
        return total


def live_rows(
    tracked_mask: Any,
    shadow: set[tuple[int, int]],
    parts: list[tuple[Int64Array, Int64Array, Int64Array]],
    direct: tuple[Int64Array, Int64Array, Int64Array],
    first: int,
    last: int,
) -> tuple[Int64Array, Int64Array, Int64Array]:
    """The authoritative in-memory copies of tracked positions with ``first <= time <= last``
    (both twins' ``live_keys``): ``parts`` are the mutable heap and the segment sources, whose
    copy of a shadowed position is obsolete; ``direct`` is the direct heap."""
    columns: list[tuple[Int64Array, Int64Array, Int64Array]] = []
    for times, ledgers, entries, is_direct in [(*p, False) for p in parts] + [(*direct, True)]:
        keep = np.flatnonzero((times >= first) & (times <= last))
        if not len(keep):
            continue
        times, ledgers, entries = times[keep], ledgers[keep], entries[keep]
        live = tracked_mask(ledgers, entries)
        if shadow and not is_direct:
            live &= np.array(
                [pos not in shadow for pos in zip(ledgers.tolist(), entries.tolist(), strict=True)],
                dtype=np.bool_,
            )
        columns.append((times[live], ledgers[live], entries[live]))
    if not columns:
        empty = np.empty(0, dtype=np.int64)
        return empty, empty.copy(), empty.copy()
    return tuple(np.concatenate(c) for c in zip(*columns, strict=True))  # type: ignore[return-value]
