"""Stateful test: DelayIndex with tiny buckets against a dict model and InMemoryTracker.

A hypothesis state machine drives a :class:`~delayindex.DelayIndex` whose buckets are so small
that almost every step seals, cuts segments, loads, merges, trims or deletes, on a shared
:class:`~delayindex.ManualClock` and :class:`~delayindex.MemoryStorage` with injected storage
failures, and it closes and reopens the index the way a restarting dispatcher would.

The model is a dict ``cand``: every position the index must be tracking -> the deliver times it
may carry. Until the first reopen each set is a singleton and the model is exact; an
:class:`~delayindex.InMemoryTracker` then runs in lockstep as a second oracle (its ``poll`` of as
many messages as the index returned must return the very same positions), and it is rebuilt
whenever the model is exact again. A reopen recovers the sealed durable buckets from storage,
*including* positions delivered since their snapshot was written (at-least-once): the model
learns the recovered set from the index itself and checks it (every recovered position comes
from a stored snapshot, with one of the deliver times stored for it there; every position
tracked at close with a not-yet-due copy in a durable snapshot is recovered; nothing at or below
the mark-delete position, which must survive the reopen unless its manifest commit on close
could fail). The dispatcher's replay follows: maybe re-apply its cursor's mark, then re-add every
position it still owes, in position order. Recovered positions nobody owes ("ghosts") may be
delivered once more; nothing may be delivered twice between reopens, since a delivery removes
the position from the model. The dispatcher never adds a position at or below its mark.

Checked after every step: ``_check()``, ``len``, ``contains``, ``tracked_entries`` and
``mark_delete`` against the model (exact, also after reopens); ``next_delivery_time`` is never
later than a tracked position's deliver time; ``has_message_available`` when something is surely
due; every stored object is referenced by the manifest and every live bucket's object exists
(two-phase creates and deletes, whatever failed). Every poll: nothing delivered that is
untracked or not yet due, at most ``n``, sorted, selected in ``(deliver_at, ledger, entry)``
order, and nothing surely due left behind when fewer than ``n`` came back, unless a segment
load could fail. Teardown drains everything far in the future: every tracked position is
delivered, nothing is lost.

The plain tests at the end are minimal deterministic repros of library bugs this test found: a
seal across a recovered bucket's range; the mark-delete position lost on reopen; and lost again
when a manifest commit's outcome was unknown (acknowledgement and read-back both failed).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

import numpy as np
from hypothesis import event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from delayindex import (
    DelayIndex,
    InMemoryTracker,
    ManualClock,
    MemoryStorage,
    RecoveryError,
    StorageError,
    TrackerConfig,
)
from delayindex.executors import InlineExecutor
from delayindex.model import MAX_ENTRY_ID
from delayindex.snapshot.codec import decode_snapshot
from delayindex.storage.manifest import decode_manifest

T0 = 1_000_000
NAME = "stateful"
FAR_FUTURE = T0 + 10**9
MAX_ATTEMPTS = 4  # storage attempts per operation: this many failures make it fail
FAULT_OPS = ("create", "get_metadata", "get_segments", "delete", "manifest")
RECOVERY_OPS = ("get_metadata", "get_segments", "manifest")

Pos = tuple[int, int]
F = TypeVar("F", bound=Callable[..., Any])

#: Ledger moves: mostly the current ledger or the next one, sometimes back (non-monotonic).
ledger_steps = st.sampled_from([0, 0, 0, 1, 1, -1, -3])
entries = st.integers(0, 3)
#: deliver_at relative to now; None is "not delayed" (-1). Mostly in the future.
offsets = st.one_of(st.integers(-4, 40), st.none())


def snapshot_times(storage: MemoryStorage, ids: Iterable[str]) -> dict[Pos, set[int]]:
    """Position -> deliver times stored for it in the given snapshots (read without faults)."""
    out: dict[Pos, set[int]] = {}
    for snapshot_id in ids:
        _, segments = decode_snapshot(storage.raw_object(snapshot_id), snapshot_id)
        for segment in segments:
            for t, ledger, entry in zip(
                segment.times.tolist(),
                segment.ledgers.tolist(),
                segment.entries.tolist(),
                strict=True,
            ):
                out.setdefault((ledger, entry), set()).add(t)
    return out


def guarded(fn: F) -> F:
    """Mark the machine broken while a rule or invariant runs, so teardown skips the drain."""

    @functools.wraps(fn)
    def run(self: DelayIndexMachine, *args: Any, **kwargs: Any) -> Any:
        self.broken = True
        result = fn(self, *args, **kwargs)
        self.broken = False
        return result

    return run  # type: ignore[return-value]


class DelayIndexMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.index: DelayIndex | None = None
        self.broken = False
        self.late = False  # a bucket's failed read deferred it: its messages may come late

    # -- setup and helpers ------------------------------------------------------------------

    @initialize(
        min_count=st.integers(1, 4),
        per_segment=st.sampled_from([1, 2, 3, -1]),
        time_step=st.integers(1, 20),
        max_buckets=st.integers(0, 3),
        tick=st.sampled_from([0, 1, 3]),
        strict=st.booleans(),
        seed=st.lists(st.tuples(st.integers(0, 1), entries, st.integers(4, 40)), max_size=20),
    )
    @guarded
    def build(
        self,
        min_count: int,
        per_segment: int,
        time_step: int,
        max_buckets: int,
        tick: int,
        strict: bool,
        seed: list[tuple[int, int, int]],
    ) -> None:
        self.clock = ManualClock(T0)
        self.storage = MemoryStorage(clock=self.clock)
        self.config = TrackerConfig(
            tick_ms=tick,
            strict=strict,
            min_index_count_per_bucket=min_count,
            max_indexes_per_segment=per_segment,
            max_time_step_per_segment_ms=time_step,
            max_num_buckets=max_buckets,
            fixed_delay_lookahead=0,
        )
        #: Position -> the deliver times the index may hold for it (one each while exact).
        self.cand: dict[Pos, set[int]] = {}
        #: Position -> deliver_at the dispatcher last added it with, for those it still owes.
        self.owed: dict[Pos, int] = {}
        #: Every position ever tracked (what ``contains`` is checked on).
        self.seen: set[Pos] = set()
        #: The index's mark-delete position, and the dispatcher's (its cursor's): they differ
        #: only after a reopen that lost a mark the index could not persist.
        self.mark: Pos | None = None
        self.acked: Pos | None = None
        self.marks: set[Pos] = set()
        self.ledger = 0
        self.tick = tick
        self.ops: dict[str, int] = {}
        self.oracle: InMemoryTracker | None = InMemoryTracker(self.config, clock=self.clock)
        self.index = self.open_index()
        for step, entry, offset in seed:  # some messages to start from
            ledger, entry = self.next_position(step, entry)
            deliver_at = self.deliver_at(offset)
            assert self.oracle.add(ledger, entry, deliver_at) is True
            assert self.index.add(ledger, entry, deliver_at) is True
            assert self.model_add((ledger, entry), deliver_at) is True

    def open_index(self) -> DelayIndex:
        return DelayIndex.open(
            self.storage, NAME, self.config, clock=self.clock, executor=InlineExecutor()
        )

    def note_stats(self, index: DelayIndex) -> None:
        for op, counts in index.stats()["ops"].items():
            for outcome in ("succeeded", "failed"):
                key = f"{op} {outcome}"
                self.ops[key] = self.ops.get(key, 0) + counts[outcome]

    def cutoff(self) -> int:
        now = self.clock()
        return now if self.config.strict else now + self.tick

    def next_position(self, step: int, entry: int) -> Pos:
        ledger = max(0, self.ledger + step)
        self.ledger = max(self.ledger, ledger)
        floor = self.floor()
        if floor is not None and (ledger, entry) <= floor:
            # A dispatcher never reads an acknowledged position again: move past the mark.
            ledger = self.ledger = max(self.ledger, floor[0] + 1)
        return ledger, entry

    def floor(self) -> Pos | None:
        """Adds stay above this: the dispatcher's mark and the index's (adds at or below the
        index's mark are :meth:`add_acknowledged`'s)."""
        marks = [m for m in (self.acked, self.mark) if m is not None]
        return max(marks) if marks else None

    def deliver_at(self, offset: int | None) -> int:
        return -1 if offset is None else self.clock() + offset

    def model_add(self, pos: Pos, deliver_at: int) -> bool:
        """The add contract on the model; returns whether the position is (still) tracked."""
        if deliver_at < 0 or deliver_at <= self.cutoff():
            self.cand.pop(pos, None)  # a due re-add untracks; the dispatcher delivers it now
            self.owed.pop(pos, None)
            return False
        if pos in self.cand:  # tracked: a no-op, the index keeps the time it has
            self.owed.setdefault(pos, deliver_at)
            return True
        self.cand[pos] = {deliver_at}
        self.owed[pos] = deliver_at
        self.seen.add(pos)
        return True

    def exact(self) -> bool:
        return all(len(times) == 1 for times in self.cand.values())

    def rebuild_oracle(self) -> None:
        """Start a fresh InMemoryTracker oracle once the model is exact and nothing is due."""
        cutoff = self.cutoff()
        if self.late or not self.exact() or any(min(t) <= cutoff for t in self.cand.values()):
            return
        oracle = InMemoryTracker(self.config, clock=self.clock)
        oracle.reset_tick_time(self.tick)
        for (ledger, entry), times in sorted(self.cand.items()):
            assert oracle.add(ledger, entry, min(times)) is True
        self.oracle = oracle

    def check_delivery(self, got: list[tuple[int, int]], n: int, load_may_fail: bool) -> None:
        """Check one poll's result against the model, then remove what it delivered."""
        cutoff = self.cutoff()
        assert got == sorted(set(got)), f"poll result not sorted or repeated: {got}"
        assert len(got) <= max(n, 0)
        for pos in got:
            assert pos in self.cand, f"{pos} delivered but not tracked (or delivered twice)"
            assert min(self.cand[pos]) <= cutoff, (
                f"{pos} delivered before it is due: deliver_at {self.cand[pos]}, cutoff {cutoff}"
            )
        delivered = set(got)
        surely_due = sorted(
            (max(times), pos)
            for pos, times in self.cand.items()
            if pos not in delivered and max(times) <= cutoff
        )
        if self.late:
            # A failed segment read defers its bucket (late, never early): order across
            # buckets is not checked until it has caught up.
            surely_due = []
        if delivered and surely_due:
            last = max((min(self.cand[pos]), pos) for pos in delivered)
            assert surely_due[0] > last, (
                f"{surely_due[0]} is due and comes before delivered {last} in "
                f"(deliver_at, ledger, entry) order, but was not delivered"
            )
        if not load_may_fail and len(got) < n:
            assert not surely_due, f"poll({n}) returned {got} and left due {surely_due}"
        if self.oracle is not None:
            expected = [tuple(p) for p in self.oracle.poll(len(got))]
            assert got == expected, f"poll({n}) = {got}, oracle's first {len(got)}: {expected}"
            if not load_may_fail and len(got) < n:
                assert not self.oracle.has_message_available()
        for pos in got:
            del self.cand[pos]
            self.owed.pop(pos, None)

    def poll_index(self, n: int) -> list[tuple[int, int]]:
        assert self.index is not None
        load_may_fail = self.storage.pending_failures("get_segments") >= MAX_ATTEMPTS
        failed_loads = self.index.stats()["ops"]["load"]["failed"]
        got = [(p.ledger_id, p.entry_id) for p in self.index.poll(n)]
        if load_may_fail and self.storage.pending_failures("get_segments") < MAX_ATTEMPTS:
            event("poll: a segment load may have failed")
        stats = self.index.stats()
        # A failed read defers its bucket. The poll's retry tick may merge that bucket away
        # before the poll returns (inline), so retrying_loads no longer names it; its messages
        # are late all the same (in the merged bucket, behind a placeholder that is due).
        retrying = bool(stats["retrying_loads"]) or stats["ops"]["load"]["failed"] > failed_loads
        if retrying:
            event("poll: a bucket's reads are retried later")
            self.late, self.oracle = True, None
        self.check_delivery(got, n, load_may_fail)
        cutoff = self.cutoff()
        if self.late and not retrying and all(min(t) > cutoff for t in self.cand.values()):
            self.late = False  # caught up: strict order holds again
        return got

    # -- rules ------------------------------------------------------------------------------

    @rule(step=ledger_steps, entry=entries, offset=offsets)
    @guarded
    def add(self, step: int, entry: int, offset: int | None) -> None:
        assert self.index is not None
        ledger, entry = self.next_position(step, entry)
        deliver_at = self.deliver_at(offset)
        got = self.index.add(ledger, entry, deliver_at)
        if self.oracle is not None:
            assert self.oracle.add(ledger, entry, deliver_at) is got
        expected = self.model_add((ledger, entry), deliver_at)
        assert got is expected, f"add({ledger}, {entry}, {deliver_at}) = {got}"

    @rule(batch=st.lists(st.tuples(ledger_steps, entries, offsets), min_size=1, max_size=5))
    @guarded
    def add_many(self, batch: list[tuple[int, int, int | None]]) -> None:
        assert self.index is not None
        rows = [(*self.next_position(s, e), self.deliver_at(o)) for s, e, o in batch]
        ledgers, entry_ids, times = (np.array(c, dtype=np.int64) for c in zip(*rows, strict=True))
        got = self.index.add_many(ledgers, entry_ids, times).tolist()
        if self.oracle is not None:
            assert self.oracle.add_many(ledgers, entry_ids, times).tolist() == got
        expected = [self.model_add((lg, e), t) for lg, e, t in rows]
        assert got == expected, f"add_many({rows}) = {got}"

    @rule(pick=st.integers(0, 2**16), offset=offsets)
    @guarded
    def readd(self, pick: int, offset: int | None) -> None:
        """Add a position seen before again: a duplicate, a due re-add, or a re-track."""
        assert self.index is not None
        floor = self.floor()
        known = sorted(p for p in self.seen if floor is None or p > floor)
        if not known:
            return
        ledger, entry = known[pick % len(known)]
        deliver_at = self.deliver_at(offset)
        got = self.index.add(ledger, entry, deliver_at)
        if self.oracle is not None:
            assert self.oracle.add(ledger, entry, deliver_at) is got
        expected = self.model_add((ledger, entry), deliver_at)
        assert got is expected, f"add({ledger}, {entry}, {deliver_at}) = {got}"

    @rule(
        picks=st.lists(st.integers(0, 2**16), min_size=1, max_size=4),
        offsets_=st.lists(offsets, min_size=4, max_size=4),
        batch=st.booleans(),
    )
    @guarded
    def add_acknowledged(self, picks: list[int], offsets_: list[int | None], batch: bool) -> None:
        """Add positions at or below the index's mark (a rewound cursor, a replay): never
        tracked nor delivered, whatever their deliver time, and ``add`` says "do not deliver"."""
        assert self.index is not None
        mark = self.mark
        if mark is None:
            return
        known = sorted({p for p in self.seen if p <= mark} | {mark, (mark[0], 0), (0, 0)})
        rows = [
            (*known[pick % len(known)], self.deliver_at(offset))
            for pick, offset in zip(picks, offsets_, strict=False)
        ]
        before = len(self.index)
        if batch:
            ledgers, entry_ids, times = (
                np.array(c, dtype=np.int64) for c in zip(*rows, strict=True)
            )
            assert self.index.add_many(ledgers, entry_ids, times).all(), rows
        else:
            for ledger, entry, deliver_at in rows:
                assert self.index.add(ledger, entry, deliver_at) is True, (ledger, entry)
        assert len(self.index) == before
        assert not any(self.index.contains(lg, e) for lg, e, _ in rows)
        event(f"add below the mark: {'add_many' if batch else 'add'}")

    @rule(count=st.integers(1, 8), offset=st.integers(1, 40), spread=st.integers(0, 10))
    @guarded
    def produce(self, count: int, offset: int, spread: int) -> None:
        """A producer's burst: the next ledger, ``count`` entries, deliver times spread out."""
        assert self.index is not None
        ledger, _ = self.next_position(1, 0)
        for entry in range(count):
            deliver_at = self.clock() + offset + (entry * spread) % 11
            got = self.index.add(ledger, entry, deliver_at)
            if self.oracle is not None:
                assert self.oracle.add(ledger, entry, deliver_at) is got
            assert got is self.model_add((ledger, entry), deliver_at)

    @rule(ms=st.one_of(st.integers(0, 15), st.just(60)))
    @guarded
    def advance(self, ms: int) -> None:
        self.clock.advance(ms)

    @rule(n=st.integers(-1, 6))
    @guarded
    def poll(self, n: int) -> None:
        self.poll_index(n)

    @rule(back=st.integers(0, 3), entry=entries)
    @guarded
    def set_mark_delete(self, back: int, entry: int) -> None:
        assert self.index is not None
        mark = (max(0, self.ledger - back), entry)
        self.index.set_mark_delete(*mark)
        self.acked = mark if self.acked is None else max(self.acked, mark)
        self.marks.add(mark)
        self.model_mark(mark)

    def model_mark(self, mark: Pos) -> None:
        if self.mark is not None and mark <= self.mark:
            return  # the mark only moves forward
        self.mark = mark
        for pos in [p for p in self.cand if p <= mark]:
            del self.cand[pos]
            self.owed.pop(pos, None)
            if self.oracle is not None:
                assert self.oracle.add(*pos, -1) is False  # untracks it

    @rule(tick=st.sampled_from([0, 1, 3, 10]))
    @guarded
    def reset_tick_time(self, tick: int) -> None:
        assert self.index is not None
        self.index.reset_tick_time(tick)
        if self.oracle is not None:
            self.oracle.reset_tick_time(tick)
        self.tick = tick

    @rule()
    @guarded
    def clear(self) -> None:
        """Drop everything (a dispatcher resetting its subscription); the mark goes too."""
        assert self.index is not None
        self.index.clear()
        self.cand.clear()
        self.owed.clear()
        self.mark = self.acked = None
        if self.oracle is not None:
            self.oracle.clear()

    @rule(
        op=st.sampled_from(FAULT_OPS),
        times=st.sampled_from([1, 3, MAX_ATTEMPTS, 6]),
        after=st.booleans(),
    )
    @guarded
    def inject_failure(self, op: str, times: int, after: bool) -> None:
        self.storage.inject_failure(op, times=times, after=after)

    @rule(reapply_mark=st.booleans())
    @guarded
    def reopen(self, reapply_mark: bool) -> None:
        """Close, reopen (retrying while injected failures break recovery), replay."""
        index = self.index
        assert index is not None
        index.flush()
        index._check()
        durable = [b.snapshot_id for b in index.buckets() if b.state == "durable"]
        assert all(d is not None for d in durable)
        at_close = set(self.cand)
        self.note_stats(index)
        # Close persists the mark unless its manifest commit fails; then close raises
        # StorageError (after closing everything else) whenever the mark was pending.
        mark_persists = self.storage.pending_failures("manifest") < MAX_ATTEMPTS
        try:
            index.close()
        except StorageError:
            assert not mark_persists, "close raised with no injected failure able to cause it"
            event("reopen: close reported an unpersisted mark")
        self.index = None
        assert index.closed and len(index) == 0
        stored = snapshot_times(self.storage, [o.id for o in self.storage.list_objects()])
        in_durable = snapshot_times(self.storage, [d for d in durable if d is not None])
        self.tick = self.config.tick_ms  # the tick is not persisted
        cutoff = self.cutoff()
        for _ in range(100):
            could_fail = any(
                self.storage.pending_failures(op) >= MAX_ATTEMPTS for op in RECOVERY_OPS
            )
            try:
                index = self.open_index()
                break
            except RecoveryError:
                event("reopen: recovery failed and was retried")
                assert could_fail, "recovery failed with no injected failure able to cause it"
        else:
            raise AssertionError("recovery kept failing")
        self.index = index
        mark = None if index.mark_delete is None else tuple(index.mark_delete)
        if mark_persists:
            assert mark == self.mark, f"mark-delete {self.mark} came back as {mark}"
        else:  # maybe an older one: acknowledged positions may come back (at-least-once)
            assert mark is None or mark in self.marks, f"mark-delete {mark} was never set"
        self.mark = mark
        # What was recovered: only positions stored in snapshots, with a stored deliver time.
        recovered = {pos for pos in self.seen if index.contains(*pos)}
        assert len(index) == len(recovered), "recovered positions never added"
        assert mark is None or all(p > mark for p in recovered), "acknowledged, recovered"
        for pos in recovered:
            assert pos in stored, f"{pos} recovered but in no stored snapshot"
        # Nothing durable and undelivered is lost: a not-yet-due copy in a durable snapshot.
        for pos, times in in_durable.items():
            acknowledged = mark is not None and pos <= mark  # by an older mark that came back
            if pos in at_close and max(times) > cutoff and not acknowledged:
                assert pos in recovered, f"{pos} (deliver_at {times}) was durable but is lost"
        self.cand = {pos: set(stored[pos]) for pos in recovered}
        event(f"reopen: recovered positions nobody owes: {bool(recovered - set(self.owed))}")
        self.oracle = None
        # The dispatcher's replay: maybe its cursor's mark, then every position it owes.
        if reapply_mark and self.acked is not None:
            index.set_mark_delete(*self.acked)
            self.model_mark(self.acked)
        assert len(index) == len(self.cand)
        for (ledger, entry), deliver_at in sorted(self.owed.items()):
            if self.mark is not None and (ledger, entry) <= self.mark:
                # Only after a clear() whose mark reset could not be persisted: the old mark
                # is back and acknowledges what the dispatcher re-added since.
                assert not mark_persists
                event("reopen: an older mark came back and acknowledged owed positions")
                del self.owed[ledger, entry]
                continue
            got = index.add(ledger, entry, deliver_at)
            expected = self.model_add((ledger, entry), deliver_at)
            assert got is expected, f"replay add({ledger}, {entry}, {deliver_at}) = {got}"
        self.rebuild_oracle()

    # -- invariants and the final drain ---------------------------------------------------------

    @invariant()
    @guarded
    def consistent(self) -> None:
        index = self.index
        if index is None:
            return
        index.flush()
        index._check()
        assert index.mark_delete == self.mark
        assert len(index) == len(self.cand)
        for pos in self.seen:
            assert index.contains(*pos) == (pos in self.cand), f"contains{pos}"
        for ledger in {lg for lg, _ in self.seen}:
            want = sorted(e for lg, e in self.cand if lg == ledger)
            assert list(index.tracked_entries(ledger, 0, MAX_ENTRY_ID)) == want
        assert index.stats()["sealed_buckets"] == len(index.buckets())
        # Two-phase creates and deletes: no orphaned object, no live bucket without its object.
        raw = self.storage.raw_manifest(NAME)
        objects = {o.id for o in self.storage.list_objects()}
        if raw is None:  # nothing was ever committed
            assert not objects
        else:
            manifest = decode_manifest(raw, NAME)
            orphans = objects - manifest.referenced_ids()
            assert not orphans, f"objects no manifest entry references: {orphans}"
            lost = manifest.live_ids() - objects
            assert not lost, f"live buckets without their object: {lost}"
        nxt = index.next_delivery_time()
        if self.cand and not self.late:
            bound = min(max(times) for times in self.cand.values())
            assert nxt is not None and nxt <= bound, f"next_delivery_time {nxt} > {bound}"
            if bound <= self.cutoff():
                assert index.has_message_available()
        if self.oracle is None:
            self.rebuild_oracle()
        if self.oracle is not None:
            assert len(self.oracle) == len(self.cand)
            if self.cand:
                assert self.oracle.next_delivery_time() == min(min(t) for t in self.cand.values())

    def teardown(self) -> None:
        index = self.index
        if index is None:
            return
        if self.broken:  # a step failed: report that failure, not a drain of broken state
            self.close_index(index)
            return
        try:
            self.clock.set(FAR_FUTURE)
            for _ in range(200):
                if not len(index):
                    break
                # A failed segment read is retried after its backoff, not on every poll.
                self.clock.advance(64 * TrackerConfig().load_retry_delay_ms)
                load_may_fail = self.storage.pending_failures("get_segments") >= MAX_ATTEMPTS
                got = self.poll_index(10_000)
                assert got or load_may_fail, f"drain stuck with {len(index)} tracked"
            assert len(index) == 0
            assert not self.cand, f"never delivered: {sorted(self.cand)}"
            index.flush()
            index._check()
            self.note_stats(index)
            for key, count in sorted(self.ops.items()):
                if count and key != "recover succeeded":
                    event(f"storage op: {key}")
        finally:
            self.close_index(index)

    def close_index(self, index: DelayIndex) -> None:
        """Close; a close whose mark-delete commit meets injected manifest faults must say so."""
        faulty = self.storage.pending_failures("manifest") > 0
        try:
            index.close()
        except StorageError:
            if not faulty:
                raise
        assert index.closed


