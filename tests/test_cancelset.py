"""``delayindex._cancelset``: the packed position sets and their helpers, against set models."""

from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from delayindex._cancelset import count_packed, pack_cancelled, union_unique, unpack_cancelled

small = st.sets(st.tuples(st.integers(0, 6), st.integers(0, 9)), max_size=30)
wide = st.sets(st.tuples(st.integers(0, 2**40), st.integers(0, 2**32 - 1)), max_size=30)


def _columns(positions: set[tuple[int, int]]) -> tuple[np.ndarray, np.ndarray]:
    ordered = sorted(positions)
    return (
        np.array([p[0] for p in ordered], dtype=np.int64),
        np.array([p[1] for p in ordered], dtype=np.int64),
    )


@given(st.one_of(st.tuples(small, small), st.tuples(wide, wide), st.tuples(small, wide)))
def test_union_unique_is_the_sorted_set_union(
    sets: tuple[set[tuple[int, int]], set[tuple[int, int]]],
) -> None:
    a, b = sets
    ledgers, entries = union_unique(*_columns(a), *_columns(b))
    assert list(zip(ledgers.tolist(), entries.tolist(), strict=True)) == sorted(a | b)


@given(small)
def test_count_packed_counts_without_decoding(positions: set[tuple[int, int]]) -> None:
    packed = pack_cancelled(*_columns(positions))
    assert count_packed(packed) == len(positions) == len(unpack_cancelled(packed)[0])
