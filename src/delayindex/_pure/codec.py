"""Pure-Python twins of the native codec kernels (see ``cython/delayindex/_codec.pxi``).

Same API and results: ``roaring_entries`` parses a portable roaring bitmap (through pyroaring),
``pack_times`` bit-packs deliver times LSB-first, ``decode_segments`` turns a batch of segments
into concatenated arrays sorted by ``(time, ledger, entry)``. Malformed input raises ValueError.
"""

from __future__ import annotations

import array
import itertools
from collections.abc import Iterator
from typing import Any

import mmh3
import numpy as np
import numpy.typing as npt
from pyroaring import BitMap

from delayindex._ints import bit_lengths
from delayindex._pure._batch import (
    bit_length,
    pack_segments,
    read_block,
    unpack_segments,
    write_groups,
)
from delayindex._sortkeys import position_order, stable_order, stable_order_int64

Int64Array = npt.NDArray[np.int64]
#: Format 6's entry gaps: a step byte that says the gap is in the escapes stream (the writer,
#: ``delayindex.snapshot._gaps``, uses this one too).
GAP_ESCAPE = 255
_GAP_ENTRY_LIMIT = 2**32  # entry ids are those of 32-bit roaring bitmaps


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

    def __init__(self, raw: bytes, bounds: Int64Array) -> None:
        self.raw = raw
        self.cuts = bounds

    def __len__(self) -> int:
        return len(self.cuts) - 1

    def __getitem__(self, i: int) -> bytes:
        return self._slice(int(self.cuts[i]), int(self.cuts[i + 1]))

    def __iter__(self) -> Iterator[bytes]:
        cuts = self.cuts.tolist()  # Python ints: one conversion for the whole walk
        return (self._slice(a, b) for a, b in itertools.pairwise(cuts))

    def _slice(self, start: int, stop: int) -> bytes:
        if not 0 <= start <= stop <= len(self.raw):
            raise ValueError("bitmap offsets decrease or leave the block")
        return self.raw[start:stop]


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
    return _Block(raw, bounds)


def roaring_cardinalities(blob: bytes, offsets: Any) -> Int64Array:
    """Validate each portable roaring bitmap of a block (``blob`` with ``offsets``, one more
    than the bitmaps) and return their cardinalities (int64 array)."""
    bitmaps = block_bitmaps(blob, offsets)
    return np.array([len(roaring_entries(b)) for b in bitmaps], dtype=np.int64)


def roaring_block_values(blob: bytes, offsets: Any) -> tuple[npt.NDArray[np.uint32], Int64Array]:
    """Parse every portable roaring bitmap of a block (``blob`` with ``offsets``, one more than
    the bitmaps): ``(values, cards)``, the bitmaps' values back to back as uint32 (each one's
    ascending) and each one's cardinality (int64). ValueError if a bitmap is malformed."""
    bitmaps = block_bitmaps(blob, offsets)
    values, cards, ok = read_block(bitmaps.raw, bitmaps.cuts)
    if bool(ok.all()):
        return values, cards
    pieces, at = [], 0
    for i, fast in enumerate(ok.tolist()):  # the batch parser's leftovers, one by one
        if fast:
            pieces.append(values[at : at + int(cards[i])])
            at += int(cards[i])
        else:
            pieces.append(roaring_entries(bitmaps[i]))
            cards[i] = len(pieces[-1])
    return np.concatenate(pieces).astype(np.uint32, copy=False), cards


