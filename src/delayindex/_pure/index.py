"""Pure-Python twin of the native ``LedgerIndex`` (see ``cython/delayindex/_index.pxi``).

The set of tracked positions ``(ledger, entry)`` as one pyroaring BitMap per ledger. The native
twin stores dense ledgers as plain bitsets instead (a fraction of the memory); the observable
behaviour is the same. Emptied ledgers are kept until :meth:`compact`, as natively.

Invariants (``_check``): ``len`` == sum of the per-ledger cardinalities; ``num_ledgers`` counts
the non-empty ones.
"""

from __future__ import annotations

import itertools
import sys

import numpy as np
import numpy.typing as npt
from pyroaring import BitMap

from delayindex._pure._ints import check_ids
from delayindex.model import MAX_ENTRY_ID

_BITMAP_OVERHEAD = 64


def _pairs(ledgers: object, entries: object) -> list[tuple[int, int]]:
    """The ``(ledger, entry)`` pairs of two int64 columns, every one checked first."""
    ls = np.asarray(ledgers, dtype=np.int64).tolist()
    es = np.asarray(entries, dtype=np.int64).tolist()
    if len(ls) != len(es):
        raise ValueError(f"ledgers and entries differ in length ({len(ls)} != {len(es)})")
    for ledger, entry in zip(ls, es, strict=True):
        check_ids(ledger, entry)
    return list(zip(ls, es, strict=True))


