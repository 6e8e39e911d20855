"""The TripleHeap contract: every test runs on each twin (native and pure) via ``heap_cls``.

The heap is a min-heap of signed int64 triples ``(time, ledger, entry)`` in lexicographic
(tuple) order. Deterministic tests call ``_check()`` after every mutating operation.
"""

from __future__ import annotations

import bisect
import random
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest

I64_MIN = -(2**63)
I64_MAX = 2**63 - 1

Triple = tuple[int, int, int]


# --- helpers -----------------------------------------------------------------------------------


def _i64(values: list[int]) -> npt.NDArray[np.int64]:
    return np.array(values, dtype=np.int64)


def _columns(triples: list[Triple]) -> tuple[npt.NDArray[np.int64], ...]:
    return (
        _i64([t for t, _, _ in triples]),
        _i64([led for _, led, _ in triples]),
        _i64([e for _, _, e in triples]),
    )


def _contents(heap: Any) -> list[Triple]:
    """The heap's nodes, sorted (``to_arrays`` order is unspecified)."""
    arrays = heap.to_arrays()
    for a in arrays:
        assert isinstance(a, np.ndarray)
        assert a.dtype == np.int64
        assert a.ndim == 1
    t, led, e = (a.tolist() for a in arrays)
    assert len(t) == len(led) == len(e) == len(heap)
    return sorted(zip(t, led, e, strict=True))


def _rows(arrays: tuple[npt.NDArray[np.int64], ...]) -> list[Triple]:
    t, led, e = arrays
    return list(zip(t.tolist(), led.tolist(), e.tolist(), strict=True))


def _filled(heap_cls: Any, triples: list[Triple]) -> Any:
    heap = heap_cls()
    for triple in triples:
        heap.push(*triple)
        heap._check()
    return heap


def _drain(heap: Any) -> list[Triple]:
    out = []
    while heap:
        out.append(heap.pop())
        heap._check()
    assert len(heap) == 0
    return out


def _assert_int64_result(arrays: Any, n: int) -> None:
    assert isinstance(arrays, tuple)
    assert len(arrays) == 3
    for a in arrays:
        assert isinstance(a, np.ndarray)
        assert a.dtype == np.int64
        assert a.shape == (n,)


# --- empty heap --------------------------------------------------------------------------------


def test_empty_heap(heap_cls: Any) -> None:
    heap = heap_cls()
    heap._check()
    assert len(heap) == 0
    assert not heap
    assert heap.nbytes >= 0
    with pytest.raises(IndexError):
        heap.peek()
    with pytest.raises(IndexError):
        heap.pop()
    heap._check()
    assert _contents(heap) == []
    _assert_int64_result(heap.pop_due(I64_MAX, 10), 0)
    assert heap.remove(0, 0) == 0
    heap._check()


def test_pop_until_empty_then_raises(heap_cls: Any) -> None:
    heap = _filled(heap_cls, [(1, 2, 3)])
    assert heap
    assert heap.pop() == (1, 2, 3)
    heap._check()
    assert not heap
    with pytest.raises(IndexError):
        heap.pop()
    with pytest.raises(IndexError):
        heap.peek()
    heap.push(4, 5, 6)
    heap._check()
    assert heap.peek() == (4, 5, 6)


# --- ordering ----------------------------------------------------------------------------------


def test_len_bool_peek_track_pushes(heap_cls: Any) -> None:
    heap = heap_cls()
    pushed: list[Triple] = []
    for triple in [(5, 0, 0), (3, 1, 1), (9, 0, 0), (3, 0, 7), (1, 9, 9), (4, 4, 4)]:
        heap.push(*triple)
        heap._check()
        pushed.append(triple)
        assert len(heap) == len(pushed)
        assert bool(heap)
        assert heap.peek() == min(pushed)
        assert len(heap) == len(pushed)  # peek does not remove
    assert _drain(heap) == sorted(pushed)


def test_peek_returns_plain_int_tuple(heap_cls: Any) -> None:
    heap = _filled(heap_cls, [(7, 8, 9)])
    head = heap.peek()
    assert type(head) is tuple
    assert [type(x) for x in head] == [int, int, int]
    popped = heap.pop()
    assert type(popped) is tuple
    assert [type(x) for x in popped] == [int, int, int]


