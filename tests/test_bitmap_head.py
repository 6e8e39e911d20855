"""A bucket's first segments decode only the head of its bitmaps part (formats 4 and 5).

Recovery reads each bucket's first live segment; its positions are in the metadata's bitmaps,
stored as one compressed part. ``DeferredBlock.head(n)`` decompresses only the part's leading
bytes (the sizes, then the first ``n`` bitmaps) the first time, and the whole part after that.
These tests hold the head to the whole block, byte for byte, on both builds' kernels.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import zstandard
from hypothesis import given, settings
from hypothesis import strategies as st

from delayindex.errors import SnapshotCorruptError
from delayindex.snapshot import _parts, codec
from delayindex.snapshot.blocks import BitmapBlock, DeferredBlock, LazyPositions
from delayindex.snapshot.codec import decode_metadata, decode_segments, split_object
from delayindex.snapshot.format import (
    LEDGERS_APART_FORMAT_VERSION,
    SnapshotMetadata,
    build_snapshot,
)
from delayindex.workload import generate

NAME = "bucket-9"


def _part(block: BitmapBlock, zstd: bool) -> bytes:
    raw = codec._bitmaps_part(block)
    return zstandard.ZstdCompressor(level=9).compress(raw) if zstd else raw


@settings(max_examples=60, deadline=None)
@given(
    sizes=st.lists(
        st.one_of(st.integers(0, 40), st.integers(100, 300), st.integers(16_000, 20_000)),
        min_size=1,
        max_size=60,
    ),
    zstd=st.booleans(),
    data=st.data(),
)
def test_head_is_the_whole_blocks_prefix(sizes: list[int], zstd: bool, data: st.DataObject) -> None:
    # Sizes of one, two and three varint bytes: the sizes' end is found however long they are.
    rng = np.random.default_rng(len(sizes))
    bitmaps = [rng.integers(0, 256, size, dtype=np.uint8).tobytes() for size in sizes]
    block = BitmapBlock.join(bitmaps)
    n = data.draw(st.integers(0, len(sizes)))
    head = _parts.head_block(_part(block, zstd), zstd, len(sizes), n)
    assert len(head) == n
    assert head.slice(0, n) == block.slice(0, n)


def test_head_of_a_part_cut_short_is_an_error() -> None:
    block = BitmapBlock.join([b"abc"] * 10)
    raw = codec._bitmaps_part(block)
    for zstd in (False, True):
        sizes_cut = zstandard.ZstdCompressor().compress(raw[:5]) if zstd else raw[:5]
        with pytest.raises(ValueError, match="sizes are cut short"):
            _parts.head_block(sizes_cut, zstd, 10, 1)
        bitmaps_cut = raw[:12]  # the sizes and 2 of the 3 bytes of the first bitmap
        part = zstandard.ZstdCompressor().compress(bitmaps_cut) if zstd else bitmaps_cut
        with pytest.raises(ValueError, match="do not add up"):
            _parts.head_block(part, zstd, 10, 1)


def test_deferred_block_decodes_one_head_then_the_whole() -> None:
    block = BitmapBlock.join([bytes([i]) * (i + 1) for i in range(10)])
    calls: list[object] = []

    def load() -> BitmapBlock:
        calls.append("whole")
        return block

    def load_head(n: int) -> BitmapBlock:
        calls.append(n)
        return BitmapBlock.join(list(block.slice(0, n)))

    deferred = DeferredBlock(load, 10, 50, load_head)
    assert deferred.head(2).slice(0, 2) == block.slice(0, 2) and calls == [2]
    assert not deferred.loaded and deferred.nbytes == 50 + deferred.head(1).nbytes
    assert deferred.head(1).slice(0, 1) == block.slice(0, 1) and calls == [2]  # kept
    assert deferred.head(3) is block and calls == [2, "whole"]  # more: the whole block
    assert deferred.loaded and deferred.nbytes == block.nbytes
    assert deferred.head(1) is block and calls == [2, "whole"]
    half = DeferredBlock(load, 10, 50, load_head)
    assert half.head(5) is block and calls[-1] == "whole"  # half or more: never a head
    bad = DeferredBlock(load, 10, 50, lambda n: BitmapBlock.join([b"x"]))
    for _ in range(2):  # a wrong head is not kept
        with pytest.raises(ValueError, match="1 bitmaps decoded where 2 were asked for"):
            bad.head(2)
    assert BitmapBlock.join([b"a"]).head(0).count == 1  # a loaded block is its own head


def _bucket() -> tuple[SnapshotMetadata, list[bytes]]:
    """A realistic bucket in format 5, the newest with a bitmaps part (format 6 stores entry
    gaps, decoded whole: ``test_codec_gaps.py``)."""
    w = generate(4_000, seed=11)
    mask = w.delayed_mask
    built, segments = build_snapshot(
        w.deliver_at[mask],
        w.ledger_ids[mask],
        w.entry_ids[mask],
        max_time_step_ms=300_000,
        max_indexes_per_segment=64,
    )
    metadata = SnapshotMetadata(
        built.start_ledger, built.end_ledger, built.mins, built.maxs, built.counts,
        built.ledger_offsets, built.ledgers, built.block, LEDGERS_APART_FORMAT_VERSION,
    )  # fmt: skip
    assert metadata.num_segments > 8
    _, framed = split_object(codec.encode_snapshot(metadata, list(segments)), NAME)
    return metadata, framed


def test_first_segments_read_only_the_head_and_match_the_whole() -> None:
    metadata, framed = _bucket()
    lazy = decode_metadata(framed[0], NAME, check_bitmaps=False)
    got = decode_segments(framed[1:2], lazy, 1, NAME)  # a recovered bucket's first segment
    assert not lazy.bitmaps_loaded
    want = decode_segments(framed[1:2], metadata, 1, NAME)
    for column in ("times", "ledgers", "entries", "bounds"):
        assert np.array_equal(getattr(got, column), getattr(want, column)), column
    last = lazy.num_segments
    got = decode_segments(framed[last:], lazy, last, NAME)
    assert lazy.bitmaps_loaded  # past the head: the whole block
    want = decode_segments(framed[last:], metadata, last, NAME)
    assert np.array_equal(got.times, want.times) and np.array_equal(got.entries, want.entries)


def test_a_head_decode_failure_names_the_object() -> None:
    metadata, framed = _bucket()
    entry = framed[0]
    payload = entry[1:-4]
    length, start = codec._get_varint(payload, 0, len(payload))
    columns = payload[: start + length]
    ledgers = b"".join(map(codec.pack_varints, codec._stored_ledgers(metadata)))
    cut = zstandard.ZstdCompressor().compress(ledgers + b"\x05\x05")  # two sizes, for thousands
    lazy = decode_metadata(codec._frame(0, entry[0], columns + cut), NAME, check_bitmaps=False)
    with pytest.raises(SnapshotCorruptError, match=f"{NAME}: the bitmaps do not decode"):
        lazy.block_head(1)


def test_a_whole_decode_during_a_head_decode_wins() -> None:
    # Another thread (simulated inside load_head) decodes the whole block meanwhile: the head
    # answers this call and is not kept, and the block's bytes are the whole block's.
    block = BitmapBlock.join([bytes([i]) * 3 for i in range(10)])
    deferred: DeferredBlock

    def load_head(n: int) -> BitmapBlock:
        deferred.get()
        return BitmapBlock.join(list(block.slice(0, n)))

    deferred = DeferredBlock(lambda: block, 10, 50, load_head)
    assert deferred.head(2).slice(0, 2) == block.slice(0, 2)
    assert deferred.loaded and deferred.nbytes == block.nbytes
    assert deferred._head is None  # nothing holds the head's bytes
    assert deferred.head(2) is block


@settings(max_examples=40, deadline=None)
@given(
    counts=st.lists(st.integers(1, 5), min_size=1, max_size=30),
    gaps=st.data(),
    zstd=st.booleans(),
)
def test_a_positions_part_decodes_its_ledger_columns_and_bitmaps(
    counts: list[int], gaps: st.DataObject, zstd: bool
) -> None:
    # Format 5's part: ledger counts, ledger deltas, then a bitmaps part; the head and the
    # whole decode agree, and the ledger columns are the ones encoded.
    start = 1_000
    ledgers: list[int] = []
    for count in counts:
        at = start + gaps.draw(st.integers(0, 3))
        for _ in range(count):
            ledgers.append(at)
            at += gaps.draw(st.integers(1, 300))  # deltas of one and two varint bytes
    end = max(ledgers) + gaps.draw(st.integers(0, 5))
    offsets = np.concatenate([[0], np.cumsum(counts)])
    deltas = np.diff(np.array(ledgers), prepend=start)
    deltas[offsets[:-1]] = np.array(ledgers)[offsets[:-1]] - start
    rng = np.random.default_rng(len(ledgers))
    block = BitmapBlock.join([rng.bytes(int(rng.integers(0, 200))) for _ in ledgers])
    raw = codec.pack_varints(counts) + codec.pack_varints(deltas) + codec._bitmaps_part(block)
    part = memoryview(zstandard.ZstdCompressor().compress(raw) if zstd else raw)
    whole = _parts.positions_part(part, zstd, NAME, len(counts), start, end)
    got_offsets, got_ledgers = whole.columns()
    assert got_offsets.tolist() == offsets.tolist() and got_ledgers.tolist() == ledgers
    assert whole.count == len(ledgers) and not whole.loaded
    n = gaps.draw(st.integers(0, len(ledgers)))
    assert whole.head(n).slice(0, n) == block.slice(0, n)
    assert whole.get().blob == block.blob and whole.loaded
    assert whole.nbytes >= block.nbytes
    cut = _parts.positions_part(part[:0], zstd, NAME, len(counts), start, end)
    with pytest.raises(SnapshotCorruptError, match=f"{NAME}: the ledger columns do not decode"):
        cut.columns()
    if max(ledgers) > start:  # a bucket's range that ends before its last ledger
        narrow = _parts.positions_part(part, zstd, NAME, len(counts), start, max(ledgers) - 1)
        with pytest.raises(SnapshotCorruptError, match="outside the bucket's range"):
            narrow.get()


def test_lazy_positions_decode_the_columns_once_and_then_hold_no_part() -> None:
    calls: list[str] = []
    block = BitmapBlock.join([b"ab", b"c", b"def"])

    def whole() -> BitmapBlock:
        calls.append("whole")
        return block

    def head(n: int) -> BitmapBlock:
        calls.append(f"head {n}")
        return BitmapBlock.join(list(block.slice(0, n)))

    def load() -> tuple[Any, Any, DeferredBlock]:
        calls.append("columns")
        return np.array([0, 2, 3]), np.array([7, 9, 8]), DeferredBlock(whole, 3, 40, head)

    lazy = LazyPositions(load, 40)
    assert lazy.nbytes == 40 and calls == []
    offsets, ledgers = lazy.columns()
    assert lazy.columns()[1] is ledgers and not ledgers.flags.writeable
    assert lazy._load is None  # the part is held by the block's loaders only
    assert lazy.head(1).slice(0, 1) == (b"ab",)
    assert lazy.get() is block and lazy.get() is block and lazy.loaded
    assert calls == ["columns", "head 1", "whole"]
    assert lazy.nbytes == block.nbytes + offsets.nbytes + ledgers.nbytes


def test_a_positions_part_with_absurd_ledger_counts_is_corrupt() -> None:
    # Checksums hold only for what a writer made: a count past what the part could hold, or
    # of zero, is refused before it sizes anything.
    for counts, match in (([1, 2**40], "too many ledgers"), ([1, 0], "no ledgers")):
        raw = codec.pack_varints(counts) + bytes(64)
        part = _parts.positions_part(memoryview(raw), False, NAME, 2, 0, 10)
        with pytest.raises(SnapshotCorruptError, match=f"{NAME}: the ledger columns .*{match}"):
            part.columns()
