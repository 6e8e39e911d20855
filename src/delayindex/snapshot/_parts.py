"""The compressed parts of a metadata payload, decoded: zstd, and the second part of formats
4 to 6.

A format 4 bitmaps part is the byte size of each bitmap (unsigned LEB128 varints, one per
(segment, ledger) of the columns) and then the bitmaps back to back, zstd-compressed when the
entry's flags say so. :func:`deferred_bitmaps` wraps a part in a
:class:`~delayindex.snapshot.blocks.DeferredBlock` that decodes it whole on first use, or only
its leading bytes (:func:`head_block`) when a bucket's first segments are all that is read. A
format 5 positions part puts the ledger columns (each segment's ledger count, then the ledger
deltas, varints) before such a bitmaps part; :func:`positions_part` wraps it in a
:class:`~delayindex.snapshot.blocks.LazyPositions`, which decodes the ledger columns from the
leading bytes on first use and the bitmaps after them. A format 6 positions part has the
entry gaps (:mod:`delayindex.snapshot._gaps`) where format 5 has the bitmaps part; it is
decoded whole, its bitmaps rebuilt (:func:`gap_block`). :func:`ledger_columns` is the one rule
that turns stored ledger columns into ``(ledger_offsets, ledgers)`` and checks them, for every
format. The parts' bytes have been verified with the entry's checksum before any of this runs;
every decoding failure raises :class:`~delayindex.errors.SnapshotCorruptError` naming the
object.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import numpy as np
import numpy.typing as npt
import zstandard

from delayindex import _impl
from delayindex.errors import SnapshotCorruptError
from delayindex.snapshot.blocks import BitmapBlock, BlockLike, DeferredBlock, LazyPositions

_T = TypeVar("_T")

#: The most bytes a compressed part may decode to (a bound against a crafted frame).
MAX_DECODED_BYTES = 1 << 30


def decompress(payload: bytes | memoryview) -> bytes:
    """One zstd frame, decoded (``zstandard.ZstdError`` if it is not one, or too large)."""
    out: bytes = zstandard.ZstdDecompressor().decompress(payload, max_output_size=MAX_DECODED_BYTES)
    return out


def deferred_bitmaps(
    part: memoryview, zstd: bool, name: str, start: int = 0
) -> Callable[[int], DeferredBlock]:
    """A bitmaps part (format 4's whole part; format 5's from decoded byte ``start``, after the
    ledger columns), to be decoded on first use into ``count`` bitmaps."""

    def named(decode: Callable[[], BitmapBlock]) -> BitmapBlock:
        return _named(decode, name, "bitmaps")

    def deferred(count: int) -> DeferredBlock:
        return DeferredBlock(
            lambda: named(lambda: whole_block(part, zstd, count, start)),
            count,
            len(part),
            lambda n: named(lambda: head_block(part, zstd, count, n, start)),
        )

    return deferred


def whole_block(part: bytes | memoryview, zstd: bool, count: int, start: int = 0) -> BitmapBlock:
    """The ``count`` bitmaps of a bitmaps part whose sizes begin at decoded byte ``start``
    (``ValueError`` unless the part is exactly their sizes and then their bytes)."""
    raw = decompress(part) if zstd else bytes(part)
    sizes, end = _impl.read_varints(raw, start, count)
    return BitmapBlock.from_sizes(sizes, raw[end:])


class _Prefix:
    """A part's leading decoded bytes, decompressed only as far as asked for."""

    def __init__(self, part: bytes | memoryview, zstd: bool) -> None:
        self._reader = zstandard.ZstdDecompressor().stream_reader(part) if zstd else None
        self.data = bytearray() if zstd else bytearray(part)

    def upto(self, size: int) -> None:
        """Decode at least ``size`` bytes (fewer only at the part's end)."""
        while self._reader is not None and len(self.data) < size:
            chunk = self._reader.read(min(size, MAX_DECODED_BYTES) - len(self.data))
            if not chunk:
                break
            self.data.extend(chunk)

    def varints_end(self, start: int, count: int, what: str) -> int:
        """Where the ``count`` varints from ``start`` end, found from their terminator bytes
        (below 0x80; the rule of the pure ``read_varints``) without decoding them all."""
        if count == 0:
            return start
        target = start + 2 * count + 64  # one or two bytes each, as a rule
        while True:
            self.upto(target)
            ends = np.flatnonzero(np.frombuffer(self.data, dtype=np.uint8)[start:target] < 0x80)
            if len(ends) >= count:
                return start + int(ends[count - 1]) + 1
            if len(self.data) < target or target >= MAX_DECODED_BYTES:
                raise ValueError(f"the {what} are cut short")
            target = start + 2 * (target - start)


def head_block(
    part: bytes | memoryview, zstd: bool, count: int, n: int, start: int = 0
) -> BitmapBlock:
    """The first ``n`` of the ``count`` bitmaps in a bitmaps part whose sizes begin at decoded
    byte ``start``, decompressing only the part's leading bytes: the ``count`` sizes, then
    those bitmaps. :func:`whole_block` later checks that the sizes add up to the part."""
    prefix = _Prefix(part, zstd)
    sizes_end = prefix.varints_end(start, count, "bitmap sizes")
    sizes, _ = _impl.read_varints(bytes(prefix.data[start:sizes_end]), 0, n)
    need = sizes_end + int(sizes.sum())
    prefix.upto(need)
    return BitmapBlock.from_sizes(sizes, bytes(prefix.data[sizes_end:need]))


