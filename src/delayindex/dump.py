"""Topic dumps: the input of an offline rebuild or verify (format: ``docs/dump-format.md``).

A *topic dump* lists the messages of one topic partition, one row per message, with the columns
``ledger_id`` (long), ``entry_id`` (long), ``deliver_at`` (long epoch ms; null or negative means
"not delayed") and optionally ``publish_time`` (long epoch ms). It is stored as Parquet (the
default), JSON Lines (``.jsonl``/``.json``/``.ndjson``) or CSV (``.csv``), optionally gzip/bz2/
zstd-compressed for the text formats (``.csv.gz``), chosen by extension or by ``fmt``. A dump is
one file or a directory of part files (what Spark writes; ``_SUCCESS``, hidden files and
``_temporary`` are ignored, part files are read in name order).

Reading checks every row and never drops one silently. Per row, in this order, the first
failing check names the reason it is rejected:

* ``null_id``: ``ledger_id`` or ``entry_id`` is null (or missing from a JSON object);
* ``wrong_type``: a value is not an integer: a string that is not a base-10 integer, a
  fraction, a float beyond 2**53 (not exact), NaN/infinity, a boolean, a nested value, or a
  value outside the int64 range. Integral floats (``5.0``) and integer strings (``"5"``,
  ``" 5 "``, ``"5.0"``) are accepted: CSV and JSON exporters write longs that way;
* ``negative_id``: ``ledger_id`` or ``entry_id`` is negative;
* ``entry_id_too_large``: ``entry_id >= 2**32`` (a position packs the entry id in 32 bits).

Then positions are compared across the whole dump: if one ``(ledger_id, entry_id)`` appears in
several rows with different (normalized) deliver times, *every* row of that position is
rejected as ``conflicting_duplicate`` (there is no telling which is right); rows repeating a
position with the same deliver time are ``duplicate``: the first (by row number) is kept, the
others are counted but are not errors (``publish_time`` is not compared).

Normalization: ``deliver_at`` null or negative becomes ``-1`` (:data:`NOT_DELAYED`);
``publish_time`` null or negative becomes ``-1`` (unknown). The result of :func:`read_dump`
and :func:`validate_batch` is in position order with unique positions (a topic dump already is:
sorting is skipped then).

Row numbers (``row`` in examples) count from 0 over the whole dump, part files in name order;
``file`` and ``file_row`` locate the row inside its part (CSV line = ``file_row + 2``, JSON
Lines line = ``file_row + 1``).

Spark reuses the same checks: :func:`check_rows` on each partition, or :func:`read_part_file`
on each part file it reads itself (per-row checks only), then
:func:`resolve_duplicates` per ledger group (a position's rows are all in its ledger's group),
then :meth:`RejectReport.merge` on the driver. :func:`validate_batch` does both on one batch.

pyarrow is imported lazily (only reading and writing files needs it; :func:`generate_dump`
does not); without it a clear :class:`ImportError` names the ``spark`` extra.
"""

from __future__ import annotations

import bisect
import bz2
import contextlib
import gzip
import importlib
import json
import math
import numbers
import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any, Self

import numpy as np
import numpy.typing as npt

from delayindex.workload import (
    DAY_MS,
    DEFAULT_START_MS,
    DELAY_MIXES,
    REALISTIC_COMPONENTS,
    Workload,
)

__all__ = [
    "COLUMNS",
    "DUMP_FORMATS",
    "ENTRY_ID_LIMIT",
    "GEN_BLOCK_ROWS",
    "MAX_EXAMPLES",
    "MIDNIGHT_BURST_SHARE",
    "NOT_DELAYED",
    "OPTIONAL_COLUMNS",
    "REASONS",
    "REJECT_REASONS",
    "REQUIRED_COLUMNS",
    "DumpColumns",
    "DumpError",
    "DumpWriter",
    "RejectReport",
    "check_rows",
    "detect_format",
    "find_conflicts",
    "find_duplicates",
    "generate_dump",
    "is_position_sorted",
    "iter_generated",
    "normalize_format",
    "part_files",
    "read_dump",
    "read_part_file",
    "resolve_duplicates",
    "validate_batch",
    "write_dump",
]

Int64Array = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]

#: Dump formats, by canonical name (``json`` is accepted as an alias of ``jsonl``).
DUMP_FORMATS: tuple[str, ...] = ("parquet", "jsonl", "csv")
#: Reasons a row is rejected, in the order the per-row checks apply, then the global one.
REJECT_REASONS: tuple[str, ...] = (
    "null_id",
    "wrong_type",
    "negative_id",
    "entry_id_too_large",
    "conflicting_duplicate",
)
#: Every reason a report counts: the rejections and ``duplicate`` (kept once, not an error).
REASONS: tuple[str, ...] = (*REJECT_REASONS, "duplicate")
#: Offending rows kept as examples per reason.
MAX_EXAMPLES = 5
#: Entry ids must be below this (a position packs the entry id in 32 bits).
ENTRY_ID_LIMIT = 2**32
#: Normalized ``deliver_at`` of a message that is not delayed (and of an unknown publish time).
NOT_DELAYED = -1
#: Rows per generator block: row ``i`` depends only on the seed, its block and the parameters.
GEN_BLOCK_ROWS = 1 << 20
#: Share of the delayed messages of the ``midnight-burst`` mix due exactly at the next midnight.
MIDNIGHT_BURST_SHARE = 0.5

