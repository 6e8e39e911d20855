"""Fault storm: a DelayIndex over a MemoryStorage where 5% of *every* storage call fails.

A simulated dispatcher drives a realistic workload (``delayindex.workload``, the demo's mix: half
the messages delayed, 1 s to 10 days) on a :class:`ManualClock`: it publishes windows of 100 ms
with ``add_many``, polls whatever is due, acknowledges every delivered message, and moves the
mark-delete to the end of the contiguous acknowledged prefix (as a broker's cursor does). At
:data:`RESTART_AT` of the publishing it closes the index and reopens it (retrying the open while
the faults make it fail, as an operator would), re-applies the cursor's mark and replays every
message read since the mark, exactly like a dispatcher after a restart. Then it drains: the clock
moves to the next delivery time (in steps of at least :data:`DRAIN_STEP_MS`) until nothing is
tracked and nothing is due.

The storage fails each call with probability 5% (every attempt of that call, so the caller
sees ``StorageError``); half of the failing creates, deletes and manifest commits take effect
before they fail (lost acknowledgements). Small buckets give hundreds of seals, loads, merges
and deletes. At the end the faults stop, failed deletes are retried, and the test checks:

* nothing lost: every message is delivered at least once (``add`` returning False counts);
* no duplicates except the replay's: a message is delivered twice only if it was delivered
  before the restart above the mark (the at-least-once window), and at most once per restart;
* nothing early: ``strict=True``, so no delivery precedes ``deliver_at``;
* no orphans: every stored object is referenced by the manifest, no intent is pending, no dead
  letter exists, and the objects are exactly the live buckets' (none: everything was consumed);
  a reopen afterwards finds nothing to deliver;
* the storm was real: hundreds of injected failures, failed creates, loads, deletes, merges.

Why the restart comes early: an open reads every live bucket (length, metadata, first segment)
and fails as a whole if one read fails, so at 5% per call it succeeds with probability about
``0.95 ** (3 * buckets)``. Failed merges let the bucket count grow well past
``max_num_buckets`` during the run, so the restart is placed where there are still few buckets.

Sizes: 1,000,000 messages with the native extension. In pure mode (``DELAYINDEX_NO_EXTENSIONS=1``)
the core is Python and the run takes about 5x longer (about 20 s for 1M here: most of the time
goes to numpy, the codec and the storage, shared by both modes), so it uses
:data:`PURE_MESSAGES` to keep the suite's pure run short; bucket and segment sizes shrink with the
message count, so the smaller run still seals, merges and deletes as often. ``InlineExecutor``
makes a run deterministic for its seed; the default thread executor runs too, where the draws
depend on scheduling (and group commit batches more, so fewer calls fail). With a thread the
dispatcher waits for the index's writes every :data:`CATCH_UP_EVERY` windows and drain steps
(faults on), as a real one, far slower per window, would give them time to run.
``DELAYINDEX_STORM_SEEDS=1,2,3`` runs other seeds (a soak); the defaults are a fixed seed
and a regression seed.
"""

from __future__ import annotations

import os
from concurrent.futures import Executor
from dataclasses import dataclass
from typing import cast

import numpy as np
import numpy.typing as npt
import pytest

from delayindex import DelayIndex, ManualClock, MemoryStorage, Position, TrackerConfig, _impl
from delayindex.errors import RecoveryError, StoreLockedError
from delayindex.executors import InlineExecutor
from delayindex.workload import Workload, generate

NATIVE_MESSAGES = 1_000_000
PURE_MESSAGES = 300_000
FAULT_RATE = 0.05
NAME = "storm"
# 9: a lost acknowledgement of a group commit (fixed); 2026 chosen before any result was seen.
SEEDS = [int(s) for s in os.environ.get("DELAYINDEX_STORM_SEEDS", "2026,9").split(",")]
ENTRIES_PER_LEDGER = 1000
WINDOW_MS = 100
POLL_BATCH = 2000
DRAIN_STEP_MS = 60_000
#: Where the restart happens, as a share of the publish windows (see the module docstring).
RESTART_AT = 0.1
RETRY_DELAY_MS = 1_000
#: Publish windows between two :meth:`Dispatcher.catch_up` calls.
CATCH_UP_EVERY = 10
#: Bucket and segment sizes at 1M messages (scaled down with the message count): small, so
#: that the run seals, loads, merges and deletes hundreds of times.
BUCKET_INDEXES = 1_500
SEGMENT_INDEXES = 500
#: Opens an operator tries before giving up (each succeeds with probability ~5% or more).
MAX_OPEN_ATTEMPTS = 1_000
#: Polls in a row that may come back empty while messages are due (failed loads) before the
#: test calls it a livelock: at 5% per call, 50 failures in a row do not happen.
MAX_EMPTY_POLLS = 50
#: Injected failures a run must see. Measured: ~230 inline in both modes; ~145-170 with the
#: thread executor (group commit batches more, so fewer calls), now that the dispatcher lets
#: the index's thread catch up while the faults are on (before, the thread did most of its
#: writes after :meth:`Dispatcher.settle` turned them off, and CI saw as few as 8). 75 is about
#: six standard deviations below the thread's mean.
MIN_INJECTED = {"inline": 150, "thread": 75}

