"""Pure-Python twins of the native codec kernels (see ``cython/delayindex/_codec.pxi``).

Same API and results: ``roaring_entries`` parses a portable roaring bitmap (through pyroaring),
``pack_times`` bit-packs deliver times LSB-first, ``decode_segments`` turns a batch of segments
into concatenated arrays sorted by ``(time, ledger, entry)``. Malformed input raises ValueError.
"""

from __future__ import annotations

import array
import itertools
import struct
from collections.abc import Iterator
from typing import Any

import mmh3
import numpy as np
import numpy.typing as npt
from pyroaring import BitMap

Int64Array = npt.NDArray[np.int64]


def roaring_entries(data: bytes) -> npt.NDArray[np.uint32]:
    """Parse a portable roaring bitmap into an ascending uint32 numpy array (ValueError if bad)."""
    if not isinstance(data, bytes | bytearray | memoryview):
        raise TypeError(f"a bytes-like object is required, not {type(data).__name__!r}")
    raw = bytes(data)
    try:
        bitmap = BitMap.deserialize(raw)
    except Exception as exc:  # pyroaring raises ValueError (and others on odd input)
        raise ValueError(f"roaring: {exc}") from None
    # pyroaring tolerates trailing bytes; the format does not. A valid portable bitmap
    # re-serializes to exactly its own bytes.
    if bytes(bitmap.serialize()) != raw:
        raise ValueError("roaring: trailing or inconsistent bytes")
    return np.array(bitmap.to_array(), dtype=np.uint32)


class _Block:
    """The bitmaps of a block, each one's bounds checked when it is read (as the native
    ``block_parse`` does: a batch reading a few segments pays nothing for the others)."""

    def __init__(self, raw: bytes, cuts: list[int]) -> None:
        self._raw = raw
        self._cuts = cuts

    def __len__(self) -> int:
        return len(self._cuts) - 1

    def __getitem__(self, i: int) -> bytes:
        start, stop = self._cuts[i], self._cuts[i + 1]
        if not 0 <= start <= stop <= self._cuts[-1]:
            raise ValueError("bitmap offsets decrease or leave the block")
        return self._raw[start:stop]

    def __iter__(self) -> Iterator[bytes]:
        return (self[i] for i in range(len(self)))


def block_bitmaps(blob: bytes | memoryview, offsets: Any, n: int | None = None) -> _Block:
    """The bitmaps of a block (``blob`` with ``offsets``, one more than the bitmaps), framed as
    the native ``block_base`` checks it: ``n`` of them (if given), spanning the whole blob."""
    if not isinstance(blob, bytes | bytearray | memoryview):
        raise TypeError(f"a bytes-like object is required, not {type(blob).__name__!r}")
    bounds = np.asarray(offsets, dtype=np.int64)
    if bounds.ndim != 1 or len(bounds) < 1 or (n is not None and len(bounds) != n + 1):
        raise ValueError("bitmap offsets and bitmaps differ in length")
    raw = bytes(blob)
    if int(bounds[0]) != 0 or int(bounds[-1]) != len(raw):
        raise ValueError("bitmap offsets do not span the bitmap block")
    return _Block(raw, bounds.tolist())


def roaring_cardinalities(blob: bytes, offsets: Any) -> Int64Array:
    """Validate each portable roaring bitmap of a block (``blob`` with ``offsets``, one more
    than the bitmaps) and return their cardinalities (int64 array)."""
    bitmaps = block_bitmaps(blob, offsets)
    return np.array([len(roaring_entries(b)) for b in bitmaps], dtype=np.int64)


def _bit_length(span: int) -> int:
    return int(span).bit_length()


def pack_times(times: Int64Array, base: int, span: int) -> bytes:
    """Bit-pack ``times - base`` at ``bit_length(span)`` bits each, LSB-first."""
    if span < 0:
        raise ValueError("span must be >= 0")
    values = np.asarray(times, dtype=np.int64)
    # Python ints: exact over the full int64 range (base + span may exceed it).
    if len(values) and not (base <= int(values.min()) and int(values.max()) <= base + span):
        offsets = values.astype(np.object_) - base  # the error path: name the first bad time
        bad = next(v for v in offsets.tolist() if not 0 <= v <= span)
        raise ValueError(f"time {bad + base} outside [{base}, {base + span}]")
    bits = _bit_length(span)
    if bits == 0:
        return b""
    # Vectorized: one row of `bits` little-endian bits per value, packed LSB-first.
    unsigned = (values.astype(np.uint64) - np.uint64(base & (2**64 - 1))).astype(np.uint64)
    matrix = (unsigned[:, None] >> np.arange(bits, dtype=np.uint64)) & np.uint64(1)
    return bytes(np.packbits(matrix.astype(np.uint8).ravel(), bitorder="little"))


