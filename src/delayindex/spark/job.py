"""The Spark rebuild: a topic dump in, a published index out, with the local rebuild's semantics.

How it works (two Spark jobs, one shuffle; the Python work is ``delayindex.dump`` and
``delayindex.rebuild``, the same functions :func:`~delayindex.rebuild.rebuild_local` calls):

1. **Scan** (``mapInArrow`` after ``repartition(P, "ledger_id")``, the only shuffle). Every row
   carries a locator ``file index << 40 | row in file``. Parquet dumps with integer columns are
   read by Spark (splittable, vectorized; the locator from ``_metadata.row_index``) and checked
   after the shuffle with :func:`~delayindex.dump.check_rows` (skipped for a partition without
   a null or out-of-range id: none of its checks could fail). Other dumps (JSON Lines, CSV,
   Parquet with non-integer columns) are read one part file per task by ``delayindex.dump``'s
   own readers and checked before the shuffle, so every format is parsed exactly as
   :func:`~delayindex.dump.read_dump` parses it. Hash partitioning puts all rows of a ledger,
   hence of a position, in one task, which sorts its rows by position (one stable sort of a
   packed key merges the sorted runs the shuffle interleaves), resolves duplicates and
   conflicts (:func:`~delayindex.dump.resolve_duplicates`), keeps the tracked rows
   (:func:`~delayindex.rebuild.classify`: delayed, not due at ``now_ms``, after the mark) and
   writes them, sorted by position, to one ``.npy`` *scratch file*. It returns its per-ledger
   tracked counts and a reject report; the driver merges the reports (examples get their
   global row numbers back from the locators) and fails here under ``strict``.
2. **Plan and reserve** (driver): :func:`~delayindex.rebuild.plan_buckets` on the per-ledger
   counts; a :class:`~delayindex.storage.catalog.Catalog` (opened at the start, so the name's
   writer lock is held throughout and a killed earlier run is repaired first) commits one create
   intent per range: ``reserve_creates(ranges, replacing_live=True)``.
3. **Build** (``spark.range(B).mapInArrow``, no shuffle): each task takes whole buckets, gathers
   each bucket's rows from every scratch file (binary search on the sorted ledger column of a
   memory-mapped file), builds the snapshot with :func:`~delayindex.rebuild.build_bucket` and
   writes it under its reserved key with ``FileStorage(store).create``.
4. **Publish** (driver): :func:`~delayindex.rebuild.publish_rebuild`: one manifest commit makes
   the new buckets the name's only live ones, records ``mark_delete`` and retires the old
   buckets.

Why ``mapInArrow`` (not ``mapInPandas``): the checks take Arrow tables and numpy arrays, and
skipping the pandas conversion cut the JVM-to-Python hand-over by about a third. No RDD is used
(an RDD version of such a job measured 13x slower here).

Where things must live: the store is a :class:`~delayindex.storage.file.FileStorage` directory,
and the executors write its objects, so on a cluster it must be a filesystem every executor and
the driver mount at the same path (NFS, a FUSE mount of object storage, ...); local mode needs
nothing. The scratch files go to ``<store>/tmp/rebuild/<name>/<run id>/`` by default (removed at
the end; a killed run's directory is removed by the next rebuild of the name, which holds the
name's lock). JSON/CSV dumps are opened by the executors with pyarrow, so they need such a path
too; Parquet dumps can be anywhere Spark reads (``hdfs://``, ``s3a://``, ...).

Failure and idempotence: a failure after the reservation rolls the reservations back at once
(:func:`~delayindex.rebuild.abort_rebuild`); a killed driver leaves create intents that the next
:meth:`Catalog.open` (``DelayIndex.open``, ``delayindex gc``) rolls back, so no object is ever
orphaned and the old buckets stay live until the publish. An executor checks its key is still
reserved after writing (and deletes its object otherwise), so a straggling task that outlives a
rollback cannot leave an orphan either. A re-run gives the same ranges and snapshot contents
(only the random keys differ), replacing what the previous run published. A retried task whose
earlier attempt already wrote an object accepts it when the bytes are identical.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import importlib
import json
import math
import os
import re
import shutil
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

import numpy as np
import numpy.typing as npt

from delayindex import dump as dumpmod
from delayindex import rebuild
from delayindex.clock import wall_clock_ms
from delayindex.config import TrackerConfig
from delayindex.dump import DumpColumns, DumpError, RejectReport
from delayindex.errors import SnapshotExistsError
from delayindex.snapshot.codec import encode_snapshot
from delayindex.snapshot.format import PreparedSegments, SnapshotMetadata
from delayindex.spark.session import ARROW_BATCH_ROWS, check_workers
from delayindex.storage.catalog import Catalog, CrashHook
from delayindex.storage.file import FileStorage
from delayindex.storage.manifest import BucketRecord

__all__ = [
    "LOC_SHIFT",
    "DumpRebuildReport",
    "DumpVerifyReport",
    "Progress",
    "rebuild_dump",
    "verify_dump",
]

Int64Array = npt.NDArray[np.int64]
#: ``progress(phase, done, total)``: phases ``"scan"`` and ``"build"`` count Spark tasks.
Progress = Callable[[str, int, int], None]
#: A row's locator is ``file_index << LOC_SHIFT | row_in_file`` (2**40 rows per part file).
LOC_SHIFT = 40
_LOC_MASK = (1 << LOC_SHIFT) - 1
#: Input bytes per scan partition by format: one to two million rows per task, which keeps a
#: Python worker's arrays at a few hundred MB.
_PARTITION_BYTES = {"parquet": 8 << 20, "jsonl": 64 << 20, "csv": 40 << 20}
_ARROW_BATCH_CONF = "spark.sql.execution.arrow.maxRecordsPerBatch"
_SCAN_SCHEMA = "kind string, a long, b long, text string"
_ROWS_SCHEMA = "ledger_id long, entry_id long, deliver_at long, loc long, report string"
_BUILD_SCHEMA = (
    "key string, start_ledger long, end_ledger long, num_messages long, num_segments long, "
    "snapshot_bytes long, status string"
)
_ROW_REF = re.compile(r"\brow (\d+)")
_INTEGER_TYPES = ("LongType", "IntegerType", "ShortType", "ByteType")
_POLL_SECONDS = 0.5


def _arrow() -> Any:
    """The pyarrow module (it has no type hints; imported when a job runs)."""
    return importlib.import_module("pyarrow")


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


# -- the dump's files ---------------------------------------------------------------------------


@dataclass(frozen=True)
class _Dump:
    """Where a dump's rows come from: its part files (in row-number order) and format."""

    path: str
    fmt: str
    files: tuple[str, ...]  # what Spark or pyarrow opens
    labels: tuple[str, ...]  # how examples name them (as read_dump does)
    size: int  # bytes, 0 when unknown


