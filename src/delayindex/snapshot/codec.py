"""Snapshot bytes: the object layout, checksums, compression and (only here) protobuf.

Object layout (object version 1, all integers little-endian)::

    magic      4 bytes  b"DIXS"
    version    u16      1
    table_len  u32      length of the entry table that follows
    table               varint entry count, then one varint length per entry
    header_crc u32      mmh3 (seed HEADER_SEED) of everything above
    entries             entry 0 = metadata, entries 1..N = segments N

    entry      flags u8 | payload | crc u32   (mmh3 of flags + payload, seeded with the entry index)

Metadata payload, format 6 (written; ``flags & FLAG_SPLIT``): ``varint len(columns) | columns |
positions``, two parts each zstd-compressed when ``flags & FLAG_ZSTD``. The columns are a
``SnapshotMetadata`` protobuf without ledger columns or bitmap fields (and with the cancels a
merge folded into the bucket, if any); the positions are the ledger columns (varints: each
segment's ledger count, then the ledger deltas) and then each (segment, ledger)'s entry ids as
gaps (:mod:`delayindex.snapshot._gaps`), from which a decode rebuilds the roaring bitmaps
byte for byte. The columns decode alone: the positions part is decompressed and checked on
first use (:mod:`delayindex.snapshot._parts`), so whatever needs only times and counts (an
open) never pays for the positions. Older formats, still read and re-encoded as themselves:
format 5 stores the bitmaps themselves (their sizes as varints, then their bytes) where format
6 stores gaps; format 4 is format 5 with the ledger columns in its columns part; before it one
protobuf, zstd-compressed when ``flags & FLAG_ZSTD``: format 2 holds the bitmaps as one block
plus their sizes inside it, format 1 one protobuf ``bytes`` per bitmap, and format 3 is format
2 plus folded cancels (packed, unpacked and range-checked on every decode).
Segment payload: the segment's deliver times minus the segment minimum, bit-packed LSB-first at
``bit_length(max - min)`` bits each, in position order (as the segment's bitmaps enumerate
positions), so a one-index segment with min == max has an empty payload. Positions are never
stored twice: they live only in the metadata bitmaps.

Every check failure (magic, version, lengths, checksums, decompression, protobuf, any
inconsistency) raises :class:`~delayindex.errors.SnapshotCorruptError` naming the object and
what failed; nothing decodes silently wrong. See docs/snapshot-format.md.
"""

from __future__ import annotations

import re
import struct
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import mmh3
import numpy as np
import numpy.typing as npt
import zstandard
from google.protobuf.message import DecodeError

from delayindex import _impl
from delayindex.errors import SnapshotCorruptError
from delayindex.model import MAX_LEDGER_ID
from delayindex.pb import snapshot_pb2
from delayindex.snapshot._gaps import pack_entry_gaps
from delayindex.snapshot._gaps import pack_varints as pack_varints  # re-exported: used from here
from delayindex.snapshot._parts import decompress, deferred_bitmaps, ledger_columns, positions_part
from delayindex.snapshot.blocks import BitmapBlock, DeferredBlock, LazyPositions
from delayindex.snapshot.format import (
    FORMAT_VERSIONS,
    GAPS_FORMAT_VERSION,
    LEDGERS_APART_FORMAT_VERSION,
    MAX_SEGMENT_SPAN,
    SPLIT_FORMAT_VERSION,
    Int64Array,
    PreparedSegments,
    Segment,
    SegmentList,
    SnapshotMetadata,
)

MAGIC = b"DIXS"
OBJECT_VERSION = 1
HEADER_SEED = 0x44495853
FLAG_ZSTD = 0x01
#: The metadata payload is two parts, columns then bitmaps (format 4 and later).
FLAG_SPLIT = 0x02
_KNOWN_METADATA_FLAGS = FLAG_ZSTD | FLAG_SPLIT
ZSTD_LEVEL = 9
_FIXED = struct.Struct("<4sHI")  # magic, version, table_len
FIXED_HEADER_BYTES = _FIXED.size
_CRC = struct.Struct("<I")
_MAX_TABLE_BYTES = 64 << 20


