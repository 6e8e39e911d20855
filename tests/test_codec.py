"""Snapshot builder and codec: the segment cut rule, round trips, corruption, size per index.

Everything here goes through the public codec, which uses whichever kernels ``delayindex._impl``
selected (run the file with ``DELAYINDEX_NO_EXTENSIONS=1`` too); ``test_codec_kernels.py``
compares the two kernel twins directly.

The corruption tests are the acceptance test of the format: a real snapshot with every single
byte flipped (two ways), truncated at every length or extended by a byte must raise
:class:`SnapshotCorruptError` naming the object, never decode and never raise anything else.
Hand-built objects with valid checksums but inconsistent contents cover the semantic checks.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Callable, Iterator, Sequence
from typing import Any, cast

import numpy as np
import numpy.typing as npt
import pytest
import zstandard
from hypothesis import given
from hypothesis import strategies as st
from pyroaring import BitMap

from delayindex import _impl
from delayindex._pure import codec as pure_codec
from delayindex.errors import SnapshotCorruptError
from delayindex.model import MAX_ENTRY_ID, MAX_LEDGER_ID
from delayindex.pb import snapshot_pb2
from delayindex.snapshot import codec
from delayindex.snapshot.codec import (
    FLAG_SPLIT,
    FLAG_ZSTD,
    decode_metadata,
    decode_segments,
    decode_snapshot,
    encode_snapshot,
    pack_object,
    pack_varints,
    split_object,
)
from delayindex.snapshot.format import (
    FORMAT_VERSION,
    LEDGERS_APART_FORMAT_VERSION,
    SPLIT_FORMAT_VERSION,
    PreparedSegments,
    Segment,
    SnapshotMetadata,
    build_snapshot,
    cut_segments,
)
from delayindex.workload import generate

I64_MIN = -(2**63)
I64_MAX = 2**63 - 1
NAME = "bucket-7"

Triple = tuple[int, int, int]
Int64Array = npt.NDArray[np.int64]


# --- helpers -----------------------------------------------------------------------------------


def _build(triples: list[Triple], step: int = 300_000, limit: int = -1, **kw: Any) -> Any:
    return build_snapshot(
        [t for t, _, _ in triples],
        [lg for _, lg, _ in triples],
        [e for _, _, e in triples],
        max_time_step_ms=step,
        max_indexes_per_segment=limit,
        **kw,
    )


def _delayed(n_messages: int, seed: int, **kw: Any) -> tuple[Int64Array, Int64Array, Int64Array]:
    """The delayed subset of a realistic workload as (times, ledgers, entries)."""
    w = generate(n_messages, seed=seed, **kw)
    mask = w.delayed_mask
    return w.deliver_at[mask], w.ledger_ids[mask], w.entry_ids[mask]


def _reference_cut(triples: list[Triple], step: int, limit: int) -> list[list[Triple]]:
    """Pulsar's cut rule, written as plainly as possible on Python ints."""
    ordered = sorted(triples)
    out: list[list[Triple]] = []
    i = 0
    while i < len(ordered):
        first = ordered[i][0]
        j = i
        while (
            j < len(ordered)
            and ordered[j][0] <= first + step - 1
            and (limit == -1 or j - i < limit)
        ):
            j += 1
        out.append(ordered[i:j])
        i = j
    return out


def _check_against_reference(triples: list[Triple], step: int, limit: int, **kw: Any) -> None:
    metadata, segments = _build(triples, step, limit, **kw)
    expected = _reference_cut(triples, step, limit)
    assert [s.triples() for s in segments] == expected
    assert metadata.num_segments == len(expected)
    assert metadata.num_messages == len(triples)
    for seg, meta, want in zip(segments, metadata.segments, expected, strict=True):
        for column in (seg.times, seg.ledgers, seg.entries):
            assert column.dtype == np.int64
        assert meta.min_deliver_at == want[0][0]
        assert meta.max_deliver_at == want[-1][0]
        assert meta.count == len(want)
        by_ledger: dict[int, set[int]] = {}
        for _, lg, e in want:
            by_ledger.setdefault(lg, set()).add(e)
        assert meta.ledgers == tuple(sorted(by_ledger))
        assert {lg: set(bm) for lg, bm in meta.items()} == by_ledger


def _positions(segments: Sequence[Segment]) -> dict[int, set[int]]:
    out: dict[int, set[int]] = {}
    for seg in segments:
        for _, lg, e in seg.triples():
            out.setdefault(lg, set()).add(e)
    return out


def _sub_ranges(n: int) -> Iterator[tuple[int, int]]:
    """Entry ranges ``[k, j)`` (segments are entries 1..n): all of them when n is small."""
    if n <= 6:
        for k in range(1, n + 2):
            for j in range(k, n + 2):
                yield k, j
        return
    mid = n // 2
    yield from [(1, n + 1), (1, 2), (n, n + 1), (mid, mid + 3), (2, n), (mid, mid), (n + 1, n + 1)]


def _assert_round_trip(metadata: SnapshotMetadata, segments: Sequence[Segment]) -> bytes:
    """Encode, then check every decode path against the input; return the object."""
    data = encode_snapshot(metadata, segments)
    got_meta, got_segments = decode_snapshot(data, NAME)
    assert got_meta == metadata
    assert got_meta.bitmaps == metadata.bitmaps  # bytes preserved exactly
    assert np.array_equal(got_meta.ledgers, metadata.ledgers)
    assert np.array_equal(got_meta.ledger_offsets, metadata.ledger_offsets)
    assert (got_meta.start_ledger, got_meta.end_ledger) == (
        metadata.start_ledger,
        metadata.end_ledger,
    )
    assert got_meta.num_messages == metadata.num_messages
    assert len(got_segments) == len(segments)
    for got, want in zip(got_segments, segments, strict=True):
        assert got.triples() == want.triples()
        assert got.times.dtype == got.ledgers.dtype == got.entries.dtype == np.int64

    header, entries = split_object(data, NAME)
    assert header.num_segments == metadata.num_segments == len(entries) - 1
    assert header.total_bytes == len(data)
    for i, entry in enumerate(entries):
        offset = header.entry_offset(i)
        assert data[offset : offset + len(entry)] == entry
    for check_bitmaps in (True, False):
        assert decode_metadata(entries[0], NAME, check_bitmaps=check_bitmaps) == metadata
    meta = decode_metadata(entries[0], NAME)
    for k, j in _sub_ranges(metadata.num_segments):
        part = decode_segments(entries[k:j], meta, first=k, name=NAME)
        assert [s.triples() for s in part] == [s.triples() for s in segments[k - 1 : j - 1]]
    return data


def _container_stats(metadata: SnapshotMetadata) -> dict[str, int]:
    totals: dict[str, int] = {}
    for data in metadata.bitmaps:
        for key, value in BitMap.deserialize(data).get_statistics().items():
            if key.startswith("n_") and key.endswith("_containers"):
                totals[key] = totals.get(key, 0) + cast(int, value)  # every statistic is an int
    return totals


