"""``BucketCore.restore_block``: recovery's restore of a snapshot's live bitmaps straight into the
dedup index, native against pure.

Both twins must agree on every block: what they track, how many, and which blocks they refuse
(a malformed bitmap, a position in two bitmaps, a count other than the expected). A refused
block leaves the core as it was: its ledger span holds nothing again, other ledgers keep theirs.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from pyroaring import BitMap

from delayindex import _impl

_native = _impl.native_module_or_none()
assert _native is not None, "the native extension must be built for the differential test"
native_module: ModuleType = _native  # declared narrowed: functions see the declared type


def _cores() -> list[Any]:
    return [native_module.BucketCore(0, True, 0, 10), _impl.PureBucketCore(0, True, 0, 10)]


def _block(bitmaps: list[bytes]) -> tuple[bytes, np.ndarray]:
    offsets = np.zeros(len(bitmaps) + 1, dtype=np.int64)
    np.cumsum([len(b) for b in bitmaps], out=offsets[1:])
    return b"".join(bitmaps), offsets


def _serialized(values: set[int], runs: bool) -> bytes:
    bm = BitMap(values)
    if runs:
        bm.run_optimize()
    return bytes(bm.serialize())


def _state(core: Any, probes: list[tuple[int, int]]) -> tuple[int, list[tuple[int, int]]]:
    return len(core), [p for p in probes if core.contains(*p)]


pieces = st.lists(
    st.tuples(
        st.integers(100, 104),
        st.sets(st.one_of(st.integers(0, 70), st.integers(65_530, 65_600)), max_size=12),
        st.booleans(),
    ),
    max_size=8,
)


@given(
    pieces=pieces,
    damage=st.one_of(st.none(), st.tuples(st.integers(0, 10_000), st.integers(0, 255))),
    expected_shift=st.sampled_from([None, 0, 1, -1]),
)
def test_twins_agree_and_a_refused_block_leaves_nothing(
    pieces: list[tuple[int, set[int], bool]],
    damage: tuple[int, int] | None,
    expected_shift: int | None,
) -> None:
    ledgers = np.array([ledger for ledger, _, _ in pieces], dtype=np.int64)
    blob, offsets = _block([_serialized(values, runs) for _, values, runs in pieces])
    if damage is not None and blob:
        at, byte = damage[0] % len(blob), damage[1]
        blob = blob[:at] + bytes([byte]) + blob[at + 1 :]
    total = sum(len(values) for _, values, _ in pieces)
    expected = -1 if expected_shift is None else max(total + expected_shift, 0)
    miscounted = expected >= 0 and expected != total
    probes = [(ledger, entry) for ledger, values, _ in pieces for entry in values]
    probes += [(7, 1), (200, 3)]  # outside the block: kept whatever happens to it
    outcomes = []
    for core in _cores():
        core.restore(7, BitMap([1]))
        core.restore(200, BitMap([3]))
        try:
            result: object = core.restore_block(ledgers, blob, offsets, expected)
        except ValueError:
            result = ValueError
            assert _state(core, probes) == (2, [(7, 1), (200, 3)])  # nothing of the block
        outcomes.append((result, _state(core, probes)))
        core._check()
    assert outcomes[0] == outcomes[1]
    clean = damage is None or not blob
    seen: dict[int, set[int]] = {}
    overlap = False
    for ledger, values, _ in pieces:
        overlap |= bool(seen.setdefault(ledger, set()) & values)
        seen[ledger] |= values
    if clean and not overlap and not miscounted:
        assert outcomes[0][0] == total
    if clean and (overlap or miscounted):
        assert outcomes[0][0] is ValueError


def test_frames_are_checked_as_the_block_readers_check_them() -> None:
    blob, offsets = _block([_serialized({1, 2}, False), _serialized({5}, False)])
    for core in _cores():
        with pytest.raises(ValueError, match="differ in length"):
            core.restore_block(np.array([1], dtype=np.int64), blob, offsets)
        with pytest.raises(ValueError, match="span"):
            core.restore_block(np.array([1, 2], dtype=np.int64), blob + b"x", offsets)
        assert core.restore_block(np.array([1, 2], dtype=np.int64), blob, offsets, 3) == 3
        assert core.restore_block(np.array([], dtype=np.int64), b"", np.zeros(1, np.int64)) == 0
        assert len(core) == 3