#: Columns a dump must have.
REQUIRED_COLUMNS: tuple[str, ...] = ("ledger_id", "entry_id", "deliver_at")
#: Columns a dump may have.
OPTIONAL_COLUMNS: tuple[str, ...] = ("publish_time",)
#: Every column a dump's reader looks at (others are ignored), in this order.
COLUMNS: tuple[str, ...] = (*REQUIRED_COLUMNS, *OPTIONAL_COLUMNS)

_EXTENSIONS: dict[str, str] = {
    ".parquet": "parquet",
    ".pq": "parquet",
    ".jsonl": "jsonl",
    ".json": "jsonl",
    ".ndjson": "jsonl",
    ".csv": "csv",
}
_COMPRESSIONS: dict[str, str] = {".gz": "gzip", ".bz2": "bz2", ".zst": "zstd"}
_FORMAT_ALIASES: dict[str, str] = {
    "parquet": "parquet",
    "jsonl": "jsonl",
    "json": "jsonl",
    "csv": "csv",
}
_READ_BATCH_ROWS = 1 << 20
_CSV_BLOCK_BYTES = 16 << 20
_INT64_MAX = 2**63 - 1
_EXACT_FLOAT = 2**53
_UNIFORM_RANGE = (1_000, 3_600_000)
_MAX_REALISTIC_DELAY = max(high for _, _, high in REALISTIC_COMPONENTS)
_SPARK_HINT = "pip install 'delayindex[spark]'"


class DumpError(ValueError):
    """A dump cannot be read as asked: a schema problem, an unreadable file, or (``strict``) a
    rejected row. ``report`` holds what was counted so far, when there is one."""

    def __init__(self, message: str, report: RejectReport | None = None) -> None:
        super().__init__(message)
        self.report = report


def _arrow() -> Any:
    """The ``pyarrow`` module (imported on first use; typed loosely: it ships no type hints)."""
    try:
        return importlib.import_module("pyarrow")
    except ImportError as exc:  # pragma: no cover - pyarrow is installed in the dev venv
        raise ImportError(
            f"topic dumps need pyarrow, which the spark extra installs: {_SPARK_HINT}"
        ) from exc


def _arrow_mod(name: str) -> Any:
    """A pyarrow submodule (``compute``, ``parquet``, ``csv``, ``json``)."""
    _arrow()
    return importlib.import_module(f"pyarrow.{name}")


# -- columns --------------------------------------------------------------------------------------


def _int64_column(name: str, value: Any) -> Int64Array:
    arr: Int64Array = np.ascontiguousarray(value, dtype=np.int64)
    if arr.ndim != 1:
        raise ValueError(f"{name} must be one-dimensional, got shape {arr.shape}")
    return arr


@dataclass(frozen=True, eq=False)
class DumpColumns:
    """The rows of a dump as column arrays (one-dimensional, C-contiguous ``int64``).

    ``deliver_at`` is normalized: ``-1`` for a message that is not delayed (any negative value
    given is replaced by ``-1``). ``publish_time`` is ``None`` when the dump has no such column;
    ``-1`` marks an unknown publish time. Results of :func:`read_dump`,
    :func:`validate_batch` and :func:`generate_dump` are in position order with unique
    positions. Equality is identity; compare columns with :func:`numpy.array_equal`.

    Raises:
        ValueError: a column is not one-dimensional, or the lengths differ.
    """

    ledger_ids: Int64Array
    entry_ids: Int64Array
    deliver_at: Int64Array
    publish_time: Int64Array | None = None

    def __post_init__(self) -> None:
        """Coerce the columns to ``int64`` arrays, check lengths, normalize ``deliver_at``."""
        names = ["ledger_ids", "entry_ids", "deliver_at"]
        if self.publish_time is not None:
            names.append("publish_time")
        for name in names:
            object.__setattr__(self, name, _int64_column(name, getattr(self, name)))
        lengths = {name: getattr(self, name).shape[0] for name in names}
        if len(set(lengths.values())) > 1:
            raise ValueError(f"DumpColumns columns must have equal lengths, got {lengths}")
        below = self.deliver_at < NOT_DELAYED
        if below.any():
            object.__setattr__(self, "deliver_at", np.where(below, NOT_DELAYED, self.deliver_at))

    def __len__(self) -> int:
        """The number of rows."""
        return int(self.ledger_ids.shape[0])

    @property
    def delayed_mask(self) -> BoolArray:
        """A new boolean array: ``True`` where the message is delayed."""
        mask: BoolArray = self.deliver_at != NOT_DELAYED
        return mask

    def take(self, selector: BoolArray | Int64Array | slice) -> DumpColumns:
        """The rows picked by a boolean mask, an index array or a slice."""
        publish = None if self.publish_time is None else self.publish_time[selector]
        return DumpColumns(
            self.ledger_ids[selector], self.entry_ids[selector], self.deliver_at[selector], publish
        )

    @classmethod
    def concat(cls, parts: Sequence[DumpColumns]) -> DumpColumns:
        """The rows of ``parts`` one after another; a missing ``publish_time`` becomes ``-1``
        when another part has one."""
        if not parts:
            return cls.empty()
        with_publish = any(p.publish_time is not None for p in parts)
        publish = None
        if with_publish:
            publish = np.concatenate(
                [
                    np.full(len(p), NOT_DELAYED, np.int64)
                    if p.publish_time is None
                    else p.publish_time
                    for p in parts
                ]
            )
        return cls(
            np.concatenate([p.ledger_ids for p in parts]),
            np.concatenate([p.entry_ids for p in parts]),
            np.concatenate([p.deliver_at for p in parts]),
            publish,
        )

    @classmethod
    def empty(cls, *, publish_time: bool = False) -> DumpColumns:
        """No rows."""
        none = np.empty(0, np.int64)
        return cls(none, none, none, none if publish_time else None)

    @classmethod
    def from_workload(cls, workload: Workload) -> DumpColumns:
        """A :class:`delayindex.workload.Workload` as dump columns (arrays shared, no copy)."""
        return cls(
            workload.ledger_ids, workload.entry_ids, workload.deliver_at, workload.publish_ms
        )