def roaring_write_block(values: Any, bounds: Any) -> tuple[bytes, Int64Array]:
    """Each group ``values[bounds[g]:bounds[g + 1]]`` (non-empty, ascending) as a portable
    roaring bitmap written as ``build_segments`` writes it (pyroaring's bytes after
    ``run_optimize``), back to back: ``(blob, offsets)``, bitmap ``g`` at
    ``blob[offsets[g]:offsets[g + 1]]``. ValueError on bounds that do not frame ``values`` in
    non-empty groups, or a group not strictly ascending."""
    v = np.asarray(values, dtype=np.uint32)
    b = np.asarray(bounds, dtype=np.int64)
    if b.ndim != 1 or len(b) < 1:
        raise ValueError("group bounds are empty")
    if int(b[0]) != 0 or int(b[-1]) != len(v):
        raise ValueError("group bounds do not span the values")
    if bool((np.diff(b) <= 0).any()):
        raise ValueError("a group is empty or its bounds decrease")
    rises = np.ones(len(v), dtype=np.bool_)
    rises[1:] = v[1:] > v[:-1]
    rises[b[:-1]] = True  # a group's first value follows nothing of its own
    if not bool(rises.all()):
        raise ValueError("a group's values are not ascending")
    return _bitmaps(v, b)


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
    bits = bit_length(span)
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
    if count == 0:
        return np.empty(0, dtype=np.int64), start
    # A varint ends at its first byte below 0x80 and has at most 9 bytes (7 bits each: 63
    # bits, so none is too large for int64), so the count varints lie in 9 * count bytes.
    raw = np.frombuffer(data, dtype=np.uint8)[start : start + 9 * count]
    ends = np.flatnonzero(raw < 0x80)[:count]
    lengths = np.diff(ends, prepend=-1)
    if len(ends) < count or int(lengths.max()) > 9:  # truncated, or one over 9 bytes
        raise ValueError("bad varint")
    end = int(ends[-1]) + 1
    starts = ends - lengths + 1
    # Each byte's 7 bits at 7 * (its place in its varint); disjoint, so summing is OR-ing.
    place = np.arange(end) - np.repeat(starts, lengths)
    bits = (raw[:end] & 0x7F).astype(np.uint64) << (7 * place).astype(np.uint64)
    return np.add.reduceat(bits, starts).astype(np.int64), start + end


def unpack_entry_gaps(
    raw: bytes, start: int, groups: int
) -> tuple[npt.NDArray[np.uint32], Int64Array]:
    """Format 6's entry gaps (``delayindex.snapshot._gaps``): the ``groups`` (segment, ledger)
    entry sets whose streams begin at ``raw[start]`` and end at its end, as ``(values,
    bounds)``, group ``g`` being ``values[bounds[g]:bounds[g + 1]]`` (uint32, int64).
    ValueError unless the streams are exactly well-formed."""
    cards, at = read_varints(raw, start, groups)
    if groups and int(cards.min()) < 1:
        raise ValueError("a (segment, ledger) holds no entry")
    if groups and int(cards.max()) > len(raw):  # each later entry takes a byte at least
        raise ValueError("a (segment, ledger) holds more entries than the part has bytes")
    firsts, at = read_varints(raw, at, groups)
    if groups and int(firsts.max()) >= _GAP_ENTRY_LIMIT:
        raise ValueError("an entry id beyond 32 bits")
    total = int(cards.sum())
    later = total - groups
    if len(raw) - at < later:
        raise ValueError("the entry gaps are cut short")
    steps = np.frombuffer(raw, dtype=np.uint8, count=later, offset=at).astype(np.int64)
    at += later
    escaped = np.flatnonzero(steps == GAP_ESCAPE)
    extra, at = read_varints(raw, at, len(escaped))
    if at != len(raw):
        raise ValueError("bytes after the entry gaps")
    if len(extra) and int(extra.max()) >= _GAP_ENTRY_LIMIT:
        raise ValueError("an entry gap beyond 32 bits")
    steps += 1
    steps[escaped] += extra
    bounds = np.zeros(groups + 1, dtype=np.int64)
    np.cumsum(cards, out=bounds[1:])
    gaps = np.empty(total, dtype=np.int64)
    heads = bounds[:-1]
    is_later = np.ones(total, dtype=np.bool_)
    is_later[heads] = False
    gaps[is_later] = steps
    gaps[heads] = firsts
    # A running sum restarting at each group. No int64 overflow for any part a reader
    # accepts (under 2**30 bytes): a first or a gap of 2**k takes k / 7 of its bytes.
    running = np.cumsum(gaps)
    values = running - np.repeat(running[heads] - firsts, cards)
    if total and int(values.max()) >= _GAP_ENTRY_LIMIT:
        raise ValueError("an entry id beyond 32 bits")
    return values.astype(np.uint32), bounds


