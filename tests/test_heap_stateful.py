"""Stateful differential test: native TripleHeap vs pure TripleHeap vs a sorted-list model.

Times come from a tiny range (plus occasional int64 extremes) and ledgers/entries from 0..2, so
nearly every operation meets ties. Every rule compares the results of all three; the invariant
checks both heaps' internal invariants and their sizes and contents after every step.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from delayindex import _impl

I64_MIN = -(2**63)
I64_MAX = 2**63 - 1

Triple = tuple[int, int, int]


def _native_heap_cls() -> Any:
    module = _impl.native_module_or_none()
    assert module is not None, "the native extension delayindex._native is not built"
    return module.TripleHeap


# Mostly 0..3 (many ties), occasionally an extreme or a negative time.
times = st.sampled_from([0, 1, 2, 3] * 4 + [-1, I64_MIN, I64_MAX])
ledgers = st.integers(0, 2)
entries = st.integers(0, 2)
triples = st.tuples(times, ledgers, entries)
cutoffs = st.sampled_from([-2, -1, 0, 1, 2, 3, 4, I64_MIN, I64_MAX])
max_ns = st.integers(-2, 12) | st.just(I64_MAX)


def _rows(arrays: Any) -> list[Triple]:
    assert isinstance(arrays, tuple)
    assert len(arrays) == 3
    for a in arrays:
        assert isinstance(a, np.ndarray)
        assert a.dtype == np.int64
        assert a.ndim == 1
    t, led, e = (a.tolist() for a in arrays)
    assert len(t) == len(led) == len(e)
    return list(zip(t, led, e, strict=True))


def _columns(batch: list[Triple]) -> tuple[npt.NDArray[np.int64], ...]:
    if not batch:
        empty = np.empty(0, dtype=np.int64)
        return empty, empty.copy(), empty.copy()
    t, led, e = zip(*batch, strict=True)
    return (np.array(t, dtype=np.int64), np.array(led, dtype=np.int64), np.array(e, dtype=np.int64))


class HeapMachine(RuleBasedStateMachine):
    """Drive both twins and the model with the same operations; all results must agree."""

    native_cls: Any = staticmethod(_native_heap_cls)
    pure_cls: Any = staticmethod(lambda: _impl.PureTripleHeap)

    def __init__(self) -> None:
        super().__init__()
        self.native = self.native_cls()()
        self.pure = self.pure_cls()()
        self.model: list[Triple] = []  # kept sorted

    # -- rules ----------------------------------------------------------------------------------

    @rule(triple=triples)
    def push(self, triple: Triple) -> None:
        self.native.push(*triple)
        self.pure.push(*triple)
        self.model.append(triple)
        self.model.sort()

    @rule(batch=st.lists(triples, max_size=40), extra=st.integers(0, 1))
    def push_many(self, batch: list[Triple], extra: int) -> None:
        # `extra` sometimes makes the batch at least as large as the heap (append + heapify
        # path in the native twin) even when the drawn list is short. Only while the heap is
        # small, so padding cannot double it step after step.
        if extra and len(batch) < len(self.model) <= 60:
            batch = batch + [batch[-1] if batch else (0, 0, 0)] * (len(self.model) - len(batch))
        self.native.push_many(*_columns(batch))
        self.pure.push_many(*_columns(batch))
        self.model.extend(batch)
        self.model.sort()

    @rule()
    def pop(self) -> None:
        if not self.model:
            for heap in (self.native, self.pure):
                try:
                    heap.pop()
                except IndexError:
                    pass
                else:
                    raise AssertionError(f"{heap!r}.pop() on an empty heap did not raise")
            return
        expected = self.model.pop(0)
        got_native = self.native.pop()
        got_pure = self.pure.pop()
        assert got_native == got_pure == expected, (got_native, got_pure, expected)

    @rule()
    def peek(self) -> None:
        if not self.model:
            for heap in (self.native, self.pure):
                try:
                    heap.peek()
                except IndexError:
                    pass
                else:
                    raise AssertionError(f"{heap!r}.peek() on an empty heap did not raise")
            return
        got_native = self.native.peek()
        got_pure = self.pure.peek()
        assert got_native == got_pure == self.model[0], (got_native, got_pure, self.model[0])

    @rule(cutoff=cutoffs, max_n=max_ns)
    def pop_due(self, cutoff: int, max_n: int) -> None:
        expected: list[Triple] = []
        while len(expected) < max_n and self.model and self.model[0][0] <= cutoff:
            expected.append(self.model.pop(0))
        got_native = _rows(self.native.pop_due(cutoff, max_n))
        got_pure = _rows(self.pure.pop_due(cutoff, max_n))
        assert got_native == got_pure == expected, (got_native, got_pure, expected)

    @rule(ledger=st.integers(0, 3), entry=st.integers(0, 3))
    def remove(self, ledger: int, entry: int) -> None:
        kept = [t for t in self.model if (t[1], t[2]) != (ledger, entry)]
        expected = len(self.model) - len(kept)
        self.model = kept
        got_native = self.native.remove(ledger, entry)
        got_pure = self.pure.remove(ledger, entry)
        assert got_native == got_pure == expected, (got_native, got_pure, expected)

    @rule()
    def clear(self) -> None:
        self.native.clear()
        self.pure.clear()
        self.model = []

    # -- invariants -----------------------------------------------------------------------------

    @invariant()
    def heaps_are_valid_and_agree(self) -> None:
        self.native._check()
        self.pure._check()
        assert len(self.native) == len(self.pure) == len(self.model)
        assert bool(self.native) == bool(self.pure) == bool(self.model)
        assert self.native.nbytes >= 0
        assert self.pure.nbytes >= 0
        native_nodes = sorted(_rows(self.native.to_arrays()))
        pure_nodes = sorted(_rows(self.pure.to_arrays()))
        assert native_nodes == pure_nodes == self.model


HeapMachine.TestCase.settings = settings(stateful_step_count=50)
TestHeapStateful = HeapMachine.TestCase