def _is_local(path: str) -> bool:
    scheme = urlparse(path).scheme
    return scheme in ("", "file") or len(scheme) == 1  # "C:" style drive letters


def _local(path: str) -> Path:
    return Path(unquote(urlparse(path).path) if path.startswith("file:") else path)


def _resolve_dump(dump: str | os.PathLike[str], fmt: str | None) -> _Dump:
    """The part files and format of a dump, checked as :func:`read_dump` checks them.

    Raises:
        FileNotFoundError: a local dump path that does not exist.
        DumpError: an unknown format, a directory without part files or with several formats.
    """
    text = os.fspath(dump)
    wanted = dumpmod.normalize_format(fmt)
    if not _is_local(text):
        found = wanted or dumpmod.detect_format(text) or "parquet"
        if found != "parquet":
            raise DumpError(
                f"{text}: JSON Lines and CSV dumps are read by the executors with pyarrow, so "
                "they must be on a local or mounted filesystem path"
            )
        return _Dump(text, found, (text,), (text,), 0)
    root = _local(text).resolve()
    files, found = dumpmod.part_files(root, wanted)
    labels = tuple(f.name if root.is_dir() else str(f) for f in files)
    size = sum(f.stat().st_size for f in files)
    return _Dump(str(root), found, tuple(str(f) for f in files), labels, size)


def _spark_type(schema: Any, column: str) -> str | None:
    for f in schema.fields:
        if f.name == column:
            return str(type(f.dataType).__name__)
    return None


