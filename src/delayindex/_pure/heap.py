"""Pure-Python twin of the native ``TripleHeap``: ``heapq`` over ``(time, ledger, entry)`` tuples.

Tuple order is the same lexicographic order the native heap uses, so both pop the same sequence.
Storage order differs (``to_arrays`` is documented as unordered). ``nbytes`` is an estimate of
the list plus its tuples and ints.
"""

from __future__ import annotations

import heapq
import itertools
import sys
from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from delayindex._pure._ints import as_i64
from delayindex.model import Position

_TRIPLE_BYTES = sys.getsizeof((0, 0, 0)) + 3 * sys.getsizeof(2**40)

Int64Array = npt.NDArray[np.int64]


def triple_columns(
    triples: Sequence[tuple[int, int, int]],
) -> tuple[Int64Array, Int64Array, Int64Array]:
    """The ``(time, ledger, entry)`` triples as three int64 columns.

    One flat ``fromiter`` rather than ``zip(*triples)``: the latter makes an iterator object per
    triple, and a sealed bucket's 50 000 of them set off the garbage collector many times.
    """
    flat = np.fromiter(
        itertools.chain.from_iterable(triples), dtype=np.int64, count=3 * len(triples)
    )
    rows = flat.reshape(len(triples), 3)
    return (
        np.ascontiguousarray(rows[:, 0]),
        np.ascontiguousarray(rows[:, 1]),
        np.ascontiguousarray(rows[:, 2]),
    )


class TripleHeap:
    """Min-heap of ``(time, ledger, entry)`` int64 triples (reference implementation)."""

    __slots__ = ("_items",)

    def __init__(self) -> None:
        self._items: list[tuple[int, int, int]] = []

    def push(self, time: int, ledger: int, entry: int) -> None:
        """Insert the triple ``(time, ledger, entry)`` of ints (``OverflowError`` past int64)."""
        heapq.heappush(self._items, (as_i64(time), as_i64(ledger), as_i64(entry)))

    def _push_int64(self, time: int, ledger: int, entry: int) -> None:
        # ``push`` for ints the caller has checked to be int64 (the bucket core's add path).
        heapq.heappush(self._items, (time, ledger, entry))

    def push_many(self, times: Int64Array, ledgers: Int64Array, entries: Int64Array) -> None:
        """Insert ``(times[i], ledgers[i], entries[i])`` for every i (equal-length int64 arrays)."""
        columns = [_int64_column(a) for a in (times, ledgers, entries)]
        k = len(columns[0])
        if len(columns[1]) != k or len(columns[2]) != k:
            raise ValueError(
                f"push_many needs arrays of equal length, got {k}, {len(columns[1])}, "
                f"{len(columns[2])}"
            )
        batch = list(zip(*(c.tolist() for c in columns), strict=True))
        if len(batch) >= len(self._items):
            self._items.extend(batch)
            heapq.heapify(self._items)
        else:
            for item in batch:
                heapq.heappush(self._items, item)

    def peek(self) -> tuple[int, int, int]:
        """Return the smallest triple without removing it."""
        if not self._items:
            raise IndexError("peek from an empty TripleHeap")
        return self._items[0]

    def pop(self) -> tuple[int, int, int]:
        """Remove and return the smallest triple."""
        if not self._items:
            raise IndexError("pop from an empty TripleHeap")
        return heapq.heappop(self._items)

    def pop_due(self, cutoff: int, max_n: int) -> tuple[Int64Array, Int64Array, Int64Array]:
        """Pop up to ``max_n`` heads whose time is ``<= cutoff``; three int64 arrays."""
        cutoff = as_i64(cutoff)
        max_n = as_i64(max_n)
        items = self._items
        popped: list[tuple[int, int, int]] = []
        while len(popped) < max_n and items and items[0][0] <= cutoff:
            popped.append(heapq.heappop(items))
        if not popped:
            empty = np.empty(0, dtype=np.int64)
            return empty, empty.copy(), empty.copy()
        return triple_columns(popped)

    def remove(self, ledger: int, entry: int) -> int:
        """Remove every triple at position ``(ledger, entry)``; O(n). Returns the count removed."""
        ledger = as_i64(ledger)
        entry = as_i64(entry)
        kept = [item for item in self._items if item[1] != ledger or item[2] != entry]
        removed = len(self._items) - len(kept)
        if removed:
            heapq.heapify(kept)
            self._items = kept
        return removed

    def clear(self) -> None:
        """Remove everything."""
        self._items = []

    def __len__(self) -> int:
        return len(self._items)

    def __bool__(self) -> bool:
        return bool(self._items)

    @property
    def nbytes(self) -> int:
        """Estimated bytes held: the list and one tuple of three ints per node."""
        return sys.getsizeof(self._items) + len(self._items) * _TRIPLE_BYTES

    def to_arrays(self) -> tuple[Int64Array, Int64Array, Int64Array]:
        """Copy the nodes, in unspecified order, into three int64 numpy arrays."""
        return triple_columns(self._items)

    def _check(self) -> None:
        """Assert the heap invariant; raises ``AssertionError`` naming the broken node."""
        items = self._items
        for i in range(1, len(items)):
            parent = (i - 1) >> 1
            if items[i] < items[parent]:
                raise AssertionError(
                    f"TripleHeap order broken at node {i}: {items[i]} < parent {items[parent]}"
                )

    def __repr__(self) -> str:
        return f"<TripleHeap n={len(self._items)} (pure)>"


def _int64_column(values: object) -> Int64Array:
    # Mirrors the native typed-memoryview argument: an int64 buffer, never a list or None.
    if not isinstance(values, np.ndarray):
        raise TypeError(f"a 1-d int64 array is required, not {type(values).__name__!r}")
    array = values
    if array.dtype != np.int64 or array.ndim != 1:
        raise ValueError(
            f"Buffer dtype mismatch, expected a 1-d int64 array, got {array.dtype} "
            f"with {array.ndim} dimension(s)"
        )
    return array


def sorted_positions(ledgers: object, entries: object) -> list[Position]:
    """``Position`` s of two int64 columns, sorted by position (twin of the native kernel)."""
    ls = np.asarray(ledgers, dtype=np.int64)
    es = np.asarray(entries, dtype=np.int64)
    if len(ls) != len(es):
        raise ValueError(f"ledgers and entries differ in length ({len(ls)} != {len(es)})")
    order = np.lexsort((es, ls))
    return list(map(Position, ls[order].tolist(), es[order].tolist()))


def position_columns(ledgers: object, entries: object, what: str) -> tuple[Any, Any]:
    """Two id columns as int64 arrays, validated as a whole (both pure cores' batch calls):
    equal lengths, ``ledger >= 0`` and ``0 <= entry < 2**32``, else ``ValueError`` naming the
    first bad element (the native twins' message)."""
    ls, es = _int64_column(ledgers), _int64_column(entries)
    if len(ls) != len(es):
        raise ValueError(f"{what} needs sequences of equal length, got {len(ls)}, {len(es)}")
    bad = np.flatnonzero((ls < 0) | (es < 0) | (es > 0xFFFFFFFF))
    if len(bad):
        i = int(bad[0])
        raise ValueError(
            f"element {i}: bad position ({ls[i]}, {es[i]}); need "
            f"ledger_id >= 0 and 0 <= entry_id < 2**32"
        )
    return ls, es
