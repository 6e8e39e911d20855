"""Per-row checks: raw cells of any type to int64 columns, or a counted rejection.

Cells arrive as pyarrow arrays (Parquet, CSV and JSON readers, Spark partitions) or pandas
columns. :func:`_parse_ints` turns each column into ``(values, null, bad)``: integer types pass,
floats only when integral and exact, strings only when they spell a base-10 integer
(``5``, ``+5``, `` 5 ``, ``5.0``); everything else is ``bad`` (``wrong_type``), never truncated.
:func:`_check` then applies the reasons in the order the format documents, the first failing
one naming the row's rejection. Invariant: every row is either kept or counted once.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from delayindex._ints import EXACT_FLOAT, INT64_MAX
from delayindex.dump.rejects import RejectReport, resolve_duplicates
from delayindex.dump.schema import (
    COLUMNS,
    ENTRY_ID_LIMIT,
    MAX_EXAMPLES,
    NOT_DELAYED,
    REQUIRED_COLUMNS,
    BoolArray,
    DumpColumns,
    DumpError,
    Int64Array,
    arrow,
    arrow_mod,
    int64_column,
)


def _jsonable(value: Any) -> Any:
    """A raw cell as a JSON-ready value (NaN becomes None; exotic types their ``str``)."""
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        return None if math.isnan(value) else value if math.isfinite(value) else str(value)
    if isinstance(value, np.generic):
        return _jsonable(value.item())
    return str(value)


def _stringify(values: Sequence[Any]) -> Any:
    """Mixed Python cells as a pyarrow string array the integer parser understands.

    None and NaN are null; strings stay as they are; ints and floats are printed; anything
    else (booleans, lists, dicts) gets a text no integer pattern matches.
    """
    pa = arrow()
    out: list[str | None] = []
    for value in values:
        if isinstance(value, np.generic):
            value = value.item()
        if value is None or (isinstance(value, float) and math.isnan(value)):
            out.append(None)
        elif isinstance(value, str):
            out.append(value)
        elif isinstance(value, bool):
            out.append(f"<bool {value}>")
        elif isinstance(value, int | float):
            out.append(repr(value))
        else:
            out.append(f"<{type(value).__name__}>")
    return pa.array(out, type=pa.string())


def _parse_strings(arr: Any) -> tuple[Int64Array, BoolArray, BoolArray]:
    """Integer strings to int64: ``(values, null, bad)``; see the module docs for the syntax."""
    pa, pc = arrow(), arrow_mod("compute")
    n = len(arr)
    null: BoolArray = arr.is_null().to_numpy(zero_copy_only=False)
    text = pc.utf8_trim_whitespace(arr)
    plain: BoolArray = pc.fill_null(pc.match_substring_regex(text, r"^-?[0-9]+$"), False).to_numpy(
        zero_copy_only=False
    )
    values: Int64Array = np.zeros(n, np.int64)
    bad: BoolArray = ~null & ~plain
    idx = np.flatnonzero(plain)
    if idx.size:
        _cast_int_strings(text.filter(pa.array(plain)), idx, values, bad)
    rest = np.flatnonzero(bad)
    if rest.size:
        # Rare forms (``+5``, ``5.0``): strip them to plain integers, vectorized.
        sub = text.take(pa.array(rest))
        fits: BoolArray = pc.fill_null(
            pc.match_substring_regex(sub, r"^[+-]?[0-9]+(\.0*)?$"), False
        ).to_numpy(zero_copy_only=False)
        if fits.any():
            good = rest[fits]
            cleaned = pc.replace_substring_regex(
                pc.replace_substring_regex(sub.filter(pa.array(fits)), r"\.0*$", ""), r"^\+", ""
            )
            bad[good] = False
            _cast_int_strings(cleaned, good, values, bad)
    return values, null, bad


def _cast_int_strings(text: Any, idx: Int64Array, values: Int64Array, bad: BoolArray) -> None:
    """Store plain integer strings ``text`` at ``values[idx]``; out-of-range ones are bad."""
    pa, pc = arrow(), arrow_mod("compute")
    try:
        values[idx] = pc.cast(text, pa.int64()).to_numpy(zero_copy_only=False)
    except pa.ArrowInvalid:  # an integer beyond int64: sort them out one by one
        for i, s in zip(idx.tolist(), text.to_pylist(), strict=True):
            number = int(s)
            if -INT64_MAX - 1 <= number <= INT64_MAX:
                values[i] = number
            else:
                bad[i] = True


def _parse_ints(arr: Any) -> tuple[Int64Array, BoolArray, BoolArray]:
    """Any pyarrow array to int64: ``(values, null, bad)``; bad and null cells hold 0."""
    pa, pc = arrow(), arrow_mod("compute")
    types = pa.types
    if types.is_dictionary(arr.type):
        arr = arr.dictionary_decode()
    kind = arr.type
    n = len(arr)
    if types.is_integer(kind):
        null: BoolArray = arr.is_null().to_numpy(zero_copy_only=False)
        raw = pc.fill_null(arr, 0).to_numpy(zero_copy_only=False)
        if types.is_uint64(kind):
            bad: BoolArray = raw > np.uint64(INT64_MAX)
            raw = np.where(bad, np.uint64(0), raw)
            return raw.astype(np.int64), null, bad
        return raw.astype(np.int64, copy=False), null, np.zeros(n, np.bool_)
    if types.is_floating(kind):
        null = arr.is_null(nan_is_null=True).to_numpy(zero_copy_only=False)
        floats = pc.fill_null(arr.cast(pa.float64()), 0.0).to_numpy(zero_copy_only=False).copy()
        floats[null] = 0.0
        with np.errstate(invalid="ignore"):
            bad = ~np.isfinite(floats)
            floats[bad] = 0.0
            bad |= (floats != np.floor(floats)) | (np.abs(floats) > EXACT_FLOAT)
        floats[bad] = 0.0
        return floats.astype(np.int64), null, bad
    if types.is_decimal(kind):
        arr, kind = arr.cast(pa.string()), pa.string()
    if types.is_string(kind) or types.is_large_string(kind) or types.is_string_view(kind):
        return _parse_strings(arr.cast(pa.string()))
    null = arr.is_null().to_numpy(zero_copy_only=False)
    if types.is_null(kind):
        return np.zeros(n, np.int64), null, np.zeros(n, np.bool_)
    return np.zeros(n, np.int64), null, ~null  # booleans, timestamps, nested: not integers


@dataclass
class _Batch:
    """One batch of raw rows: arrow arrays per present column, and where its rows come from."""

    arrays: dict[str, Any]
    num_rows: int
    rows: Int64Array
    file: str | None = None
    file_offset: int = 0
    raw: dict[str, Sequence[Any]] | None = None  # original cells when ``arrays`` were rebuilt

    def cell(self, column: str, i: int) -> Any:
        if self.raw is not None and column in self.raw:
            return _jsonable(self.raw[column][i])
        if column not in self.arrays:
            return None
        return _jsonable(self.arrays[column][i].as_py())

    def example(self, i: int, detail: str) -> dict[str, Any]:
        row = int(self.rows[i])
        ex: dict[str, Any] = {"row": row, "detail": detail}
        for column in COLUMNS:
            if column in self.arrays:
                ex[column] = self.cell(column, i)
        if self.file is not None:
            ex["file"] = self.file
            ex["file_row"] = row - self.file_offset
        return ex


def _first(mask: BoolArray) -> list[int]:
    return [int(i) for i in np.flatnonzero(mask)[:MAX_EXAMPLES]]


def _check(batch: _Batch) -> tuple[DumpColumns, Int64Array, RejectReport]:
    """Per-row checks of one batch: the rows that pass, their row numbers, the report."""
    n = batch.num_rows
    parsed: dict[str, tuple[Int64Array, BoolArray, BoolArray]] = {}
    for column in COLUMNS:
        if column in batch.arrays:
            parsed[column] = _parse_ints(batch.arrays[column])
        elif column in REQUIRED_COLUMNS:  # JSON writers omit null fields
            parsed[column] = (np.zeros(n, np.int64), np.ones(n, np.bool_), np.zeros(n, np.bool_))
    ledger, ledger_null, ledger_bad = parsed["ledger_id"]
    entry, entry_null, entry_bad = parsed["entry_id"]
    deliver, deliver_null, deliver_bad = parsed["deliver_at"]

    null_id = ledger_null | entry_null
    wrong = ledger_bad | entry_bad | deliver_bad
    if "publish_time" in parsed:
        wrong |= parsed["publish_time"][2]
    wrong &= ~null_id
    negative = ~null_id & ~wrong & ((ledger < 0) | (entry < 0))
    too_large = ~null_id & ~wrong & ~negative & (entry >= ENTRY_ID_LIMIT)
    keep = ~(null_id | wrong | negative | too_large)

    report = RejectReport(total_rows=n)
    checks: list[tuple[str, BoolArray, Callable[[int], str]]] = [
        (
            "null_id",
            null_id,
            lambda i: f"{'ledger_id' if ledger_null[i] else 'entry_id'} is null",
        ),
        ("wrong_type", wrong, lambda i: _wrong_detail(batch, parsed, i)),
        (
            "negative_id",
            negative,
            lambda i: (
                f"ledger_id {ledger[i]} is negative"
                if ledger[i] < 0
                else f"entry_id {entry[i]} is negative"
            ),
        ),
        ("entry_id_too_large", too_large, lambda i: f"entry_id {entry[i]} >= 2**32"),
    ]
    for reason, mask, detail in checks:
        count = int(np.count_nonzero(mask))
        if count:
            report.record(reason, count, [batch.example(i, detail(i)) for i in _first(mask)])

    deliver = np.where(deliver_null | (deliver < 0), NOT_DELAYED, deliver)
    publish = None
    if "publish_time" in parsed:
        values, nulls, _ = parsed["publish_time"]
        publish = np.where(nulls | (values < 0), NOT_DELAYED, values)[keep]
    columns = DumpColumns(ledger[keep], entry[keep], deliver[keep], publish)
    return columns, batch.rows[keep], report


def _wrong_detail(
    batch: _Batch, parsed: dict[str, tuple[Int64Array, BoolArray, BoolArray]], i: int
) -> str:
    for column in COLUMNS:
        if column in parsed and parsed[column][2][i]:
            return f"{column}: {batch.cell(column, i)!r} is not a long integer"
    return "not a long integer"  # pragma: no cover - a wrong row has a bad column


def _table_batch(
    table: Any,
    *,
    rows: Int64Array,
    file: str | None = None,
    file_offset: int = 0,
    raw: dict[str, Sequence[Any]] | None = None,
    allow_missing: bool = False,
    where: str = "batch",
) -> _Batch:
    """A :class:`_Batch` over a pyarrow Table or RecordBatch."""
    names = list(table.schema.names)
    missing = [c for c in REQUIRED_COLUMNS if c not in names]
    if missing and not allow_missing:
        raise DumpError(
            f"{where}: missing column(s) {', '.join(missing)} (columns: {', '.join(names)}); "
            f"a dump needs {', '.join(REQUIRED_COLUMNS)}"
        )
    arrays = {}
    for column in COLUMNS:
        if column in names:
            col = table.column(column)
            arrays[column] = col.combine_chunks() if hasattr(col, "combine_chunks") else col
    return _Batch(arrays, table.num_rows, rows, file, file_offset, raw)


def _frame_batch(frame: Any, rows: Int64Array) -> _Batch:
    """A :class:`_Batch` over a pandas DataFrame (duck-typed: pandas is never imported)."""
    pa = arrow()
    names = [str(c) for c in frame.columns]
    missing = [c for c in REQUIRED_COLUMNS if c not in names]
    if missing:
        raise DumpError(
            f"batch: missing column(s) {', '.join(missing)} (columns: {', '.join(names)})"
        )
    arrays: dict[str, Any] = {}
    raw: dict[str, Sequence[Any]] = {}
    for column in COLUMNS:
        if column not in names:
            continue
        series = frame[column]
        try:
            arrays[column] = pa.array(series, from_pandas=True)
        except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, ValueError):
            values = series.tolist()  # mixed object column, e.g. ints and strings
            arrays[column] = _stringify(values)
            raw[column] = values
    return _Batch(arrays, len(frame), rows, raw=raw or None)


def _as_batch(
    batch: Any, row_offset: int, row_numbers: Sequence[int] | Int64Array | None
) -> _Batch:
    pa = arrow()
    is_arrow = isinstance(batch, pa.Table | pa.RecordBatch)
    if not is_arrow and not (hasattr(batch, "columns") and hasattr(batch, "iloc")):
        raise TypeError(
            "expected a pyarrow Table/RecordBatch or a pandas DataFrame, "
            f"got {type(batch).__name__}"
        )
    n = batch.num_rows if is_arrow else len(batch)
    if row_numbers is None:
        rows: Int64Array = np.arange(row_offset, row_offset + n, dtype=np.int64)
    else:
        rows = int64_column("row_numbers", row_numbers)
        if rows.shape[0] != n:
            raise ValueError(f"row_numbers has {rows.shape[0]} entries for {n} rows")
    return _table_batch(batch, rows=rows) if is_arrow else _frame_batch(batch, rows)


def check_rows(
    batch: Any,
    *,
    row_offset: int = 0,
    row_numbers: Sequence[int] | Int64Array | None = None,
) -> tuple[DumpColumns, Int64Array, RejectReport]:
    """The per-row checks on one batch, without the position comparison.

    Args:
        batch: a pyarrow Table or RecordBatch, or a pandas DataFrame, with the dump columns.
        row_offset: row number of the batch's first row (examples carry row numbers).
        row_numbers: explicit row numbers, one per row (overrides ``row_offset``).

    Returns:
        ``(columns, row_numbers, report)``: the rows that pass, in batch order, normalized;
        their row numbers; the counts (``total_rows`` = rows in the batch).

    Raises:
        DumpError: a required column is missing.
        TypeError: ``batch`` is none of the accepted types.
    """
    return _check(_as_batch(batch, row_offset, row_numbers))


def validate_batch(
    batch: Any,
    *,
    row_offset: int = 0,
    row_numbers: Sequence[int] | Int64Array | None = None,
) -> tuple[DumpColumns, RejectReport]:
    """Every check on one batch: :func:`check_rows`, then :func:`resolve_duplicates`.

    Positions are compared within this batch only; across batches (Spark partitions), use
    :func:`check_rows` per batch and :func:`resolve_duplicates` per ledger group.

    Args:
        batch: a pyarrow Table or RecordBatch, or a pandas DataFrame.
        row_offset: row number of the first row; ``row_numbers`` overrides it per row.
        row_numbers: explicit row numbers.

    Returns:
        ``(columns, report)``: clean rows in position order with unique positions.

    Raises:
        DumpError: a required column is missing.
        TypeError: ``batch`` is none of the accepted types.
    """
    columns, rows, report = check_rows(batch, row_offset=row_offset, row_numbers=row_numbers)
    columns, _, report = resolve_duplicates(columns, rows, report)
    return columns, report