def _columnar_frame(spark: Any, source: _Dump) -> tuple[Any, tuple[str, ...]] | None:
    """The dump as ``(ledger_id, entry_id, deliver_at, loc)`` read by Spark, with the part files'
    labels in locator order, when its columns are integers (the fast path); None when it must be
    read file by file."""
    from pyspark.sql import functions as F

    if source.fmt != "parquet":
        return None
    # Local dumps: exactly the part files read_dump reads; elsewhere Spark lists the directory.
    paths = source.files if _is_local(source.path) else (source.path,)
    try:
        df = spark.read.parquet(*paths)
    except Exception as exc:  # AnalysisException and friends: unreadable or no schema
        raise DumpError(f"{source.path}: Spark cannot read it as Parquet: {exc}") from exc
    types = {c: _spark_type(df.schema, c) for c in dumpmod.COLUMNS}
    missing = [c for c in dumpmod.REQUIRED_COLUMNS if types[c] is None]
    if missing:
        raise DumpError(
            f"{source.path}: missing column(s) {', '.join(missing)} "
            f"(columns: {', '.join(df.columns)}); a dump needs "
            f"{', '.join(dumpmod.REQUIRED_COLUMNS)}"
        )
    if any(t is not None and t not in _INTEGER_TYPES for t in types.values()):
        if not _is_local(source.path):
            raise DumpError(
                f"{source.path}: columns that are not integers are checked by pyarrow on the "
                "executors, so this dump must be on a local or mounted filesystem path"
            )
        return None  # doubles, strings, decimals: dump's own parser decides row by row
    row = F.col("_metadata.row_index")
    if _is_local(source.path):
        names = [Path(f).name for f in source.files]
    else:
        names = sorted(Path(unquote(urlparse(f).path)).name for f in df.inputFiles())
    if len(names) > 1:
        index = F.create_map(*[x for i, n in enumerate(names) for x in (F.lit(n), F.lit(i))])
        row = F.shiftleft(F.element_at(index, F.col("_metadata.file_name")).cast("long"),
                          LOC_SHIFT) + row  # fmt: skip
    frame = df.select(
        *(F.col(c).cast("long").alias(c) for c in dumpmod.REQUIRED_COLUMNS),
        row.cast("long").alias("loc"),
    )
    return frame, source.labels if _is_local(source.path) else tuple(names)


def _read_files(
    files: Sequence[tuple[str, str]], fmt: str, batches: Iterator[Any]
) -> Iterator[Any]:
    """Executor, file-by-file path: read part files with ``delayindex.dump``'s readers, apply
    the per-row checks, emit the rows that pass with their locators and one report row per
    file."""
    pa = _arrow()
    schema = pa.schema(
        [(c, pa.int64()) for c in ("ledger_id", "entry_id", "deliver_at", "loc")]
        + [("report", pa.string())]
    )
    for batch in batches:
        for index in batch.column(0).to_pylist():
            path, label = files[index]
            report = RejectReport()
            for columns, rows, checked in dumpmod.read_part_file(Path(path), fmt, label):
                report.merge(checked)
                loc = rows + (index << LOC_SHIFT)
                yield pa.RecordBatch.from_arrays(
                    [
                        pa.array(columns.ledger_ids),
                        pa.array(columns.entry_ids),
                        pa.array(columns.deliver_at),
                        pa.array(loc),
                        pa.nulls(len(columns), pa.string()),
                    ],
                    schema=schema,
                )
            for examples in report.examples.values():  # locators, as the rows carry
                for ex in examples:
                    ex["row"] = ex.get("file_row", ex["row"]) + (index << LOC_SHIFT)
            note = {"file": index, "rows": report.total_rows, "report": report.to_json()}
            yield pa.RecordBatch.from_arrays(
                [pa.nulls(1, pa.int64())] * 4 + [pa.array([json.dumps(note)])], schema=schema
            )


def _file_frame(spark: Any, source: _Dump, partitions: int) -> Any:
    """The dump read file by file on the executors (module docs), as ``_ROWS_SCHEMA`` rows."""
    files = tuple(zip(source.files, source.labels, strict=True))
    tasks = max(1, min(len(files), partitions))
    reader = functools.partial(_read_files, files, source.fmt)
    return spark.range(0, len(files), 1, tasks).mapInArrow(reader, _ROWS_SCHEMA)