def test_full_ties_are_all_kept(heap_cls: Any) -> None:
    heap = _filled(heap_cls, [(5, 5, 5)] * 7 + [(4, 4, 4)] * 3)
    assert len(heap) == 10
    assert _drain(heap) == [(4, 4, 4)] * 3 + [(5, 5, 5)] * 7


def test_ties_on_time_break_on_ledger_then_entry(heap_cls: Any) -> None:
    triples = [(10, 3, 0), (10, 1, 5), (10, 2, 0), (10, 1, 2), (10, 1, 9), (10, 0, 100)]
    heap = _filled(heap_cls, triples)
    assert heap.peek() == (10, 0, 100)
    assert _drain(heap) == [
        (10, 0, 100),
        (10, 1, 2),
        (10, 1, 5),
        (10, 1, 9),
        (10, 2, 0),
        (10, 3, 0),
    ]


def test_ties_on_time_and_ledger_break_on_entry(heap_cls: Any) -> None:
    entries = [8, 3, 5, 0, 9, 1, 7, 2, 6, 4]
    heap = _filled(heap_cls, [(1, 1, e) for e in entries])
    assert _drain(heap) == [(1, 1, e) for e in range(10)]


def test_time_dominates_ledger_and_entry(heap_cls: Any) -> None:
    heap = _filled(heap_cls, [(2, 0, 0), (1, 99, 99), (3, -5, -5), (1, 100, 0)])
    assert _drain(heap) == [(1, 99, 99), (1, 100, 0), (2, 0, 0), (3, -5, -5)]


def test_many_ties_small_domain(heap_cls: Any) -> None:
    rng = random.Random(7)
    triples = [(rng.randrange(3), rng.randrange(3), rng.randrange(3)) for _ in range(500)]
    heap = _filled(heap_cls, triples)
    assert _contents(heap) == sorted(triples)
    assert _drain(heap) == sorted(triples)


# --- extreme values ----------------------------------------------------------------------------


def test_extreme_values(heap_cls: Any) -> None:
    triples = [
        (I64_MAX, I64_MAX, I64_MAX),
        (I64_MIN, I64_MIN, I64_MIN),
        (0, 0, 0),
        (-1, 5, 5),
        (-(2**40), I64_MAX, I64_MIN),
        (I64_MIN, I64_MAX, 0),
        (I64_MIN, I64_MIN, I64_MAX),
        (I64_MAX, I64_MIN, I64_MIN),
        (-1, -1, -1),
    ]
    heap = _filled(heap_cls, triples)
    assert heap.peek() == (I64_MIN, I64_MIN, I64_MIN)
    assert _contents(heap) == sorted(triples)
    assert _drain(heap) == sorted(triples)


def test_negative_times_come_first(heap_cls: Any) -> None:
    heap = _filled(heap_cls, [(0, 0, 0), (-5, 0, 0), (3, 0, 0), (-1, 0, 0), (-1000, 0, 0)])
    assert _drain(heap) == [(-1000, 0, 0), (-5, 0, 0), (-1, 0, 0), (0, 0, 0), (3, 0, 0)]


def test_extreme_values_through_pop_due_and_push_many(heap_cls: Any) -> None:
    triples = [(I64_MAX, 1, 1), (I64_MIN, 2, 2), (-7, I64_MIN, I64_MAX), (I64_MAX, 0, I64_MIN)]
    heap = heap_cls()
    heap.push_many(*_columns(triples))
    heap._check()
    assert _contents(heap) == sorted(triples)
    out = heap.pop_due(-7, 10)
    heap._check()
    assert _rows(out) == [(I64_MIN, 2, 2), (-7, I64_MIN, I64_MAX)]
    out = heap.pop_due(I64_MAX, 10)
    heap._check()
    assert _rows(out) == [(I64_MAX, 0, I64_MIN), (I64_MAX, 1, 1)]
    assert len(heap) == 0


# --- argument errors ---------------------------------------------------------------------------


@pytest.mark.parametrize("bad", [1.5, "x", None, 2.0, b"1", [1]])
@pytest.mark.parametrize("slot", [0, 1, 2])
def test_push_rejects_non_ints(heap_cls: Any, slot: int, bad: object) -> None:
    heap = _filled(heap_cls, [(3, 3, 3), (1, 1, 1)])
    before = _contents(heap)
    args: list[object] = [2, 2, 2]
    args[slot] = bad
    with pytest.raises(TypeError):
        heap.push(*args)
    heap._check()
    assert len(heap) == 2
    assert heap.peek() == (1, 1, 1)
    assert _contents(heap) == before


