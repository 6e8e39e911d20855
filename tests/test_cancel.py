"""Cancel, reschedule and browse (API.md "Cancel, reschedule, browse"): the contract, per tracker.

``KINDS`` lists the trackers (InMemoryTracker, DelayIndex with the default and with tiny
buckets, a one-subscription SharedDelayIndex with tiny buckets); ``BROWSE_KINDS`` those with
``pending`` and ``due_histogram`` (all of them). Each test runs on both builds through the suite's
``DELAYINDEX_NO_EXTENSIONS`` switch. The stateful machine at the end runs a tracker against a
plain dict model with cancels and reschedules interleaved with adds, polls, clock moves, clears,
marks and, for DelayIndex, injected storage faults and close/reopen followed by the dispatcher's
replay; ``_check`` runs after every step.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from hypothesis import event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from delayindex import (
    DelayIndex,
    InMemoryTracker,
    ManualClock,
    MemoryStorage,
    Position,
    RecoveryError,
    SharedDelayIndex,
    StorageError,
    TrackerClosedError,
    TrackerConfig,
)
from delayindex.executors import InlineExecutor

T0 = 1_000_000
RETRY_MS = 5  # load_retry_delay_ms and delete_retry_delay_ms: the backoff's first step
MAX_BACKOFF_MS = 64 * RETRY_MS  # the backoff doubles up to 64x
MAX_ATTEMPTS = 4  # storage attempts per operation: this many failures make it fail
CONFIG = TrackerConfig(tick_ms=10, load_retry_delay_ms=RETRY_MS, delete_retry_delay_ms=RETRY_MS)
#: Buckets so small that cancels and reschedules meet sealed, loaded and merged buckets.
TINY = CONFIG.replace(
    min_index_count_per_bucket=2,
    max_indexes_per_segment=2,
    max_time_step_per_segment_ms=50,
    max_num_buckets=2,
)


def _in_memory(clock: ManualClock, storage: Any = None) -> Any:
    return InMemoryTracker(CONFIG, clock=clock)


def _delay_index(clock: ManualClock, storage: Any = None) -> Any:
    store = storage if storage is not None else MemoryStorage()
    # Any: the tests reach the storage through an attribute added here.
    index: Any = DelayIndex.open(store, "cancel", CONFIG, clock=clock, executor=InlineExecutor())
    index.storage = store
    return index


def _delay_index_tiny(clock: ManualClock, storage: Any = None) -> Any:
    store = storage if storage is not None else MemoryStorage()
    # Any: the tests reach the storage through an attribute added here.
    index: Any = DelayIndex.open(store, "cancel", TINY, clock=clock, executor=InlineExecutor())
    index.storage = store
    return index


class _OneSubscription:
    """A shared index with one subscription seen as one tracker: the index's changes (add,
    cancel, reschedule, ...) and the subscription's reads."""

    def __init__(self, shared: SharedDelayIndex, storage: Any) -> None:
        self.shared, self.storage = shared, storage
        self.sub = shared.subscribe("only")
        for name in ("add", "add_many", "cancel", "cancel_many", "reschedule", "flush",
                     "close", "clear", "stats", "pending", "due_histogram"):  # fmt: skip
            setattr(self, name, getattr(shared, name))
        for name in ("poll", "next_delivery_time", "contains", "set_mark_delete"):
            setattr(self, name, getattr(self.sub, name))
        self._core = shared  # _check() is the shared index's own

    def __len__(self) -> int:
        return len(self.sub)


def _shared_tiny(clock: ManualClock, storage: Any = None) -> Any:
    store = storage if storage is not None else MemoryStorage()
    shared = SharedDelayIndex.open(store, "cancel", TINY, clock=clock, executor=InlineExecutor())
    return _OneSubscription(shared, store)


KINDS: dict[str, Callable[..., Any]] = {
    "in_memory": _in_memory,
    "delay_index": _delay_index,
    "delay_index_tiny": _delay_index_tiny,
    "shared_tiny": _shared_tiny,
}
BROWSE_KINDS = tuple(KINDS)
DURABLE_KINDS = ("delay_index", "delay_index_tiny", "shared_tiny")


def _make(kind: str) -> Any:
    clock = ManualClock(T0)
    made = KINDS[kind](clock)
    made.clock, made.kind = clock, kind
    return made