# --- build_snapshot: the cut rule --------------------------------------------------------------


@given(
    st.lists(
        st.tuples(
            st.one_of(st.integers(-30, 30), st.integers(I64_MIN, I64_MAX)),
            st.integers(0, 5),
            st.integers(0, 40),
        ),
        min_size=1,
        max_size=60,
        unique_by=lambda x: (x[1], x[2]),
    ),
    st.one_of(st.integers(1, 25), st.integers(1, 2**62)),
    st.one_of(st.just(-1), st.integers(1, 8)),
    st.randoms(use_true_random=False),
)
def test_cut_rule_matches_reference(
    triples: list[Triple], step: int, limit: int, rnd: random.Random
) -> None:
    rnd.shuffle(triples)
    _check_against_reference(triples, step, limit)


def test_time_step_is_inclusive() -> None:
    # A segment starting at T holds times T .. T + step - 1; T + step starts the next one.
    triples = [(100, 1, 0), (109, 1, 1), (110, 1, 2), (119, 1, 3), (120, 1, 4)]
    _, segments = _build(triples, step=10)
    assert [s.triples() for s in segments] == [triples[0:2], triples[2:4], triples[4:]]
    _check_against_reference(triples, 10, -1)


def test_count_limit() -> None:
    triples = [(0, 1, e) for e in range(10)]
    for limit, sizes in [(1, [1] * 10), (3, [3, 3, 3, 1]), (10, [10]), (11, [10]), (-1, [10])]:
        _, segments = _build(triples, step=1_000, limit=limit)
        assert [len(s) for s in segments] == sizes
        _check_against_reference(triples, 1_000, limit)


def test_count_limit_restarts_time_window() -> None:
    # The segment cut by the count limit starts a new time window at its own first index.
    triples = [(0, 1, 0), (0, 1, 1), (5, 1, 2), (14, 1, 3), (15, 1, 4)]
    _, segments = _build(triples, step=10, limit=2)
    assert [s.triples() for s in segments] == [triples[0:2], triples[2:4], triples[4:]]


def test_step_one_is_one_segment_per_distinct_time() -> None:
    rnd = random.Random(5)
    triples = [(rnd.randrange(20), rnd.randrange(3), e) for e in range(200)]
    metadata, segments = _build(triples, step=1, limit=-1)
    distinct = sorted({t for t, _, _ in triples})
    assert metadata.num_segments == len(distinct)
    assert [int(s.times[0]) for s in segments] == distinct
    assert all(len(set(s.times.tolist())) == 1 for s in segments)
    _check_against_reference(triples, 1, -1)


def test_unlimited_largest_step_is_one_segment() -> None:
    triples = [(-(2**61), 3, 1), (0, 1, 2), (2**62 - 2**61 - 1, 2, 3)]
    metadata, segments = _build(triples, step=2**62, limit=-1)
    assert metadata.num_segments == 1
    assert segments[0].triples() == sorted(triples)


def test_cut_segments_direct() -> None:
    times = np.array([0, 0, 9, 10, 10, 25], dtype=np.int64)
    assert cut_segments(times, 10, -1) == [(0, 3), (3, 5), (5, 6)]
    assert cut_segments(times, 10, 2) == [(0, 2), (2, 4), (4, 5), (5, 6)]  # 2nd starts at 9
    assert cut_segments(times[:0], 10, -1) == []
    assert cut_segments(np.array([I64_MAX - 1, I64_MAX], dtype=np.int64), 2**62, -1) == [(0, 2)]
    for step, limit in [(0, -1), (-5, 3), (10, 0), (10, -2)]:
        with pytest.raises(ValueError):
            cut_segments(times, step, limit)


def test_unsorted_input_is_sorted() -> None:
    rnd = random.Random(11)
    triples = [(rnd.randrange(50), lg, e) for lg in range(1, 5) for e in range(30)]
    shuffled = triples[:]
    rnd.shuffle(shuffled)
    metadata, segments = _build(shuffled, step=7, limit=9)
    flat = [x for s in segments for x in s.triples()]
    assert flat == sorted(triples)
    other_meta, other_segments = _build(sorted(triples), step=7, limit=9)
    assert other_meta == metadata
    assert other_segments == segments
    # Inside a segment: time, then ledger, then entry.
    for seg in segments:
        assert seg.triples() == sorted(seg.triples())


# --- build_snapshot: validation ----------------------------------------------------------------


def test_ledger_range_defaults_to_min_max() -> None:
    metadata, _ = _build([(1, 7, 0), (2, 3, 0), (3, 5, 1)])
    assert (metadata.start_ledger, metadata.end_ledger) == (3, 7)


def test_ledger_range_explicit() -> None:
    triples = [(1, 7, 0), (2, 3, 0)]
    metadata, _ = _build(triples, start_ledger=0, end_ledger=MAX_LEDGER_ID)
    assert (metadata.start_ledger, metadata.end_ledger) == (0, MAX_LEDGER_ID)
    metadata, _ = _build(triples, start_ledger=3, end_ledger=7)
    assert (metadata.start_ledger, metadata.end_ledger) == (3, 7)


@pytest.mark.parametrize(
    ("start", "end"),
    [
        (4, 7),  # ledger 3 below the range
        (3, 6),  # ledger 7 above the range
        (8, 7),  # start > end
        (-1, 7),  # negative start
        (3, MAX_LEDGER_ID + 1),  # end beyond int64
        (7, 3),
    ],
)
def test_ledger_range_validation(start: int, end: int) -> None:
    with pytest.raises(ValueError):
        _build([(1, 7, 0), (2, 3, 0)], start_ledger=start, end_ledger=end)


def test_duplicate_positions_rejected() -> None:
    with pytest.raises(ValueError, match="twice"):
        _build([(1, 5, 9), (2, 5, 9)])
    with pytest.raises(ValueError, match="twice"):
        _build([(1, 5, 9), (1, 5, 9)])
    _build([(1, 5, 9), (1, 6, 9), (1, 5, 8)])  # same entry in another ledger is fine


def test_empty_rejected() -> None:
    with pytest.raises(ValueError):
        _build([])
    with pytest.raises(ValueError):
        build_snapshot(
            np.empty(0, dtype=np.int64),
            np.empty(0, dtype=np.int64),
            np.empty(0, dtype=np.int64),
            max_time_step_ms=1,
            max_indexes_per_segment=-1,
        )


@pytest.mark.parametrize(
    "bad",
    [
        np.array([1.0]),
        np.array([1.5]),
        np.array(["1"]),
        np.array([True]),
        np.array([[1]]),
        np.array([1.5], dtype=object),
    ],
    ids=["float", "fraction", "str", "bool", "2d", "object"],
)
@pytest.mark.parametrize("column", [0, 1, 2])
def test_non_int_arrays_rejected(bad: Any, column: int) -> None:
    args: list[Any] = [np.array([1]), np.array([1]), np.array([1])]
    args[column] = bad
    with pytest.raises(TypeError):
        build_snapshot(*args, max_time_step_ms=1, max_indexes_per_segment=-1)


