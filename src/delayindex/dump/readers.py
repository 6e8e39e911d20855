"""Readers: Parquet, CSV and JSON Lines part files to checked, normalized rows.

Each reader yields raw batches (:class:`~delayindex.dump.checks._Batch`) of at most
``_READ_BATCH_ROWS`` rows with global row numbers; :func:`read_part_file` runs the per-row
checks on each, :func:`read_dump` chains the part files and resolves duplicates across the whole
dump. CSV cells are read as strings and JSON falls back to a line-by-line parse on mixed types,
so that the one integer parser of ``checks`` decides every cell (nothing is coerced by pyarrow
on the way). Invariant: row numbers count from 0 over the whole dump, part files in name order.
"""

from __future__ import annotations

import bisect
import json
import os
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from delayindex.dump.checks import _Batch, _check, _stringify, _table_batch
from delayindex.dump.formats import normalize_format, part_files
from delayindex.dump.rejects import RejectReport, resolve_duplicates
from delayindex.dump.schema import (
    COLUMNS,
    REQUIRED_COLUMNS,
    DumpColumns,
    DumpError,
    Int64Array,
    arrow,
    arrow_mod,
)

_READ_BATCH_ROWS = 1 << 20
_CSV_BLOCK_BYTES = 16 << 20


def _read_parquet(file: Path, label: str, offset: int) -> Iterator[_Batch]:
    pa, pq = arrow(), arrow_mod("parquet")
    try:
        reader = pq.ParquetFile(str(file))
    except (pa.ArrowException, OSError) as exc:
        raise DumpError(f"{label}: not a readable Parquet file: {exc}") from exc
    names = list(reader.schema_arrow.names)
    present = [c for c in COLUMNS if c in names]
    if reader.metadata.num_rows == 0:
        table = reader.schema_arrow.empty_table()
        yield _table_batch(table, rows=np.empty(0, np.int64), file=label, where=label)
        return
    start = offset
    try:
        for record_batch in reader.iter_batches(batch_size=_READ_BATCH_ROWS, columns=present):
            n = record_batch.num_rows
            rows = np.arange(start, start + n, dtype=np.int64)
            yield _table_batch(record_batch, rows=rows, file=label, file_offset=offset, where=label)
            start += n
    except pa.ArrowException as exc:
        raise DumpError(f"{label}: unreadable Parquet data: {exc}") from exc


def _read_csv(file: Path, label: str, offset: int) -> Iterator[_Batch]:
    pa, pcsv = arrow(), arrow_mod("csv")

    def open_reader(include: list[str] | None) -> Any:
        convert = pcsv.ConvertOptions(
            column_types={c: pa.string() for c in COLUMNS},
            strings_can_be_null=True,
            null_values=["", "null", "NULL"],
            include_columns=include,
        )
        stream = pa.input_stream(str(file), compression="detect")
        read = pcsv.ReadOptions(block_size=_CSV_BLOCK_BYTES)
        return pcsv.open_csv(stream, read_options=read, convert_options=convert)

    try:
        header = list(open_reader(None).schema.names)  # reads the first block only
    except pa.ArrowException as exc:
        raise DumpError(f"{label}: not a readable CSV file: {exc}") from exc
    present = [c for c in COLUMNS if c in header]
    missing = [c for c in REQUIRED_COLUMNS if c not in header]
    if missing:
        raise DumpError(
            f"{label}: missing column(s) {', '.join(missing)} (header: {', '.join(header)})"
        )
    start = offset
    try:
        for record_batch in open_reader(present):
            n = record_batch.num_rows
            rows = np.arange(start, start + n, dtype=np.int64)
            yield _table_batch(record_batch, rows=rows, file=label, file_offset=offset, where=label)
            start += n
    except pa.ArrowException as exc:
        raise DumpError(f"{label}: malformed CSV: {exc}") from exc