def is_position_sorted(ledgers: Int64Array, entries: Int64Array, *, strict: bool) -> bool:
    """Whether positions never decrease (``strict``: strictly increase) from row to row.

    ``strict`` also means no position repeats: a topic dump in position order passes.
    """
    if ledgers.shape[0] < 2:
        return True
    lo_l, hi_l = ledgers[:-1], ledgers[1:]
    lo_e, hi_e = entries[:-1], entries[1:]
    step = hi_e > lo_e if strict else hi_e >= lo_e
    return bool(np.all((hi_l > lo_l) | ((hi_l == lo_l) & step)))


# -- reject report --------------------------------------------------------------------------------


def _zero_counts() -> dict[str, int]:
    return dict.fromkeys(REASONS, 0)


def _no_examples() -> dict[str, list[dict[str, Any]]]:
    return {reason: [] for reason in REASONS}


@dataclass
class RejectReport:
    """What reading a dump found: rows read, rows rejected by reason, examples.

    Attributes:
        total_rows: rows read (every row, rejected or not).
        counts: rows per reason (every key of :data:`REASONS`, zeros included).
        examples: up to :data:`MAX_EXAMPLES` offending rows per reason, lowest row numbers
            first; each a JSON-ready dict with ``row``, ``detail``, the row's values and, when
            read from files, ``file`` and ``file_row``.
    """

    total_rows: int = 0
    counts: dict[str, int] = field(default_factory=_zero_counts)
    examples: dict[str, list[dict[str, Any]]] = field(default_factory=_no_examples)

    @property
    def errors(self) -> int:
        """Rows rejected (every reason except ``duplicate``)."""
        return sum(self.counts.get(reason, 0) for reason in REJECT_REASONS)

    @property
    def duplicates(self) -> int:
        """Identical repeats of a kept row (dropped, not errors)."""
        return self.counts.get("duplicate", 0)

    @property
    def kept_rows(self) -> int:
        """Rows in the result: read, minus rejected, minus identical repeats."""
        return self.total_rows - self.errors - self.duplicates

    @property
    def ok(self) -> bool:
        """True when no row was rejected (identical duplicates are fine)."""
        return self.errors == 0

    def record(self, reason: str, count: int, examples: Sequence[dict[str, Any]] = ()) -> None:
        """Count ``count`` rows under ``reason`` and keep the lowest-numbered examples.

        Raises:
            ValueError: ``reason`` is not one of :data:`REASONS`, or ``count < 0``.
        """
        if reason not in REASONS:
            raise ValueError(f"unknown reason {reason!r}; reasons: {', '.join(REASONS)}")
        if count < 0:
            raise ValueError(f"count must be >= 0, got {count}")
        self.counts[reason] = self.counts.get(reason, 0) + count
        if examples:
            merged = [*self.examples.get(reason, []), *examples]
            merged.sort(key=lambda ex: (ex.get("row", 0), str(ex.get("file", ""))))
            self.examples[reason] = merged[:MAX_EXAMPLES]

    def merge(self, other: RejectReport) -> RejectReport:
        """Add ``other``'s rows, counts and examples to this report; returns ``self``."""
        self.total_rows += other.total_rows
        for reason in REASONS:
            self.record(reason, other.counts.get(reason, 0), other.examples.get(reason, []))
        return self

    def first_problem(self) -> str | None:
        """A one-line description of the lowest-numbered rejected row, if any."""
        best: tuple[int, str, dict[str, Any]] | None = None
        for reason in REJECT_REASONS:
            for ex in self.examples.get(reason, [])[:1]:
                if best is None or ex.get("row", 0) < best[0]:
                    best = (ex.get("row", 0), reason, ex)
        if best is None:
            return None
        row, reason, ex = best
        where = f"row {row}"
        if "file" in ex:
            where += f" ({ex['file']} row {ex['file_row']})"
        return f"{reason} at {where}: {ex.get('detail', '')}"

    def summary(self) -> str:
        """One line: ``1,000 rows: 997 kept, 1 duplicate, 2 rejected (wrong_type 2)``."""
        text = f"{self.total_rows:,} rows: {self.kept_rows:,} kept"
        if self.duplicates:
            text += f", {self.duplicates:,} duplicate"
        if self.errors:
            parts = [f"{r} {self.counts[r]:,}" for r in REJECT_REASONS if self.counts.get(r)]
            text += f", {self.errors:,} rejected ({', '.join(parts)})"
        return text

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict: ``total_rows``, ``kept_rows``, ``errors``, ``duplicates``,
        ``ok``, ``counts``, ``examples``."""
        return {
            "total_rows": self.total_rows,
            "kept_rows": self.kept_rows,
            "errors": self.errors,
            "duplicates": self.duplicates,
            "ok": self.ok,
            "counts": dict(self.counts),
            "examples": {reason: list(exs) for reason, exs in self.examples.items()},
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> RejectReport:
        """The report :meth:`to_json` described (e.g. sent back by a Spark executor)."""
        report = cls(total_rows=int(data["total_rows"]))
        for reason in REASONS:
            report.record(
                reason,
                int(data["counts"].get(reason, 0)),
                list(data.get("examples", {}).get(reason, [])),
            )
        return report


# -- per-row checks -------------------------------------------------------------------------------


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
    pa = _arrow()
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
    pa, pc = _arrow(), _arrow_mod("compute")
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
    pa, pc = _arrow(), _arrow_mod("compute")
    try:
        values[idx] = pc.cast(text, pa.int64()).to_numpy(zero_copy_only=False)
    except pa.ArrowInvalid:  # an integer beyond int64: sort them out one by one
        for i, s in zip(idx.tolist(), text.to_pylist(), strict=True):
            number = int(s)
            if -_INT64_MAX - 1 <= number <= _INT64_MAX:
                values[i] = number
            else:
                bad[i] = True


def _parse_ints(arr: Any) -> tuple[Int64Array, BoolArray, BoolArray]:
    """Any pyarrow array to int64: ``(values, null, bad)``; bad and null cells hold 0."""
    pa, pc = _arrow(), _arrow_mod("compute")
    types = pa.types
    if types.is_dictionary(arr.type):
        arr = arr.dictionary_decode()
    kind = arr.type
    n = len(arr)
    if types.is_integer(kind):
        null: BoolArray = arr.is_null().to_numpy(zero_copy_only=False)
        raw = pc.fill_null(arr, 0).to_numpy(zero_copy_only=False)
        if types.is_uint64(kind):
            bad: BoolArray = raw > np.uint64(_INT64_MAX)
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
            bad |= (floats != np.floor(floats)) | (np.abs(floats) > _EXACT_FLOAT)
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
    pa = _arrow()
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
    pa = _arrow()
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
        rows = _int64_column("row_numbers", row_numbers)
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


# -- positions: conflicts and duplicates ----------------------------------------------------------


def _same_as_previous(ledgers: Int64Array, entries: Int64Array) -> BoolArray:
    same: BoolArray = (ledgers[1:] == ledgers[:-1]) & (entries[1:] == entries[:-1])
    return same


def _require_sorted(ledgers: Int64Array, entries: Int64Array) -> None:
    if ledgers.shape != entries.shape:
        raise ValueError(f"ledgers and entries differ in length: {ledgers.shape} {entries.shape}")
    if not is_position_sorted(ledgers, entries, strict=False):
        raise ValueError("positions must be sorted by (ledger_id, entry_id)")


def find_conflicts(
    ledgers: npt.ArrayLike, entries: npt.ArrayLike, deliver_at: npt.ArrayLike
) -> BoolArray:
    """Rows whose position appears with different deliver times (every row of such a position).

    Works on one batch or one ledger group; O(n), vectorized.

    Args:
        ledgers, entries, deliver_at: equal-length arrays sorted by ``(ledger, entry)``;
            ``deliver_at`` normalized (not delayed = -1).

    Returns:
        A boolean mask, ``True`` for every row of a conflicting position.

    Raises:
        ValueError: the arrays differ in length or are not sorted by position.
    """
    led = _int64_column("ledgers", ledgers)
    ent = _int64_column("entries", entries)
    times = _int64_column("deliver_at", deliver_at)
    _require_sorted(led, ent)
    if times.shape != led.shape:
        raise ValueError("deliver_at differs in length from the positions")
    n = led.shape[0]
    if n < 2:
        return np.zeros(n, np.bool_)
    same = _same_as_previous(led, ent)
    differs = same & (times[1:] != times[:-1])
    if not differs.any():
        return np.zeros(n, np.bool_)
    group = np.concatenate(([0], np.cumsum(~same)))
    flagged = np.zeros(int(group[-1]) + 1, np.bool_)
    flagged[group[1:][differs]] = True
    mask: BoolArray = flagged[group]
    return mask


def find_duplicates(
    ledgers: npt.ArrayLike, entries: npt.ArrayLike, deliver_at: npt.ArrayLike
) -> BoolArray:
    """Rows repeating the previous row's position and deliver time (identical duplicates).

    The first row of each run is not flagged, so ``~mask`` keeps one of each. Meaningful for
    positions :func:`find_conflicts` does not flag.

    Args:
        ledgers, entries, deliver_at: as for :func:`find_conflicts` (sorted by position).

    Returns:
        A boolean mask, ``True`` for every repeat.

    Raises:
        ValueError: the arrays differ in length or are not sorted by position.
    """
    led = _int64_column("ledgers", ledgers)
    ent = _int64_column("entries", entries)
    times = _int64_column("deliver_at", deliver_at)
    _require_sorted(led, ent)
    if times.shape != led.shape:
        raise ValueError("deliver_at differs in length from the positions")
    mask: BoolArray = np.zeros(led.shape[0], np.bool_)
    if led.shape[0] > 1:
        mask[1:] = _same_as_previous(led, ent) & (times[1:] == times[:-1])
    return mask


def _lowest_rows(mask: BoolArray, rows: Int64Array) -> list[int]:
    """Indices of the (at most MAX_EXAMPLES) flagged rows with the lowest row numbers."""
    idx = np.flatnonzero(mask)
    if idx.size > MAX_EXAMPLES:
        idx = idx[np.argpartition(rows[idx], MAX_EXAMPLES)[:MAX_EXAMPLES]]
    return [int(i) for i in idx[np.argsort(rows[idx], kind="stable")]]


def resolve_duplicates(
    columns: DumpColumns,
    row_numbers: npt.ArrayLike | None = None,
    report: RejectReport | None = None,
) -> tuple[DumpColumns, Int64Array, RejectReport]:
    """Sort rows by position, reject conflicting positions, keep one of identical repeats.

    Every row of a position seen with different deliver times is rejected
    (``conflicting_duplicate``); of rows repeating a position with the same deliver time, the
    lowest-numbered is kept and the others are counted as ``duplicate``.

    Args:
        columns: rows that passed :func:`check_rows`, in any order.
        row_numbers: their row numbers (default ``0..n-1``); used for examples and to decide
            which repeat is kept.
        report: a report to add the counts to (``total_rows`` is not changed: the rows were
            counted when checked); a new one if omitted.

    Returns:
        ``(columns, row_numbers, report)``: position-sorted, unique positions.
    """
    n = len(columns)
    rows = (
        np.arange(n, dtype=np.int64)
        if row_numbers is None
        else _int64_column("row_numbers", row_numbers)
    )
    if rows.shape[0] != n:
        raise ValueError(f"row_numbers has {rows.shape[0]} entries for {n} rows")
    report = RejectReport() if report is None else report
    if is_position_sorted(columns.ledger_ids, columns.entry_ids, strict=True):
        return columns, rows, report  # a well-formed topic dump: nothing to sort or drop
    order = np.lexsort((rows, columns.entry_ids, columns.ledger_ids))
    columns, rows = columns.take(order), rows[order]
    ledgers, entries, times = columns.ledger_ids, columns.entry_ids, columns.deliver_at
    conflict = find_conflicts(ledgers, entries, times)
    duplicate = find_duplicates(ledgers, entries, times) & ~conflict
    starts = np.flatnonzero(np.concatenate(([True], ~_same_as_previous(ledgers, entries))))
    bounds = np.append(starts, n)

    def group(i: int) -> slice:
        """The rows of row ``i``'s position (adjacent after the sort)."""
        at = int(np.searchsorted(starts, i, side="right")) - 1
        return slice(int(bounds[at]), int(bounds[at + 1]))

    def example(i: int, detail: str) -> dict[str, Any]:
        return {
            "row": int(rows[i]),
            "detail": detail,
            "ledger_id": int(ledgers[i]),
            "entry_id": int(entries[i]),
            "deliver_at": int(times[i]),
        }

    def conflict_detail(i: int) -> str:
        rows_of = group(i)
        distinct = np.unique(times[rows_of]).tolist()
        return (
            f"position {ledgers[i]}:{entries[i]} has {rows_of.stop - rows_of.start} rows "
            f"(first: row {rows[rows_of].min()}) with deliver times {distinct}"
        )

    for reason, mask, detail in (
        ("conflicting_duplicate", conflict, conflict_detail),
        ("duplicate", duplicate, lambda i: f"repeats row {rows[group(i)].min()} (kept)"),
    ):
        count = int(np.count_nonzero(mask))
        if count:
            report.record(reason, count, [example(i, detail(i)) for i in _lowest_rows(mask, rows)])
    keep = ~(conflict | duplicate)
    return columns.take(keep), rows[keep], report


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


