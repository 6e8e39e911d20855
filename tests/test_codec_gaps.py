"""Format 6: each (segment, ledger)'s entry ids stored as gaps (``snapshot/_gaps.py``).

The writer turns a block's roaring bitmaps into gap streams; the reader rebuilds the bitmaps
from them, byte for byte. These tests hold both directions to each other and to pyroaring, run
the three kernels (``roaring_block_values``, ``roaring_write_block``, ``unpack_entry_gaps``)
native against pure,
and damage the streams behind a valid checksum: every such part must raise
``SnapshotCorruptError`` naming the object, never decode into other positions.
"""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest
import zstandard
from hypothesis import given, settings
from hypothesis import strategies as st
from pyroaring import BitMap

from delayindex import _impl
from delayindex._pure import codec as pure
from delayindex.errors import SnapshotCorruptError
from delayindex.snapshot import codec
from delayindex.snapshot._gaps import pack_entry_gaps, pack_varints
from delayindex.snapshot.format import (
    FORMAT_VERSION,
    GAPS_FORMAT_VERSION,
    LEDGERS_APART_FORMAT_VERSION,
    SnapshotMetadata,
    build_snapshot,
)
from delayindex.workload import generate

NAME = "bucket-6"
U32_MAX = 2**32 - 1

# Groups of entry ids: small sets, dense runs (run containers), sets over 4096 (bitsets),
# ids across 2**16 chunks and near 2**32, gaps of one byte and escaped ones.
_group = st.one_of(
    st.sets(st.integers(0, 1_000), min_size=1, max_size=30),
    st.sets(st.integers(0, U32_MAX), min_size=1, max_size=8),
    st.builds(
        lambda start, length, step: set(range(start, start + length * step, step)),
        st.integers(0, 2**20),
        st.sampled_from([1, 2, 300, 4_097]),
        st.sampled_from([1, 2, 3, 255, 256, 70_000]),
    ),
)


def _groups_arrays(groups: list[set[int]]) -> tuple[npt.NDArray[np.uint32], npt.NDArray[np.int64]]:
    values = np.array([v for g in groups for v in sorted(g)], dtype=np.uint32)
    return values, np.cumsum([0, *map(len, groups)], dtype=np.int64)


def _native() -> Any:
    module = _impl.native_module_or_none()
    if module is None:
        pytest.fail("the native extension delayindex._native is not built; reinstall the package")
    return module


@settings(max_examples=150, deadline=None)
@given(st.lists(_group, max_size=12))
def test_gap_streams_round_trip(groups: list[set[int]]) -> None:
    values, bounds = _groups_arrays(groups)
    raw = b"\x07prefix" + pack_entry_gaps(values, np.diff(bounds))
    for unpack in (_impl.unpack_entry_gaps, _native().unpack_entry_gaps, pure.unpack_entry_gaps):
        got_values, got_bounds = unpack(raw, 7, len(groups))
        assert got_values.dtype == np.uint32 and got_values.tolist() == values.tolist()
        assert got_bounds.dtype == np.int64 and got_bounds.tolist() == bounds.tolist()


def _outcome(unpack: Any, raw: bytes, start: int, groups: int) -> tuple[str, Any]:
    try:
        values, bounds = unpack(raw, start, groups)
    except ValueError as exc:
        return "ValueError", str(exc)
    return "ok", (values.dtype.str, values.tolist(), bounds.dtype.str, bounds.tolist())


@settings(max_examples=400, deadline=None)
@given(
    st.lists(_group, max_size=5),
    st.binary(max_size=12),
    st.integers(0, 40),
    st.integers(-1, 1),
    st.integers(0, 3),
)
def test_the_twins_read_any_bytes_alike(
    groups: list[set[int]], noise: bytes, at: int, shift: int, start: int
) -> None:
    """Native and pure read valid streams, damaged ones and garbage the same way: equal
    results, or ValueError with the same message."""
    values, bounds = _groups_arrays(groups)
    raw = bytearray(bytes(start) + pack_entry_gaps(values, np.diff(bounds)))
    if noise:  # overwrite or insert some bytes somewhere
        at = min(at, len(raw))
        raw[at : at + (len(noise) if shift >= 0 else 0)] = noise
    data = bytes(raw)
    for count in {max(len(groups) + shift, 0), len(groups)}:
        native = _outcome(_native().unpack_entry_gaps, data, start, count)
        python = _outcome(pure.unpack_entry_gaps, data, start, count)
        assert native == python


@settings(max_examples=150, deadline=None)
@given(st.lists(_group, min_size=1, max_size=12))
def test_block_kernels_match_pyroaring_and_each_other(groups: list[set[int]]) -> None:
    values, bounds = _groups_arrays(groups)
    expected = []
    for group in groups:
        bitmap = BitMap(group)
        bitmap.run_optimize()
        expected.append(bytes(bitmap.serialize()))
    for kernels in (_native(), pure):
        blob, offsets = kernels.roaring_write_block(values, bounds)
        assert [blob[a:b] for a, b in itertools.pairwise(offsets.tolist())] == expected
        got, cards = kernels.roaring_block_values(blob, offsets)
        assert got.dtype == np.uint32 and cards.dtype == np.int64
        assert got.tolist() == values.tolist() and cards.tolist() == np.diff(bounds).tolist()