def read_varints(data: bytes, start: int, count: int) -> tuple[Int64Array, int]:
    """Decode ``count`` unsigned LEB128 varints from ``data[start:]``; ``(values, end)``."""
    if count < 0 or start < 0:
        raise ValueError("bad varint request")
    values: list[int] = []
    pos = start
    for _ in range(count):
        value = shift = 0
        while True:
            if pos >= len(data) or shift > 56:
                raise ValueError("bad varint")
            byte = data[pos]
            pos += 1
            value |= (byte & 0x7F) << shift
            if byte < 0x80:
                break
            shift += 7
        if value >> 63:
            raise ValueError("varint too large")
        values.append(value)
    return np.array(values, dtype=np.int64), pos


def murmur3_32(data: bytes, seed: int) -> int:
    """MurmurHash3 x86_32 of ``data`` (the ``mmh3`` library's)."""
    if not 0 <= seed < 2**32:
        raise OverflowError("seed must fit uint32")
    return int(mmh3.hash(bytes(data), seed, signed=False))


def roaring_check_positions(ledgers: Int64Array, blob: bytes, offsets: Any) -> Int64Array:
    """Validate a bitmap block (``blob``, ``offsets``) aligned with ``ledgers``; fail if a
    (ledger, entry) appears twice."""
    bitmaps = block_bitmaps(blob, offsets, len(ledgers))
    cards = np.array([len(roaring_entries(b)) for b in bitmaps], dtype=np.int64)
    seen: dict[int, BitMap] = {}
    for ledger, data in zip(np.asarray(ledgers).tolist(), bitmaps, strict=True):
        bm = BitMap.deserialize(bytes(data))
        if ledger in seen:
            overlap = seen[ledger] & bm
            if overlap:
                raise ValueError(f"position ({ledger}, {overlap.min()}) is in two segments")
            seen[ledger] |= bm
        else:
            seen[ledger] = bm
    return cards


def _unpack(payload: bytes, n: int, bits: int) -> npt.NDArray[np.uint64]:
    if bits == 0:
        return np.zeros(n, dtype=np.uint64)
    flat = np.unpackbits(np.frombuffer(payload, dtype=np.uint8), bitorder="little")
    matrix = flat[: n * bits].reshape(n, bits).astype(np.uint64)
    values: npt.NDArray[np.uint64] = (matrix << np.arange(bits, dtype=np.uint64)).sum(
        axis=1, dtype=np.uint64
    )
    return values


def decode_segments(
    buffer: bytes | memoryview,
    entry_lengths: Int64Array,
    first_index: int,
    mins: Int64Array,
    spans: Int64Array,
    counts: Int64Array,
    ledger_offsets: Int64Array,
    ledgers: Int64Array,
    blob: bytes,
    bitmap_offsets: Any,
    slots: Int64Array | None = None,
) -> tuple[Int64Array, Int64Array, Int64Array, Int64Array]:
    """Verify and decode consecutive framed segment entries into (time, ledger, entry) order.

    With ``slots`` (a dense id per distinct ledger, aligned with ``ledgers``), also fail if a
    position appears in two of the decoded segments.
    """
    if slots is not None and len(slots) != len(ledgers):
        raise ValueError("slots and ledgers differ in length")
    n_seg = len(entry_lengths)
    if not (len(mins) == len(spans) == len(counts) == n_seg and len(ledger_offsets) == n_seg + 1):
        raise ValueError("per-segment inputs differ in length")
    bitmaps = block_bitmaps(blob, bitmap_offsets, len(ledgers))
    out_t: list[Int64Array] = []
    out_l: list[Int64Array] = []
    out_e: list[Int64Array] = []
    offsets = [0]
    for s, payload in _payloads(buffer, entry_lengths, first_index, counts, spans):
        n, span, low = int(counts[s]), int(spans[s]), int(mins[s])
        a, b = int(ledger_offsets[s]), int(ledger_offsets[s + 1])
        if not 0 <= a < b <= len(ledgers):
            raise ValueError(f"segment {s}: bad ledger offsets")
        seg_ledgers = [int(x) for x in ledgers[a:b]]
        if seg_ledgers[0] < 0 or any(y <= x for x, y in itertools.pairwise(seg_ledgers)):
            raise ValueError(f"segment {s}: ledgers not ascending")
        parts = [roaring_entries(bitmaps[i]) for i in range(a, b)]
        if any(len(p) == 0 for p in parts) or sum(len(p) for p in parts) != n:
            raise ValueError(f"segment {s}: bitmap cardinality does not match the count")
        entries = np.concatenate(parts).astype(np.int64)
        seg_l = np.repeat(np.array(seg_ledgers, dtype=np.int64), [len(p) for p in parts])
        keys = _segment_keys(payload, n, span, s)
        order = np.argsort(keys, kind="stable")
        out_t.append(keys.astype(np.int64)[order] + low)
        out_l.append(seg_l[order])
        out_e.append(entries[order])
        offsets.append(offsets[-1] + n)
    empty = np.empty(0, dtype=np.int64)
    if slots is not None and out_l:
        all_l, all_e = np.concatenate(out_l), np.concatenate(out_e)
        pairs = np.unique(np.stack([all_l, all_e]), axis=1)
        if pairs.shape[1] != len(all_l):
            raise ValueError("an entry of a ledger is in two segments")
    return (
        np.concatenate(out_t) if out_t else empty,
        np.concatenate(out_l) if out_l else empty.copy(),
        np.concatenate(out_e) if out_e else empty.copy(),
        np.array(offsets, dtype=np.int64),
    )