# -- 1. scan ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _ScanParams:
    now_ms: int
    config: TrackerConfig
    mark: tuple[int, int] | None
    scratch: str
    checked: bool  # rows were checked before the shuffle (file-by-file path)


def _task_id() -> str:
    from pyspark import TaskContext

    ctx = TaskContext.get()
    if ctx is None:  # pragma: no cover - only ever called inside a task
        return uuid.uuid4().hex
    return f"{ctx.partitionId()}-{ctx.attemptNumber()}-{uuid.uuid4().hex[:8]}"


def _scan_partition(params: _ScanParams, batches: Iterator[Any]) -> Iterator[Any]:
    """Executor: check, resolve, classify one ledger-hash partition; write its tracked rows."""
    pa = _arrow()
    received = list(batches)
    if not received:  # no ledger hashed here
        yield _summary_batch(pa, {"report": RejectReport().to_json(), "files": {}, "kept": 0,
                                  "tracked": 0, "not_delayed": 0, "due": 0, "acked": 0,
                                  "scratch": ""})  # fmt: skip
        return
    table = pa.Table.from_batches(received)
    del received
    report = RejectReport()
    file_rows: dict[int, int] = {}
    if params.checked:
        notes = table.filter(table.column("report").is_valid())
        for text in notes.column("report").to_pylist():
            note = json.loads(text)
            report.merge(RejectReport.from_json(note["report"]))
            file_rows[int(note["file"])] = int(note["rows"])
        data = table.filter(table.column("report").is_null())
        loc = data.column("loc").to_numpy()
        columns = DumpColumns(
            data.column("ledger_id").to_numpy(),
            data.column("entry_id").to_numpy(),
            data.column("deliver_at").to_numpy(),
        )
    else:
        loc = table.column("loc").to_numpy()
        which, counts = np.unique(loc >> LOC_SHIFT, return_counts=True)
        file_rows = {int(w): int(c) for w, c in zip(which, counts, strict=True)}
        clean = _clean_rows(table)
        if clean is not None:
            columns, report = clean, RejectReport(total_rows=len(clean))
        else:
            columns, loc, report = dumpmod.check_rows(
                table.select(list(dumpmod.REQUIRED_COLUMNS)), row_numbers=loc
            )
    del table
    # The shuffle interleaves sorted runs: a stable sort of one packed key merges them fast,
    # and resolve_duplicates then only checks the order (it sorts itself if a position repeats).
    order = _position_order(columns.ledger_ids, columns.entry_ids)
    if order is not None:
        columns, loc = columns.take(order), loc[order]
    columns, _, report = dumpmod.resolve_duplicates(columns, loc, report)
    seen = rebuild.classify(
        columns, now_ms=params.now_ms, config=params.config, mark_delete=params.mark
    )
    mask = seen.mask
    ledgers = columns.ledger_ids[mask]
    path = ""
    if len(ledgers):
        path = os.path.join(params.scratch, f"scan-{_task_id()}.npy")
        np.save(path, np.stack([ledgers, columns.entry_ids[mask], columns.deliver_at[mask]]))
    # Positions are sorted, so each ledger's tracked rows are one run.
    starts = np.flatnonzero(np.concatenate(([True], ledgers[1:] != ledgers[:-1])))[: len(ledgers)]
    unique = ledgers[starts]
    counts = np.diff(np.append(starts, len(ledgers)))
    summary = {
        "report": report.to_json(),
        "files": file_rows,
        "kept": len(columns),
        "tracked": len(ledgers),
        "not_delayed": seen.not_delayed,
        "due": seen.due,
        "acked": seen.acked,
        "scratch": path,
    }
    n = len(unique)
    yield pa.RecordBatch.from_arrays(
        [
            pa.array(["ledger"] * n, pa.string()),
            pa.array(unique, pa.int64()),
            pa.array(counts.astype(np.int64), pa.int64()),
            pa.nulls(n, pa.string()),
        ],
        names=["kind", "a", "b", "text"],
    )
    yield _summary_batch(pa, summary)


