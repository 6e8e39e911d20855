"""Child process of the crash-injection harness (``tests/test_crash_harness.py``).

How it works. ``python tests/crash_child.py STORE JOURNAL --crash-at K`` runs one deterministic
dispatcher simulation on ``FileStorage(STORE, step_hook=hook)``: a seeded workload of a few
thousand messages over many ledgers is added in publish order, one publish-time window at a
time, on a :class:`~delayindex.ManualClock`; background jobs (snapshot writes, merges, deletes)
run on a :class:`~delayindex.executors.ManualExecutor` every other window, so they lag behind
the adds as a real background thread would; due messages are polled, the contiguous delivered
prefix is acknowledged with ``set_mark_delete``, ``flush()`` runs now and then, once the index
is cleared (a cursor rewind: everything after the mark-delete position is re-added), and after
the last window the clock runs on for a while before ``close()``.

The step hook counts the storage's durable filesystem steps. In a dry run (``--crash-at 0``)
it journals every step with a label ``job:catalog_method#commits:step`` (the job and protocol
method come from the call stack; ``+merge`` marks steps taken while a merge is in flight,
read from the index's ``_merge_in_flight`` without its lock, because the hook may run while the
lock is held). With ``--crash-at K`` the process dies just before step K: ``os._exit(77)``, or
with ``--kill`` a SIGKILL to itself. ``--expect-label`` makes a crash run check that step K is
the step the dry run saw (exit 78 otherwise), which proves the run is deterministic.

The journal tells the parent what a dispatcher would know after the crash. It is written with
``os.write`` (no buffering, so it survives ``os._exit``), one line per event, message indexes
(into the workload) instead of positions:

* ``T ms``: the clock was set to ``ms`` (the parent reopens at the last one);
* ``D i...``: ``add`` returned False for these messages (delivered at once);
* ``P i...``: ``poll`` returned these messages;
* ``M i``: ``set_mark_delete`` acknowledged messages ``0..i`` (written after it returned: the
  dispatcher's durable cursor);
* ``K``: ``clear()`` starts (earlier checkpoints, cancels and reschedules no longer hold);
* ``x i...`` / ``r i t``: ``cancel`` of these tracked messages / ``reschedule`` of message ``i``
  to ``t`` (later than its own time) returned; ``X i...`` / ``R i t``: the same, acknowledged:
  a ``flush()`` after them returned, so they must survive a crash;
* ``C i...``: after a ``flush()``, the tracked messages that are durable in sealed buckets;
* ``S k label``: step ``k`` (every step in a dry run; the fatal one in a crash run);
* ``I impl``: the implementation the child runs (``native`` or ``pure``);
* ``E``: the run finished.

The child checks its own model of the tracked set against the index at every checkpoint (exit
3 on a mismatch), so a checkpoint never claims more than the index holds.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from types import FrameType

import numpy as np
import numpy.typing as npt

from delayindex import NATIVE, DelayIndex, FileStorage, ManualClock, TrackerConfig
from delayindex.executors import ManualExecutor

NAME = "crash"
EXIT_CRASHED = 77
EXIT_WRONG_STEP = 78
EXIT_MODEL_MISMATCH = 3
START_MS = 1_767_225_600_000
ENTRIES_PER_LEDGER = 10
PUBLISH_PER_SECOND = 25
WINDOW_MS = 1_000
RUN_JOBS_EVERY = 2  # windows between ManualExecutor.run_pending() calls
FLUSH_EVERY = 9  # windows between flush() checkpoints
CANCELS_PER_CHECKPOINT, RESCHEDULES_PER_CHECKPOINT = 2, 1  # made just before each checkpoint
RESCHEDULE_BY_MS = 30_000  # a reschedule moves a message this much later
CLEAR_AT = 0.45  # clear() after this fraction of the windows
TAIL_STEPS, TAIL_STEP_MS = 24, 5_000  # after publishing: the clock runs on, polling
POLL_BATCH = 64
MESSAGES, SEED = 2_400, 7  # the default workload

#: Small buckets and segments, few buckets: seals, loads and merges happen every few seconds.
CONFIG = TrackerConfig(
    tick_ms=0,
    strict=True,
    min_index_count_per_bucket=30,
    max_indexes_per_segment=16,
    max_time_step_per_segment_ms=10_000,
    max_num_buckets=3,
    fixed_delay_lookahead=0,
    delete_retry_delay_ms=1_000,
)

I64 = npt.NDArray[np.int64]


@dataclass(frozen=True)
class Messages:
    """The workload, in publish (= position) order; ``deliver[i] == -1``: not delayed."""

    ledgers: I64
    entries: I64
    publish: I64
    deliver: I64

    def __len__(self) -> int:
        return len(self.ledgers)

    def position(self, i: int) -> tuple[int, int]:
        """Message ``i``'s ``(ledger, entry)``."""
        return int(self.ledgers[i]), int(self.entries[i])

    @staticmethod
    def index_of(ledger: int, entry: int) -> int:
        """The message stored at ``(ledger, entry)``."""
        return (ledger - 1) * ENTRIES_PER_LEDGER + entry


