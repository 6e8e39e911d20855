"""Batch kernels for the pure codec: many small portable roaring bitmaps, and many segments'
bit-packed times, in a few numpy passes instead of a Python loop per bitmap or segment.

How it works. A snapshot holds one roaring bitmap per (segment, ledger), about a dozen entries
each, nearly all of them a single 2**16 chunk. Those take one of two shapes, byte for byte what
pyroaring writes after ``run_optimize()`` (and what the native ``roaring_write`` writes):

- *array*: cookie 12346, one container, its offset (16), then ``card`` little-endian uint16;
- *run*: cookie 12347 with one container, run flag 1, then ``n_runs`` (start, length - 1) pairs;
  chosen when strictly smaller than the array (``2 + 4 * runs < 2 * card``).

:func:`write_groups` writes every group of at most 4096 values within one chunk in those shapes
at once; :func:`read_block` parses every bitmap of a block that has one of those shapes and
passes all the checks the native parser makes. Anything else (several chunks, a bitset, a
malformed bitmap) is left to the per-bitmap path (pyroaring), so results and errors are exactly
the per-bitmap ones. :func:`pack_segments` / :func:`unpack_segments` bit-pack times of many
segments at once, each segment's payload starting on a byte boundary.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import numpy.typing as npt

from delayindex._ints import bit_lengths

Int64Array = npt.NDArray[np.int64]
UInt32Array = npt.NDArray[np.uint32]
BoolArray = npt.NDArray[np.bool_]

_COOKIE_RUN = 12347
_COOKIE_NO_RUN = 12346
_ARRAY_MAX = 4096
_ARRAY_HEADER = 16  # cookie, container count, key, card - 1, offset
_RUN_HEADER = 11  # cookie, run flags, key, card - 1, n_runs


def _ragged_arange(lengths: Int64Array) -> Int64Array:
    """``concatenate([arange(k) for k in lengths])`` without the loop."""
    total = int(lengths.sum())
    if total == 0:
        return np.empty(0, dtype=np.int64)
    starts = np.repeat(np.cumsum(lengths) - lengths, lengths)
    return np.arange(total, dtype=np.int64) - starts


def _put_u16(out: npt.NDArray[np.uint8], at: Int64Array, values: npt.ArrayLike) -> None:
    v = np.asarray(values, dtype=np.int64)
    out[at] = v & 0xFF
    out[at + 1] = (v >> 8) & 0xFF


def _put_u32(out: npt.NDArray[np.uint8], at: Int64Array, values: npt.ArrayLike) -> None:
    v = np.asarray(values, dtype=np.int64)
    for k in range(4):
        out[at + k] = (v >> (8 * k)) & 0xFF


def _get_u16(raw: npt.NDArray[np.uint8], at: Int64Array) -> Int64Array:
    return raw[at].astype(np.int64) | (raw[at + 1].astype(np.int64) << 8)


def write_groups(values: UInt32Array, bounds: Int64Array) -> tuple[bytes, Int64Array, BoolArray]:
    """Portable roaring bytes of the non-empty groups ``values[bounds[g]:bounds[g + 1]]`` (each
    ascending and distinct) that fit one chunk with at most 4096 values.

    Returns ``(raw, sizes, fast)``: the ``fast`` groups' bitmaps back to back in group order in
    ``raw``, each one's size (0 for the other groups, which the caller writes one by one).
    """
    v = np.asarray(values, dtype=np.int64)
    starts, stops = bounds[:-1], bounds[1:]
    cards = stops - starts
    n_groups = len(cards)
    if n_groups == 0 or len(v) == 0:
        return b"", np.zeros(n_groups, dtype=np.int64), np.zeros(n_groups, dtype=np.bool_)
    keys = v[starts] >> 16
    fast = (cards >= 1) & (cards <= _ARRAY_MAX) & ((v[stops - 1] >> 16) == keys)
    # A run starts at each group's first value and wherever a value does not follow its
    # predecessor; the next run's start (or the end) ends it.
    breaks = np.ones(len(v), dtype=np.bool_)
    breaks[1:] = v[1:] != v[:-1] + 1
    breaks[starts] = True
    firsts = np.flatnonzero(breaks)
    lengths = np.diff(np.append(firsts, len(v)))
    group_of = np.repeat(np.arange(n_groups), cards)
    run_counts = np.bincount(group_of[firsts], minlength=n_groups)
    is_run = 2 + 4 * run_counts < 2 * cards
    sizes = np.where(is_run, _RUN_HEADER + 4 * run_counts, _ARRAY_HEADER + 2 * cards)
    sizes = np.where(fast, sizes, 0)
    base = np.zeros(n_groups + 1, dtype=np.int64)
    np.cumsum(sizes, out=base[1:])
    out = np.zeros(int(base[-1]), dtype=np.uint8)
    at = base[:-1]
    arr = fast & ~is_run
    run = fast & is_run
    a_at, r_at = at[arr], at[run]
    _put_u32(out, a_at, _COOKIE_NO_RUN)
    _put_u32(out, a_at + 4, 1)
    _put_u16(out, a_at + 8, keys[arr])
    _put_u16(out, a_at + 10, cards[arr] - 1)
    _put_u32(out, a_at + 12, _ARRAY_HEADER)
    idx = np.flatnonzero(arr[group_of])
    g = group_of[idx]
    _put_u16(out, at[g] + _ARRAY_HEADER + 2 * (idx - starts[g]), v[idx] & 0xFFFF)
    _put_u32(out, r_at, _COOKIE_RUN)
    out[r_at + 4] = 1
    _put_u16(out, r_at + 5, keys[run])
    _put_u16(out, r_at + 7, cards[run] - 1)
    _put_u16(out, r_at + 9, run_counts[run])
    in_run = run[group_of[firsts]]
    r_first, r_len = firsts[in_run], lengths[in_run]
    g = group_of[r_first]
    slot = at[g] + _RUN_HEADER + 4 * _ragged_arange(run_counts[run])
    _put_u16(out, slot, v[r_first] & 0xFFFF)
    _put_u16(out, slot + 2, r_len - 1)
    return out.tobytes(), sizes, fast


def read_block(raw: bytes, cuts: Int64Array) -> tuple[UInt32Array, Int64Array, BoolArray]:
    """Parse the bitmaps ``raw[cuts[i]:cuts[i + 1]]`` that have one of the two single-chunk
    shapes and pass the native parser's checks. Returns ``(values, counts, ok)``: the parsed
    values of the ``ok`` bitmaps, back to back in order, and each bitmap's count (0 when not
    ``ok``). The caller parses the others one by one (and reports their errors)."""
    # Padded so that a header read past a short bitmap stays inside (and is masked out).
    data = np.frombuffer(bytes(raw) + bytes(_ARRAY_HEADER), dtype=np.uint8)
    lo = np.asarray(cuts[:-1], dtype=np.int64)
    size = np.asarray(cuts[1:], dtype=np.int64) - lo
    # A bitmap whose bounds leave the block is the per-bitmap path's to report.
    framed = (lo >= 0) & (size >= 0) & (lo + size <= len(raw))
    lo = np.where(framed, lo, 0)
    size = np.where(framed, size, -1)
    n = len(lo)

    def u16(off: int, need: BoolArray) -> Int64Array:
        return np.where(need, _get_u16(data, lo + off), -1)

    has16 = size >= _ARRAY_HEADER
    has11 = size >= _RUN_HEADER
    cookie_lo = u16(0, size >= 4)
    cookie_hi = u16(2, size >= 4)
    # Array shape: 12346, one container, offset 16, exact size.
    a_card = u16(10, has16) + 1
    arr = (
        has16
        & (cookie_lo == _COOKIE_NO_RUN)
        & (cookie_hi == 0)
        & (u16(4, has16) == 1)
        & (u16(6, has16) == 0)
        & (u16(12, has16) == _ARRAY_HEADER)
        & (u16(14, has16) == 0)
        & (a_card <= _ARRAY_MAX)
        & (size == _ARRAY_HEADER + 2 * a_card)
    )
    # Run shape: 12347 with one container, run flag 1, exact size.
    flags = np.where(has11, data[lo + 4], -1)
    n_runs = u16(9, has11)
    run = (
        has11
        & (cookie_lo == _COOKIE_RUN)
        & (cookie_hi == 0)
        & (flags == 1)
        & (n_runs >= 1)
        & (size == _RUN_HEADER + 4 * n_runs)
    )
    key = np.where(arr | run, u16(5, has11), 0)
    key = np.where(arr, u16(8, has16), key)
    counts = np.zeros(n, dtype=np.int64)
    ok = arr | run
    # Array bodies: strictly ascending.
    a_counts = np.where(arr, a_card, 0)
    a_group = np.repeat(np.arange(n), a_counts)
    a_vals = _get_u16(data, lo[a_group] + _ARRAY_HEADER + 2 * _ragged_arange(a_counts[arr]))
    if len(a_vals) > 1:
        same = a_group[1:] == a_group[:-1]
        bad = same & (a_vals[1:] <= a_vals[:-1])
        ok[a_group[1:][bad]] = False
    # Run bodies: in range, ascending, not overlapping, adding up to the cardinality.
    r_counts = np.where(run, n_runs, 0)
    r_group = np.repeat(np.arange(n), r_counts)
    slot = lo[r_group] + _RUN_HEADER + 4 * _ragged_arange(r_counts[run])
    r_start = _get_u16(data, slot)
    r_len = _get_u16(data, slot + 2)
    r_last = r_start + r_len
    bad_run = r_last > 0xFFFF
    if len(r_start) > 1:
        same = r_group[1:] == r_group[:-1]
        bad_run[1:] |= same & (r_start[1:] <= r_last[:-1])
    ok[r_group[bad_run]] = False
    r_card = np.zeros(n, dtype=np.int64)
    np.add.at(r_card, r_group, r_len + 1)
    r_declared = u16(7, has11) + 1
    ok[run & (r_card != r_declared)] = False
    counts[arr & ok] = a_card[arr & ok]
    counts[run & ok] = r_card[run & ok]
    # Values of the bitmaps that passed, in bitmap order.
    a_keep = ok[a_group]
    r_keep = ok[r_group]
    a_out_group = a_group[a_keep]
    a_out = (key[a_out_group] << 16) | a_vals[a_keep]
    r_g = r_group[r_keep]
    r_expand = r_len[r_keep] + 1
    r_out_group = np.repeat(r_g, r_expand)
    r_out = (key[r_out_group] << 16) | (
        np.repeat(r_start[r_keep], r_expand) + _ragged_arange(r_expand)
    )
    groups = np.concatenate([a_out_group, r_out_group])
    vals = np.concatenate([a_out, r_out])
    order = np.argsort(groups, kind="stable")  # arrays and runs back in bitmap order
    return vals[order].astype(np.uint32), counts, ok


#: Segments are packed this many times at a time at most (bounds the temporaries).
_PACK_CHUNK = 1 << 16


def bit_length(span: int) -> int:
    """Bits per packed time of a segment spanning ``span`` (the format's one width rule)."""
    return int(span).bit_length()


def _chunks(bounds: Int64Array) -> Iterator[tuple[int, int]]:
    """Segments ``[s, stop)`` in chunks of whole segments, at least one each, of at most
    ``_PACK_CHUNK`` times unless one segment alone holds more (``bounds``: cumulative counts)."""
    n_seg = len(bounds) - 1
    s = 0
    while s < n_seg:
        stop = int(np.searchsorted(bounds, bounds[s] + _PACK_CHUNK, side="right")) - 1
        stop = min(max(stop, s + 1), n_seg)
        yield s, stop
        s = stop


def _value_places(
    counts: Int64Array, bits: Int64Array, seg_starts: Int64Array
) -> tuple[Int64Array, Int64Array, Int64Array, Int64Array]:
    """Where each packed value's bits lie in the stream read as little-endian 64-bit words
    (LSB-first bits, so the words' bytes are the format's): segment ``s`` holds ``counts[s]``
    values of ``bits[s]`` bits from byte ``seg_starts[s]`` on. Returns per value its width, its
    first bit's word and place in it, and the indexes of the values that spill into the next
    word (past bit 63; the others must not be shifted by 64 there: undefined)."""
    widths = np.repeat(bits, counts)
    first_bit = np.repeat(8 * seg_starts, counts) + _ragged_arange(counts) * widths
    shift = first_bit & 63
    return widths, first_bit >> 6, shift, np.flatnonzero(shift + widths > 64)


def pack_segments(
    times: Int64Array, bounds: Int64Array, mins: Int64Array, spans: Int64Array
) -> list[bytes]:
    """``pack_times(times[bounds[s]:bounds[s + 1]], mins[s], spans[s])`` for every segment
    ``s`` (each segment's times within its range: the caller made them so)."""
    bits = bit_lengths(spans)
    out: list[bytes] = []
    for s, stop in _chunks(bounds):
        out.extend(_pack_chunk(times, bounds[s : stop + 1], mins[s:stop], bits[s:stop]))
    return out


def _pack_chunk(
    times: Int64Array, bounds: Int64Array, mins: Int64Array, bits: Int64Array
) -> list[bytes]:
    lo, hi = int(bounds[0]), int(bounds[-1])
    counts = np.diff(bounds)
    offsets = times[lo:hi].astype(np.uint64) - np.repeat(mins.astype(np.uint64), counts)
    # Each segment's payload starts on a byte boundary and pads its last byte with zeros.
    seg_bytes = (counts * bits + 7) // 8
    at = np.cumsum(seg_bytes) - seg_bytes
    total_bytes = int(seg_bytes.sum())
    _, word, shift, spill = _value_places(counts, bits, at)
    # Values share no bit, so summing a word's contributions is OR-ing them; values come in
    # stream order, so each word's contributions are one run (``reduceat``).
    words = np.zeros(total_bytes // 8 + 2, dtype=np.uint64)
    if len(word):
        runs = np.flatnonzero(np.concatenate(([True], word[1:] != word[:-1])))
        words[word[runs]] = np.add.reduceat(offsets << shift.astype(np.uint64), runs)
        if len(spill):
            high = np.zeros(len(word), dtype=np.uint64)
            high[spill] = offsets[spill] >> (64 - shift[spill]).astype(np.uint64)
            words[word[runs] + 1] += np.add.reduceat(high, runs)
    raw = words.astype("<u8").tobytes()[:total_bytes]
    return [raw[a : a + k] for a, k in zip(at.tolist(), seg_bytes.tolist(), strict=True)]


def unpack_segments(
    payloads: list[bytes], counts: Int64Array, bits: Int64Array
) -> npt.NDArray[np.uint64]:
    """Each segment's ``counts[s]`` times packed at ``bits[s]`` bits, ``bit_length`` of its
    span (the inverse of :func:`pack_segments`, less the minimum), back to back; the lengths
    are the caller's to check."""
    bounds = np.zeros(len(counts) + 1, dtype=np.int64)
    np.cumsum(counts, out=bounds[1:])
    out = [
        _unpack_chunk(payloads[s:stop], counts[s:stop], bits[s:stop]) for s, stop in _chunks(bounds)
    ]
    return np.concatenate(out) if out else np.empty(0, dtype=np.uint64)


def _unpack_chunk(
    payloads: list[bytes], counts: Int64Array, bits: Int64Array
) -> npt.NDArray[np.uint64]:
    seg_bytes = np.array([len(p) for p in payloads], dtype=np.int64)
    widths, word, shift, spill = _value_places(counts, bits, np.cumsum(seg_bytes) - seg_bytes)
    # The inverse of _pack_chunk: a value is its first word's bits from its first bit on, plus
    # the next word's low bits when it spills past bit 63 (padded: that word always exists).
    joined = b"".join(payloads)
    stream: npt.NDArray[np.uint64] = np.frombuffer(
        joined + bytes(16 - len(joined) % 8), dtype="<u8"
    )
    value = stream[word] >> shift.astype(np.uint64)
    value[spill] |= stream[word[spill] + 1] << (64 - shift[spill]).astype(np.uint64)
    # Keep each value's own bits (a 64-bit one keeps all: no shift by 64 here either).
    narrow = widths < 64
    mask = np.full(len(value), np.uint64(2**64 - 1), dtype=np.uint64)
    mask[narrow] = (np.uint64(1) << widths[narrow].astype(np.uint64)) - np.uint64(1)
    return value & mask
