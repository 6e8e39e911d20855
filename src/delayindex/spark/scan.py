"""The Spark rebuild's scan: a dump's part files in, per-ledger tracked counts and scratch out.

How it works (step 1 of :mod:`delayindex.spark.job`): every task gets whole ledgers, checks,
deduplicates and classifies their rows, writes its tracked rows to one scratch file and returns
its counts. Every row carries a locator ``file index << LOC_SHIFT | row in file``. Three ways to
give each task whole ledgers, the first that applies:

1. **By ledger range, no shuffle** (:mod:`delayindex.spark.slices`): a local
   Parquet dump with integer columns whose row groups' ``ledger_id`` statistics do not overlap
   (a topic dump written in topic order). The driver reads only the files' footers and cuts the
   ledger ids into P ranges of about equal rows (interpolating within row groups); a task
   (an RDD job over the range numbers, :func:`~delayindex.spark.tasks.range_tasks`) reads with
   pyarrow the row groups that overlap its range and keeps the rows in it (task 0 also those
   with a null ledger id). A row group cut by a range boundary is read by both tasks; nothing
   is shuffled, and the JVM only schedules (no Spark SQL job at all).
2. **Read by Spark, then shuffled** (``repartition(P, "ledger_id")``): other Parquet dumps with
   integer columns (vectorized, splittable; the locator from ``_metadata.row_index``), e.g.
   shuffled rows or a dump Spark reads from ``hdfs://`` or ``s3a://``.
3. **File by file, then shuffled**: other dumps (JSON Lines, CSV, Parquet with non-integer
   columns) are read one part file per task by ``delayindex.dump``'s own readers and checked
   before the shuffle, so every format is parsed exactly as :func:`~delayindex.dump.read_dump`
   parses it.

In ways 1 and 2 a task checks its rows with :func:`~delayindex.dump.check_rows` (skipped for a
task without a null or out-of-range id: none of its checks could fail). Each task sorts its
rows by position (nothing to do for a dump in topic order), resolves duplicates and conflicts
(:func:`~delayindex.dump.resolve_duplicates`), keeps the tracked rows
(:func:`~delayindex.rebuild.classify`) and writes them, sorted by position, as a ``(3, n)``
int64 array ``[ledgers, entries, deliver_at]`` to one ``.npy`` *scratch file* (the build step
reads them back, :mod:`delayindex.spark.build`). Each task returns its per-ledger tracked counts
and a reject report; :func:`_scan` merges them on the driver (examples get their global row
numbers back from the locators) into a :class:`_Scan`.

Invariants: a ledger's rows meet in one task (one range, or one hash partition), so per-ledger
counts are exact and a scratch file is sorted by ledger; every row is counted by exactly one
task; the dump itself is never written.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import json
import os
import re
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

import numpy as np

from delayindex import dump as dumpmod
from delayindex import rebuild
from delayindex.config import TrackerConfig
from delayindex.dump import DumpColumns, DumpError, RejectReport
from delayindex.spark.arrowbuf import (
    Int64Array,
    arrow,
    int64_array,
    int64s,
    int64s_or,
    string_array,
)
from delayindex.spark.session import ARROW_BATCH_ROWS
from delayindex.spark.slices import (
    LOC_SHIFT,
    RowGroup,
    Slice,
    plan_slices,
    read_slice,
    row_groups,
)
from delayindex.spark.tasks import range_tasks

#: Runs one phase's Spark jobs (``Watcher.phase``: job group and progress reports).
Phase = Callable[[str], AbstractContextManager[None]]
_LOC_MASK = (1 << LOC_SHIFT) - 1
_ARROW_BATCH_CONF = "spark.sql.execution.arrow.maxRecordsPerBatch"
_SCAN_SCHEMA = "kind string, a long, b long, text string"
_ROWS_SCHEMA = "ledger_id long, entry_id long, deliver_at long, loc long, report string"
_ROW_REF = re.compile(r"\brow (\d+)")
_INTEGER_TYPES = ("LongType", "IntegerType", "ShortType", "ByteType")


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


def check_dump(dump: str | os.PathLike[str], fmt: str | None = None) -> None:
    """The checks :func:`~delayindex.spark.rebuild` and :func:`~delayindex.spark.verify` make
    on the dump path and format, without Spark: the command line runs them before it starts
    a JVM, so a wrong path or name fails at once.

    Raises:
        FileNotFoundError: a local dump path that does not exist.
        DumpError: an unknown format, a directory without part files or with several formats.
    """
    _resolve_dump(dump, fmt)


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
    pa = arrow()
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


# -- by ledger range, without a shuffle (delayindex.spark.slices) ----------------------------------


def _scan_slices(
    params: _ScanParams, files: Sequence[str], slices: Sequence[Slice], batches: Iterator[Any]
) -> Iterator[Any]:
    """Executor, way 1: read each slice whose number arrives, then scan it as a shuffled
    partition is scanned."""
    for batch in batches:
        for number in batch.column(0).to_pylist():
            yield from _scan_table(params, read_slice(files, slices[number]))


def scans_without_shuffle(dump: str | os.PathLike[str], fmt: str | None = None) -> bool:
    """Whether the scan of this dump gives each task a ledger range with no shuffle (module
    docs, way 1): then the JVM only schedules, and a quick-start JVM suits any dump size.

    Raises:
        FileNotFoundError, DumpError: as :func:`check_dump`.
    """
    return _sorted_groups(_resolve_dump(dump, fmt)) is not None


def _sorted_groups(source: _Dump) -> tuple[RowGroup, ...] | None:
    """A local Parquet dump's row groups when it can be split by ledger range without a
    shuffle (:func:`delayindex.spark.slices.row_groups`), else None."""
    if source.fmt != "parquet" or not _is_local(source.path):
        return None
    return row_groups(source.files)


# -- the scan ------------------------------------------------------------------------------------


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
    """Executor, ways 2 and 3: scan one ledger-hash partition of the shuffled rows."""
    received = list(batches)
    if not received:  # no ledger hashed here
        yield from _scan_table(params, None)
        return
    table = arrow().Table.from_batches(received)
    del received
    yield from _scan_table(params, table)


def _scan_table(params: _ScanParams, table: Any) -> Iterator[Any]:
    """Executor: check, resolve, classify one task's rows (a table of ``_ROWS_SCHEMA``'s
    columns, or None for none); write its tracked rows; yield its counts and summary."""
    pa = arrow()
    if table is None or table.num_rows == 0:
        yield _summary_batch(pa, {"report": RejectReport().to_json(), "files": {}, "kept": 0,
                                  "tracked": 0, "not_delayed": 0, "due": 0, "acked": 0,
                                  "scratch": ""})  # fmt: skip
        return
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
        loc = int64s(table.column("loc"))
        # Rows per part file (the locator's high bits); a part file count is small.
        per_file = np.bincount(loc >> LOC_SHIFT)
        file_rows = {int(w): int(per_file[w]) for w in np.flatnonzero(per_file)}
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
    tracked = int(np.count_nonzero(mask))
    rows = np.empty((3, tracked), dtype=np.int64)  # the scratch array, filled in place
    for at, column in enumerate((columns.ledger_ids, columns.entry_ids, columns.deliver_at)):
        np.compress(mask, column, out=rows[at])
    ledgers = rows[0]
    path = ""
    if tracked:
        path = os.path.join(params.scratch, f"scan-{_task_id()}.npy")
        np.save(path, rows)
    # Positions are sorted, so each ledger's tracked rows are one run.
    starts = np.flatnonzero(np.concatenate(([True], ledgers[1:] != ledgers[:-1])))[:tracked]
    unique = ledgers[starts]
    counts = np.diff(np.append(starts, tracked))
    summary = {
        "report": report.to_json(),
        "files": file_rows,
        "kept": len(columns),
        "tracked": tracked,
        "not_delayed": seen.not_delayed,
        "due": seen.due,
        "acked": seen.acked,
        "scratch": path,
    }
    n = len(unique)
    yield pa.RecordBatch.from_arrays(
        [
            string_array(["ledger"] * n),
            int64_array(unique),
            int64_array(counts),
            pa.nulls(n, pa.string()),
        ],
        names=["kind", "a", "b", "text"],
    )
    yield _summary_batch(pa, summary)


def _clean_rows(table: Any) -> DumpColumns | None:
    """The rows as :func:`~delayindex.dump.check_rows` returns them, when none of its per-row
    checks can fail: no null id, ids in range (the columns are Spark longs, so no wrong type);
    None otherwise, and check_rows decides row by row. Saves its copies on clean dumps."""
    ledger, entry = table.column("ledger_id"), table.column("entry_id")
    if ledger.null_count or entry.null_count:
        return None
    ledgers, entries = int64s(ledger), int64s(entry)
    if len(ledgers) and (
        ledgers.min() < 0 or entries.min() < 0 or entries.max() >= dumpmod.ENTRY_ID_LIMIT
    ):
        return None
    deliver = int64s_or(table.column("deliver_at"), dumpmod.NOT_DELAYED)
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
    return pa.RecordBatch.from_arrays(
        [string_array(["summary"]), int64_array([summary["tracked"]]), int64_array([0]),
         string_array([json.dumps(summary)])],
        names=["kind", "a", "b", "text"],
    )  # fmt: skip


@dataclass
class _Scan:
    """What the scan found, merged on the driver: per-ledger tracked counts, the scratch files
    (path, rows), the rejects, the counts (``rows`` are the rows kept after the checks) and the
    number of scan tasks."""

    ledgers: Int64Array
    counts: Int64Array
    scratch: list[tuple[str, int]]
    rejects: RejectReport
    tally: rebuild.Tally
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
    phase: Phase,
) -> _Scan:
    """Run the scan job (under ``phase("scan")``) and merge what its tasks report."""
    groups = _sorted_groups(source)
    if groups is not None:  # way 1: ledger ranges, no shuffle, no Spark SQL
        slices = plan_slices(groups, partitions)
        scan = functools.partial(_scan_slices, params, source.files, slices)
        with phase("scan"):
            table = range_tasks(spark, partitions, partitions, scan, _SCAN_SCHEMA)
        return _merged(table, params, source.labels, partitions)
    with _arrow_batches(spark):
        columnar = _columnar_frame(spark, source)
        if columnar is None:
            frame, labels = _file_frame(spark, source, partitions), source.labels
            params = _ScanParams(params.now_ms, params.config, params.mark, params.scratch, True)
        else:
            frame, labels = columnar
        frame = frame.repartition(partitions, "ledger_id")
        scan = functools.partial(_scan_partition, params)
        with phase("scan"):
            table = frame.mapInArrow(scan, _SCAN_SCHEMA).toArrow()
    return _merged(table, params, labels, partitions)


@contextlib.contextmanager
def _arrow_batches(spark: Any) -> Iterator[None]:
    """Hand Python 100 000-row Arrow batches (10x fewer round trips) while a Spark SQL scan
    runs (the RDD jobs take no rows from the JVM)."""
    before = spark.conf.get(_ARROW_BATCH_CONF, None)
    spark.conf.set(_ARROW_BATCH_CONF, str(ARROW_BATCH_ROWS))
    try:
        yield
    finally:
        if before is None:
            spark.conf.unset(_ARROW_BATCH_CONF)
        else:
            spark.conf.set(_ARROW_BATCH_CONF, before)


def _merged(table: Any, params: _ScanParams, labels: Sequence[str], partitions: int) -> _Scan:
    """What the scan's tasks reported (a table of ``_SCAN_SCHEMA``), merged."""
    pc = importlib.import_module("pyarrow.compute")
    texts = table.column("text")  # null on the per-ledger rows, the JSON on the summaries
    ledger_rows = table.filter(pc.is_null(texts))
    ledgers = int64s(ledger_rows.column("a"))
    counts = int64s(ledger_rows.column("b"))
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
    for text in table.filter(pc.is_valid(texts)).column("text").to_pylist():
        summary = json.loads(text)
        rejects.merge(RejectReport.from_json(summary["report"]))
        for index, count in summary["files"].items():
            file_rows[int(index)] = file_rows.get(int(index), 0) + int(count)
        for key in totals:
            totals[key] += int(summary[key])
        if summary["scratch"]:
            scratch.append((summary["scratch"], int(summary["tracked"])))
    _locate_examples(rejects, file_rows, labels)
    tally = rebuild.Tally(
        cutoff, totals["kept"], totals["tracked"], totals["not_delayed"], totals["due"],
        totals["acked"],
    )  # fmt: skip
    return _Scan(
        ledgers.astype(np.int64), counts.astype(np.int64), scratch, rejects, tally, partitions
    )
