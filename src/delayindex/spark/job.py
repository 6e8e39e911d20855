"""The Spark rebuild: a topic dump in, a published index out, with the local rebuild's semantics.

How it works (two Spark jobs, at most one shuffle; the Python work is ``delayindex.dump`` and
``delayindex.rebuild``, the same functions :func:`~delayindex.rebuild.rebuild_local` calls, and
the same offline skeleton, :class:`~delayindex.rebuild.RebuildRun`):

1. **Scan** (:mod:`delayindex.spark.scan`; P tasks that each take whole ledgers: a ledger
   range read straight from a Parquet dump in topic order, an RDD job over the range numbers,
   else ``mapInArrow`` over a hash partition after ``repartition(P, "ledger_id")``, the only
   shuffle): every task checks,
   deduplicates and classifies the rows of its ledgers exactly as
   :func:`~delayindex.dump.read_dump` and
   :func:`~delayindex.rebuild.classify` do, writes its tracked rows, sorted by position, to one
   ``.npy`` *scratch file*, and returns its per-ledger tracked counts and a reject report; the
   driver merges the reports and fails here under ``strict``.
2. **Plan and reserve** (driver): :func:`~delayindex.rebuild.plan_for` on the per-ledger counts
   (the online sealing rule, :func:`delayindex.policy.plan_ranges`); the
   :class:`~delayindex.rebuild.RebuildRun` (opened at the start, so the name's writer lock is
   held throughout and a killed earlier run is repaired first) commits one create intent per
   range.
3. **Build** (:mod:`delayindex.spark.build`; an RDD job over the bucket numbers, no shuffle): each
   task takes whole buckets, gathers each bucket's rows from every scratch file, builds the
   snapshot with :func:`~delayindex.rebuild.build_bucket` and writes it under its reserved key
   with ``FileStorage(store).create``.
4. **Publish** (driver, the skeleton): :func:`~delayindex.rebuild.publish_rebuild`: one manifest
   commit makes the new buckets the name's only live ones, records ``mark_delete`` (for a shared
   index, the lowest subscription mark, with every subscription's record:
   :func:`~delayindex.rebuild.acknowledged`, as the local rebuild) and retires the old buckets.

Why Arrow batches (not pandas): the checks take Arrow tables and numpy arrays, and skipping the
pandas conversion cut the JVM-to-Python hand-over by about a third. Where rows go through the JVM
(the shuffle), that is ``mapInArrow``: an RDD of rows measured 13x slower here. Where they do not
(the scan of a dump in topic order reads its files itself; the build reads scratch files), the
job is an RDD job over a range of numbers with Arrow batches in and out
(:func:`delayindex.spark.tasks.range_tasks`): same tasks, no Spark SQL, which on a fresh JVM
costs more than these jobs' scheduling (10 M rows: job 6.4-6.7 s as ``mapInArrow``, 5.6-5.9 s
now).

Where things must live: the store is a :class:`~delayindex.storage.file.FileStorage` directory,
and the executors write its objects, so on a cluster it must be a filesystem every executor and
the driver mount at the same path (NFS, a FUSE mount of object storage, ...); local mode needs
nothing. The scratch files go to ``<store>/tmp/rebuild/<name>/<run id>/`` by default (removed at
the end; a killed run's directory is removed by the next rebuild of the name, which holds the
name's lock). JSON/CSV dumps are opened by the executors with pyarrow, so they need such a path
too; Parquet dumps can be anywhere Spark reads (``hdfs://``, ``s3a://``, ...).

Failure and idempotence: a failure after the reservation rolls the reservations back at once
(:func:`~delayindex.rebuild.abort_rebuild`, through the skeleton); a killed driver leaves create
intents that the next :meth:`Catalog.open` (``DelayIndex.open``, ``delayindex gc``) rolls back,
so no object is ever orphaned and the old buckets stay live until the publish. An executor
checks its key is still reserved after writing (and deletes its object otherwise), so a
straggling task that outlives a rollback cannot leave an orphan either. A re-run gives the same
ranges and snapshot contents (only the random keys differ), replacing what the previous run
published. A retried task whose earlier attempt already wrote an object accepts it when the
bytes are identical.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import shutil
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from delayindex import dump as dumpmod
from delayindex import rebuild
from delayindex.clock import wall_clock_ms
from delayindex.config import TrackerConfig
from delayindex.dump import DumpError, RejectReport
from delayindex.spark.arrowbuf import Int64Array
from delayindex.spark.build import _write_reserved as _write_reserved  # tests import it here
from delayindex.spark.build import build_step
from delayindex.spark.scan import _Dump, _resolve_dump, _scan, _ScanParams
from delayindex.spark.scan import _locate_examples as _locate_examples  # tests import it here
from delayindex.spark.session import check_workers
from delayindex.spark.slices import LOC_SHIFT
from delayindex.storage.catalog import CrashHook
from delayindex.storage.file import FileStorage

__all__ = [
    "LOC_SHIFT",
    "DumpRebuildReport",
    "DumpVerifyReport",
    "Progress",
    "rebuild_dump",
    "verify_dump",
]

#: ``progress(phase, done, total)``: phases ``"scan"`` and ``"build"`` count Spark tasks.
Progress = Callable[[str, int, int], None]
#: Input bytes per scan partition by format: one to two million rows per task, which keeps a
#: Python worker's arrays at a few hundred MB.
_PARTITION_BYTES = {"parquet": 8 << 20, "jsonl": 64 << 20, "csv": 40 << 20}
_POLL_SECONDS = 0.5


# -- reports ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class DumpRebuildReport(rebuild.RebuildReport):
    """A :class:`~delayindex.rebuild.RebuildReport` of a rebuild from a dump file.

    ``rows`` counts the rows kept after the checks (as :func:`~delayindex.rebuild.rebuild_local`
    counts the rows it is given). Extra fields: ``rejects`` (what the checks counted, with
    examples), ``phases`` (seconds per phase: ``scan``, ``plan``, ``build``, ``publish``),
    ``partitions`` (scan tasks) and ``master`` (the Spark master).
    """

    rejects: RejectReport = field(default_factory=RejectReport)
    phases: dict[str, float] = field(default_factory=dict)
    partitions: int = 0
    master: str = ""

    @property
    def rate(self) -> float:
        """Rows read per second, end to end."""
        return self.rejects.total_rows / self.seconds if self.seconds > 0 else 0.0

    def as_dict(self) -> dict[str, Any]:
        """Plain data (JSON-ready); ``rejects`` as :meth:`RejectReport.to_json` gives it."""
        out = super().as_dict()
        out["rejects"] = self.rejects.to_json()
        out["rows_per_second"] = self.rate
        return out


@dataclass(frozen=True)
class DumpVerifyReport(rebuild.VerifyReport):
    """A :class:`~delayindex.rebuild.VerifyReport` against a dump file, with the dump's
    ``rejects`` (rejected rows are not store findings: ``ok`` ignores them)."""

    rejects: RejectReport = field(default_factory=RejectReport)

    def as_dict(self) -> dict[str, Any]:
        """Plain data (JSON-ready)."""
        out = super().as_dict()
        out["rejects"] = self.rejects.to_json()
        return out


# -- arguments ----------------------------------------------------------------------------------


def _check_args(
    name: str, config: object, now_ms: object, mark_delete: object
) -> tuple[TrackerConfig, int, tuple[int, int] | None]:
    """Validate the common arguments before anything runs (``now_ms`` None: the wall clock);
    return config, now, mark."""
    now = wall_clock_ms() if now_ms is None else now_ms
    return rebuild.check_arguments(name, config, now, mark_delete)


# -- progress -----------------------------------------------------------------------------------


class _Watcher:
    """Reports the tasks of the running phase's Spark jobs to ``progress`` from a thread."""

    def __init__(self, spark: Any, progress: Progress | None) -> None:
        self._sc = spark.sparkContext
        self._progress = progress
        self.group = f"delayindex-{uuid.uuid4().hex[:12]}"

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Run a phase's Spark jobs under this watcher's job group, reporting as they go."""
        self._sc.setJobGroup(self.group, f"delayindex rebuild: {name}")
        stop = threading.Event()
        thread = None
        if self._progress is not None:
            thread = threading.Thread(target=self._poll, args=(name, stop), daemon=True)
            thread.start()
        try:
            yield
        finally:
            stop.set()
            if thread is not None:
                thread.join()
            self._sc.setLocalProperty("spark.jobGroup.id", None)
            self._sc.setLocalProperty("spark.job.description", None)

    def _counts(self) -> tuple[int, int]:
        tracker = self._sc.statusTracker()
        done = total = 0
        for job_id in tracker.getJobIdsForGroup(self.group):
            job = tracker.getJobInfo(job_id)
            for stage_id in job.stageIds if job is not None else ():
                stage = tracker.getStageInfo(stage_id)
                if stage is not None:
                    done += stage.numCompletedTasks
                    total += stage.numTasks
        return done, total

    def _poll(self, name: str, stop: threading.Event) -> None:
        assert self._progress is not None
        base = self._counts()  # jobs of earlier phases share the group
        while not stop.wait(_POLL_SECONDS):
            with contextlib.suppress(Exception):  # the gateway may be busy or closing
                done, total = self._counts()
                self._progress(name, done - base[0], max(total - base[1], 1))


# -- the public entry points ---------------------------------------------------------------------


def _partitions(spark: Any, source: _Dump, partitions: int | None) -> int:
    if partitions is not None:
        if isinstance(partitions, bool) or not isinstance(partitions, int) or partitions < 1:
            raise ValueError(f"partitions must be a positive int, got {partitions!r}")
        return partitions
    cores = int(spark.sparkContext.defaultParallelism)
    wanted = max(2 * cores, math.ceil(source.size / _PARTITION_BYTES[source.fmt]))
    return -(-wanted // cores) * cores  # whole waves: no core idles through a last lone task


def _scratch_root(store: Path, name: str) -> Path:
    return store / "tmp" / "rebuild" / name


def rebuild_dump(
    spark: Any,
    dump: str | os.PathLike[str],
    store: str | os.PathLike[str],
    name: str,
    config: TrackerConfig = TrackerConfig(),  # noqa: B008 - frozen, shared safely
    now_ms: int | None = None,
    mark_delete: tuple[int, int] | None = None,
    *,
    strict: bool = False,
    fmt: str | None = None,
    partitions: int | None = None,
    scratch: str | os.PathLike[str] | None = None,
    progress: Progress | None = None,
    crash_hook: CrashHook | None = None,
    subscriptions: rebuild.Subscriptions | None = None,
) -> DumpRebuildReport:
    """Rebuild index ``name`` in the FileStorage at ``store`` from a topic dump, with Spark.

    The result equals :func:`delayindex.rebuild.rebuild_local` of
    :func:`delayindex.dump.read_dump` of the same dump (same ranges, same snapshot contents,
    same reject counts); the module docs describe the jobs and the failure handling.

    Args:
        spark: a SparkSession (:func:`delayindex.spark.local_session`, or spark-submit's).
        dump: a dump file or directory of part files (``docs/dump-format.md``).
        store: the FileStorage directory (created if missing); executors write into it.
        name: the index name; its writer lock is held for the whole rebuild.
        config: tracker settings (cutoff, bucket size, segment limits, ``max_num_buckets``).
        now_ms: the time the rebuilt index is as of (default: now).
        mark_delete: the cursor's mark-delete position, or None.
        strict: fail (nothing written) if any row is rejected.
        fmt: ``parquet``, ``jsonl`` or ``csv`` (default: from the file names).
        partitions: scan tasks (default: 2 per core, or one per 8 MB of Parquet).
        scratch: directory for the scan's scratch files, reachable by every executor
            (default ``<store>/tmp/rebuild/<name>/<run id>``).
        progress: ``progress(phase, done, total)`` while the Spark jobs run.
        crash_hook: test seam: called with a step name between steps (the catalog's, plus
            ``rebuild.scanned`` and ``rebuild.objects_written``).
        subscriptions: build a shared index: name -> mark-delete position (None: nothing
            acknowledged); the rows after the lowest mark are kept and every subscription's
            record is published (not with ``mark_delete``; as
            :func:`~delayindex.rebuild.rebuild_local`).

    Raises:
        DumpError: unreadable dump, missing column, or (``strict``) rejected rows.
        FileNotFoundError: no dump at ``dump``.
        StoreLockedError: another writer holds ``name``.
        StorageError, ManifestConflictError: the store failed; reservations were rolled back.
        TypeError, ValueError: bad arguments (checked before anything runs).
        SparkUnavailableError: the session's Python workers cannot import delayindex
            (checked once per application, before the first stage).
    """
    started = time.perf_counter()
    ack = rebuild.acknowledged(mark_delete, subscriptions)  # as the local rebuild
    config, now, mark = _check_args(name, config, now_ms, ack.mark_delete)
    if progress is not None and not callable(progress):
        raise TypeError("progress must be callable")
    source = _resolve_dump(dump, fmt)
    check_workers(spark)  # before any stage: a clear error if the workers lack delayindex
    n_parts = _partitions(spark, source, partitions)
    root = Path(os.path.abspath(os.fspath(store)))
    storage = FileStorage(root)
    phases: dict[str, float] = {}
    try:
        run = rebuild.RebuildRun(storage, name, config, crash_hook=crash_hook)
    except BaseException:
        storage.close()
        raise
    if scratch is None:
        parent = _scratch_root(root, name)
        shutil.rmtree(parent, ignore_errors=True)  # a killed run's leftovers (we hold the lock)
        work = parent / uuid.uuid4().hex[:12]
    else:
        work = Path(os.path.abspath(os.fspath(scratch))) / uuid.uuid4().hex[:12]
    watch = _Watcher(spark, progress)
    try:
        work.mkdir(parents=True)
        mark_phase = time.perf_counter()
        params = _ScanParams(now, config, mark, str(work), False)
        scanned = _scan(spark, source, params, n_parts, watch.phase)
        phases["scan"] = time.perf_counter() - mark_phase
        if strict and not scanned.rejects.ok:
            raise DumpError(f"{source.path}: {scanned.rejects.first_problem()}",
                            scanned.rejects)  # fmt: skip
        run.hook("rebuild.scanned")
        mark_phase = time.perf_counter()
        plan = rebuild.plan_for(scanned.ledgers, scanned.counts, config)
        planning = time.perf_counter() - mark_phase
        files = [path for path, _ in scanned.scratch]
        build = build_step(spark, str(root), config, files, watch.phase)
        steps = run.publish(plan, ack, build).seconds
        phases.update(plan=planning + steps["reserve"], build=steps["build"],
                      publish=steps["publish"])  # fmt: skip
    finally:
        shutil.rmtree(work, ignore_errors=True)
        run.close()
        storage.close()
    return run.report(
        DumpRebuildReport,
        now_ms=now,
        tally=scanned.tally,
        started=started,
        rejects=scanned.rejects,
        phases=phases,
        partitions=scanned.partitions,
        master=str(spark.sparkContext.master),
    )


class _Tracked:
    """Tracked rows loaded from scratch files, as the columns :func:`verify_store` reads."""

    def __init__(self, paths: Sequence[str]) -> None:
        arrays = [np.load(p) for p in paths]
        rows = np.concatenate(arrays, axis=1) if arrays else np.empty((3, 0), np.int64)
        order = np.lexsort((rows[1], rows[0]))
        self.ledger_ids: Int64Array = rows[0][order]
        self.entry_ids: Int64Array = rows[1][order]
        self.deliver_at: Int64Array = rows[2][order]


def verify_dump(
    spark: Any | None,
    dump: str | os.PathLike[str],
    store: str | os.PathLike[str],
    name: str,
    config: TrackerConfig = TrackerConfig(),  # noqa: B008 - frozen, shared safely
    now_ms: int | None = None,
    mark_delete: tuple[int, int] | None = None,
    *,
    strict: bool = False,
    fmt: str | None = None,
    partitions: int | None = None,
    scratch: str | os.PathLike[str] | None = None,
    orphan_grace_ms: int = rebuild.DEFAULT_ORPHAN_GRACE_MS,
    progress: Progress | None = None,
    subscriptions: rebuild.Subscriptions | None = None,
) -> DumpVerifyReport:
    """Check index ``name`` in the store at ``store`` against a dump; change nothing.

    The dump is read and checked by Spark's scan (when ``spark`` is given; only the expected
    positions come back to the driver) or by :func:`delayindex.dump.read_dump` (``spark`` None);
    then :func:`delayindex.rebuild.verify_store` compares (findings by kind, orphans listed).

    Args:
        spark: a SparkSession, or None to read the dump in this process.
        dump, name, config, now_ms, mark_delete, strict, fmt, partitions, subscriptions: as
            for :func:`rebuild_dump` (``now_ms``, ``mark_delete`` and ``subscriptions`` must be
            the rebuild's); a shared index is checked per subscription (the scan keeps the rows
            after the lowest mark, :func:`~delayindex.rebuild.verify_store` each
            subscription's share of them).
        store: an existing FileStorage directory (read only: no lock is taken).
        scratch: the scan's scratch directory when ``spark`` is given (default: a temporary
            directory, which suits local mode; on a cluster pass a shared path).
        orphan_grace_ms: unreferenced objects younger than this are not orphans.
        progress: ``progress(phase, done, total)`` while the Spark scan runs.

    Raises:
        DumpError, FileNotFoundError: as for :func:`rebuild_dump`; also for a missing store.
        TypeError, ValueError: bad arguments.
        SparkUnavailableError: as for :func:`rebuild_dump` (``spark`` given).
    """
    started = time.perf_counter()
    ack = rebuild.acknowledged(mark_delete, subscriptions)
    # The scan keeps the rows after the lowest subscription mark; verify_store each one's share.
    config, now, mark = _check_args(name, config, now_ms, ack.mark_delete)
    root = Path(os.fspath(store))
    if not (root / "objects").is_dir() or not (root / "manifests").is_dir():
        raise FileNotFoundError(f"no delayindex store at {root}")
    columns: Any
    if spark is None:
        columns, rejects = dumpmod.read_dump(dump, fmt, strict=strict)
    else:
        source = _resolve_dump(dump, fmt)
        check_workers(spark)
        n_parts = _partitions(spark, source, partitions)
        if scratch is None:
            work = Path(tempfile.mkdtemp(prefix="delayindex-verify-"))
        else:
            work = Path(os.path.abspath(os.fspath(scratch))) / uuid.uuid4().hex[:12]
            work.mkdir(parents=True)
        try:
            params = _ScanParams(now, config, mark, str(work), False)
            scanned = _scan(spark, source, params, n_parts, _Watcher(spark, progress).phase)
            rejects = scanned.rejects
            if strict and not rejects.ok:
                raise DumpError(f"{source.path}: {rejects.first_problem()}", rejects)
            columns = _Tracked([p for p, _ in scanned.scratch])
        finally:
            shutil.rmtree(work, ignore_errors=True)
    storage = FileStorage(root, clean_tmp=False)
    try:
        report = rebuild.verify_store(
            storage,
            name,
            columns,
            config,
            now_ms=now,
            mark_delete=mark_delete,
            orphan_grace_ms=orphan_grace_ms,
            subscriptions=subscriptions,
        )
    finally:
        storage.close()
    values = {f.name: getattr(report, f.name) for f in dataclasses.fields(report)}
    values["seconds"] = time.perf_counter() - started
    return DumpVerifyReport(**values, rejects=rejects)