Int64Array = npt.NDArray[np.int64]


@dataclass
class Run:
    """What a storm run observed."""

    deliveries: npt.NDArray[np.int32]
    replay_window: npt.NDArray[np.bool_]  # delivered before the restart, above the mark
    early: int
    restarts: int
    open_failures: int
    ops: dict[str, dict[str, int]]  # the index's op counters, summed over its incarnations


class Dispatcher:
    """The simulated dispatcher and its cursor over one workload (see the module docstring)."""

    def __init__(
        self,
        workload: Workload,
        storage: MemoryStorage,
        clock: ManualClock,
        config: TrackerConfig,
        executor: str,
    ) -> None:
        self.w = workload
        self.storage = storage
        self.config = config
        self.executor = executor
        n = len(workload)
        self.clock = clock
        self.deliveries = np.zeros(n, dtype=np.int32)
        self.acked = np.zeros(n, dtype=np.bool_)
        self.cursor = 0  # messages [0, cursor) are acknowledged: the mark-delete is cursor - 1
        self.published = 0  # messages [0, published) have been read by the dispatcher
        self.early = 0
        self.open_failures = 0
        self.ops_seen: dict[str, dict[str, int]] = {}
        self.index = self.open()

    # -- the index --------------------------------------------------------------------------------

    def open(self) -> DelayIndex:
        """Open the index, retrying while the storage faults make recovery fail."""
        for _ in range(MAX_OPEN_ATTEMPTS):
            executor: Executor | None = InlineExecutor() if self.executor == "inline" else None
            try:
                return DelayIndex.open(
                    self.storage, NAME, self.config, clock=self.clock, executor=executor
                )
            except (RecoveryError, StoreLockedError):
                self.open_failures += 1
        raise AssertionError(f"the index did not open in {MAX_OPEN_ATTEMPTS} attempts")

    def restart(self) -> None:
        """Close and reopen, then re-apply the cursor's mark and replay everything after it."""
        self.collect_ops()
        self.index.close()
        self.index = self.open()
        if self.cursor:
            self.index.set_mark_delete(*self.position(self.cursor - 1))
        for start in range(self.cursor, self.published, 100_000):
            self.add(self.w.window(start, min(start + 100_000, self.published)))
        self.dispatch()

    def collect_ops(self) -> None:
        """Add the index's op counters to the run's (an index's counters die with it)."""
        for op, counts in self.index.stats()["ops"].items():
            seen = self.ops_seen.setdefault(op, {"succeeded": 0, "failed": 0})
            seen["succeeded"] += counts["succeeded"]
            seen["failed"] += counts["failed"]

    # -- dispatching ------------------------------------------------------------------------------

    def position(self, i: int) -> tuple[int, int]:
        """The position of message ``i``."""
        return int(self.w.ledger_ids[i]), int(self.w.entry_ids[i])

    def indexes(self, ledgers: Int64Array, entries: Int64Array) -> Int64Array:
        """Message numbers of positions (the workload's layout: fixed entries per ledger)."""
        first = int(self.w.ledger_ids[0])
        out: Int64Array = (ledgers - first) * ENTRIES_PER_LEDGER + entries
        return out

    def deliver(self, idx: Int64Array) -> None:
        """Hand messages to consumers (counted, checked for earliness) and acknowledge them."""
        due = self.w.deliver_at[idx]
        self.early += int((due > self.clock()).sum())
        np.add.at(self.deliveries, idx, 1)
        self.acked[idx] = True

    def add(self, chunk: Workload) -> None:
        """Offer messages to the index; those it does not track are delivered at once."""
        accepted = self.index.add_many(chunk.ledger_ids, chunk.entry_ids, chunk.deliver_at)
        self.deliver(self.indexes(chunk.ledger_ids, chunk.entry_ids)[~accepted])

    def publish(self, chunk: Workload, window_end: int) -> None:
        """One publish window: the clock moves to its end, its messages arrive, due ones go."""
        self.clock.set(max(self.clock(), window_end - 1))
        self.published += len(chunk)
        self.add(chunk)
        self.dispatch()

    def dispatch(self) -> None:
        """Poll while messages are due (a failed load leaves them due: the next poll retries)."""
        empty = 0
        while self.index.has_message_available():
            batch: list[Position] = self.index.poll(POLL_BATCH)
            if not batch:
                empty += 1
                if empty >= MAX_EMPTY_POLLS:
                    warnings = self.index.stats()["warnings"][-3:]
                    raise AssertionError(f"due messages never come (livelock): {warnings}")
                continue
            empty = 0
            pairs = np.asarray(batch, dtype=np.int64).reshape(-1, 2)
            self.deliver(self.indexes(pairs[:, 0], pairs[:, 1]))
        self.acknowledge()

    def acknowledge(self) -> None:
        """Move the mark-delete to the end of the contiguous acknowledged prefix."""
        if self.cursor >= self.published or not self.acked[self.cursor]:
            return
        start, block = self.cursor, 4096
        while start < self.published:  # blocks of doubling size: amortized O(distance moved)
            stop = min(start + block, self.published)
            rest = self.acked[start:stop]
            if not rest.all():
                start += int(rest.argmin())
                break
            start, block = stop, block * 2
        self.cursor = min(start, self.published)
        self.index.set_mark_delete(*self.position(self.cursor - 1))

    def drain(self) -> None:
        """Move the clock from delivery to delivery until nothing is tracked or due."""
        steps = 0
        while len(self.index) or self.index.has_message_available():
            nxt = self.index.next_delivery_time()
            if nxt is not None and nxt > self.clock():
                self.clock.set(max(nxt, self.clock() + DRAIN_STEP_MS))
            self.dispatch()
            steps += 1
            if steps % CATCH_UP_EVERY == 0:
                self.catch_up()

    def catch_up(self) -> None:
        """Wait, faults still on, for the background writes started so far (thread executor).

        A simulated dispatcher outruns a real one: it publishes a window in microseconds, so
        without this the index's thread would do most of its creates and deletes only in
        :meth:`settle`, after the faults stop, and the storm would barely touch it.
        """
        if self.executor != "inline":  # inline work is done when its call returns
            self.index.flush()  # a failed change is kept for its retry, never raised here

    def settle(self) -> None:
        """Faults off: finish in-flight work, then let every failed change be retried."""
        self.catch_up()
        self.storage.set_fault_rate(0)
        self.index.flush()
        for _ in range(3):
            # Past the longest backoff (64x the first delay); a poll starts the retries.
            self.clock.advance(RETRY_DELAY_MS * 64 + 1)
            assert self.index.poll(POLL_BATCH) == []
            self.index.flush()


