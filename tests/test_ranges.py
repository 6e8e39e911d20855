"""``LedgerRanges``: the evicted ranges both core twins keep (against a plain set model)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from delayindex._ranges import LedgerRanges

spans = st.lists(st.tuples(st.integers(0, 60), st.integers(0, 8)), max_size=12)


@given(spans=spans, cut=st.integers(0, 70))
def test_ranges_cover_exactly_the_ledgers_added_and_not_dropped(
    spans: list[tuple[int, int]], cut: int
) -> None:
    ranges, model = LedgerRanges(), set()
    for start, width in spans:
        ranges.add(start, start + width)
        model |= set(range(start, start + width + 1))
        ranges._check()
    probe = np.arange(0, 75, dtype=np.int64)
    assert [int(x) in ranges for x in probe] == [int(x) in model for x in probe]
    assert ranges.mask(probe).tolist() == [int(x) in model for x in probe]
    assert all(np.int64(x) in ranges for x in model)  # numpy ints too
    ranges.drop_below(cut)
    ranges._check()
    # A range that ends below the cut goes whole; one that reaches it stays whole.
    kept = {x for start, end in ranges for x in range(start, end + 1)}
    assert kept <= model and all(x >= cut or any(s <= x <= e and e >= cut for s, e in ranges)
                                 for x in kept)  # fmt: skip
    assert all(x in kept for x in model if x >= cut)
    assert ranges.max == (max(kept) if kept else -1)


@given(
    steps=st.lists(
        st.tuples(st.booleans(), st.integers(0, 60), st.integers(0, 8)), min_size=1, max_size=16
    )
)
def test_ranges_cover_what_was_added_less_what_was_removed(
    steps: list[tuple[bool, int, int]],
) -> None:
    ranges, model = LedgerRanges(), set()
    probe = np.arange(0, 75, dtype=np.int64)
    for adding, start, width in steps:
        covered = set(range(start, start + width + 1))
        if adding:
            ranges.add(start, start + width)
            model |= covered
        else:
            ranges.remove(start, start + width)
            model -= covered
        ranges._check()
        assert ranges.mask(probe).tolist() == [int(x) in model for x in probe]
        assert ranges.max == (max(model) if model else -1)


def test_bad_ranges_and_values() -> None:
    ranges = LedgerRanges()
    with pytest.raises(ValueError):
        ranges.add(5, 4)
    with pytest.raises(ValueError):
        ranges.add(-1, 3)
    with pytest.raises(ValueError):
        ranges.remove(5, 4)
    ranges.add(3, 4)
    assert "3" not in ranges and 3.0 not in ranges and 3 in ranges
    ranges.add(5, 9)  # touching ranges merge
    assert list(ranges) == [(3, 9)]
    ranges.clear()
    assert len(ranges) == 0 and ranges.max == -1 and not ranges.mask([3]).any()