@pytest.mark.parametrize("bad", [2**63, -(2**63) - 1, 2**64, -(2**100)])
@pytest.mark.parametrize("slot", [0, 1, 2])
def test_push_rejects_out_of_int64(heap_cls: Any, slot: int, bad: int) -> None:
    heap = _filled(heap_cls, [(3, 3, 3), (1, 1, 1)])
    before = _contents(heap)
    args: list[object] = [0, 0, 0]
    args[slot] = bad
    with pytest.raises(OverflowError):
        heap.push(*args)
    heap._check()
    assert len(heap) == 2
    assert heap.peek() == (1, 1, 1)
    assert _contents(heap) == before


def test_push_accepts_int64_bounds_exactly(heap_cls: Any) -> None:
    heap = heap_cls()
    heap.push(I64_MAX, I64_MIN, I64_MAX)
    heap._check()
    assert heap.pop() == (I64_MAX, I64_MIN, I64_MAX)


@pytest.mark.parametrize(
    "make",
    [np.int64, np.int32, np.int16, np.int8, np.uint8, np.uint32, np.uint64, np.intp],
)
def test_push_accepts_numpy_int_scalars(heap_cls: Any, make: Any) -> None:
    heap = heap_cls()
    heap.push(make(7), make(2), make(1))
    heap.push(make(3), make(4), make(5))
    heap._check()
    head = heap.peek()
    assert head == (3, 4, 5)
    assert [type(x) for x in head] == [int, int, int]
    assert _drain(heap) == [(3, 4, 5), (7, 2, 1)]


def test_push_numpy_scalar_extremes(heap_cls: Any) -> None:
    heap = heap_cls()
    heap.push(np.int64(I64_MIN), np.int64(I64_MAX), np.int64(-1))
    heap._check()
    assert heap.peek() == (I64_MIN, I64_MAX, -1)
    with pytest.raises(OverflowError):
        heap.push(np.uint64(2**64 - 1), 0, 0)
    with pytest.raises(TypeError):
        heap.push(np.float64(1.0), 0, 0)
    heap._check()
    assert len(heap) == 1


def test_pop_due_and_remove_reject_non_ints(heap_cls: Any) -> None:
    heap = _filled(heap_cls, [(1, 1, 1)])
    args: tuple[object, object]
    for args in [(1.5, 1), ("x", 1), (None, 1), (1, 1.0), (1, None)]:
        with pytest.raises(TypeError):
            heap.pop_due(*args)
    for args in [(1.0, 1), (1, "x"), (None, 1)]:
        with pytest.raises(TypeError):
            heap.remove(*args)
    with pytest.raises(OverflowError):
        heap.pop_due(2**63, 1)
    with pytest.raises(OverflowError):
        heap.remove(1, 2**63)
    heap._check()
    assert _contents(heap) == [(1, 1, 1)]


# --- pop_due -----------------------------------------------------------------------------------


def test_pop_due_respects_cutoff(heap_cls: Any) -> None:
    triples = [(5, 0, 0), (1, 2, 2), (3, 1, 1), (3, 0, 4), (8, 0, 0), (3, 0, 1), (6, 6, 6)]
    heap = _filled(heap_cls, triples)
    out = heap.pop_due(3, 100)
    heap._check()
    _assert_int64_result(out, 4)
    assert _rows(out) == [(1, 2, 2), (3, 0, 1), (3, 0, 4), (3, 1, 1)]
    assert _contents(heap) == [(5, 0, 0), (6, 6, 6), (8, 0, 0)]
    assert heap.peek() == (5, 0, 0)
    # Nothing due below the head: no change.
    out = heap.pop_due(4, 100)
    heap._check()
    _assert_int64_result(out, 0)
    assert len(heap) == 3


def test_pop_due_respects_max_n(heap_cls: Any) -> None:
    triples = [(t, t % 3, t) for t in range(20)]
    heap = _filled(heap_cls, triples)
    out = heap.pop_due(100, 5)
    heap._check()
    _assert_int64_result(out, 5)
    assert _rows(out) == sorted(triples)[:5]
    assert len(heap) == 15
    out = heap.pop_due(9, 100)
    heap._check()
    assert _rows(out) == sorted(triples)[5:10]
    assert _contents(heap) == sorted(triples)[10:]


