"""Recovery's restores into the pure ``BucketCore``'s dedup index (a mixin; the native twin has
them in ``cython/delayindex/_bucket_state.pxi``).

``restore_block`` is recovery's path: a snapshot's live bitmaps go straight into the index, each
position new (the block's ledgers hold nothing yet), and a damaged block leaves its ledger span
empty again, so a bucket found damaged is quarantined without a trace of it in the index.
"""

from __future__ import annotations

import itertools

import numpy as np

from delayindex._pure.codec import block_bitmaps, roaring_entries
from delayindex._pure.index import LedgerIndex


class BucketRestore:
    """``restore``, ``restore_many`` and ``restore_block``."""

    _index: LedgerIndex

    def restore(self, ledger: int, bitmap: object) -> int:
        """Track every entry of ``bitmap`` (a BitMap or uint32 array) in ``ledger`` (recovery);
        return how many were new."""
        return self._index.restore(ledger, bitmap)

    def restore_many(self, ledgers: object, offsets: object, entries: object) -> int:
        """``restore`` each ledger ``ledgers[i]`` with ``entries[offsets[i]:offsets[i + 1]]``."""
        bounds = np.asarray(offsets).tolist()
        values = np.asarray(entries)
        n = len(np.asarray(ledgers))
        if len(bounds) != n + 1 or (n and (bounds[0] < 0 or bounds[n] > len(values))):
            raise ValueError("offsets do not frame the entries")
        if any(b < a for a, b in itertools.pairwise(bounds)):
            raise ValueError("offsets do not ascend")
        return sum(
            self._index.restore(ledger, values[bounds[i] : bounds[i + 1]])
            for i, ledger in enumerate(np.asarray(ledgers).tolist())
        )

    def restore_block(
        self, ledgers: object, blob: bytes | memoryview, offsets: object, expected: int = -1
    ) -> int:
        """Track the positions of a bitmap block, bitmap ``i`` holding entries of ledger
        ``ledgers[i]``; every position must be new. Returns how many were tracked.

        Raises:
            ValueError: a malformed bitmap, a position in two bitmaps, or (``expected`` >= 0)
                other than ``expected`` positions; the block's ledger span then holds nothing
                again.
        """
        ids = np.ascontiguousarray(np.asarray(ledgers), dtype=np.int64).tolist()
        bitmaps = block_bitmaps(blob, offsets, len(ids))
        added = 0
        try:
            for ledger, data in zip(ids, bitmaps, strict=True):
                values = roaring_entries(data)
                new = self._index.restore(ledger, values)
                added += new
                if new != len(values):
                    raise ValueError(f"a position of ledger {ledger} is in two segments")
            if expected >= 0 and added != expected:
                raise ValueError(f"the bitmaps hold {added} positions, expected {expected}")
        except BaseException:
            if ids:
                self._index.remove_ledgers(min(ids), max(ids))
            raise
        return added
