"""The Spark rebuild's scan: a dump's part files in, per-ledger tracked counts and scratch out.

How it works (step 1 of :mod:`delayindex.spark.job`): every task gets whole ledgers, checks,
deduplicates and classifies their rows, writes its tracked rows to one scratch file and returns
its counts. Every row carries a locator ``file index << LOC_SHIFT | row in file``. Three ways to
give each task whole ledgers, the first that applies:

1. **By ledger range, no shuffle** (:func:`_sorted_groups`, :func:`_plan_slices`): a local
   Parquet dump with integer columns whose row groups' ``ledger_id`` statistics do not overlap
   (a topic dump written in topic order). The driver reads only the files' footers and cuts the
   ledger ids into P ranges of about equal rows (interpolating within row groups); a task
   (``spark.range(P).mapInArrow``) reads with pyarrow the row groups that overlap its range and
   keeps the rows in it (task 0 also those with a null ledger id). A row group cut by a range
   boundary is read by both tasks; nothing is shuffled, and the JVM only schedules.
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

import functools
import importlib
import itertools
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
import numpy.typing as npt

from delayindex import dump as dumpmod
from delayindex import rebuild
from delayindex.config import TrackerConfig
from delayindex.dump import DumpColumns, DumpError, RejectReport

Int64Array = npt.NDArray[np.int64]
#: Runs one phase's Spark jobs (``Watcher.phase``: job group and progress reports).
Phase = Callable[[str], AbstractContextManager[None]]
#: A row's locator is ``file_index << LOC_SHIFT | row_in_file`` (2**40 rows per part file).
LOC_SHIFT = 40
_LOC_MASK = (1 << LOC_SHIFT) - 1
_SCAN_SCHEMA = "kind string, a long, b long, text string"
_ROWS_SCHEMA = "ledger_id long, entry_id long, deliver_at long, loc long, report string"
_ROW_REF = re.compile(r"\brow (\d+)")
_INTEGER_TYPES = ("LongType", "IntegerType", "ShortType", "ByteType")


def arrow() -> Any:
    """The pyarrow module (it has no type hints; imported when a job runs)."""
    return importlib.import_module("pyarrow")


# pyarrow imports pandas, when it is installed, the first time it converts between Arrow and
# numpy or Python values (to_numpy, pa.array, scalars): half a second of CPU in the driver
# and in every Python worker, for nothing here. These helpers go through the buffers instead.


def int64s(column: Any) -> Int64Array:
    """The values of an int64 Arrow array or chunked array without nulls, as a read-only numpy
    view of its buffer (a copy only to join several chunks)."""
    if hasattr(column, "num_chunks"):
        if column.num_chunks == 1:
            column = column.chunk(0)
        else:
            column = arrow().concat_arrays(column.chunks) if column.num_chunks else None
    if column is None or len(column) == 0:
        return np.empty(0, dtype=np.int64)
    if column.null_count:
        raise ValueError("int64s: the column has nulls")
    values: Int64Array = np.frombuffer(
        column.buffers()[1], dtype=np.int64, count=len(column), offset=column.offset * 8
    )
    return values


def int64s_or(column: Any, default: int) -> Int64Array:
    """The values of an int64 Arrow (chunked) array as numpy, ``default`` where null."""
    if column.null_count == 0:
        return int64s(column)
    chunks = column.chunks if hasattr(column, "chunks") else [column]
    parts = []
    for chunk in chunks:
        if len(chunk) == 0:
            continue
        values = np.frombuffer(
            chunk.buffers()[1], dtype=np.int64, count=len(chunk), offset=chunk.offset * 8
        )
        bitmap = chunk.buffers()[0]
        if chunk.null_count == 0 or bitmap is None:
            parts.append(values)
            continue
        valid = np.unpackbits(np.frombuffer(bitmap, dtype=np.uint8), bitorder="little")
        valid = valid[chunk.offset : chunk.offset + len(chunk)].astype(bool)
        parts.append(np.where(valid, values, np.int64(default)))
    return np.concatenate(parts) if parts else np.empty(0, dtype=np.int64)


def int64_array(values: Any) -> Any:
    """An Arrow int64 array over a numpy array's memory (no copy when it is int64)."""
    data = np.ascontiguousarray(values, dtype=np.int64)
    pa = arrow()
    return pa.Array.from_buffers(pa.int64(), len(data), [None, pa.py_buffer(data)])


