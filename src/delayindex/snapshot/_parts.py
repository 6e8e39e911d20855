"""The compressed parts of a metadata payload, decoded: zstd, and format 4's bitmaps part.

A format 4 bitmaps part is the byte size of each bitmap (unsigned LEB128 varints, one per
(segment, ledger) of the columns) and then the bitmaps back to back, zstd-compressed when the
entry's flags say so. :func:`deferred_bitmaps` wraps a part in a
:class:`~delayindex.snapshot.blocks.DeferredBlock` that decodes it whole on first use, or only
its leading bytes (:func:`head_block`) when a bucket's first segments are all that is read. The
part's bytes have been verified with the entry's checksum before any of this runs; every
decoding failure raises :class:`~delayindex.errors.SnapshotCorruptError` naming the object.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import zstandard

from delayindex import _impl
from delayindex.errors import SnapshotCorruptError
from delayindex.snapshot.blocks import BitmapBlock, DeferredBlock

#: The most bytes a compressed part may decode to (a bound against a crafted frame).
MAX_DECODED_BYTES = 1 << 30


def decompress(payload: bytes | memoryview) -> bytes:
    """One zstd frame, decoded (``zstandard.ZstdError`` if it is not one, or too large)."""
    out: bytes = zstandard.ZstdDecompressor().decompress(payload, max_output_size=MAX_DECODED_BYTES)
    return out


def deferred_bitmaps(part: memoryview, zstd: bool, name: str) -> Callable[[int], DeferredBlock]:
    """Format 4's bitmaps part, to be decoded on first use into ``count`` bitmaps."""

    def named(decode: Callable[[], BitmapBlock]) -> BitmapBlock:
        try:
            return decode()
        except (zstandard.ZstdError, ValueError) as exc:
            raise SnapshotCorruptError(f"{name}: the bitmaps do not decode: {exc}") from None

    def deferred(count: int) -> DeferredBlock:
        return DeferredBlock(
            lambda: named(lambda: whole_block(part, zstd, count)),
            count,
            len(part),
            lambda n: named(lambda: head_block(part, zstd, count, n)),
        )

    return deferred


def whole_block(part: bytes | memoryview, zstd: bool, count: int) -> BitmapBlock:
    """The ``count`` bitmaps of a bitmaps part (``ValueError`` unless the part is exactly
    their sizes and then their bytes)."""
    raw = decompress(part) if zstd else bytes(part)
    sizes, end = _impl.read_varints(raw, 0, count)
    return BitmapBlock.from_sizes(sizes, raw[end:])


def head_block(part: bytes | memoryview, zstd: bool, count: int, n: int) -> BitmapBlock:
    """The first ``n`` of the ``count`` bitmaps in a bitmaps part, decompressing only the
    part's leading bytes: the ``count`` sizes, then those bitmaps. The sizes' end is found
    from their terminator bytes (below 0x80) rather than by decoding all ``count`` of them;
    :func:`whole_block` later checks that they add up to the part."""
    reader = zstandard.ZstdDecompressor().stream_reader(part) if zstd else None
    data = bytearray() if zstd else bytearray(part)

    def upto(size: int) -> None:
        while reader is not None and len(data) < size:
            chunk = reader.read(min(size, MAX_DECODED_BYTES) - len(data))
            if not chunk:
                break
            data.extend(chunk)

    target = 2 * count + 64  # the sizes: one or two bytes each, as a rule
    while True:
        upto(target)
        ends = np.flatnonzero(np.frombuffer(data, dtype=np.uint8)[:target] < 0x80)
        if len(ends) >= count:
            break
        if len(data) < target or target >= MAX_DECODED_BYTES:
            raise ValueError("the bitmap sizes are cut short")
        target *= 2
    sizes_end = int(ends[count - 1]) + 1 if count else 0
    sizes, _ = _impl.read_varints(bytes(data[:sizes_end]), 0, n)
    need = sizes_end + int(sizes.sum())
    upto(need)
    return BitmapBlock.from_sizes(sizes, bytes(data[sizes_end:need]))
