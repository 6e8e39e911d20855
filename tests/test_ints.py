"""The library's one strict int64 coercion (``delayindex._ints``) and the helpers built on it:
nothing ever truncates a float."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from delayindex._ints import INT64_MAX, as_int, bit_lengths, int64_array
from delayindex.rebuild import _array
from delayindex.tracker.in_memory import as_int64_array
from delayindex.workload import Workload


def test_int64_array_accepts_integers_without_copy() -> None:
    arr = np.arange(3, dtype=np.int64)
    assert int64_array(arr, "x") is arr
    assert int64_array([1, 2], "x").tolist() == [1, 2]
    assert int64_array(np.array([1], np.uint8), "x").dtype == np.int64
    assert int64_array([], "x").dtype == np.int64
    assert int64_array([INT64_MAX], "x").tolist() == [INT64_MAX]


@pytest.mark.parametrize(
    ("values", "error"),
    [
        ([5.5], TypeError),
        ([5.0], TypeError),  # floats only with integral_floats
        ([True], TypeError),
        (["5"], TypeError),
        (np.array([2**63], np.uint64), ValueError),
        ([2**63], ValueError),
        ([[1]], ValueError),
        ("12", TypeError),
    ],
)
def test_int64_array_is_strict(values: Any, error: type[Exception]) -> None:
    with pytest.raises(error):
        int64_array(values, "x")


def test_integral_floats_only_when_exact() -> None:
    assert int64_array([5.0, -3.0], "x", integral_floats=True).tolist() == [5, -3]
    assert int64_array(np.array([1, 2.0], object), "x", integral_floats=True).tolist() == [1, 2]
    for bad in ([5.5], [float("inf")], [float("nan")], [2.0**53 + 2]):
        with pytest.raises(TypeError, match="not truncated"):
            int64_array(bad, "x", integral_floats=True)


def test_as_int() -> None:
    assert as_int("n", np.int32(4), 0, 5) == 4
    for bad in (4.0, True, "4", np.bool_(True)):
        with pytest.raises(TypeError, match="n must be an int"):
            as_int("n", bad)
    with pytest.raises(ValueError, match=r"n must be in \[0, 5\], got 6"):
        as_int("n", 6, 0, 5)


@pytest.mark.parametrize("coerce", [as_int64_array, _array])
def test_helpers_share_the_strict_coercion(coerce: Any) -> None:
    assert coerce([1, 2], "x").tolist() == [1, 2]
    with pytest.raises(TypeError):
        coerce(np.array([5.5]), "x")
    with pytest.raises(TypeError):
        coerce(np.array([5.0]), "x")


def test_workload_refuses_floats() -> None:
    with pytest.raises(TypeError):
        Workload([1], [5.5], [1], [2])  # type: ignore[arg-type]


@given(
    st.lists(
        st.integers(0, 2**63 - 1)
        | st.sampled_from(
            [2**k + d for k in range(63) for d in (-1, 0, 1) if 0 <= 2**k + d < 2**63]
        )
    )
)
def test_bit_lengths_is_int_bit_length(spans: list[int]) -> None:
    got = bit_lengths(np.array(spans, dtype=np.int64))
    assert got.dtype == np.int64
    assert got.tolist() == [s.bit_length() for s in spans]
