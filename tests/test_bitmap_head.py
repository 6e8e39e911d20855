"""A bucket's first segments decode only the head of its bitmaps part (format 4).

Recovery reads each bucket's first live segment; its positions are in the metadata's bitmaps,
stored as one compressed part. ``DeferredBlock.head(n)`` decompresses only the part's leading
bytes (the sizes, then the first ``n`` bitmaps) the first time, and the whole part after that.
These tests hold the head to the whole block, byte for byte, on both builds' kernels.
"""

from __future__ import annotations

import numpy as np
import pytest
import zstandard
from hypothesis import given, settings
from hypothesis import strategies as st

from delayindex.errors import SnapshotCorruptError
from delayindex.snapshot import _parts, codec
from delayindex.snapshot.blocks import BitmapBlock, DeferredBlock
from delayindex.snapshot.codec import decode_metadata, decode_segments, split_object
from delayindex.snapshot.format import SnapshotMetadata, build_snapshot
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
    w = generate(4_000, seed=11)
    mask = w.delayed_mask
    metadata, segments = build_snapshot(
        w.deliver_at[mask],
        w.ledger_ids[mask],
        w.entry_ids[mask],
        max_time_step_ms=300_000,
        max_indexes_per_segment=64,
    )
    assert metadata.num_segments > 8
    _, framed = split_object(codec.encode_snapshot(metadata, segments), NAME)
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
    _, framed = _bucket()
    entry = framed[0]
    payload = entry[1:-4]
    length, start = codec._get_varint(payload, 0, len(payload))
    columns = payload[: start + length]
    cut = zstandard.ZstdCompressor().compress(b"\x05\x05")  # two sizes, for thousands
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