TestDelayIndexStateful = DelayIndexMachine.TestCase
TestDelayIndexStateful.settings = settings(stateful_step_count=150)  # examples: the profile


# -- minimal repros of bugs the machine found ------------------------------------------------------


def test_replay_below_a_recovered_bucket_seals_and_delivers() -> None:
    """After a reopen, the replay starts a mutable bucket below a recovered sealed bucket.

    The mutable bucket's range then grows across the recovered bucket's range, and its seal
    must not collide with it: every add returns True and every position is delivered.
    """
    clock = ManualClock(T0)
    storage = MemoryStorage()
    config = TrackerConfig(min_index_count_per_bucket=2, max_num_buckets=0)
    due = T0 + 10_000

    def open_index() -> DelayIndex:
        return DelayIndex.open(storage, NAME, config, clock=clock, executor=InlineExecutor())

    with open_index() as index:
        for ledger, entry in [(3, 0), (3, 1), (4, 0), (1, 0)]:  # (4, 0) seals [3, 3]
            assert index.add(ledger, entry, due)
        index.flush()
        assert [(b.start_ledger, b.end_ledger, b.state) for b in index.buckets()] == [
            (3, 3, "durable")
        ]
    with open_index() as index:
        assert len(index) == 2  # bucket [3, 3]; (1, 0) and (4, 0) lived only in memory
        # The dispatcher's replay from its cursor, then one new message.
        for ledger, entry in [(1, 0), (3, 0), (3, 1), (4, 0), (5, 0)]:
            assert index.add(ledger, entry, due), (ledger, entry)
        index.flush()
        index._check()
        clock.set(due)
        assert index.poll(100) == [(1, 0), (3, 0), (3, 1), (4, 0), (5, 0)]
        assert len(index) == 0


