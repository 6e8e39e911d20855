"""The main job (``delayindex demo``): dump, Spark rebuild, open, dispatch, verify, drain.

How it works. Everything happens in a fresh work directory, on the embedded defaults:

1. **gen-dump**: :func:`delayindex.dump.generate_dump` writes a realistic topic dump (half the
   messages delayed; 70 % 1-60 s, 25 % 1-60 min, 5 % 1-10 days) as Parquet.
2. **rebuild**: :func:`delayindex.spark.rebuild` (local Spark) builds the delayed index of the
   dump as of its first publish time, straight into a FileStorage store, through the two-phase
   protocol.
3. **open + short dispatch**: :meth:`DelayIndex.open` recovers the rebuilt index; a dispatcher on
   a :class:`ManualClock` polls what is due during the first :data:`SHORT_DISPATCH_MS` and closes
   without acknowledging (so the store still holds the whole index).
4. **verify**: :func:`delayindex.spark.verify` checks the store against the dump (every expected
   position in exactly one bucket with its deliver time, nothing extra, checksums, manifest,
   orphans).
5. **drain**: the index is reopened and drained to the end; every delivery is checked against
   the dump.

The checks: every delayed, not-yet-due message of the dump is delivered at least once (the
short dispatch's deliveries come back after the reopen, as at-least-once delivery promises, and
are counted as redeliveries, not duplicates), never twice within one run, never before its
deliver time (strict mode); nothing else is delivered; the verify report is clean; and the store
ends with no snapshot object left (everything delivered, every bucket deleted, nothing orphaned).
"""

from __future__ import annotations

import contextlib
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from delayindex import _impl
from delayindex.clock import ManualClock
from delayindex.config import TrackerConfig
from delayindex.dump import generate_dump, write_dump
from delayindex.storage.file import FileStorage
from delayindex.tracker.delay_index import DelayIndex

NAME = "demo"
#: Simulated time of the short dispatch after the first open.
SHORT_DISPATCH_MS = 60_000
#: Clock step of the short dispatch.
DISPATCH_STEP_MS = 1_000
POLL_BATCH = 10_000
#: The demo's tracker settings: strict (nothing early), buckets of 50 000 (the default).
DEMO_CONFIG = TrackerConfig(strict=True, tick_ms=0)

Progress = Callable[[str], None]


@dataclass
class DemoResult:
    """What the main job did and found (``ok`` when every check held)."""

    messages: int = 0
    expected: int = 0
    dump_bytes: int = 0
    gen_seconds: float = 0.0
    rebuild_seconds: float = 0.0
    rebuild_rate: float = 0.0
    spark_master: str = ""
    buckets: int = 0
    snapshot_bytes: int = 0
    rejected_rows: int = 0
    open_seconds: float = 0.0
    recovered: int = 0
    short_dispatch_delivered: int = 0
    verify_ok: bool = False
    verify_findings: dict[str, int] = field(default_factory=dict)
    verify_seconds: float = 0.0
    delivered: int = 0
    redelivered: int = 0
    lost: int = 0
    delivered_twice: int = 0
    early: int = 0
    unexpected: int = 0
    drain_seconds: float = 0.0
    objects_left: int = 0
    implementation: str = ""
    workdir: str = ""

    @property
    def ok(self) -> bool:
        """Every check held."""
        return (
            self.verify_ok
            and self.lost == 0
            and self.delivered_twice == 0
            and self.early == 0
            and self.unexpected == 0
            and self.objects_left == 0
            and self.rejected_rows == 0
            and self.recovered == self.expected
        )

    def as_dict(self) -> dict[str, Any]:
        """Plain data (JSON-ready), with ``ok``."""
        return {**asdict(self), "ok": self.ok}


class _Checker:
    """Checks deliveries against the expected (deliver_at by position) table; counts the
    unexpected, early and twice-in-one-run deliveries over every run."""

    def __init__(self, ledgers: Any, entries: Any, deliver_at: Any) -> None:
        self.expected: dict[tuple[int, int], int] = {
            (ledger, entry): due  # tolist(): plain ints
            for ledger, entry, due in zip(
                ledgers.tolist(), entries.tolist(), deliver_at.tolist(), strict=True
            )
        }
        self.early = self.unexpected = self.twice = 0

    def run(
        self, index: DelayIndex, clock: ManualClock, until_ms: int | None
    ) -> set[tuple[int, int]]:
        """Dispatch until ``until_ms`` (None: until nothing is tracked); returns the expected
        positions delivered in this run."""
        seen: set[tuple[int, int]] = set()
        while True:
            for position in index.poll(POLL_BATCH):
                key = (position.ledger_id, position.entry_id)
                due = self.expected.get(key)
                if due is None:
                    self.unexpected += 1
                    continue
                if due > clock():
                    self.early += 1
                if key in seen:
                    self.twice += 1
                seen.add(key)
            if index.has_message_available():
                continue
            following = index.next_delivery_time()
            if following is None or (until_ms is not None and following > until_ms):
                return seen
            clock.set(max(clock() + (DISPATCH_STEP_MS if until_ms is not None else 0), following))


