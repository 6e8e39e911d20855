"""Differential tests of the codec kernels: ``_native`` twin against ``_pure.codec`` twin.

Every kernel named in ``delayindex._impl.CODEC_KERNELS`` is called on both twins with the same
input (whatever ``DELAYINDEX_NO_EXTENSIONS`` says: the native module is imported directly). On
valid input both must return equal results (same dtypes) that are also checked against an
independent reference; on malformed input both must raise ValueError. Any other exception fails.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any, Literal

import mmh3
import numpy as np
import numpy.typing as npt
import pytest
from hypothesis import assume, given
from hypothesis import strategies as st
from pyroaring import BitMap

from delayindex import _impl
from delayindex._pure import codec as pure
from delayindex.snapshot import codec
from delayindex.snapshot.format import Segment, SnapshotMetadata, build_snapshot

I64_MIN = -(2**63)
I64_MAX = 2**63 - 1
U32_MAX = 2**32 - 1
ROARING_COOKIE = 12347

#: Kernels with a differential test below; must be all of them.
TESTED = {
    "build_segments",
    "decode_segments",
    "murmur3_32",
    "pack_times",
    "read_varints",
    "roaring_block_values",  # test_codec_gaps.py
    "roaring_cardinalities",
    "roaring_check_positions",
    "roaring_entries",
    "roaring_union_by_ledger",
    "roaring_write_block",  # test_codec_gaps.py
    "unpack_entry_gaps",  # test_codec_gaps.py
    "unpack_segment_times",
}


def _native_module() -> ModuleType:
    module = _impl.native_module_or_none()
    if module is None:
        pytest.fail("the native extension delayindex._native is not built; reinstall the package")
    return module


def _call(fn: Callable[..., Any], args: tuple[Any, ...]) -> tuple[str, Any]:
    try:
        return "ok", fn(*args)
    except ValueError as exc:
        return "ValueError", exc


def _assert_equal(a: Any, b: Any, where: str = "result") -> None:
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        assert isinstance(a, np.ndarray) and isinstance(b, np.ndarray), where
        assert a.dtype == b.dtype, f"{where}: dtype {a.dtype} != {b.dtype}"
        assert np.array_equal(a, b), f"{where}: {a!r} != {b!r}"
    elif isinstance(a, tuple):
        assert isinstance(b, tuple) and len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            _assert_equal(x, y, f"{where}[{i}]")
    else:
        assert type(a) is type(b), f"{where}: {type(a).__name__} != {type(b).__name__}"
        assert a == b, f"{where}: {a!r} != {b!r}"


def _same(name: str, *args: Any) -> tuple[str, Any]:
    """Call kernel ``name`` on both twins; both raise ValueError or both return equal results."""
    native = _call(getattr(_native_module(), name), args)
    python = _call(getattr(pure, name), args)
    assert native[0] == python[0], f"{name}: native -> {native}, pure -> {python}"
    if native[0] == "ok":
        _assert_equal(native[1], python[1], name)
    return native


def _ok(name: str, *args: Any) -> Any:
    outcome, value = _same(name, *args)
    assert outcome == "ok", f"{name}: both raised {value!r}"
    return value


def _rejected(name: str, *args: Any) -> None:
    outcome, value = _same(name, *args)
    assert outcome == "ValueError", f"{name}: both accepted, returning {value!r}"


def test_every_kernel_is_tested_and_exists() -> None:
    assert set(_impl.CODEC_KERNELS) == TESTED
    native = _native_module()
    for name in _impl.CODEC_KERNELS:
        assert callable(getattr(native, name))
        assert callable(getattr(pure, name))
        # The selector exposes the twin it chose.
        chosen = native if _impl.NATIVE else pure
        assert getattr(_impl, name) is getattr(chosen, name)


# --- roaring_entries / roaring_cardinalities ---------------------------------------------------


@st.composite
def _bitmap_values(draw: st.DrawFn) -> list[int]:
    values = draw(st.lists(st.integers(0, U32_MAX), max_size=40))
    for _ in range(draw(st.integers(0, 2))):
        # Dense ranges: bitset containers (step 2 or 3 over > 4096 values) and runs (step 1).
        length = draw(st.sampled_from([1, 100, 4_096, 4_097, 9_000, 70_000]))
        step = draw(st.sampled_from([1, 2, 3]))
        start = draw(st.integers(0, U32_MAX - length * step))
        values.extend(range(start, start + length * step, step))
    return values


def _serialize(values: list[int], run_optimize: bool) -> bytes:
    bm = BitMap(values)
    if run_optimize:
        bm.run_optimize()
    return bytes(bm.serialize())


def _clear_run_flag_padding(data: bytes) -> bytes:
    """Zero the unused bits of the run-flag bitset (both twins reject them when set)."""
    if len(data) < 4 or int.from_bytes(data[:2], "little") != ROARING_COOKIE:
        return data
    n = int.from_bytes(data[2:4], "little") + 1
    last = 4 + (n + 7) // 8 - 1
    if n % 8 == 0 or last >= len(data):
        return data
    out = bytearray(data)
    out[last] &= (1 << (n % 8)) - 1
    return bytes(out)


@given(_bitmap_values(), st.booleans())
def test_roaring_entries_valid(values: list[int], run_optimize: bool) -> None:
    data = _serialize(values, run_optimize)
    got = _ok("roaring_entries", data)
    assert got.dtype == np.uint32
    assert got.tolist() == sorted(set(values))
    cards = _ok("roaring_cardinalities", *_block([data, _serialize([1], False)]))
    assert cards.dtype == np.int64 and cards.tolist() == [len(set(values)), 1]


ContainerCount = Literal["n_array_containers", "n_bitset_containers", "n_run_containers"]


def test_roaring_container_kinds() -> None:
    cases: dict[str, tuple[list[int], bool, ContainerCount]] = {
        "array": (list(range(0, 8_000, 2)), False, "n_array_containers"),
        "bitset": (list(range(0, 20_000, 2)), False, "n_bitset_containers"),
        "run": (list(range(0, 70_000)), True, "n_run_containers"),
        "full": (list(range(65_536, 2 * 65_536)), True, "n_run_containers"),
        "top": (list(range(U32_MAX - 5_000, U32_MAX + 1)), True, "n_run_containers"),
        "bitset-top": (list(range(U32_MAX - 20_000, U32_MAX + 1, 3)), False, "n_bitset_containers"),
    }
    for name, (values, run_optimize, kind) in cases.items():
        bm = BitMap(values)
        if run_optimize:
            bm.run_optimize()
        assert bm.get_statistics()[kind] >= 1, name
        assert _ok("roaring_entries", bytes(bm.serialize())).tolist() == values, name
    many = BitMap(range(0, 40 * 65_536, 65_536))  # 40 containers: the offset table is present
    assert _ok("roaring_entries", bytes(many.serialize())).tolist() == list(many)
    assert _ok("roaring_entries", _serialize([], False)).tolist() == []
    assert _ok("roaring_entries", _serialize([], True)).tolist() == []


@given(
    _bitmap_values(),
    st.booleans(),
    st.sampled_from(["truncate", "flip", "append", "overwrite"]),
    st.data(),
)
def test_roaring_entries_damaged(
    values: list[int], run_optimize: bool, damage: str, data: st.DataObject
) -> None:
    raw = bytearray(_serialize(values, run_optimize))
    if damage == "truncate":
        raw = raw[: data.draw(st.integers(0, len(raw) - 1))]
    elif damage == "flip":
        for _ in range(data.draw(st.integers(1, 3))):
            # Often in the headers (cookie, run flags, keys, offsets), where most checks are.
            pos = data.draw(st.integers(0, min(len(raw) - 1, 40)) | st.integers(0, len(raw) - 1))
            raw[pos] ^= 1 << data.draw(st.integers(0, 7))
    elif damage == "append":
        raw += data.draw(st.binary(min_size=1, max_size=4))
    else:
        pos = data.draw(st.integers(0, min(len(raw) - 1, 40)))
        chunk = data.draw(st.binary(min_size=1, max_size=8))
        raw[pos : pos + len(chunk)] = chunk
    damaged = _clear_run_flag_padding(bytes(raw))
    outcome, value = _same("roaring_entries", damaged)
    if damage in ("truncate", "append"):
        assert outcome == "ValueError", f"{damage}: accepted {value!r}"
    _same("roaring_cardinalities", *_block([_serialize([5], False), damaged]))


@given(st.binary(max_size=80))
def test_roaring_entries_garbage(data: bytes) -> None:
    _same("roaring_entries", _clear_run_flag_padding(data))


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"\x3b",
        b"\x3b\x30",
        b"\x3a\x30\x00\x00",
        b"\x3a\x30\x00\x00\x00\x00\x00",
        b"\x3b\x30\x00\x00",
        b"\x00\x00\x00\x00\x00\x00\x00\x00",
        b"\xff" * 16,
    ],
)
def test_roaring_entries_short_or_bad_cookie(data: bytes) -> None:
    _rejected("roaring_entries", data)
    _rejected("roaring_cardinalities", *_block([data]))


def test_roaring_run_flag_padding_bits() -> None:
    data = bytearray(_serialize(list(range(100)), True))  # one run container: flags byte 0x01
    assert data[4] == 0x01
    data[4] |= 0x10  # flag of container 4, which does not exist
    _rejected("roaring_entries", bytes(data))


def _block(bitmaps: list[bytes]) -> tuple[bytes, npt.NDArray[np.int64]]:
    """The kernels' bitmap block form: the bitmaps back to back, and their offsets."""
    return b"".join(bitmaps), np.cumsum([0, *map(len, bitmaps)], dtype=np.int64)


