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
  ``LOAD_BATCH_INDEXES``, more while they are due already; the only load in flight, under the
  lock) and resumes. A storage error moves that bucket's placeholder past the cutoff to its
  retry time (``load_retry_delay_ms``, backing off per failure): its messages come late, never
  early, and no other bucket waits.
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
  bucket's metadata columns are read and fully due segments skipped; the positions of the
  rest are restored a bucket at a time, on first use and by a background job
  (``_lazy_restore.py``), and each first live segment is a placeholder, read when due; the
  persisted mark is applied. A damaged or missing snapshot quarantines its bucket only (moved
  to the manifest's quarantine list in one commit before anything is installed); active
  quarantine records are restored without delivery. A storage error reading a snapshot's
  metadata raises :class:`~delayindex.errors.RecoveryError` having changed nothing; one reading
  a segment leaves it a placeholder, read again after the loads' backoff.

Threads: one lock guards the core and the bucket table. Background jobs do their I/O without it
and take it only to install results (in slices where the work is large). Jobs are queued while
the lock is held and submitted after it is released, so an inline executor cannot deadlock.

Layout. :class:`DelayIndex` is assembled from mixins, one module per responsibility (recovery,
the persist writer, housekeeping, merges, loads, stats, damage; ``docs/architecture.md`` maps
them); its state lives on the instance (set in ``__init__`` here) and each mixin declares the
attributes it uses. This module holds the public class, ``open``, the job queue, the hot path,
sealing, ``_build`` (so tests can patch this module's ``build_snapshot``), the mark and ``close``.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Callable
from concurrent.futures import Executor, Future, ThreadPoolExecutor
from typing import Any

import numpy as np
import numpy.typing as npt
from pyroaring import BitMap

from delayindex import _impl, _registry
from delayindex._memory import release_free_memory
from delayindex.clock import Clock
from delayindex.config import TrackerConfig
from delayindex.errors import (
    ManifestConflictError,
    RecoveryError,
    SnapshotCorruptError,
    StorageError,
    TrackerClosedError,
)
from delayindex.model import MAX_TIME, Position
from delayindex.policy import (
    resolve_overlaps,
    select_merge_window,
)
from delayindex.snapshot.format import PreparedSegments, SnapshotMetadata, build_snapshot
from delayindex.storage.base import SnapshotStorage
from delayindex.storage.catalog import Catalog
from delayindex.storage.manifest import BucketRecord, QuarantineRecord
from delayindex.timers import ArmingRule, Timer
from delayindex.tracker._bucket import BucketInfo, Int64Array, _Bucket, _PendingCreate
from delayindex.tracker._damage import ProblemLog, QuarantineMixin
from delayindex.tracker._front import TrackerFront, as_count
from delayindex.tracker._housekeeping import HousekeepingMixin
from delayindex.tracker._lazy_restore import LazyBucket, LazyRestoreMixin
from delayindex.tracker._loading import LoadingMixin
from delayindex.tracker._merge import MergeMixin
from delayindex.tracker._overrides import OverridesMixin
from delayindex.tracker._persist import PersistMixin
from delayindex.tracker._recovery import RecoveryMixin
from delayindex.tracker._schedule import ScheduleMixin
from delayindex.tracker._stats import StatsMixin, _OpStats
from delayindex.tracker._topic import TopicMixin
from delayindex.tracker.in_memory import _ClosedCore, _diagnose, as_int64_array

_log = logging.getLogger(__name__)
_DEFAULT_CONFIG = TrackerConfig()


class DelayIndex(
    LazyRestoreMixin,
    OverridesMixin,
    ScheduleMixin,
    QuarantineMixin,
    RecoveryMixin,
    PersistMixin,
    MergeMixin,
    HousekeepingMixin,
    LoadingMixin,
    StatsMixin,
    TopicMixin,
    TrackerFront,
):
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
        # Optional: a storage that reads ahead takes hints of the segments loaded next.
        self._prefetch = getattr(self._storage, "prefetch_segments", None)
        self._ahead: list[tuple[int, int, int]] = []
        self._name: str = _catalog.name
        self._clock: Clock = kwargs["clock"]
        self._core: Any = _impl.BucketCore(**config.bucket_core_settings())
        self._lock = _impl.Lock()  # the native fronts take it from C
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
        # A deque: consumers popleft while adds append, so no job is lost between a swap and
        # an append, and the front keeps one reference to it.
        self._queued: deque[Callable[[], None]] = deque()
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
        self._front = _impl.Front(self._lock, self._clock, self._core)
        self._front.arming = self._arming
        self._front.seal = self._seal
        self._front.restore = self._restore_evicted
        self._front.queued = self._queued
        self._front.submit = self._submit_queued
        self._front.check_open = self._check_open
        self._front.load = self._load
        self._front.after_poll = self._after_take
        self._bind_front()
        self._flushing = 0
        self._deferred_creates: list[_PendingCreate] = []
        self._deferred_deletes: list[str] = []
        self._deferred_at = MAX_TIME
        self._unresolved_merge: tuple[list[_Bucket], int, SnapshotMetadata] | None = None
        self._group = {"batches": 0, "creates": 0, "deletes": 0, "manifest_writes": 0}
        self._mark: tuple[int, int] | None = None
        self._lazy: dict[int, LazyBucket] = {}  # recovered, positions not restored yet
        self._lazy_spans: list[tuple[int, int, int]] = []  # their (start, end, sid), sorted
        self._lazy_count = 0
        self._restore_job_queued, self._restore_in_background = False, True  # until a close
        self._lazy_lock = threading.RLock()
        self._overrides_dirty = False  # cancels or reschedules not yet handed to the catalog
        self._overrides_used = False  # some were made (a mark may forget some: note again)
        self._noted_gen = -1  # the core's override_gen at the last note
        self._evicted_count = 0  # cancels evicted from the core, held by the catalog only
        self._fold_pending: list[tuple[int, int]] = []  # merged ranges whose folds to note
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

        Recovery (the module doc): each live bucket's metadata columns are read, and no
        segment; positions are restored a bucket at a time, on first use and in the
        background; ``len`` is exact at once. A missing or damaged snapshot quarantines its
        bucket only, with a warning in :meth:`stats`.

        Args:
            storage: where snapshots and the manifest live (``FileStorage``, ``MemoryStorage``).
            name: the index name (letters, digits, ``._-``); one writer per name.
            config: tracker settings.
            clock: zero-argument callable returning epoch ms (default: wall clock).
            timer: optional timer armed by Pulsar's rule; ``on_ready()`` is called when it fires.
            on_ready: called without the lock held when armed messages may be due.
            executor: runs snapshot writes, merges and deletes (default: one private thread).

        Raises:
            RecoveryError: a snapshot's metadata could not be read (a storage error after the
                retries) or no manifest could be recovered; it is named, nothing is changed.
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
                **config.catalog_settings(),
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
        _registry.enroll(index)
        return index

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
        bucket.maxs = np.array(metadata.maxs, dtype=np.int64)
        bucket.bounds = np.cumsum(metadata.counts)
        bucket.folded = record.folded_cancels  # counted when the record was made

    def _queue(self, job: Callable[[], None]) -> None:
        """Queue a background job; it is submitted once the lock is released."""
        self._queued.append(job)

    def _submit_queued(self) -> None:
        """Submit every queued job. No lock needed: each job is taken by exactly one popleft,
        whichever thread (a caller after its call, a finished job, flush) gets to it."""
        queued = self._queued
        while queued:
            try:
                job = queued.popleft()
            except IndexError:  # another thread took the last one
                return
            self._submit(job)

    def _submit(self, job: Callable[[], None]) -> None:
        def run() -> None:
            try:
                job()
            except Exception:  # a bug: log it, never kill the executor thread silently
                _log.exception("delayindex %s: background job failed", self._name)
            finally:
                self._submit_queued()

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
        # Each instance calls the front's add directly (_bind_front): lock, clock read, core
        # call; it seals when the core asks to (then adds again), re-arms the timer, and
        # submits queued jobs once the lock is released. A closed index has a core whose add
        # raises TrackerClosedError.
        return self._front.add(ledger_id, entry_id, deliver_at)  # type: ignore[no-any-return]

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
                if self._core.needs_restore(int(ledgers[stop]), int(entries[stop])):
                    self._restore_evicted(int(ledgers[stop]))
                else:
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
        if not self._core.evicted_ranges():
            self._note_overrides()  # carried by this seal's commit
        # (else its persist job notes them, off the add path, before that commit)
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
            **self._config.builder_settings(),
            start_ledger=start,
            end_ledger=end,
            validate=False,  # positions come from the dedup index: distinct by construction
        )

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
        # One call into the front: under the lock it checks the index is open, polls the core
        # at the clock's now and, while more is wanted and a segment placeholder is due, loads
        # it (_load reads the segment, quarantines a damaged bucket or moves a failing one's
        # placeholder past the cutoff: the loop always ends, no bucket holds the others back)
        # and polls again, merging into what it has; then _after_take. Queued jobs are
        # submitted once the lock is released.
        try:
            return self._front.poll(max_messages)  # type: ignore[no-any-return]
        except TypeError:
            self._now()  # names a bad clock value
            raise

    def _after_take(self, now: int) -> None:
        """After positions were taken (under the lock): retire exhausted buckets, retry what
        waits for its backoff, re-arm the timer."""
        for sid in self._core.take_exhausted():
            self._exhaust(sid)
        if self._catalog.manifest.intents or self._deferred_at <= now:
            self._maybe_retry_failures(now)
        self._rearm(now)

    def next_delivery_time(self) -> int | None:
        """Smallest ``deliver_at`` among loaded indexes (and next-segment minimums), or None."""
        with self._lock:
            if self._closed:
                return None
            return self._core.next_time()  # type: ignore[no-any-return]

    def contains(self, ledger_id: int, entry_id: int) -> bool:
        """Whether the position is tracked and not yet delivered. Safe from other threads."""
        # Each instance calls the front's contains directly (_bind_front); a closed index's
        # core tracks nothing.
        return self._front.contains(ledger_id, entry_id)  # type: ignore[no-any-return]

    def __len__(self) -> int:
        """Number of tracked, undelivered positions (exact)."""
        return 0 if self._closed else len(self._core)

    def tracked_entries(self, ledger_id: int, first_entry: int, last_entry: int) -> BitMap:
        """Tracked entry ids of ``ledger_id`` in ``[first_entry, last_entry]`` (a new BitMap).

        A dispatcher can skip reading these entries: they will be delivered by the index.
        """
        try:
            return self._front.tracked_entries(  # type: ignore[no-any-return]
                ledger_id, first_entry, last_entry
            )
        except (TypeError, OverflowError):
            _diagnose(ledger_id=ledger_id, entry_id=first_entry)
            _diagnose(ledger_id=ledger_id, entry_id=last_entry)
            raise

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
            self._core.untrack_upto(ledger_id, entry_id)  # forgets the overrides it passes
            self._overrides_dirty |= self._overrides_used
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
        """Block until every snapshot create, merge and delete started so far has finished
        (and a background restore of recovered positions, if one is under way).

        A group commit waiting for more changes is written at once. Changes that failed and
        wait for their retry backoff are not retried by ``flush`` (see :meth:`stats`).
        Then returns the memory their temporaries freed to the OS (see ``delayindex._memory``).
        """
        with self._lock:
            self._flushing += 1
            self._persist_wakeup.notify_all()
        try:
            overrides_noted = self._note_overrides_unlocked()
            noted_gen = self._noted_gen
            while True:
                with self._inflight_lock:
                    pending = list(self._inflight)
                if not pending:
                    with self._lock:
                        queued = bool(self._queued)
                    if not queued:
                        if overrides_noted:  # cancels and reschedules: durable on return
                            self._catalog.persist_mark_delete()
                            with self._lock:
                                self._evict_cancels(noted_gen)
                        release_free_memory()
                        return
                    self._submit_queued()
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

    # -- closing ----------------------------------------------------------------------------------

    def close(self) -> None:
        """Stop the timer, finish in-flight writes and release the name. Snapshots stay.

        Idempotent; afterwards ``add``/``poll`` raise :class:`TrackerClosedError`.

        Raises:
            StorageError: the mark-delete position could not be persisted (everything else is
                closed all the same; re-apply the mark after the next open).
        """
        if self._closed:
            return
        with self._lock:
            self._restore_in_background = False  # flush need not restore what close drops
        self.flush()
        with self._lock:
            if self._closed:
                return
            self._closed = self._front.closed = True
            _registry.withdraw(self)
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
            core = self._drop_lazy()  # their snapshots keep them: nothing to restore
            core.clear()
            self._core = self._front.core = _ClosedCore(core)
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

    def __repr__(self) -> str:
        state = "closed" if self._closed else f"tracked={len(self)} buckets={len(self._buckets)}"
        return f"<DelayIndex {self._name!r} {state}>"


_OPEN_TOKEN = object()

__all__ = ["BucketInfo", "DelayIndex", "resolve_overlaps", "select_merge_window"]