def murmur3_32(data: bytes | bytearray | memoryview, seed: int) -> int:
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
    payloads, bits = _payloads(buffer, entry_lengths, first_index, counts, spans)
    empty = np.empty(0, dtype=np.int64)
    if n_seg == 0:
        return empty, empty.copy(), empty.copy(), np.zeros(1, dtype=np.int64)
    n_per_seg = np.asarray(counts, dtype=np.int64)
    bounds = np.asarray(ledger_offsets, dtype=np.int64)
    lo, hi = bounds[:-1], bounds[1:]
    framed = (lo >= 0) & (lo < hi) & (hi <= len(ledgers))
    if not framed.all():
        raise ValueError(f"segment {int(np.argmin(framed))}: bad ledger offsets")
    # Segment s reads ledgers[lo[s]:hi[s]]; consecutive segments, consecutive slices.
    first, last = int(lo[0]), int(hi[-1])
    batch_ledgers = np.asarray(ledgers, dtype=np.int64)[first:last]
    rising = batch_ledgers[1:] > batch_ledgers[:-1]
    rising[lo[1:] - first - 1] = True  # a segment's first ledger need not follow the last's
    if (batch_ledgers[lo - first] < 0).any() or not rising.all():
        raise ValueError("a segment's ledgers are not ascending")
    # The usual single-chunk bitmaps in one pass; any other one by one (naming its error).
    values, cards, parsed = read_block(bitmaps.raw, bitmaps.cuts[first : last + 1])
    if not parsed.all():
        at = np.concatenate(([0], np.cumsum(cards)))
        parts = [
            values[at[i] : at[i + 1]] if parsed[i] else roaring_entries(bitmaps[first + i])
            for i in range(last - first)
        ]
        cards = np.array([len(p) for p in parts], dtype=np.int64)
        values = np.concatenate(parts)
    if not cards.all():
        raise ValueError("an empty bitmap")
    per_seg = np.add.reduceat(cards, lo - first)
    if not np.array_equal(per_seg, n_per_seg):
        s = int(np.flatnonzero(per_seg != n_per_seg)[0])
        raise ValueError(f"segment {s}: bitmap cardinality does not match the count")
    seg_of = np.repeat(np.arange(n_seg), n_per_seg)
    keys = _batch_keys(payloads, n_per_seg, np.asarray(spans, dtype=np.int64), bits)
    order = _by_time_within_segments(keys, seg_of, n_seg)
    out_t = keys.astype(np.int64)[order] + np.asarray(mins, dtype=np.int64)[seg_of]
    out_l = np.repeat(batch_ledgers, cards)[order]
    out_e = values.astype(np.int64)[order]
    if slots is not None:
        # One sort of packed (slot, entry) keys: entries are 32-bit (roaring) and slots dense.
        slot_of = np.repeat(np.asarray(slots, dtype=np.uint64)[first:last], cards)
        pairs = (slot_of << np.uint64(32)) | values.astype(np.uint64)
        pairs.sort()
        if (pairs[1:] == pairs[:-1]).any():
            raise ValueError("an entry of a ledger is in two segments")
    offsets = np.zeros(n_seg + 1, dtype=np.int64)
    np.cumsum(n_per_seg, out=offsets[1:])
    return out_t, out_l, out_e, offsets


def _by_time_within_segments(
    keys: npt.NDArray[np.uint64], seg_of: Int64Array, n_seg: int
) -> npt.NDArray[np.intp]:
    """The order that sorts each segment's keys stably (a segment's positions are in position
    order, so equal times keep it); one stable sort of ``segment << width | key`` when that
    fits 64 bits, a two-key lexsort (several times slower) when not."""
    width = int(keys.max()).bit_length() if len(keys) else 0
    if width + max(n_seg - 1, 0).bit_length() <= 64:
        composite = (seg_of.astype(np.uint64) << np.uint64(width)) | keys
        return stable_order(composite, width + max(n_seg - 1, 0).bit_length())
    return np.lexsort((keys, seg_of))


