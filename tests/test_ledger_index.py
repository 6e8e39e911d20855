"""LedgerIndex: native (dense bitsets, sparse fallback) against pure (BitMaps) and a plain set.

The entry domain mixes dense runs, far-apart values (forcing the sparse fallback and downward
growth) and the 32-bit edges, so every bitset growth path is exercised.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule
from pyroaring import BitMap

from delayindex import _impl

_native = _impl.native_module_or_none()
assert _native is not None, "the native extension must be built for the differential test"
native_module: ModuleType = _native  # declared narrowed: functions see the declared type

ledgers = st.integers(0, 5)
entries = st.one_of(
    st.integers(0, 300),
    st.integers(5_000, 5_200),
    st.integers(0, 2**32 - 1),
    st.sampled_from([0, 63, 64, 2**32 - 65, 2**32 - 64, 2**32 - 1]),
)


class LedgerIndexMachine(RuleBasedStateMachine):
    """Both twins and a model set in lock step."""

    @initialize()
    def build(self) -> None:
        self.twins: list[Any] = [native_module.LedgerIndex(), _impl.PureLedgerIndex()]
        self.model: set[tuple[int, int]] = set()

    def _both(self, method: str, *args: Any) -> Any:
        a, b = (getattr(t, method)(*args) for t in self.twins)
        assert a == b, (method, args, a, b)
        return a

    @rule(ledger=ledgers, entry=entries)
    def add(self, ledger: int, entry: int) -> None:
        assert self._both("add", ledger, entry) == ((ledger, entry) not in self.model)
        self.model.add((ledger, entry))

    @rule(ledger=ledgers, start=st.integers(0, 400), n=st.integers(1, 300))
    def add_run(self, ledger: int, start: int, n: int) -> None:
        for entry in range(start, start + n, 2):
            self.add(ledger, entry)

    @rule(ledger=ledgers, entry=entries)
    def discard(self, ledger: int, entry: int) -> None:
        assert self._both("discard", ledger, entry) == ((ledger, entry) in self.model)
        self.model.discard((ledger, entry))

    @rule(pairs=st.lists(st.tuples(ledgers, entries), max_size=30))
    def add_many(self, pairs: list[tuple[int, int]]) -> None:
        ls, es = (np.array([p[i] for p in pairs], dtype=np.int64) for i in (0, 1))
        assert self._both("add_many", ls, es) == len(set(pairs) - self.model)
        self.model |= set(pairs)

    @rule(pairs=st.lists(st.tuples(ledgers, entries), max_size=30))
    def discard_many(self, pairs: list[tuple[int, int]]) -> None:
        ls, es = (np.array([p[i] for p in pairs], dtype=np.int64) for i in (0, 1))
        assert self._both("discard_many", ls, es) == len(set(pairs) & self.model)
        self.model -= set(pairs)

    @rule(ledger=ledgers, values=st.lists(entries, max_size=30))
    def restore(self, ledger: int, values: list[int]) -> None:
        new = {(ledger, v) for v in values} - self.model
        assert self._both("restore", ledger, BitMap(values)) == len(new)
        self.model |= new

    @rule(ledger=ledgers, values=st.lists(st.integers(0, 2_000), max_size=30))
    def restore_array(self, ledger: int, values: list[int]) -> None:
        new = {(ledger, v) for v in values} - self.model
        arr = np.array(sorted(set(values)), dtype=np.uint32)
        assert self._both("restore", ledger, arr) == len(new)
        self.model |= new

    @rule(ledger=ledgers, entry=entries)
    def remove_upto(self, ledger: int, entry: int) -> None:
        gone = {p for p in self.model if p <= (ledger, entry)}
        assert self._both("remove_upto", ledger, entry) == len(gone)
        self.model -= gone

    @rule(start=ledgers, end=ledgers)
    def remove_ledgers(self, start: int, end: int) -> None:
        gone = {p for p in self.model if start <= p[0] <= end}
        assert self._both("remove_ledgers", start, end) == len(gone)
        self.model -= gone

    @rule()
    def compact(self) -> None:
        self._both("compact")

    @rule(ledger=ledgers, entry=entries)
    def queries(self, ledger: int, entry: int) -> None:
        assert self._both("contains", ledger, entry) == ((ledger, entry) in self.model)
        assert self._both("bitmap", ledger) == BitMap(e for lg, e in self.model if lg == ledger)
        assert self._both("ledger_count", ledger) == sum(1 for p in self.model if p[0] == ledger)

    @rule(ledger=ledgers, first=entries, last=entries)
    def ranged_bitmap(self, ledger: int, first: int, last: int) -> None:
        want = BitMap(e for lg, e in self.model if lg == ledger and first <= e <= last)
        assert self._both("bitmap", ledger, first, last) == want

    @rule(
        pairs=st.lists(
            st.tuples(
                ledgers,
                st.integers(0, 2**32 - 1)
                | entries
                | st.integers(-3, -1)  # out of range: absent
                | st.integers(2**32, 2**32 + 3),
            ),
            max_size=40,
        )
    )
    def contains_many(self, pairs: list[tuple[int, int]]) -> None:
        ls = np.array([p[0] for p in pairs], dtype=np.int64)
        es = np.array([p[1] for p in pairs], dtype=np.int64)
        for twin in self.twins:
            got = twin.contains_many(ls, es)
            assert got.dtype == np.bool_
            assert got.tolist() == [p in self.model for p in pairs]

    @invariant()
    def agree(self) -> None:
        for twin in self.twins:
            twin._check()
            assert len(twin) == len(self.model)
            assert twin.ledgers() == sorted({p[0] for p in self.model})
            assert twin.num_ledgers == len({p[0] for p in self.model})
            ledgers, counts = twin.ledger_counts()
            want = sorted({p[0] for p in self.model})
            assert ledgers.tolist() == want
            assert counts.tolist() == [sum(1 for p in self.model if p[0] == g) for g in want]
            pos_ledgers, pos_entries = twin.positions()
            assert pos_ledgers.dtype == pos_entries.dtype == np.int64
            pairs = list(zip(pos_ledgers.tolist(), pos_entries.tolist(), strict=True))
            assert pairs == sorted(self.model)


TestLedgerIndexDifferential = LedgerIndexMachine.TestCase


@pytest.mark.parametrize("which", ["native", "pure"])
def test_bad_ids_are_rejected(which: str) -> None:
    index = native_module.LedgerIndex() if which == "native" else _impl.PureLedgerIndex()
    for ledger, entry in [(-1, 0), (0, -1), (0, 2**32)]:
        with pytest.raises(ValueError):
            index.add(ledger, entry)
    assert len(index) == 0


@pytest.mark.parametrize("which", ["native", "pure"])
def test_many_validates_the_whole_batch_before_changing_anything(which: str) -> None:
    index = native_module.LedgerIndex() if which == "native" else _impl.PureLedgerIndex()
    good_then_bad = np.array([1, 2, 3], dtype=np.int64), np.array([5, 6, 2**32], dtype=np.int64)
    for method in ("add_many", "discard_many"):
        with pytest.raises(ValueError, match="entry_id"):
            getattr(index, method)(*good_then_bad)
        assert len(index) == 0
    index.add(1, 5)
    with pytest.raises(ValueError, match="differ in length"):
        index.discard_many(np.array([1], dtype=np.int64), np.array([], dtype=np.int64))
    assert index.contains(1, 5)


def test_dense_ledgers_cost_well_under_a_byte_per_entry() -> None:
    index = native_module.LedgerIndex()
    rng = np.random.default_rng(5)
    for ledger in range(200):
        for entry in np.flatnonzero(rng.random(1_000) < 0.5).tolist():
            index.add(ledger, entry)
    assert index.memory_bytes() / len(index) < 1.0  # roaring array containers: ~2 B + objects
    index._check()


def test_sparse_ledger_falls_back_and_stays_correct() -> None:
    index = native_module.LedgerIndex()
    values = [0, 2**31, 2**32 - 1, 77, 10**9]
    for value in values:
        assert index.add(3, value)
    assert index.bitmap(3) == BitMap(values)
    assert index.memory_bytes() < 4_096  # no 512 MiB bitset
    assert index.discard(3, 77) and not index.contains(3, 77)
    index._check()


@pytest.mark.parametrize("which", ["native", "pure"])
def test_ranged_bitmap_covers_word_and_bitset_edges(which: str) -> None:
    """A read window scans only its words; windows crossing 64-bit words and the bitset's ends
    still see exactly their entries."""
    index = native_module.LedgerIndex() if which == "native" else _impl.PureLedgerIndex()
    values = list(range(1_000, 3_000, 3))
    for value in values:
        index.add(7, value)
    windows = [(0, 999), (0, 1_000), (1_063, 1_064), (1_000, 1_099), (2_990, 10**6)]
    windows += [(2_999, 2_999), (0, 2**32 - 1), (1_500, 1_499), (3_000, 2**32 - 1)]
    for first, last in windows:
        want = BitMap(v for v in values if first <= v <= last)
        assert index.bitmap(7, first, last) == want, (first, last)
    assert index.bitmap(8, 0, 2**32 - 1) == BitMap()
    index._check()


_any_position = st.tuples(st.integers(0, 2**63 - 1), st.integers(0, 2**32 - 1))
# A poll's positions: few ledgers, small entries (the native radix sort's path, > 64 of them).
_near_position = st.tuples(st.integers(10**12, 10**12 + 40), st.integers(0, 3000))


@given(
    pairs=st.one_of(
        st.lists(_any_position, max_size=60),
        st.lists(st.one_of(_near_position, _any_position), max_size=300),
        st.lists(_near_position, min_size=65, max_size=1500),
        st.lists(st.tuples(st.integers(0, 3), st.just(0)), min_size=65, max_size=200),
    )
)
def test_sorted_positions_twins_agree_with_sorted(pairs: list[tuple[int, int]]) -> None:
    from delayindex._pure.heap import sorted_positions as pure_sorted_positions
    from delayindex.model import Position

    ledgers = np.array([p[0] for p in pairs], dtype=np.int64)
    entries = np.array([p[1] for p in pairs], dtype=np.int64)
    want = sorted(Position(*p) for p in pairs)
    for kernel in (native_module.sorted_positions, pure_sorted_positions):
        got = kernel(ledgers, entries)
        assert got == want and all(type(p) is Position for p in got)
    for kernel in (native_module.sorted_positions, pure_sorted_positions):
        with pytest.raises(ValueError, match="differ in length"):
            kernel(ledgers, np.append(entries, 0))


@pytest.mark.parametrize("n", [65, 1000, 4095, 4096, 20_000])
@pytest.mark.parametrize("ledger_span", [1, 300, 20_000, 2**40])
def test_sorted_positions_at_every_radix_width(n: int, ledger_span: int) -> None:
    """The native sort's paths: 8-bit digits below 4096 positions, 11-bit above, passes
    skipped where every key shares a digit, the quicksort when the keys do not fit 64 bits;
    duplicates kept."""
    from delayindex.model import Position

    rng = np.random.default_rng(n + ledger_span)
    ledgers = 7 + rng.integers(0, ledger_span, n).astype(np.int64)
    entries = rng.integers(0, 2**31 if ledger_span == 2**40 else 5_000, n).astype(np.int64)
    entries[: n // 10] = entries[n // 10 : 2 * (n // 10)]  # some duplicates
    ledgers[: n // 10] = ledgers[n // 10 : 2 * (n // 10)]
    got = native_module.sorted_positions(ledgers, entries)
    order = np.lexsort((entries, ledgers))
    pairs = zip(ledgers[order].tolist(), entries[order].tolist(), strict=True)
    assert got == [Position(a, b) for a, b in pairs]


def test_positions_hold_the_right_ints_when_cached_ones_collide() -> None:
    """The native poll reuses the int objects of recent ledger and entry ids (a direct-mapped
    table of 16384 slots per kind): ids that share a slot, met in turn, are never mixed up."""
    slots = 16_384
    values = [5, 5 + slots, 5 + 3 * slots, 2**40 + 5, 5, 2**31 + 5, 5 + slots]
    for _ in range(3):
        for ledger in values:
            entries = np.array(values, dtype=np.int64)
            got = native_module.sorted_positions(np.full(len(values), ledger, np.int64), entries)
            assert [tuple(p) for p in got] == [(ledger, e) for e in sorted(values)]
            assert all(type(p.ledger_id) is int and type(p.entry_id) is int for p in got)