# -- files ----------------------------------------------------------------------------------------


def _split_suffix(path: Path) -> tuple[str | None, str | None]:
    """``(format, compression)`` from a file name's extensions (each None if unknown/absent)."""
    suffixes = [s.lower() for s in path.suffixes]
    compression = None
    if suffixes and suffixes[-1] in _COMPRESSIONS:
        compression = _COMPRESSIONS[suffixes.pop()]
    fmt = _EXTENSIONS.get(suffixes[-1]) if suffixes else None
    return fmt, compression


def detect_format(path: str | os.PathLike[str]) -> str | None:
    """The dump format a file name implies (``parquet``, ``jsonl``, ``csv``), or None.

    A compression suffix (``.gz``, ``.bz2``, ``.zst``) after the format's is allowed.
    """
    return _split_suffix(Path(path))[0]


def normalize_format(fmt: str | None) -> str | None:
    """The canonical name (:data:`DUMP_FORMATS`) of a format name or alias; None stays None.

    Raises:
        DumpError: an unknown format.
    """
    if fmt is None:
        return None
    canonical = _FORMAT_ALIASES.get(str(fmt).lower())
    if canonical is None:
        raise DumpError(f"unknown dump format {fmt!r}; formats: parquet, jsonl (json), csv")
    return canonical