@pytest.mark.parametrize("max_n", [0, -1, -(2**63)])
def test_pop_due_non_positive_max_n_is_empty(heap_cls: Any, max_n: int) -> None:
    heap = _filled(heap_cls, [(1, 1, 1), (0, 0, 0)])
    out = heap.pop_due(I64_MAX, max_n)
    heap._check()
    _assert_int64_result(out, 0)
    assert len(heap) == 2


def test_pop_due_cutoff_below_everything(heap_cls: Any) -> None:
    heap = _filled(heap_cls, [(0, 0, 0), (5, 5, 5)])
    out = heap.pop_due(-1, 10)
    _assert_int64_result(out, 0)
    out = heap.pop_due(I64_MIN, 10)
    _assert_int64_result(out, 0)
    heap._check()
    assert _contents(heap) == [(0, 0, 0), (5, 5, 5)]


def test_pop_due_max_int_cutoff_pops_everything(heap_cls: Any) -> None:
    rng = random.Random(3)
    triples = [(rng.randrange(-50, 50), rng.randrange(4), rng.randrange(4)) for _ in range(300)]
    triples += [(I64_MAX, 0, 0), (I64_MIN, 0, 0)]
    heap = _filled(heap_cls, triples)
    out = heap.pop_due(I64_MAX, I64_MAX)
    heap._check()
    _assert_int64_result(out, len(triples))
    assert _rows(out) == sorted(triples)
    assert not heap


def test_pop_due_with_ties_at_cutoff(heap_cls: Any) -> None:
    heap = _filled(heap_cls, [(2, 1, 1)] * 4 + [(2, 0, 0)] * 3 + [(3, 0, 0)])
    out = heap.pop_due(2, 5)
    heap._check()
    assert _rows(out) == [(2, 0, 0)] * 3 + [(2, 1, 1)] * 2
    assert _contents(heap) == [(2, 1, 1)] * 2 + [(3, 0, 0)]


def test_pop_due_arrays_are_independent(heap_cls: Any) -> None:
    heap = _filled(heap_cls, [(1, 2, 3), (4, 5, 6)])
    t, led, e = heap.pop_due(10, 10)
    t[:] = 0
    assert led.tolist() == [2, 5]
    assert e.tolist() == [3, 6]
    assert len(heap) == 0


# --- push_many ---------------------------------------------------------------------------------


def test_push_many_into_empty_heap(heap_cls: Any) -> None:
    rng = random.Random(11)
    batch = [(rng.randrange(5), rng.randrange(3), rng.randrange(3)) for _ in range(200)]
    heap = heap_cls()
    heap.push_many(*_columns(batch))
    heap._check()
    assert len(heap) == 200
    assert _contents(heap) == sorted(batch)
    assert _drain(heap) == sorted(batch)


@pytest.mark.parametrize(
    ("existing", "batch_size"),
    [
        (50, 3),  # small batch: sifted in one by one
        (50, 49),  # just below the switch
        (50, 50),  # batch as large as the heap: append + heapify
        (50, 51),
        (3, 200),  # much larger batch
        (1, 1),
    ],
)
def test_push_many_both_paths(heap_cls: Any, existing: int, batch_size: int) -> None:
    rng = random.Random(existing * 1000 + batch_size)
    first = [(rng.randrange(10), rng.randrange(3), rng.randrange(3)) for _ in range(existing)]
    batch = [(rng.randrange(-3, 13), rng.randrange(3), rng.randrange(3)) for _ in range(batch_size)]
    heap = _filled(heap_cls, first)
    heap.push_many(*_columns(batch))
    heap._check()
    assert len(heap) == existing + batch_size
    assert heap.peek() == min(first + batch)
    assert _contents(heap) == sorted(first + batch)
    assert _drain(heap) == sorted(first + batch)


