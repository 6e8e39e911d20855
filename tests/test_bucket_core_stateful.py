"""Differential stateful test: native BucketCore vs pure BucketCore, driven like DelayIndex does.

Both twins get the same operations: adds (with seals whenever ``add`` asks for one), batch adds,
polls, sealed sources cut to segments with placeholders and "loaded" later, source removal,
mark-delete, restore from bitmaps, eviction of durable cancels (and their restore when an add or
reschedule answers ``ADD_NEED_OVERRIDES``), and queries. Every result must be equal and both must
pass ``_check`` after every step. A plain model (position -> deliver time) checks what the contract
fixes independently of the twins: nothing is delivered early or twice, a position is delivered only
while tracked, and an add at or below the mark (the highest ``untrack_upto`` since the last
``clear``) returns 4 (acknowledged: not tracked, not delivered) whatever its time.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

import numpy as np
import pytest
from hypothesis import event, given
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule
from pyroaring import BitMap

from delayindex import _impl
from delayindex.model import ADD_NEED_OVERRIDES, Position
from delayindex.storage._overrides import Overrides

_native = _impl.native_module_or_none()
assert _native is not None, "the native extension must be built for the differential test"
native_module: ModuleType = _native  # declared narrowed: functions see the declared type

ledgers = st.integers(0, 6)
entries = st.integers(0, 4)
times = st.integers(-2, 60)


class BucketCoreMachine(RuleBasedStateMachine):
    """Native and pure BucketCore in lock step."""

    def __init__(self) -> None:
        super().__init__()
        self.cores: list[Any] = []
        self.now = 0
        self.next_sid = 0
        # sid -> remaining segments [(times, ledgers, entries)] not yet "loaded"
        self.pending: dict[int, list[tuple[np.ndarray, np.ndarray, np.ndarray]]] = {}
        # sid -> every segment of a sealed, not yet settled bucket
        self.segments: dict[int, list[tuple[np.ndarray, np.ndarray, np.ndarray]]] = {}
        self.tracked: dict[tuple[int, int], int] = {}
        self.mark = (-1, -1)
        self.cutoff = 0
        self.cancelled: set[tuple[int, int]] = set()
        self.moved: dict[tuple[int, int], int] = {}
        # Cancels evicted from the cores (the driver's durable record holds them) and the
        # sealed ranges registered so far (what eviction covers).
        self.evicted: set[tuple[int, int]] = set()
        self.sealed: list[tuple[int, int]] = []

    @initialize(
        tick=st.integers(0, 5),
        strict=st.booleans(),
        lookahead=st.integers(0, 3),
        min_count=st.integers(1, 4),
        restore_whole=st.booleans(),
    )
    def build(
        self, tick: int, strict: bool, lookahead: int, min_count: int, restore_whole: bool
    ) -> None:
        self.restore_whole = restore_whole  # else one span at a time, as the driver does
        self.cores = [
            native_module.BucketCore(tick, strict, lookahead, min_count),
            _impl.PureBucketCore(tick, strict, lookahead, min_count),
        ]
        self.tick, self.strict = tick, strict

    def _cutoff(self) -> int:
        return self.now if self.strict else self.now + self.tick

    def _both(self, method: str, *args: Any) -> Any:
        results = [getattr(core, method)(*args) for core in self.cores]
        a, b = results
        if isinstance(a, np.ndarray):
            assert np.array_equal(a, b), (method, args, a, b)
        elif isinstance(a, tuple) and a and isinstance(a[0], np.ndarray):
            assert all(
                np.array_equal(x, y) if isinstance(x, np.ndarray) else x == y
                for x, y in zip(a, b, strict=True)
            ), (method, args, a, b)
        else:
            assert a == b, (method, args, a, b)
        return a

    def _seal(self, segment_size: int) -> None:
        sid = self.next_sid
        self.next_sid += 1
        # The copies come in heap-array order, which differs between a 4-ary and a binary
        # heap: compare them sorted, as the snapshot builder sorts them.
        sealed = []
        for core in self.cores:
            t, lg, en, start, end = core.seal(sid)
            order = np.lexsort((en, lg, t))
            sealed.append((t[order], lg[order], en[order], start, end))
        (t, lg, en, start, end), other = sealed
        assert all(np.array_equal(x, y) for x, y in zip(sealed[0][:3], other[:3], strict=True))
        assert (start, end) == other[3:]
        if len(t) == 0:
            self._both("remove_source", sid)
            return
        self._both("add_range", start, end)
        self.sealed.append((start, end))
        self.segments[sid] = [
            (t[i : i + segment_size], lg[i : i + segment_size], en[i : i + segment_size])
            for i in range(0, len(t), segment_size)
        ]
        self.pending[sid] = []

    @rule(data=st.data())
    def settle(self, data: st.DataObject) -> None:
        """A sealed bucket became durable: keep its current segment, placeholder the rest."""
        if not self.segments:
            return
        sid = data.draw(st.sampled_from(sorted(self.segments)))
        segments = self.segments.pop(sid)
        if not self.cores[0].has_source(sid):
            return
        head = self._both("source_head", sid)
        if head is None:
            return
        lasts = [(int(s[0][-1]), int(s[1][-1]), int(s[2][-1])) for s in segments]
        k = next(i for i, last in enumerate(lasts) if last >= head)
        rest = segments[k + 1 :]
        next_time = int(rest[0][0][0]) if rest else -1
        self._both("cut_source", sid, *lasts[k], next_time)
        self.pending[sid] = rest

    def _in_evicted_range(self, ledger: int) -> bool:
        return any(a <= ledger <= b for a, b in self._both("evicted_ranges"))

    def _restore_if_needed(self, code: int, pos: tuple[int, int], tracked_matters: bool) -> bool:
        """On ADD_NEED_OVERRIDES (checked against the model): hand the evicted cancels back."""
        in_memory = pos in self.tracked or pos in self.cancelled - self.evicted
        expected = (  # an add answers from memory first (tracked, or a cancel kept there)
            pos > self.mark
            and self._in_evicted_range(pos[0])
            and not (tracked_matters and in_memory)
        )
        assert (code == ADD_NEED_OVERRIDES) == expected, (pos, code)
        if code != ADD_NEED_OVERRIDES:
            return False
        # A stale folded cancel of a position rescheduled since comes back too: skipped.
        stale = {p for p in self.moved if p > self.mark and self._in_evicted_range(p[0])}
        if stale:
            event("a stale folded cancel is skipped")
        ordered = sorted(self.evicted | stale)
        ls, es = (np.array([p[i] for p in ordered], dtype=np.int64) for i in (0, 1))
        if self.restore_whole:
            event("evicted cancels restored")
            assert self._both("restore_evicted", ls, es) == len(self.evicted)
            assert self._both("evicted_ranges") == []
            self.evicted.clear()
            return True
        # The driver's way: only the span of the add's ledger (here its evicted range, cut
        # down to the ledger and one neighbour each side); the rest stays evicted.
        start, end = next((a, b) for a, b in self._both("evicted_ranges") if a <= pos[0] <= b)
        start, end = max(start, pos[0] - 1), min(end, pos[0] + 1)
        before = {x for a, b in self._both("evicted_ranges") for x in range(a, b + 1)}
        back = {p for p in self.evicted if start <= p[0] <= end}
        assert self._both("restore_evicted", ls, es, start, end) == len(back)
        after = {x for a, b in self._both("evicted_ranges") for x in range(a, b + 1)}
        assert after == before - set(range(start, end + 1))
        event("evicted cancels of one span restored" + (" (others stay)" if after else ""))
        self.evicted -= back
        return True

    @rule()
    def evict(self) -> None:
        """The driver committed the overrides: the cancels of sealed ranges leave memory."""
        n = self._both("evict_cancels")
        leaving = {
            p for p in self.cancelled - self.evicted if any(a <= p[0] <= b for a, b in self.sealed)
        }
        assert n == len(leaving)
        if n:
            event("cancels evicted")
        self.evicted |= leaving

    @rule(data=st.data(), drop=st.booleans())
    def fold(self, data: st.DataObject, drop: bool) -> None:
        """A merge folded a sealed range's cancels into its bucket: they leave memory (drop)
        or stay (a cancel came meanwhile); either way the range is evicted."""
        if not self.sealed:
            return
        start, end = data.draw(st.sampled_from(self.sealed))
        n = self._both("evict_range", start, end, drop)
        leaving = {p for p in self.cancelled - self.evicted if start <= p[0] <= end}
        assert n == (len(leaving) if drop else 0)
        if drop:
            self.evicted |= leaving
        event("range folded" + (" (cancels dropped)" if n else ""))

    @rule(data=st.data())
    def cancel_sealed_then_evict(self, data: st.DataObject) -> None:
        """A cancel of a sealed bucket's message, then a flush: the driver evicts."""
        sealed = sorted(p for p in self.tracked if any(a <= p[0] <= b for a, b in self.sealed))
        if sealed:
            self.cancel(*data.draw(st.sampled_from(sealed)))
        self.evict()

    @rule(data=st.data(), t=times)
    def replay_cancelled(self, data: st.DataObject, t: int) -> None:
        """The dispatcher's replay re-adds a cancelled position (its cancel often evicted)."""
        if self.cancelled:
            ledger, entry = data.draw(st.sampled_from(sorted(self.cancelled)))
            self.add(ledger, entry, t, 1)

    @rule(ledger=ledgers, entry=entries, t=times, segment_size=st.integers(1, 3))
    def add(self, ledger: int, entry: int, t: int, segment_size: int) -> None:
        code = self._both("add", ledger, entry, t, self.now)
        if self._restore_if_needed(code, (ledger, entry), tracked_matters=True):
            code = self._both("add", ledger, entry, t, self.now)
        if code == 3:
            self._seal(segment_size)
            code = self._both("add", ledger, entry, t, self.now)
            assert code != 3
        self._apply_add((ledger, entry), t, code)

    def _apply_add(self, pos: tuple[int, int], t: int, code: int) -> None:
        assert (code == 4) == (pos <= self.mark), (pos, t, code)
        if code == 4:
            return
        assert (code == 5) == (pos in self.cancelled), (pos, code)
        if code == 5:
            assert pos not in self.tracked
            return
        t = self.moved.get(pos, t)
        if code == 0:
            assert t < 0 or t <= self._cutoff()
            self.tracked.pop(pos, None)
        elif code == 1:
            assert pos not in self.tracked
            self.tracked[pos] = t
        else:
            assert code == 2 and pos in self.tracked

    @rule(ledger=ledgers, entry=entries)
    def cancel(self, ledger: int, entry: int) -> None:
        pos = (ledger, entry)
        assert self._both("cancel", ledger, entry) == (pos in self.tracked)
        if pos in self.tracked:
            del self.tracked[pos]
            self.cancelled.add(pos)
            self.moved.pop(pos, None)

    @rule(batch=st.lists(st.tuples(ledgers, entries), max_size=5))
    def cancel_many(self, batch: list[tuple[int, int]]) -> None:
        ls, es = (np.array([b[i] for b in batch], dtype=np.int64) for i in (0, 1))
        got = self._both("cancel_many", ls, es).tolist()
        want = []
        for pos in batch:
            want.append(pos in self.tracked)
            if pos in self.tracked:
                del self.tracked[pos]
                self.cancelled.add(pos)
                self.moved.pop(pos, None)
        assert got == want

    @rule(ledger=ledgers, entry=entries, t=times, segment_size=st.integers(1, 3))
    def reschedule(self, ledger: int, entry: int, t: int, segment_size: int) -> None:
        pos = (ledger, entry)
        code = self._both("reschedule", ledger, entry, t, self.now)
        if self._restore_if_needed(code, pos, tracked_matters=False):
            code = self._both("reschedule", ledger, entry, t, self.now)
        if code == 3:
            self._seal(segment_size)
            code = self._both("reschedule", ledger, entry, t, self.now)
            assert code != 3
        if pos <= self.mark:
            assert code == 4
            return
        self.cancelled.discard(pos)
        self.tracked.pop(pos, None)
        self.moved[pos] = t
        assert code in (0, 1), code
        self._apply_add(pos, t, code)

    @rule(
        batch=st.lists(st.tuples(ledgers, entries, times), min_size=1, max_size=6),
        segment_size=st.integers(1, 3),
    )
    def add_many(self, batch: list[tuple[int, int, int]], segment_size: int) -> None:
        ls, es, ts = (np.array(col, dtype=np.int64) for col in zip(*batch, strict=True))
        outs = [np.zeros(len(ls), dtype=np.bool_) for _ in self.cores]
        start = 0
        while True:
            stops = [
                core.add_many(ls, es, ts, self.now, out, start)
                for core, out in zip(self.cores, outs, strict=True)
            ]
            assert stops[0] == stops[1]
            for i in range(start, stops[0]):
                key = (int(ls[i]), int(es[i]))
                if key <= self.mark or key in self.cancelled:
                    assert outs[0][i], f"{key} is acknowledged or cancelled"
                    assert key not in self.tracked
                elif not outs[0][i]:
                    self.tracked.pop(key, None)
                else:
                    self.tracked.setdefault(key, self.moved.get(key, int(ts[i])))
            if stops[0] >= len(ls):
                break
            stop = stops[0]
            need = self._both("needs_restore", int(ls[stop]), int(es[stop]))
            if not self._restore_if_needed(
                ADD_NEED_OVERRIDES if need else 3, (int(ls[stop]), int(es[stop])), True
            ):
                self._seal(segment_size)
            start = stop
        assert np.array_equal(outs[0], outs[1])

    @rule(dt=st.integers(0, 15))
    def advance(self, dt: int) -> None:
        self.now += dt

    @rule(n=st.integers(-1, 6))
    def poll(self, n: int) -> None:
        got = self._both("poll", n, self.now)
        assert got == sorted(got)
        assert len(got) <= max(n, 0)
        for pos in got:
            key = (pos.ledger_id, pos.entry_id)
            assert key in self.tracked, f"{key} delivered but not tracked"
            assert self.tracked.pop(key) <= self._cutoff(), f"{key} delivered early"
        self._after_poll()

    @rule(n=st.integers(-1, 6), m=st.integers(-1, 6))
    def poll_then_merge(self, n: int, m: int) -> None:
        """As DelayIndex.poll around a load: a second poll merged into the first's result."""
        first = self._both("poll", n, self.now)
        if self.cores[0].load_needed >= 0:
            self._after_poll()
        got = self._both("poll", m, self.now, first)
        assert got == sorted(got) and set(first) <= set(got)
        assert len(got) <= max(n, 0) + max(m, 0) and all(type(p) is Position for p in got)
        for pos in got:
            key = (pos.ledger_id, pos.entry_id)
            assert key in self.tracked, f"{key} delivered but not tracked"
            assert self.tracked.pop(key) <= self._cutoff(), f"{key} delivered early"
        self._after_poll()

    @rule(n=st.integers(-1, 6))
    def poll_keys(self, n: int) -> None:
        times, ledgers, entries = self._both("poll_keys", n, self.now)
        assert len(times) <= max(n, 0)
        keys = list(zip(times.tolist(), ledgers.tolist(), entries.tolist(), strict=True))
        assert keys == sorted(keys), "not in selection order"
        for time, ledger, entry in keys:
            assert self.tracked.pop((ledger, entry), None) == time, f"{(ledger, entry)} untracked"
            assert time <= self._cutoff(), f"{(ledger, entry)} delivered early"
        self._after_poll()

    def _after_poll(self) -> None:
        sid = self.cores[0].load_needed
        assert sid == self.cores[1].load_needed
        if sid >= 0:
            self._load(sid)

    def _load(self, sid: int) -> None:
        rest = self.pending[sid]
        seg, rest = rest[0], rest[1:]
        next_time = int(rest[0][0][0]) if rest else -1
        self._both("set_source", sid, *seg, next_time)
        self.pending[sid] = rest

    @rule()
    def take_exhausted(self) -> None:
        for sid in self._both("take_exhausted"):
            assert not self.pending.get(sid)

    @rule(data=st.data())
    def remove_source(self, data: st.DataObject) -> None:
        sids = self.cores[0].source_ids()
        assert sids == self.cores[1].source_ids()
        if not sids:
            return
        sid = data.draw(st.sampled_from(sids))
        self._both("remove_source", sid)
        # Its indexes stay tracked but can no longer be delivered (a trim would untrack them).
        self.pending.pop(sid, None)
        self.segments.pop(sid, None)

    @rule(ledger=ledgers, entry=entries)
    def mark_delete(self, ledger: int, entry: int) -> None:
        self._both("untrack_upto", ledger, entry)
        self.mark = max(self.mark, (ledger, entry))
        for key in [k for k in self.tracked if k <= (ledger, entry)]:
            del self.tracked[key]
        self.cancelled = {k for k in self.cancelled if k > (ledger, entry)}
        self.evicted = {k for k in self.evicted if k > (ledger, entry)}
        self.moved = {k: t for k, t in self.moved.items() if k > (ledger, entry)}

    @rule(ledger=ledgers, entry=entries)
    def count_upto(self, ledger: int, entry: int) -> None:
        want = sum(1 for key in self.tracked if key <= (ledger, entry))
        assert self._both("count_upto", ledger, entry) == want

    @rule()
    def clear(self) -> None:
        """A cursor rewind: everything goes, the mark too (adds below it are tracked again)."""
        self._both("clear")
        self.tracked.clear()
        self.pending.clear()
        self.segments.clear()
        self.mark = (-1, -1)
        self.cancelled.clear()
        self.evicted.clear()
        self.sealed.clear()
        self.moved.clear()

    @rule(ledger=ledgers, values=st.lists(entries, max_size=3))
    def restore(self, ledger: int, values: list[int]) -> None:
        # Only positions not yet tracked anywhere: recovery restores into an empty ledger, and
        # before the mark is applied (so never at or below it).
        if any(k[0] == ledger for k in self.tracked) or ledger <= self.mark[0]:
            return
        if any(k[0] == ledger for k in (*self.cancelled, *self.moved)):
            return  # recovery applies the stored overrides after restoring
        self._both("restore", ledger, BitMap(values))
        for entry in values:
            self.tracked[(ledger, entry)] = -(10**9)  # recovered: time unknown to the model

    @rule(ledger=ledgers, entry=entries)
    def queries(self, ledger: int, entry: int) -> None:
        assert self._both("contains", ledger, entry) == ((ledger, entry) in self.tracked)
        self._both("has_due", self.now)
        self._both("next_time")
        self._both("should_pause", self.now)
        self._both("in_sealed_range", ledger)
        self._both(
            "tracked_mask", np.array([ledger], dtype=np.int64), np.array([entry], dtype=np.int64)
        )

    @invariant()
    def same_state(self) -> None:
        if not self.cores:
            return
        for core in self.cores:
            core._check()
        assert len(self.cores[0]) == len(self.cores[1]) == len(self.tracked)
        assert self.cores[0].mutable_range == self.cores[1].mutable_range
        assert self.cores[0].loaded == self.cores[1].loaded
        a, b = self.cores[0].counters(), self.cores[1].counters()
        assert a == b
        cl, ce, ml, me, mt = Overrides.from_arrays(*self._both("override_record")).to_arrays()
        assert set(zip(cl.tolist(), ce.tolist(), strict=True)) == self.cancelled - self.evicted
        assert self.evicted <= self.cancelled
        assert dict(zip(zip(ml.tolist(), me.tolist(), strict=True), mt.tolist(), strict=True)) == (
            self.moved
        )