@pytest.mark.parametrize(
    ("values", "bounds", "match"),
    [
        ([3, 2], [0, 2], "not ascending"),
        ([3, 3], [0, 2], "not ascending"),
        ([1], [0, 0, 1], "empty or its bounds decrease"),
        ([1, 2], [0, 2, 1, 2], "empty or its bounds decrease"),
        ([1], [0, 2], "do not span"),
        ([1], [1, 1], "do not span"),
        ([], [], "bounds are empty"),
    ],
)
def test_write_block_refuses_what_is_not_groups(
    values: list[int], bounds: list[int], match: str
) -> None:
    for kernels in (_native(), pure):
        with pytest.raises(ValueError, match=match):
            kernels.roaring_write_block(
                np.array(values, dtype=np.uint32), np.array(bounds, dtype=np.int64)
            )


def test_block_values_refuse_a_malformed_bitmap() -> None:
    good = bytes(BitMap([1, 5]).serialize())
    for kernels in (_native(), pure):
        for blob, offsets in (
            (good + b"junk", [0, len(good), len(good) + 4]),
            (good, [0, len(good) + 1]),
            (good, [0, 3, len(good)]),
        ):
            with pytest.raises(ValueError):
                kernels.roaring_block_values(blob, np.array(offsets, dtype=np.int64))


def _streams(cards: list[int], firsts: list[int], steps: bytes, escapes: list[int]) -> bytes:
    return pack_varints(cards) + pack_varints(firsts) + steps + pack_varints(escapes)


@pytest.mark.parametrize(
    ("raw", "groups", "match"),
    [
        (_streams([0], [5], b"", []), 1, "holds no entry"),
        (_streams([2], [5], b"", []), 1, "cut short"),
        (_streams([1], [2**32], b"", []), 1, "beyond 32 bits"),
        (_streams([2], [2**32 - 1], b"\x00", []), 1, "beyond 32 bits"),
        (_streams([2], [5], b"\xff", []), 1, "bad varint"),
        (_streams([2], [5], b"\xff", [2**32]), 1, "gap beyond 32 bits"),
        (_streams([2], [5], b"\x00", [0]), 1, "bytes after"),
        (_streams([1], [5], b"\x00", []), 1, "bytes after"),
        (_streams([1], [], b"", []), 1, "bad varint"),
        (_streams([2**40], [1], b"", []), 1, "more entries than the part has bytes"),
        (b"", 1, "bad varint"),
    ],
)
def test_malformed_gap_streams_are_refused(raw: bytes, groups: int, match: str) -> None:
    for unpack in (_native().unpack_entry_gaps, pure.unpack_entry_gaps):
        with pytest.raises(ValueError, match=match):
            unpack(raw, 0, groups)


def test_an_escaped_gap_is_exact() -> None:
    raw = _streams([3], [10], b"\x00\xff", [1])  # gaps 1 and 257
    values, bounds = _impl.unpack_entry_gaps(raw, 0, 1)
    assert values.tolist() == [10, 11, 268] and bounds.tolist() == [0, 3]
    assert pack_entry_gaps(values, np.diff(bounds)) == raw


def _realistic(version: int = FORMAT_VERSION) -> tuple[SnapshotMetadata, list[Any], bytes]:
    w = generate(6_000, seed=7)
    mask = w.delayed_mask
    built, segments = build_snapshot(
        w.deliver_at[mask], w.ledger_ids[mask], w.entry_ids[mask],
        max_time_step_ms=300_000, max_indexes_per_segment=64,
    )  # fmt: skip
    metadata = SnapshotMetadata(
        built.start_ledger, built.end_ledger, built.mins, built.maxs, built.counts,
        built.ledger_offsets, built.ledgers, built.block, version,
    )  # fmt: skip
    return metadata, list(segments), codec.encode_snapshot(metadata, list(segments))


def test_format_6_is_written_and_decodes_to_the_same_bitmaps_as_format_5() -> None:
    assert FORMAT_VERSION == GAPS_FORMAT_VERSION
    new, _, data = _realistic()
    old, _, old_data = _realistic(LEDGERS_APART_FORMAT_VERSION)
    got, got_segments = codec.decode_snapshot(data, NAME)
    assert got.format_version == GAPS_FORMAT_VERSION and got == new
    assert got.block.blob == old.block.blob and np.array_equal(got.block.offsets, old.block.offsets)
    assert codec.decode_snapshot(old_data, NAME)[0].format_version == LEDGERS_APART_FORMAT_VERSION
    assert codec.encode_snapshot(got, list(got_segments)) == data  # re-encodes as itself
    assert len(data) < 0.9 * len(old_data)