class LedgerIndex:
    """Set of tracked positions ``(ledger, entry)``; ``add``/``discard`` say if it changed."""

    def __init__(self) -> None:
        self._sets: dict[int, BitMap] = {}
        self._count = 0

    def add(self, ledger: int, entry: int) -> bool:
        """Add ``(ledger, entry)``; True if it was not there."""
        check_ids(ledger, entry)
        return self._insert(ledger, entry)

    def _insert(self, ledger: int, entry: int) -> bool:
        # ``add`` for ids the caller has checked (the bucket core's add path).
        bm = self._sets.get(ledger)
        if bm is None:
            bm = self._sets[ledger] = BitMap()
        if entry in bm:
            return False
        bm.add(entry)
        self._count += 1
        return True

    def discard(self, ledger: int, entry: int) -> bool:
        """Remove ``(ledger, entry)``; True if it was there."""
        check_ids(ledger, entry)
        bm = self._sets.get(ledger)
        if bm is None or entry not in bm:
            return False
        bm.discard(entry)
        self._count -= 1
        return True

    def add_many(self, ledgers: object, entries: object) -> int:
        """Add every ``(ledgers[i], entries[i])``, validated as a whole first; return how many
        were new."""
        pairs = _pairs(ledgers, entries)
        return sum(self.add(ledger, entry) for ledger, entry in pairs)

    def discard_many(self, ledgers: object, entries: object) -> int:
        """Remove every ``(ledgers[i], entries[i])``, validated as a whole first; return how
        many were there."""
        pairs = _pairs(ledgers, entries)
        return sum(self.discard(ledger, entry) for ledger, entry in pairs)

    def contains(self, ledger: int, entry: int) -> bool:
        """Whether ``(ledger, entry)`` is in the set."""
        check_ids(ledger, entry)
        return self._has(ledger, entry)

    def _has(self, ledger: int, entry: int) -> bool:
        # ``contains`` for ids the caller has checked (the bucket core's add path).
        bm = self._sets.get(ledger)
        return bm is not None and entry in bm

    def contains_many(self, ledgers: object, entries: object) -> npt.NDArray[np.bool_]:
        """For each position, whether it is in the set: a bool array (the ids are not
        validated; a position out of range is simply absent). Vectorized per ledger."""
        ls = np.ascontiguousarray(ledgers, dtype=np.int64)
        es = np.ascontiguousarray(entries, dtype=np.int64)
        if len(ls) != len(es):
            raise ValueError("ledgers and entries differ in length")
        out = np.zeros(len(ls), dtype=np.bool_)
        if not len(ls) or not self._count:
            return out
        order = np.argsort(ls, kind="stable")
        grouped = ls[order]
        cuts = [0, *(np.flatnonzero(grouped[1:] != grouped[:-1]) + 1).tolist(), len(ls)]
        for a, b in itertools.pairwise(cuts):
            bm = self._sets.get(int(grouped[a]))
            if bm:
                rows = order[a:b]
                # The members come sorted: a binary search each, no sort of the ledger's set.
                members = np.frombuffer(bm.to_array(), dtype=np.uint32).astype(np.int64)
                wanted = es[rows]
                at = np.minimum(np.searchsorted(members, wanted), len(members) - 1)
                out[rows] = members[at] == wanted
        return out

    def __len__(self) -> int:
        return self._count

    @property
    def num_ledgers(self) -> int:
        """Ledgers holding at least one position."""
        return sum(1 for bm in self._sets.values() if bm)

    def ledger_count(self, ledger: int) -> int:
        """Positions of ``ledger`` in the set."""
        bm = self._sets.get(ledger)
        return 0 if bm is None else len(bm)

    def ledgers(self) -> list[int]:
        """Ledgers holding at least one position, ascending."""
        return sorted(k for k, bm in self._sets.items() if bm)

    def ledger_counts(self) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
        """``(ledgers, counts)`` int64 arrays: each non-empty ledger, ascending, and how many
        positions it holds."""
        items = sorted((k, len(bm)) for k, bm in self._sets.items() if bm)
        return (
            np.array([k for k, _ in items], dtype=np.int64),
            np.array([c for _, c in items], dtype=np.int64),
        )

    def positions(self) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
        """Every position, ascending: ``(ledgers, entries)`` int64 arrays."""
        ledgers, counts = self.ledger_counts()
        parts = [
            np.frombuffer(self._sets[ledger].to_array(), dtype=np.uint32)
            for ledger in ledgers.tolist()
        ]
        entries = np.concatenate(parts).astype(np.int64) if parts else np.empty(0, np.int64)
        return np.repeat(ledgers, counts), entries

    def bitmap(self, ledger: int, first: int = 0, last: int = MAX_ENTRY_ID) -> BitMap:
        """The entries of ``ledger`` in ``[first, last]`` as a new pyroaring BitMap (empty if
        none)."""
        bm = self._sets.get(ledger)
        if bm is None or last < first:
            return BitMap()
        out = bm.copy()
        if first > 0:
            out.remove_range(0, first)
        if last < MAX_ENTRY_ID:
            out.remove_range(last + 1, MAX_ENTRY_ID + 1)
        return out

    def restore(self, ledger: int, entries: object) -> int:
        """Add every entry of ``entries`` (a BitMap or integer array); return how many were new."""
        new = (
            entries
            if isinstance(entries, BitMap)
            else BitMap(np.asarray(entries, dtype=np.uint32).tolist())
        )
        if not new:
            return 0
        if ledger < 0:
            raise ValueError(f"ledger_id must be >= 0, got {ledger}")
        bm = self._sets.get(ledger)
        if bm is None:
            bm = self._sets[ledger] = BitMap()
        before = len(bm)
        bm |= new
        self._count += len(bm) - before
        return len(bm) - before

    def remove_upto(self, ledger: int, entry: int) -> int:
        """Remove every position ``<= (ledger, entry)``; return how many."""
        removed = 0
        for key, bm in self._sets.items():
            if key > ledger or not bm:
                continue
            before = len(bm)
            if key < ledger:
                bm.clear()
            else:
                bm.remove_range(0, min(entry, MAX_ENTRY_ID) + 1)
            removed += before - len(bm)
        self._count -= removed
        return removed

    def remove_ledgers(self, start: int, end: int) -> int:
        """Remove every position of ledgers ``start..end``; return how many."""
        removed = 0
        for key, bm in self._sets.items():
            if start <= key <= end:
                removed += len(bm)
                bm.clear()
        self._count -= removed
        return removed

    def compact(self) -> None:
        """Drop emptied ledgers."""
        self._sets = {k: bm for k, bm in self._sets.items() if bm}

    def clear(self) -> None:
        """Remove everything."""
        self._sets.clear()
        self._count = 0

    def memory_bytes(self) -> int:
        """Resident estimate: the dict and the BitMaps."""
        return sys.getsizeof(self._sets) + sum(
            sys.getsizeof(bm) + _BITMAP_OVERHEAD for bm in self._sets.values()
        )

    def _check(self) -> None:
        """Assert the invariants listed in the module docstring."""
        total = sum(len(bm) for bm in self._sets.values())
        if total != self._count:
            raise AssertionError(f"count {self._count} != cardinality {total}")
