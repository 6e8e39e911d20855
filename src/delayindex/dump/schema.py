"""Dump schema: the columns, their constants, :class:`DumpColumns` and :class:`DumpError`.

A dump is four ``int64`` columns (``ledger_id``, ``entry_id``, ``deliver_at``, optional
``publish_time``); every other module of the package speaks in :class:`DumpColumns`.
Invariants: columns are one-dimensional, C-contiguous ``int64`` of equal length, coerced
strictly by :func:`delayindex._ints.int64_array` (integral floats such as ``5.0`` are accepted,
as the format allows; ``5.5`` raises, never truncates); ``deliver_at`` below zero is stored as
:data:`NOT_DELAYED`. pyarrow is imported lazily through :func:`arrow` so that the generator and
the column types work without it.
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from delayindex._ints import int64_array
from delayindex.workload import Workload

if TYPE_CHECKING:  # the report module imports this one
    from delayindex.dump.rejects import RejectReport

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

#: Columns a dump must have.
REQUIRED_COLUMNS: tuple[str, ...] = ("ledger_id", "entry_id", "deliver_at")
#: Columns a dump may have.
OPTIONAL_COLUMNS: tuple[str, ...] = ("publish_time",)
#: Every column a dump's reader looks at (others are ignored), in this order.
COLUMNS: tuple[str, ...] = (*REQUIRED_COLUMNS, *OPTIONAL_COLUMNS)

_SPARK_HINT = "pip install 'delayindex[spark]'"


class DumpError(ValueError):
    """A dump cannot be read as asked: a schema problem, an unreadable file, or (``strict``) a
    rejected row. ``report`` holds what was counted so far, when there is one."""

    def __init__(self, message: str, report: RejectReport | None = None) -> None:
        super().__init__(message)
        self.report = report


def arrow() -> Any:
    """The ``pyarrow`` module (imported on first use; typed loosely: it ships no type hints)."""
    try:
        return importlib.import_module("pyarrow")
    except ImportError as exc:  # pragma: no cover - pyarrow is installed in the dev venv
        raise ImportError(
            f"topic dumps need pyarrow, which the spark extra installs: {_SPARK_HINT}"
        ) from exc


def arrow_mod(name: str) -> Any:
    """A pyarrow submodule (``compute``, ``parquet``, ``csv``, ``json``)."""
    arrow()
    return importlib.import_module(f"pyarrow.{name}")


def int64_column(name: str, value: Any) -> Int64Array:
    """A dump column as int64, strictly: ``5.0`` is 5, ``5.5`` raises ``TypeError``."""
    return int64_array(value, name, integral_floats=True)


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
            object.__setattr__(self, name, int64_column(name, getattr(self, name)))
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