def test_push_many_repeated_batches(heap_cls: Any) -> None:
    rng = random.Random(5)
    heap = heap_cls()
    model: list[Triple] = []
    for size in [0, 1, 1, 5, 3, 40, 2, 100, 7, 0, 300, 1]:
        batch = [(rng.randrange(8), rng.randrange(3), rng.randrange(3)) for _ in range(size)]
        heap.push_many(*_columns(batch))
        heap._check()
        model.extend(batch)
        assert len(heap) == len(model)
        for _ in range(min(len(model), size // 2)):
            model.sort()
            assert heap.pop() == model.pop(0)
            heap._check()
    assert _drain(heap) == sorted(model)


def test_push_many_empty_batch_is_noop(heap_cls: Any) -> None:
    heap = _filled(heap_cls, [(2, 2, 2), (1, 1, 1)])
    empty = np.empty(0, dtype=np.int64)
    heap.push_many(empty, empty, empty)
    heap._check()
    assert _contents(heap) == [(1, 1, 1), (2, 2, 2)]
    fresh = heap_cls()
    fresh.push_many(empty, empty, empty)
    fresh._check()
    assert len(fresh) == 0


def test_push_many_accepts_strided_and_readonly_arrays(heap_cls: Any) -> None:
    base = np.arange(20, dtype=np.int64)
    readonly = base.copy()
    readonly.flags.writeable = False
    heap = heap_cls()
    heap.push_many(base[::-2], base[::-2], readonly[::2])
    heap._check()
    expected = sorted(
        zip(base[::-2].tolist(), base[::-2].tolist(), readonly[::2].tolist(), strict=True)
    )
    assert _contents(heap) == expected


@pytest.mark.parametrize("short", [0, 1, 2])
@pytest.mark.parametrize("existing", [0, 5])
def test_push_many_length_mismatch_leaves_heap_unchanged(
    heap_cls: Any, short: int, existing: int
) -> None:
    first = [(i, 0, i) for i in range(existing)]
    heap = _filled(heap_cls, first)
    columns = [np.arange(4, dtype=np.int64) for _ in range(3)]
    columns[short] = columns[short][:3]
    with pytest.raises(ValueError):
        heap.push_many(*columns)
    heap._check()
    assert len(heap) == existing
    assert _contents(heap) == first


def test_push_many_wrong_dtype_leaves_heap_unchanged(heap_cls: Any) -> None:
    heap = _filled(heap_cls, [(1, 1, 1)])
    good = np.arange(3, dtype=np.int64)
    bad = np.arange(3, dtype=np.int32)
    with pytest.raises(ValueError):
        heap.push_many(good, bad, good)
    with pytest.raises(ValueError):
        heap.push_many(good.astype(np.float64), good, good)
    heap._check()
    assert _contents(heap) == [(1, 1, 1)]


# --- remove ------------------------------------------------------------------------------------


def test_remove_every_node_at_position(heap_cls: Any) -> None:
    triples = [(5, 1, 1), (1, 1, 1), (3, 1, 2), (1, 1, 1), (9, 2, 1), (0, 1, 1), (4, 0, 0)]
    heap = _filled(heap_cls, triples)
    assert heap.remove(1, 1) == 4
    heap._check()
    assert len(heap) == 3
    assert _contents(heap) == [(3, 1, 2), (4, 0, 0), (9, 2, 1)]
    assert heap.peek() == (3, 1, 2)
    assert heap.remove(1, 1) == 0
    heap._check()
    assert heap.remove(7, 7) == 0
    heap._check()
    assert len(heap) == 3
    assert _drain(heap) == [(3, 1, 2), (4, 0, 0), (9, 2, 1)]


def test_remove_head_and_everything(heap_cls: Any) -> None:
    heap = _filled(heap_cls, [(1, 0, 0), (2, 0, 0), (3, 0, 0)])
    assert heap.remove(0, 0) == 3
    heap._check()
    assert not heap
    with pytest.raises(IndexError):
        heap.peek()
    heap.push(1, 2, 3)
    heap._check()
    assert heap.pop() == (1, 2, 3)


def test_remove_on_large_heap_keeps_order(heap_cls: Any) -> None:
    rng = random.Random(17)
    triples = [(rng.randrange(100), rng.randrange(5), rng.randrange(5)) for _ in range(3000)]
    heap = heap_cls()
    heap.push_many(*_columns(triples))
    heap._check()
    for ledger, entry in [(0, 0), (3, 4), (4, 4), (9, 9)]:
        expected = sum(1 for t in triples if t[1:] == (ledger, entry))
        assert heap.remove(ledger, entry) == expected
        heap._check()
        triples = [t for t in triples if t[1:] != (ledger, entry)]
        assert len(heap) == len(triples)
    assert _drain(heap) == sorted(triples)


def test_remove_with_extreme_position(heap_cls: Any) -> None:
    heap = _filled(heap_cls, [(0, I64_MIN, I64_MAX), (1, I64_MAX, I64_MIN), (2, I64_MIN, I64_MAX)])
    assert heap.remove(I64_MIN, I64_MAX) == 2
    heap._check()
    assert _contents(heap) == [(1, I64_MAX, I64_MIN)]


# --- clear, nbytes, to_arrays ------------------------------------------------------------------


def test_clear(heap_cls: Any) -> None:
    heap = _filled(heap_cls, [(i, i, i) for i in range(100)])
    heap.clear()
    heap._check()
    assert len(heap) == 0
    assert not heap
    with pytest.raises(IndexError):
        heap.pop()
    assert _contents(heap) == []
    heap.clear()  # idempotent
    heap._check()
    heap.push(3, 2, 1)
    heap._check()
    assert heap.peek() == (3, 2, 1)
    assert len(heap) == 1


def test_nbytes_grows_with_pushes_and_clear_brings_it_down(heap_cls: Any) -> None:
    heap = heap_cls()
    empty_bytes = heap.nbytes
    assert isinstance(empty_bytes, int)
    assert empty_bytes >= 0
    heap.push(1, 1, 1)
    assert heap.nbytes > empty_bytes
    n = 20_000
    ts = np.arange(n, dtype=np.int64)
    heap.push_many(ts, ts, ts)
    heap._check()
    peak = heap.nbytes
    # at least 3 x 8 bytes per node, whatever the representation
    assert peak >= 24 * n
    heap.clear()
    heap._check()
    assert 0 <= heap.nbytes < peak
    assert heap.nbytes <= empty_bytes


def test_nbytes_shrinks_after_popping_most(heap_cls: Any) -> None:
    heap = heap_cls()
    n = 20_000
    ts = np.arange(n, dtype=np.int64)
    heap.push_many(ts, ts, ts)
    peak = heap.nbytes
    heap.pop_due(n - 11, n)
    heap._check()
    assert len(heap) == 10
    assert 0 <= heap.nbytes < peak


def test_to_arrays_is_a_copy(heap_cls: Any) -> None:
    heap = _filled(heap_cls, [(3, 0, 0), (1, 0, 0), (2, 0, 0)])
    t, led, e = heap.to_arrays()
    assert sorted(t.tolist()) == [1, 2, 3]
    t[:] = 99
    led[:] = 99
    e[:] = 99
    heap._check()
    assert _drain(heap) == [(1, 0, 0), (2, 0, 0), (3, 0, 0)]


# --- randomized cross-check --------------------------------------------------------------------


def test_random_push_pop_matches_sorted(heap_cls: Any) -> None:
    """100k random push/pop operations checked against a sorted list."""
    rng = random.Random(20240601)
    heap = heap_cls()
    model: list[Triple] = []  # kept sorted
    for step in range(100_000):
        if model and rng.random() < 0.45:
            assert heap.pop() == model.pop(0)
        else:
            r = rng.random()
            if r < 0.01:
                t = rng.choice((I64_MIN, I64_MAX, -1))
            elif r < 0.5:
                t = rng.randrange(8)  # many ties
            else:
                t = rng.randrange(-(2**40), 2**40)
            triple = (t, rng.randrange(4), rng.randrange(4))
            heap.push(*triple)
            bisect.insort(model, triple)
        if step % 10_000 == 0:
            heap._check()
            assert len(heap) == len(model)
            if model:
                assert heap.peek() == model[0]
    heap._check()
    assert len(heap) == len(model)
    assert _contents(heap) == model
    assert _drain(heap) == model


def test_push_many_rejects_none_and_lists(heap_cls: Any) -> None:
    heap = heap_cls()
    ok = np.zeros(1, dtype=np.int64)
    for bad in [(None, ok, ok), (ok, None, ok), (ok, ok, None), ([1], [1], [1])]:
        with pytest.raises(TypeError):
            heap.push_many(*bad)
    assert len(heap) == 0


def test_core_add_many_rejects_none(core_cls: Any) -> None:
    core = core_cls(1000, False, 0)
    ok = np.zeros(1, dtype=np.int64)
    for bad in [(None, ok, ok), (ok, None, ok), (ok, ok, None)]:
        with pytest.raises(TypeError):
            core.add_many(*bad, 0)
    assert len(core) == 0