def part_files(path: Path, fmt: str | None) -> tuple[list[Path], str]:
    """The data files of a dump (one file or a directory of parts, in name order) and their
    format (``fmt``, canonical or None, wins over the names).

    Raises:
        FileNotFoundError: nothing at ``path``.
        DumpError: the format cannot be told, a directory without part files, with
            sub-directories or with part files of several formats.
    """
    if not path.exists():
        raise FileNotFoundError(f"no dump at {path}")
    if path.is_file():
        found = fmt or detect_format(path)
        if found is None:
            raise DumpError(
                f"{path}: cannot tell the dump format from the name; pass fmt "
                "(parquet, jsonl, csv) or use .parquet, .jsonl, .json or .csv"
            )
        return [path], found
    entries = sorted(p for p in path.iterdir() if not p.name.startswith(("_", ".")))
    subdirs = [p.name for p in entries if p.is_dir()]
    if subdirs:
        raise DumpError(
            f"{path}: sub-directories {', '.join(subdirs[:5])} are not supported "
            "(a dump directory holds part files only; partitioned output is not read)"
        )
    if not entries:
        raise DumpError(f"{path}: no part files in the dump directory")
    if fmt is not None:
        return entries, fmt
    formats = {p: detect_format(p) for p in entries}
    unknown = [p.name for p, f in formats.items() if f is None]
    if unknown:
        raise DumpError(
            f"{path}: cannot tell the format of {', '.join(unknown[:5])}; pass fmt explicitly"
        )
    kinds = sorted({f for f in formats.values() if f is not None})
    if len(kinds) > 1:
        raise DumpError(f"{path}: part files of several formats ({', '.join(kinds)})")
    return entries, kinds[0]