TestBucketCoreDifferential = BucketCoreMachine.TestCase


def test_seal_moves_the_heap_and_drops_untracked() -> None:
    for cls in (native_module.BucketCore, _impl.PureBucketCore):
        core = cls(0, False, 0, 10)
        for entry, t in [(3, 50), (1, 20), (2, 20), (0, 90)]:
            assert core.add(7, entry, t, 0) == 1
        assert core.add(7, 0, 0, 0) == 0  # due re-add untracks: the seal must drop its node
        times, lg, en, start, end = core.seal(0)
        assert sorted(zip(times.tolist(), en.tolist(), strict=True)) == [(20, 1), (20, 2), (50, 3)]
        assert lg.tolist() == [7, 7, 7] and (start, end) == (7, 7)
        assert core.mutable_range == (-1, -1)
        assert core.source_head(0) == (20, 7, 1) and core.source_remaining(0) == 3
        assert core.cut_source(0, 20, 7, 2, 50) == 2  # settle: segment 1 kept, 2 in storage
        assert core.source_remaining(0) == 2
        assert core.poll(10, 100) == [(7, 1), (7, 2)] and core.load_needed == 0
        core._check()


def test_placeholder_blocks_until_loaded() -> None:
    for cls in (native_module.BucketCore, _impl.PureBucketCore):
        core = cls(0, True, 0, 1)
        core.restore(1, BitMap([0, 1]))
        core.add_range(1, 1)
        core.set_source(0, [10], [1], [0], 15)  # segment 2 starts at t=15, not loaded
        core.add(5, 0, 20, 0)
        assert core.poll(10, 30) == [(1, 0)]
        assert core.load_needed == 0
        core.set_source(0, [15], [1], [1], -1)
        assert core.poll(10, 30) == [(1, 1), (5, 0)]
        assert core.take_exhausted() == [0]
        core._check()