def unpack_segment_times(
    buffer: bytes | memoryview,
    entry_lengths: Int64Array,
    first_index: int,
    mins: Int64Array,
    spans: Int64Array,
    counts: Int64Array,
    indexes: Int64Array | None = None,
) -> Int64Array:
    """Verify framed segment entries and unpack their deliver times only (in each segment's
    position order, segment after segment), without the metadata's bitmaps: the checks of
    :func:`decode_segments` that do not involve positions. Entry ``s`` is the object's entry
    ``first_index + s``, or ``indexes[s]`` when given (entries need not be consecutive)."""
    if not len(mins) == len(spans) == len(counts) == len(entry_lengths):
        raise ValueError("per-segment inputs differ in length")
    if indexes is not None and len(indexes) != len(entry_lengths):
        raise ValueError("one index per entry")
    out = [
        _segment_keys(payload, int(counts[s]), int(spans[s]), s).astype(np.int64) + int(mins[s])
        for s, payload in _payloads(buffer, entry_lengths, first_index, counts, spans, indexes)
    ]
    return np.concatenate(out) if out else np.empty(0, dtype=np.int64)


def _payloads(
    buffer: bytes | memoryview,
    entry_lengths: Int64Array,
    first_index: int,
    counts: Int64Array,
    spans: Int64Array,
    indexes: Int64Array | None = None,
) -> Iterator[tuple[int, bytes]]:
    """Each segment's packed times, its entry checked (framing, checksum seeded with its
    object entry index: ``first_index + s`` or ``indexes[s]``, flags, payload length):
    ``(segment, payload)`` in order."""
    if any(int(c) < 1 for c in counts) or any(int(x) < 0 for x in spans):
        raise ValueError("bad count or span")
    if any(int(x) < 5 for x in entry_lengths):
        raise ValueError("truncated entry")
    if sum(int(x) for x in entry_lengths) != len(buffer):
        raise ValueError("entry lengths do not add up to the buffer")
    pos = 0
    for s in range(len(entry_lengths)):
        entry = bytes(buffer[pos : pos + int(entry_lengths[s])])
        pos += len(entry)
        (stored,) = struct.unpack_from("<I", entry, len(entry) - 4)
        index = first_index + s if indexes is None else int(indexes[s])
        if murmur3_32(entry[:-4], index) != stored:
            raise ValueError(f"entry {index}: checksum mismatch")
        if entry[0] != 0:
            raise ValueError(f"entry {index}: unknown flags {entry[0]:#x}")
        payload = entry[1:-4]
        if len(payload) != (int(counts[s]) * _bit_length(int(spans[s])) + 7) // 8:
            raise ValueError(f"segment {s}: packed times have the wrong length")
        yield s, payload


def _segment_keys(payload: bytes, n: int, span: int, s: int) -> npt.NDArray[np.uint64]:
    """Segment ``s``'s ``n`` packed times minus its minimum, checked to fill ``[0, span]``."""
    keys = _unpack(payload, n, _bit_length(span))
    highest = int(keys.max())
    if highest > span:
        raise ValueError(f"segment {s}: a packed time exceeds the span")
    if int(keys.min()) != 0 or highest != span:
        raise ValueError(f"segment {s}: times do not span its metadata range")
    return keys


