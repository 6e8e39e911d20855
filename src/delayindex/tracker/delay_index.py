"""DelayIndex: the bucket-based tracker (PIP-195), joined to storage, a clock and a thread.

How it works. The state lives in a ``BucketCore`` (native or pure, see ``delayindex._impl``):
one dedup index, the last mutable bucket's heap, a direct heap for non-monotonic ledgers, and
one *segment source* per sealed bucket, merged by a small heap of heads. This module is the
driver that joins the core to a :class:`~delayindex.storage.catalog.Catalog` (two-phase
snapshot creation and deletion), a clock, a timer and a background executor:

* **Seal** (inline, O(1)): when ``add`` meets a strictly newer ledger while the mutable bucket
  holds ``min_index_count_per_bucket`` indexes (or would span a sealed range), the mutable heap
  itself becomes the sealed bucket's source and an unsorted copy of its indexes goes to the
  executor, which sorts, cuts, encodes (``build_segments``, without the GIL) and writes. When
  the snapshot is durable, the data leaves memory: a *placeholder* (the min deliver time of the
  segment holding the first undelivered index) stands for it until it comes due. If the create
  fails after its retries, the bucket stays in memory ("memory mode"), deliverable and counted
  as unpersisted, and its write is retried after ``delete_retry_delay_ms`` (doubling).
* **Group commit**: snapshot creates and deletes queue for one *persist job*, which takes up to
  ``group_commit_max_ops`` of them (creates until their snapshots hold
  ``group_commit_max_bytes``), waiting up to ``group_commit_max_delay_ms`` for a batch to fill
  when a thread can add meanwhile, and makes the whole batch durable with two manifest writes
  (``Catalog.apply_batch``). A change is acknowledged (the bucket becomes durable, or leaves the
  manifest) only after the write that makes it durable, and in the order the changes were made.
* **Load**: ``poll`` stops at a due placeholder; the driver reads the next segments (up to
  ``LOAD_BATCH_INDEXES``; the only load in flight, under the lock) and resumes. A storage error
  moves that bucket's placeholder past the cutoff to its retry time (``load_retry_delay_ms``,
  backing off per failure): its messages come late, never early, and no other bucket waits.
  Damage (checksum, decode, missing object) quarantines the bucket (``_damage``): its source
  leaves the merge, its positions stay tracked, the manifest records it, the object is kept.
* **Merge**: when more than ``max_num_buckets`` buckets are sealed, up to four adjacent durable
  buckets with the fewest messages are merged on the executor, whether or not their segments
  are loaded: all their segments are read back, filtered to still-tracked positions, re-cut and
  written; the sources (and their in-memory runs) stay live until the merged snapshot is durable
  (one manifest commit swaps them), so a failed merge changes nothing. The merged range is
  registered when the merge starts, so no bucket can claim a ledger in the gaps between the
  sources. Merges chain until the count fits; a failed one is retried after the retry backoff,
  on the index's clock, from ``poll``/``has_message_available``. Buckets still being written
  or in memory mode are merged once durable; until then ``stats()["over_limit"]`` says by how
  much and why the count exceeds the bound.
* **Trim and delete**: ``set_mark_delete`` untracks positions at or below the mark (persisted in
  the manifest with its next commit and on close); buckets wholly below the mark ledger whose
  create succeeded are deleted with all their ledgers untracked, as are exhausted buckets (their
  last segment consumed), through the catalog's two-phase delete (batched by group commit).
  Failed deletes are retried on ``poll`` once their backoff (on the index's clock) runs out,
  then dead-lettered.
* **Recovery** (:meth:`DelayIndex.open`): the catalog repairs the manifest's intents (and
  recovers a damaged or missing manifest from its history and the objects' headers); each live
  bucket's metadata is read, fully due segments are skipped, the bitmaps of the rest restored
  and its first live segment loaded; the persisted mark is applied. A damaged or missing
  snapshot quarantines its bucket only (moved to the manifest's quarantine list in one commit
  before anything is installed); active quarantine records are restored without delivery. A
  storage error reading a snapshot raises :class:`~delayindex.errors.RecoveryError` having
  changed nothing.

Threads: one lock guards the core and the bucket table. Background jobs do their I/O without it
and take it only to install results (in slices where the work is large). Jobs are queued while
the lock is held and submitted after it is released, so an inline executor cannot deadlock.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import Executor, Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt
from pyroaring import BitMap

from delayindex import _impl
from delayindex._memory import release_free_memory
from delayindex.clock import Clock
from delayindex.config import TrackerConfig
from delayindex.errors import (
    CommitOutcomeUnknownError,
    ManifestConflictError,
    RecoveryError,
    SnapshotCorruptError,
    SnapshotNotFoundError,
    StorageError,
    TrackerClosedError,
)
from delayindex.model import ADD_DELIVER, ADD_SEAL_FIRST, ADD_TRACKED, MAX_TIME, Position
from delayindex.policy import (
    backoff_delay_ms,
    resolve_overlaps,
    select_merge_window,
)
from delayindex.snapshot.format import PreparedSegments, SnapshotMetadata, build_snapshot
from delayindex.storage.base import SnapshotStorage
from delayindex.storage.catalog import Catalog
from delayindex.storage.manifest import BucketRecord, QuarantineRecord, WriterStatus
from delayindex.timers import ArmingRule, Timer
from delayindex.tracker._damage import (
    ProblemLog,
    QuarantineMixin,
    damage_reason,
)
from delayindex.tracker._front import TrackerFront, as_count
from delayindex.tracker.in_memory import _ClosedCore, _diagnose, as_int64_array

_log = logging.getLogger(__name__)
_DEFAULT_CONFIG = TrackerConfig()
#: A segment load reads consecutive segments until they hold this many indexes.
LOAD_BATCH_INDEXES = 4096
#: A merge reads its sources this many segments at a time, and filters this many rows per
#: lock hold, so that no single step keeps add() waiting for long.
MERGE_READ_SEGMENTS = 256
MERGE_FILTER_ROWS = 65_536
_EMPTY = np.empty(0, dtype=np.int64)
Int64Array = npt.NDArray[np.int64]


@dataclass(frozen=True)
class BucketInfo:
    """One sealed bucket, as :meth:`DelayIndex.buckets` reports it.

    ``state`` is ``"creating"`` (snapshot being written), ``"durable"`` (snapshot live in the
    manifest), ``"memory"`` (create failed; held in memory), ``"merging"`` (durable, being
    merged), ``"quarantined"`` (snapshot damaged or missing: positions held, not delivered until
    repaired or released; see :meth:`DelayIndex.quarantined`) or ``"released"`` (a quarantined
    bucket whose positions were released: due now). ``loaded_segment`` is the 1-based number
    of the last segment read into memory (0: none yet, or the whole bucket is in memory);
    ``num_messages`` counts the indexes written to the snapshot.
    """

    start_ledger: int
    end_ledger: int
    num_segments: int
    loaded_segment: int
    num_messages: int
    snapshot_id: str | None
    snapshot_bytes: int
    state: str


class _Bucket:
    """Driver-side record of a sealed bucket (the core knows it only as a source id)."""

    __slots__ = (
        "bounds", "current", "damage", "end", "exhausted", "load_failures", "merging", "mins",
        "num_messages", "positions_known", "sid", "snapshot_bytes", "snapshot_id", "start",
        "state",
    )  # fmt: skip

    def __init__(self, sid: int, start: int, end: int, num_messages: int) -> None:
        self.sid = sid
        self.start = start
        self.end = end
        self.state = "creating"
        self.snapshot_id: str | None = None
        self.snapshot_bytes = 0
        self.num_messages = num_messages
        self.current = 0  # 1-based segment in memory; 0: all of it is in memory
        self.mins: Int64Array = np.empty(0, dtype=np.int64)
        self.bounds: Int64Array = np.empty(0, dtype=np.int64)  # cumulative counts per segment
        self.merging = False
        self.exhausted = False
        self.load_failures = 0  # consecutive failed segment reads (transient storage errors)
        self.damage: QuarantineRecord | None = None  # set while quarantined or released
        self.positions_known = False  # quarantined: its positions are still tracked

    @property
    def num_segments(self) -> int:
        return len(self.mins)

    def has_unloaded(self) -> bool:
        """Durable, with a segment not read into memory yet."""
        return self.state == "durable" and self.current < self.num_segments

    def mergeable(self) -> bool:
        """Whether a merge may take this bucket: durable and idle. Loaded segments do not
        matter: a merge reads every segment back from the snapshot and keeps what is tracked,
        so the bucket's in-memory run can go when the merged bucket replaces it."""
        return (
            self.state == "durable"
            and self.snapshot_id is not None
            and not self.merging
            and not self.exhausted
        )

    def next_time(self, segment: int) -> int:
        """Min deliver time of 1-based ``segment + 1`` (-1 when there is none)."""
        return int(self.mins[segment]) if segment < self.num_segments else -1

    def info(self) -> BucketInfo:
        state = "merging" if self.merging else self.state
        return BucketInfo(
            self.start, self.end, self.num_segments, self.current, self.num_messages,
            self.snapshot_id, self.snapshot_bytes, state,
        )  # fmt: skip