def string_array(texts: Sequence[str]) -> Any:
    """An Arrow string array of ``texts`` (no nulls)."""
    pa = arrow()
    encoded = [t.encode() for t in texts]
    offsets = np.zeros(len(encoded) + 1, dtype=np.int32)
    np.cumsum([len(e) for e in encoded], out=offsets[1:])
    data = pa.py_buffer(b"".join(encoded))
    return pa.Array.from_buffers(pa.string(), len(encoded), [None, pa.py_buffer(offsets), data])


def _bool_array(mask: npt.NDArray[np.bool_]) -> Any:
    pa = arrow()
    bits = np.packbits(mask, bitorder="little")
    return pa.Array.from_buffers(pa.bool_(), len(mask), [None, pa.py_buffer(bits)])


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


# -- by ledger range, without a shuffle ------------------------------------------------------------


@dataclass(frozen=True)
class _Group:
    """One Parquet row group of a dump, with its ledger ids' range from the file's footer."""

    file: int  # index into the dump's files (the locator's file index)
    group: int  # row group number within the file
    first_row: int  # its first row's number within the file
    rows: int
    low: int | None  # lowest and highest ledger id; None: the group holds only nulls
    high: int | None
    nulls: bool  # may hold rows with a null ledger id


@dataclass(frozen=True)
class _Slice:
    """One scan task's share: the ledger ids in ``[low, high)`` (None: unbounded), the null
    ones too when ``nulls``, and the row groups that may hold them."""

    low: int | None
    high: int | None
    nulls: bool
    groups: tuple[_Group, ...]

    def holds(self, group: _Group) -> bool:
        """Whether ``group`` may hold a row of this slice."""
        if self.nulls and group.nulls:
            return True
        if group.low is None or group.high is None:
            return False
        if self.low is not None and self.high is not None and self.low >= self.high:
            return False  # an empty range
        return (self.low is None or group.high >= self.low) and (
            self.high is None or group.low < self.high
        )

    def covers(self, group: _Group) -> bool:
        """Whether every row of ``group`` belongs to this slice (no filter needed)."""
        if group.nulls and not self.nulls:
            return False
        if group.low is None or group.high is None:
            return self.nulls
        return (self.low is None or group.low >= self.low) and (
            self.high is None or group.high < self.high
        )


def _integer_type(pa: Any, dtype: Any) -> bool:
    """Whether Spark reads a Parquet column of this Arrow type as an integer type (the rule
    :func:`_columnar_frame` applies: Spark reads a uint64 column as a decimal)."""
    return bool(pa.types.is_integer(dtype)) and not pa.types.is_uint64(dtype)


