"""``LedgerRanges``: a small set of disjoint inclusive ledger ranges (both core twins use it).

A ``BucketCore`` keeps the ranges whose cancel overrides it *evicted* (dropped from memory once
a commit made them durable; the driver restores them when an add needs them). There are at
most as many ranges as sealed buckets, and they are consulted only by adds whose ledger is at or
below :attr:`LedgerRanges.max`, so plain sorted lists and ``bisect`` suffice; the native core
calls this class too, off its hot path.

Invariants (``_check``): ``starts`` ascending, each range ``start <= end``, ranges disjoint and
not adjacent (touching ranges are merged), ``max`` the last end (-1 when empty).
"""

from __future__ import annotations

import bisect
import operator
from collections.abc import Iterator

import numpy as np
import numpy.typing as npt


class LedgerRanges:
    """Disjoint inclusive ledger ranges; ``ledger in ranges`` is a binary search."""

    __slots__ = ("_ends", "_starts", "max")

    def __init__(self) -> None:
        self._starts: list[int] = []
        self._ends: list[int] = []
        self.max = -1  # the largest ledger covered (-1: none)

    def __len__(self) -> int:
        return len(self._starts)

    def __iter__(self) -> Iterator[tuple[int, int]]:
        return iter(zip(self._starts, self._ends, strict=True))

    def __contains__(self, ledger: object) -> bool:
        try:
            value = operator.index(ledger)  # type: ignore[arg-type]  # numpy ints too
        except TypeError:
            return False
        if value > self.max:
            return False
        at = bisect.bisect_right(self._starts, value)
        return bool(at) and self._ends[at - 1] >= value

    def add(self, start: int, end: int) -> None:
        """Cover ``start..end`` too (merged with the ranges it overlaps or touches)."""
        if not 0 <= start <= end:
            raise ValueError(f"bad range [{start}, {end}]")
        first = bisect.bisect_left(self._ends, start - 1)
        last = bisect.bisect_right(self._starts, end + 1)
        if first < last:
            start = min(start, self._starts[first])
            end = max(end, self._ends[last - 1])
        self._starts[first:last] = [start]
        self._ends[first:last] = [end]
        self.max = self._ends[-1]

    def remove(self, start: int, end: int) -> None:
        """Stop covering ``start..end`` (the ranges it overlaps are cut, or split in two)."""
        if not 0 <= start <= end:
            raise ValueError(f"bad range [{start}, {end}]")
        first = bisect.bisect_left(self._ends, start)  # the first range reaching start
        last = bisect.bisect_right(self._starts, end)  # past the last range starting by end
        if first >= last:
            return
        pieces = []
        if self._starts[first] < start:
            pieces.append((self._starts[first], start - 1))
        if self._ends[last - 1] > end:
            pieces.append((end + 1, self._ends[last - 1]))
        self._starts[first:last] = [a for a, _ in pieces]
        self._ends[first:last] = [b for _, b in pieces]
        self.max = self._ends[-1] if self._ends else -1

    def drop_below(self, ledger: int) -> None:
        """Forget the ranges that end below ``ledger`` (the mark-delete passed them)."""
        keep = bisect.bisect_left(self._ends, ledger)
        del self._starts[:keep], self._ends[:keep]
        self.max = self._ends[-1] if self._ends else -1

    def clear(self) -> None:
        """Forget every range."""
        self._starts.clear()
        self._ends.clear()
        self.max = -1

    def mask(self, ledgers: npt.ArrayLike) -> npt.NDArray[np.bool_]:
        """Whether each ledger of ``ledgers`` lies in a range (vectorized ``in``)."""
        values = np.asarray(ledgers, dtype=np.int64)
        if not self._starts:
            return np.zeros(len(values), dtype=np.bool_)
        at = np.searchsorted(np.asarray(self._starts, dtype=np.int64), values, side="right")
        ends = np.asarray(self._ends, dtype=np.int64)
        return (at > 0) & (ends[np.maximum(at - 1, 0)] >= values)

    def _check(self) -> None:
        """Raise AssertionError if an invariant (see the module docs) is broken."""
        for i, (start, end) in enumerate(self):
            if start > end or (i and start <= self._ends[i - 1] + 1):
                raise AssertionError(f"range {i} [{start}, {end}] is empty, unsorted or touches")
        if self.max != (self._ends[-1] if self._ends else -1):
            raise AssertionError("max is not the last end")
