"""Child process of the crash harness's shared-topic scenario (``tests/test_crash_harness.py``).

How it works. ``python tests/crash_child_shared.py STORE JOURNAL --crash-at K`` runs one
deterministic simulation of a topic with three subscriptions on a
:class:`~delayindex.SharedDelayIndex` over ``FileStorage(STORE, step_hook=hook)``: the workload,
the configuration, the clock, the windows and the step hook are ``crash_child``'s. The topic's
dispatcher adds each window's messages once (``add``: False means every subscription delivers
it at once); background jobs run on a :class:`~delayindex.executors.ManualExecutor` every other
window; each subscription polls and acknowledges at its own pace (:data:`PACES`: ``fast`` every
window until nothing is due, ``medium`` a few batches every third window, ``slow`` one small
batch every seventh window, so the due log holds what it has not read yet), acknowledging the
contiguous prefix of what it received; ``flush()`` runs now and then; after the last window the
clock runs on while every subscription drains, then ``close()``. There is no ``clear()`` (a
rewind resets every subscription: ``crash_child`` covers the rewind of one index).

Durability, as the journal reports it. A subscription's mark is acknowledged when its
``set_mark_delete`` is called (``A``, written *before* the call: a commit inside it may carry
the mark). It is durable once a manifest commit (or ``close``) carried it: after every
dispatcher step the child reads the stored manifest and journals the subscription records that
changed (``U``). A commit may land in the step that dies, so after a crash a subscription's
stored mark lies between its last ``U`` and its last ``A``. After every step the child also
checks that once the topic's catalog has nothing pending, the stored records are the ones the
shared index noted (exit 3 otherwise): a commit carries the marks.

Journal lines (message indexes into the workload, as in ``crash_child``): ``T ms``; ``D i...``
(delivered at once to every subscription); ``P sub i...`` (``sub``'s poll returned these);
``A sub i`` (``sub`` acknowledges messages ``0..i``); ``U sub i`` (the stored mark of ``sub`` is
message ``i``, ``-1`` for none); ``C i...`` (after a ``flush()``: the messages the topic index
tracks in durable sealed buckets); ``S k label``; ``I impl``; ``E`` (finished).

The child keeps a model of what each subscription still has to receive and checks it against
the index (exit 3 on a mismatch): a poll returns only due positions it had to receive, and at
every checkpoint each subscription's ``len`` matches the model and the invariants hold.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import cast

from crash_child import (
    CONFIG,
    FLUSH_EVERY,
    RUN_JOBS_EVERY,
    START_MS,
    TAIL_STEP_MS,
    TAIL_STEPS,
    Dispatcher,
    Journal,
    Messages,
    StepHook,
    begin,
    main,
    publish_windows,
    workload,
)

from delayindex import FileStorage, ManualClock, SharedDelayIndex, Subscription

NAME = "shared"


@dataclass(frozen=True)
class Pace:
    """When a subscription polls (every ``every`` windows, at ``offset``), how much (``batches``
    polls of ``batch``; 0: until nothing is due) and how often it acknowledges (every
    ``ack_every`` turns)."""

    every: int
    offset: int
    batch: int
    batches: int
    ack_every: int


PACES: dict[str, Pace] = {
    "fast": Pace(every=1, offset=0, batch=64, batches=0, ack_every=1),
    "medium": Pace(every=3, offset=1, batch=32, batches=3, ack_every=2),
    "slow": Pace(every=7, offset=3, batch=16, batches=1, ack_every=3),
}
SUBS = tuple(PACES)


@dataclass
class SubModel:
    """One subscription's dispatcher: what it received, what it must still receive, its mark."""

    view: Subscription
    pace: Pace
    received: set[int] = field(default_factory=set)
    pending: set[int] = field(default_factory=set)  # tracked, to be received by this one
    mark: int = -1
    turns: int = 0


