"""The pure codec's batch kernels (``delayindex._pure._batch``) against the per-item paths.

``write_groups`` must write exactly pyroaring's ``run_optimize(); serialize()`` bytes for every
group it takes; ``read_block`` must accept a bitmap only if the native parser accepts it, with
the same values (anything else is left to the per-bitmap path); ``pack_segments`` must equal
``pack_times`` per segment. The native parser is imported directly, whatever the build.
"""

from __future__ import annotations

from types import ModuleType

import numpy as np
import numpy.typing as npt
import pytest
from hypothesis import given
from hypothesis import strategies as st
from pyroaring import BitMap

from delayindex import _impl
from delayindex._ints import bit_lengths
from delayindex._pure import codec as pure
from delayindex._pure._batch import (
    pack_segments,
    read_block,
    unpack_segments,
    write_groups,
)

U32_MAX = 2**32 - 1


def _native() -> ModuleType:
    module = _impl.native_module_or_none()
    if module is None:
        pytest.fail("the native extension delayindex._native is not built; reinstall the package")
    return module


@st.composite
def _group(draw: st.DrawFn) -> list[int]:
    """Ascending distinct uint32 values shaped like a snapshot's (segment, ledger) bitmaps:
    scattered, clustered in one chunk, runs, and now and then several chunks or > 4096."""
    shape = draw(st.sampled_from(["scattered", "cluster", "runs", "big", "chunks"]))
    if shape == "scattered":
        values = draw(st.lists(st.integers(0, U32_MAX), min_size=1, max_size=12))
    elif shape == "cluster":
        base = draw(st.integers(0, U32_MAX - 70_000))
        values = [base + d for d in draw(st.lists(st.integers(0, 3_000), min_size=1, max_size=60))]
    elif shape == "runs":
        start, values = draw(st.integers(0, U32_MAX - 10_000)), []
        for _ in range(draw(st.integers(1, 5))):
            length = draw(st.integers(1, 40))
            values.extend(range(start, start + length))
            start += length + draw(st.integers(1, 30))
    elif shape == "big":
        base = draw(st.integers(0, 65_535)) << 16
        values = [base + v for v in range(0, draw(st.sampled_from([4_095, 4_096, 4_097, 9_000])))]
        if draw(st.booleans()):
            values = values[::2]
    else:
        key = draw(st.integers(0, 65_534))
        values = [key << 16 | 0xFFFF, (key + 1) << 16]
    return sorted(set(values))


def _pyroaring(values: list[int]) -> bytes:
    bm = BitMap(values)
    bm.run_optimize()
    return bytes(bm.serialize())


def _blocks(groups: list[list[int]]) -> tuple[npt.NDArray[np.uint32], npt.NDArray[np.int64]]:
    values = np.array([v for g in groups for v in g], dtype=np.uint32)
    return values, np.cumsum([0, *map(len, groups)], dtype=np.int64)


@given(st.lists(_group(), max_size=25))
def test_write_groups_writes_what_pyroaring_writes(groups: list[list[int]]) -> None:
    values, bounds = _blocks(groups)
    raw, sizes, fast = write_groups(values, bounds)
    assert len(raw) == int(sizes.sum())
    at = 0
    for g, vals in enumerate(groups):
        single_chunk = vals[0] >> 16 == vals[-1] >> 16
        assert fast[g] == (single_chunk and len(vals) <= 4_096), vals[:3]
        if fast[g]:
            assert raw[at : at + sizes[g]] == _pyroaring(vals)
            at += int(sizes[g])
        else:
            assert sizes[g] == 0


@given(st.lists(_group(), min_size=1, max_size=20))
def test_read_block_reads_what_it_may_and_leaves_the_rest(groups: list[list[int]]) -> None:
    bitmaps = [_pyroaring(g) for g in groups]
    raw = b"".join(bitmaps)
    values, counts, ok = read_block(raw, np.cumsum([0, *map(len, bitmaps)], dtype=np.int64))
    at = 0
    for g, vals in enumerate(groups):
        # Every single-chunk array or run bitmap is read here; bitsets and several chunks not.
        run = bitmaps[g][:2] == b"\x3b\x30"
        assert ok[g] == (vals[0] >> 16 == vals[-1] >> 16 and (len(vals) <= 4_096 or run))
        if ok[g]:
            assert values[at : at + len(vals)].tolist() == vals
            at += len(vals)
        assert counts[g] == (len(vals) if ok[g] else 0)
    assert at == len(values) and values.dtype == np.uint32


