"""The Spark rebuild's scan without a shuffle: a topic-ordered Parquet dump split by ledger range.

How it works (way 1 of :mod:`delayindex.spark.scan`): :func:`row_groups` reads only the part
files' footers and returns every row group with its ``ledger_id`` range, or None when the dump
cannot be split so (a column Spark would not read as an integer, a row group without
statistics, or two row groups whose ranges overlap: each task would read most of the dump).
:func:`plan_slices` cuts the ledger ids into P ranges of about equal rows (interpolating within
row groups), and a task's :func:`read_slice` reads with pyarrow the row groups that overlap its
range and keeps the rows in it, task 0 also those with a null ledger id. A row group cut by a
range boundary is read by both tasks.

Invariants: the slices' ranges cover every ledger id exactly once and only task 0 takes null
ids, so every row is read into exactly one task; a row's locator is ``file index << LOC_SHIFT |
row in file``, as the other ways make it.
"""

from __future__ import annotations

import importlib
import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from delayindex import dump as dumpmod
from delayindex.spark.arrowbuf import Int64Array, arrow, bool_array, int64_array, int64s

#: A row's locator is ``file_index << LOC_SHIFT | row_in_file`` (2**40 rows per part file).
LOC_SHIFT = 40


@dataclass(frozen=True)
class RowGroup:
    """One Parquet row group of a dump, with its ledger ids' range from the file's footer."""

    file: int  # index into the dump's files (the locator's file index)
    group: int  # row group number within the file
    first_row: int  # its first row's number within the file
    rows: int
    low: int | None  # lowest and highest ledger id; None: the group holds only nulls
    high: int | None
    nulls: bool  # may hold rows with a null ledger id


@dataclass(frozen=True)
class Slice:
    """One scan task's share: the ledger ids in ``[low, high)`` (None: unbounded), the null
    ones too when ``nulls``, and the row groups that may hold them."""

    low: int | None
    high: int | None
    nulls: bool
    groups: tuple[RowGroup, ...]

    def holds(self, group: RowGroup) -> bool:
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

    def covers(self, group: RowGroup) -> bool:
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
    :mod:`delayindex.spark.scan` applies to read a dump with Spark: Spark reads a uint64
    column as a decimal)."""
    return bool(pa.types.is_integer(dtype)) and not pa.types.is_uint64(dtype)


def _file_groups(pa: Any, pq: Any, index: int, path: str) -> list[RowGroup] | None:
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
    groups: list[RowGroup] = []
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
            groups.append(
                RowGroup(index, number, first, rows, int(stats.min), int(stats.max), nulls)
            )
        elif stats.has_null_count and stats.null_count == rows:
            groups.append(RowGroup(index, number, first, rows, None, None, True))
        else:
            return None
        first += rows
    return groups


def row_groups(files: Sequence[str]) -> tuple[RowGroup, ...] | None:
    """The row groups of a local Parquet dump's part ``files`` when tasks can take ledger
    ranges without a shuffle (module docs): integer columns, ledger statistics in every row
    group, and no two row groups whose ledger ranges overlap (sharing one ledger at an edge is
    fine). None otherwise."""
    if not files:
        return None
    pa, pq = arrow(), importlib.import_module("pyarrow.parquet")
    groups: list[RowGroup] = []
    for index, path in enumerate(files):
        found = _file_groups(pa, pq, index, path)
        if found is None:
            return None
        groups.extend(found)
    ranged = sorted((g.low, g.high) for g in groups if g.low is not None and g.high is not None)
    for (_, high), (low, _) in itertools.pairwise(ranged):
        if low < high:
            return None  # overlapping ranges: each task would read most of the dump
    return tuple(groups)


def _cuts(groups: Sequence[RowGroup], partitions: int) -> list[int]:
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


def plan_slices(groups: Sequence[RowGroup], partitions: int) -> tuple[Slice, ...]:
    """``partitions`` slices whose ledger ranges cover every id once (task 0 also takes the
    null ones), each with the row groups it reads."""
    bounds: list[int | None] = [None, *_cuts(groups, partitions), None]
    bounds += [None] * (partitions + 1 - len(bounds))  # no ranged group: the rest is empty
    slices = []
    for k in range(partitions):
        low, high = bounds[k], bounds[k + 1]
        if k > 0 and low is None:
            low = high = 0  # an empty range
        empty = Slice(low, high, k == 0, ())
        slices.append(Slice(low, high, k == 0, tuple(g for g in groups if empty.holds(g))))
    return tuple(slices)


def _locators(index: int, groups: Sequence[RowGroup]) -> Int64Array:
    """The locators of the rows of ``groups`` (of part file ``index``), in one new array."""
    loc = np.empty(sum(g.rows for g in groups), dtype=np.int64)
    at = 0
    for g in groups:
        start = (index << LOC_SHIFT) + g.first_row
        loc[at : at + g.rows] = np.arange(start, start + g.rows, dtype=np.int64)
        at += g.rows
    return loc


def _in_slice(table: Any, share: Slice) -> Any:
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
        return table.filter(bool_array(keep))
    # Kleene logic: a null id compares to null, and "false and null" must be false.
    mask = pc.is_valid(ledger)
    if share.low is not None:
        mask = pc.and_kleene(mask, pc.greater_equal(ledger, share.low))
    if share.high is not None:
        mask = pc.and_kleene(mask, pc.less(ledger, share.high))
    if share.nulls:
        mask = pc.or_kleene(mask, pc.is_null(ledger))
    return table.filter(mask)


def read_slice(files: Sequence[str], share: Slice) -> Any:
    """Executor: the rows of ``share`` as ``ledger_id, entry_id, deliver_at, loc`` (int64), in
    file and row order."""
    pa, pq = arrow(), importlib.import_module("pyarrow.parquet")
    columns = list(dumpmod.REQUIRED_COLUMNS)
    names = [*columns, "loc"]
    by_file: dict[int, list[RowGroup]] = {}
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