@pytest.fixture(params=sorted(KINDS))
def tracker(request: pytest.FixtureRequest) -> Any:
    made = _make(request.param)
    yield made
    made.close()


@pytest.fixture(params=BROWSE_KINDS)
def browser(request: pytest.FixtureRequest) -> Any:
    made = _make(request.param)
    yield made
    made.close()


@pytest.fixture(params=DURABLE_KINDS)
def durable(request: pytest.FixtureRequest) -> Any:
    made = _make(request.param)
    yield made
    made.close()


def _fill(tracker: Any) -> None:
    for entry in range(10):
        assert tracker.add(1, entry, T0 + 100 + 10 * entry)


def test_cancel_untracks_for_good(tracker: Any) -> None:
    _fill(tracker)
    assert tracker.cancel(1, 3) is True
    assert not tracker.contains(1, 3) and len(tracker) == 9
    assert tracker.cancel(1, 3) is False  # no longer tracked
    assert tracker.add(1, 3, T0 + 500) is True  # refused: not tracked, not to be delivered
    assert not tracker.contains(1, 3) and len(tracker) == 9
    assert tracker.add(1, 3, T0 - 5) is True  # a due re-add is refused too
    tracker.clock.advance(10_000)
    got = tracker.poll(100)
    assert Position(1, 3) not in got and len(got) == 9
    tracker._core._check()


def test_cancel_of_an_unknown_position_is_false_and_changes_nothing(tracker: Any) -> None:
    _fill(tracker)
    assert tracker.cancel(2, 0) is False
    assert tracker.add(2, 0, T0 + 50) is True and tracker.contains(2, 0)
    assert tracker.stats()["cancel_overrides"] == 0


def test_cancel_many_validates_the_whole_batch_first(tracker: Any) -> None:
    _fill(tracker)
    with pytest.raises(ValueError, match="bad position"):
        tracker.cancel_many([1, 1], [0, 2**32])
    with pytest.raises(TypeError):
        tracker.cancel_many([1, 1], [0, 1.5])
    with pytest.raises(ValueError, match="equal length"):
        tracker.cancel_many([1, 1], [0])
    assert len(tracker) == 10
    out = tracker.cancel_many(np.array([1, 1, 1, 9]), np.array([0, 0, 5, 9]))
    assert out.dtype == np.bool_ and out.tolist() == [True, False, True, False]
    assert len(tracker) == 8


def test_bad_ids_raise_and_change_nothing(tracker: Any) -> None:
    _fill(tracker)
    for args, error in [((-1, 0), ValueError), ((1, 2**32), ValueError), ((1, "x"), TypeError),
                        ((True, 0), TypeError), ((1.0, 0), TypeError)]:  # fmt: skip
        with pytest.raises(error):
            tracker.cancel(*args)
        with pytest.raises(error):
            tracker.reschedule(*args, T0 + 5)
    with pytest.raises(TypeError):
        tracker.reschedule(1, 0, 1.5)
    with pytest.raises((ValueError, OverflowError)):
        tracker.reschedule(1, 0, 2**63)
    assert len(tracker) == 10 and tracker.stats()["reschedule_overrides"] == 0


def test_reschedule_moves_later_earlier_and_into_the_past(tracker: Any) -> None:
    _fill(tracker)
    assert tracker.reschedule(1, 0, T0 + 5_000) is True  # later
    assert tracker.reschedule(1, 9, T0 + 50) is True  # earlier
    assert tracker.reschedule(1, 5, T0 - 1) is False  # the past: due now, untracked
    assert not tracker.contains(1, 5) and len(tracker) == 9
    assert tracker.next_delivery_time() == T0 + 50
    # The dispatcher's replay re-adds with the original times: the new times hold.
    assert tracker.add(1, 0, T0 + 100) is True
    assert tracker.add(1, 5, T0 + 150) is False  # still due now
    tracker.clock.advance(45)  # the cutoff (tick 10) reaches T0 + 55
    assert tracker.poll(100) == [Position(1, 9)]
    tracker.clock.advance(200)
    assert tracker.poll(100) == [Position(1, e) for e in (1, 2, 3, 4, 6, 7, 8)]
    tracker.clock.advance(10_000)
    assert tracker.poll(100) == [Position(1, 0)]
    tracker._core._check()