@dataclass
class _PendingCreate:
    """A sealed bucket waiting for its snapshot write (its unsorted copy of the indexes)."""

    bucket: _Bucket
    times: Int64Array
    ledgers: Int64Array
    entries: Int64Array
    epoch: int
    enqueued: float = field(default_factory=time.monotonic)
    attempts: int = 0


class _OpStats:
    """Counts and latencies of one kind of storage operation."""

    __slots__ = ("failed", "max_ms", "succeeded", "total_ms")

    def __init__(self) -> None:
        self.succeeded = 0
        self.failed = 0
        self.total_ms = 0.0
        self.max_ms = 0.0

    def record(self, ok: bool, started: float) -> None:
        elapsed = (time.perf_counter() - started) * 1000.0
        if ok:
            self.succeeded += 1
        else:
            self.failed += 1
        self.total_ms += elapsed
        self.max_ms = max(self.max_ms, elapsed)

    def as_dict(self) -> dict[str, float | int]:
        n = self.succeeded + self.failed
        return {
            "succeeded": self.succeeded,
            "failed": self.failed,
            "mean_ms": self.total_ms / n if n else 0.0,
            "max_ms": self.max_ms,
        }


def _live_positions(metadata: SnapshotMetadata, first: int, name: str) -> Any:
    """Per-ledger union of segments ``first..`` (recovery's index), checked against the counts.

    Raises:
        SnapshotCorruptError: a bitmap is malformed, a position is in two segments, or the
            bitmaps do not hold the segments' counts.
    """
    try:
        ledgers, offsets, entries = metadata.ledger_entries(first)
    except ValueError as exc:
        raise SnapshotCorruptError(f"{name}: bad bitmaps: {exc}") from None
    expected = int(metadata.counts[first - 1 :].sum())
    if len(entries) != expected:
        raise SnapshotCorruptError(
            f"{name}: the live segments' bitmaps hold {len(entries)} positions, "
            f"their counts say {expected}"
        )
    return ledgers, offsets, entries