def test_a_first_segment_read_decodes_the_positions_whole() -> None:
    metadata, _, data = _realistic()
    _, framed = codec.split_object(data, NAME)
    lazy = codec.decode_metadata(framed[0], NAME, check_bitmaps=False)
    assert not lazy.bitmaps_loaded  # an open reads the columns only
    got = codec.decode_segments(framed[1:2], lazy, 1, NAME)
    assert lazy.bitmaps_loaded
    want = codec.decode_segments(framed[1:2], metadata, 1, NAME)
    for column in ("times", "ledgers", "entries", "bounds"):
        assert np.array_equal(getattr(got, column), getattr(want, column)), column


def _with_part(data: bytes, part: bytes) -> bytes:
    """``data`` with its metadata's positions part replaced by ``part`` (checksums valid)."""
    _, entries = codec.split_object(data, NAME)
    flags, payload = entries[0][0], entries[0][1:-4]
    length, start = codec._get_varint(payload, 0, len(payload))
    packed = zstandard.ZstdCompressor().compress(part) if flags & codec.FLAG_ZSTD else part
    entries[0] = codec._frame(0, flags, payload[: start + length] + packed)
    return codec.pack_object(entries)


def _parts_of(metadata: SnapshotMetadata) -> tuple[bytes, list[int], list[int], bytes, list[int]]:
    """The positions part's ledger columns, then the gap streams as lists."""
    counts, deltas = codec._stored_ledgers(metadata)
    values, cards = _impl.roaring_block_values(metadata.block.blob, metadata.block.offsets)
    starts = np.cumsum(cards) - cards
    later = np.ones(len(values), dtype=np.bool_)
    later[starts] = False
    gaps = np.diff(values.astype(np.int64), prepend=np.int64(0))[later]
    steps = np.where(gaps > 255, 255, gaps - 1).astype(np.uint8).tobytes()
    escapes = (gaps[gaps > 255] - 256).tolist()
    ledgers = pack_varints(counts) + pack_varints(deltas)
    return ledgers, cards.tolist(), values[starts].tolist(), steps, escapes


def test_damaged_gap_streams_behind_a_valid_checksum_are_corrupt() -> None:
    """Streams that break the layout (counts, lengths, escapes) are refused. A change that
    keeps the layout (other valid positions) is what the entry's checksum is for: the damage
    campaign flips every byte of a stored object."""
    metadata, _, data = _realistic()
    assert codec.split_object(data, NAME)[1][0][0] == codec.FLAG_ZSTD | codec.FLAG_SPLIT
    ledgers, cards, firsts, steps, escapes = _parts_of(metadata)
    assert ledgers + _streams(cards, firsts, steps, escapes) == codec._positions_part(metadata)
    i = next(k for k, c in enumerate(cards) if c >= 2)  # a (segment, ledger) with a gap
    step_at = sum(cards[:i]) - i  # its first step
    cases: dict[str, bytes] = {
        "a card one more": _streams(
            [*cards[:i], cards[i] + 1, *cards[i + 1 :]], firsts, steps, escapes
        ),
        "a step byte more": _streams(cards, firsts, steps + b"\x00", escapes),
        "a step byte less": _streams(cards, firsts, steps[:-1], escapes),
        "an escape more": _streams(cards, firsts, steps, [*escapes, 1]),
        "a step changed into an escape": _streams(
            cards, firsts, steps[:step_at] + b"\xff" + steps[step_at + 1 :], escapes
        ),
        "the gaps cut off": ledgers[:-1],
        "nothing after the ledger columns": b"",
        "a ledger column cut": ledgers[:3],
    }
    for what, streams in cases.items():
        part = streams if what in ("the gaps cut off", "a ledger column cut") else ledgers + streams
        damaged = _with_part(data, part)
        with pytest.raises(SnapshotCorruptError, match=NAME):
            codec.decode_snapshot(damaged, NAME)
        _, framed = codec.split_object(damaged, NAME)
        lazy = codec.decode_metadata(framed[0], NAME, check_bitmaps=False)  # the columns are sound
        with pytest.raises(SnapshotCorruptError, match=NAME):
            lazy.block  # noqa: B018
        assert what


def test_a_position_in_two_segments_through_the_gaps_is_corrupt() -> None:
    metadata, _, data = _realistic()
    ledgers, cards, firsts, steps, escapes = _parts_of(metadata)
    led = metadata.ledgers.tolist()
    # Two (segment, ledger)s of one ledger with one entry each: give the second the first's.
    singles = [k for k, c in enumerate(cards) if c == 1]
    a, b = next((x, y) for x in singles for y in singles if x < y and led[x] == led[y])
    moved = [*firsts[:b], firsts[a], *firsts[b + 1 :]]
    damaged = _with_part(data, ledgers + _streams(cards, moved, steps, escapes))
    with pytest.raises(SnapshotCorruptError, match=f"{NAME}.*in two segments"):
        codec.decode_snapshot(damaged, NAME)