def _read_parquet(file: Path, label: str, offset: int) -> Iterator[_Batch]:
    pa, pq = _arrow(), _arrow_mod("parquet")
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
    pa, pcsv = _arrow(), _arrow_mod("csv")

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
    pa = _arrow()
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
    pa, pj = _arrow(), _arrow_mod("json")
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


# -- writing --------------------------------------------------------------------------------------


class DumpWriter:
    """Writes a dump file chunk by chunk; the file appears (atomically) only on success.

    Rows go to a temporary file next to ``path``, renamed over ``path`` by :meth:`close`;
    :meth:`abort` (or leaving the ``with`` block on an exception) removes it. ``deliver_at``
    of a message that is not delayed is written as null, so is an unknown ``publish_time``.
    Parquet goes through one ``ParquetWriter`` (a row group per chunk), CSV through pyarrow's
    ``CSVWriter``, JSON Lines as text built with vectorized string kernels.

    Args:
        path: the file to write (a compression suffix ``.gz``/``.bz2``/``.zst`` compresses
            the text formats).
        fmt: ``parquet``, ``jsonl`` or ``csv``; default: from the extension, else Parquet.

    Raises:
        DumpError: an unknown format, or a compression suffix on a Parquet file.
    """

    def __init__(self, path: str | os.PathLike[str], fmt: str | None = None) -> None:
        """Choose the format; nothing is written before the first :meth:`write`."""
        self.path = Path(path)
        by_name, compression = _split_suffix(self.path)
        self.fmt = normalize_format(fmt) or by_name or "parquet"
        if self.fmt == "parquet" and compression is not None:
            raise DumpError(f"{self.path}: Parquet files are compressed inside; drop the suffix")
        self._compression = compression
        self._tmp = self.path.with_name(f".{self.path.name}.tmp-{os.getpid()}")
        self._sink: Any = None
        self._writer: Any = None
        self._schema: Any = None
        self.rows = 0

    def __enter__(self) -> Self:
        """Use as a context manager: closes on success, aborts on an exception."""
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        """Close (publish the file) or abort (remove the temporary file)."""
        if exc_type is None:
            self.close()
        else:
            self.abort()

    def _open(self, with_publish: bool) -> None:
        pa = _arrow()
        fields = [(c, pa.int64()) for c in REQUIRED_COLUMNS]
        if with_publish:
            fields.append(("publish_time", pa.int64()))
        self._schema = pa.schema(fields)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if self.fmt == "parquet":
            self._writer = _arrow_mod("parquet").ParquetWriter(str(self._tmp), self._schema)
            return
        if self._compression == "gzip":  # pyarrow's gzip runs at level 9: ten times slower
            self._sink = gzip.open(self._tmp, "wb", compresslevel=6)  # noqa: SIM115
        elif self._compression == "bz2":
            self._sink = bz2.open(self._tmp, "wb")  # noqa: SIM115
        else:
            self._sink = pa.output_stream(str(self._tmp), compression=self._compression)
        if self.fmt == "csv":
            pcsv = _arrow_mod("csv")
            try:  # a plain header (pyarrow >= 18); older ones quote the column names
                options = pcsv.WriteOptions(batch_size=1 << 16, quoting_header="none")
            except TypeError:  # pragma: no cover - depends on the pyarrow version
                options = pcsv.WriteOptions(batch_size=1 << 16)
            self._writer = pcsv.CSVWriter(self._sink, self._schema, write_options=options)

    def write(self, columns: DumpColumns) -> None:
        """Append rows.

        Raises:
            ValueError: negative ids or an entry id >= 2**32 (a dump writer writes valid
                dumps; seed bad rows with pyarrow directly), or ``publish_time`` present in
                some chunks only.
        """
        if len(columns) and (columns.ledger_ids.min() < 0 or columns.entry_ids.min() < 0):
            raise ValueError("ledger and entry ids must be >= 0")
        if len(columns) and columns.entry_ids.max() >= ENTRY_ID_LIMIT:
            raise ValueError("entry ids must be < 2**32")
        with_publish = columns.publish_time is not None
        if self._schema is None:
            self._open(with_publish)
        elif with_publish != ("publish_time" in self._schema.names):
            raise ValueError("publish_time must be present in every chunk or in none")
        for lo in range(0, len(columns), GEN_BLOCK_ROWS):  # bounded text buffers
            table = self._table(columns.take(slice(lo, lo + GEN_BLOCK_ROWS)))
            if self.fmt == "jsonl":
                self._sink.write(self._json_lines(table))
            else:
                self._writer.write_table(table)
        self.rows += len(columns)

    def _table(self, columns: DumpColumns) -> Any:
        pa = _arrow()
        arrays = [
            pa.array(columns.ledger_ids),
            pa.array(columns.entry_ids),
            pa.array(columns.deliver_at, mask=columns.deliver_at < 0),
        ]
        if columns.publish_time is not None:
            arrays.append(pa.array(columns.publish_time, mask=columns.publish_time < 0))
        return pa.Table.from_arrays(arrays, schema=self._schema)

    @staticmethod
    def _json_lines(table: Any) -> bytes:
        pa, pc = _arrow(), _arrow_mod("compute")
        if table.num_rows == 0:
            return b""
        pieces: list[Any] = []
        for i, name in enumerate(table.schema.names):
            text = pc.fill_null(pc.cast(table.column(name), pa.string()), "null")
            pieces += [("{" if i == 0 else ",") + f'"{name}":', text]
        lines = pc.binary_join_element_wise(*pieces, "}\n", "").combine_chunks()
        # The text of all lines is one contiguous buffer: slice it instead of joining strings.
        offsets = np.frombuffer(lines.buffers()[1], np.int32, count=lines.offset + len(lines) + 1)
        data = lines.buffers()[2]
        first, last = int(offsets[lines.offset]), int(offsets[-1])
        return bytes(memoryview(data)[first:last])

    def close(self) -> Path:
        """Finish the file and move it to ``path`` (an empty dump if nothing was written)."""
        if self._schema is None:
            self._open(False)
        if self._writer is not None:
            self._writer.close()
        if self._sink is not None:
            self._sink.close()
        self._writer = self._sink = None
        os.replace(self._tmp, self.path)
        return self.path

    def abort(self) -> None:
        """Drop the temporary file; ``path`` is left as it was."""
        for closer in (self._writer, self._sink):
            if closer is not None:
                with contextlib.suppress(Exception):  # best effort: the file is deleted next
                    closer.close()
        self._writer = self._sink = None
        self._tmp.unlink(missing_ok=True)