@dataclass(frozen=True)
class ObjectHeader:
    """Where each entry of a stored object lies."""

    version: int
    entry_lengths: tuple[int, ...]
    header_bytes: int
    #: Byte offset of each entry and of the end, from the parsed table (reads look it up; a
    #: header may stay cached with its object's metadata, so int64s rather than Python ints).
    _offsets: npt.NDArray[np.int64] = field(compare=False, repr=False)

    @property
    def num_segments(self) -> int:
        """Segments in the object (entries minus the metadata)."""
        return len(self.entry_lengths) - 1

    @property
    def total_bytes(self) -> int:
        """Length of the whole object."""
        return int(self._offsets[-1])

    def entry_offset(self, index: int) -> int:
        """Byte offset of entry ``index`` from the start of the object."""
        return int(self._offsets[index])

    def span(self, first: int, last: int) -> int:
        """Bytes of entries ``first..last`` (inclusive)."""
        return int(self._offsets[last + 1] - self._offsets[first])

    def extents(self, firsts: Int64Array, lasts: Int64Array) -> tuple[Int64Array, Int64Array]:
        """Byte offset and length of each run of entries ``firsts[i]..lasts[i]`` (inclusive,
        in range)."""
        offsets = self._offsets
        return offsets[firsts], offsets[lasts + 1] - offsets[firsts]


# -- varints ------------------------------------------------------------------------------------


def _put_varint(out: bytearray, value: int) -> None:
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)


def _get_varint(data: bytes | memoryview, pos: int, end: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if pos >= end or shift > 63:
            raise ValueError("bad varint")
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, pos
        shift += 7


# -- entries ------------------------------------------------------------------------------------


def _frame(index: int, flags: int, payload: bytes) -> bytes:
    body = bytes([flags]) + payload
    return body + _CRC.pack(mmh3.hash(body, index, signed=False))


def _unframe(entry: bytes, index: int, name: str) -> tuple[int, memoryview]:
    """An entry's flags and payload, its checksum verified (the payload is a view: a metadata
    entry is hundreds of kilobytes, and its parts are cut from it without copies)."""
    if len(entry) < 1 + _CRC.size:
        raise SnapshotCorruptError(f"{name}: entry {index} is truncated ({len(entry)} bytes)")
    body = memoryview(entry)[: -_CRC.size]
    (stored,) = _CRC.unpack_from(entry, len(entry) - _CRC.size)
    if _impl.murmur3_32(body, index) != stored:  # mmh3's hash, without copying the body
        raise SnapshotCorruptError(f"{name}: entry {index} checksum mismatch")
    return body[0], body[1:]


#: A stamped index name is a manifest name (``storage.manifest.KEY_PATTERN``, repeated here:
#: the storage package imports this module).
_INDEX_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._~-]{0,199}")


# -- encoding -----------------------------------------------------------------------------------