def test_acknowledged_positions_are_not_delivered_after_reopen() -> None:
    """``set_mark_delete`` acknowledges for good: a reopen must not bring acked positions back.

    API.md: positions at or below the mark are "untracked and never delivered", and only a
    position "not yet covered by set_mark_delete may come back after a restart". Here the mark
    falls inside a durable bucket (which is therefore kept), so its snapshot still holds the
    acknowledged position.
    """
    clock = ManualClock(T0)
    storage = MemoryStorage()
    config = TrackerConfig(min_index_count_per_bucket=2, max_num_buckets=0)
    due = T0 + 10_000

    def open_index() -> DelayIndex:
        return DelayIndex.open(storage, NAME, config, clock=clock, executor=InlineExecutor())

    with open_index() as index:
        for ledger, entry in [(1, 0), (1, 1), (2, 0)]:  # (2, 0) seals [1, 1]
            assert index.add(ledger, entry, due)
        index.set_mark_delete(1, 0)
        assert not index.contains(1, 0)
        assert len(index) == 2
    with open_index() as index:
        clock.set(due)
        assert not index.contains(1, 0)
        assert (1, 0) not in index.poll(100)


def test_mark_delete_persists_after_a_commit_whose_outcome_was_lost() -> None:
    """A manifest commit lands but its acknowledgement is lost, and so is the read checking it.

    The seal's snapshot may stay in memory (a failed create), but once storage is healthy again
    the index must persist its mark-delete position on close: a reopen must not bring the
    acknowledged position back.
    """
    clock = ManualClock(T0)
    storage = MemoryStorage()
    config = TrackerConfig(min_index_count_per_bucket=2, max_num_buckets=0)
    due = T0 + 10_000

    def open_index() -> DelayIndex:
        return DelayIndex.open(storage, NAME, config, clock=clock, executor=InlineExecutor())

    with open_index() as index:
        for ledger, entry in [(1, 0), (1, 1), (2, 0)]:  # (2, 0) seals [1, 1]
            assert index.add(ledger, entry, due)
        storage.inject_failure("manifest", times=MAX_ATTEMPTS, after=True)  # lands, no ack
        storage.inject_failure("manifest", times=MAX_ATTEMPTS)  # the read-back fails too
        for ledger, entry in [(2, 1), (3, 0)]:  # (3, 0) seals [2, 2]: its create fails
            assert index.add(ledger, entry, due)
        assert storage.pending_failures("manifest") == 0
        index.set_mark_delete(1, 0)  # [1, 1] straddles the mark: kept
    with open_index() as index:
        assert index.mark_delete == (1, 0)
        clock.set(due)
        assert (1, 0) not in index.poll(100)


def test_a_position_added_below_the_mark_is_neither_tracked_nor_delivered() -> None:
    """A position at or below the mark-delete is acknowledged (API.md, "Acknowledgement"):
    ``add`` returns True (do not deliver) but does not track it, so its sealed bucket and the
    mutable one agree (before the fix the mutable one delivered it, the sealed one dropped it).
    """
    clock = ManualClock(T0)
    config = TrackerConfig(min_index_count_per_bucket=1, max_num_buckets=0)
    due = T0 + 10_000
    index = DelayIndex.open(MemoryStorage(), NAME, config, clock=clock, executor=InlineExecutor())
    with index:
        index.set_mark_delete(5, 0)
        assert index.add(1, 0, due)
        assert index.add(2, 0, due)  # would seal [1, 1]
        assert index.add(5, 0, due)  # in what would be the mutable bucket
        assert len(index) == 0 and not index.contains(1, 0) and not index.contains(5, 0)
        clock.set(due)
        assert index.poll(100) == []
        assert index.stats()["acked_on_add"] == 3