def _batch_keys(
    payloads: list[bytes], counts: Int64Array, spans: Int64Array, bits: Int64Array
) -> npt.NDArray[np.uint64]:
    """Every segment's packed times minus its minimum (packed at ``bits``, the bit lengths of
    the spans), checked to fill ``[0, span]`` exactly."""
    keys = unpack_segments(payloads, counts, bits)
    starts = np.concatenate(([0], np.cumsum(counts)[:-1]))
    highest = np.maximum.reduceat(keys, starts)
    lowest = np.minimum.reduceat(keys, starts)
    wide = highest > spans.astype(np.uint64)
    if wide.any():
        raise ValueError(f"segment {int(np.argmax(wide))}: a packed time exceeds the span")
    off = (lowest != 0) | (highest != spans.astype(np.uint64))
    if off.any():
        raise ValueError(f"segment {int(np.argmax(off))}: times do not span its metadata range")
    return keys


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
    payloads, bits = _payloads(buffer, entry_lengths, first_index, counts, spans, indexes)
    if not payloads:
        return np.empty(0, dtype=np.int64)
    n_per_seg = np.asarray(counts, dtype=np.int64)
    keys = _batch_keys(payloads, n_per_seg, np.asarray(spans, dtype=np.int64), bits)
    return keys.astype(np.int64) + np.repeat(np.asarray(mins, dtype=np.int64), n_per_seg)


def _payloads(
    buffer: bytes | memoryview,
    entry_lengths: Int64Array,
    first_index: int,
    counts: Int64Array,
    spans: Int64Array,
    indexes: Int64Array | None = None,
) -> tuple[list[bytes], Int64Array]:
    """Each segment's packed times, its entry checked (framing, checksum seeded with its
    object entry index: ``first_index + s`` or ``indexes[s]``, flags, payload length), and
    the bit length of each segment's span, at which its times are packed."""
    n_per_seg = np.asarray(counts, dtype=np.int64)
    if (n_per_seg < 1).any() or (np.asarray(spans, dtype=np.int64) < 0).any():
        raise ValueError("bad count or span")
    lengths = np.asarray(entry_lengths, dtype=np.int64)
    if (lengths < 5).any():
        raise ValueError("truncated entry")
    if int(lengths.sum()) != len(buffer):
        raise ValueError("entry lengths do not add up to the buffer")
    raw = bytes(buffer)
    ends = np.cumsum(lengths)
    starts = ends - lengths
    if indexes is None:
        seeds = np.arange(first_index, first_index + len(lengths), dtype=np.int64)
    else:
        seeds = np.asarray(indexes, dtype=np.int64)
    if len(seeds) and (int(seeds.min()) < 0 or int(seeds.max()) >= 2**32):
        raise OverflowError("seed must fit uint32")
    # An entry is its flags byte, the payload, then the murmur3 of those two (uint32 LE).
    data = np.frombuffer(raw, dtype=np.uint8)
    stored = np.zeros(len(ends), dtype=np.uint32)
    for k in range(4):
        stored |= data[ends - 4 + k].astype(np.uint32) << np.uint32(8 * k)
    computed = np.fromiter(
        (mmh3.hash(raw[a : b - 4], seed, signed=False) for a, b, seed in
         zip(starts.tolist(), ends.tolist(), seeds.tolist(), strict=True)),
        dtype=np.uint32, count=len(ends),
    )  # fmt: skip
    if (computed != stored).any():
        raise ValueError(f"entry {int(seeds[np.argmax(computed != stored)])}: checksum mismatch")
    flags = data[starts] if len(raw) else starts
    if flags.any():
        s = int(np.flatnonzero(flags)[0])
        raise ValueError(f"entry {int(seeds[s])}: unknown flags {int(flags[s]):#x}")
    bits = bit_lengths(np.asarray(spans, dtype=np.int64))
    wrong = lengths - 5 != (n_per_seg * bits + 7) // 8
    if wrong.any():
        raise ValueError(f"segment {int(np.argmax(wrong))}: packed times have the wrong length")
    return [raw[a + 1 : b - 4] for a, b in zip(starts.tolist(), ends.tolist(), strict=True)], bits


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


def _bitmaps(values: npt.NDArray[np.uint32], bounds: Int64Array) -> tuple[bytes, Int64Array]:
    """Each group ``values[bounds[g]:bounds[g + 1]]`` as a portable roaring bitmap (as
    pyroaring writes it after ``run_optimize``), back to back: ``(blob, offsets)``."""
    raw, sizes, fast = write_groups(values, bounds)
    if not fast.all():  # a group over several chunks or 4096 values: pyroaring writes it
        pieces, at = [], 0
        for g, size in enumerate(sizes.tolist()):
            if fast[g]:
                pieces.append(raw[at : at + size])
                at += size
            else:
                bm = BitMap(array.array("I", values[bounds[g] : bounds[g + 1]].tobytes()))
                bm.run_optimize()
                pieces.append(bytes(bm.serialize()))
                sizes[g] = len(pieces[-1])
        raw = b"".join(pieces)
    offsets = np.zeros(len(sizes) + 1, dtype=np.int64)
    np.cumsum(sizes, out=offsets[1:])
    return raw, offsets