def test_reschedule_tracks_an_untracked_position_and_revives_a_cancelled_one(
    tracker: Any,
) -> None:
    assert tracker.reschedule(7, 1, T0 + 100) is True and tracker.contains(7, 1)
    assert tracker.add(7, 1, T0 + 900) is True  # a duplicate: the override time stands
    assert tracker.next_delivery_time() == T0 + 100
    assert tracker.cancel(7, 1) and tracker.reschedule(7, 1, T0 + 300) is True
    assert tracker.next_delivery_time() == T0 + 300
    tracker.clock.advance(280)  # the cutoff (tick 10) reaches T0 + 290
    assert tracker.poll(10) == []
    tracker.clock.advance(10)
    assert tracker.poll(10) == [Position(7, 1)] and len(tracker) == 0
    tracker._core._check()


def test_pending_is_ordered_bounded_and_removes_nothing(browser: Any) -> None:
    tracker = browser
    _fill(tracker)
    tracker.add(0, 7, T0 + 100)  # ties with (1, 0): position order decides
    everything = tracker.pending(limit=100)
    assert [t for t, _ in everything] == sorted(t for t, _ in everything)
    assert everything[:2] == [(T0 + 100, Position(0, 7)), (T0 + 100, Position(1, 0))]
    assert tracker.pending(T0 + 120, T0 + 150) == [
        (T0 + 120, Position(1, 2)), (T0 + 130, Position(1, 3)), (T0 + 140, Position(1, 4))
    ]  # fmt: skip
    assert tracker.pending(limit=3) == everything[:3]
    assert tracker.pending(start_ms=T0 + 180) == everything[-2:]
    assert tracker.pending(end_ms=T0 + 100) == [] and tracker.pending(limit=0) == []
    assert tracker.pending(T0 + 150, T0 + 150) == [] and tracker.pending(T0 + 9, T0 + 1) == []
    assert len(tracker) == 11
    for bad in ({"start_ms": 1.5}, {"end_ms": "x"}, {"limit": 2.0}, {"start_ms": True}):
        with pytest.raises(TypeError):
            tracker.pending(**bad)
    with pytest.raises(ValueError):
        tracker.pending(end_ms=2**64)


def test_pending_includes_the_largest_time(browser: Any) -> None:
    tracker = browser
    tracker.add(1, 1, 2**63 - 1)
    assert tracker.pending() == [(2**63 - 1, Position(1, 1))]
    assert tracker.pending(end_ms=2**63 - 1) == []
    assert tracker.due_histogram([0, 2**63 - 1]).tolist() == [0]


def test_due_histogram_counts_exactly(browser: Any) -> None:
    tracker = browser
    _fill(tracker)
    tracker.cancel(1, 2)
    tracker.reschedule(1, 9, T0 + 105)
    counts = tracker.due_histogram([T0, T0 + 110, T0 + 150, T0 + 1_000])
    assert counts.dtype == np.int64 and counts.tolist() == [
        2,
        3,
        4,
    ]  # 100,105 | 110,130,140 | 150-180
    assert tracker.due_histogram(np.array([T0 + 101, T0 + 102])).tolist() == [0]
    bad_edges: list[tuple[object, type[Exception]]] = [
        ([1], ValueError), ([2, 1], ValueError), ([1, 1], ValueError),
        ([1, 2.5], TypeError), ("ab", TypeError), ([0, 2**64], ValueError),
    ]  # fmt: skip
    for bad, error in bad_edges:
        with pytest.raises(error):
            tracker.due_histogram(bad)


def test_clear_forgets_the_overrides(tracker: Any) -> None:
    _fill(tracker)
    tracker.cancel(1, 0)
    tracker.reschedule(1, 1, T0 + 9_000)
    tracker.clear()
    assert tracker.add(1, 0, T0 + 100) is True and tracker.contains(1, 0)
    assert tracker.add(1, 1, T0 + 110) is True
    assert tracker.next_delivery_time() == T0 + 100
    tracker.clock.advance(105)
    assert tracker.poll(10) == [Position(1, 0), Position(1, 1)]