class DelayIndex(QuarantineMixin, TrackerFront):
    """Bucket-based delayed-message tracker (PIP-195) over a :class:`SnapshotStorage`.

    Build it with :meth:`open`. See the module documentation for how it works, and
    :class:`~delayindex.InMemoryTracker` for the shared method contract.
    """

    def __init__(self, _catalog: Catalog, _token: object, **kwargs: Any) -> None:
        """Internal: use :meth:`DelayIndex.open`."""
        if _token is not _OPEN_TOKEN:
            raise TypeError("use DelayIndex.open(storage, name, ...) to create a DelayIndex")
        config: TrackerConfig = kwargs["config"]
        self._config = config
        self._catalog = _catalog
        self._storage: SnapshotStorage = kwargs["storage"]
        self._name: str = _catalog.name
        self._clock: Clock = kwargs["clock"]
        self._core: Any = _impl.BucketCore(
            config.tick_ms,
            config.strict,
            config.fixed_delay_lookahead,
            config.min_index_count_per_bucket,
        )
        self._lock = threading.Lock()
        timer: Timer | None = kwargs["timer"]
        self._arming = ArmingRule(timer, self._on_timer) if timer is not None else None
        self._on_ready: Callable[[], object] | None = kwargs["on_ready"]
        executor: Executor | None = kwargs["executor"]
        self._owns_executor = executor is None
        self._executor: Executor = executor or ThreadPoolExecutor(
            max_workers=1, thread_name_prefix=f"delayindex-{self._name}"
        )
        # Jobs of a synchronous executor run on the caller's thread: waiting in one for more
        # changes to arrive would only stall the caller.
        self._synchronous = bool(getattr(self._executor, "synchronous", False))
        self._buckets: dict[int, _Bucket] = {}
        self._next_sid = 0
        self._queued: list[Callable[[], None]] = []
        self._inflight: set[Future[None]] = set()
        self._inflight_lock = threading.Lock()
        self._merge_in_flight = False
        # Consecutive failed merges, and when the next may start (the retry backoff's rule).
        self._merge_failures = 0
        self._merge_retry_at = 0
        self._retry_queued = False
        # Group commit: changes wait here for the persist job, which makes a batch of them
        # durable with two manifest writes; failed ones wait in _deferred_* for their backoff.
        self._persist_creates: deque[_PendingCreate] = deque()
        self._persist_deletes: deque[str] = deque()
        self._persist_scheduled = False
        self._persist_wakeup = threading.Condition(self._lock)
        self._flushing = 0
        self._deferred_creates: list[_PendingCreate] = []
        self._deferred_deletes: list[str] = []
        self._deferred_at = MAX_TIME
        self._unresolved_merge: tuple[list[_Bucket], int, SnapshotMetadata] | None = None
        self._group = {"batches": 0, "creates": 0, "deletes": 0, "manifest_writes": 0}
        self._mark: tuple[int, int] | None = None
        self._epoch = 0
        self._closed = False
        self._warnings = ProblemLog(f"delayindex {self._name}")  # once per distinct problem
        self._pending_quarantine: list[tuple[QuarantineRecord, str]] = []
        self._quarantine_job_queued = False
        self._quarantine_failures = 0
        self._ops = {k: _OpStats() for k in ("create", "load", "delete", "merge", "recover")}

    # -- construction ---------------------------------------------------------------------------

    @classmethod
    def open(
        cls,
        storage: SnapshotStorage,
        name: str,
        config: TrackerConfig = _DEFAULT_CONFIG,
        *,
        clock: Clock | None = None,
        timer: Timer | None = None,
        on_ready: Callable[[], object] | None = None,
        executor: Executor | None = None,
    ) -> DelayIndex:
        """Open (and recover) the index ``name`` in ``storage``.

        Recovery: the manifest's intents are finished or rolled back; for each live bucket the
        fully due segments are skipped, the bitmaps of the others restored and the first live
        segment loaded. Buckets with nothing left to deliver are deleted; a bucket whose
        snapshot is missing is dropped with a warning in :meth:`stats`.

        Args:
            storage: where snapshots and the manifest live (``FileStorage``, ``MemoryStorage``).
            name: the index name (letters, digits, ``._-``); one writer per name.
            config: tracker settings.
            clock: zero-argument callable returning epoch ms (default: wall clock).
            timer: optional timer armed by Pulsar's rule; ``on_ready()`` is called when it fires.
            on_ready: called without the lock held when armed messages may be due.
            executor: runs snapshot writes, merges and deletes (default: one private thread).

        Raises:
            RecoveryError: a snapshot is corrupt or unreadable; it is named, nothing is deleted.
            StoreLockedError: another writer holds ``name``.
            TypeError, ValueError: bad arguments.
        """
        if not isinstance(config, TrackerConfig):
            raise TypeError(f"config must be a TrackerConfig, got {type(config).__name__}")
        if clock is not None and not callable(clock):
            raise TypeError("clock must be a zero-argument callable returning epoch ms")
        if on_ready is not None and not callable(on_ready):
            raise TypeError("on_ready must be callable")
        if executor is not None and not callable(getattr(executor, "submit", None)):
            raise TypeError("executor must be a concurrent.futures.Executor")
        the_clock: Clock = clock if clock is not None else _impl.wall_clock_ms
        try:
            catalog = Catalog.open(
                storage,
                name,
                clock=the_clock,
                max_delete_attempts=config.max_delete_attempts,
                delete_retry_delay_ms=config.delete_retry_delay_ms,
            )
        except (SnapshotCorruptError, StorageError, ManifestConflictError) as exc:
            raise RecoveryError(f"could not open the manifest of {name!r}: {exc}") from exc
        try:
            index = cls(
                catalog,
                _OPEN_TOKEN,
                config=config,
                storage=storage,
                clock=the_clock,
                timer=timer,
                on_ready=on_ready,
                executor=executor,
            )
        except BaseException:
            catalog.close()
            raise
        try:
            index._recover()
        except BaseException:
            index._shutdown_executor()
            catalog.close()
            raise
        index._submit_queued()
        return index

    def _recover(self) -> None:
        started = time.perf_counter()
        report = self._catalog.repair_report
        if report.recovered:  # a damaged or missing manifest, recovered: say so, loudly
            self._warnings.append(report.recovered)
        for snapshot_id in report.pending_deletes:
            self._warnings.append(f"delete of {snapshot_id!r} still pending after repair")
        records, overlapping = resolve_overlaps(self._catalog.buckets())
        now = self._now()
        cutoff = self._core.cutoff_for(now)
        loaded: list[tuple[BucketRecord, SnapshotMetadata, int, Any, Any]] = []
        damaged: list[tuple[QuarantineRecord, Any]] = []
        drop: list[str] = [r.snapshot_id for r in overlapping]
        for record in records:
            sid_name = record.snapshot_id
            metadata: SnapshotMetadata | None = None
            first = 1
            live: Any = None
            try:
                # Bitmaps are parsed once, below, and only those of the live segments.
                metadata = self._storage.get_metadata(sid_name, check_bitmaps=False)
                found = metadata.first_live_segment(cutoff)
                if found is None:
                    drop.append(sid_name)  # every index is due: the dispatcher delivers them
                    continue
                first = found
                live = _live_positions(metadata, first, sid_name)
                segment = self._storage.get_segments(sid_name, first, first)[0]
            except (SnapshotNotFoundError, SnapshotCorruptError) as exc:
                # Damage stays local: this bucket is quarantined, the others recover.
                remaining = record.num_messages
                if live is not None and metadata is not None:
                    remaining = int(metadata.counts[first - 1 :].sum())
                damaged.append(
                    (
                        QuarantineRecord(
                            sid_name, record.start_ledger, record.end_ledger, remaining,
                            first, damage_reason(exc), max(now, 0),
                        ),
                        live,
                    )
                )  # fmt: skip
                continue
            except StorageError as exc:
                self._ops["recover"].record(False, started)
                raise RecoveryError(
                    f"cannot recover {self._name!r}: reading snapshot {sid_name!r} (bucket "
                    f"[{record.start_ledger}, {record.end_ledger}]) failed: {exc}; nothing was "
                    "changed, open again once the storage answers"
                ) from exc
            loaded.append((record, metadata, first, segment, live))
        if damaged:
            try:
                self._catalog.quarantine_buckets([q for q, _ in damaged])
            except (StorageError, ManifestConflictError) as exc:
                self._ops["recover"].record(False, started)
                names = ", ".join(repr(q.snapshot_id) for q, _ in damaged)
                raise RecoveryError(
                    f"cannot recover {self._name!r}: snapshots {names} are damaged and moving "
                    f"them to the quarantine failed: {exc}"
                ) from exc
        new_ids = {q.snapshot_id for q, _ in damaged}
        damaged.extend(
            (q, self._quarantined_positions(q))
            for q in self._catalog.manifest.quarantined
            if q.active and q.snapshot_id not in new_ids
        )
        core = self._core
        for record, metadata, first, segment, live in loaded:
            core.restore_many(*live)
            bucket = self._new_bucket(record.start_ledger, record.end_ledger, 0)
            self._make_durable(bucket, record, metadata)
            bucket.current = first
            core.add_range(bucket.start, bucket.end)
            core.set_source(
                bucket.sid, segment.times, segment.ledgers, segment.entries,
                bucket.next_time(first),
            )  # fmt: skip
        for quarantine, live in damaged:
            self._install_quarantined(quarantine, live)
        for snapshot_id in drop:
            self._request_delete(snapshot_id)
        mark = self._catalog.manifest.mark_delete
        if mark is not None:  # acknowledged before the restart: never delivered again
            self._mark = mark
            core.untrack_upto(*mark)
            for bucket in list(self._buckets.values()):
                if bucket.end < mark[0]:
                    self._trim(bucket)
        self._ops["recover"].record(True, started)

    # -- small helpers --------------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise TrackerClosedError(f"DelayIndex {self._name!r} is closed")

    def _new_bucket(self, start: int, end: int, num_messages: int) -> _Bucket:
        bucket = _Bucket(self._next_sid, start, end, num_messages)
        self._next_sid += 1
        self._buckets[bucket.sid] = bucket
        return bucket

    @staticmethod
    def _make_durable(bucket: _Bucket, record: BucketRecord, metadata: SnapshotMetadata) -> None:
        bucket.state = "durable"
        bucket.snapshot_id = record.snapshot_id
        bucket.snapshot_bytes = record.snapshot_bytes
        bucket.num_messages = record.num_messages
        # Two int64 per segment is all a bucket keeps of its metadata: the bitmaps stay on disk.
        bucket.mins = np.array(metadata.mins, dtype=np.int64)
        bucket.bounds = np.cumsum(metadata.counts)

    def _queue(self, job: Callable[[], None]) -> None:
        """Queue a background job; it is submitted once the lock is released."""
        self._queued.append(job)

    def _submit_queued(self) -> None:
        while self._queued:
            jobs, self._queued = self._queued, []
            for job in jobs:
                self._submit(job)

    def _submit(self, job: Callable[[], None]) -> None:
        def run() -> None:
            try:
                job()
            except Exception:  # a bug: log it, never kill the executor thread silently
                _log.exception("delayindex %s: background job failed", self._name)
            finally:
                self._submit_queued_from_job()

        try:
            future = self._executor.submit(run)
        except RuntimeError:  # executor shut down (closing): run inline
            run()
            return
        with self._inflight_lock:
            if not future.done():
                self._inflight.add(future)
        future.add_done_callback(self._forget_future)

    def _forget_future(self, future: Future[None]) -> None:
        with self._inflight_lock:
            self._inflight.discard(future)

    def _submit_queued_from_job(self) -> None:
        with self._lock:
            jobs, self._queued = self._queued, []
        for job in jobs:
            self._submit(job)

    # -- adding -----------------------------------------------------------------------------------

    def add(self, ledger_id: int, entry_id: int, deliver_at: int) -> bool:
        """Track a message until ``deliver_at`` (epoch ms); see InMemoryTracker.add.

        True: tracked (do not deliver yet). False: deliver now (not delayed, or due; a due re-add
        of a tracked position untracks it). A position at or below the mark-delete
        (:meth:`set_mark_delete`, since the last :meth:`clear`) is acknowledged: never tracked
        nor delivered, so this returns True (do not deliver) whatever ``deliver_at`` is, even
        negative or due, and ``len`` does not count it (``stats()["acked_on_add"]`` does).
        Sealing the mutable bucket happens here when a newer ledger arrives; only its cheap part
        runs inline.

        Raises:
            ValueError: an id is out of range. TypeError: an argument is not an int.
            TrackerClosedError: the index is closed.
        """
        # The hot path: one lock, one clock read, one core call (a closed index has a core
        # whose add raises TrackerClosedError, so there is no separate closed check).
        with self._lock:
            now = self._clock()
            try:
                code = self._core.add(ledger_id, entry_id, deliver_at, now)
                if code == ADD_SEAL_FIRST:  # nothing was done: seal, then add again
                    self._seal()
                    code = self._core.add(ledger_id, entry_id, deliver_at, now)
            except (TypeError, OverflowError):
                _diagnose(ledger_id=ledger_id, entry_id=entry_id, deliver_at=deliver_at)
                self._now()
                raise
            arming = self._arming
            if (
                code == ADD_TRACKED
                and arming is not None
                and (arming.target < 0 or deliver_at < arming.target)
            ):
                arming.update(self._core.next_time(), now, self._core.tick_ms)
        if self._queued:
            self._submit_queued()
        return bool(code != ADD_DELIVER)

    def add_many(
        self, ledger_ids: object, entry_ids: object, deliver_ats: object
    ) -> npt.NDArray[np.bool_]:
        """:meth:`add` each element in order; sequences or int64 arrays of equal length.

        Everything is validated before anything changes. Returns a bool array (True = do not
        deliver: tracked, or at or below the mark-delete as for :meth:`add`).

        Raises:
            ValueError: lengths differ, an id is out of range, or a value does not fit int64.
            TypeError: a value is not an integer.
        """
        ledgers = as_int64_array(ledger_ids, "ledger_ids")
        entries = as_int64_array(entry_ids, "entry_ids")
        deliver = as_int64_array(deliver_ats, "deliver_ats")
        if not len(ledgers) == len(entries) == len(deliver):
            raise ValueError(
                f"add_many needs sequences of equal length, got {len(ledgers)}, "
                f"{len(entries)}, {len(deliver)}"
            )
        out = np.zeros(len(ledgers), dtype=np.bool_)
        with self._lock:
            self._check_open()
            now = self._now()
            start = 0
            while True:
                stop = self._core.add_many(ledgers, entries, deliver, now, out, start)
                if stop >= len(ledgers):
                    break
                self._seal()
                start = stop
            if self._arming is not None and len(out):
                self._rearm(now)
        if self._queued:
            self._submit_queued()
        return out

    def _seal(self) -> None:
        """Seal the mutable bucket (lock held): O(1) for the index, plus one copy of its
        indexes for the snapshot; sorting, cutting, encoding and I/O are queued."""
        sid = self._next_sid
        self._next_sid += 1
        times, ledgers, entries, start, end = self._core.seal(sid)
        if len(times) == 0:
            self._core.remove_source(sid)
            return
        bucket = _Bucket(sid, start, end, len(times))
        self._buckets[sid] = bucket
        self._core.add_range(start, end)
        self._persist_creates.append(_PendingCreate(bucket, times, ledgers, entries, self._epoch))
        self._schedule_persist()
        self._maybe_merge()

    # -- background jobs ---------------------------------------------------------------------------

    def _build(
        self, times: Int64Array, ledgers: Int64Array, entries: Int64Array, start: int, end: int
    ) -> tuple[SnapshotMetadata, PreparedSegments]:
        return build_snapshot(
            times,
            ledgers,
            entries,
            max_time_step_ms=self._config.max_time_step_per_segment_ms,
            max_indexes_per_segment=self._config.max_indexes_per_segment,
            start_ledger=start,
            end_ledger=end,
            validate=False,  # positions come from the dedup index: distinct by construction
        )

    def _schedule_persist(self) -> None:
        """Make sure a persist job will run for the queued changes (lock held)."""
        if not self._persist_scheduled:
            self._persist_scheduled = True
            self._queue(self._persist_job)
        elif len(self._persist_creates) + len(self._persist_deletes) >= (
            self._config.group_commit_max_ops
        ):
            self._persist_wakeup.notify()  # a full batch: stop waiting for more

    def _request_delete(self, snapshot_id: str) -> None:
        """Queue the two-phase delete of a snapshot with the next group commit (lock held)."""
        self._persist_deletes.append(snapshot_id)
        self._schedule_persist()

    def _await_batch(self) -> None:
        """Wait (lock held, released while waiting) until the batch is full, the oldest change
        has waited ``group_commit_max_delay_ms``, or someone flushes or closes."""
        config = self._config
        if self._synchronous or config.group_commit_max_delay_ms <= 0:
            return
        oldest = self._persist_creates[0].enqueued if self._persist_creates else time.monotonic()
        deadline = oldest + config.group_commit_max_delay_ms / 1000.0
        while (
            len(self._persist_creates) + len(self._persist_deletes) < config.group_commit_max_ops
            and not self._flushing
            and not self._closed
        ):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return
            self._persist_wakeup.wait(remaining)

    def _take_batch(self) -> tuple[list[_PendingCreate], list[str]]:
        """Pop the next batch's changes in arrival order (lock held)."""
        limit = self._config.group_commit_max_ops
        deletes: list[str] = []
        while self._persist_deletes and len(deletes) < limit:
            deletes.append(self._persist_deletes.popleft())
        creates: list[_PendingCreate] = []
        while self._persist_creates and len(creates) + len(deletes) < limit:
            item = self._persist_creates.popleft()
            if item.epoch == self._epoch and self._buckets.get(item.bucket.sid) is item.bucket:
                item.bucket.state = "creating"
                creates.append(item)  # else: cleared (or dropped) before it was written
        return creates, deletes

    def _build_batch(
        self, creates: list[_PendingCreate]
    ) -> tuple[list[_PendingCreate], list[tuple[SnapshotMetadata, PreparedSegments]]]:
        """Sort, cut and encode each create until the batch holds ``group_commit_max_bytes``;
        the rest go back to the front of the queue. Returns what to write; builds that fail
        (a bug, or bad settings) put their bucket in memory mode."""
        kept: list[_PendingCreate] = []
        built: list[tuple[SnapshotMetadata, PreparedSegments]] = []
        size = 0
        for i, item in enumerate(creates):
            if built and size >= self._config.group_commit_max_bytes:
                with self._lock:
                    self._persist_creates.extendleft(reversed(creates[i:]))
                break
            b = item.bucket
            try:
                metadata, segments = self._build(item.times, item.ledgers, item.entries,
                                                 b.start, b.end)  # fmt: skip
            except ValueError as exc:
                with self._lock:
                    self._create_failed(item, exc)
                continue
            size += sum(len(p) for p in segments.packed)
            kept.append(item)
            built.append((metadata, segments))
        return kept, built

    def _writer_status(self) -> WriterStatus:
        """What this writer holds only in memory now, for the manifest (lock held)."""
        return WriterStatus(
            self._unpersisted(),
            sum(b.state == "memory" for b in self._buckets.values()),
            max(self._now(), 0),
        )

    def _persist_job(self) -> None:
        """Group commit: write a batch of snapshot creates and deletes with two manifest writes,
        then acknowledge each change (in order) now that it is durable."""
        with self._lock:
            self._await_batch()
            creates, deletes = self._take_batch()
            status = self._writer_status()
        self._catalog.note_writer_status(status)
        started = time.perf_counter()
        creates, built = self._build_batch(creates)
        sizes = [len(item.times) for item in creates]

        def status_after(results: Sequence[BucketRecord | Exception]) -> WriterStatus:
            # What the acknowledging commit should record: this batch's creates are durable.
            written = sum(
                n for n, r in zip(sizes, results, strict=True) if not isinstance(r, Exception)
            )
            failed = sum(isinstance(r, Exception) for r in results)
            return WriterStatus(
                max(status.unpersisted - written, 0),
                status.memory_mode_buckets + failed,
                status.as_of_ms,
            )

        outcomes: tuple[BucketRecord | Exception, ...]
        try:
            result = self._catalog.apply_batch(built, deletes, status_after=status_after)
            outcomes, done, commits = result.created, result.deleted, result.commits
        except (StorageError, ManifestConflictError, ValueError) as exc:
            outcomes, done, commits = tuple(exc for _ in creates), tuple(False for _ in deletes), 0
            failed_batch: Exception | None = exc
        else:
            failed_batch = None
        with self._lock:
            self._group["batches"] += 1
            self._group["creates"] += len(creates)
            self._group["deletes"] += len(deletes)
            self._group["manifest_writes"] += commits
            for item, (metadata, segments), outcome in zip(creates, built, outcomes, strict=True):
                if isinstance(outcome, Exception):
                    self._create_failed(item, outcome)
                else:
                    self._create_succeeded(item, outcome, metadata, segments, started)
            for snapshot_id, ok in zip(deletes, done, strict=True):
                self._ops["delete"].record(ok, started)
                if ok:
                    continue
                if self._catalog.manifest.bucket(snapshot_id) is not None:
                    # Still live: the batch failed before deciding it. Retry after the backoff.
                    self._defer(self._deferred_deletes, snapshot_id)
                else:  # a pending intent now: the catalog's retries own it
                    self._warnings.append(f"delete of {snapshot_id!r} failed; will retry")
            if failed_batch is not None:
                self._warnings.append(f"a group commit failed; retried later: {failed_batch}")
            self._persist_scheduled = False
            if self._persist_creates or self._persist_deletes:
                self._schedule_persist()

    def _defer_at(self, attempts: int) -> int:
        """Schedule the retry tick after the backoff of ``attempts`` failures (lock held);
        return when that backoff runs out."""
        at: int = max(self._now(), 0) + backoff_delay_ms(
            self._config.delete_retry_delay_ms, attempts
        )
        self._deferred_at = min(self._deferred_at, at)
        return at

    def _defer(self, queue: list[Any], item: Any) -> None:
        """Keep a failed change for a retry after the backoff, on the index's clock (lock held)."""
        queue.append(item)
        self._defer_at(item.attempts if isinstance(item, _PendingCreate) else 1)

    def _create_failed(self, item: _PendingCreate, exc: BaseException) -> None:
        """A snapshot write failed: the bucket stays in memory and is retried later."""
        bucket = item.bucket
        self._ops["create"].record(False, time.perf_counter())
        self._warnings.append(
            f"create of bucket [{bucket.start}, {bucket.end}] failed; kept in memory: {exc}"
        )
        if self._buckets.get(bucket.sid) is not bucket:
            return
        bucket.state = "memory"
        if bucket.exhausted:
            self._drop_bucket(bucket)
            return
        item.attempts += 1
        self._defer(self._deferred_creates, item)

    def _create_succeeded(
        self,
        item: _PendingCreate,
        record: BucketRecord,
        metadata: SnapshotMetadata,
        segments: PreparedSegments,
        started: float,
    ) -> None:
        bucket = item.bucket
        self._ops["create"].record(True, started)
        if self._closed or item.epoch != self._epoch or self._buckets.get(bucket.sid) is not bucket:
            # Cleared (or trimmed away) while being written: the snapshot is garbage.
            self._request_delete(record.snapshot_id)
            return
        self._make_durable(bucket, record, metadata)
        self._settle(bucket, segments)

    def _settle(self, bucket: _Bucket, segments: PreparedSegments) -> None:
        """A bucket whose snapshot just became durable: drop its data from memory.

        The segment holding the first index not yet consumed becomes a placeholder, read back
        from storage when it comes due.
        """
        core = self._core
        head = core.source_head(bucket.sid) if core.has_source(bucket.sid) else None
        if bucket.exhausted or head is None:
            self._retire(bucket)
            return
        # Nothing stays in memory: a placeholder (the min deliver time of the segment holding
        # the head) stands for the rest, and the segment is read back when it comes due. An idle
        # bucket then costs its bitmaps in the index and 16 bytes per segment.
        k = segments.segment_of(*head)  # 0-based segment holding the head
        core.cut_source(bucket.sid, -1, -1, -1, bucket.next_time(k))
        bucket.current = k
        if self._mark is not None and bucket.end < self._mark[0]:
            self._trim(bucket)
            return
        self._maybe_merge()

    def _trim(self, bucket: _Bucket) -> None:
        """Delete a bucket wholly below the mark-delete ledger (lock held). Everything in its
        ledgers is acknowledged (positions added after the mark at or below it were never
        tracked), so they are untracked: nothing stays counted that can no longer be
        delivered."""
        self._core.untrack_ledgers(bucket.start, bucket.end)
        if bucket.state in ("quarantined", "released"):
            self._forget_quarantined(bucket, "acknowledged")  # the damaged object stays
            self._drop_bucket(bucket)
        elif bucket.state == "memory":
            self._drop_bucket(bucket)
        else:
            self._retire(bucket)

    def _retire(self, bucket: _Bucket) -> None:
        """Drop a durable bucket from memory and queue its two-phase delete (lock held)."""
        snapshot_id = bucket.snapshot_id
        self._drop_bucket(bucket)
        if snapshot_id is not None:
            self._request_delete(snapshot_id)

    def _drop_bucket(self, bucket: _Bucket, *, keep_range: bool = False) -> None:
        core = self._core
        if self._buckets.pop(bucket.sid, None) is None:
            return
        core.remove_source(bucket.sid)
        if not keep_range:
            core.remove_range(bucket.start)

    def _unregister_merge(self, sources: list[_Bucket]) -> None:
        """A merge did not happen: the sources get their own ranges back (lock held)."""
        self._core.remove_range(sources[0].start)
        for b in sources:
            self._core.add_range(b.start, b.end)

    def _maybe_retry_failures(self, now: int) -> None:
        """Queue the retries whose backoff has run out (lock held): failed snapshot writes and
        deletes the group commit deferred, a merge whose outcome is unknown, merging after a
        failed merge, the catalog's failed delete intents and leftover create intents.

        Driven by the index's clock: failures wait ``delete_retry_delay_ms`` (doubling per
        failure); delete intents move to the dead letters after ``max_delete_attempts``.
        """
        if self._deferred_at <= now:
            self._deferred_at = MAX_TIME
            if self._unresolved_merge is not None:
                self._queue(self._resolve_merge_job)  # first: before any delete is retried
            for item in self._deferred_creates:
                if self._buckets.get(item.bucket.sid) is item.bucket and item.epoch == self._epoch:
                    item.enqueued = time.monotonic()
                    self._persist_creates.append(item)
            self._persist_deletes.extend(self._deferred_deletes)
            self._deferred_creates, self._deferred_deletes = [], []
            self._retry_quarantine_commits()
            if self._persist_creates or self._persist_deletes:
                self._schedule_persist()
            self._resume_merges(now)
        if self._retry_queued or self._unresolved_merge is not None:
            return
        intents = self._catalog.manifest.intents
        due = [i.next_attempt_ms for i in intents if i.kind == "delete"]
        if not self._persist_scheduled and not self._merge_in_flight:
            # No create is running, so a create intent is a failed rollback's leftover: the
            # same retry rolls it back now (else it waits for the next open).
            due += [now for i in intents if i.kind == "create"]
        if not due or min(due) > now:
            return
        self._retry_queued = True
        self._queue(lambda: self._retry_deletes_job(now))

    def _retry_deletes_job(self, now: int) -> None:
        started = time.perf_counter()
        try:
            report = self._catalog.retry_pending_deletes(now_ms=now)
        finally:
            with self._lock:
                self._retry_queued = False
        with self._lock:
            for _ in report.completed:
                self._ops["delete"].record(True, started)
            for snapshot_id in (*report.failed, *report.dead_lettered):
                self._ops["delete"].record(False, started)
                self._warnings.append(f"delete of {snapshot_id!r} failed again")

    def _maybe_merge(self) -> None:
        """Start a merge if there are too many sealed buckets (lock held).

        Started by a seal, a create or merge that completes, and (after a failed merge's
        backoff) by the retry tick of ``poll``/``has_message_available``.
        """
        limit = self._config.max_num_buckets
        if limit <= 0 or self._merge_in_flight or len(self._buckets) <= limit:
            return
        if self._merge_failures and self._now() < self._merge_retry_at:
            return  # backing off; _resume_merges restarts merging when the backoff runs out
        ordered = sorted(self._buckets.values(), key=lambda b: b.start)
        candidates = [
            (
                b.mergeable(),
                b.num_messages,
                b.next_time(b.current) if b.has_unloaded() else MAX_TIME,
            )
            for b in ordered
        ]
        low, high = self._core.mutable_range
        cut = len(ordered)
        if low >= 0:
            # The mutable bucket lies between sealed ones (after a reopen): no window may span
            # it, so it splits the candidates like an ineligible bucket.
            cut = sum(b.start < low for b in ordered)
            candidates.insert(cut, (False, 0, MAX_TIME))
        chosen = select_merge_window(candidates)
        if chosen is None:
            return
        first, count = chosen
        if first > cut:
            first -= 1
        sources = ordered[first : first + count]
        start, end = sources[0].start, sources[-1].end
        if low >= 0 and low <= end and high >= start:
            return  # cannot happen after the split above; kept as a guard
        # The merged range covers the gaps between the sources too. Registering it now routes
        # adds in those gaps to the direct heap, so no other bucket can claim a ledger in it.
        for b in sources:
            b.merging = True
            self._core.remove_range(b.start)
        self._core.add_range(start, end)
        self._merge_in_flight = True
        epoch = self._epoch
        self._queue(lambda: self._merge_then_trim(sources, epoch))

    def _resume_merges(self, now: int) -> None:
        """Retry tick (lock held): merge again once a failed merge's backoff has run out."""
        if self._merge_failures and now < self._merge_retry_at:
            # Another retry fired the tick first: keep it armed for the merge's own time.
            self._deferred_at = min(self._deferred_at, self._merge_retry_at)
            return
        self._maybe_merge()

    def _bound_stats(self) -> dict[str, Any]:
        """``stats()`` keys on the bucket bound: how far above ``max_num_buckets``, and why."""
        limit = self._config.max_num_buckets
        sealed = list(self._buckets.values())
        over = max(len(sealed) - limit, 0) if limit > 0 else 0
        return {
            "bucket_limit": limit if limit > 0 else None,
            "over_limit": over,
            "over_limit_why": {
                "creating": sum(b.state == "creating" for b in sealed),
                "memory_mode": sum(b.state == "memory" for b in sealed),
                "quarantined": sum(b.state in ("quarantined", "released") for b in sealed),
                "merging": sum(b.merging for b in sealed),
                "merge_failures": self._merge_failures,
                "merge_retry_at_ms": self._merge_retry_at if self._merge_failures else None,
            },
        }

    def _merge_then_trim(self, sources: list[_Bucket], epoch: int) -> None:
        self._merge_job(sources, epoch)
        release_free_memory()  # the merge's decoded segments (tens of MB) are garbage now

    def _merge_job(self, sources: list[_Bucket], epoch: int) -> None:
        started = time.perf_counter()
        record: BucketRecord | None = None
        metadata: SnapshotMetadata | None = None
        reading: _Bucket | None = None
        try:
            columns: list[tuple[Int64Array, Int64Array, Int64Array]] = []
            for b in sources:
                reading = b
                assert b.snapshot_id is not None
                # Read in slices: each decode holds the GIL, and add() must not wait long.
                for first in range(1, b.num_segments + 1, MERGE_READ_SEGMENTS):
                    last = min(first + MERGE_READ_SEGMENTS - 1, b.num_segments)
                    columns.append(self._storage.get_segment_arrays(b.snapshot_id, first, last))
            times, ledgers, entries = (np.concatenate(c) for c in zip(*columns, strict=True))
            keep = np.empty(len(times), dtype=np.bool_)
            for start in range(0, len(times), MERGE_FILTER_ROWS):
                stop = start + MERGE_FILTER_ROWS
                with self._lock:  # in slices: the lock is add()'s too
                    keep[start:stop] = self._core.tracked_mask(
                        ledgers[start:stop], entries[start:stop]
                    )
            times, ledgers, entries = times[keep], ledgers[keep], entries[keep]
            if len(times):
                # build_snapshot sorts (natively, without the GIL).
                metadata, segments = self._build(
                    times, ledgers, entries, sources[0].start, sources[-1].end
                )
                # The sources' objects are deleted only once this index no longer reads them
                # (_merge_succeeded): a poll may be loading one of their segments right now.
                record = self._catalog.create_bucket(
                    metadata,
                    segments,
                    replaces=[b.snapshot_id for b in sources if b.snapshot_id],
                    delete_replaced=False,
                )
        except CommitOutcomeUnknownError as exc:
            # The merged bucket may be live and its sources delete intents, or not. Until a
            # resync tells, the sources stay as they are (still readable: the catalog deletes
            # nothing before it has re-read the manifest, and this index retries nothing first).
            assert metadata is not None
            with self._lock:
                self._ops["merge"].record(False, started)
                self._warnings.append(f"merge outcome unknown; resolved later: {exc}")
                self._unresolved_merge = (sources, epoch, metadata)
                self._defer_at(1)
            return
        except (StorageError, ManifestConflictError, SnapshotCorruptError,
                SnapshotNotFoundError, ValueError) as exc:  # fmt: skip
            with self._lock:
                self._ops["merge"].record(False, started)
                self._warnings.append(f"merge of {len(sources)} buckets failed: {exc}")
                self._merge_failed(sources, epoch)
                damaged = isinstance(exc, (SnapshotCorruptError, SnapshotNotFoundError))
                if damaged and reading is not None and self._buckets.get(reading.sid) is reading:
                    self._quarantine(reading, exc, max(reading.current, 1))
            return
        with self._lock:
            self._ops["merge"].record(True, started)
            if record is None:  # nothing tracked any more: the sources just go
                self._merge_in_flight = False
                for b in sources:
                    b.merging = False
                if epoch == self._epoch and not self._closed:
                    self._unregister_merge(sources)
                for b in sources:
                    if self._buckets.get(b.sid) is b:
                        self._retire(b)
                self._merge_failures = 0
                self._maybe_merge()  # still too many buckets? merges chain until they fit
                return
            assert metadata is not None
            self._merge_succeeded(sources, epoch, record, metadata)

    def _merge_failed(self, sources: list[_Bucket], epoch: int) -> None:
        """A merge did not happen: the sources are themselves again (lock held), and merging
        resumes after the retry backoff (the count stays above the bound meanwhile)."""
        self._merge_in_flight = False
        self._merge_failures += 1
        self._merge_retry_at = self._defer_at(self._merge_failures)
        if epoch == self._epoch and not self._closed:
            self._unregister_merge(sources)
        mark = self._mark
        for b in sources:
            b.merging = False
            if self._buckets.get(b.sid) is not b:
                continue
            if mark is not None and b.end < mark[0]:
                self._trim(b)  # acknowledged while the merge ran
            elif b.exhausted:
                self._retire(b)

    def _merge_succeeded(
        self, sources: list[_Bucket], epoch: int, record: BucketRecord, metadata: SnapshotMetadata
    ) -> None:
        """The merged bucket is live and its sources are gone from the manifest (lock held).

        The sources' in-memory runs (loaded segments) are dropped: every position still
        tracked in them was tracked when the merge filtered, so it is in the merged snapshot,
        behind a placeholder for segment 1 that keeps delivery in global order.
        """
        self._merge_in_flight = False
        self._merge_failures = 0
        for b in sources:
            b.merging = False
            if b.snapshot_id is not None:
                self._request_delete(b.snapshot_id)  # delete intents since the merge's commit
        if self._closed or epoch != self._epoch:
            self._request_delete(record.snapshot_id)
            return
        for b in sources:
            self._drop_bucket(b, keep_range=True)  # the merged range is registered
        merged = self._new_bucket(record.start_ledger, record.end_ledger, record.num_messages)
        self._make_durable(merged, record, metadata)
        # Nothing in memory: a placeholder for segment 1, read back when it comes due.
        self._core.set_source(merged.sid, _EMPTY, _EMPTY, _EMPTY, merged.next_time(0))
        if self._mark is not None and merged.end < self._mark[0]:
            self._trim(merged)  # acknowledged while it was being merged
        self._maybe_merge()  # still too many buckets? merges chain until they fit

    def _resolve_merge_job(self) -> None:
        """Learn whether a merge whose commit outcome was unknown happened, and act on it."""
        with self._lock:
            unresolved = self._unresolved_merge
        if unresolved is None:
            return
        sources, epoch, metadata = unresolved
        try:
            manifest = self._catalog.resync()
        except (StorageError, SnapshotCorruptError) as exc:
            with self._lock:
                self._warnings.append(f"merge outcome still unknown: {exc}")
                self._defer_at(2)
            return
        live = manifest.live_ids()
        merged = next(
            (
                b
                for b in manifest.buckets
                if (b.start_ledger, b.end_ledger) == (sources[0].start, sources[-1].end)
                and b.snapshot_id not in {s.snapshot_id for s in sources}
            ),
            None,
        )
        with self._lock:
            self._unresolved_merge = None
            if merged is not None and not any(s.snapshot_id in live for s in sources):
                self._merge_succeeded(sources, epoch, merged, metadata)
            else:
                self._merge_failed(sources, epoch)

    # -- delivery -------------------------------------------------------------------------------

    def has_message_available(self) -> bool:
        """Whether some tracked message is due (False once closed). When not, (re)arms the
        timer."""
        with self._lock:
            if self._closed:
                return False
            now = self._now()
            due = bool(self._core.has_due(now))
            if not due:
                self._rearm(now)
            if self._deferred_at <= now:  # retries (merges too) resume by time, not by polls
                self._maybe_retry_failures(now)
        if self._queued:
            self._submit_queued()
        return due

    def poll(self, max_messages: int) -> list[Position]:
        """Remove and return up to ``max_messages`` due positions.

        Selected in ``(deliver_at, ledger_id, entry_id)`` order across all buckets, returned
        sorted by position. Loads a bucket's next segment when its placeholder comes due; if
        that load fails, the positions before it are returned and the next call retries.
        """
        max_messages = as_count(max_messages)
        with self._lock:
            self._check_open()
            now = self._now()
            want = min(max_messages, MAX_TIME)
            out: list[Position] = self._core.poll(want, now)
            extra: list[Position] = []
            # Each load reads the segment, quarantines a damaged bucket or moves a failing
            # one's placeholder past the cutoff: the loop always ends, and no bucket holds the
            # others back.
            while self._core.load_needed >= 0 and len(out) + len(extra) < want:
                self._load(self._core.load_needed, now)
                extra.extend(self._core.poll(want - len(out) - len(extra), now))
            for sid in self._core.take_exhausted():
                self._exhaust(sid)
            if self._catalog.manifest.intents or self._deferred_at <= now:
                self._maybe_retry_failures(now)
            self._rearm(now)
        if self._queued:
            self._submit_queued()
        if extra:
            out.extend(extra)
            out.sort()
        return out

    def _load(self, sid: int, now: int, *, single: bool = False) -> None:
        """Load bucket ``sid``'s next segments (lock held).

        Consecutive segments are read together until they hold :data:`LOAD_BATCH_INDEXES`
        indexes: a realistic bucket's far-future tail is hundreds of one-index segments, and
        one read per index would bound delivery by storage latency.

        Damage (a checksum or decode failure, a missing object) quarantines the bucket. A
        transient storage error moves the bucket's placeholder past the cutoff to its retry
        time (``load_retry_delay_ms``, backing off): its messages come late, never early, and
        the other buckets keep delivering meanwhile. A damaged batch is read again one segment
        at a time (``single``), so the good segments before the damage are still delivered.
        """
        bucket = self._buckets[sid]
        started = time.perf_counter()
        first = bucket.current + 1
        base = int(bucket.bounds[first - 2]) if first > 1 else 0
        last = int(np.searchsorted(bucket.bounds, base + LOAD_BATCH_INDEXES, side="right"))
        last = first if single else min(max(last, first), bucket.num_segments)
        assert bucket.snapshot_id is not None
        try:
            times, ledgers, entries = self._storage.get_segment_arrays(
                bucket.snapshot_id, first, last
            )
            expected = int(bucket.bounds[last - 1]) - base
            if len(times) != expected:
                raise SnapshotCorruptError(
                    f"{bucket.snapshot_id}: segments {first}..{last} hold {len(times)} "
                    f"indexes, expected {expected}"
                )
        except (SnapshotCorruptError, SnapshotNotFoundError) as exc:
            self._ops["load"].record(False, started)
            if last > first and isinstance(exc, SnapshotCorruptError):
                self._load(sid, now, single=True)  # isolate the damaged segment
            else:
                self._quarantine(bucket, exc, first)
            return
        except StorageError as exc:
            self._ops["load"].record(False, started)
            bucket.load_failures += 1
            delay = backoff_delay_ms(self._config.load_retry_delay_ms, bucket.load_failures)
            retry_at = max(now + max(delay, 1), self._core.cutoff_for(now) + 1)
            self._core.set_source(sid, _EMPTY, _EMPTY, _EMPTY, retry_at)
            self._warnings.append(
                f"reads of segments {first}..{last} of {bucket.snapshot_id!r} (bucket "
                f"[{bucket.start}, {bucket.end}]) are failing; retried with backoff, the "
                f"bucket's messages wait (late, never early), the others keep delivering; "
                f"check the storage: {exc}",
                key=f"load:{bucket.snapshot_id}",
            )
            return
        self._core.set_source(sid, times, ledgers, entries, bucket.next_time(last))
        bucket.current = last
        if bucket.load_failures:
            bucket.load_failures = 0
            self._warnings.resolve(f"load:{bucket.snapshot_id}")
        self._ops["load"].record(True, started)

    def _exhaust(self, sid: int) -> None:
        bucket = self._buckets.get(sid)
        if bucket is None:
            return
        bucket.exhausted = True
        if bucket.state in ("memory", "released"):  # a released one keeps its damaged object
            self._drop_bucket(bucket)
        elif bucket.state == "durable" and not bucket.merging:
            self._retire(bucket)

    def next_delivery_time(self) -> int | None:
        """Smallest ``deliver_at`` among loaded indexes (and next-segment minimums), or None."""
        with self._lock:
            if self._closed:
                return None
            return self._core.next_time()  # type: ignore[no-any-return]

    def contains(self, ledger_id: int, entry_id: int) -> bool:
        """Whether the position is tracked and not yet delivered. Safe from other threads."""
        with self._lock:
            if self._closed:
                return False
            try:
                return self._core.contains(ledger_id, entry_id)  # type: ignore[no-any-return]
            except (TypeError, OverflowError):
                _diagnose(ledger_id=ledger_id, entry_id=entry_id)
                raise

    def __len__(self) -> int:
        """Number of tracked, undelivered positions (exact)."""
        return 0 if self._closed else len(self._core)

    def tracked_entries(self, ledger_id: int, first_entry: int, last_entry: int) -> BitMap:
        """Tracked entry ids of ``ledger_id`` in ``[first_entry, last_entry]`` (a new BitMap).

        A dispatcher can skip reading these entries: they will be delivered by the index.
        """
        _diagnose(ledger_id=ledger_id, entry_id=first_entry)
        _diagnose(ledger_id=ledger_id, entry_id=last_entry)
        out = BitMap()
        if last_entry < first_entry:
            return out
        with self._lock:
            if self._closed:
                return out
            bm = self._core.index_bitmap(ledger_id, first_entry, last_entry)
        return out if bm is None else bm

    # -- durability ----------------------------------------------------------------------------

    def set_mark_delete(self, ledger_id: int, entry_id: int) -> None:
        """Acknowledge every position ``<= (ledger_id, entry_id)``.

        Their indexes are untracked and never delivered, and a later :meth:`add` of such a
        position is refused (it returns True and tracks nothing) until :meth:`clear`, which is
        how a cursor rewind is expressed; sealed buckets wholly below
        ``ledger_id`` whose snapshot is durable are deleted (a bucket straddling the ledger is
        kept). The mark only moves forward; an older mark is ignored. It is persisted in the
        manifest with the next commit (a seal, merge or delete) and by :meth:`close`, so a
        reopen does not bring acknowledged positions back; after a crash, re-apply the cursor's
        durable mark-delete position once the index is open.
        """
        _diagnose(ledger_id=ledger_id, entry_id=entry_id)
        with self._lock:
            self._check_open()
            mark = (ledger_id, entry_id)
            if self._mark is not None and mark <= self._mark:
                return
            self._mark = mark
            self._catalog.note_mark_delete(mark)  # persisted with the next manifest commit
            self._core.untrack_upto(ledger_id, entry_id)
            for bucket in list(self._buckets.values()):
                if bucket.end < ledger_id and not bucket.merging and bucket.state != "creating":
                    self._trim(bucket)
        if self._queued:
            self._submit_queued()

    @property
    def mark_delete(self) -> tuple[int, int] | None:
        """The last mark-delete position, or None."""
        return self._mark

    def flush(self) -> None:
        """Block until every snapshot create, merge and delete started so far has finished.

        A group commit waiting for more changes is written at once. Changes that failed and
        wait for their retry backoff are not retried by ``flush`` (see :meth:`stats`).
        Then returns the memory their temporaries freed to the OS (see ``delayindex._memory``).
        """
        with self._lock:
            self._flushing += 1
            self._persist_wakeup.notify_all()
        try:
            while True:
                with self._inflight_lock:
                    pending = list(self._inflight)
                if not pending:
                    with self._lock:
                        queued = bool(self._queued)
                    if not queued:
                        release_free_memory()
                        return
                    self._submit_queued_from_job()
                    continue
                for future in pending:
                    future.result()
        finally:
            with self._lock:
                self._flushing -= 1

    def unpersisted(self) -> int:
        """Indexes that live only in memory: the mutable bucket, direct adds, unwritten buckets."""
        with self._lock:
            return self._unpersisted()

    def _unpersisted(self) -> int:
        core = self._core
        if isinstance(core, _ClosedCore):
            return 0  # nothing is held any more (close recorded what was lost)
        total = core.mutable_size + core.direct_size
        for b in self._buckets.values():
            if b.state in ("creating", "memory", "released") and core.has_source(b.sid):
                total += core.source_remaining(b.sid)
        return int(total)

    def should_pause_all_deliveries(self) -> bool:
        """Fixed-delay detection, or (with ``pause_on_unpersisted``) too much unpersisted state."""
        with self._lock:
            if self._closed:
                return False
            now = self._now()
            pause = bool(self._core.should_pause(now))
            if not self._core.has_due(now):
                self._rearm(now)
            if self._config.pause_on_unpersisted:
                pause = pause or self._unpersisted() > self._config.max_unpersisted_indexes
            return pause

    # -- housekeeping -------------------------------------------------------------------------

    def buckets(self) -> list[BucketInfo]:
        """One record per sealed bucket, in ledger order."""
        with self._lock:
            return [b.info() for b in sorted(self._buckets.values(), key=lambda b: b.start)]

    def memory_usage_bytes(self) -> int:
        """Resident estimate: heaps, loaded segments, bitmaps and per-bucket bookkeeping."""
        with self._lock:
            total = int(self._core.memory_bytes())
            for b in self._buckets.values():
                total += 200 + b.mins.nbytes + b.bounds.nbytes
            return total

    def stats(self) -> dict[str, Any]:
        """Counters and gauges: buckets, loaded indexes, snapshot bytes, op counts, warnings.

        ``health`` is ``"ok"``, or ``"degraded"`` while ``problems`` lists a condition that
        needs attention, each with what to do: quarantined buckets, failing segment reads,
        dead letters, memory-mode buckets, unrecorded quarantines. ``warnings`` holds the
        newest messages, each distinct problem once. Also works on a closed index.
        """
        with self._lock:
            out: dict[str, Any] = dict(self._core.counters())
            states = [b.state for b in self._buckets.values()]
            problems = self._problems()
            quarantined = [
                {
                    "snapshot_id": b.snapshot_id, "start_ledger": b.start, "end_ledger": b.end,
                    "reason": b.damage.reason if b.damage else "",
                }
                for b in self._buckets.values() if b.state == "quarantined"
            ]  # fmt: skip
            dead_letters = [d.snapshot_id for d in self._catalog.manifest.dead_letters]
            out.update(
                implementation="native" if _impl.NATIVE else "pure",
                buckets=len(self._buckets) + 1,
                sealed_buckets=len(self._buckets),
                durable_buckets=states.count("durable"),
                memory_mode_buckets=states.count("memory"),
                creating_buckets=states.count("creating"),
                merge_in_flight=self._merge_in_flight,
                group_commit=dict(self._group),
                awaiting_retry={
                    "creates": len(self._deferred_creates),
                    "deletes": len(self._deferred_deletes),
                    "at_ms": None if self._deferred_at == MAX_TIME else self._deferred_at,
                },
                snapshot_bytes=sum(b.snapshot_bytes for b in self._buckets.values()),
                unpersisted=self._unpersisted(),
                blocked_on_persistence=self._config.pause_on_unpersisted
                and self._unpersisted() > self._config.max_unpersisted_indexes,
                memory_bytes=int(self._core.memory_bytes()),
                ops={k: v.as_dict() for k, v in self._ops.items()},
                warnings=list(self._warnings),
                storage_problems=self._catalog.problems(),
                pending_deletes=[
                    i.snapshot_id for i in self._catalog.manifest.intents if i.kind == "delete"
                ],
                dead_letters=dead_letters,
                quarantined_buckets=len(quarantined),
                quarantined=quarantined,
                released_buckets=states.count("released"),
                retrying_loads={
                    b.snapshot_id: b.load_failures
                    for b in self._buckets.values() if b.load_failures
                },
                problems=problems,
                health="degraded" if problems else "ok",
                mark_delete=self._mark,
                tick_ms=self._core.tick_ms,
                strict=self._config.strict,
                timer_armed=self._arming is not None and self._arming.armed,
                closed=self._closed,
            )
            out.update(self._bound_stats())  # bucket_limit, over_limit, over_limit_why
            return out

    def _problems(self) -> list[str]:
        """Conditions that need an operator, each with what to do (lock held)."""
        out = []
        for b in sorted(self._buckets.values(), key=lambda b: b.start):
            if b.state == "quarantined":
                out.append(
                    f"bucket [{b.start}, {b.end}] ({b.snapshot_id}) is quarantined: repair it "
                    "(delayindex repair --store STORE --name NAME --dump DUMP) or release it "
                    "(release_quarantined)"
                )
            elif b.load_failures:
                out.append(
                    f"reads of {b.snapshot_id} failed {b.load_failures} times in a row; its "
                    "messages wait: check the storage"
                )
            elif b.state == "memory":
                out.append(
                    f"bucket [{b.start}, {b.end}] could not be written and is held in memory "
                    "(retried with backoff): check the storage"
                )
        dead = len(self._catalog.manifest.dead_letters)
        if dead:
            out.append(
                f"{dead} snapshot deletes are dead letters: retry them "
                "(delayindex gc STORE --delete --retry-dead-letters)"
            )
        if self._pending_quarantine:
            out.append("quarantines not yet recorded in the manifest (retried): check the storage")
        return out

    def clear(self) -> None:
        """Drop everything and delete every snapshot of this name.

        Always completes: in-flight jobs are awaited, and deletes that fail stay as pending
        intents in the manifest (retried later, shown in :meth:`stats`), never raised.
        Quarantined buckets are resolved as ``cleared``; their damaged objects are kept.
        """
        self._check_open()
        self.flush()
        with self._lock:
            self._epoch += 1
            self._core.clear()
            self._buckets.clear()
            self._persist_creates.clear()
            self._deferred_creates.clear()
            self._merge_in_flight = False
            self._mark = None
            self._catalog.note_mark_delete(None)
            if self._arming is not None:
                self._arming.cancel()
            live = [b.snapshot_id for b in self._catalog.buckets()]
            self._pending_quarantine.clear()  # superseded by the resolution below
            damaged = [q.snapshot_id for q in self._catalog.manifest.quarantined if q.active]
        try:
            self._catalog.resolve_quarantine(damaged, "cleared")
        except (StorageError, ManifestConflictError) as exc:
            with self._lock:
                self._warnings.append(f"clear: the quarantine is not resolved: {exc}")
        for snapshot_id in live:
            try:
                self._catalog.delete_bucket(snapshot_id)
            except (StorageError, ManifestConflictError, ValueError) as exc:
                with self._lock:
                    self._warnings.append(f"clear: delete of {snapshot_id!r} failed: {exc}")
        try:
            self._catalog.retry_pending_deletes(force=True)
        except (StorageError, ManifestConflictError) as exc:
            with self._lock:
                self._warnings.append(f"clear: pending deletes not finished: {exc}")
        try:
            self._catalog.persist_mark_delete()  # the reset, now: an old mark must not return
        except (StorageError, ManifestConflictError) as exc:
            with self._lock:
                self._warnings.append(f"clear: the mark-delete reset is not persisted: {exc}")

    def close(self) -> None:
        """Stop the timer, finish in-flight writes and release the name. Snapshots stay.

        Idempotent; afterwards ``add``/``poll`` raise :class:`TrackerClosedError`.

        Raises:
            StorageError: the mark-delete position could not be persisted (everything else is
                closed all the same; re-apply the mark after the next open).
        """
        if self._closed:
            return
        self.flush()
        with self._lock:
            if self._closed:
                return
            self._closed = True
            if self._arming is not None:
                self._arming.cancel()
        self._shutdown_executor()
        with self._lock:
            # The mutable bucket (and any bucket whose write failed) is lost with this process:
            # record how much, so inspect tells how much the dispatcher must replay.
            final_status = self._writer_status()
        failure: Exception | None = None
        try:
            self._catalog.persist_mark_delete(final_status=final_status)
        except (StorageError, ManifestConflictError) as exc:
            failure = exc
        with self._lock:
            self._core.clear()
            self._core = _ClosedCore(self._core)
            self._buckets.clear()
        mark_lost = failure is not None and self._catalog.mark_pending
        self._catalog.close()
        if failure is not None and not mark_lost:
            _log.warning("%s: the final writer status was not recorded: %s", self._name, failure)
        if mark_lost:
            # Everything else is closed; the caller must know that acknowledged positions
            # may come back after a reopen (at-least-once) unless it re-applies its mark.
            raise StorageError(
                f"{self._name!r} is closed, but its mark-delete position {self._mark} was not "
                f"persisted: after a reopen, re-apply the cursor's mark-delete position "
                f"(set_mark_delete) or positions up to it are delivered again: {failure}"
            ) from failure

    def _shutdown_executor(self) -> None:
        if self._owns_executor:
            self._executor.shutdown(wait=True)

    @property
    def name(self) -> str:
        """The index name in its storage."""
        return self._name

    def _check(self) -> None:
        """Assert the invariants of the core and of the bucket table (tests call this)."""
        with self._lock:
            self._core._check()
            for b in self._buckets.values():
                if not self._core.in_sealed_range(b.start):
                    raise AssertionError(f"bucket [{b.start}, {b.end}] has no sealed range")
                if b.state == "durable" and b.snapshot_id is None:
                    raise AssertionError("a durable bucket has no snapshot id")
                if b.state == "quarantined" and self._core.has_source(b.sid):
                    raise AssertionError(f"quarantined bucket [{b.start}, {b.end}] delivers")
                if b.state in ("quarantined", "released") and (b.damage is None or b.merging):
                    raise AssertionError(f"bucket [{b.start}, {b.end}]: bad damage record")
            live = {b.snapshot_id for b in self._buckets.values() if b.state == "durable"}
            manifest = self._catalog.manifest.live_ids()
            if not live <= manifest:
                raise AssertionError(f"durable buckets {live - manifest} are not in the manifest")

    def __repr__(self) -> str:
        state = "closed" if self._closed else f"tracked={len(self)} buckets={len(self._buckets)}"
        return f"<DelayIndex {self._name!r} {state}>"


_OPEN_TOKEN = object()

__all__ = ["BucketInfo", "DelayIndex", "resolve_overlaps", "select_merge_window"]