def _time_order(
    t: Int64Array, lg: Int64Array, en: Int64Array
) -> tuple[npt.NDArray[np.intp], npt.NDArray[np.intp]]:
    """The order by ``(time, ledger, entry)``, and the order by position it was made from:
    one sort by position, then one stable sort by time (``_sortkeys``: each a plain sort of
    packed words when they fit, about 20x faster than numpy's stable argsort)."""
    by_position = position_order(lg, en)
    return by_position[stable_order_int64(t[by_position])], by_position


def _position_order_within_segments(
    order: npt.NDArray[np.intp], by_position: npt.NDArray[np.intp], seg_of: Int64Array
) -> npt.NDArray[np.intp]:
    """Indexes into the time-sorted rows, each segment's rows in position order."""
    # Where each row went in the time order, taken in position order; then stably by segment
    # (segment numbers are small: segment << bits | index words fit 64 bits).
    moved = np.empty(len(order), dtype=np.intp)
    moved[order] = np.arange(len(order))
    in_position_order = moved[by_position]
    seg = seg_of[in_position_order].astype(np.uint64)
    return in_position_order[stable_order(seg)]


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
    order, by_position = _time_order(t, lg, en)
    t, lg, en = t[order], lg[order], en[order]
    n = len(t)
    # The native cut: up to max_time_step_ms of time and max_indexes_per_segment indexes
    # (-1: no cap; below 1, one index per segment).
    cap = n if max_indexes_per_segment == -1 else max(max_indexes_per_segment, 1)
    # Where a segment starting at each index would end; then follow the chain from 0.
    reach = min(max_time_step_ms - 1, 2**63 - 1)  # the last time a segment may hold, past its first
    upper = np.minimum(t, np.int64(2**63 - 1 - reach)) + np.int64(reach)
    ends = np.minimum(np.searchsorted(t, upper, side="right"), np.arange(n) + min(cap, n))
    cuts = [0]
    while cuts[-1] < n:
        cuts.append(int(ends[cuts[-1]]))
    seg_bounds = np.array(cuts, dtype=np.int64)
    n_seg = len(cuts) - 1
    seg_of = np.repeat(np.arange(n_seg, dtype=np.int64), np.diff(seg_bounds))
    by_pos = _position_order_within_segments(order, by_position, seg_of)
    pos_t, pos_l, pos_e = t[by_pos], lg[by_pos], en[by_pos]
    same_group = (seg_of[1:] == seg_of[:-1]) & (pos_l[1:] == pos_l[:-1])
    dup = same_group & (pos_e[1:] == pos_e[:-1])
    if dup.any():
        i = int(np.flatnonzero(dup)[0]) + 1
        raise ValueError(f"position ({pos_l[i]}, {pos_e[i]}) appears twice")
    group_bounds = np.concatenate(([0], np.flatnonzero(~same_group) + 1, [n])).astype(np.int64)
    if n == 0:
        group_bounds = group_bounds[:1]
    entries32 = pos_e.astype(np.uint32)  # ids are in range: the caller validates
    bitmap_blob, bitmap_offsets = _bitmaps(entries32, group_bounds)
    firsts = group_bounds[:-1]
    seg_ledgers = pos_l[firsts]
    # A segment's groups are its ledgers: offsets count the groups before each segment.
    offsets = np.searchsorted(firsts, seg_bounds, side="left").astype(np.int64)
    mins = t[seg_bounds[:-1]] if n_seg else np.empty(0, dtype=np.int64)
    maxs = t[seg_bounds[1:] - 1] if n_seg else np.empty(0, dtype=np.int64)
    counts = np.diff(seg_bounds)
    packed = pack_segments(pos_t, seg_bounds, mins, maxs - mins)
    columns = [mins, maxs, counts, offsets, seg_ledgers]
    return (t, lg, en, *columns, bitmap_blob, bitmap_offsets, packed)