def test_a_closed_tracker_refuses_changes_and_browses_empty(tracker: Any) -> None:
    _fill(tracker)
    tracker.close()
    with pytest.raises(TrackerClosedError):
        tracker.cancel(1, 0)
    with pytest.raises(TrackerClosedError):
        tracker.cancel_many([1], [0])
    with pytest.raises(TrackerClosedError):
        tracker.reschedule(1, 0, T0 + 5)
    if tracker.kind in BROWSE_KINDS:
        assert tracker.pending() == [] and tracker.due_histogram([0, 1]).tolist() == [0]


def _reopen(index: Any) -> Any:
    """Close (persisting everything) and open the same store, as a restarted dispatcher."""
    index.close()
    again = KINDS[index.kind](index.clock, index.storage)
    again.clock, again.kind = index.clock, index.kind
    return again


def test_cancel_and_reschedule_survive_close_open_and_the_replay(durable: Any) -> None:
    for ledger in range(1, 6):
        for entry in range(3):
            durable.add(ledger, entry, T0 + 100 * ledger + entry)
    assert durable.cancel(2, 1) and durable.cancel(5, 0)
    assert durable.reschedule(1, 0, T0 + 9_000) is True
    assert durable.reschedule(4, 2, T0 - 1) is False  # due now: the dispatcher delivers it
    again = _reopen(durable)
    try:
        assert not again.contains(2, 1) and not again.contains(4, 2)
        # The dispatcher replays its topic from the cursor with the original times.
        replay = [again.add(g, e, T0 + 100 * g + e) for g in range(1, 6) for e in range(3)]
        assert replay[3 * 1 + 1] is True and not again.contains(2, 1)  # still cancelled
        assert replay[3 * 4 + 0] is True and not again.contains(5, 0)
        assert replay[3 * 3 + 2] is False  # (4, 2) keeps its new, past time: due now
        assert len(again) == 15 - 3
        again.clock.advance(1_000)
        got = again.poll(100)
        assert Position(1, 0) not in got and len(got) == 11
        again.clock.advance(10_000)
        assert again.poll(100) == [Position(1, 0)]
        again._core._check()
    finally:
        again.close()


def test_the_mark_forgets_the_overrides_it_passes(durable: Any) -> None:
    for entry in range(4):
        durable.add(3, entry, T0 + 100 + entry)
    durable.cancel(3, 0)
    durable.reschedule(3, 3, T0 + 5_000)
    durable.set_mark_delete(3, 1)
    assert durable.stats()["cancel_overrides"] == 0
    assert durable.stats()["reschedule_overrides"] == 1
    again = _reopen(durable)
    try:
        assert again.stats()["reschedule_overrides"] == 1
        assert again.stats()["cancel_overrides"] == 0
        assert again.add(3, 0, T0 + 100) is True and not again.contains(3, 0)  # acknowledged
    finally:
        again.close()


def test_flush_makes_a_cancel_durable_without_a_close(durable: Any) -> None:
    for entry in range(3):
        durable.add(9, entry, T0 + 100 + entry)
    durable.flush()  # nothing to seal yet in the default config: the mutable bucket holds them
    durable.cancel(9, 1)
    durable.flush()
    stored = durable.storage.read_manifest("cancel").overrides
    assert [a.tolist() for a in stored.to_arrays()[:2]] == [[9], [1]]


# -- stateful: the front against a dict model ---------------------------------------------------

ENTRIES = range(4)
ledgers = st.integers(0, 2)  # and the newer ledgers of ``add_next_ledger``
entries = st.integers(ENTRIES.start, ENTRIES.stop - 1)
offsets = st.integers(-20, 60)