@pytest.mark.parametrize(
    "triples",
    [
        [(1, 1, MAX_ENTRY_ID + 1)],
        [(1, 1, 0), (1, 1, 2**40)],
        [(1, 1, -1)],
        [(1, -1, 0)],
    ],
    ids=["entry-2**32", "entry-2**40", "entry-negative", "ledger-negative"],
)
def test_ids_out_of_range_rejected(triples: list[Triple]) -> None:
    with pytest.raises(ValueError):
        _build(triples)


def test_unequal_lengths_rejected() -> None:
    with pytest.raises(ValueError):
        build_snapshot([1, 2], [1], [1], max_time_step_ms=1, max_indexes_per_segment=-1)


def test_time_beyond_int64_rejected() -> None:
    with pytest.raises((ValueError, TypeError)):
        _build([(1, 1, 0), (2**63, 1, 1)])


def test_time_2_pow_63_alone_rejected() -> None:
    with pytest.raises((ValueError, TypeError)):
        _build([(2**63, 1, 0)])


# --- round trips -------------------------------------------------------------------------------


def test_round_trip_one_index() -> None:
    metadata, segments = _build([(1_767_225_600_000, 42, 7)])
    data = _assert_round_trip(metadata, segments)
    _, entries = split_object(data, NAME)
    assert len(entries[1]) == 5  # flags + empty payload + crc: min == max packs to nothing


@pytest.mark.parametrize("limit", [-1, 1, 7, 64])
def test_round_trip_all_at_the_same_time(limit: int) -> None:
    triples = [(123_456, lg, e) for lg in (1, 2, 9) for e in range(0, 300, 2)]
    metadata, segments = _build(triples, step=1, limit=limit)
    assert np.all(metadata.mins == 123_456) and np.all(metadata.maxs == 123_456)
    _assert_round_trip(metadata, segments)


@pytest.mark.parametrize(
    ("times", "step"),
    [
        ([I64_MIN, I64_MIN + 1, I64_MIN + 2], 1),
        ([I64_MIN, I64_MIN, I64_MIN + 5], 3),
        ([I64_MAX - 2, I64_MAX - 1, I64_MAX, I64_MAX], 1),
        ([I64_MAX - 2, I64_MAX], 2**62),
        ([I64_MIN, -1], 2**62),  # far apart: separate segments
        ([0, I64_MAX], 2**62),
        ([I64_MIN + 1, 0], 2**62),
        ([-1, I64_MAX - 1], 1),  # consecutive minimums 2**63 - 1 apart
        ([I64_MIN, -1, 5, I64_MAX - 7], 1),
    ],
)
def test_round_trip_extreme_times(times: list[int], step: int) -> None:
    triples = [(t, 1 + i % 2, i) for i, t in enumerate(times)]
    metadata, segments = _build(triples, step=step)
    _assert_round_trip(metadata, segments)


@pytest.mark.parametrize(
    ("times", "step"),
    [
        ([I64_MIN + 1, I64_MAX], 1),
        ([I64_MIN, 0], 1),
        ([I64_MIN + 1, 0, I64_MAX], 2**62),
    ],
)
def test_round_trip_segment_minimums_far_apart(times: list[int], step: int) -> None:
    triples = [(t, 1, i) for i, t in enumerate(times)]
    _assert_round_trip(*_build(triples, step=step))


@pytest.mark.parametrize("step", [2**62 + 1, 2**63, 2**64])
def test_time_step_beyond_2_pow_62_rejected(step: int) -> None:
    with pytest.raises(ValueError, match="max_time_step_ms"):
        _build([(I64_MIN + 1, 1, 0), (I64_MAX, 1, 1)], step=step)


def test_round_trip_extreme_ids() -> None:
    triples = [
        (10, MAX_LEDGER_ID, MAX_ENTRY_ID),
        (10, MAX_LEDGER_ID, 0),
        (11, 0, MAX_ENTRY_ID),
        (11, 0, 0),
        (12, MAX_LEDGER_ID - 1, MAX_ENTRY_ID - 1),
        (12, 2**32, 2**31),
    ]
    for limit in (-1, 1, 2):
        metadata, segments = _build(triples, step=1, limit=limit)
        assert (metadata.start_ledger, metadata.end_ledger) == (0, MAX_LEDGER_ID)
        _assert_round_trip(metadata, segments)
    metadata, segments = _build(
        [(5, MAX_LEDGER_ID, MAX_ENTRY_ID)], start_ledger=MAX_LEDGER_ID, end_ledger=MAX_LEDGER_ID
    )
    _assert_round_trip(metadata, segments)
    metadata, segments = _build([(5, 0, MAX_ENTRY_ID)], start_ledger=0, end_ledger=MAX_LEDGER_ID)
    _assert_round_trip(metadata, segments)


@pytest.mark.parametrize("limit", [-1, 100, 1])
def test_round_trip_many_ledgers(limit: int) -> None:
    rnd = random.Random(3)
    ledgers = sorted(rnd.sample(range(10**12), 2_000))
    triples = [(rnd.randrange(1_000), lg, rnd.randrange(2**32)) for lg in ledgers]
    metadata, segments = _build(triples, step=1_000, limit=limit)
    assert len(metadata.ledgers) >= 2_000
    _assert_round_trip(metadata, segments)


