"""DelayIndex's introspection: per-operation counters (``_OpStats``), ``stats()`` and the
problems an operator must act on, ``buckets()``, ``memory_usage_bytes()`` and the invariant
check (``_check``, which tests call)."""

from __future__ import annotations

import bisect
import threading
import time
from collections.abc import Callable
from typing import Any

from delayindex import _impl
from delayindex.config import TrackerConfig
from delayindex.model import MAX_TIME
from delayindex.storage.base import SnapshotStorage
from delayindex.storage.catalog import Catalog
from delayindex.storage.manifest import QuarantineRecord
from delayindex.timers import ArmingRule
from delayindex.tracker._bucket import BucketInfo, _Bucket, _PendingCreate
from delayindex.tracker._damage import ProblemLog

#: Upper bounds (ms, inclusive) of the storage-operation latency buckets; a last one is +Inf.
OP_LATENCY_BOUNDS_MS = (1, 2.5, 5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000, 30000)


class _OpStats:
    """Counts and latencies of one kind of storage operation (with a latency histogram)."""

    __slots__ = ("buckets", "failed", "max_ms", "succeeded", "total_ms")

    def __init__(self) -> None:
        self.succeeded = 0
        self.failed = 0
        self.total_ms = 0.0
        self.max_ms = 0.0
        self.buckets = [0] * (len(OP_LATENCY_BOUNDS_MS) + 1)

    def record(self, ok: bool, started: float) -> None:
        elapsed = (time.perf_counter() - started) * 1000.0
        if ok:
            self.succeeded += 1
        else:
            self.failed += 1
        self.total_ms += elapsed
        self.max_ms = max(self.max_ms, elapsed)
        self.buckets[bisect.bisect_left(OP_LATENCY_BOUNDS_MS, elapsed)] += 1

    def as_dict(self) -> dict[str, Any]:
        n = self.succeeded + self.failed
        return {
            "succeeded": self.succeeded,
            "failed": self.failed,
            "mean_ms": self.total_ms / n if n else 0.0,
            "max_ms": self.max_ms,
            "total_ms": self.total_ms,
            "latency_buckets": list(self.buckets),
        }


class StatsMixin:
    """DelayIndex's stats, problems and introspection (state lives on the DelayIndex)."""

    # State (set in DelayIndex.__init__).
    _arming: ArmingRule | None
    _buckets: dict[int, _Bucket]
    _catalog: Catalog
    _closed: bool
    _config: TrackerConfig
    _core: Any
    _deferred_at: int
    _deferred_creates: list[_PendingCreate]
    _deferred_deletes: list[str]
    _group: dict[str, int]
    _lazy: dict[int, Any]  # LazyBucket by sid
    _lock: threading.Lock
    _mark: tuple[int, int] | None
    _merge_in_flight: bool
    _ops: dict[str, _OpStats]
    _pending_quarantine: list[tuple[QuarantineRecord, str]]
    _warnings: ProblemLog
    _storage: SnapshotStorage

    _evicted_count: int

    # Provided by DelayIndex and its other mixins.
    _bound_stats: Callable[[], dict[str, Any]]
    _unpersisted: Callable[[], int]

    def stats(self) -> dict[str, Any]:
        """Counters and gauges: buckets, loaded indexes, snapshot bytes, op counts, warnings.

        ``health`` is ``"ok"``, or ``"degraded"`` while ``problems`` lists a condition that
        needs attention, each with what to do: quarantined buckets, failing segment reads,
        dead letters, memory-mode buckets, unrecorded quarantines. ``warnings`` holds the
        newest messages, each distinct problem once. ``readahead`` is the storage's read-ahead
        counters (shared by every index on that storage; ``{}`` without read-ahead). Also
        works on a closed index.
        """
        with self._lock:
            out: dict[str, Any] = dict(self._core.counters())
            cached = self._metadata_cache_bytes()
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
                implementation=_impl.IMPLEMENTATION,
                build=_impl.BUILD,
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
                memory_bytes=self._memory_bytes(cached),  # memory_usage_bytes(); the metric
                metadata_cache_bytes=cached,
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
                lazy_buckets=len(self._lazy),  # recovered, positions not restored yet
                # The storage's, shared by every index on it ({}: it does not read ahead).
                readahead=self._readahead_stats(),
                retrying_loads={
                    b.snapshot_id: b.load_failures
                    for b in self._buckets.values()
                    if b.load_failures
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
            if "cancel_overrides" in out:  # those in the catalog's record only count too
                out["cancel_overrides"] += self._evicted_count
                out["cancel_overrides_evicted"] = self._evicted_count
                folded = sum(b.folded for b in self._buckets.values())
                out["cancel_overrides_folded"] = folded  # may overlap the others (harmless)
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

    def _readahead_stats(self) -> dict[str, int]:
        read = getattr(self._storage, "readahead_stats", None)
        return {} if read is None else dict(read())

    def buckets(self) -> list[BucketInfo]:
        """One record per sealed bucket, in ledger order."""
        with self._lock:
            return [b.info() for b in sorted(self._buckets.values(), key=lambda b: b.start)]

    def memory_usage_bytes(self) -> int:
        """Resident estimate: heaps, loaded segments, bitmaps, per-bucket bookkeeping, and the
        decoded metadata of this index's snapshots that the storage keeps cached
        (``stats()["metadata_cache_bytes"]``)."""
        with self._lock:
            return self._memory_bytes()

    def _memory_bytes(self, cached: int | None = None) -> int:
        """:meth:`memory_usage_bytes` (lock held); ``cached``: :meth:`_metadata_cache_bytes`
        when the caller has it already."""
        if cached is None:
            cached = self._metadata_cache_bytes()
        total = int(self._core.memory_bytes()) + cached
        for b in self._buckets.values():
            total += 200 + b.mins.nbytes + b.bounds.nbytes
        return total

    def _metadata_cache_bytes(self) -> int:
        """Bytes of this index's snapshot metadata in the storage's read cache (lock held); 0
        for a storage without that cache. After a reopen it holds every bucket's metadata,
        bitmaps included (about 5 B per indexed message at 10 M), until evicted."""
        measure = getattr(self._storage, "cached_metadata_bytes", None)
        ids = {b.snapshot_id for b in self._buckets.values() if b.snapshot_id is not None}
        return int(measure(ids)) if measure is not None and ids else 0

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