def _clean_rows(table: Any) -> DumpColumns | None:
    """The rows as :func:`~delayindex.dump.check_rows` returns them, when none of its per-row
    checks can fail: no null id, ids in range (the columns are Spark longs, so no wrong type);
    None otherwise, and check_rows decides row by row. Saves its copies on clean dumps."""
    pc = importlib.import_module("pyarrow.compute")
    ledger, entry = table.column("ledger_id"), table.column("entry_id")
    if ledger.null_count or entry.null_count:
        return None
    ledgers, entries = ledger.to_numpy(), entry.to_numpy()
    if len(ledgers) and (
        ledgers.min() < 0 or entries.min() < 0 or entries.max() >= dumpmod.ENTRY_ID_LIMIT
    ):
        return None
    deliver = pc.fill_null(table.column("deliver_at"), dumpmod.NOT_DELAYED).to_numpy()
    return DumpColumns(ledgers, entries, deliver)  # normalizes negative deliver times


def _position_order(ledgers: Int64Array, entries: Int64Array) -> Int64Array | None:
    """A stable order by position, or None when the rows already strictly increase."""
    if dumpmod.is_position_sorted(ledgers, entries, strict=True):
        return None
    low = int(ledgers.min())
    if int(ledgers.max()) - low < 2**31:  # (ledger, entry) packs into one int64 key
        order: Int64Array = np.argsort(((ledgers - low) << 32) | entries, kind="stable")
        return order
    lexical: Int64Array = np.lexsort((entries, ledgers))
    return lexical


def _summary_batch(pa: Any, summary: dict[str, Any]) -> Any:
    return pa.RecordBatch.from_pydict(
        {"kind": ["summary"], "a": [summary["tracked"]], "b": [0], "text": [json.dumps(summary)]}
    )


@dataclass
class _Scan:
    """What the scan found, merged on the driver."""

    ledgers: Int64Array
    counts: Int64Array
    scratch: list[tuple[str, int]]
    rejects: RejectReport
    kept: int
    tracked: int
    not_delayed: int
    due: int
    acked: int
    cutoff: int
    partitions: int


def _locate_examples(
    report: RejectReport, file_rows: dict[int, int], labels: Sequence[str]
) -> None:
    """Turn the locators in the examples (``row`` and in details) into global row numbers,
    given the rows per part file and the part files' labels (both in locator order)."""
    offsets = np.zeros(len(labels) + 1, dtype=np.int64)
    for index, count in file_rows.items():
        if 0 <= index < len(labels):
            offsets[index + 1] = count
    offsets = np.cumsum(offsets)

    def row_of(loc: int) -> int:
        index = loc >> LOC_SHIFT
        return int(offsets[index]) + (loc & _LOC_MASK) if index < len(labels) else loc

    for examples in report.examples.values():
        for ex in examples:
            loc = int(ex["row"])
            index = loc >> LOC_SHIFT
            ex["row"] = row_of(loc)
            if index < len(labels):
                ex["file"] = labels[index]
                ex["file_row"] = loc & _LOC_MASK
            if "detail" in ex:
                ex["detail"] = _ROW_REF.sub(lambda m: f"row {row_of(int(m.group(1)))}",
                                            ex["detail"])  # fmt: skip