def _unblock(blob: bytes, offsets: npt.NDArray[np.int64]) -> list[bytes]:
    cuts = offsets.tolist()
    return [blob[a:b] for a, b in itertools.pairwise(cuts)]


def test_roaring_cardinalities_empty_list_and_types() -> None:
    assert _ok("roaring_cardinalities", *_block([])).tolist() == []
    with pytest.raises(TypeError):
        _native_module().roaring_entries(None)
    with pytest.raises(TypeError):
        pure.roaring_entries(None)  # type: ignore[arg-type]


# --- pack_times --------------------------------------------------------------------------------


def _reference_pack(times: list[int], base: int, span: int) -> bytes:
    bits = span.bit_length()
    stream = 0
    for i, t in enumerate(times):
        stream |= (t - base) << (i * bits)
    return stream.to_bytes((len(times) * bits + 7) // 8, "little")


_TIMES = st.one_of(
    st.lists(st.integers(I64_MIN, I64_MAX), max_size=30),
    st.lists(st.integers(-5, 300), max_size=60),
    st.lists(st.integers(I64_MAX - 3, I64_MAX), max_size=10),
    st.lists(st.integers(I64_MIN, I64_MIN + 3), max_size=10),
)


@given(_TIMES, st.integers(0, 2**63 - 1), st.booleans())
def test_pack_times_valid(times: list[int], slack: int, strided: bool) -> None:
    assume(times)
    base = min(times)
    span = max(times) - base
    assume(span <= I64_MAX)
    span = min(I64_MAX, span + slack % (span + 2))
    array = np.array(times, dtype=np.int64)
    if strided:
        array = np.repeat(array, 2)[::2]  # a non-contiguous view
    packed = _ok("pack_times", array, base, span)
    assert isinstance(packed, bytes)
    assert packed == _reference_pack(times, base, span)


@given(_TIMES, st.sampled_from(["base+1", "span-1", "span<0", "base-far"]))
def test_pack_times_out_of_range(times: list[int], how: str) -> None:
    assume(times)
    base = min(times)
    span = max(times) - base
    assume(span <= I64_MAX)
    if how == "base+1":
        assume(base < I64_MAX)
        base += 1
    elif how == "span-1":
        assume(span > 0)
        span -= 1
    elif how == "span<0":
        span = -1 - span % 100
    else:  # every time lies below the base, far away
        assume(max(times) < 0)
        base, span = I64_MAX - 10, 10
    _rejected("pack_times", np.array(times, dtype=np.int64), base, span)


def test_pack_times_edges() -> None:
    empty = np.empty(0, dtype=np.int64)
    assert _ok("pack_times", empty, 0, 0) == b""
    assert _ok("pack_times", empty, 5, I64_MAX) == b""
    assert _ok("pack_times", np.array([7, 7, 7], dtype=np.int64), 7, 0) == b""
    _rejected("pack_times", np.array([7, 8], dtype=np.int64), 7, 0)
    full = np.array([I64_MIN, -1, I64_MIN + 1], dtype=np.int64)
    assert _ok("pack_times", full, I64_MIN, I64_MAX) == _reference_pack(
        full.tolist(), I64_MIN, I64_MAX
    )
    top = np.array([0, I64_MAX], dtype=np.int64)
    assert _ok("pack_times", top, 0, I64_MAX) == _reference_pack([0, I64_MAX], 0, I64_MAX)
    _rejected("pack_times", np.array([I64_MIN], dtype=np.int64), I64_MAX, I64_MAX)
    _rejected("pack_times", np.array([I64_MAX], dtype=np.int64), I64_MIN, I64_MAX)
    for bits in range(0, 64):
        span = (1 << bits) - 1
        times = np.array([0, span, span // 2, 0, span], dtype=np.int64)
        assert _ok("pack_times", times, 0, span) == _reference_pack(times.tolist(), 0, span)


# --- read_varints ------------------------------------------------------------------------------


def _varints(values: list[int]) -> bytes:
    out = bytearray()
    for value in values:
        codec._put_varint(out, value)
    return bytes(out)


@given(
    st.lists(st.one_of(st.integers(0, 300), st.integers(0, I64_MAX)), max_size=30),
    st.binary(max_size=6),
    st.binary(max_size=6),
)
def test_read_varints_round_trip(values: list[int], prefix: bytes, suffix: bytes) -> None:
    body = _varints(values)
    data = prefix + body + suffix
    got, end = _ok("read_varints", data, len(prefix), len(values))
    assert got.dtype == np.int64
    assert got.tolist() == values
    assert end == len(prefix) + len(body)
    # Fewer values than present stops early, at the end of the last one read.
    if values:
        got, end = _ok("read_varints", data, len(prefix), len(values) - 1)
        assert got.tolist() == values[:-1]
        assert end == len(prefix) + len(_varints(values[:-1]))


@given(st.lists(st.integers(0, I64_MAX), min_size=1, max_size=20), st.data())
def test_read_varints_truncated(values: list[int], data: st.DataObject) -> None:
    body = _varints(values)
    cut = data.draw(st.integers(0, len(body) - 1))
    _rejected("read_varints", body[:cut], 0, len(values))


@given(st.binary(max_size=40), st.integers(0, 45), st.integers(0, 12))
def test_read_varints_garbage(data: bytes, start: int, count: int) -> None:
    _same("read_varints", data, start, count)


def test_read_varints_edges() -> None:
    _rejected("read_varints", _varints([2**63]), 0, 1)  # beyond int64
    _rejected("read_varints", _varints([2**64 - 1]), 0, 1)
    _rejected("read_varints", b"\xff" * 9 + b"\x01", 0, 1)  # ten bytes
    _rejected("read_varints", b"\x80" * 10 + b"\x00", 0, 1)
    _rejected("read_varints", b"\x01", -1, 1)
    _rejected("read_varints", b"\x01", 0, -1)
    _rejected("read_varints", b"", 0, 1)
    assert _ok("read_varints", b"\xff" * 8 + b"\x7f", 0, 1)[0].tolist() == [I64_MAX]
    assert _ok("read_varints", b"\x80\x00", 0, 1)[0].tolist() == [0]  # not canonical, allowed
    values, end = _ok("read_varints", b"", 0, 0)
    assert values.tolist() == [] and end == 0
    values, end = _ok("read_varints", b"\x05", 1, 0)
    assert values.tolist() == [] and end == 1


# --- murmur3_32 --------------------------------------------------------------------------------


@given(st.binary(max_size=64), st.integers(0, U32_MAX))
def test_murmur3_matches_mmh3(data: bytes, seed: int) -> None:
    got = _ok("murmur3_32", data, seed)
    assert got == mmh3.hash(data, seed, signed=False)


@pytest.mark.parametrize("seed", [0, 1, 0x44495853, U32_MAX])
def test_murmur3_every_length(seed: int) -> None:
    blob = bytes(range(7, 256)) * 2
    for length in range(0, 65):
        for data in (blob[:length], blob[-length:] if length else b"", b"\xff" * length):
            assert _ok("murmur3_32", data, seed) == mmh3.hash(data, seed, signed=False)


@pytest.mark.parametrize("seed", [-1, 2**32])
def test_murmur3_seed_out_of_range(seed: int) -> None:
    # Not reachable through the codec (seeds are entry indexes); the twins differ in the type:
    # native raises OverflowError (Cython's uint32_t conversion), pure ValueError (mmh3).
    for fn in (_native_module().murmur3_32, pure.murmur3_32):
        with pytest.raises((ValueError, OverflowError)):
            fn(b"x", seed)


# --- decode_segments ---------------------------------------------------------------------------


def _kernel_args(metadata: SnapshotMetadata, entries: list[bytes], k: int, j: int) -> list[Any]:
    """The arguments ``codec.decode_segment_buffer`` passes for entries ``k..j-1``."""
    a, b = k - 1, j - 1
    return [
        b"".join(entries[k:j]),
        np.array([len(e) for e in entries[k:j]], dtype=np.int64),
        k,
        metadata.mins[a:b],
        metadata.maxs[a:b] - metadata.mins[a:b],
        metadata.counts[a:b],
        metadata.ledger_offsets[a : b + 1],
        metadata.ledgers,
        metadata.block.blob,
        metadata.block.offsets,
    ]


def _expected(segments: Sequence[Segment]) -> tuple[npt.NDArray[np.int64], ...]:
    empty = np.empty(0, dtype=np.int64)
    return (
        np.concatenate([s.times for s in segments]) if segments else empty,
        np.concatenate([s.ledgers for s in segments]) if segments else empty,
        np.concatenate([s.entries for s in segments]) if segments else empty,
        np.cumsum([0, *(len(s) for s in segments)], dtype=np.int64),
    )


@st.composite
def _snapshots(draw: st.DrawFn) -> tuple[SnapshotMetadata, Sequence[Segment], list[bytes]]:
    positions = draw(
        st.lists(
            st.tuples(st.integers(0, 5), st.integers(0, 2**32 - 1) | st.integers(0, 40)),
            min_size=1,
            max_size=50,
            unique=True,
        )
    )
    wide = draw(st.booleans())
    low, high = (-(2**62) + 1, 2**62 - 1) if wide else (-50, 400)  # spans stay below 2**63
    times = draw(st.lists(st.integers(low, high), min_size=len(positions), max_size=len(positions)))
    step = draw(st.integers(1, 200) | st.integers(1, 2**62))
    limit = draw(st.just(-1) | st.integers(1, 12))
    metadata, segments = build_snapshot(
        times,
        [lg for lg, _ in positions],
        [e for _, e in positions],
        max_time_step_ms=step,
        max_indexes_per_segment=limit,
    )
    _, entries = codec.split_object(codec.encode_snapshot(metadata, segments), "k")
    return metadata, segments, entries


def _times_args(args: list[Any]) -> list[Any]:
    """``unpack_segment_times``'s arguments from ``decode_segments``' (no positions)."""
    return args[:6]


def _sorted_per_segment(times: npt.NDArray[np.int64], counts: Any) -> list[list[int]]:
    cuts = np.cumsum([0, *np.asarray(counts).tolist()]).tolist()
    return [sorted(times[a:b].tolist()) for a, b in itertools.pairwise(cuts)]


@given(_snapshots(), st.data())
def test_decode_segments_valid(
    snap: tuple[SnapshotMetadata, Sequence[Segment], list[bytes]], data: st.DataObject
) -> None:
    metadata, segments, entries = snap
    n = metadata.num_segments
    first = data.draw(st.integers(1, n + 1))
    for k, j in [(1, n + 1), (first, data.draw(st.integers(first, n + 1)))]:
        args = _kernel_args(metadata, entries, k, j)
        got = _ok("decode_segments", *args)
        _assert_equal(got, _expected(segments[k - 1 : j - 1]), "decode_segments")
        # The times alone (no positions), segment by segment, are the same multisets.
        times = _ok("unpack_segment_times", *_times_args(args))
        want = [sorted(s.times.tolist()) for s in segments[k - 1 : j - 1]]
        assert _sorted_per_segment(times, args[5]) == want


def test_decode_segments_scratch_kept_and_fresh() -> None:
    """The native decode keeps its scratch between calls up to a limit and allocates a fresh
    one beyond it (a segment of more than 8 MiB / 52 B = 161 k indexes): small, large, then
    small again must all decode exactly, after a failed decode too."""
    rng = np.random.default_rng(5)
    for n in (10, 200_000, 300, 200_000, 7):
        positions = rng.choice(10**6, size=n, replace=False)
        times = rng.integers(0, 1000, size=n)
        metadata, segments = build_snapshot(
            times.tolist(),
            (positions // 1000).tolist(),
            (positions % 1000).tolist(),
            max_time_step_ms=10**6,
            max_indexes_per_segment=-1,
        )
        _, entries = codec.split_object(codec.encode_snapshot(metadata, segments), "k")
        args = _kernel_args(metadata, entries, 1, metadata.num_segments + 1)
        got = _native_module().decode_segments(*args)
        _assert_equal(got, _expected(segments), f"decode_segments of {n}")
        damaged = list(args)
        damaged[0] = damaged[0][:-1] + bytes([damaged[0][-1] ^ 1])  # a checksum byte
        with pytest.raises(ValueError):
            _native_module().decode_segments(*damaged)


@given(_snapshots(), st.data())
def test_decode_segments_flipped_checksum(
    snap: tuple[SnapshotMetadata, Sequence[Segment], list[bytes]], data: st.DataObject
) -> None:
    metadata, _, entries = snap
    n = metadata.num_segments
    victim = data.draw(st.integers(1, n))
    args = _kernel_args(metadata, entries, 1, n + 1)
    end = sum(len(e) for e in entries[1 : victim + 1])
    buffer = bytearray(args[0])
    buffer[end - 1 - data.draw(st.integers(0, 3))] ^= 1 << data.draw(st.integers(0, 7))
    args[0] = bytes(buffer)
    _rejected("decode_segments", *args)
    # Any other flipped bit in the buffer is caught by a checksum as well.
    buffer = bytearray(_kernel_args(metadata, entries, 1, n + 1)[0])
    buffer[data.draw(st.integers(0, len(buffer) - 1))] ^= 1 << data.draw(st.integers(0, 7))
    args[0] = bytes(buffer)
    _rejected("decode_segments", *args)
    # The checksum seed is the entry index: shifting first_index breaks every entry.
    args = _kernel_args(metadata, entries, 1, n + 1)
    args[2] = data.draw(st.sampled_from([0, 2, n + 1, 2**31]))
    _rejected("decode_segments", *args)


def _bump(index: int, delta: int) -> Callable[[npt.NDArray[np.int64]], npt.NDArray[np.int64]]:
    def change(column: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
        out = np.array(column, dtype=np.int64)
        if len(out):
            out[index % len(out)] += delta
        return out

    return change


#: A mutation of the bitmaps (as a list of bytes), re-blocked into arguments 8 and 9.
_BITMAPS = -1


def _swap_offsets(offsets: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
    out = np.array(offsets, dtype=np.int64)
    if len(out) > 2 and out[1] < out[2]:
        out[1], out[2] = out[2], out[1]  # a size goes negative; the ends still match
    return out


_ARG_MUTATIONS: dict[str, tuple[int, Callable[[Any], Any]]] = {
    "counts+1": (5, _bump(0, 1)),
    "counts-1": (5, _bump(-1, -1)),
    "counts 0": (5, lambda c: np.zeros_like(c)),
    "spans+1": (4, _bump(0, 1)),
    "spans doubled": (4, lambda c: np.array(c, dtype=np.int64) * 2 + 1),
    "spans -1": (4, lambda c: np.full_like(c, -1)),
    "mins shifted": (3, lambda c: np.array(c, dtype=np.int64) - 1),
    "offsets+1": (6, _bump(1, 1)),
    "offsets-1": (6, _bump(-1, -1)),
    "offsets short": (6, lambda c: c[:-1]),
    "ledgers reversed": (7, lambda c: np.array(c[::-1], dtype=np.int64)),
    "ledgers negative": (7, lambda c: np.array(c, dtype=np.int64) - 10**6),
    "bitmaps garbage": (_BITMAPS, lambda b: [b"\x3a\x30\x00\x00", *b[1:]]),
    "bitmaps empty": (_BITMAPS, lambda b: [bytes(BitMap().serialize()), *b[1:]]),
    "bitmaps short": (_BITMAPS, lambda b: b[:-1]),
    "bitmap block longer": (8, lambda b: b + b"\x00"),
    "bitmap block shorter": (8, lambda b: b[:-1]),
    "bitmap offsets short": (9, lambda c: c[:-1]),
    "bitmap offsets from 1": (9, lambda c: np.concatenate([[1], c[1:]]).astype(np.int64)),
    "bitmap offsets decrease": (9, _swap_offsets),
    "lengths+1": (1, _bump(0, 1)),
    "lengths tiny": (1, lambda c: np.minimum(c, 4)),
    "buffer longer": (0, lambda b: b + b"\x00"),
    "buffer shorter": (0, lambda b: b[:-1]),
}


@given(_snapshots(), st.sampled_from(sorted(_ARG_MUTATIONS)))
def test_decode_segments_bad_arguments_agree(
    snap: tuple[SnapshotMetadata, Sequence[Segment], list[bytes]], mutation: str
) -> None:
    metadata, _, entries = snap
    args = _kernel_args(metadata, entries, 1, metadata.num_segments + 1)
    position, change = _ARG_MUTATIONS[mutation]
    if position == _BITMAPS:
        args[8:10] = _block(change(_unblock(args[8], args[9])))
    else:
        args[position] = change(args[position])
    outcome, _ = _same("decode_segments", *args)
    if mutation in (
        "counts 0", "spans -1", "lengths tiny", "buffer longer", "buffer shorter",
        "bitmap block longer", "bitmap block shorter", "bitmap offsets short",
        "bitmap offsets from 1",
    ):  # fmt: skip
        assert outcome == "ValueError"


def test_decode_segments_empty_batch() -> None:
    metadata, segments = build_snapshot(
        [1, 2], [1, 1], [0, 1], max_time_step_ms=1, max_indexes_per_segment=-1
    )
    _, entries = codec.split_object(codec.encode_snapshot(metadata, segments), "k")
    for k in (1, 2, 3):
        got = _ok("decode_segments", *_kernel_args(metadata, entries, k, k))
        _assert_equal(got, _expected([]), "empty batch")


@given(
    st.lists(
        st.tuples(st.integers(0, 3), st.lists(st.integers(0, 50), min_size=1, max_size=8)),
        min_size=1,
        max_size=8,
    )
)
def test_roaring_check_positions(groups: list[tuple[int, list[int]]]) -> None:
    ledgers = np.array([ledger for ledger, _ in groups], dtype=np.int64)
    bitmaps = [_serialize(values, False) for _, values in groups]
    seen: set[tuple[int, int]] = set()
    duplicate = False
    for ledger, values in groups:
        for value in set(values):
            duplicate |= (ledger, value) in seen
            seen.add((ledger, value))
    if duplicate:
        _rejected("roaring_check_positions", ledgers, *_block(bitmaps))
    else:
        cards = _ok("roaring_check_positions", ledgers, *_block(bitmaps))
        assert cards.tolist() == [len(set(values)) for _, values in groups]


@given(_snapshots())
def test_decode_segments_slots_accepts_distinct_positions(
    snap: tuple[SnapshotMetadata, Sequence[Segment], list[bytes]],
) -> None:
    metadata, segments, entries = snap
    slots = np.unique(metadata.ledgers, return_inverse=True)[1].astype(np.int64)
    args = _kernel_args(metadata, entries, 1, metadata.num_segments + 1)
    got = _ok("decode_segments", *args, slots)
    _assert_equal(got, _expected(segments), "decode_segments")


def test_decode_segments_slots_rejects_a_position_in_two_segments() -> None:
    # Two one-index segments that both claim position (1, 5).
    bitmap = _serialize([5], False)
    entries = [codec._frame(1, 0, b""), codec._frame(2, 0, b"")]
    args = [
        b"".join(entries),
        np.array([len(e) for e in entries], dtype=np.int64),
        1,
        np.array([10, 20], dtype=np.int64),
        np.array([0, 0], dtype=np.int64),
        np.array([1, 1], dtype=np.int64),
        np.array([0, 1, 2], dtype=np.int64),
        np.array([1, 1], dtype=np.int64),
        *_block([bitmap, bitmap]),
    ]
    _ok("decode_segments", *args)  # without slots the kernel does not look across segments
    _rejected("decode_segments", *args, np.array([0, 0], dtype=np.int64))


# --- unpack_segment_times ----------------------------------------------------------------------


@given(_snapshots(), st.data())
def test_unpack_segment_times_checks_every_entry(
    snap: tuple[SnapshotMetadata, Sequence[Segment], list[bytes]], data: st.DataObject
) -> None:
    metadata, _, entries = snap
    n = metadata.num_segments
    args = _times_args(_kernel_args(metadata, entries, 1, n + 1))
    buffer = bytearray(args[0])
    buffer[data.draw(st.integers(0, len(buffer) - 1))] ^= 1 << data.draw(st.integers(0, 7))
    _rejected("unpack_segment_times", bytes(buffer), *args[1:])
    shifted = list(args)
    shifted[2] = data.draw(st.sampled_from([0, 2, n + 1, 2**31]))
    _rejected("unpack_segment_times", *shifted)


@given(_snapshots(), st.data())
def test_unpack_segment_times_of_scattered_entries(
    snap: tuple[SnapshotMetadata, Sequence[Segment], list[bytes]], data: st.DataObject
) -> None:
    """With ``indexes``, any entries in any order: each checked against its own index."""
    metadata, segments, entries = snap
    n = metadata.num_segments
    picks = data.draw(st.lists(st.integers(1, n), min_size=1, max_size=2 * n))
    chosen = np.array(picks, dtype=np.int64)
    args = [
        b"".join(entries[k] for k in picks),
        np.array([len(entries[k]) for k in picks], dtype=np.int64),
        0,
        metadata.mins[chosen - 1],
        metadata.maxs[chosen - 1] - metadata.mins[chosen - 1],
        metadata.counts[chosen - 1],
        chosen,
    ]
    times = _ok("unpack_segment_times", *args)
    want = [sorted(segments[k - 1].times.tolist()) for k in picks]
    assert _sorted_per_segment(times, args[5]) == want
    # An entry checked against another index fails its checksum; a short index column too.
    wrong = chosen.copy()
    wrong[data.draw(st.integers(0, len(picks) - 1))] += data.draw(st.sampled_from([-1, 1, n]))
    _rejected("unpack_segment_times", *args[:6], wrong)
    _rejected("unpack_segment_times", *args[:6], chosen[:-1])


@given(
    _snapshots(),
    st.sampled_from(sorted(m for m, (pos, _) in _ARG_MUTATIONS.items() if 0 <= pos < 6)),
)
def test_unpack_segment_times_bad_arguments_agree(
    snap: tuple[SnapshotMetadata, Sequence[Segment], list[bytes]], mutation: str
) -> None:
    metadata, _, entries = snap
    args = _times_args(_kernel_args(metadata, entries, 1, metadata.num_segments + 1))
    position, change = _ARG_MUTATIONS[mutation]
    args[position] = change(args[position])
    outcome, _ = _same("unpack_segment_times", *args)
    if mutation in ("counts 0", "spans -1", "lengths tiny", "buffer longer", "buffer shorter"):
        assert outcome == "ValueError"


# --- roaring_union_by_ledger ---------------------------------------------------------------------


@given(
    st.lists(st.tuples(st.integers(0, 5), _bitmap_values(), st.booleans()), max_size=8),
    st.booleans(),
)
def test_roaring_union_by_ledger(pieces: list[tuple[int, list[int], bool]], dense: bool) -> None:
    # A valid snapshot never repeats a position, so give each ledger disjoint pieces.
    seen: dict[int, set[int]] = {}
    ledgers, bitmaps = [], []
    for ledger, values, run_optimize in pieces:
        if dense:  # small offsets: the bitset path
            values = [v % 5_000 for v in values]
        fresh = sorted(set(values) - seen.setdefault(ledger, set()))
        seen[ledger].update(fresh)
        ledgers.append(ledger)
        bitmaps.append(_serialize(fresh, run_optimize))
    ids, offsets, entries = _ok(
        "roaring_union_by_ledger", np.array(ledgers, dtype=np.int64), *_block(bitmaps)
    )
    expected = {k: sorted(v) for k, v in seen.items()}
    got = {
        int(ledger): entries[offsets[i] : offsets[i + 1]].tolist()
        for i, ledger in enumerate(ids.tolist())
    }
    assert got == expected
    assert ids.tolist() == sorted(expected)


def test_roaring_union_by_ledger_rejects_garbage() -> None:
    _rejected("roaring_union_by_ledger", np.array([1], dtype=np.int64), *_block([b"junk"]))
    _rejected("roaring_union_by_ledger", np.array([1, 2], dtype=np.int64), *_block([b""]))
    good = _serialize([1, 2], False)
    blob, _offsets = _block([good, good])
    for bad in ([0, 5, len(blob)], [0, len(blob)], [0, len(good), len(blob) + 1]):
        # Offsets that split the block badly, miss a bitmap or overrun it.
        _rejected("roaring_union_by_ledger", np.array([1, 2], dtype=np.int64), blob,
                  np.array(bad, dtype=np.int64))  # fmt: skip


# --- build_segments ------------------------------------------------------------------------------


@given(
    st.lists(
        st.tuples(st.integers(0, 400), st.integers(0, 3), _bitmap_values()), min_size=1, max_size=6
    ),
    st.integers(1, 200),
    st.sampled_from([-1, 1, 2, 7, 5000]),
)
def test_build_segments(groups: list[tuple[int, int, list[int]]], step: int, max_per: int) -> None:
    seen: set[tuple[int, int]] = set()
    times, ledgers, entries = [], [], []
    for t0, ledger, values in groups:
        for i, entry in enumerate(values[:3000]):
            if (ledger, entry) not in seen:
                seen.add((ledger, entry))
                times.append(t0 + i % 50)
                ledgers.append(ledger)
                entries.append(entry)
    cols = [np.array(c, dtype=np.int64) for c in (times, ledgers, entries)]
    out = _ok("build_segments", *cols, step, max_per)
    t, lg, en, mins, maxs, counts = out[:6]
    assert sorted(zip(times, ledgers, entries, strict=True)) == list(
        zip(t.tolist(), lg.tolist(), en.tolist(), strict=True)
    )
    assert counts.sum() == len(times)
    assert max_per == -1 or len(counts) == 0 or counts.max() <= max_per
    assert np.all(maxs - mins <= step - 1)


@pytest.mark.parametrize(
    ("time_span", "ledger_low", "ledger_span", "entry_max"),
    [
        (2**20, 0, 2**4, 2**16),  # a realistic bucket: the triples pack into one key
        (2**40, 7, 2**8, 2**16 - 1),  # exactly 64 bits with the entries
        (2**62, 0, 2**10, 2**32 - 1),  # too wide to pack: the quicksort
        (2**30, 2**62, 2**40, 2**20),  # large ledger ids, a wide ledger span
    ],
)
def test_build_segments_packed_and_wide_sorts_agree(
    time_span: int, ledger_low: int, ledger_span: int, entry_max: int
) -> None:
    """Above 64 triples the native build sorts packed keys when the fields fit 64 bits, else
    the quicksort: both twins, each width, the same bytes (negative times included)."""
    rng = np.random.default_rng(time_span ^ ledger_span)
    n = 3000
    ledgers = ledger_low + rng.integers(0, ledger_span, n, dtype=np.int64)
    entries = rng.integers(0, entry_max, n, dtype=np.int64, endpoint=True)
    keep = np.unique(np.stack([ledgers, entries]), axis=1, return_index=True)[1]
    ledgers, entries = ledgers[np.sort(keep)], entries[np.sort(keep)]
    times = -(time_span // 2) + rng.integers(0, time_span, len(ledgers), dtype=np.int64)
    times[:40] = times[40]  # equal times: the order falls to the positions
    for step, max_per in ((2**62, -1), (max(time_span // 16, 1), 500)):
        out = _ok("build_segments", times, ledgers, entries, step, max_per)
        order = np.lexsort((entries, ledgers, times))
        np.testing.assert_array_equal(out[0], times[order])
        np.testing.assert_array_equal(out[1], ledgers[order])
        np.testing.assert_array_equal(out[2], entries[order])


def test_build_segments_rejects_a_repeated_position() -> None:
    cols = [np.array(c, dtype=np.int64) for c in ([5, 5], [1, 1], [9, 9])]
    _rejected("build_segments", *cols, 10, -1)