def workload(n: int, seed: int) -> Messages:
    """``n`` messages: 15% not delayed; in the first 60%, delays of 0.2-5 s (some 5-20 s), so
    the acknowledged prefix moves and buckets drain; later, 30% of 10-120 s and 10% of 5-30
    min, so sealed buckets pile up and merge."""
    rng = np.random.default_rng(seed)
    index = np.arange(n, dtype=np.int64)
    ledgers = 1 + index // ENTRIES_PER_LEDGER
    entries = index % ENTRIES_PER_LEDGER
    publish = START_MS + index * 1000 // PUBLISH_PER_SECOND
    late = index >= int(n * 0.6)
    u = rng.random(n)
    short = rng.integers(200, 5_000, n, endpoint=True)
    medium = rng.integers(5_000, 20_000, n, endpoint=True)
    long = rng.integers(10_000, 120_000, n, endpoint=True)
    very_long = rng.integers(300_000, 1_800_000, n, endpoint=True)
    delay = np.where(
        late,
        np.where(u < 0.6, short, np.where(u < 0.9, long, very_long)),
        np.where(u < 0.9, short, medium),
    )
    deliver = np.where(rng.random(n) < 0.15, -1, publish + delay).astype(np.int64)
    return Messages(ledgers, entries, publish, deliver)


# -- the journal -------------------------------------------------------------------------------


class Journal:
    """Unbuffered, append-only event lines (survive ``os._exit``)."""

    def __init__(self, path: str) -> None:
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o644)

    def write(self, kind: str, values: Iterable[object] = ()) -> None:
        """Append one line ``kind v1 v2 ...``."""
        data = " ".join([kind, *map(str, values)]).encode() + b"\n"
        view = memoryview(data)
        while view:
            view = view[os.write(self._fd, view) :]


# -- the step hook -----------------------------------------------------------------------------

#: DelayIndex methods (besides its ``*_job`` background jobs) that do storage I/O themselves.
_INLINE_JOBS = frozenset({"open", "clear", "close", "flush"})
#: The modules of ``delayindex/tracker/`` that hold DelayIndex's driver (the class and its
#: mixins; ``_damage.py``'s quarantine jobs are not labelled as jobs).
_DRIVER_FILES = (
    "delay_index.py", "_bucket.py", "_housekeeping.py", "_loading.py", "_merge.py",
    "_persist.py", "_recovery.py", "_stats.py",
)  # fmt: skip


def _is_driver(filename: str) -> bool:
    head, base = os.path.split(filename)
    return base in _DRIVER_FILES and os.path.basename(head) == "tracker"


