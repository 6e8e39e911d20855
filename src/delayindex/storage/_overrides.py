"""The cancel and reschedule overrides a manifest carries (:class:`Overrides`).

A ``DelayIndex`` persists its overrides with its commits, like the mark-delete position: the
positions whose ``cancel`` must hold against the dispatcher's replay, and the positions moved
by ``reschedule`` with their new times. Both are dropped once the mark-delete passes them.

``cancelled`` holds one roaring bitmap per ledger (the portable serialization pyroaring and
CRoaring share), so a million cancelled positions of a few ledgers take a few hundred
kilobytes; ``moved`` is a plain list (reschedules are rare). In the manifest's JSON::

    "overrides": {"cancelled": [[ledger, "<base64 roaring>"], ...],
                  "moved": [[ledger, entry, deliver_at], ...]}

Invariants (checked on construction, hence on every decode): ledgers ascending and each once,
every bitmap non-empty and its entries below 2**32; moved positions ascending, each once;
every id non-negative and every value an int64.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
from pyroaring import BitMap

Int64Array = npt.NDArray[np.int64]
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1


def _is_int(value: object) -> bool:
    return type(value) is int and _INT64_MIN <= value <= _INT64_MAX


@dataclass(frozen=True)
class Overrides:
    """Cancelled positions (per-ledger roaring bytes) and moved positions with their times."""

    cancelled: tuple[tuple[int, bytes], ...] = ()
    moved: tuple[tuple[int, int, int], ...] = ()

    def __post_init__(self) -> None:
        if not isinstance(self.cancelled, tuple) or not isinstance(self.moved, tuple):
            raise TypeError("overrides: cancelled and moved must be tuples")
        previous = -1
        for item in self.cancelled:
            if not (isinstance(item, tuple) and len(item) == 2 and _is_int(item[0])):
                raise TypeError(f"overrides: bad cancelled entry {item!r:.80}")
            ledger, data = item
            if ledger <= previous or not isinstance(data, bytes):
                raise ValueError("overrides: cancelled ledgers must ascend, each with its bytes")
            previous = ledger
        last: tuple[int, int] = (-1, -1)
        for move in self.moved:
            if not (isinstance(move, tuple) and len(move) == 3 and all(map(_is_int, move))):
                raise TypeError(f"overrides: bad moved entry {move!r:.80}")
            if move[0] < 0 or not 0 <= move[1] < 2**32 or (move[0], move[1]) <= last:
                raise ValueError(f"overrides: moved positions must be valid and ascend: {move}")
            last = (move[0], move[1])

    def __bool__(self) -> bool:
        return bool(self.cancelled or self.moved)

    def to_arrays(self) -> tuple[Int64Array, Int64Array, Int64Array, Int64Array, Int64Array]:
        """``(cancelled_ledgers, cancelled_entries, moved_ledgers, moved_entries,
        moved_times)`` int64 arrays, positions ascending."""
        ledgers: list[Int64Array] = []
        entries: list[Int64Array] = []
        for ledger, data in self.cancelled:
            values = np.asarray(BitMap.deserialize(data).to_array(), dtype=np.int64)
            ledgers.append(np.full(len(values), ledger, dtype=np.int64))
            entries.append(values)
        empty = np.empty(0, dtype=np.int64)
        columns = [np.array([m[i] for m in self.moved], dtype=np.int64) for i in range(3)]
        return (
            np.concatenate(ledgers) if ledgers else empty,
            np.concatenate(entries) if entries else empty,
            *columns,  # type: ignore[return-value]
        )

    def to_json(self) -> dict[str, Any]:
        """The manifest's JSON form (see the module docs)."""
        return {
            "cancelled": [
                [ledger, base64.b64encode(data).decode("ascii")] for ledger, data in self.cancelled
            ],
            "moved": [list(m) for m in self.moved],
        }

    @classmethod
    def from_json(cls, obj: object) -> Overrides:
        """Parse the JSON form; ``ValueError``/``TypeError`` for anything malformed (the
        bitmaps are deserialized, so damaged bytes are found here)."""
        if not isinstance(obj, dict) or set(obj) != {"cancelled", "moved"}:
            raise ValueError("overrides must be an object with cancelled and moved")
        if not isinstance(obj["cancelled"], list) or not isinstance(obj["moved"], list):
            raise ValueError("overrides: cancelled and moved must be lists")
        cancelled = []
        for item in obj["cancelled"]:
            if not (isinstance(item, list) and len(item) == 2 and isinstance(item[1], str)):
                raise ValueError(f"overrides: bad cancelled entry {item!r:.80}")
            try:
                data = base64.b64decode(item[1], validate=True)
                bitmap = BitMap.deserialize(data)
            except Exception as exc:  # pyroaring raises several kinds on bad bytes
                raise ValueError(f"overrides: ledger {item[0]!r}: bad bitmap ({exc})") from None
            if not bitmap:
                raise ValueError(f"overrides: ledger {item[0]!r}: empty bitmap")
            cancelled.append((item[0], data))
        moved = []
        for item in obj["moved"]:
            if not isinstance(item, list):
                raise ValueError(f"overrides: bad moved entry {item!r:.80}")
            moved.append(tuple(item))
        return cls(tuple(cancelled), tuple(moved))