class SharedDispatcher:
    """The topic's dispatcher and its subscriptions' (see the module docstring)."""

    def __init__(
        self,
        shared: SharedDelayIndex,
        storage: FileStorage,
        clock: ManualClock,
        msgs: Messages,
        journal: Journal,
    ) -> None:
        self.shared, self.storage, self.clock = shared, storage, clock
        self.msgs, self.journal = msgs, journal
        self.subs = {name: SubModel(shared.subscribe(name), PACES[name]) for name in SUBS}
        self.read = 0
        self.durable: dict[str, int] = {}

    # Sets self.clock, journals ``T``; the cast: it only reads attributes both classes have.
    set_clock = cast("Callable[[SharedDispatcher, int], None]", Dispatcher.set_clock)
    fail = staticmethod(Dispatcher.fail)

    def add(self, stop: int) -> None:
        """The topic's building cursor: read messages ``read..stop-1`` and add them once."""
        msgs, now_delivered = self.msgs, []
        for i in range(self.read, stop):
            if self.shared.add(*msgs.position(i), int(msgs.deliver[i])):
                for sub in self.subs.values():
                    sub.pending.add(i)
            else:
                now_delivered.append(i)
        self.read = max(self.read, stop)
        for sub in self.subs.values():
            sub.received.update(now_delivered)
        if now_delivered:
            self.journal.write("D", now_delivered)
        self.note_durable()

    def turn(self, name: str, drain: bool = False) -> None:
        """One polling turn of ``name`` at its pace (``drain``: until nothing is due)."""
        sub = self.subs[name]
        batches = 0 if drain else sub.pace.batches
        polls = 0
        while not batches or polls < batches:
            batch = sub.view.poll(sub.pace.batch)
            polls += 1
            if not batch:
                break
            polled = [self.msgs.index_of(*p) for p in batch]
            now = self.clock()
            if not sub.pending.issuperset(polled):
                self.fail(f"{name} polled {sorted(set(polled) - sub.pending)}, not pending")
            late = [i for i in polled if not 0 <= self.msgs.deliver[i] <= now]
            if late:
                self.fail(f"{name} polled {late} before they were due (now {now})")
            self.journal.write("P", (name, *polled))
            sub.received.update(polled)
            sub.pending.difference_update(polled)
        self.note_durable()
        sub.turns += 1
        if drain or sub.turns % sub.pace.ack_every == 0:
            self.acknowledge(name)

    def acknowledge(self, name: str) -> None:
        """Mark-delete the contiguous prefix ``name`` received."""
        sub = self.subs[name]
        mark = sub.mark
        while mark + 1 < self.read and mark + 1 in sub.received:
            mark += 1
        if mark == sub.mark:
            return
        self.journal.write("A", (name, mark))  # before the call: a commit in it may carry it
        sub.view.set_mark_delete(*self.msgs.position(mark))
        sub.mark = mark
        sub.pending = {i for i in sub.pending if i > mark}
        self.note_durable()

    def note_durable(self) -> None:
        """Journal the subscription marks the stored manifest holds, where they changed; and
        check that a catalog with nothing pending stored what the shared index noted."""
        stored = self.storage.read_manifest(NAME).subscriptions
        marks = {
            r.name: -1 if r.mark_delete is None else self.msgs.index_of(*r.mark_delete)
            for r in stored
        }
        for name, mark in sorted(marks.items()):
            if self.durable.get(name) != mark:
                self.journal.write("U", (name, mark))
        self.durable = marks
        catalog = self.shared._topic._catalog
        if not catalog.mark_pending and not catalog.stale:
            noted = {n: s.mark for n, s in self.subs.items()}
            got = {r.name: r.mark_delete for r in stored}
            want = {n: None if m < 0 else self.msgs.position(m) for n, m in noted.items()}
            if got != want:
                self.fail(f"nothing pending, yet the stored marks are {got}, noted {want}")

    def checkpoint(self) -> None:
        """flush(), check the model, journal what the topic index holds in durable buckets."""
        self.shared.flush()
        self.shared._check()
        for name, sub in self.subs.items():
            if len(sub.view) != len(sub.pending):
                self.fail(f"{name} has {len(sub.view)} to receive, the model {len(sub.pending)}")
            missing = [i for i in sub.pending if not sub.view.contains(*self.msgs.position(i))]
            if missing:
                self.fail(f"{name} does not contain {missing[:10]}")
        ranges = [
            (b.start_ledger, b.end_ledger) for b in self.shared.buckets() if b.state == "durable"
        ]
        topic, ledgers = self.shared._topic, self.msgs.ledgers
        durable = [
            i
            for i in range(self.read)
            if any(s <= ledgers[i] <= e for s, e in ranges)
            and topic.contains(*self.msgs.position(i))
        ]
        self.journal.write("C", durable)
        self.note_durable()


def run(store: str, messages: int, seed: int, hook: StepHook) -> None:
    """The whole simulation (see the module docstring)."""
    msgs = workload(messages, seed)
    journal = hook.journal
    clock, executor, storage = begin(store, hook)
    shared = SharedDelayIndex.open(storage, NAME, CONFIG, clock=clock, executor=executor)
    hook.index = shared._topic
    dispatcher = SharedDispatcher(shared, storage, clock, msgs, journal)
    dispatcher.set_clock(START_MS)
    for w, (end, stop) in enumerate(publish_windows(msgs)):
        dispatcher.set_clock(end)
        dispatcher.add(stop)
        if w % RUN_JOBS_EVERY == RUN_JOBS_EVERY - 1:
            executor.run_pending()
            dispatcher.note_durable()
        for name, pace in PACES.items():
            if w % pace.every == pace.offset:
                dispatcher.turn(name)
        if w % FLUSH_EVERY == FLUSH_EVERY - 1:
            dispatcher.checkpoint()
    for _ in range(TAIL_STEPS):
        dispatcher.set_clock(clock() + TAIL_STEP_MS)
        executor.run_pending()
        for name in SUBS:
            dispatcher.turn(name, drain=True)
    dispatcher.checkpoint()
    shared.close()
    dispatcher.note_durable()
    executor.shutdown()
    storage.close()
    journal.write("E")


if __name__ == "__main__":
    sys.exit(main(simulation=run, doc=__doc__))
