"""Format 6's positions: each (segment, ledger)'s entry ids as gaps instead of roaring bitmaps.

How it works. A bucket holds one small set of entry ids per (segment, ledger), about eight to
eleven of them at the realistic mix. As portable roaring bitmaps they take about 32 bytes each,
1.5 bytes per index after zstd; as gaps between consecutive entries, one byte each for most,
about 0.85 (docs/benchmarks.md, "Session 32"). :func:`pack_entry_gaps` writes, after the ledger
columns, four streams back to back (all integers unsigned LEB128 varints unless said otherwise):

- *cards*: per (segment, ledger), how many entries it holds (at least 1);
- *firsts*: per (segment, ledger), its lowest entry id;
- *steps*: one byte per later entry: its gap to the one before, minus 1, when that is below
  255; else 255, an escape;
- *escapes*: per escape byte, in order, the gap minus 256.

Nothing follows. Bytes of one kind sit together, so that zstd's entropy coder sees one
distribution at a time. The ``unpack_entry_gaps`` kernel inverts it exactly and checks every rule
(counts at least 1, ids below 2**32 as in the bitmaps, as many escapes as escape bytes, no
byte left over), so a part that does not decode raises ValueError. The reader rebuilds the same
roaring bitmaps the writer started from (``roaring_write_block``, the writer's own bytes), so
everything downstream of a decode reads the block format 5 would have given it.

Invariants: this module is where the rule lives. Writing is vectorized numpy (no loop per
entry); reading is on every open bucket's path, so it is a codec kernel with two twins
(``unpack_entry_gaps`` in ``cython/delayindex/_codec_decode.pxi`` and
``delayindex._pure.codec``, held to each other by ``tests/test_codec_gaps.py``). Entries ascend
strictly within each (segment, ledger).
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from delayindex._pure.codec import GAP_ESCAPE

Int64Array = npt.NDArray[np.int64]
UInt32Array = npt.NDArray[np.uint32]


def pack_varints(values: npt.ArrayLike) -> bytes:
    """Non-negative int64 values as unsigned LEB128 varints back to back (vectorized; the
    inverse of the ``read_varints`` kernel)."""
    v = np.asarray(values, dtype=np.int64)
    if len(v) and int(v.min()) < 0:
        raise ValueError("varints must be >= 0")
    u = v.astype(np.uint64)
    sizes = np.ones(len(u), dtype=np.int64)
    for k in range(1, 10):
        sizes += u >= np.uint64(1 << (7 * k))
    starts = np.cumsum(sizes) - sizes
    out = np.empty(int(sizes.sum()), dtype=np.uint8)
    for k in range(int(sizes.max()) if len(sizes) else 0):
        has = sizes > k
        low7 = ((u[has] >> np.uint64(7 * k)) & np.uint64(0x7F)).astype(np.uint8)
        out[starts[has] + k] = low7 | ((sizes[has] > k + 1).astype(np.uint8) << np.uint8(7))
    return out.tobytes()


def pack_entry_gaps(values: UInt32Array, cards: Int64Array) -> bytes:
    """The four streams of ``values`` cut into groups of ``cards`` entries (each group
    strictly ascending, as a block's bitmaps are; ``ValueError`` otherwise)."""
    v = np.asarray(values, dtype=np.int64)
    counts = np.asarray(cards, dtype=np.int64)
    if len(counts) and int(counts.min()) < 1:
        raise ValueError("a (segment, ledger) holds no entry")
    if int(counts.sum()) != len(v):
        raise ValueError("the counts do not add up to the entries")
    starts = np.cumsum(counts) - counts
    later = np.ones(len(v), dtype=np.bool_)
    later[starts] = False
    gaps = np.diff(v, prepend=np.int64(0))[later]
    if len(gaps) and int(gaps.min()) < 1:
        raise ValueError("entries do not ascend within a (segment, ledger)")
    escaped = gaps > GAP_ESCAPE
    steps = np.where(escaped, GAP_ESCAPE, gaps - 1).astype(np.uint8)
    return (
        pack_varints(counts)
        + pack_varints(v[starts])
        + steps.tobytes()
        + pack_varints(gaps[escaped] - (GAP_ESCAPE + 1))
    )