def write_dump(path: str | os.PathLike[str], columns: DumpColumns, fmt: str | None = None) -> Path:
    """Write ``columns`` as one dump file (atomically; see :class:`DumpWriter`).

    Returns:
        The path written.

    Raises:
        DumpError: an unknown format.
        ValueError: invalid ids (see :meth:`DumpWriter.write`).
    """
    writer = DumpWriter(path, fmt)
    with writer:
        writer.write(columns)
    return writer.path


# -- generator ------------------------------------------------------------------------------------


def _int_arg(name: str, value: object, minimum: int, maximum: int = _INT64_MAX) -> int:
    if isinstance(value, bool | np.bool_) or not isinstance(value, int | np.integer):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}: {value!r}")
    number = int(value)
    if not minimum <= number <= maximum:
        raise ValueError(f"{name} must be in [{minimum}, {maximum}], got {number}")
    return number


def _fraction_arg(name: str, value: object) -> float:
    if isinstance(value, bool | np.bool_) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a number, got {type(value).__name__}: {value!r}")
    number = float(value)
    if not 0.0 <= number <= 1.0:  # also rejects NaN
        raise ValueError(f"{name} must be in [0, 1], got {value!r}")
    return number


@dataclass(frozen=True)
class _GenSpec:
    n: int
    per_ledger: int
    fraction: float
    mix: str
    seed: int
    start_ms: int
    first_ledger: int
    publish_rate: int
    fixed_delay_ms: int


def _spec(
    n: int,
    entries_per_ledger: int,
    delayed_fraction: float,
    delay_mix: str,
    seed: int,
    start_ms: int,
    first_ledger: int,
    publish_rate: int,
    fixed_delay_ms: int,
) -> _GenSpec:
    spec = _GenSpec(
        n=_int_arg("n", n, 0),
        per_ledger=_int_arg("entries_per_ledger", entries_per_ledger, 1, ENTRY_ID_LIMIT),
        fraction=_fraction_arg("delayed_fraction", delayed_fraction),
        mix=delay_mix,
        seed=_int_arg("seed", seed, 0),
        start_ms=_int_arg("start_ms", start_ms, 0),
        first_ledger=_int_arg("first_ledger", first_ledger, 0),
        publish_rate=_int_arg("publish_rate", publish_rate, 1),
        fixed_delay_ms=_int_arg("fixed_delay_ms", fixed_delay_ms, 0),
    )
    if not isinstance(delay_mix, str) or delay_mix not in DELAY_MIXES:
        raise ValueError(f"unknown delay_mix {delay_mix!r}; mixes: {', '.join(DELAY_MIXES)}")
    last = max(spec.n - 1, 0)
    max_delay = {
        "fixed": spec.fixed_delay_ms,
        "uniform": _UNIFORM_RANGE[1],
    }.get(delay_mix, _MAX_REALISTIC_DELAY)
    if last * 1000 > _INT64_MAX or spec.first_ledger + last // spec.per_ledger > _INT64_MAX:
        raise ValueError(f"n={spec.n} is too large (ids or times overflow int64)")
    if spec.start_ms + last * 1000 // spec.publish_rate + max_delay > _INT64_MAX:
        raise ValueError("timestamps would overflow int64; lower start_ms or the delays")
    return spec


def _uniform_ms(draw: npt.NDArray[np.float64], low: Any, high: Any) -> Int64Array:
    """Integers uniform in ``[low, high]`` (inclusive) from uniform doubles in ``[0, 1)``."""
    span = np.asarray(high) - np.asarray(low) + 1
    picked: Int64Array = np.minimum(np.floor(draw * span).astype(np.int64), span - 1)
    picked += low
    return picked