def _is_catalog(filename: str) -> bool:
    """Whether ``filename`` holds Catalog's methods: ``storage/catalog.py`` or one of its mixin
    modules (``storage/_catalog_*.py``)."""
    head, base = os.path.split(filename)
    in_storage = os.path.basename(head) == "storage"
    return in_storage and (base == "catalog.py" or base.startswith("_catalog_"))


def _where(frame: FrameType | None) -> tuple[str, FrameType | None, str]:
    """Where a storage step comes from: ``(job, entry, helper)``.

    ``job`` is the innermost ``DelayIndex`` frame that is a ``*_job`` method (``_merge_job`` ->
    ``merge``) or one of :data:`_INLINE_JOBS`; ``entry`` is the outermost frame of a public
    ``Catalog`` method below it (``create_bucket``, ...); ``helper`` the innermost private
    ``Catalog`` method other than ``_commit`` (``_finish_delete``, ...). Names come from the
    stack, so the labels follow the driver as it changes.
    """
    job, entry, helper = "", None, ""
    while frame is not None and not job:
        code = frame.f_code
        name = code.co_name
        if _is_catalog(code.co_filename):
            if not name.startswith("_"):
                entry = frame
            elif not helper and name != "_commit":
                helper = name
        elif _is_driver(code.co_filename):
            if name.endswith("_job"):
                job = name.strip("_").removesuffix("_job")
            elif name in _INLINE_JOBS:
                job = name
        frame = frame.f_back
    return job or "other", entry, helper


class StepHook:
    """Counts and labels steps; journals them (dry run) or dies at step ``crash_at``.

    A label is ``job:catalog_method#commits[/helper]:step[+merge]``, ``commits`` being how many
    manifest commits that catalog call has started (this step's included), so the steps of each
    commit of a protocol (intent, live, drop) and those between them get labels of their own.
    """

    def __init__(
        self, journal: Journal, crash_at: int, kill: bool, expect_label: str | None
    ) -> None:
        self.journal = journal
        self.crash_at = crash_at
        self.kill = kill
        self.expect_label = expect_label
        self.count = 0
        self.index: DelayIndex | None = None
        self._entry: FrameType | None = None  # kept alive, so a new call never has its id
        self._commits = 0

    def label(self, step: str) -> str:
        """The label of ``step``; called for every step, in order."""
        job, entry, helper = _where(sys._getframe(2))
        if entry is not self._entry:
            self._entry, self._commits = entry, 0
        api = entry.f_code.co_name if entry is not None else "-"
        if step == "manifest.write":
            self._commits += 1
        where = f"{api}#{self._commits}" + (f"/{helper}" if helper else "")
        # Never the index's lock here: the hook may run while it is held.
        merging = self.index is not None and self.index._merge_in_flight
        return f"{job}:{where}:{step}{'+merge' if merging else ''}"

    def __call__(self, step: str) -> None:
        self.count += 1
        label = self.label(step)
        if self.crash_at and self.count != self.crash_at:
            return
        self.journal.write("S", (self.count, label))
        if not self.crash_at:
            return
        if self.expect_label is not None and label != self.expect_label:
            sys.stderr.write(
                f"step {self.count} is {label!r}, the dry run saw {self.expect_label!r}\n"
            )
            os._exit(EXIT_WRONG_STEP)
        if self.kill:
            os.kill(os.getpid(), signal.SIGKILL)
        os._exit(EXIT_CRASHED)


# -- the dispatcher ----------------------------------------------------------------------------