def _scan(
    spark: Any,
    source: _Dump,
    params: _ScanParams,
    partitions: int,
    watch: _Watcher,
) -> _Scan:
    """Run the scan job and merge what its tasks report."""
    columnar = _columnar_frame(spark, source)
    if columnar is None:
        frame, labels = _file_frame(spark, source, partitions), source.labels
        params = _ScanParams(params.now_ms, params.config, params.mark, params.scratch, True)
    else:
        frame, labels = columnar
    scan = functools.partial(_scan_partition, params)
    with watch.phase("scan"):
        table = frame.repartition(partitions, "ledger_id").mapInArrow(scan, _SCAN_SCHEMA).toArrow()
    pa = _arrow()
    kinds = table.column("kind")
    ledger_rows = table.filter(pa.compute.equal(kinds, "ledger"))
    ledgers = ledger_rows.column("a").to_numpy()
    counts = ledger_rows.column("b").to_numpy()
    order = np.argsort(ledgers, kind="stable")
    ledgers, counts = ledgers[order], counts[order]
    if len(ledgers) > 1 and bool(np.any(ledgers[1:] == ledgers[:-1])):
        # Never with hash partitioning (a ledger lives in one task); sum to stay exact anyway.
        ledgers, where = np.unique(ledgers, return_inverse=True)
        counts = np.bincount(where, weights=counts).astype(np.int64)
    rejects = RejectReport()
    file_rows: dict[int, int] = {}
    scratch: list[tuple[str, int]] = []
    totals = {"kept": 0, "tracked": 0, "not_delayed": 0, "due": 0, "acked": 0}
    cutoff = rebuild.cutoff_for(params.now_ms, params.config)
    for text in table.filter(pa.compute.equal(kinds, "summary")).column("text").to_pylist():
        summary = json.loads(text)
        rejects.merge(RejectReport.from_json(summary["report"]))
        for index, count in summary["files"].items():
            file_rows[int(index)] = file_rows.get(int(index), 0) + int(count)
        for key in totals:
            totals[key] += int(summary[key])
        if summary["scratch"]:
            scratch.append((summary["scratch"], int(summary["tracked"])))
    _locate_examples(rejects, file_rows, labels)
    return _Scan(
        ledgers.astype(np.int64),
        counts.astype(np.int64),
        scratch,
        rejects,
        cutoff=cutoff,
        partitions=partitions,
        **totals,
    )


# -- 3. build -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class _BuildParams:
    store: str
    name: str
    config: TrackerConfig
    plan: tuple[tuple[int, int, str, int], ...]  # (start, end, key, expected rows)
    scratch: tuple[str, ...]
    generation: int = 0  # the reservation's manifest version, stamped into each object


def _reserved(storage: FileStorage, name: str, key: str) -> bool:
    intent = storage.read_manifest(name).intent(key)
    return intent is not None and intent.kind == "create"


def _write_reserved(
    storage: FileStorage,
    name: str,
    key: str,
    metadata: SnapshotMetadata,
    segments: PreparedSegments,
    generation: int = 0,
) -> BucketRecord | None:
    """Write a bucket under its reserved key; None (and no object) if the reservation is gone.

    The object is stamped with its origin ``(name, generation)`` (self-describing objects).

    The check after the write closes the race with a rollback: a rollback commits its delete
    intents before it deletes, so either it deletes this object or this check sees the intent
    gone and deletes it here.
    """
    if not _reserved(storage, name, key):
        return None
    metadata = metadata.with_origin(name, generation)
    try:
        record = rebuild.write_bucket(storage, key, metadata, segments)
    except SnapshotExistsError:
        # A retried task: the earlier attempt wrote it. Identical bytes are the same bucket.
        stored = storage.object_path(key).read_bytes()
        if stored != encode_snapshot(metadata, segments):
            raise
        record = BucketRecord(
            metadata.start_ledger,
            metadata.end_ledger,
            key,
            metadata.num_messages,
            metadata.num_segments,
            len(stored),
        )
    if not _reserved(storage, name, key):
        storage.delete(key)
        return None
    return record


def _gather(arrays: list[Int64Array], start: int, end: int) -> Int64Array:
    """Rows of ledgers ``start..end`` from every scratch array (each sorted by ledger)."""
    parts = []
    for arr in arrays:
        ledgers = arr[0]
        lo = int(np.searchsorted(ledgers, start, side="left"))
        hi = int(np.searchsorted(ledgers, end, side="right"))
        if hi > lo:
            parts.append(np.asarray(arr[:, lo:hi]))
    if not parts:
        return np.empty((3, 0), dtype=np.int64)
    return np.concatenate(parts, axis=1)


