"""Sets of message positions packed for storage: cancelled positions in a manifest's
overrides and in a merged snapshot's folded cancels.

Packed form (a zstd frame of, little-endian)::

    ledger_count u32 | ledgers i64[ledger_count] | counts u32[ledger_count]
    | deltas u32[sum(counts)], byte-shuffled (all first bytes, then all second bytes, ...)

where a ledger's deltas are its first entry, then the gaps between its ascending entries. The
shuffle leaves the high bytes of the small gaps as long runs of zeros, so half of 10 M
positions cancelled at random packs into about 0.2 B per message. ``b""`` is the empty set.

Invariants (checked when packing and on every unpack): ledgers ascending and each once, every
count positive, entries ascending within a ledger and below 2**32, every id non-negative.
Damage of any kind raises ``ValueError``; callers add where the bytes came from.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
import zstandard

Int64Array = npt.NDArray[np.int64]
_ENTRY_LIMIT = 2**32
_ZSTD_LEVEL = 1  # level 3 packs no smaller here and takes twice as long
_MAX_UNPACKED = 2**34  # refuse a frame claiming more (16 GiB: no real override set is near)


def _empty() -> Int64Array:
    return np.empty(0, dtype=np.int64)


def pack_cancelled(ledgers: Int64Array, entries: Int64Array) -> bytes:
    """The packed form of cancelled positions given ascending and unique, as two int64 arrays
    of equal length (b"" for none). ``ValueError`` if they are not."""
    ledgers = np.ascontiguousarray(ledgers, dtype=np.int64)
    entries = np.ascontiguousarray(entries, dtype=np.int64)
    if ledgers.shape != entries.shape or ledgers.ndim != 1:
        raise ValueError("overrides: cancelled ledgers and entries must be 1-d and equal length")
    if not len(ledgers):
        return b""
    if int(ledgers[0]) < 0 or int(entries.min()) < 0 or int(entries.max()) >= _ENTRY_LIMIT:
        raise ValueError("overrides: a cancelled position is out of range")
    step = np.diff(ledgers)
    gaps = np.diff(entries)
    if (step < 0).any() or ((step == 0) & (gaps <= 0)).any():
        raise ValueError("overrides: cancelled positions must ascend, each once")
    firsts = np.flatnonzero(np.r_[True, step != 0])
    counts = np.diff(np.r_[firsts, len(ledgers)]).astype("<u4")
    deltas = np.empty(len(entries), dtype="<u4")
    deltas[1:] = gaps
    deltas[firsts] = entries[firsts]  # index 0 included
    shuffled = deltas.view(np.uint8).reshape(-1, 4).T.tobytes()
    body = b"".join(
        (
            np.array([len(firsts)], dtype="<u4").tobytes(),
            ledgers[firsts].astype("<i8").tobytes(),
            counts.tobytes(),
            shuffled,
        )
    )
    return zstandard.ZstdCompressor(level=_ZSTD_LEVEL).compress(body)


def unpack_cancelled(packed: bytes) -> tuple[Int64Array, Int64Array]:
    """``(ledgers, entries)`` int64 arrays of a packed form, checked against every invariant
    (``ValueError`` for damage of any kind)."""
    if not packed:
        return _empty(), _empty()
    body, n, head = _frame(packed)
    ledgers = np.frombuffer(body, dtype="<i8", count=n, offset=4).astype(np.int64)
    counts = np.frombuffer(body, dtype="<u4", count=n, offset=4 + 8 * n).astype(np.int64)
    total = (len(body) - head) // 4
    if int(counts.sum()) != total or (counts <= 0).any():
        raise ValueError("overrides: packed cancels' counts do not match their entries")
    if ledgers[0] < 0 or (np.diff(ledgers) <= 0).any():
        raise ValueError("overrides: cancelled ledgers must ascend, each once")
    planes = np.frombuffer(body, dtype=np.uint8, offset=head).reshape(4, total)
    deltas = np.ascontiguousarray(planes.T).view("<u4").reshape(total).astype(np.int64)
    firsts = np.r_[0, np.cumsum(counts)[:-1]]
    if len(deltas) > 1:
        inner = np.ones(len(deltas), dtype=np.bool_)
        inner[firsts] = False
        if (deltas[inner] <= 0).any():
            raise ValueError("overrides: cancelled entries must ascend within a ledger")
    # Entries: a running sum of the deltas restarted at each ledger's first.
    sums = np.cumsum(deltas)
    base = np.repeat(sums[firsts] - deltas[firsts], counts)
    entries = sums - base
    if int(entries.max()) >= _ENTRY_LIMIT:
        raise ValueError("overrides: a cancelled entry is out of range")
    return np.repeat(ledgers, counts), entries


def count_packed(packed: bytes) -> int:
    """How many positions a packed form holds (its frame is decompressed, its entries are
    not decoded); ``ValueError`` if it does not unpack."""
    if not packed:
        return 0
    body, _, head = _frame(packed)
    return (len(body) - head) // 4


def _frame(packed: bytes) -> tuple[bytes, int, int]:
    """A non-empty packed form's body, its ledger count and where its deltas start; the
    frame and sizes checked (``ValueError``)."""
    try:
        body = zstandard.ZstdDecompressor().decompress(packed, max_output_size=_MAX_UNPACKED)
    except zstandard.ZstdError as exc:
        raise ValueError(f"overrides: cancelled positions do not unpack ({exc})") from None
    if len(body) < 4:
        raise ValueError("overrides: packed cancels are truncated")
    n = int(np.frombuffer(body, dtype="<u4", count=1)[0])
    head = 4 + 12 * n
    if n == 0 or len(body) < head or (len(body) - head) % 4:
        raise ValueError("overrides: packed cancels have a bad size")
    return body, n, head


def union_unique(
    ledgers: Int64Array, entries: Int64Array, more_ledgers: Int64Array, more_entries: Int64Array
) -> tuple[Int64Array, Int64Array]:
    """Two ascending position sets (int64 column pairs, each position once in each), which
    may overlap, as one ascending pair with each position once.

    O(small log large) when the ledgers fit 31 bits (one int64 key per position: the smaller
    set's new keys are inserted by binary search); a lexicographic sort otherwise."""
    ledgers = np.asarray(ledgers, dtype=np.int64)
    entries = np.asarray(entries, dtype=np.int64)
    more_ledgers = np.asarray(more_ledgers, dtype=np.int64)
    more_entries = np.asarray(more_entries, dtype=np.int64)
    if not len(ledgers) or not len(more_ledgers):
        return (ledgers, entries) if len(ledgers) else (more_ledgers, more_entries)
    if max(int(ledgers[-1]), int(more_ledgers[-1])) < 2**31:
        keys = (ledgers << 32) | entries
        more = (more_ledgers << 32) | more_entries
        small, large = (keys, more) if len(keys) <= len(more) else (more, keys)
        at = np.searchsorted(large, small)
        known = large[np.minimum(at, len(large) - 1)] == small
        merged = np.insert(large, at[~known], small[~known])
        return merged >> 32, merged & 0xFFFFFFFF
    all_ledgers = np.concatenate([ledgers, more_ledgers])
    all_entries = np.concatenate([entries, more_entries])
    order = np.lexsort((all_entries, all_ledgers))
    all_ledgers, all_entries = all_ledgers[order], all_entries[order]
    fresh = np.r_[True, (np.diff(all_ledgers) != 0) | (np.diff(all_entries) != 0)]
    return all_ledgers[fresh], all_entries[fresh]