class Dispatcher:
    """Feeds the index like a topic's dispatcher and keeps a model of what it tracks."""

    def __init__(self, index: DelayIndex, clock: ManualClock, msgs: Messages, journal: Journal):
        self.index, self.clock, self.msgs, self.journal = index, clock, msgs, journal
        self.delivered: set[int] = set()  # since the last rewind
        self.tracked: set[int] = set()  # the model of the index's tracked set
        self.mark = -1  # messages 0..mark are acknowledged
        self.read = 0  # messages 0..read-1 were read from the topic
        self.cancelled: set[int] = set()  # since the last rewind (never delivered)
        self.unflushed: list[tuple[str, tuple[int, ...]]] = []  # X/R lines for the next flush

    def set_clock(self, ms: int) -> None:
        self.clock.set(ms)
        self.journal.write("T", (ms,))

    def add(self, stop: int) -> None:
        """Read messages ``read..stop-1`` and add them."""
        msgs, now_delivered = self.msgs, []
        for i in range(self.read, stop):
            ledger, entry = msgs.position(i)
            if self.index.add(ledger, entry, int(msgs.deliver[i])):
                self.tracked.add(i)
            else:
                now_delivered.append(i)
        self.read = max(self.read, stop)
        self.delivered.update(now_delivered)
        if now_delivered:
            self.journal.write("D", now_delivered)

    def poll(self) -> None:
        while True:
            batch = self.index.poll(POLL_BATCH)
            if not batch:
                return
            polled = [self.msgs.index_of(*p) for p in batch]
            if not self.tracked.issuperset(polled):
                self.fail(f"polled {sorted(set(polled) - self.tracked)}, which are not tracked")
            self.journal.write("P", polled)
            self.delivered.update(polled)
            self.tracked.difference_update(polled)

    def acknowledge(self) -> None:
        """Mark-delete the contiguous delivered prefix."""
        mark = self.mark
        while mark + 1 < self.read and (mark + 1 in self.delivered or mark + 1 in self.cancelled):
            mark += 1
        if mark == self.mark:
            return
        self.index.set_mark_delete(*self.msgs.position(mark))
        self.mark = mark
        self.journal.write("M", (mark,))
        self.tracked = {i for i in self.tracked if i > mark}

    def cancel_and_reschedule(self) -> None:
        """Cancel the first tracked messages not due within 2 s and reschedule the next one
        later (deterministic: the dry run and every crash run make the same calls)."""
        soon = self.clock() + 2_000
        candidates = sorted(i for i in self.tracked if int(self.msgs.deliver[i]) > soon)
        chosen = candidates[:CANCELS_PER_CHECKPOINT]
        moved = candidates[
            CANCELS_PER_CHECKPOINT : CANCELS_PER_CHECKPOINT + RESCHEDULES_PER_CHECKPOINT
        ]
        for i in chosen:
            if not self.index.cancel(*self.msgs.position(i)):
                self.fail(f"cancel of tracked message {i} returned False")
            self.tracked.discard(i)
            self.cancelled.add(i)
        if chosen:
            self.journal.write("x", chosen)
            self.unflushed.append(("X", tuple(chosen)))
        for i in moved:
            t = int(self.msgs.deliver[i]) + RESCHEDULE_BY_MS
            if not self.index.reschedule(*self.msgs.position(i), t):
                self.fail(f"reschedule of message {i} to {t} said deliver now")
            self.journal.write("r", (i, t))
            self.unflushed.append(("R", (i, t)))

    def checkpoint(self) -> None:
        """flush(), then journal the acknowledged cancels and reschedules and the tracked
        messages that are in durable sealed buckets."""
        self.index.flush()
        for kind, values in self.unflushed:
            self.journal.write(kind, values)
        self.unflushed.clear()
        for i in self.tracked:
            if not self.index.contains(*self.msgs.position(i)):
                self.fail(f"message {i} {self.msgs.position(i)} is tracked but not contained")
        if len(self.index) != len(self.tracked):
            self.fail(f"the index tracks {len(self.index)} messages, the model {len(self.tracked)}")
        ranges = [
            (b.start_ledger, b.end_ledger) for b in self.index.buckets() if b.state == "durable"
        ]
        ledgers = self.msgs.ledgers
        durable = sorted(i for i in self.tracked if any(s <= ledgers[i] <= e for s, e in ranges))
        self.journal.write("C", durable)

    def rewind(self) -> None:
        """clear(), then re-read the topic from the mark-delete position (a cursor rewind)."""
        self.journal.write("K")
        self.index.clear()  # forgets the cancels and reschedules too
        self.tracked.clear()
        self.cancelled = {i for i in self.cancelled if i <= self.mark}
        self.unflushed.clear()
        self.delivered = {i for i in self.delivered if i <= self.mark}
        if self.mark >= 0:
            self.index.set_mark_delete(*self.msgs.position(self.mark))
            self.journal.write("M", (self.mark,))
        read, self.read = self.read, self.mark + 1
        self.add(read)

    @staticmethod
    def fail(message: str) -> None:
        sys.stderr.write(f"model mismatch: {message}\n")
        os._exit(EXIT_MODEL_MISMATCH)