def run_demo(
    messages: int = 1_000_000,
    *,
    seed: int = 7,
    master: str = "local[*]",
    workdir: str | Path | None = None,
    keep: bool = False,
    progress: Progress | None = None,
    spark: Any | None = None,
) -> DemoResult:
    """Run the main job end to end (see the module docs) and return what it found.

    Args:
        messages: rows of the generated dump.
        seed: the dump generator's seed.
        master: the Spark master (local mode by default).
        workdir: where the dump and the store go (default: a fresh temporary directory).
        keep: keep the temporary work directory afterwards (a given ``workdir`` is always
            kept).
        progress: called with a short description as each stage starts.
        spark: a running SparkSession to use (left running); default: start a local session
            on ``master`` and stop it when done.

    Raises:
        delayindex.spark.SparkUnavailableError: pyspark or Java 17+ is missing.
    """
    from delayindex import spark as spark_jobs

    say = progress or (lambda _stage: None)
    root = Path(workdir) if workdir is not None else Path(tempfile.mkdtemp(prefix="delayindex-"))
    root.mkdir(parents=True, exist_ok=True)
    result = DemoResult(
        messages=messages,
        workdir=str(root),
        implementation=_impl.IMPLEMENTATION,
    )
    try:
        _run(result, root, messages, seed, master, say, spark_jobs, spark)
    finally:
        if not keep and workdir is None:
            shutil.rmtree(root, ignore_errors=True)
    return result


def _run(
    result: DemoResult,
    root: Path,
    messages: int,
    seed: int,
    master: str,
    say: Progress,
    spark_jobs: Any,
    spark: Any | None,
) -> None:
    config = DEMO_CONFIG
    now = 1_767_225_600_000  # 2026-01-01T00:00:00Z: the dump's first publish time
    say(f"generating a {messages:,}-message topic dump")
    started = time.perf_counter()
    columns = generate_dump(messages, seed=seed, start_ms=now)
    dump_path = write_dump(root / "topic.parquet", columns)
    result.gen_seconds = time.perf_counter() - started
    result.dump_bytes = dump_path.stat().st_size
    tracked = columns.deliver_at > now  # strict, tick 0: what add() would track at `now`
    checker = _Checker(
        columns.ledger_ids[tracked], columns.entry_ids[tracked], columns.deliver_at[tracked]
    )
    result.expected = len(checker.expected)

    store = root / "store"
    if spark is None:
        say(f"starting Spark ({master})")
    given = contextlib.nullcontext(spark) if spark is not None else None
    with given or spark_jobs.session_for(master) as session:  # never stops a given session
        say("rebuilding the delayed index with Spark")
        report = spark_jobs.rebuild(session, dump_path, store, NAME, config, now_ms=now)
        result.rebuild_seconds = report.seconds
        result.rebuild_rate = report.rate
        result.spark_master = report.master
        result.buckets = len(report.buckets)
        result.snapshot_bytes = report.snapshot_bytes
        result.rejected_rows = report.rejects.errors

        say("opening the index and dispatching for a simulated minute")
        clock = ManualClock(now)
        started = time.perf_counter()
        index = DelayIndex.open(FileStorage(store), NAME, config, clock=clock)
        result.open_seconds = time.perf_counter() - started
        result.recovered = len(index)
        first_run = checker.run(index, clock, now + SHORT_DISPATCH_MS)
        result.short_dispatch_delivered = len(first_run)
        index.close()  # nothing acknowledged: the store still holds the whole index

        say("verifying the store against the dump")
        check = spark_jobs.verify(session, dump_path, store, NAME, config, now_ms=now)
        result.verify_ok = check.ok
        result.verify_findings = check.counts()
        result.verify_seconds = check.seconds

    say("reopening and draining everything")
    started = time.perf_counter()
    clock = ManualClock(now + SHORT_DISPATCH_MS)
    with DelayIndex.open(FileStorage(store), NAME, config, clock=clock) as index:
        drained = checker.run(index, clock, None)
        index.flush()
    result.drain_seconds = time.perf_counter() - started
    result.redelivered = len(first_run & drained)
    delivered = first_run | drained  # expected positions only: the checker counts the rest
    result.delivered = len(delivered)
    result.lost = result.expected - len(delivered)
    result.delivered_twice = checker.twice
    result.early = checker.early
    result.unexpected = checker.unexpected
    result.objects_left = len(FileStorage(store).list_objects())


__all__ = ["DEMO_CONFIG", "DemoResult", "run_demo"]