def ledger_columns(
    ledger_counts: npt.NDArray[np.int64],
    deltas: npt.NDArray[np.uint64],
    start: int,
    end: int,
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """A bucket's ``(ledger_offsets, ledgers)`` from their stored form: per segment the
    number of its ledgers, and its ledgers as the first one's offset from ``start`` then
    deltas, modulo 2**64 (every format stores them so). ``ValueError`` unless every segment
    has ledgers, ascending and inside ``[start, end]``."""
    if np.any(ledger_counts < 1):
        raise ValueError("a segment has no ledgers")
    offsets = np.concatenate([[0], np.cumsum(ledger_counts)]).astype(np.int64)
    if len(deltas) != int(offsets[-1]):
        raise ValueError("ledger columns do not match the ledger counts")
    span = np.uint64(end - start)
    if np.any(deltas > span):
        raise ValueError("a ledger lies outside the bucket's range")
    firsts = offsets[:-1]
    repeated = deltas == 0
    repeated[firsts] = False  # a segment's first ledger may be the bucket's start
    if repeated.any():
        raise ValueError("a segment's ledgers are not ascending")
    # A cumulative sum restarting at each segment: each segment's first step also takes back
    # the previous segment's total (modulo 2**64, as the sums are; the result is exact).
    steps = deltas.copy()
    steps[firsts[1:]] -= np.add.reduceat(deltas, firsts)[:-1]
    relative = np.cumsum(steps, dtype=np.uint64)
    if relative.max(initial=0) > span:
        raise ValueError("a ledger lies outside the bucket's range")
    return offsets, relative.astype(np.int64) + np.int64(start)


def positions_part(
    part: memoryview,
    zstd: bool,
    name: str,
    segments: int,
    start: int,
    end: int,
    gap_counts: npt.NDArray[np.int64] | None = None,
) -> LazyPositions:
    """A positions part of ``segments`` segments, decoded on first use
    (:class:`~delayindex.snapshot.blocks.LazyPositions`). Format 5 (``gap_counts`` None): the
    ledger columns, decoded from its leading bytes, then a bitmaps part, decoded later as
    :func:`deferred_bitmaps`. Format 6: the ledger columns, then the entry gaps, decoded whole
    and their bitmaps rebuilt (:func:`gap_block`), checked against ``gap_counts``, the
    segments' index counts."""

    def decode() -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64], BlockLike]:
        if gap_counts is not None:  # format 6: decoded whole
            raw = decompress(part) if zstd else bytes(part)
            counts, at = _impl.read_varints(raw, 0, segments)
            total = _checked_ledger_counts(counts)
            deltas, at = _impl.read_varints(raw, at, total)
            offsets, ledgers = ledger_columns(counts, deltas.view(np.uint64), start, end)
            return offsets, ledgers, gap_block(raw, at, offsets, gap_counts)
        prefix = _Prefix(part, zstd)
        counts_end = prefix.varints_end(0, segments, "ledger counts")
        counts, _ = _impl.read_varints(bytes(prefix.data[:counts_end]), 0, segments)
        total = _checked_ledger_counts(counts)
        deltas_end = prefix.varints_end(counts_end, total, "ledger deltas")
        deltas, _ = _impl.read_varints(bytes(prefix.data[counts_end:deltas_end]), 0, total)
        offsets, ledgers = ledger_columns(counts, deltas.view(np.uint64), start, end)
        return offsets, ledgers, deferred_bitmaps(part, zstd, name, deltas_end)(total)

    # Format 5's bitmaps fail later, as "bitmaps"; format 6's gaps fail with its columns.
    what = "ledger columns" if gap_counts is None else "positions"
    return LazyPositions(lambda: _named(decode, name, what), len(part))


def _checked_ledger_counts(counts: npt.NDArray[np.int64]) -> int:
    """The number of (segment, ledger)s of stored ledger counts (``ValueError`` unless each
    is at least 1 and no more than a part can hold)."""
    if int(counts.min(initial=1)) < 1:
        raise ValueError("a segment has no ledgers")
    if int(counts.max(initial=0)) > MAX_DECODED_BYTES:  # more than the part can hold
        raise ValueError("a segment has too many ledgers")
    return int(counts.sum())  # below 2**61: no wrap-around


def gap_block(
    raw: bytes, start: int, ledger_offsets: npt.NDArray[np.int64], counts: npt.NDArray[np.int64]
) -> BitmapBlock:
    """The bitmaps of format 6's entry gaps at ``raw[start:]`` (one per ledger of the ledger
    columns ``ledger_offsets``), rebuilt as the writer's bytes; ``ValueError`` unless each
    segment's bitmaps hold its count of ``counts``."""
    pairs = int(ledger_offsets[-1])
    values, bounds = _impl.unpack_entry_gaps(raw, start, pairs)
    held = np.add.reduceat(np.diff(bounds), ledger_offsets[:-1]) if pairs else bounds[:0]
    if not np.array_equal(held, counts):
        raise ValueError("the entry gaps do not hold the segment counts")
    blob, offsets = _impl.roaring_write_block(values, bounds)
    return BitmapBlock(blob, offsets)


def _named(decode: Callable[[], _T], name: str, what: str) -> _T:
    try:
        return decode()
    except (zstandard.ZstdError, ValueError) as exc:
        raise SnapshotCorruptError(f"{name}: the {what} do not decode: {exc}") from None