def _build_partition(params: _BuildParams, batches: Iterator[Any]) -> Iterator[Any]:
    """Executor: build and write the snapshots of the buckets whose numbers arrive."""
    pa = _arrow()
    schema = pa.schema(
        [("key", pa.string())]
        + [(c, pa.int64()) for c in ("start_ledger", "end_ledger", "num_messages",
                                     "num_segments", "snapshot_bytes")]
        + [("status", pa.string())]
    )  # fmt: skip
    storage = FileStorage(params.store, clean_tmp=False)  # other hosts' temp files: not ours
    arrays = [np.load(path, mmap_mode="r") for path in params.scratch]
    try:
        for batch in batches:
            out: list[tuple[str, int, int, int, int, int, str]] = []
            for index in batch.column(0).to_pylist():
                start, end, key, expected = params.plan[index]
                rows = _gather(arrays, start, end)
                if rows.shape[1] != expected:
                    raise RuntimeError(
                        f"bucket [{start}, {end}]: scratch files hold {rows.shape[1]} rows, "
                        f"the scan counted {expected}"
                    )
                metadata, segments = rebuild.build_bucket(
                    rows[2], rows[0], rows[1], start, end, params.config, validate=False
                )
                record = _write_reserved(
                    storage, params.name, key, metadata, segments, params.generation
                )
                if record is None:
                    out.append((key, start, end, 0, 0, 0, "aborted"))
                else:
                    out.append(
                        (key, start, end, record.num_messages, record.num_segments,
                         record.snapshot_bytes, "ok")
                    )  # fmt: skip
            columns = list(zip(*out, strict=True)) if out else [()] * len(schema)
            yield pa.RecordBatch.from_arrays(
                [pa.array(list(c), f.type) for c, f in zip(columns, schema, strict=True)],
                schema=schema,
            )
    finally:
        storage.close()


def _build(spark: Any, params: _BuildParams, watch: _Watcher) -> list[BucketRecord]:
    """Run the build job; the records of every bucket, in ledger order.

    Raises:
        RuntimeError: a task found its reservation gone (the rebuild was rolled back meanwhile).
    """
    if not params.plan:
        return []
    tasks = max(1, min(len(params.plan), 2 * spark.sparkContext.defaultParallelism))
    build = functools.partial(_build_partition, params)
    with watch.phase("build"):
        rows = spark.range(0, len(params.plan), 1, tasks).mapInArrow(build, _BUILD_SCHEMA)
        collected = rows.collect()
    aborted = [r.key for r in collected if r.status != "ok"]
    if aborted:
        raise RuntimeError(f"reservations vanished while writing {aborted[:5]}")
    records = sorted(
        (
            BucketRecord(r.start_ledger, r.end_ledger, r.key, r.num_messages, r.num_segments,
                         r.snapshot_bytes)
            for r in collected
        ),
        key=lambda b: b.start_ledger,
    )  # fmt: skip
    if [r.snapshot_id for r in records] != [key for _, _, key, _ in params.plan]:
        raise RuntimeError("the build job did not return exactly one record per bucket")
    return records


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


