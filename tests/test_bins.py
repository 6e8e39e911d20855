"""``BinIndex`` (due_histogram's bin lookup): both twins count exactly what a binary search
over the edges counts, for any strictly increasing int64 edges, including edges a rounding cell
map could misplace (adjacent edges, the int64 extremes, a huge range with narrow bins)."""

from __future__ import annotations

import bisect
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

INT64 = st.integers(-(2**63), 2**63 - 1)
#: ``bin_cls`` only names a class: nothing to reset between examples.
FIXTURE_OK = settings(suppress_health_check=[HealthCheck.function_scoped_fixture])


def _reference(edges: list[int], times: list[int]) -> list[int]:
    counts = [0] * (len(edges) - 1)
    for t in times:
        if edges[0] <= t < edges[-1]:
            counts[bisect.bisect_right(edges, t) - 1] += 1
    return counts


@st.composite
def _edges_and_times(draw: st.DrawFn) -> tuple[list[int], list[int]]:
    edges = sorted(set(draw(st.lists(INT64, min_size=2, max_size=40))))
    if len(edges) < 2:
        edges = [edges[0] - 1, edges[0]] if edges[0] > -(2**63) else [edges[0], edges[0] + 1]
    if draw(st.booleans()):  # crowd edges together inside one cell of a huge range
        base = draw(st.integers(-(2**62), 2**62))
        edges = sorted({*edges, *(base + k for k in range(draw(st.integers(1, 6))))})
    near = [e + d for e in edges for d in (-1, 0, 1) if -(2**63) <= e + d < 2**63]
    times = draw(st.lists(st.one_of(INT64, st.sampled_from(near)), max_size=200))
    return edges, times


@FIXTURE_OK
@given(_edges_and_times())
def test_counts_match_a_binary_search(bin_cls: Any, case: tuple[list[int], list[int]]) -> None:
    edges, times = case
    got = bin_cls(np.array(edges, dtype=np.int64)).counts(np.array(times, dtype=np.int64))
    assert got.dtype == np.int64
    assert got.tolist() == _reference(edges, times)


@FIXTURE_OK
@given(st.integers(2, 300), st.integers(1, 10**6), st.integers(-(10**12), 10**12))
def test_equal_bins_over_a_dense_range(bin_cls: Any, nbins: int, width: int, low: int) -> None:
    edges = np.arange(nbins + 1, dtype=np.int64) * width + low
    times = np.arange(edges[0] - 2, edges[-1] + 2, max(1, (nbins * width) // 5000), dtype=np.int64)
    got = bin_cls(edges).counts(times)
    assert got.tolist() == _reference(edges.tolist(), times.tolist())


def test_fewer_than_two_edges_is_an_error(bin_cls: Any) -> None:
    with pytest.raises(ValueError, match="two"):
        bin_cls(np.array([5], dtype=np.int64))