def _wrapping_diff(values: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        return np.diff(values, prepend=np.int64(0))


def _metadata_payload(metadata: SnapshotMetadata) -> bytes:
    """The protobuf bytes: all of the metadata before format 4, its columns from format 4
    (from format 5 without the ledger columns)."""
    payload: bytes = _metadata_message(metadata).SerializeToString()
    return payload


def _bitmaps_part(block: BitmapBlock) -> bytes:
    """Format 4's second part (format 5's, after the ledger columns): the bitmaps' sizes
    (varints), then the bitmaps."""
    return pack_varints(np.diff(block.offsets)) + block.blob


def _positions_part(metadata: SnapshotMetadata) -> bytes:
    """The second part: from format 5 the ledger columns (varints: each segment's ledger
    count, then the ledger deltas), then format 6's entry gaps (:mod:`._gaps`) or format 4's
    whole part (:func:`_bitmaps_part`)."""
    block = metadata.block
    if metadata.format_version < LEDGERS_APART_FORMAT_VERSION:
        return _bitmaps_part(block)
    counts, deltas = _stored_ledgers(metadata)
    ledgers = pack_varints(counts) + pack_varints(deltas)
    if metadata.format_version < GAPS_FORMAT_VERSION:
        return ledgers + _bitmaps_part(block)
    values, cards = _impl.roaring_block_values(block.blob, block.offsets)
    return ledgers + pack_entry_gaps(values, cards)


def _stored_ledgers(metadata: SnapshotMetadata) -> tuple[Int64Array, Int64Array]:
    """The ledger columns as every format stores them (the inverse of
    :func:`~delayindex.snapshot._parts.ledger_columns`): each segment's ledger count, and per
    segment its first ledger's offset from start_ledger, then deltas within it."""
    offsets = metadata.ledger_offsets
    ledgers = metadata.ledgers
    deltas = np.diff(ledgers, prepend=np.int64(metadata.start_ledger))
    if len(ledgers):
        firsts = offsets[:-1]
        deltas[firsts] = ledgers[firsts] - metadata.start_ledger
    return np.diff(offsets), deltas


def _metadata_entry(columns: bytes, bitmaps: bytes | None) -> bytes:
    """Framed entry 0: one protobuf (``bitmaps`` None, formats 1-3) or two parts (4 and 5);
    compressed when that makes it smaller."""
    compress = zstandard.ZstdCompressor(level=ZSTD_LEVEL).compress
    if bitmaps is None:
        packed = compress(columns)
        return _frame(0, FLAG_ZSTD, packed) if len(packed) < len(columns) else _frame(0, 0, columns)
    packed_columns, packed_bitmaps = compress(columns), compress(bitmaps)
    flags = FLAG_SPLIT
    if len(packed_columns) + len(packed_bitmaps) < len(columns) + len(bitmaps):
        flags |= FLAG_ZSTD
        columns, bitmaps = packed_columns, packed_bitmaps
    head = bytearray()
    _put_varint(head, len(columns))
    return _frame(0, flags, bytes(head) + columns + bitmaps)


def _metadata_message(
    metadata: SnapshotMetadata, format_version: int | None = None
) -> snapshot_pb2.SnapshotMetadata:
    """The protobuf message of ``metadata`` (``format_version`` overrides its version: tests
    of inconsistent objects)."""
    mins = metadata.mins
    # Each format's own ledger and bitmap form (re-encoding old metadata keeps its bytes).
    if metadata.format_version >= SPLIT_FORMAT_VERSION:  # the bitmaps are a part of their own
        bitmap_fields: dict[str, Any] = {"folded_cancels": metadata.folded_cancels}
    elif metadata.format_version == 1:
        bitmap_fields = {"bitmaps": metadata.bitmaps}
    else:
        block = metadata.block
        bitmap_fields = {
            "bitmap_block": block.blob,
            "bitmap_sizes": pack_varints(np.diff(block.offsets)),
            "folded_cancels": metadata.folded_cancels,
        }
    if metadata.format_version < LEDGERS_APART_FORMAT_VERSION:  # the ledgers are columns here
        counts, deltas = _stored_ledgers(metadata)
        bitmap_fields["ledger_counts"] = counts.tolist()
        bitmap_fields["ledger_deltas"] = deltas.tolist()
    return snapshot_pb2.SnapshotMetadata(
        format_version=metadata.format_version if format_version is None else format_version,
        start_ledger=metadata.start_ledger,
        end_ledger=metadata.end_ledger,
        num_messages=metadata.num_messages,
        # int64 wrap-around is intended: deltas are modulo 2**64 (see the decoder).
        min_deliver_at_deltas=_wrapping_diff(mins).tolist(),
        deliver_at_spans=(metadata.maxs - mins).tolist(),
        counts=metadata.counts.tolist(),
        index_name=metadata.index_name,
        generation=metadata.generation,
        **bitmap_fields,
    )


def _check_segment_matches(meta: Any, segment: Segment, number: int) -> None:
    if len(segment) != meta.count or len(segment) == 0:
        raise ValueError(f"segment {number}: {len(segment)} indexes, metadata says {meta.count}")
    first_time, last_time = int(segment.times[0]), int(segment.times[-1])
    if first_time != meta.min_deliver_at or last_time != meta.max_deliver_at:
        raise ValueError(f"segment {number}: time range differs from its metadata")


def encode_entries(metadata: SnapshotMetadata, segments: Sequence[Segment]) -> list[bytes]:
    """Framed entries: metadata first, then one per segment (checksummed, compressed metadata)."""
    if len(segments) != metadata.num_segments:
        raise ValueError(f"{len(segments)} segments for metadata with {metadata.num_segments}")
    split = metadata.format_version >= SPLIT_FORMAT_VERSION
    bitmaps = _positions_part(metadata) if split else None
    entries = [_metadata_entry(_metadata_payload(metadata), bitmaps)]
    if isinstance(segments, PreparedSegments) and segments.metadata.same_columns(metadata):
        # Built together with this metadata (build_snapshot): consistent by construction.
        return entries + [_frame(n, 0, packed) for n, packed in enumerate(segments.packed, 1)]
    for number, (meta, segment) in enumerate(zip(metadata.segments, segments, strict=True), 1):
        _check_segment_matches(meta, segment, number)
        by_position = np.lexsort((segment.entries, segment.ledgers))
        parts = [_impl.roaring_entries(b) for b in meta.bitmaps]
        expected_l = np.repeat(np.array(meta.ledgers, dtype=np.int64), [len(p) for p in parts])
        expected_e = np.concatenate(parts).astype(np.int64)
        if not (
            np.array_equal(segment.ledgers[by_position], expected_l)
            and np.array_equal(segment.entries[by_position], expected_e)
        ):
            raise ValueError(f"segment {number}: positions differ from its metadata bitmaps")
        packed = _impl.pack_times(
            np.ascontiguousarray(segment.times[by_position]),
            meta.min_deliver_at,
            meta.max_deliver_at - meta.min_deliver_at,
        )
        entries.append(_frame(number, 0, packed))
    return entries


def pack_object(entries: Sequence[bytes]) -> bytes:
    """Prefix framed entries with the object header."""
    table = bytearray()
    _put_varint(table, len(entries))
    for entry in entries:
        _put_varint(table, len(entry))
    head = _FIXED.pack(MAGIC, OBJECT_VERSION, len(table)) + bytes(table)
    return head + _CRC.pack(mmh3.hash(head, HEADER_SEED, signed=False)) + b"".join(entries)


def encode_snapshot(metadata: SnapshotMetadata, segments: Sequence[Segment]) -> bytes:
    """The complete stored object for a snapshot."""
    return pack_object(encode_entries(metadata, segments))


# -- decoding -----------------------------------------------------------------------------------


def header_bytes_needed(prefix: bytes, name: str) -> int:
    """From the first ``FIXED_HEADER_BYTES`` bytes, how many bytes the whole header takes."""
    if len(prefix) < FIXED_HEADER_BYTES:
        raise SnapshotCorruptError(f"{name}: truncated header ({len(prefix)} bytes)")
    magic, version, table_len = _FIXED.unpack_from(prefix)
    if magic != MAGIC:
        raise SnapshotCorruptError(f"{name}: bad magic {magic!r} (not a delayindex snapshot)")
    if version != OBJECT_VERSION:
        raise SnapshotCorruptError(f"{name}: unsupported object version {version}")
    if table_len > _MAX_TABLE_BYTES:
        raise SnapshotCorruptError(f"{name}: implausible entry table of {table_len} bytes")
    needed: int = FIXED_HEADER_BYTES + table_len + _CRC.size
    return needed


def read_header(data: bytes, name: str) -> ObjectHeader:
    """Parse and verify the object header from (at least) its first bytes."""
    needed = header_bytes_needed(data[:FIXED_HEADER_BYTES], name)
    if len(data) < needed:
        raise SnapshotCorruptError(f"{name}: truncated header")
    head = bytes(data[: needed - _CRC.size])
    (stored,) = _CRC.unpack_from(data, needed - _CRC.size)
    if mmh3.hash(head, HEADER_SEED, signed=False) != stored:
        raise SnapshotCorruptError(f"{name}: header checksum mismatch")
    try:
        count, pos = _get_varint(head, FIXED_HEADER_BYTES, len(head))
        lengths, pos = _impl.read_varints(head, pos, count)
    except ValueError:
        raise SnapshotCorruptError(f"{name}: malformed entry table") from None
    if pos != len(head) or count < 2 or np.any(lengths < 1 + _CRC.size):
        raise SnapshotCorruptError(f"{name}: malformed entry table")
    offsets = _entry_offsets(lengths, needed)
    return ObjectHeader(OBJECT_VERSION, tuple(lengths.tolist()), needed, offsets)


def _entry_offsets(lengths: npt.NDArray[np.int64], header_bytes: int) -> npt.NDArray[np.int64]:
    """Byte offset of each entry and of the object's end."""
    offsets = np.empty(len(lengths) + 1, dtype=np.int64)
    offsets[0] = header_bytes
    np.cumsum(lengths, out=offsets[1:])
    offsets[1:] += header_bytes
    return offsets


def split_object(data: bytes, name: str) -> tuple[ObjectHeader, list[bytes]]:
    """Verify the header and the total length; return the header and the framed entries."""
    header = read_header(data, name)
    if len(data) != header.total_bytes:
        raise SnapshotCorruptError(
            f"{name}: object is {len(data)} bytes, its header says {header.total_bytes}"
        )
    entries, pos = [], header.header_bytes
    for length in header.entry_lengths:
        entries.append(bytes(data[pos : pos + length]))
        pos += length
    return header, entries


def decode_metadata(entry: bytes, name: str, *, check_bitmaps: bool = True) -> SnapshotMetadata:
    """Decode and validate the framed metadata entry (entry 0).

    ``check_bitmaps=False`` skips parsing every bitmap; only for callers that decode all segments
    right away, since segment decoding validates each bitmap against its segment's count.
    """
    flags, payload = _unframe(entry, 0, name)
    if flags & ~_KNOWN_METADATA_FLAGS:
        raise SnapshotCorruptError(f"{name}: unknown metadata flags {flags:#x}")
    zstd = bool(flags & FLAG_ZSTD)
    bitmaps: memoryview | None = None
    if flags & FLAG_SPLIT:
        try:
            length, start = _get_varint(payload, 0, len(payload))
        except ValueError:
            length, start = len(payload) + 1, 0
        if length > len(payload) - start:
            raise SnapshotCorruptError(f"{name}: the metadata's parts are cut wrong")
        payload, bitmaps = payload[start : start + length], payload[start + length :]
    try:
        raw = decompress(payload) if zstd else bytes(payload)
        message = snapshot_pb2.SnapshotMetadata.FromString(raw)
    except (zstandard.ZstdError, DecodeError) as exc:
        raise SnapshotCorruptError(f"{name}: metadata does not decode: {exc}") from None
    try:
        return _metadata_from_message(message, check_bitmaps, bitmaps, zstd, name)
    except ValueError as exc:
        raise SnapshotCorruptError(f"{name}: inconsistent metadata: {exc}") from None


def _metadata_from_message(
    message: snapshot_pb2.SnapshotMetadata,
    check_bitmaps: bool = True,
    part: memoryview | None = None,
    zstd: bool = False,
    name: str = "",
) -> SnapshotMetadata:
    """The metadata a message describes, checked; ``part`` is the second part of a format 4
    or 5 payload (``zstd``-compressed), decoded later, on first use (``ValueError`` if the
    message is inconsistent)."""
    version = message.format_version
    if version not in FORMAT_VERSIONS:
        raise ValueError(f"unsupported format version {version}")
    start, end = message.start_ledger, message.end_ledger
    if not start <= end <= MAX_LEDGER_ID:
        raise ValueError(f"bad ledger range [{start}, {end}]")
    counts = np.array(message.counts, dtype=np.int64)
    n = len(counts)
    apart = version >= LEDGERS_APART_FORMAT_VERSION
    if apart and (len(message.ledger_counts) or len(message.ledger_deltas)):
        raise ValueError(f"format {version} metadata carries ledgers in its columns")
    if n == 0 or not (
        len(message.min_deliver_at_deltas)
        == len(message.deliver_at_spans)
        == (n if apart else len(message.ledger_counts))
        == n
    ):
        raise ValueError("segment columns differ in length or are empty")
    # Min deltas are stored modulo 2**64 (consecutive minimums may lie up to 2**64 - 1 apart),
    # so int64 wrap-around in the cumulative sum restores them exactly.
    deltas_t = np.array(message.min_deliver_at_deltas, dtype=np.int64)
    spans_t = np.array(message.deliver_at_spans, dtype=np.uint64)
    if np.any(spans_t >= np.uint64(MAX_SEGMENT_SPAN)):
        raise ValueError("a segment spans too much time")
    with np.errstate(over="ignore"):
        mins = np.cumsum(deltas_t)
        maxs = mins + spans_t.astype(np.int64)
    if np.any(maxs < mins):
        raise ValueError("deliver times out of range")
    if np.any(mins[1:] < maxs[:-1]):
        raise ValueError("a segment starts before the previous one ends")
    if np.any(counts < 1):
        raise ValueError("a segment has no indexes")
    if message.num_messages != int(counts.sum()):
        raise ValueError("num_messages differs from the segment counts")
    if (part is None) != (version < SPLIT_FORMAT_VERSION):
        parts = "in one part" if part is None else "in two parts"
        raise ValueError(f"format {version} metadata {parts}")
    if part is not None and (message.bitmaps or message.bitmap_block or message.bitmap_sizes):
        raise ValueError(f"format {version} metadata carries bitmaps in its columns")
    offsets: Int64Array | None = None
    ledgers: Int64Array | None = None
    block: BitmapBlock | DeferredBlock | LazyPositions
    if apart:
        assert part is not None
        gaps = counts if version >= GAPS_FORMAT_VERSION else None
        block = positions_part(part, zstd, name, n, start, end, gaps)
    else:
        offsets, ledgers = ledger_columns(
            np.array(message.ledger_counts, dtype=np.int64),
            np.array(message.ledger_deltas, dtype=np.uint64),
            start,
            end,
        )
        if part is None:
            block = _bitmap_block(message, len(ledgers))
            if len(block) != len(ledgers):
                raise ValueError("ledger columns do not match the ledger counts")
        else:
            block = deferred_bitmaps(part, zstd, name)(len(ledgers))
    index_name = message.index_name
    if index_name and _INDEX_NAME.fullmatch(index_name) is None:
        raise ValueError(f"bad index name {index_name!r}")
    metadata = SnapshotMetadata(
        start, end, mins, maxs, counts, offsets, ledgers, block, version,
        index_name=index_name, generation=message.generation,
        folded_cancels=message.folded_cancels,
    )  # fmt: skip
    if metadata.folded_cancels:
        metadata.folded_positions()  # unpacked and checked: damage is found here, not later
    if check_bitmaps:
        _check_bitmaps(metadata)
    return metadata


def _bitmap_block(message: snapshot_pb2.SnapshotMetadata, count: int) -> BitmapBlock:
    """The message's ``count`` bitmaps (one per ledger entry) in its format's form (a metadata
    never carries both forms)."""
    if message.format_version == 1:
        if message.bitmap_block or len(message.bitmap_sizes):
            raise ValueError("format 1 metadata carries a format 2 bitmap block")
        return BitmapBlock.join(message.bitmaps)
    if len(message.bitmaps):
        raise ValueError(f"format {message.format_version} metadata carries format 1 bitmaps")
    packed = message.bitmap_sizes
    sizes, end = _impl.read_varints(packed, 0, count)
    if end != len(packed):
        raise ValueError("the bitmap sizes do not match the ledger counts")
    return BitmapBlock.from_sizes(
        sizes, message.bitmap_block
    )  # read once: a read of a bytes field copies


def _check_bitmaps(metadata: SnapshotMetadata) -> None:
    block = metadata.block
    cardinality = _impl.roaring_check_positions(metadata.ledgers, block.blob, block.offsets)
    if np.any(cardinality < 1) or not np.array_equal(
        np.add.reduceat(cardinality, metadata.ledger_offsets[:-1]), metadata.counts
    ):
        raise ValueError("the bitmaps do not hold the segment counts")


def check_metadata_bitmaps(metadata: SnapshotMetadata, name: str) -> None:
    """Parse every bitmap of ``metadata``: well-formed, counts match, no position twice.

    Raises:
        SnapshotCorruptError: naming ``name``.
    """
    try:
        _check_bitmaps(metadata)
    except ValueError as exc:
        raise SnapshotCorruptError(f"{name}: inconsistent metadata: {exc}") from None


def decode_segment_buffer(
    buffer: bytes | memoryview,
    entry_lengths: Sequence[int],
    metadata: SnapshotMetadata,
    first: int,
    name: str,
    *,
    check_distinct: bool = False,
) -> SegmentList:
    """Decode consecutive framed segment entries held back to back in ``buffer``.

    Entry ``i`` of the buffer is segment ``first + i``. One native call verifies the checksums
    and decodes them all; ``check_distinct`` also rejects a position found in two of them.
    """
    count = len(entry_lengths)
    if first < 1 or first + count - 1 > metadata.num_segments:
        raise ValueError(f"segments {first}..{first + count - 1} outside the snapshot")
    if count == 0:
        empty = np.empty(0, dtype=np.int64)
        return SegmentList(empty, empty, empty, np.zeros(1, dtype=np.int64))
    a, b = first - 1, first - 1 + count
    # Only the bitmaps up to segment b's are read: a bucket's first segments need not
    # decompress all of them (a cross-segment check needs them all).
    block = (
        metadata.block if check_distinct else metadata.block_head(int(metadata.ledger_offsets[b]))
    )
    bitmap_ledgers = metadata.ledgers[: len(block)]
    try:
        times, ledgers, entry_ids, offsets = _impl.decode_segments(
            buffer,
            np.asarray(entry_lengths, dtype=np.int64),
            first,
            metadata.mins[a:b],
            metadata.maxs[a:b] - metadata.mins[a:b],
            metadata.counts[a:b],
            metadata.ledger_offsets[a : b + 1],
            bitmap_ledgers,
            block.blob,
            block.offsets,
            np.unique(bitmap_ledgers, return_inverse=True)[1].astype(np.int64)
            if check_distinct
            else None,
        )
    except ValueError as exc:
        raise SnapshotCorruptError(f"{name}: {exc}") from None
    return SegmentList(times, ledgers, entry_ids, offsets)


def decode_segments(
    entries: Sequence[bytes], metadata: SnapshotMetadata, first: int, name: str
) -> SegmentList:
    """Decode framed segment entries ``first, first+1, ...`` of a snapshot, using its metadata."""
    return decode_segment_buffer(
        b"".join(entries), [len(e) for e in entries], metadata, first, name
    )


def decode_segment_times(
    buffer: bytes,
    lengths: Int64Array,
    indexes: Int64Array,
    mins: Int64Array,
    maxs: Int64Array,
    counts: Int64Array,
    name: str,
) -> Int64Array:
    """The deliver times of the framed segment entries in ``buffer`` (``lengths`` bytes each;
    object entry ``indexes``, not necessarily consecutive), each checked and
    unpacked with its segment's ``mins``/``maxs``/``counts`` (aligned with the entries) and
    without the metadata's bitmaps. In each segment's position order; positions are not
    decoded."""
    if not len(mins) == len(maxs) == len(counts) == len(lengths) == len(indexes):
        raise ValueError("one min, max, count and index per entry")
    if not len(lengths):
        return np.empty(0, dtype=np.int64)
    lows = np.asarray(mins, dtype=np.int64)
    try:
        return _impl.unpack_segment_times(
            buffer,
            np.asarray(lengths, dtype=np.int64),
            0,
            lows,
            np.asarray(maxs, dtype=np.int64) - lows,
            np.asarray(counts, dtype=np.int64),
            np.asarray(indexes, dtype=np.int64),
        )
    except ValueError as exc:
        raise SnapshotCorruptError(f"{name}: {exc}") from None


def decode_snapshot(data: bytes, name: str) -> tuple[SnapshotMetadata, SegmentList]:
    """Decode a whole stored object."""
    header = read_header(data, name)
    if len(data) != header.total_bytes:
        raise SnapshotCorruptError(
            f"{name}: object is {len(data)} bytes, its header says {header.total_bytes}"
        )
    meta_end = header.header_bytes + header.entry_lengths[0]
    # Bitmaps are validated (counts and cross-segment duplicates) by the segment decode below,
    # which parses each of them once.
    metadata = decode_metadata(
        bytes(data[header.header_bytes : meta_end]), name, check_bitmaps=False
    )
    if header.num_segments != metadata.num_segments:
        raise SnapshotCorruptError(
            f"{name}: {header.num_segments} segment entries, metadata lists {metadata.num_segments}"
        )
    segments = decode_segment_buffer(
        memoryview(data)[meta_end:],
        header.entry_lengths[1:],
        metadata,
        1,
        name,
        check_distinct=True,
    )
    return metadata, segments