def _read_json_python(file: Path, label: str) -> tuple[dict[str, list[Any]], int]:
    """JSON Lines parsed line by line: cells per column (for files pyarrow's typed reader
    refuses, e.g. a string where other rows have numbers)."""
    pa = arrow()
    cells: dict[str, list[Any]] = {c: [] for c in COLUMNS}
    count = 0
    with pa.input_stream(str(file), compression="detect") as stream:
        raw = stream.read()
    try:
        data = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise DumpError(f"{label}: not UTF-8 text: {exc}") from exc
    for number, line in enumerate(data.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            raise DumpError(f"{label}: line {number} is not JSON: {exc}") from exc
        if not isinstance(obj, dict):
            raise DumpError(f"{label}: line {number} is not a JSON object")
        for column in COLUMNS:
            cells[column].append(obj.get(column))
        count += 1
    return cells, count


def _read_jsonl(file: Path, label: str, offset: int) -> Iterator[_Batch]:
    pa, pj = arrow(), arrow_mod("json")
    raw: dict[str, Sequence[Any]] | None = None
    try:
        table = pj.read_json(pa.input_stream(str(file), compression="detect"))
        table = table.select([c for c in COLUMNS if c in table.schema.names])
    except pa.ArrowInvalid:
        # Mixed types in a column: parse in Python and keep the original cells for examples.
        cells, count = _read_json_python(file, label)
        present = [c for c in COLUMNS if any(v is not None for v in cells[c])]
        raw = {c: cells[c] for c in present}
        table = pa.table({c: _stringify(raw[c]) for c in present}) if present else None
        if table is None:
            table = pa.table({"ledger_id": pa.nulls(count, pa.string())})
    n = table.num_rows
    for lo in range(0, max(n, 1), _READ_BATCH_ROWS):
        hi = min(lo + _READ_BATCH_ROWS, n)
        piece = table.slice(lo, hi - lo)
        piece_raw = None if raw is None else {c: v[lo:hi] for c, v in raw.items()}
        rows = np.arange(offset + lo, offset + hi, dtype=np.int64)
        yield _table_batch(
            piece,
            rows=rows,
            file=label,
            file_offset=offset,
            raw=piece_raw,
            allow_missing=True,
            where=label,
        )


_READERS: dict[str, Callable[[Path, str, int], Iterator[_Batch]]] = {
    "parquet": _read_parquet,
    "jsonl": _read_jsonl,
    "csv": _read_csv,
}


def read_part_file(
    file: Path, fmt: str, label: str, offset: int = 0
) -> Iterator[tuple[DumpColumns, Int64Array, RejectReport]]:
    """Read one part file batch by batch with the per-row checks (:func:`check_rows`).

    Args:
        file: the part file.
        fmt: its canonical format (:func:`normalize_format`).
        label: how examples name the file (their ``file``).
        offset: row number of the file's first row.

    Yields:
        ``(columns, row_numbers, report)`` per batch, as :func:`check_rows` returns them
        (``report.total_rows`` = rows in the batch).

    Raises:
        DumpError: a missing required column or an unreadable file.
    """
    for batch in _READERS[fmt](file, label, offset):
        yield _check(batch)


def read_dump(
    path: str | os.PathLike[str], fmt: str | None = None, *, strict: bool = False
) -> tuple[DumpColumns, RejectReport]:
    """Read and check a dump: one file or a directory of part files.

    Args:
        path: the dump file or directory.
        fmt: ``parquet``, ``jsonl`` (or ``json``) or ``csv``; default: from the extension(s).
        strict: raise on the first rejected row instead of counting it.

    Returns:
        ``(columns, report)``: the accepted rows, normalized, in position order with unique
        positions; and the counts and examples of every rejected or repeated row
        (``report.total_rows`` = rows read).

    Raises:
        FileNotFoundError: nothing at ``path``.
        DumpError: an unknown format, a missing required column, an unreadable file, or
            (``strict``) a rejected row: the message names the first one, ``exc.report`` has
            the counts so far.
    """
    root = Path(path)
    files, found = part_files(root, normalize_format(fmt))
    report = RejectReport()
    pieces: list[DumpColumns] = []
    row_pieces: list[Int64Array] = []
    file_starts: list[int] = []
    labels: list[str] = []
    offset = 0
    for file in files:
        label = file.name if root.is_dir() else str(file)
        file_starts.append(offset)
        labels.append(label)
        for columns, rows, batch_report in read_part_file(file, found, label, offset):
            report.merge(batch_report)
            if strict and not batch_report.ok:
                raise DumpError(f"{root}: {report.first_problem()}", report)
            pieces.append(columns)
            row_pieces.append(rows)
            offset += batch_report.total_rows
    columns = DumpColumns.concat(pieces)
    rows = np.concatenate(row_pieces) if row_pieces else np.empty(0, np.int64)
    columns, _, report = resolve_duplicates(columns, rows, report)
    for reason in ("conflicting_duplicate", "duplicate"):
        for ex in report.examples[reason]:
            if "file" not in ex:  # resolve_duplicates knows row numbers only
                at = bisect.bisect_right(file_starts, ex["row"]) - 1
                ex["file"], ex["file_row"] = labels[at], ex["row"] - file_starts[at]
    if strict and not report.ok:
        raise DumpError(f"{root}: {report.first_problem()}", report)
    return columns, report