def _generate_block(spec: _GenSpec, block: int) -> DumpColumns:
    """Rows ``[block * GEN_BLOCK_ROWS, ...)``: a pure function of the spec and the block.

    Each random quantity has its own stream and every row takes one draw from it, delayed or
    not, so row ``j`` of a block gets the ``j``-th draw whatever the block's length: a shorter
    dump is a prefix of a longer one.
    """
    lo = block * GEN_BLOCK_ROWS
    hi = min(lo + GEN_BLOCK_ROWS, spec.n)
    size = hi - lo
    streams = [np.random.default_rng([spec.seed, block, k]) for k in range(4)]
    index = np.arange(lo, hi, dtype=np.int64)
    publish = index * 1000
    publish //= spec.publish_rate
    publish += spec.start_ms
    delayed = streams[0].random(size) < spec.fraction
    if spec.mix == "fixed":
        delay = np.full(size, spec.fixed_delay_ms, np.int64)
    elif spec.mix == "uniform":
        delay = _uniform_ms(streams[2].random(size), *_UNIFORM_RANGE)
    else:  # the realistic mix of delayindex.workload: pick a component, then a delay in it
        edges = np.array([edge for edge, _, _ in REALISTIC_COMPONENTS[:-1]])
        component = np.searchsorted(edges, streams[1].random(size), side="right")
        low = np.array([c[1] for c in REALISTIC_COMPONENTS], np.int64)[component]
        high = np.array([c[2] for c in REALISTIC_COMPONENTS], np.int64)[component]
        delay = _uniform_ms(streams[2].random(size), low, high)
    deliver = publish + delay
    if spec.mix == "midnight-burst":
        burst = streams[3].random(size) < MIDNIGHT_BURST_SHARE
        deliver[burst] = (publish[burst] // DAY_MS + 1) * DAY_MS  # exact ties, as cron does
    deliver[~delayed] = NOT_DELAYED
    ledgers = index // spec.per_ledger
    ledgers += spec.first_ledger
    entries = index % spec.per_ledger
    return DumpColumns(ledgers, entries, deliver, publish)


def iter_generated(
    n: int,
    *,
    entries_per_ledger: int = 1000,
    delayed_fraction: float = 0.5,
    delay_mix: str = "realistic",
    seed: int = 7,
    start_ms: int = DEFAULT_START_MS,
    first_ledger: int = 1,
    publish_rate: int = 10_000,
    fixed_delay_ms: int = 60_000,
) -> Iterator[DumpColumns]:
    """:func:`generate_dump`'s rows in chunks of :data:`GEN_BLOCK_ROWS` (arguments checked now).

    Concatenated, the chunks equal ``generate_dump(n, ...)``; ``gen-dump`` writes them one by
    one so memory stays bounded for any ``n``.
    """
    spec = _spec(
        n,
        entries_per_ledger,
        delayed_fraction,
        delay_mix,
        seed,
        start_ms,
        first_ledger,
        publish_rate,
        fixed_delay_ms,
    )
    blocks = -(-spec.n // GEN_BLOCK_ROWS)
    return (_generate_block(spec, block) for block in range(blocks))


def generate_dump(
    n: int,
    *,
    entries_per_ledger: int = 1000,
    delayed_fraction: float = 0.5,
    delay_mix: str = "realistic",
    seed: int = 7,
    start_ms: int = DEFAULT_START_MS,
    first_ledger: int = 1,
    publish_rate: int = 10_000,
    fixed_delay_ms: int = 60_000,
) -> DumpColumns:
    """A realistic, deterministic dump of ``n`` messages in topic order (vectorized numpy).

    Message ``i`` is at ``(first_ledger + i // entries_per_ledger, i % entries_per_ledger)``,
    published at ``start_ms + i * 1000 // publish_rate``, and delayed with probability
    ``delayed_fraction``. Delays by ``delay_mix``:

    * ``fixed``: ``fixed_delay_ms`` (60 s);
    * ``uniform``: 1 s to 1 h;
    * ``realistic``: :mod:`delayindex.workload`'s mix: 70 % 1-60 s, 25 % 1-60 min,
      5 % 1-10 days;
    * ``midnight-burst``: :data:`MIDNIGHT_BURST_SHARE` of the delayed messages are due exactly
      at the next UTC midnight after their publish time, the rest realistic.

    Row ``i`` depends only on the arguments (``n`` aside) and its block of
    :data:`GEN_BLOCK_ROWS` rows, so a smaller ``n`` gives a prefix of a larger one. Ten million
    rows take about a second.

    Raises:
        TypeError: an integer argument is not an int (``bool`` is refused).
        ValueError: an argument is out of range, an unknown mix, or int64 overflow.
    """
    chunks = iter_generated(
        n,
        entries_per_ledger=entries_per_ledger,
        delayed_fraction=delayed_fraction,
        delay_mix=delay_mix,
        seed=seed,
        start_ms=start_ms,
        first_ledger=first_ledger,
        publish_rate=publish_rate,
        fixed_delay_ms=fixed_delay_ms,
    )
    # Fill preallocated columns block by block: no second full-size copy for a concat.
    result = DumpColumns(*(np.zeros(n, np.int64) for _ in range(4)))
    lo = 0
    for chunk in chunks:
        hi = lo + len(chunk)
        for name in ("ledger_ids", "entry_ids", "deliver_at", "publish_time"):
            getattr(result, name)[lo:hi] = getattr(chunk, name)
        lo = hi
    return result