def storm(
    messages: int, executor: str, *, seed: int, restart_at: float = RESTART_AT
) -> tuple[Run, Dispatcher]:
    """Run the storm; return what it observed and the dispatcher (its index still open)."""
    scale = messages / NATIVE_MESSAGES
    config = TrackerConfig(
        strict=True,
        min_index_count_per_bucket=max(100, int(BUCKET_INDEXES * scale)),
        max_indexes_per_segment=max(50, int(SEGMENT_INDEXES * scale)),
        max_num_buckets=12,
        delete_retry_delay_ms=RETRY_DELAY_MS,
        max_delete_attempts=50,  # 50 failures in a row at 5%: never; nothing may dead-letter
    )
    workload = generate(messages, seed=seed, entries_per_ledger=ENTRIES_PER_LEDGER)
    clock = ManualClock(int(workload.publish_ms[0]))
    storage = MemoryStorage(clock=clock)
    storage.set_fault_rate(FAULT_RATE, seed=seed)
    d = Dispatcher(workload, storage, clock, config, executor)
    chunks = list(workload.chunks_by_publish_time(WINDOW_MS))
    replay = np.zeros(messages, dtype=np.bool_)
    restarts = 0
    try:
        for n, (window_end, chunk) in enumerate(chunks):
            d.publish(chunk, window_end)
            if n % CATCH_UP_EVERY == CATCH_UP_EVERY - 1:
                d.catch_up()
            if n == int(len(chunks) * restart_at):
                replay[d.cursor : d.published] = d.deliveries[d.cursor : d.published] > 0
                d.restart()
                restarts += 1
        d.drain()
        d.settle()
    except BaseException:
        d.index.close()  # stops the index's thread, if it has one
        raise
    d.collect_ops()
    return Run(d.deliveries, replay, d.early, restarts, d.open_failures, d.ops_seen), d