def _file_groups(pa: Any, pq: Any, index: int, path: str) -> list[_Group] | None:
    """The row groups of one Parquet part file, or None when it cannot be split by ledger."""
    try:
        meta = pq.ParquetFile(path).metadata
    except (pa.ArrowException, OSError):
        return None  # the Spark read reports it as read_dump would
    schema = meta.schema.to_arrow_schema()
    names = schema.names
    if any(c not in names for c in dumpmod.REQUIRED_COLUMNS):
        return None  # so does a missing column
    if any(c in names and not _integer_type(pa, schema.field(c).type) for c in dumpmod.COLUMNS):
        return None  # parsed row by row, file by file
    if not pa.types.is_signed_integer(schema.field("ledger_id").type):
        return None  # unsigned statistics may be ordered as signed by old writers
    paths = [meta.schema.column(i).path for i in range(meta.num_columns)]
    if "ledger_id" not in paths:
        return None  # a nested schema: leave it to Spark
    column = paths.index("ledger_id")
    groups: list[_Group] = []
    first = 0
    for number in range(meta.num_row_groups):
        group = meta.row_group(number)
        rows = group.num_rows
        stats = group.column(column).statistics
        if rows and stats is None:
            return None
        nulls = rows > 0 and (not stats.has_null_count or stats.null_count > 0)
        if rows == 0:
            pass
        elif stats.has_min_max:
            groups.append(_Group(index, number, first, rows, int(stats.min), int(stats.max), nulls))
        elif stats.has_null_count and stats.null_count == rows:
            groups.append(_Group(index, number, first, rows, None, None, True))
        else:
            return None
        first += rows
    return groups


def _sorted_groups(source: _Dump) -> tuple[_Group, ...] | None:
    """The dump's row groups when tasks can take ledger ranges without a shuffle (module docs,
    way 1): a local Parquet dump, integer columns, ledger statistics in every row group, and
    no two row groups whose ledger ranges overlap (sharing one ledger at an edge is fine).
    None otherwise."""
    if source.fmt != "parquet" or not _is_local(source.path) or not source.files:
        return None
    pa, pq = arrow(), importlib.import_module("pyarrow.parquet")
    groups: list[_Group] = []
    for index, path in enumerate(source.files):
        found = _file_groups(pa, pq, index, path)
        if found is None:
            return None
        groups.extend(found)
    ranged = sorted((g.low, g.high) for g in groups if g.low is not None and g.high is not None)
    for (_, high), (low, _) in itertools.pairwise(ranged):
        if low < high:
            return None  # overlapping ranges: each task would read most of the dump
    return tuple(groups)


def _cuts(groups: Sequence[_Group], partitions: int) -> list[int]:
    """``partitions - 1`` ledger ids that split the rows into about equal shares, assuming
    the ids of a row group spread evenly over its range."""
    ranged = [(g.low, g.high, g.rows) for g in groups if g.low is not None and g.high is not None]
    if not ranged or partitions < 2:
        return []
    lows = np.array([float(low) for low, _, _ in ranged])
    spans = np.array([float(high) - float(low) + 1.0 for low, high, _ in ranged])
    rows = np.array([float(n) for _, _, n in ranged])
    total = float(rows.sum())

    def below(ledger: int) -> float:
        return float((rows * np.clip((float(ledger) - lows) / spans, 0.0, 1.0)).sum())

    first = min(low for low, _, _ in ranged)
    last = max(high for _, high, _ in ranged) + 1
    cuts = []
    for k in range(1, partitions):
        target = total * k / partitions
        lo, hi = first, last
        while lo < hi:  # the lowest ledger id with at least ``target`` rows below it
            mid = (lo + hi) // 2
            if below(mid) >= target:
                hi = mid
            else:
                lo = mid + 1
        cuts.append(lo)
    return cuts


def _plan_slices(groups: Sequence[_Group], partitions: int) -> tuple[_Slice, ...]:
    """``partitions`` slices whose ledger ranges cover every id once (task 0 also takes the
    null ones), each with the row groups it reads."""
    bounds: list[int | None] = [None, *_cuts(groups, partitions), None]
    bounds += [None] * (partitions + 1 - len(bounds))  # no ranged group: the rest is empty
    slices = []
    for k in range(partitions):
        low, high = bounds[k], bounds[k + 1]
        if k > 0 and low is None:
            low = high = 0  # an empty range
        empty = _Slice(low, high, k == 0, ())
        slices.append(_Slice(low, high, k == 0, tuple(g for g in groups if empty.holds(g))))
    return tuple(slices)