@contextlib.contextmanager
def _arrow_batches(spark: Any) -> Iterator[None]:
    """Hand Python 100 000-row Arrow batches (10x fewer round trips) for the job's duration."""
    before = spark.conf.get(_ARROW_BATCH_CONF, None)
    spark.conf.set(_ARROW_BATCH_CONF, str(ARROW_BATCH_ROWS))
    try:
        yield
    finally:
        if before is None:
            spark.conf.unset(_ARROW_BATCH_CONF)
        else:
            spark.conf.set(_ARROW_BATCH_CONF, before)


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
    config, now, mark = _check_args(name, config, now_ms, mark_delete)
    if progress is not None and not callable(progress):
        raise TypeError("progress must be callable")
    source = _resolve_dump(dump, fmt)
    check_workers(spark)  # before any stage: a clear error if the workers lack delayindex
    n_parts = _partitions(spark, source, partitions)
    root = Path(os.path.abspath(os.fspath(store)))
    storage = FileStorage(root)
    phases: dict[str, float] = {}
    hook = crash_hook or (lambda step: None)
    try:
        catalog = Catalog.open(
            storage,
            name,
            crash_hook=crash_hook,
            **config.catalog_settings(),
        )
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
        with _arrow_batches(spark):
            mark_phase = time.perf_counter()
            params = _ScanParams(now, config, mark, str(work), False)
            scanned = _scan(spark, source, params, n_parts, watch)
            phases["scan"] = time.perf_counter() - mark_phase
            if strict and not scanned.rejects.ok:
                raise DumpError(f"{source.path}: {scanned.rejects.first_problem()}",
                                scanned.rejects)  # fmt: skip
            hook("rebuild.scanned")
            mark_phase = time.perf_counter()
            sealed = rebuild.plan_buckets(scanned.ledgers, scanned.counts,
                                          config.replace(max_num_buckets=0))  # fmt: skip
            ranges = (
                rebuild.plan_buckets(scanned.ledgers, scanned.counts, config)
                if config.max_num_buckets > 0
                else sealed
            )
            expected = _range_counts(scanned.ledgers, scanned.counts, ranges)
            previous_mark = catalog.manifest.mark_delete
            try:
                # Inside the try: a reservation whose commit landed before an error is ours
                # (we hold the lock), and the abort rolls it back too.
                keys = catalog.reserve_creates(ranges, replacing_live=True)
                phases["plan"] = time.perf_counter() - mark_phase
                mark_phase = time.perf_counter()
                plan = tuple(
                    (start, end, key, count)
                    for (start, end), key, count in zip(ranges, keys, expected, strict=True)
                )
                build = _BuildParams(str(root), name, config, plan,
                                     tuple(p for p, _ in scanned.scratch),
                                     catalog.manifest.version)  # fmt: skip
                records = _build(spark, build, watch)
                phases["build"] = time.perf_counter() - mark_phase
                hook("rebuild.objects_written")
                mark_phase = time.perf_counter()
                replaced = rebuild.publish_rebuild(catalog, records, mark)
                phases["publish"] = time.perf_counter() - mark_phase
            except Exception as exc:
                for note in rebuild.abort_rebuild(catalog, previous_mark):
                    exc.add_note(note)
                raise
        notes = tuple(catalog.problems())
    finally:
        shutil.rmtree(work, ignore_errors=True)
        catalog.close()
        storage.close()
    return DumpRebuildReport(
        name=name,
        now_ms=now,
        cutoff_ms=scanned.cutoff,
        rows=scanned.kept,
        tracked=scanned.tracked,
        not_delayed=scanned.not_delayed,
        due=scanned.due,
        acked=scanned.acked,
        planned_buckets=len(sealed),
        buckets=tuple(records),
        replaced=tuple(replaced),
        mark_delete=mark,
        seconds=time.perf_counter() - started,
        notes=notes,
        rejects=scanned.rejects,
        phases=phases,
        partitions=scanned.partitions,
        master=str(spark.sparkContext.master),
    )


def _range_counts(
    ledgers: Int64Array, counts: Int64Array, ranges: Sequence[tuple[int, int]]
) -> list[int]:
    """Tracked rows per range (the build checks its gathered rows against them)."""
    total = np.concatenate(([0], np.cumsum(counts)))
    out = []
    for start, end in ranges:
        lo = int(np.searchsorted(ledgers, start, side="left"))
        hi = int(np.searchsorted(ledgers, end, side="right"))
        out.append(int(total[hi] - total[lo]))
    return out


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
) -> DumpVerifyReport:
    """Check index ``name`` in the store at ``store`` against a dump; change nothing.

    The dump is read and checked by Spark's scan (when ``spark`` is given; only the expected
    positions come back to the driver) or by :func:`delayindex.dump.read_dump` (``spark`` None);
    then :func:`delayindex.rebuild.verify_store` compares (findings by kind, orphans listed).

    Args:
        spark: a SparkSession, or None to read the dump in this process.
        dump, name, config, now_ms, mark_delete, strict, fmt, partitions: as for
            :func:`rebuild_dump` (``now_ms`` and ``mark_delete`` must be the rebuild's).
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
    config, now, mark = _check_args(name, config, now_ms, mark_delete)
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
            with _arrow_batches(spark):
                params = _ScanParams(now, config, mark, str(work), False)
                scanned = _scan(spark, source, params, n_parts, _Watcher(spark, progress))
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
            mark_delete=mark,
            orphan_grace_ms=orphan_grace_ms,
        )
    finally:
        storage.close()
    values = {f.name: getattr(report, f.name) for f in dataclasses.fields(report)}
    values["seconds"] = time.perf_counter() - started
    return DumpVerifyReport(**values, rejects=rejects)