def test_restore_many_twins_agree_and_check_the_offsets() -> None:
    ledgers = np.array([3, 5, 9], dtype=np.int64)
    offsets = np.array([0, 2, 2, 5], dtype=np.int64)
    entries = np.array([1, 7, 0, 4, 4000], dtype=np.uint32)
    for core in (native_module.BucketCore(0, True, 0, 10), _impl.PureBucketCore(0, True, 0, 10)):
        assert core.restore_many(ledgers, offsets, entries) == 5  # ledger 5 gets none
        assert core.restore_many(ledgers, offsets, entries) == 0  # nothing new the second time
        assert [p for p in [(3, 1), (3, 7), (9, 0), (9, 4000), (5, 0)] if core.contains(*p)] == [
            (3, 1),
            (3, 7),
            (9, 0),
            (9, 4000),
        ]
        for bad in ([0, 2, 2], [0, 2, 1, 5], [0, 2, 2, 6], [-1, 2, 2, 5]):
            with pytest.raises(ValueError, match="offsets"):
                core.restore_many(ledgers, np.array(bad, dtype=np.int64), entries)
        assert len(core) == 5


@given(
    tracked=st.lists(st.tuples(st.integers(0, 40), st.integers(0, 300)), max_size=60),
    queried=st.lists(
        st.tuples(st.sampled_from([0, 1, 7, 40, 2**40, 2**62]), st.integers(0, 2**32 - 1)),
        max_size=60,
    ),
    slice_rows=st.integers(1, 7),
)
def test_tracked_mask_order_keeps_the_same_rows(
    tracked: list[tuple[int, int]], queried: list[tuple[int, int]], slice_rows: int
) -> None:
    """Filtering in ``tracked_mask_order``'s order, a slice at a time (as a merge does), keeps
    exactly the rows ``tracked_mask`` keeps in the original order; the pure twin's order is
    position order (its speed-up), the native twin's None (any order does)."""
    rows = tracked[: len(tracked) // 2] + queried  # some tracked, some not
    ledgers = np.array([r[0] for r in rows], dtype=np.int64)
    entries = np.array([r[1] for r in rows], dtype=np.int64)
    for core in (native_module.BucketCore(0, True, 0, 10), _impl.PureBucketCore(0, True, 0, 10)):
        for ledger, entry in tracked:
            core.restore(ledger, BitMap([entry]))
        expected = {rows[i] for i in np.flatnonzero(core.tracked_mask(ledgers, entries))}
        order = core.tracked_mask_order(ledgers, entries)
        if order is None:
            order = np.arange(len(rows))
        assert sorted(order.tolist()) == list(range(len(rows)))
        kept: set[tuple[int, int]] = set()
        for start in range(0, len(rows), slice_rows):
            part = order[start : start + slice_rows]
            mask = core.tracked_mask(ledgers[part], entries[part])
            kept |= {rows[i] for i in part[mask]}
        assert kept == expected
        if isinstance(core, _impl.PureBucketCore):
            assert [rows[i] for i in order] == sorted(rows)
        core._check()