def _locators(index: int, groups: Sequence[_Group]) -> Int64Array:
    """The locators of the rows of ``groups`` (of part file ``index``), in one new array."""
    loc = np.empty(sum(g.rows for g in groups), dtype=np.int64)
    at = 0
    for g in groups:
        start = (index << LOC_SHIFT) + g.first_row
        loc[at : at + g.rows] = np.arange(start, start + g.rows, dtype=np.int64)
        at += g.rows
    return loc


def _in_slice(table: Any, share: _Slice) -> Any:
    """The rows of ``table`` that belong to ``share``: a zero-copy slice when they are one run
    (a dump in topic order), else a filtered copy."""
    pc = importlib.import_module("pyarrow.compute")
    ledger = table.column("ledger_id")
    if ledger.null_count == 0:
        ids = int64s(ledger)
        keep = np.ones(len(ids), dtype=bool)
        if share.low is not None:
            keep &= ids >= share.low
        if share.high is not None:
            keep &= ids < share.high
        count = int(np.count_nonzero(keep))
        first = int(np.argmax(keep)) if count else 0
        if count == 0 or bool(keep[first : first + count].all()):
            return table.slice(first, count)
        return table.filter(_bool_array(keep))
    # Kleene logic: a null id compares to null, and "false and null" must be false.
    mask = pc.is_valid(ledger)
    if share.low is not None:
        mask = pc.and_kleene(mask, pc.greater_equal(ledger, share.low))
    if share.high is not None:
        mask = pc.and_kleene(mask, pc.less(ledger, share.high))
    if share.nulls:
        mask = pc.or_kleene(mask, pc.is_null(ledger))
    return table.filter(mask)


def _read_slice(files: Sequence[str], share: _Slice) -> Any:
    """Executor: the rows of ``share`` as ``ledger_id, entry_id, deliver_at, loc`` (int64), in
    file and row order."""
    pa, pq = arrow(), importlib.import_module("pyarrow.parquet")
    columns = list(dumpmod.REQUIRED_COLUMNS)
    names = [*columns, "loc"]
    by_file: dict[int, list[_Group]] = {}
    for group in share.groups:
        by_file.setdefault(group.file, []).append(group)
    tables = []
    for index, chosen in sorted(by_file.items()):
        # Memory-mapped, one thread: measured faster here, and tasks already fill the cores.
        read = pq.ParquetFile(files[index], memory_map=True).read_row_groups(
            [g.group for g in chosen], columns, use_threads=False
        )
        arrays = [read.column(c).cast(pa.int64()) for c in columns]
        locators = int64_array(_locators(index, chosen))
        table = pa.Table.from_arrays([*arrays, locators], names=names)
        if not all(share.covers(g) for g in chosen):
            table = _in_slice(table, share)
        tables.append(table)
    if not tables:
        return pa.table({c: pa.nulls(0, pa.int64()) for c in names})
    return pa.concat_tables(tables) if len(tables) > 1 else tables[0]


def _scan_slices(
    params: _ScanParams, files: Sequence[str], slices: Sequence[_Slice], batches: Iterator[Any]
) -> Iterator[Any]:
    """Executor, way 1: read each slice whose number arrives, then scan it as a shuffled
    partition is scanned."""
    for batch in batches:
        for number in batch.column(0).to_pylist():
            yield from _scan_table(params, _read_slice(files, slices[number]))


def scans_without_shuffle(dump: str | os.PathLike[str], fmt: str | None = None) -> bool:
    """Whether the scan of this dump gives each task a ledger range with no shuffle (module
    docs, way 1): then the JVM only schedules, and a quick-start JVM suits any dump size.

    Raises:
        FileNotFoundError, DumpError: as :func:`check_dump`.
    """
    return _sorted_groups(_resolve_dump(dump, fmt)) is not None


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
    if groups is not None:  # way 1: ledger ranges, no shuffle
        slices = _plan_slices(groups, partitions)
        scan = functools.partial(_scan_slices, params, source.files, slices)
        frame, labels = spark.range(0, partitions, 1, partitions), source.labels
    else:
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