@given(
    st.lists(_group(), min_size=1, max_size=6),
    st.sampled_from(["flip", "overwrite", "truncate", "append", "garbage"]),
    st.data(),
)
def test_read_block_accepts_only_what_the_native_parser_accepts(
    groups: list[list[int]], damage: str, data: st.DataObject
) -> None:
    bitmaps = [bytearray(_pyroaring(g)) for g in groups]
    victim = data.draw(st.integers(0, len(bitmaps) - 1))
    raw = bitmaps[victim]
    if damage == "flip":
        for _ in range(data.draw(st.integers(1, 3))):
            pos = data.draw(st.integers(0, min(len(raw) - 1, 24)) | st.integers(0, len(raw) - 1))
            raw[pos] ^= 1 << data.draw(st.integers(0, 7))
    elif damage == "overwrite":
        pos = data.draw(st.integers(0, len(raw) - 1))
        chunk = data.draw(st.binary(min_size=1, max_size=6))
        raw[pos : pos + len(chunk)] = chunk
    elif damage == "truncate":
        del raw[data.draw(st.integers(0, len(raw) - 1)) :]
    elif damage == "append":
        raw += data.draw(st.binary(min_size=1, max_size=4))
    else:
        bitmaps[victim] = bytearray(data.draw(st.binary(max_size=40)))
    cuts = np.cumsum([0, *map(len, bitmaps)], dtype=np.int64)
    values, counts, ok = read_block(b"".join(bitmaps), cuts)
    at = 0
    for i, bitmap in enumerate(bitmaps):
        try:
            expected: list[int] | None = _native().roaring_entries(bytes(bitmap)).tolist()
        except ValueError:
            expected = None
        if ok[i]:
            assert expected is not None, f"bitmap {i} accepted, the native parser rejects it"
            assert values[at : at + counts[i]].tolist() == expected
            at += int(counts[i])
    assert at == len(values)


def test_read_block_leaves_bitmaps_outside_the_block_alone() -> None:
    one = _pyroaring([1, 5, 9])
    cuts = np.array([0, len(one), len(one) + 40, len(one)], dtype=np.int64)
    _, counts, ok = read_block(one, cuts)
    assert ok.tolist() == [True, False, False] and counts.tolist() == [3, 0, 0]


@given(
    st.lists(
        st.lists(st.integers(-(2**62) + 1, 2**62 - 1), min_size=1, max_size=40),
        min_size=1,
        max_size=12,
    )
)
def test_pack_segments_packs_as_pack_times(segments: list[list[int]]) -> None:
    times = np.array([t for s in segments for t in s], dtype=np.int64)
    bounds = np.cumsum([0, *map(len, segments)], dtype=np.int64)
    mins = np.array([min(s) for s in segments], dtype=np.int64)
    spans = np.array([max(s) - min(s) for s in segments], dtype=np.int64)
    got = pack_segments(times, bounds, mins, spans)
    assert got == [
        pure.pack_times(np.array(s, dtype=np.int64), min(s), max(s) - min(s)) for s in segments
    ]
    back = unpack_segments(got, np.diff(bounds), bit_lengths(spans))
    assert back.dtype == np.uint64
    assert (back.astype(np.int64) + np.repeat(mins, np.diff(bounds))).tolist() == times.tolist()


def test_pack_segments_in_chunks() -> None:
    # More times than one chunk holds, and one segment alone over a chunk.
    rng = np.random.default_rng(7)
    sizes = [3, 70_000, 5, 40_000, 40_000, 1]
    segments = [rng.integers(0, 2**40, size=k, dtype=np.int64) for k in sizes]
    times = np.concatenate(segments)
    bounds = np.cumsum([0, *sizes], dtype=np.int64)
    mins = np.array([s.min() for s in segments], dtype=np.int64)
    spans = np.array([s.max() - s.min() for s in segments], dtype=np.int64)
    got = pack_segments(times, bounds, mins, spans)
    assert got == [pure.pack_times(s, int(s.min()), int(s.max() - s.min())) for s in segments]
    back = unpack_segments(got, np.array(sizes, dtype=np.int64), bit_lengths(spans))
    assert np.array_equal(back.astype(np.int64) + np.repeat(mins, sizes), times)
