"""The packed-word sorts (``_sortkeys``) against numpy's stable argsort and lexsort, including
keys too wide to pack (the fallback) and the int64 edges."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from delayindex._sortkeys import pack_positions, position_order, stable_order, stable_order_int64

INT64 = st.integers(-(2**63), 2**63 - 1)


@given(st.lists(st.integers(0, 2**64 - 1), max_size=300), st.integers(0, 64))
def test_stable_order_is_the_stable_argsort(values: list[int], shift: int) -> None:
    keys = np.array([v >> shift for v in values], dtype=np.uint64)
    got = stable_order(keys)
    assert got.dtype == np.intp
    np.testing.assert_array_equal(got, np.argsort(keys, kind="stable"))


@given(st.lists(st.integers(0, 7), max_size=300))
def test_stable_order_keeps_ties_in_index_order(values: list[int]) -> None:
    # Few distinct keys: most rows tie, so only the index bits order them.
    keys = np.array(values, dtype=np.uint64)
    np.testing.assert_array_equal(stable_order(keys, 3), np.argsort(keys, kind="stable"))


def test_stable_order_falls_back_when_key_and_index_do_not_fit() -> None:
    keys = np.array([2**63 + 5, 3, 2**63 + 5, 0, 3], dtype=np.uint64)  # 64-bit keys
    np.testing.assert_array_equal(stable_order(keys), [3, 1, 4, 0, 2])


@given(st.lists(INT64, max_size=300))
def test_stable_order_int64_is_the_stable_argsort(values: list[int]) -> None:
    array = np.array(values, dtype=np.int64)
    np.testing.assert_array_equal(stable_order_int64(array), np.argsort(array, kind="stable"))


@given(
    st.lists(st.tuples(st.integers(0, 2**63 - 1), st.integers(0, 2**32 - 1)), max_size=200),
    st.integers(0, 62),
)
def test_pack_positions_preserves_position_order(pairs: list[tuple[int, int]], shift: int) -> None:
    ledgers = np.array([lg >> shift for lg, _ in pairs], dtype=np.int64)
    entries = np.array([e for _, e in pairs], dtype=np.int64)
    packed = pack_positions(ledgers, entries)
    if packed is None:  # too wide: the span of ledgers and the entries exceed 64 bits
        span = int(ledgers.max()) - int(ledgers.min())
        assert span.bit_length() + int(entries.max()).bit_length() > 64
        return
    keys, width = packed
    assert all(int(k).bit_length() <= width for k in keys)
    np.testing.assert_array_equal(stable_order(keys, width), np.lexsort((entries, ledgers)))
    same = (keys[:, None] == keys[None, :]) == (
        (ledgers[:, None] == ledgers[None, :]) & (entries[:, None] == entries[None, :])
    )
    assert same.all()


@given(
    st.lists(st.tuples(st.integers(0, 2**63 - 1), st.integers(0, 2**32 - 1)), max_size=200),
    st.integers(0, 62),
)
def test_position_order_is_the_stable_lexsort(pairs: list[tuple[int, int]], shift: int) -> None:
    # Narrow ledger spans pack (the plain sort); wide ones fall back to lexsort. Repeated
    # positions keep their index order either way.
    pairs = pairs + pairs[: len(pairs) // 3]
    ledgers = np.array([lg >> shift for lg, _ in pairs], dtype=np.int64)
    entries = np.array([e for _, e in pairs], dtype=np.int64)
    got = position_order(ledgers, entries)
    np.testing.assert_array_equal(got, np.lexsort((entries, ledgers)))


def test_pack_positions_refuses_negative_ids() -> None:
    assert pack_positions(np.array([-1], dtype=np.int64), np.array([0], dtype=np.int64)) is None
    assert pack_positions(np.array([1], dtype=np.int64), np.array([-1], dtype=np.int64)) is None


@pytest.mark.parametrize("n", [0, 1])
def test_tiny_inputs(n: int) -> None:
    assert len(stable_order(np.zeros(n, dtype=np.uint64))) == n
    assert len(stable_order_int64(np.zeros(n, dtype=np.int64))) == n
    assert len(position_order(np.zeros(n, dtype=np.int64), np.zeros(n, dtype=np.int64))) == n