def violations(run: Run, d: Dispatcher) -> list[str]:
    """Every invariant of the module docstring that does not hold (all of them, for a report)."""
    index, storage, n = d.index, d.storage, len(d.w)
    out: list[str] = []

    def expect(ok: bool, what: str) -> None:
        if not ok:
            out.append(what)

    # Complete delivery.
    expect(d.published == n, f"published {d.published} of {n}")
    expect(len(index) == 0, f"{len(index)} positions still tracked")
    expect(not index.has_message_available(), "messages still due")
    # Zero lost; duplicates only inside the restart's replay window, at most once per restart.
    lost = np.flatnonzero(run.deliveries == 0)
    expect(lost.size == 0, f"{lost.size} messages never delivered, e.g. {lost[:10].tolist()}")
    outside = np.flatnonzero((run.deliveries > 1) & ~run.replay_window)
    expect(outside.size == 0, f"{outside.size} duplicates outside the replay: {outside[:10]}")
    most = int(run.deliveries.max())
    expect(most <= 1 + run.restarts, f"a message was delivered {most} times")
    # Nothing early (strict mode).
    expect(run.early == 0, f"{run.early} deliveries before their deliver_at")
    # The cursor acknowledged everything, and the index's mark followed it.
    expect(d.cursor == n, f"cursor at {d.cursor} of {n}")
    expect(index.mark_delete == d.position(n - 1), f"mark-delete {index.mark_delete}")
    # Zero orphans, no pending intents, no dead letters; objects are exactly the live buckets.
    manifest = storage.read_manifest(NAME)
    objects = {o.id for o in storage.list_objects()}
    orphans = objects - manifest.referenced_ids()
    expect(not orphans, f"orphan objects (in no manifest): {sorted(orphans)}")
    intents = [(i.kind, i.snapshot_id) for i in manifest.intents]
    expect(not intents, f"pending intents: {intents}")
    dead = [i.snapshot_id for i in manifest.dead_letters]
    expect(not dead, f"dead letters: {dead}")
    # A durable bucket is stored: its snapshot_id is set.
    durable = cast("set[str]", {b.snapshot_id for b in index.buckets() if b.state == "durable"})
    expect(
        objects == manifest.live_ids() == durable,
        f"objects {sorted(objects)}, live in the manifest {sorted(manifest.live_ids())}, "
        f"durable in the index {sorted(durable)}",
    )
    # Everything was consumed, so every sealed bucket was retired and its snapshot deleted.
    expect(index.buckets() == [], f"buckets left: {index.buckets()}")
    try:
        index._check()
    except AssertionError as exc:
        out.append(f"index invariants: {exc}")
    return out


def storm_size(run: Run, d: Dispatcher) -> list[str]:
    """Evidence that the faults really hit the run (so that it cannot pass vacuously)."""
    faults = d.storage.fault_counts()
    failed_calls = {op: c["before"] + c["after"] for op, c in faults.items()}
    lost_acks = sum(faults[op]["after"] for op in ("create", "delete", "commit_manifest"))
    out = []
    if sum(failed_calls.values()) < MIN_INJECTED[d.executor]:
        out.append(f"only {sum(failed_calls.values())} injected failures: {failed_calls}")
    # The ops a DelayIndex uses all the time (list_* are never called, lock and read_manifest
    # rarely: on open, and after a failed commit).
    if lost_acks == 0:
        out.append("no lost acknowledgement")
    if d.executor != "inline":
        # With a thread, group commit batches whatever queued up meanwhile: how many calls each
        # op makes (hence which ops draw a fault) depends on scheduling. The totals above hold.
        return out
    busy = ("create", "length", "get_segments", "delete", "commit_manifest")
    out += [f"no injected failure of {op}" for op in busy if not failed_calls[op]]
    out += [
        f"no failed {op} in the index: {run.ops}"
        for op in ("create", "load", "delete")
        if not run.ops[op]["failed"]
    ]
    if not (run.ops["merge"]["failed"] and run.ops["merge"]["succeeded"]):
        out.append(f"merges did not both fail and succeed: {run.ops['merge']}")
    return out


@pytest.mark.slow
@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("executor", ["inline", "thread"])
def test_fault_storm(executor: str, seed: int) -> None:
    """The issue's acceptance test (see the module docstring)."""
    messages = NATIVE_MESSAGES if _impl.NATIVE else PURE_MESSAGES
    run, d = storm(messages, executor, seed=seed)
    faults = sum(sum(c.values()) for c in d.storage.fault_counts().values())
    print(
        f"storm {executor} seed={seed} messages={messages}: "
        f"{faults} injected failures, {run.open_failures} failed opens, ops {run.ops}"
    )
    try:
        assert storm_size(run, d) == []
        assert violations(run, d) == []
    finally:
        d.index.close()
    # A reopen after the storm brings nothing back: the mark and the deletes were persisted.
    with DelayIndex.open(
        d.storage, NAME, d.config, clock=d.clock, executor=InlineExecutor()
    ) as again:
        assert len(again) == 0
        d.clock.advance(20 * 86_400_000)
        assert again.poll(POLL_BATCH) == []
    assert d.storage.list_objects() == []