class CancelMachine(RuleBasedStateMachine):
    """A tracker against ``position -> deliver_at`` plus the two override maps (and, for
    DelayIndex, the mark-delete and every position ever tracked, which a reopen may deliver
    again: at-least-once)."""

    @initialize(kind=st.sampled_from(sorted(KINDS)))
    def build(self, kind: str) -> None:
        self.clock = ManualClock(T0)
        self.kind = kind
        self.tracker = KINDS[kind](self.clock)
        self.tracked: dict[tuple[int, int], int] = {}
        self.cancelled: set[tuple[int, int]] = set()
        self.moved: dict[tuple[int, int], int] = {}
        self.mark = (-1, -1)
        self.ever: set[tuple[int, int]] = set()
        self.late = False  # a failed segment read deferred a bucket: due ones may come late
        self.top = 2  # the newest ledger added

    def teardown(self) -> None:
        if hasattr(self, "tracker"):
            self.tracker.close()

    def _cutoff(self) -> int:
        return self.clock() + CONFIG.tick_ms

    def _add(self, pos: tuple[int, int], t: int) -> bool:
        if pos in self.cancelled or pos <= self.mark:
            return True
        t = self.moved.get(pos, t)
        if t <= self._cutoff():
            self.tracked.pop(pos, None)
            return False
        self.tracked.setdefault(pos, t)
        self.ever.add(pos)
        return True

    @rule(ledger=ledgers, entry=entries, offset=offsets)
    def add(self, ledger: int, entry: int, offset: int) -> None:
        t = self.clock() + offset
        may_fail = self._folds_may_fail()
        try:
            got = self.tracker.add(ledger, entry, t)
        except StorageError:
            self._folds_failed(may_fail)
            return
        assert got == self._add((ledger, entry), t)

    def _folds_may_fail(self) -> bool:
        """Whether a read of folded cancels (an add or reschedule of an untracked position in
        a merged range) may fail now: enough ``get_metadata`` failures are queued."""
        storage = getattr(self.tracker, "storage", None)
        return storage is not None and storage.pending_failures("get_metadata") >= MAX_ATTEMPTS

    def _folds_failed(self, may_fail: bool) -> None:
        """An add or reschedule raised: only a failing read of folded cancels may make it, and
        then nothing changed (the position may be cancelled: neither tracked nor delivered)."""
        assert may_fail, "an add or reschedule failed with no injected failure able to cause it"
        event("a read of folded cancels failed: the add or reschedule raised")

    @precondition(lambda self: self.top < 12)
    @rule(offsets=st.lists(offsets, min_size=1, max_size=4))
    def add_next_ledger(self, offsets: list[int]) -> None:
        """A producer moves on to a new ledger: the mutable bucket seals (so segments are
        written and read back)."""
        self.top += 1
        for entry, offset in enumerate(offsets):
            self.add(self.top, entry, offset)
        buckets = getattr(self.tracker, "_buckets", {})
        if any(getattr(b, "folded", 0) for b in buckets.values()):
            event("a merge folded cancels into its bucket")

    @rule(ledger=ledgers, entry=entries)
    def cancel(self, ledger: int, entry: int) -> None:
        pos = (ledger, entry)
        expected = pos in self.tracked
        if expected:
            del self.tracked[pos]
            self.cancelled.add(pos)
            self.moved.pop(pos, None)
        assert self.tracker.cancel(ledger, entry) == expected

    @rule(data=st.data())
    def cancel_tracked(self, data: st.DataObject) -> None:
        """Cancel a tracked message of any ledger: sealed buckets' too, which merges fold."""
        if self.tracked:
            self.cancel(*data.draw(st.sampled_from(sorted(self.tracked))))

    @precondition(lambda self: self.top < 11)
    @rule(data=st.data(), later=st.lists(st.integers(100, 400), min_size=2, max_size=4))
    def cancel_then_merge(self, data: st.DataObject, later: list[int]) -> None:
        """Cancel a tracked message, then move on two ledgers with messages due later: in the
        tiny kind the seals go over the bucket bound and the merges fold the cancel."""
        self.cancel_tracked(data)
        self.add_next_ledger(later)
        self.add_next_ledger(later)

    @rule(batch=st.lists(st.tuples(ledgers, entries), max_size=6))
    def cancel_many(self, batch: list[tuple[int, int]]) -> None:
        expected = []
        for pos in batch:
            expected.append(pos in self.tracked)
            if pos in self.tracked:
                del self.tracked[pos]
                self.cancelled.add(pos)
                self.moved.pop(pos, None)
        got = self.tracker.cancel_many([p[0] for p in batch], [p[1] for p in batch])
        assert got.tolist() == expected

    @rule(ledger=ledgers, entry=entries, offset=offsets)
    def reschedule(self, ledger: int, entry: int, offset: int) -> None:
        pos, t = (ledger, entry), self.clock() + offset
        if pos <= self.mark:
            assert self.tracker.reschedule(ledger, entry, t) is True
            return
        may_fail = self._folds_may_fail()
        try:
            got = self.tracker.reschedule(ledger, entry, t)
        except StorageError:
            self._folds_failed(may_fail)
            return
        self.cancelled.discard(pos)
        self.tracked.pop(pos, None)
        self.moved[pos] = t
        assert got == self._add(pos, t)

    def _reads_may_fail(self) -> bool:
        storage = getattr(self.tracker, "storage", None)
        return storage is not None and storage.pending_failures("get_segments") >= MAX_ATTEMPTS

    def _note_late(self) -> None:
        """Late deliveries start with a deferred read and end once nothing is retried and
        nothing is due."""
        if self.kind not in DURABLE_KINDS:
            return
        retrying = bool(self.tracker.stats()["retrying_loads"])
        if retrying:
            event("a failed read deferred a bucket")
            self.late = True
        elif not any(t <= self._cutoff() for t in self.tracked.values()):
            self.late = False

    @rule(n=st.integers(0, 5))
    def poll(self, n: int) -> None:
        may_fail = self._reads_may_fail()
        got = self.tracker.poll(n)
        self._note_late()
        if self.late or may_fail:
            self._check_late_poll(got, n)
            return
        due = sorted((t, *p) for p, t in self.tracked.items() if t <= self._cutoff())[:n]
        for _, *p in due:
            del self.tracked[tuple(p)]  # type: ignore[arg-type]
        assert got == sorted(Position(a, b) for _, a, b in due)

    def _check_late_poll(self, got: list[Position], n: int) -> None:
        """A poll while a read may fail or was deferred: nothing untracked, cancelled or
        early, sorted, at most ``n``."""
        pairs = [(p.ledger_id, p.entry_id) for p in got]
        assert pairs == sorted(set(pairs)) and len(pairs) <= n, pairs
        for pos in pairs:
            assert pos in self.tracked, f"{pos} delivered but not tracked (or cancelled)"
            assert self.tracked[pos] <= self._cutoff(), f"{pos} delivered early"
            del self.tracked[pos]

    # -- storage faults (durable kinds) ----------------------------------------------------

    @precondition(lambda self: self.kind in DURABLE_KINDS)
    @rule(
        op=st.sampled_from(("create", "delete", "get_metadata", "get_segments")),
        times=st.sampled_from([1, 3, MAX_ATTEMPTS, 6]),
        after=st.booleans(),
    )
    def inject_failure(self, op: str, times: int, after: bool) -> None:
        """Queue failures: a failed create keeps the bucket in memory, a failed delete is
        retried, a failed segment read defers its bucket (late, never early), a failed
        recovery read fails the open (retried)."""
        self.tracker.storage.inject_failure(
            op, times=times, after=after and op in ("create", "delete")
        )

    @precondition(lambda self: self.kind in DURABLE_KINDS)
    @rule(n=st.integers(1, 5), ms=st.integers(0, 60))
    def poll_failing_reads(self, n: int, ms: int) -> None:
        """``ms`` later, poll while the next segment read fails on every attempt: a bucket
        whose next segment comes due is deferred (its messages come late, never early)."""
        self.clock.advance(ms)
        self.tracker.storage.inject_failure("get_segments", times=MAX_ATTEMPTS)
        self.poll(n)

    @precondition(lambda self: self.kind in DURABLE_KINDS)
    @rule()
    def heal(self) -> None:
        """The storage works again; once the backoff has passed everything due comes."""
        self.tracker.storage.clear_faults()
        for _ in range(8):
            self.clock.advance(MAX_BACKOFF_MS + 1)
            self._check_late_poll(self.tracker.poll(10_000), 10_000)
            self._note_late()
            if not self.late:
                break
        assert not self.late, "the deferred reads never caught up"

    @rule(ms=st.integers(0, 40))
    def advance(self, ms: int) -> None:
        self.clock.advance(ms)

    @rule()
    def clear(self) -> None:
        self.tracker.clear()
        self.tracked.clear()
        self.cancelled.clear()
        self.moved.clear()
        self.mark = (-1, -1)
        self.ever.clear()

    @precondition(lambda self: self.kind in DURABLE_KINDS)
    @rule(ledger=ledgers, entry=entries)
    def mark_delete(self, ledger: int, entry: int) -> None:
        self.tracker.set_mark_delete(ledger, entry)
        self.mark = max(self.mark, (ledger, entry))
        for keys in (self.tracked, self.moved):
            for pos in [p for p in keys if p <= self.mark]:
                del keys[pos]
        self.cancelled = {p for p in self.cancelled if p > self.mark}

    @precondition(lambda self: self.kind in DURABLE_KINDS)
    @rule()
    def reopen(self) -> None:
        """Close and open the store, then the dispatcher's replay of what it still holds."""
        storage = self.tracker.storage
        self.tracker.close()
        for _ in range(10):  # a failed recovery read fails the open: the operator retries
            could_fail = any(
                storage.pending_failures(op) >= MAX_ATTEMPTS
                for op in ("get_metadata", "get_segments")
            )
            try:
                self.tracker = KINDS[self.kind](self.clock, storage)
                break
            except RecoveryError:
                event("reopen: recovery failed and was retried")
                assert could_fail, "recovery failed with no injected failure able to cause it"
        else:
            raise AssertionError("recovery kept failing")
        self.late = False
        if self.tracker.stats().get("cancel_overrides_folded"):
            event("reopen: a merged bucket still holds folded cancels")
        for pos in sorted(set(self.tracked) | self.cancelled):
            t = self.tracked.get(pos, self.clock() + 1_000)
            may_fail = self._folds_may_fail()
            try:
                got = self.tracker.add(*pos, t)
            except StorageError:  # the dispatcher retries once the storage answers
                self._folds_failed(may_fail)
                storage.clear_faults()
                got = self.tracker.add(*pos, t)
            assert got == self._add(pos, t), pos
        for ledger in range(self.top + 1):
            for entry in ENTRIES:
                pos = (ledger, entry)
                found = self.tracker.contains(ledger, entry)
                if pos in self.cancelled or pos <= self.mark:
                    assert not found, f"{pos} is back after the reopen"
                elif pos in self.tracked:
                    assert found, f"{pos} was lost"
                elif found:  # delivered or untracked before: at-least-once brings it back
                    assert pos in self.ever, f"{pos} was never tracked"
        # Drain everything (times of positions brought back are the stored ones) to resync.
        storage.clear_faults()
        self.clock.advance(10**9)
        drained: set[tuple[int, int]] = set()
        while got := self.tracker.poll(100):
            drained.update((p.ledger_id, p.entry_id) for p in got)
        assert set(self.tracked) <= drained and not drained & self.cancelled
        assert drained <= self.ever
        self.tracked.clear()

    @precondition(lambda self: self.kind in BROWSE_KINDS)
    @rule(start=st.integers(-30, 70), width=st.integers(0, 80), limit=st.integers(0, 6))
    def browse(self, start: int, width: int, limit: int) -> None:
        lo, hi = self.clock() + start, self.clock() + start + width
        want = sorted((t, p) for p, t in self.tracked.items() if lo <= t < hi)[:limit]
        edges = sorted({lo, (lo + hi) // 2 + 1, hi + 1})
        counts = [
            sum(1 for t in self.tracked.values() if lo_ <= t < hi_)
            for lo_, hi_ in itertools.pairwise(edges)
        ]
        may_fail = self._reads_may_fail()
        try:
            got = self.tracker.pending(lo, hi, limit)
            histogram = self.tracker.due_histogram(edges).tolist()
        except StorageError:
            assert may_fail, "a browse failed with no injected failure"
            event("browse: a segment read failed")
            return  # reported; a browse changes nothing
        assert [(t, tuple(p)) for t, p in got] == want
        assert histogram == counts

    @invariant()
    def agree(self) -> None:
        if not hasattr(self, "tracker"):
            return
        self.tracker._core._check()
        assert len(self.tracker) == len(self.tracked)
        for ledger in range(self.top + 1):
            for entry in ENTRIES:
                assert self.tracker.contains(ledger, entry) == ((ledger, entry) in self.tracked)


TestCancelStateful = CancelMachine.TestCase
TestCancelStateful.settings = settings(stateful_step_count=100)  # examples: the profile