def begin(store: str, hook: StepHook) -> tuple[ManualClock, ManualExecutor, FileStorage]:
    """A run's clock, background executor and step-hooked storage; journals the build."""
    hook.journal.write("I", ("native" if NATIVE else "pure",))
    return ManualClock(START_MS), ManualExecutor(), FileStorage(store, step_hook=hook)


def publish_windows(msgs: Messages) -> list[tuple[int, int]]:
    """``(end, stop)`` per publish-time window: when it ends (the clock then) and one past the
    last message published before that."""
    count = (int(msgs.publish[-1]) - START_MS) // WINDOW_MS + 1
    ends = [START_MS + (w + 1) * WINDOW_MS for w in range(count)]
    return [(end, int(np.searchsorted(msgs.publish, end, side="left"))) for end in ends]


def run(store: str, messages: int, seed: int, hook: StepHook) -> None:
    """The whole simulation (see the module docstring)."""
    msgs = workload(messages, seed)
    journal = hook.journal
    clock, executor, storage = begin(store, hook)
    index = DelayIndex.open(storage, NAME, CONFIG, clock=clock, executor=executor)
    hook.index = index
    dispatcher = Dispatcher(index, clock, msgs, journal)
    dispatcher.set_clock(START_MS)
    windows = publish_windows(msgs)
    for w, (end, stop) in enumerate(windows):
        dispatcher.set_clock(end)
        dispatcher.add(stop)
        if w % RUN_JOBS_EVERY == RUN_JOBS_EVERY - 1:
            executor.run_pending()
        dispatcher.poll()
        dispatcher.acknowledge()
        if w == int(len(windows) * CLEAR_AT):
            dispatcher.rewind()
        elif w % FLUSH_EVERY == FLUSH_EVERY - 1:
            dispatcher.cancel_and_reschedule()
            dispatcher.checkpoint()
    for _ in range(TAIL_STEPS):
        dispatcher.set_clock(clock() + TAIL_STEP_MS)
        executor.run_pending()
        dispatcher.poll()
        dispatcher.acknowledge()
    dispatcher.checkpoint()
    index.close()
    executor.shutdown()
    storage.close()
    journal.write("E")


def main(
    argv: list[str] | None = None,
    simulation: Callable[[str, int, int, StepHook], None] | None = None,
    doc: str | None = None,
) -> int:
    """Parse the arguments and run ``simulation`` (default :func:`run`; ``crash_child_shared``
    passes its own, and its module docstring as ``doc``)."""
    parser = argparse.ArgumentParser(description=(doc or __doc__).split("\n\n")[0])
    parser.add_argument("store")
    parser.add_argument("journal")
    parser.add_argument("--messages", type=int, default=MESSAGES)
    parser.add_argument("--seed", type=int, default=SEED)
    parser.add_argument("--crash-at", type=int, default=0, help="die before step K (0: never)")
    parser.add_argument("--kill", action="store_true", help="SIGKILL instead of os._exit")
    parser.add_argument("--expect-label", default=None)
    args = parser.parse_args(argv)
    journal = Journal(args.journal)
    hook = StepHook(journal, args.crash_at, args.kill, args.expect_label)
    (simulation or run)(args.store, args.messages, args.seed, hook)
    return 0


if __name__ == "__main__":
    sys.exit(main())
