"""``delayindex simulate``: a dispatcher simulation over a realistic workload, checked end to end.

How it works. A topic's messages (``delayindex.workload``, the realistic mix) are "published" in
windows of publish time. For each window a simulated dispatcher sets a :class:`ManualClock` to the
window's end, hands the window to the tracker with ``add_many`` (re-adding an earlier window now
and then, as a dispatcher replaying its cursor does), lets the :class:`ManualTimer` fire, and
polls while messages are due. After the last window the clock jumps from timer deadline to timer
deadline until everything is delivered.

Every delivery is checked against the workload: each delayed message is delivered exactly once,
never before ``deliver_at - tick`` (``deliver_at`` in strict mode), and nothing is lost. The
result says whether all checks held; the CLI turns that into the exit code.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from delayindex import _impl
from delayindex.clock import ManualClock
from delayindex.config import TrackerConfig
from delayindex.timers import ManualTimer
from delayindex.tracker.in_memory import InMemoryTracker
from delayindex.workload import Workload, generate

ENTRIES_PER_LEDGER = 1000
WINDOW_MS = 100
POLL_BATCH = 1000
REPLAY_EVERY = 50  # re-add the previous window every N windows (cursor replay)


@dataclass
class SimulationResult:
    """What the demo measured and verified."""

    messages: int
    delayed: int
    tracked: int
    immediate: int
    replayed_adds: int
    polled: int
    lost: int
    polled_twice: int
    early: int
    max_late_ms: int
    mean_late_ms: float
    timer_fires: int
    peak_tracked: int
    peak_memory_bytes: int
    ingest_seconds: float
    drain_seconds: float
    implementation: str
    config: dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        """True when nothing was lost, polled twice or delivered early."""
        return self.lost == 0 and self.polled_twice == 0 and self.early == 0

    @property
    def bytes_per_message(self) -> float:
        """Peak estimated resident bytes per tracked message."""
        return self.peak_memory_bytes / max(self.peak_tracked, 1)


def run_simulation(
    messages: int = 1_000_000,
    *,
    seed: int = 7,
    tick_ms: int = 1000,
    strict: bool = False,
    progress: Callable[[int, int], object] | None = None,
) -> SimulationResult:
    """Run the simulation and verify every delivery.

    Args:
        messages: messages published (about half are delayed).
        seed: workload seed.
        tick_ms: tracker tick (non-strict deliveries may come up to one tick early).
        strict: never deliver before ``deliver_at``.
        progress: optional ``progress(done, total)`` called as windows are ingested.

    Returns:
        A :class:`SimulationResult`; ``result.ok`` tells whether every check held.

    Raises:
        ValueError: ``messages`` is not a positive int.
    """
    if isinstance(messages, bool) or not isinstance(messages, int) or messages < 1:
        raise ValueError(f"messages must be a positive int, got {messages!r}")
    workload = generate(messages, seed=seed, entries_per_ledger=ENTRIES_PER_LEDGER)
    first_ledger = int(workload.ledger_ids[0])
    deliver_at = workload.deliver_at
    slack = 0 if strict else tick_ms
    polls = np.zeros(messages, dtype=np.int32)  # deliveries handed out by poll()
    lateness: list[np.ndarray] = []
    delivered_now = np.zeros(messages, dtype=np.bool_)  # add() said "deliver now" at least once
    early = 0

    clock = ManualClock(int(workload.publish_ms[0]))
    timer = ManualTimer(clock)
    fires = [0]

    def on_ready() -> None:
        fires[0] += 1

    config = TrackerConfig(tick_ms=tick_ms, strict=strict)
    tracker = InMemoryTracker(config, clock=clock, timer=timer, on_ready=on_ready)

    def index_of(ledgers: np.ndarray, entries: np.ndarray) -> np.ndarray:
        index: np.ndarray = (ledgers - first_ledger) * ENTRIES_PER_LEDGER + entries
        return index

    def check_on_time(index: np.ndarray) -> None:
        nonlocal early
        due = deliver_at[index]
        delayed = due >= 0
        early += int((clock() < due[delayed] - slack).sum())

    def add(chunk: Workload) -> np.ndarray:
        accepted = tracker.add_many(chunk.ledger_ids, chunk.entry_ids, chunk.deliver_at)
        index = index_of(chunk.ledger_ids, chunk.entry_ids)[~accepted]
        delivered_now[index] = True
        check_on_time(index)
        return accepted

    def dispatch() -> None:
        timer.run_due()
        while tracker.has_message_available():
            batch = tracker.poll(POLL_BATCH)
            pairs = np.asarray(batch, dtype=np.int64).reshape(-1, 2)
            index = index_of(pairs[:, 0], pairs[:, 1])
            np.add.at(polls, index, 1)
            check_on_time(index)
            lateness.append(clock() - deliver_at[index])

    tracked = immediate = replayed = peak_tracked = peak_memory = 0
    chunks = list(workload.chunks_by_publish_time(WINDOW_MS))
    previous: Workload | None = None
    started = time.perf_counter()
    for n, (window_end, chunk) in enumerate(chunks):
        clock.set(max(clock(), window_end - 1))
        accepted = add(chunk)
        tracked += int(accepted.sum())
        immediate += len(accepted) - int(accepted.sum())
        if previous is not None and n % REPLAY_EVERY == 0:
            # A dispatcher replaying its cursor: tracked positions dedup; due ones come back.
            replayed += len(add(previous))
        previous = chunk
        dispatch()
        if n % 200 == 0:
            peak_tracked = max(peak_tracked, len(tracker))
            peak_memory = max(peak_memory, tracker.memory_usage_bytes())
        if progress is not None:
            progress(n + 1, len(chunks))
    ingest_seconds = time.perf_counter() - started
    peak_tracked = max(peak_tracked, len(tracker))
    peak_memory = max(peak_memory, tracker.memory_usage_bytes())

    started = time.perf_counter()
    while len(tracker):
        deadline = timer.next_deadline()
        if deadline is None:  # nothing armed: the head is already due
            deadline = tracker.next_delivery_time()
        assert deadline is not None
        clock.set(max(clock(), deadline))
        dispatch()
    drain_seconds = time.perf_counter() - started
    tracker.close()

    late = np.concatenate(lateness) if lateness else np.zeros(0, dtype=np.int64)
    return SimulationResult(
        messages=messages,
        delayed=int(workload.delayed_mask.sum()),
        tracked=tracked,
        immediate=immediate,
        replayed_adds=replayed,
        polled=int(polls.sum()),
        lost=int(((polls == 0) & ~delivered_now).sum()),
        polled_twice=int((polls > 1).sum()),
        early=early,
        max_late_ms=int(late.max()) if len(late) else 0,
        mean_late_ms=float(late.mean()) if len(late) else 0.0,
        timer_fires=fires[0],
        peak_tracked=peak_tracked,
        peak_memory_bytes=peak_memory,
        ingest_seconds=ingest_seconds,
        drain_seconds=drain_seconds,
        implementation=_impl.IMPLEMENTATION,
        config={"tick_ms": tick_ms, "strict": strict, "seed": seed},
    )
