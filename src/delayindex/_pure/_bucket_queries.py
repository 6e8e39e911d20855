"""Read-only queries over the pure ``BucketCore``'s dedup index (a mixin; the native twin has
them inline in ``cython/delayindex/_bucket.pxi``)."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from delayindex._pure.index import LedgerIndex

Int64Array = npt.NDArray[np.int64]


def _column(values: object) -> Int64Array:
    return np.ascontiguousarray(np.asarray(values), dtype=np.int64)


class BucketQueries:
    """``tracked_mask``, ``tracked_in_range`` and ``count_upto``."""

    _index: LedgerIndex
    _shadow: set[tuple[int, int]]

    def tracked_mask(self, ledgers: Int64Array, entries: Int64Array) -> npt.NDArray[np.bool_]:
        """For each position, whether it is tracked."""
        ledgers, entries = _column(ledgers), _column(entries)
        if len(ledgers) != len(entries):
            raise ValueError("ledgers and entries differ in length")
        contains = self._index.contains
        return np.array(
            [contains(lg, e) for lg, e in zip(ledgers.tolist(), entries.tolist(), strict=True)],
            dtype=np.bool_,
        )

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