def roaring_union_by_ledger(
    ledgers: Int64Array, blob: bytes | memoryview, bitmap_offsets: Any
) -> tuple[Int64Array, Int64Array, npt.NDArray[np.uint32]]:
    """Union the bitmaps of a block (``blob``, ``bitmap_offsets``) by ledger: ``(ledger_ids,
    offsets, entries)`` (see the native)."""
    bitmaps = block_bitmaps(blob, bitmap_offsets, len(ledgers))
    union: dict[int, BitMap] = {}
    for ledger, data in zip(np.asarray(ledgers).tolist(), bitmaps, strict=True):
        try:
            bm = BitMap.deserialize(bytes(data))
        except Exception as exc:  # pyroaring raises plain ValueError or similar
            raise ValueError(f"bad roaring bitmap: {exc}") from None
        if ledger in union:
            overlap = union[ledger] & bm
            if overlap:
                raise ValueError(f"position ({ledger}, {overlap.min()}) is in two segments")
            union[ledger] |= bm
        else:
            union[ledger] = bm
    ids = sorted(union)
    parts = [np.array(union[k].to_array(), dtype=np.uint32) for k in ids]
    offsets = np.cumsum([0, *(len(p) for p in parts)], dtype=np.int64)
    entries = np.concatenate(parts) if parts else np.empty(0, dtype=np.uint32)
    return np.array(ids, dtype=np.int64), offsets, entries.astype(np.uint32)


def build_segments(
    times: Int64Array,
    ledgers: Int64Array,
    entries: Int64Array,
    max_time_step_ms: int,
    max_indexes_per_segment: int,
) -> tuple[Any, ...]:
    """Sort, cut and encode segments in one pass (see the native twin for the result)."""
    t, lg, en = (np.ascontiguousarray(a, dtype=np.int64) for a in (times, ledgers, entries))
    if not len(t) == len(lg) == len(en):
        raise ValueError("times, ledgers and entries differ in length")
    if max_time_step_ms < 1:
        raise ValueError("max_time_step_ms must be >= 1")
    order = np.lexsort((en, lg, t))
    t, lg, en = t[order], lg[order], en[order]
    mins, maxs, counts, offsets = [], [], [], [0]
    seg_ledgers: list[int] = []
    bitmaps: list[bytes] = []
    packed: list[bytes] = []
    n, start = len(t), 0
    # The native cut: up to max_time_step_ms of time and max_indexes_per_segment indexes
    # (-1: no cap; below 1, one index per segment).
    cap = n if max_indexes_per_segment == -1 else max(max_indexes_per_segment, 1)
    while start < n:
        first = int(t[start])
        upper = min(first + max_time_step_ms - 1, 2**63 - 1)
        stop = min(int(np.searchsorted(t, np.int64(upper), side="right")), start + cap)
        by_pos = np.lexsort((en[start:stop], lg[start:stop]))
        seg_t, seg_l, seg_e = t[start:stop][by_pos], lg[start:stop][by_pos], en[start:stop][by_pos]
        same_ledger = seg_l[1:] == seg_l[:-1]
        dup = same_ledger & (seg_e[1:] == seg_e[:-1])
        if dup.any():
            i = int(np.flatnonzero(dup)[0]) + 1
            raise ValueError(f"position ({seg_l[i]}, {seg_e[i]}) appears twice")
        bounds = [0, *(np.flatnonzero(~same_ledger) + 1).tolist(), len(seg_l)]
        entries32 = seg_e.astype(np.uint32)  # ids are in range: the caller validates
        for a, b in itertools.pairwise(bounds):
            bm = BitMap(array.array("I", entries32[a:b].tobytes()))
            bm.run_optimize()
            seg_ledgers.append(int(seg_l[a]))
            bitmaps.append(bytes(bm.serialize()))
        offsets.append(len(seg_ledgers))
        last = int(t[stop - 1])
        mins.append(first)
        maxs.append(last)
        counts.append(stop - start)
        packed.append(pack_times(seg_t, first, last - first))
        start = stop
    columns = [np.array(c, dtype=np.int64) for c in (mins, maxs, counts, offsets, seg_ledgers)]
    bitmap_offsets = np.zeros(len(bitmaps) + 1, dtype=np.int64)
    np.cumsum([len(b) for b in bitmaps], out=bitmap_offsets[1:])
    return (t, lg, en, *columns, b"".join(bitmaps), bitmap_offsets, packed)
