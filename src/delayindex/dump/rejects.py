"""Reject reports and the comparison of positions across rows.

:class:`RejectReport` counts rows per reason (:data:`~delayindex.dump.schema.REASONS`) and keeps
the lowest-numbered examples, so reports of batches, files or Spark partitions merge into the
report of the whole dump whatever the order. :func:`resolve_duplicates` is the global check:
rows of one position with different deliver times are all rejected (no telling which is
right), identical repeats keep the lowest row number. Invariant: its result is in position
order with unique positions; an already strictly sorted input is returned untouched (the
common case: a topic dump is in position order).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from delayindex.dump.schema import (
    MAX_EXAMPLES,
    REASONS,
    REJECT_REASONS,
    BoolArray,
    DumpColumns,
    Int64Array,
    int64_column,
    is_position_sorted,
)


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
    led = int64_column("ledgers", ledgers)
    ent = int64_column("entries", entries)
    times = int64_column("deliver_at", deliver_at)
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
    led = int64_column("ledgers", ledgers)
    ent = int64_column("entries", entries)
    times = int64_column("deliver_at", deliver_at)
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
        else int64_column("row_numbers", row_numbers)
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