def test_round_trip_bitset_and_run_containers() -> None:
    # Segment sizes stay moderate: the pure twin packs times through one big Python int.
    rnd = random.Random(9)
    # Times rise with the entry id (a few equal times in a row, as when published), so that
    # a segment cut by count holds consecutive entries.
    dense_run = [(10_000 + e // 64, 1, e) for e in range(70_000)]
    dense_bits = [(20_000 + e // 128, 2, e) for e in range(0, 140_000, 2)]
    random_half = [(30_000 + e // 64, 3, e) for e in range(30_000) if rnd.random() < 0.5]
    # Cut by count (Pulsar's default limit): runs and bitsets in every segment, some
    # containers straddling two segments.
    metadata, segments = _build(dense_run + dense_bits + random_half, step=10**6, limit=5_000)
    stats = _container_stats(metadata)
    assert stats["n_run_containers"] >= 14
    assert stats["n_bitset_containers"] >= 14
    _assert_round_trip(metadata, segments)
    # One unlimited segment: range(0, 70000) at one time (a full 65536-value run container).
    metadata, segments = _build([(7, 1, e) for e in range(70_000)], limit=-1)
    assert metadata.num_segments == 1
    assert _container_stats(metadata)["n_run_containers"] == 2
    _assert_round_trip(metadata, segments)
    # One segment holding a bitset container and packed times.
    metadata, segments = _build(dense_bits[:20_000] + random_half, step=10**6, limit=-1)
    assert metadata.num_segments == 1
    assert _container_stats(metadata)["n_bitset_containers"] >= 2
    _assert_round_trip(metadata, segments)


@pytest.fixture(scope="module")
def realistic() -> tuple[SnapshotMetadata, PreparedSegments]:
    times, ledgers, entries = _delayed(40_000, seed=3)
    assert len(times) >= 19_000
    return build_snapshot(
        times, ledgers, entries, max_time_step_ms=300_000, max_indexes_per_segment=5_000
    )


def test_round_trip_realistic(realistic: tuple[SnapshotMetadata, PreparedSegments]) -> None:
    metadata, segments = realistic
    assert metadata.num_segments > 10
    _assert_round_trip(metadata, segments)


@given(
    st.lists(
        st.tuples(st.integers(-(10**6), 10**6), st.integers(0, 6), st.integers(0, 2**32 - 1)),
        min_size=1,
        max_size=80,
        unique_by=lambda x: (x[1], x[2]),
    ),
    st.integers(1, 10**5),
    st.one_of(st.just(-1), st.integers(1, 10)),
)
def test_round_trip_random(triples: list[Triple], step: int, limit: int) -> None:
    _assert_round_trip(*_build(triples, step=step, limit=limit))


# --- metadata queries --------------------------------------------------------------------------


def test_first_live_segment(realistic: tuple[SnapshotMetadata, PreparedSegments]) -> None:
    metadata, segments = realistic

    def reference(cutoff: int) -> int | None:
        for number, seg in enumerate(segments, 1):
            if any(t > cutoff for t in seg.times.tolist()):
                return number
        return None

    cutoffs = {I64_MIN, I64_MAX}
    for seg in segments[:: max(1, len(segments) // 40)] + segments[-3:]:
        low, high = int(seg.times[0]), int(seg.times[-1])
        cutoffs |= {low - 1, low, high - 1, high, high + 1}
    for cutoff in sorted(cutoffs):
        assert metadata.first_live_segment(cutoff) == reference(cutoff), cutoff
    assert metadata.first_live_segment(I64_MIN) == 1
    assert metadata.first_live_segment(int(metadata.maxs[-1])) is None


def test_ledger_bitmaps(realistic: tuple[SnapshotMetadata, PreparedSegments]) -> None:
    metadata, segments = realistic
    n = metadata.num_segments
    for first in sorted({1, 2, max(1, n // 3), max(1, n // 2), max(1, n - 1), n}):
        got = metadata.ledger_bitmaps(first)
        assert {lg: set(bm) for lg, bm in got.items()} == _positions(segments[first - 1 :])
    assert {lg: set(bm) for lg, bm in metadata.ledger_bitmaps().items()} == _positions(segments)


def test_ledger_bitmaps_small() -> None:
    triples = [(0, 1, 0), (0, 2, 5), (10, 1, 1), (10, 1, 2), (20, 2, 6), (30, 3, 0)]
    metadata, segments = _build(triples, step=10)
    assert metadata.num_segments == 4
    for first in range(1, 5):
        got = {lg: set(bm) for lg, bm in metadata.ledger_bitmaps(first).items()}
        assert got == _positions(segments[first - 1 :])
    assert metadata.first_live_segment(9) == 2
    assert metadata.first_live_segment(10) == 3
    assert metadata.first_live_segment(30) is None


# --- size --------------------------------------------------------------------------------------


def test_bytes_per_index_realistic() -> None:
    # 120 full ledgers of 1000 entries: the bucket ends at a ledger boundary.
    workload = generate(120_000, seed=17)
    assert np.all(np.bincount(workload.ledger_ids)[1:] == 1_000)
    mask = workload.delayed_mask
    times, ledgers, entries = (
        workload.deliver_at[mask],
        workload.ledger_ids[mask],
        workload.entry_ids[mask],
    )
    assert len(times) >= 50_000
    metadata, segments = build_snapshot(
        times, ledgers, entries, max_time_step_ms=300_000, max_indexes_per_segment=5_000
    )
    data = encode_snapshot(metadata, segments)
    per_index = len(data) / len(times)
    assert per_index <= 4.0, f"{per_index:.3f} bytes per index"


# --- corruption --------------------------------------------------------------------------------


def _assert_corrupt(data: bytes, what: str) -> SnapshotCorruptError:
    """``decode_snapshot`` must raise SnapshotCorruptError naming the object, nothing else."""
    try:
        with pytest.raises(SnapshotCorruptError) as info:
            decode_snapshot(data, NAME)
    except pytest.fail.Exception:
        pytest.fail(f"{what}: decoded without an error")
    except Exception as exc:
        pytest.fail(f"{what}: raised {type(exc).__name__} instead of SnapshotCorruptError: {exc}")
    assert NAME in str(info.value), f"{what}: message does not name the object: {info.value}"
    return info.value


@pytest.fixture(scope="module")
def real() -> tuple[SnapshotMetadata, Sequence[Segment], bytes]:
    """A real snapshot: realistic mix, a few hundred indexes, multi-ledger segments."""
    times, ledgers, entries = _delayed(800, seed=7, entries_per_ledger=50)
    metadata, segments = build_snapshot(
        times, ledgers, entries, max_time_step_ms=300_000, max_indexes_per_segment=40
    )
    data = encode_snapshot(metadata, segments)
    assert 200 <= metadata.num_messages <= 600
    assert len(data) < 6_000
    assert metadata.num_segments >= 10
    assert sum(len(s.ledgers) > 1 for s in metadata.segments) >= 3
    assert decode_snapshot(data, NAME)[0] == metadata
    return metadata, segments, data


@pytest.mark.parametrize("mask", [0xFF, 0x01])
def test_every_flipped_byte_is_detected(
    real: tuple[SnapshotMetadata, Sequence[Segment], bytes], mask: int
) -> None:
    data = real[2]
    for pos in range(len(data)):
        corrupt = bytearray(data)
        corrupt[pos] ^= mask
        _assert_corrupt(bytes(corrupt), f"byte {pos} ^ {mask:#x}")


def test_every_truncation_is_detected(
    real: tuple[SnapshotMetadata, Sequence[Segment], bytes],
) -> None:
    data = real[2]
    for length in range(len(data)):
        _assert_corrupt(data[:length], f"truncated to {length}")


@pytest.mark.parametrize("extra", [b"\x00", b"\xff", b"DIXS"])
def test_appended_bytes_are_detected(
    real: tuple[SnapshotMetadata, Sequence[Segment], bytes], extra: bytes
) -> None:
    _assert_corrupt(real[2] + extra, f"appended {extra!r}")


def test_error_names_the_object(real: tuple[SnapshotMetadata, Sequence[Segment], bytes]) -> None:
    data = bytearray(real[2])
    data[-1] ^= 0xFF
    with pytest.raises(SnapshotCorruptError) as info:
        decode_snapshot(bytes(data), "bucket-7")
    assert "bucket-7" in str(info.value)
    with pytest.raises(SnapshotCorruptError, match="other-name"):
        decode_snapshot(b"", "other-name")


def test_swapped_equal_length_segments_are_detected(
    real: tuple[SnapshotMetadata, Sequence[Segment], bytes],
) -> None:
    _, entries = split_object(real[2], NAME)
    pairs = [
        (i, j)
        for i in range(1, len(entries))
        for j in range(i + 1, len(entries))
        if len(entries[i]) == len(entries[j]) and entries[i] != entries[j]
    ]
    assert pairs, "the fixture should have two different segment entries of equal length"
    for i, j in pairs[:50]:
        swapped = entries[:]
        swapped[i], swapped[j] = swapped[j], swapped[i]
        error = _assert_corrupt(pack_object(swapped), f"swapped entries {i} and {j}")
        assert "checksum" in str(error)


def test_decode_segments_rejects_wrong_first(
    real: tuple[SnapshotMetadata, Sequence[Segment], bytes],
) -> None:
    metadata, _, data = real
    _, entries = split_object(data, NAME)
    with pytest.raises(SnapshotCorruptError, match=NAME):
        decode_segments(entries[2:4], metadata, first=3, name=NAME)  # seeds off by one
    with pytest.raises(ValueError):
        decode_segments(entries[1:], metadata, first=2, name=NAME)  # beyond the last segment


def test_garbage_and_foreign_objects(
    real: tuple[SnapshotMetadata, Sequence[Segment], bytes],
) -> None:
    data = real[2]
    _assert_corrupt(b"", "empty")
    _assert_corrupt(b"PK\x03\x04" + bytes(100), "a zip file")
    _assert_corrupt(b"DIXS\x02\x00" + data[6:], "version 2")
    _assert_corrupt(data[:6] + b"\xff\xff\xff\x7f" + data[10:], "huge table length")
    _assert_corrupt(bytes(len(data)), "zeros")
    rnd = random.Random(1)
    for _ in range(200):
        _assert_corrupt(rnd.randbytes(rnd.randrange(1, 300)), "random bytes")
        _assert_corrupt(data[:10] + rnd.randbytes(rnd.randrange(1, 300)), "random after header")


# --- semantic validation with valid checksums --------------------------------------------------


def _message(metadata: SnapshotMetadata) -> snapshot_pb2.SnapshotMetadata:
    """The metadata as one protobuf holding everything, bitmaps included (a format 4 or 5
    metadata's second part is folded back into the format 2 fields, so that the cases below
    can damage it the same way; :func:`_reframed` splits it again)."""
    message = snapshot_pb2.SnapshotMetadata.FromString(codec._metadata_payload(metadata))
    if metadata.format_version >= SPLIT_FORMAT_VERSION:
        _store_bitmaps(message, list(metadata.bitmaps))
    if metadata.format_version >= LEDGERS_APART_FORMAT_VERSION:
        counts, deltas = codec._stored_ledgers(metadata)
        message.ledger_counts.extend(counts.tolist())
        message.ledger_deltas.extend(deltas.tolist())
    return message


def _reframed(data: bytes, message: snapshot_pb2.SnapshotMetadata, *, zstd: bool = False) -> bytes:
    """``data`` with its metadata replaced by ``message``, checksums valid: one protobuf when
    ``data`` is in a format before 4, else the columns and the bitmaps part (the message's
    ``bitmap_sizes`` then ``bitmap_block``) in two parts; from format 5 the second part begins
    with the message's ledger columns (``ledger_counts`` then ``ledger_deltas``, varints)."""
    _, entries = split_object(data, NAME)
    compress = zstandard.ZstdCompressor().compress if zstd else bytes
    flags = FLAG_ZSTD if zstd else 0
    if entries[0][0] & FLAG_SPLIT:
        columns = snapshot_pb2.SnapshotMetadata()
        columns.CopyFrom(message)
        columns.ClearField("bitmap_sizes")
        columns.ClearField("bitmap_block")
        ledgers = b""
        if decode_metadata(entries[0], NAME).format_version >= LEDGERS_APART_FORMAT_VERSION:
            values = [*message.ledger_counts, *message.ledger_deltas]
            ledgers = b"".join(_varint(value) for value in values)
            columns.ClearField("ledger_counts")
            columns.ClearField("ledger_deltas")
        first = compress(columns.SerializeToString())
        second = compress(ledgers + message.bitmap_sizes + message.bitmap_block)
        entries[0] = codec._frame(0, flags | FLAG_SPLIT, _varint(len(first)) + first + second)
    else:
        entries[0] = codec._frame(0, flags, compress(message.SerializeToString()))
    return pack_object(entries)


def _varint(value: int) -> bytes:
    out = bytearray()
    codec._put_varint(out, value)
    return bytes(out)


def _set(field: str, index: int, value: int) -> Callable[[Any], None]:
    def mutate(m: Any) -> None:
        getattr(m, field)[index] = value

    return mutate


def _add(field: str, index: int, delta: int) -> Callable[[Any], None]:
    def mutate(m: Any) -> None:
        getattr(m, field)[index] += delta

    return mutate


def _count_plus_one(m: Any) -> None:
    m.counts[0] += 1
    m.num_messages += 1


def _count_minus_one_everywhere(m: Any) -> None:
    m.counts[1] -= 1
    m.num_messages -= 1


def _drop_segment_column(m: Any) -> None:
    del m.counts[-1]


def _sizes(m: Any) -> list[int]:
    """A format-2 message's bitmap sizes (unsigned LEB128 varints, back to back)."""
    sizes, pos, data = [], 0, m.bitmap_sizes
    while pos < len(data):
        value, shift = 0, 0
        while True:
            value |= (data[pos] & 0x7F) << shift
            pos, shift = pos + 1, shift + 7
            if data[pos - 1] < 0x80:
                break
        sizes.append(value)
    return sizes


def _bitmap_list(m: Any) -> list[bytes]:
    """A format-2 message's bitmaps, one ``bytes`` each."""
    cuts = np.cumsum([0, *_sizes(m)]).tolist()
    return [m.bitmap_block[a:b] for a, b in itertools.pairwise(cuts)]


def _store_bitmaps(m: Any, bitmaps: list[bytes]) -> None:
    m.bitmap_block = b"".join(bitmaps)
    m.bitmap_sizes = pack_varints([len(b) for b in bitmaps])


def _resize_first(delta: int) -> Callable[[Any], None]:
    def mutate(m: Any) -> None:
        sizes = _sizes(m)
        sizes[0] += delta
        m.bitmap_sizes = pack_varints(sizes)

    return mutate


def _set_bitmap(index: int, value: bytes) -> Callable[[Any], None]:
    def mutate(m: Any) -> None:
        bitmaps = _bitmap_list(m)
        bitmaps[index] = value
        _store_bitmaps(m, bitmaps)

    return mutate


def _drop_bitmap(m: Any) -> None:
    _store_bitmaps(m, _bitmap_list(m)[:-1])


def _both_bitmap_forms(m: Any) -> None:
    m.bitmaps.extend(_bitmap_list(m))


def _as_format_1_with_block(m: Any) -> None:
    m.format_version = 1
    m.bitmaps.extend(_bitmap_list(m))


def _swap_ledgers(m: Any) -> None:
    # The multi-ledger segment's second ledger delta 0: not ascending.
    m.ledger_deltas[1] = 0


def _no_segments(m: Any) -> None:
    for field in (
        "min_deliver_at_deltas",
        "deliver_at_spans",
        "counts",
        "ledger_counts",
        "ledger_deltas",
        "bitmap_block",
        "bitmap_sizes",
    ):
        m.ClearField(field)
    m.num_messages = 0


SEMANTIC_CASES: dict[str, Callable[[Any], None]] = {
    "count+1 (num_messages adjusted)": _count_plus_one,
    "count-1 (num_messages adjusted)": _count_minus_one_everywhere,
    "count+1 only": _add("counts", 0, 1),
    "count 0": _set("counts", 0, 0),
    "num_messages+1": lambda m: setattr(m, "num_messages", m.num_messages + 1),
    "format_version 3": lambda m: setattr(m, "format_version", 3),
    "format_version 1 (format 2 bitmaps)": lambda m: setattr(m, "format_version", 1),
    "format 1 with a block too": _as_format_1_with_block,
    "format 2 with format 1 bitmaps too": _both_bitmap_forms,
    "bitmap size+1": _resize_first(1),
    "bitmap size-1": _resize_first(-1),
    "bitmap sizes one short": lambda m: setattr(m, "bitmap_sizes", m.bitmap_sizes[:-1]),
    "bitmap sizes one extra": lambda m: setattr(m, "bitmap_sizes", m.bitmap_sizes + b"\x00"),
    "bitmap size truncated varint": lambda m: setattr(m, "bitmap_sizes", b"\x80"),
    "bitmap size 2**63": lambda m: setattr(
        m, "bitmap_sizes", b"\xff" * 8 + b"\x80\x01" + m.bitmap_sizes[1:]
    ),
    "bitmap sizes missing": lambda m: m.ClearField("bitmap_sizes"),
    "bitmap block missing": lambda m: m.ClearField("bitmap_block"),
    "bitmap block byte extra": lambda m: setattr(m, "bitmap_block", m.bitmap_block + b"\x00"),
    "format_version 0": lambda m: setattr(m, "format_version", 0),
    "start > end": lambda m: setattr(m, "start_ledger", m.end_ledger + 1),
    "end beyond int64": lambda m: setattr(m, "end_ledger", 2**63),
    "ledger beyond the range": _set("ledger_deltas", 0, 10**9),
    "ledger delta 2**64-1": _set("ledger_deltas", 0, 2**64 - 1),
    "ledgers not ascending": _swap_ledgers,
    "span+100": _add("deliver_at_spans", 0, 100),
    "span huge": _set("deliver_at_spans", 0, 2**64 - 1),
    "segments overlap": _set("min_deliver_at_deltas", 1, -1),
    "min delta overflow": _set("min_deliver_at_deltas", 1, 2**63 - 1),
    "ledger count+1": _add("ledger_counts", 0, 1),
    "ledger count 0": _set("ledger_counts", 0, 0),
    "segment column shorter": _drop_segment_column,
    "bitmap missing": _drop_bitmap,
    "bitmap garbage": _set_bitmap(0, b"\x00\x01\x02"),
    "bitmap empty bytes": _set_bitmap(0, b""),
    "bitmap empty set": _set_bitmap(0, bytes(BitMap().serialize())),
    "bitmap other entries": _set_bitmap(0, bytes(BitMap([10**6]).serialize())),
    "no segments": _no_segments,
    "everything cleared": lambda m: m.Clear(),
}


def _in_format(metadata: SnapshotMetadata, version: int) -> SnapshotMetadata:
    """``metadata`` (no folded cancels) as format ``version`` (the same columns and bitmaps)."""
    return SnapshotMetadata(
        metadata.start_ledger, metadata.end_ledger, metadata.mins, metadata.maxs,
        metadata.counts, metadata.ledger_offsets, metadata.ledgers, metadata.block, version,
    )  # fmt: skip


@pytest.fixture(
    scope="module", params=[2, LEDGERS_APART_FORMAT_VERSION], ids=lambda v: f"format{v}"
)
def small(request: pytest.FixtureRequest) -> tuple[SnapshotMetadata, Sequence[Segment], bytes]:
    """A small snapshot whose first segment has two ledgers and a non-zero span, in format 5
    (the newest that stores the bitmaps' own bytes, which the cases here damage; format 6's
    entry gaps have their own cases in ``test_codec_gaps.py``) and in format 2 (a store
    written before format 4)."""
    triples = [(0, 4, 1), (3, 5, 2), (5, 4, 3), (100, 6, 0), (104, 6, 1), (200, 4, 9), (200, 7, 1)]
    metadata, segments = _build(triples, step=10, start_ledger=2, end_ledger=9)
    metadata = _in_format(metadata, request.param)
    segments = list(segments)
    assert metadata.num_segments == 3
    assert metadata.segments[0].ledgers == (4, 5)
    return metadata, segments, encode_snapshot(metadata, segments)


@pytest.mark.parametrize("case", sorted(SEMANTIC_CASES))
@pytest.mark.parametrize("zstd", [False, True], ids=["raw", "zstd"])
def test_inconsistent_metadata_is_rejected(
    small: tuple[SnapshotMetadata, Sequence[Segment], bytes], case: str, zstd: bool
) -> None:
    metadata, _, data = small
    message = _message(metadata)
    assert decode_snapshot(_reframed(data, message, zstd=zstd), NAME)[0] == metadata
    SEMANTIC_CASES[case](message)
    corrupt = _reframed(data, message, zstd=zstd)
    _assert_corrupt(corrupt, case)
    # The metadata alone, with its full bitmap checks, must already refuse every case here
    # except the span, which only the segment's packed length contradicts.
    _, entries = split_object(corrupt, NAME)
    if case != "span+100":
        with pytest.raises(SnapshotCorruptError, match=NAME):
            decode_metadata(entries[0], NAME)


def test_metadata_count_mismatch_message(
    small: tuple[SnapshotMetadata, Sequence[Segment], bytes],
) -> None:
    metadata, _, data = small
    message = _message(metadata)
    _count_plus_one(message)
    error = _assert_corrupt(_reframed(data, message), "count+1")
    assert "count" in str(error)


def test_header_and_metadata_disagree_on_segments(
    small: tuple[SnapshotMetadata, Sequence[Segment], bytes],
) -> None:
    _, _, data = small
    _, entries = split_object(data, NAME)
    _assert_corrupt(pack_object(entries[:-1]), "one segment entry missing")
    _assert_corrupt(pack_object([*entries, entries[-1]]), "one segment entry too many")
    _assert_corrupt(pack_object(entries[:1]), "no segment entries")
    extra = codec._frame(len(entries), 0, b"")
    _assert_corrupt(pack_object([*entries, extra]), "extra valid entry")


@pytest.mark.parametrize(
    "case",
    [
        "metadata flags 0x04",
        "zstd flag on raw payload",
        "protobuf garbage",
        "zstd garbage",
        "one part marked as two",
        "two parts marked as one",
        "first part's length past the end",
        "first part's length a bad varint",
        "empty two-part payload",
        "bitmaps part zstd garbage",
        "bitmaps part raw under the zstd flag",
        "bitmaps part empty",
    ],
)
def test_bad_metadata_framing(
    small: tuple[SnapshotMetadata, Sequence[Segment], bytes], case: str
) -> None:
    metadata, _, data = small
    _, entries = split_object(data, NAME)
    raw = codec._metadata_payload(metadata)
    split = _in_format(metadata, FORMAT_VERSION)
    columns = codec._metadata_payload(split)
    bitmaps = codec._bitmaps_part(split.block)
    packed = zstandard.ZstdCompressor().compress
    both = FLAG_ZSTD | FLAG_SPLIT
    entries[0] = {
        "metadata flags 0x04": codec._frame(0, 0x04, raw),
        "zstd flag on raw payload": codec._frame(0, FLAG_ZSTD, raw),
        "protobuf garbage": codec._frame(0, 0, b"\xff\xff\xff\xff\xff"),
        "zstd garbage": codec._frame(0, FLAG_ZSTD, b"\x28\xb5\x2f\xfd\x00\x00\x01"),
        "one part marked as two": codec._frame(0, FLAG_SPLIT, _varint(len(raw)) + raw),
        "two parts marked as one": codec._frame(0, 0, columns),
        "first part's length past the end": codec._frame(
            0, FLAG_SPLIT, _varint(len(columns) + len(bitmaps) + 1) + columns + bitmaps
        ),
        "first part's length a bad varint": codec._frame(0, FLAG_SPLIT, b"\x80\x80"),
        "empty two-part payload": codec._frame(0, FLAG_SPLIT, b""),
        "bitmaps part zstd garbage": codec._frame(
            0, both, _varint(len(packed(columns))) + packed(columns) + b"\x28\xb5\x2f\xfd\x00"
        ),
        "bitmaps part raw under the zstd flag": codec._frame(
            0, both, _varint(len(packed(columns))) + packed(columns) + bitmaps
        ),
        "bitmaps part empty": codec._frame(0, FLAG_SPLIT, _varint(len(columns)) + columns),
    }[case]
    _assert_corrupt(pack_object(entries), case)
    with pytest.raises(SnapshotCorruptError, match=NAME):
        decode_metadata(entries[0], NAME)


@pytest.mark.parametrize(
    "case", ["flags 1", "payload byte extra", "payload byte missing", "time beyond span"]
)
def test_bad_segment_entries(
    small: tuple[SnapshotMetadata, Sequence[Segment], bytes], case: str
) -> None:
    metadata, _, data = small
    _, entries = split_object(data, NAME)
    # Segment 1: times 0, 3, 5 (span 5, 3 bits each) in position order (4,1) (4,3) (5,2).
    payload = entries[1][1:-4]
    assert payload == (0 | 5 << 3 | 3 << 6).to_bytes(2, "little")
    entries[1] = {
        "flags 1": codec._frame(1, 1, payload),
        "payload byte extra": codec._frame(1, 0, payload + b"\x00"),
        "payload byte missing": codec._frame(1, 0, payload[:1]),
        "time beyond span": codec._frame(1, 0, (0 | 7 << 3 | 3 << 6).to_bytes(2, "little")),
    }[case]
    _assert_corrupt(pack_object(entries), case)
    with pytest.raises(SnapshotCorruptError, match=NAME):
        decode_segments(entries[1:2], metadata, first=1, name=NAME)


def test_segment_times_must_match_metadata_range(
    small: tuple[SnapshotMetadata, Sequence[Segment], bytes],
) -> None:
    _, _, data = small
    _, entries = split_object(data, NAME)
    # Times 1, 4, 3 instead of 0, 5, 3: inside [0, 5], but neither bound is reached.
    entries[1] = codec._frame(1, 0, (1 | 4 << 3 | 3 << 6).to_bytes(2, "little"))
    _assert_corrupt(pack_object(entries), "segment range differs from metadata")


def test_position_in_two_segments_is_rejected(
    small: tuple[SnapshotMetadata, Sequence[Segment], bytes],
) -> None:
    metadata, _, data = small
    message = _message(metadata)
    # Segment 2 is ledger 6 entries {0, 1}; segment 3 is ledger 4 {9} and ledger 7 {1}.
    # Make segment 3's ledger-4 bitmap {1}: position (4, 1) is also in segment 1.
    assert list(message.ledger_counts) == [2, 1, 2]
    _set_bitmap(3, bytes(BitMap([1]).serialize()))(message)
    _assert_corrupt(_reframed(data, message), "duplicate position")


@given(st.lists(st.integers(0, 2**63 - 1), max_size=50))
def test_pack_varints_round_trips(values: list[int]) -> None:
    data = pack_varints(np.array(values, dtype=np.int64))
    native = _impl.native_module_or_none()
    for kernels in (pure_codec, *([native] if native is not None else [])):
        got, end = kernels.read_varints(data, 0, len(values))
        assert got.tolist() == values and end == len(data)
    # The protobuf encoding of a packed field, which this replaces, is the same bytes.
    assert data == b"".join(_leb128(v) for v in values)


def _leb128(value: int) -> bytes:
    out = bytearray()
    while True:
        out.append((value & 0x7F) | (0x80 if value >= 0x80 else 0))
        value >>= 7
        if not value:
            return bytes(out)


def test_pack_varints_refuses_negatives() -> None:
    with pytest.raises(ValueError, match="varints must be >= 0"):
        pack_varints(np.array([1, -1], dtype=np.int64))


# -- folded cancels (format 4, and format 3 before it) ------------------------------------------


def _folded_snapshot(packed: bytes) -> bytes:
    times = np.array([10, 20, 30], dtype=np.int64)
    metadata, segments = build_snapshot(
        times,
        np.array([3, 4, 5]),
        np.array([0, 1, 2]),
        max_time_step_ms=5,
        max_indexes_per_segment=2,
        start_ledger=2,
        end_ledger=9,
    )
    return encode_snapshot(metadata.with_folded(packed), segments)


@given(st.sets(st.tuples(st.integers(2, 9), st.integers(0, 2**32 - 1)), min_size=1, max_size=60))
def test_folded_cancels_round_trip(positions: set[tuple[int, int]]) -> None:
    from delayindex._cancelset import pack_cancelled

    ordered = sorted(positions)
    ledgers = np.array([p[0] for p in ordered], dtype=np.int64)
    entries = np.array([p[1] for p in ordered], dtype=np.int64)
    metadata, _ = decode_snapshot(_folded_snapshot(pack_cancelled(ledgers, entries)), "obj")
    assert metadata.format_version == FORMAT_VERSION
    got_ledgers, got_entries = metadata.folded_positions()
    assert got_ledgers.tolist() == ledgers.tolist() and got_entries.tolist() == entries.tolist()


def test_damaged_or_misplaced_folded_cancels_are_corrupt() -> None:
    from delayindex._cancelset import pack_cancelled

    outside = pack_cancelled(np.array([3, 10], dtype=np.int64), np.array([1, 1], dtype=np.int64))
    with pytest.raises(SnapshotCorruptError, match=r"obj-1.*outside the bucket's range"):
        decode_snapshot(_folded_snapshot(outside), "obj-1")
    with pytest.raises(SnapshotCorruptError, match=r"obj-2.*do not unpack"):
        decode_snapshot(_folded_snapshot(b"not a zstd frame"), "obj-2")
    good = pack_cancelled(np.array([3], dtype=np.int64), np.array([1], dtype=np.int64))
    body = bytearray(zstandard.ZstdDecompressor().decompress(good))
    body[0] = 2  # claims two ledgers
    with pytest.raises(SnapshotCorruptError, match=r"obj-3.*bad size"):
        decode_snapshot(_folded_snapshot(zstandard.ZstdCompressor().compress(bytes(body))), "obj-3")


def test_folded_cancels_keep_each_formats_form() -> None:
    from delayindex._cancelset import pack_cancelled

    packed = pack_cancelled(np.array([3], dtype=np.int64), np.array([1], dtype=np.int64))
    metadata, segments = _build([(10, 3, 0), (20, 4, 1)], start_ledger=2, end_ledger=9)
    old = _in_format(metadata, 2)
    assert (old.with_folded(packed).format_version, old.with_folded(b"").format_version) == (3, 2)
    for folded in (packed, b""):
        current = metadata.with_folded(folded)
        assert current.format_version == FORMAT_VERSION
        back, _ = decode_snapshot(encode_snapshot(current, segments), NAME)
        assert back == current and back.folded_cancels == folded
    columns = (
        old.start_ledger, old.end_ledger, old.mins, old.maxs, old.counts, old.ledger_offsets,
        old.ledgers, old.block,
    )  # fmt: skip
    with pytest.raises(ValueError, match="cannot carry folded cancels"):
        SnapshotMetadata(*columns, 2, folded_cancels=packed)
    with pytest.raises(ValueError, match="needs folded cancels"):
        SnapshotMetadata(*columns, 3)


# -- format 4: the bitmaps decode on first use ---------------------------------------------------


def _realistic_metadata_entry(
    version: int = LEDGERS_APART_FORMAT_VERSION,
) -> tuple[SnapshotMetadata, bytes]:
    """A realistic metadata and its framed entry, in format ``version`` (by default 5, whose
    positions part these tests take apart; ``test_codec_gaps.py`` has format 6's)."""
    times, ledgers, entries = _delayed(3_000, seed=5)
    metadata, segments = build_snapshot(
        times, ledgers, entries, max_time_step_ms=300_000, max_indexes_per_segment=64
    )
    metadata = _in_format(metadata, version)
    _, framed = split_object(encode_snapshot(metadata, list(segments)), NAME)
    return metadata, framed[0]


def test_columns_decode_without_the_bitmaps() -> None:
    metadata, entry = _realistic_metadata_entry()
    assert entry[0] == FLAG_ZSTD | FLAG_SPLIT
    lazy = decode_metadata(entry, NAME, check_bitmaps=False)
    assert not lazy.bitmaps_loaded
    assert lazy.first_live_segment(int(metadata.mins[3])) == 4
    assert lazy.counts.tolist() == metadata.counts.tolist()
    assert lazy.ledgers.tolist() == metadata.ledgers.tolist()
    assert lazy.num_messages == metadata.num_messages
    assert lazy.with_origin("name", 3).same_columns(lazy)
    assert not lazy.bitmaps_loaded
    unloaded = lazy.nbytes
    assert lazy.block.blob == metadata.block.blob and lazy.bitmaps_loaded
    assert lazy.nbytes > unloaded
    assert lazy == metadata
    assert decode_metadata(entry, NAME).bitmaps_loaded  # checked: decoded at once


def test_damaged_bitmaps_part_is_found_on_first_use_and_names_the_object() -> None:
    metadata, entry = _realistic_metadata_entry()
    payload = entry[1:-4]
    length, start = codec._get_varint(payload, 0, len(payload))
    columns = payload[: start + length]
    part = zstandard.ZstdDecompressor().decompress(payload[start + length :])
    # Format 5's part: the ledger columns, then (format 4's part) the sizes and the bitmaps.
    ledgers = b"".join(map(pack_varints, codec._stored_ledgers(metadata)))
    assert part.startswith(ledgers)
    bitmaps = part[len(ledgers) :]
    damaged = {
        "sizes cut short": (ledgers + bitmaps[:3], "bitmaps"),
        "a byte missing at the end": (ledgers + bitmaps[:-1], "bitmaps"),
        "a byte extra": (ledgers + bitmaps + b"\x00", "bitmaps"),
        "ledger counts cut short": (ledgers[:3], "ledger columns"),
        "ledger deltas cut short": (ledgers[: metadata.num_segments + 2], "ledger columns"),
        "a ledger count of 0": (b"\x00" + part[1:], "ledger columns"),
    }
    for what, (damage, where) in damaged.items():
        framed = codec._frame(0, entry[0], columns + zstandard.ZstdCompressor().compress(damage))
        lazy = decode_metadata(framed, NAME, check_bitmaps=False)  # the columns are sound
        assert lazy.num_messages == metadata.num_messages
        with pytest.raises(SnapshotCorruptError, match=f"{NAME}: the {where} do not decode"):
            lazy.block  # noqa: B018
        with pytest.raises(SnapshotCorruptError, match=NAME):
            decode_metadata(framed, NAME)
        assert what


def test_deferred_block_checks_the_count_it_was_promised() -> None:
    from delayindex.snapshot.blocks import BitmapBlock, DeferredBlock

    block = BitmapBlock.join([b"a", b"bc"])
    assert DeferredBlock(lambda: block, 2, 9).get() is block
    with pytest.raises(ValueError, match="2 bitmaps where the ledger columns need 3"):
        DeferredBlock(lambda: block, 3, 9).get()
