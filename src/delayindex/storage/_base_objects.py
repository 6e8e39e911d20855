"""The object half of :class:`~delayindex.storage.base.BaseStorage`: create, read, delete.

How a snapshot is read (the layout is ``delayindex.snapshot.codec``'s): the fixed header prefix,
then the rest of the header (entry lengths, checksummed), then only the entries asked for. The
object's size must equal the size the header announces, so truncation or trailing garbage is
caught before any entry is trusted. Decoding a segment needs the metadata (entry 0), so decoded
metadata is kept in a small LRU keyed by snapshot id and validated by a *fingerprint* of the
stored object (a generation counter in memory; inode, size and mtime on disk).

Invariants: objects are immutable once created (``create`` never overwrites; a retry accepts
only identical bytes); a cached metadata is used only while the stored object's fingerprint is
unchanged, and one cached without its bitmaps checked is checked before a caller that asks for
them gets it; every read runs inside one retry attempt, so a transient failure rereads from the
header on.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Collection, Hashable, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from delayindex.errors import SnapshotCorruptError
from delayindex.snapshot.codec import (
    FIXED_HEADER_BYTES,
    ObjectHeader,
    check_metadata_bitmaps,
    decode_metadata,
    decode_segment_times,
    decode_segments,
    encode_snapshot,
    header_bytes_needed,
    read_header,
)
from delayindex.snapshot.format import Segment, SegmentList, SnapshotMetadata
from delayindex.storage._base_raw import ObjectInfo, ObjectSource, RawStorage, _check_int
from delayindex.storage._readahead import ReadAhead, ReadResult
from delayindex.storage.manifest import validate_key

Int64Array = npt.NDArray[np.int64]


class ObjectsMixin(RawStorage):
    """Snapshot objects over the raw primitives: the read path and its metadata cache."""

    # State (set in BaseStorage.__init__).
    # id -> (fingerprint, metadata, whether every bitmap was checked)
    _cache: OrderedDict[str, tuple[Hashable, SnapshotMetadata, bool]]
    # id -> (fingerprint, header): segment reads skip re-reading and parsing the header
    _headers: OrderedDict[str, tuple[Hashable, ObjectHeader]]
    _cache_size: int
    _readahead: ReadAhead | None  # None: reads are never ahead of their callers

    @staticmethod
    def _read_header(src: ObjectSource) -> ObjectHeader:
        prefix = src.read(0, FIXED_HEADER_BYTES)
        needed = header_bytes_needed(prefix, src.where)
        data = prefix + src.read(len(prefix), needed - len(prefix))
        header = read_header(data, src.where)
        if src.size != header.total_bytes:
            raise SnapshotCorruptError(
                f"{src.where}: object is {src.size} bytes, its header says {header.total_bytes}"
            )
        return header

    def _header(self, src: ObjectSource) -> ObjectHeader:
        """The object's header: the one cached with its metadata while the object's
        fingerprint is unchanged (a browse reads many single segments), else read."""
        with self._state_lock:
            cached = self._headers.get(src.key)
        if cached is not None and cached[0] == src.fingerprint:
            return cached[1]
        header = self._read_header(src)
        self._remember(self._headers, src.key, (src.fingerprint, header))
        return header

    def _remember(self, cache: OrderedDict[str, Any], key: str, value: Any) -> None:
        """Put ``key`` in an LRU ``cache`` of at most ``_cache_size`` entries."""
        if self._cache_size:
            with self._state_lock:
                cache[key] = value
                cache.move_to_end(key)
                while len(cache) > self._cache_size:
                    cache.popitem(last=False)

    @staticmethod
    def _read_entries(
        src: ObjectSource, header: ObjectHeader, first: int, last: int
    ) -> list[bytes]:
        """Framed entries ``first..last`` (entry indexes, inclusive), read in one call."""
        lengths = header.entry_lengths[first : last + 1]
        span = header.span(first, last)
        blob = src.read(header.entry_offset(first), span)
        if len(blob) != span:
            raise SnapshotCorruptError(f"{src.where}: short read of entries {first}..{last}")
        entries, pos = [], 0
        for length in lengths:
            entries.append(blob[pos : pos + length])
            pos += length
        return entries

    def _metadata(
        self, src: ObjectSource, header: ObjectHeader, check_bitmaps: bool = False
    ) -> SnapshotMetadata:
        """Decoded metadata, cached with whether its bitmaps were fully checked yet."""
        with self._state_lock:
            cached = self._cache.get(src.key)
            if cached is not None and cached[0] != src.fingerprint:
                cached = None
            if cached is not None:
                self._cache.move_to_end(src.key)
                if cached[2] or not check_bitmaps:
                    return cached[1]
        if cached is not None:
            metadata = cached[1]
        else:
            metadata = decode_metadata(
                self._read_entries(src, header, 0, 0)[0], src.where, check_bitmaps=False
            )
            if metadata.num_segments != header.num_segments:
                raise SnapshotCorruptError(
                    f"{src.where}: {header.num_segments} segment entries, "
                    f"metadata lists {metadata.num_segments}"
                )
        if check_bitmaps:
            check_metadata_bitmaps(metadata, src.where)
        self._remember(self._cache, src.key, (src.fingerprint, metadata, check_bitmaps))
        return metadata

    def cached_metadata_bytes(self, snapshot_ids: Collection[str]) -> int:
        """Bytes of decoded metadata this storage keeps cached for ``snapshot_ids``.

        The read cache (``metadata_cache_size`` entries, least recently used out first) holds
        each object's metadata, bitmaps included, from its first read (a recovery, a segment
        load) so that later segment loads skip decoding it again.
        """
        with self._state_lock:
            return sum(entry[1].nbytes for key, entry in self._cache.items() if key in snapshot_ids)

    def _forget(self, key: str) -> None:
        if self._readahead is not None:
            self._readahead.forget(key)
        with self._state_lock:
            self._cache.pop(key, None)
            self._headers.pop(key, None)

    def _segment_entries(
        self, src: ObjectSource, header: ObjectHeader, first: int, last: int
    ) -> list[bytes]:
        """Framed segments ``first..last``: read ahead already, else read now."""
        if self._readahead is not None:
            entries = self._readahead.take(src.key, src.fingerprint, first, last)
            if entries is not None:
                return entries
        return self._read_entries(src, header, first, last)

    def _read_ahead(self, key: str, first: int, last: int) -> ReadResult | None:
        """One background read of segments ``first..last`` (the read-ahead thread's)."""
        with self._raw_source(key) as src:
            header = self._header(src)
            if last > header.num_segments:
                return None
            self._metadata(src, header)  # decoding the segments needs it: into the LRU too
            return src.fingerprint, self._read_entries(src, header, first, last)

    def prefetch_segments(self, snapshot_id: str, first: int, last: int) -> bool:
        """Hint that segments ``first..last`` of ``snapshot_id`` will be read soon.

        A storage with read-ahead (FileStorage's ``readahead_bytes``) reads their bytes (and
        the object's metadata, into its cache) on a background thread, so the later
        :meth:`get_segment_arrays` (or any segment read of that exact range) finds them in
        memory; the segments' checksums and decoding still run then, so a damaged segment is
        reported by that read as without the hint. Never blocks, never raises for a storage
        fault; a bad range is ignored. Returns whether a read was queued.
        """
        if self._readahead is None or not 1 <= first <= last:
            return False
        return self._readahead.request(snapshot_id, first, last)

    def readahead_stats(self) -> dict[str, int]:
        """The read-ahead's counters (``delayindex.storage._readahead.READAHEAD_COUNTERS``,
        ``held_bytes``, ``waiting``); empty when this storage does not read ahead."""
        return {} if self._readahead is None else self._readahead.stats()

    # -- SnapshotStorage ----------------------------------------------------------------------

    def create(self, metadata: SnapshotMetadata, segments: Sequence[Segment], key: str) -> str:
        """See :meth:`SnapshotStorage.create`."""
        validate_key(key, "snapshot key")
        self._check_open()
        data = encode_snapshot(metadata, segments)
        self._retry("create", key, lambda n: self._raw_put(key, data, may_exist=n > 1))
        return key

    def get_metadata(self, snapshot_id: str, *, check_bitmaps: bool = True) -> SnapshotMetadata:
        """See :meth:`SnapshotStorage.get_metadata`."""
        validate_key(snapshot_id, "snapshot id")

        def attempt(_: int) -> SnapshotMetadata:
            with self._raw_source(snapshot_id) as src:
                return self._metadata(src, self._read_header(src), check_bitmaps)

        return self._retry("get_metadata", snapshot_id, attempt)

    def _decoded_segments(self, snapshot_id: str, first: int, last: int) -> Sequence[Segment]:
        return self._decoded_runs(snapshot_id, [(first, last)])[0]

    def _decoded_runs(
        self, snapshot_id: str, runs: Sequence[tuple[int, int]]
    ) -> list[Sequence[Segment]]:
        validate_key(snapshot_id, "snapshot id")
        _check_runs(runs)

        def attempt(_: int) -> list[Sequence[Segment]]:
            read: list[tuple[int, list[bytes]]] = []
            with self._raw_source(snapshot_id) as src:
                header = self._header(src)
                metadata: SnapshotMetadata | None = None
                for first, last in runs:
                    stop = min(last, header.num_segments)
                    if first > stop:
                        read.append((first, []))
                        continue
                    if metadata is None:
                        metadata = self._metadata(src, header)
                    read.append((first, self._segment_entries(src, header, first, stop)))
            return [
                decode_segments(entries, metadata, first, src.where)
                if entries and metadata is not None
                else []
                for first, entries in read
            ]

        return self._retry("get_segments", snapshot_id, attempt)

    def get_segments(self, snapshot_id: str, first: int, last: int) -> list[Segment]:
        """See :meth:`SnapshotStorage.get_segments`."""
        # The codec returns a lazy SegmentList; the protocol promises a plain list.
        return list(self._decoded_segments(snapshot_id, first, last))

    def get_segment_arrays(
        self, snapshot_id: str, first: int, last: int
    ) -> tuple[Int64Array, Int64Array, Int64Array]:
        """See :meth:`SnapshotStorage.get_segment_arrays`."""
        return _columns(self._decoded_segments(snapshot_id, first, last))

    def get_segment_runs(
        self, snapshot_id: str, runs: Sequence[tuple[int, int]]
    ) -> tuple[Int64Array, Int64Array, Int64Array]:
        """See :meth:`SnapshotStorage.get_segment_runs`."""
        parts = [_columns(d) for d in self._decoded_runs(snapshot_id, runs)]
        if len(parts) == 1:
            return parts[0]
        empty = np.empty(0, dtype=np.int64)
        return tuple(  # type: ignore[return-value]
            np.concatenate([p[i] for p in parts]) if parts else empty.copy() for i in range(3)
        )

    def get_segment_times(
        self,
        snapshot_id: str,
        runs: Sequence[tuple[int, int]],
        mins: Int64Array,
        maxs: Int64Array,
        counts: Int64Array,
    ) -> Int64Array:
        """See :meth:`SnapshotStorage.get_segment_times`."""
        validate_key(snapshot_id, "snapshot id")
        _check_runs(runs)
        columns = [np.asarray(c, dtype=np.int64) for c in (mins, maxs, counts)]
        if not len(columns[0]) == len(columns[1]) == len(columns[2]):
            raise ValueError("mins, maxs and counts differ in length")

        def attempt(_: int) -> Int64Array:
            with self._raw_source(snapshot_id) as src:
                header = self._header(src)
                if header.num_segments != len(columns[0]):
                    raise SnapshotCorruptError(
                        f"{src.where}: {header.num_segments} segment entries, the bucket "
                        f"lists {len(columns[0])}"
                    )
                # One read per run, one decode for all of them.
                firsts, lasts, segments = _run_segments(runs, header.num_segments)
                if not len(segments):
                    return np.empty(0, dtype=np.int64)
                offsets, sizes = header.extents(firsts, lasts)
                blobs = []
                for offset, size in zip(offsets.tolist(), sizes.tolist(), strict=True):
                    blob = src.read(offset, size)
                    if len(blob) != size:
                        raise SnapshotCorruptError(f"{src.where}: short read of segment entries")
                    blobs.append(blob)
                low, high, count = (c[segments - 1] for c in columns)
                return decode_segment_times(
                    b"".join(blobs), header.extents(segments, segments)[1], segments,
                    low, high, count, src.where,
                )  # fmt: skip

        return self._retry("get_segments", snapshot_id, attempt)

    def length(self, snapshot_id: str) -> int:
        """See :meth:`SnapshotStorage.length`."""
        validate_key(snapshot_id, "snapshot id")
        return self._retry("length", snapshot_id, lambda _: self._raw_size(snapshot_id))

    def delete(self, snapshot_id: str) -> None:
        """See :meth:`SnapshotStorage.delete`."""
        validate_key(snapshot_id, "snapshot id")
        try:
            self._retry("delete", snapshot_id, lambda _: self._raw_delete(snapshot_id))
        finally:
            self._forget(snapshot_id)

    def list_objects(self) -> list[ObjectInfo]:
        """See :meth:`SnapshotStorage.list_objects`."""
        return sorted(self._retry("list_objects", "*", lambda _: self._raw_list()))


def _columns(decoded: Sequence[Segment]) -> tuple[Int64Array, Int64Array, Int64Array]:
    """Decoded segments as three concatenated columns ``(times, ledgers, entries)``."""
    if isinstance(decoded, SegmentList):
        return decoded.times, decoded.ledgers, decoded.entries
    empty = np.empty(0, dtype=np.int64)
    parts = list(decoded)
    if not parts:
        return empty, empty.copy(), empty.copy()
    return (
        np.concatenate([s.times for s in parts]),
        np.concatenate([s.ledgers for s in parts]),
        np.concatenate([s.entries for s in parts]),
    )


def _check_runs(runs: Sequence[tuple[int, int]]) -> None:
    """Every ``(first, last)`` segment range valid (1-based, inclusive), before any I/O."""
    for first, last in runs:
        if type(first) is int and type(last) is int and 1 <= first <= last:
            continue  # the common case, checked without calls
        _check_int(first, "first")
        _check_int(last, "last")
        if first < 1 or last < first:
            raise ValueError(f"bad segment range {first}..{last} (1-based, inclusive)")


def _run_segments(
    runs: Sequence[tuple[int, int]], num_segments: int
) -> tuple[Int64Array, Int64Array, Int64Array]:
    """Runs of 1-based segments ``(a, b)`` clipped to ``num_segments`` (empty ones dropped):
    their firsts and lasts, and every segment they hold, in order."""
    pairs = np.array(runs, dtype=np.int64).reshape(-1, 2)
    firsts, lasts = pairs[:, 0], np.minimum(pairs[:, 1], num_segments)
    keep = firsts <= lasts
    firsts, lasts = firsts[keep], lasts[keep]
    sizes = lasts - firsts + 1
    starts = np.cumsum(sizes) - sizes
    segments = np.arange(int(sizes.sum()), dtype=np.int64) + np.repeat(firsts - starts, sizes)
    return firsts, lasts, segments
