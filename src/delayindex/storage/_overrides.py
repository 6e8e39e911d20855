"""The cancel and reschedule overrides a manifest carries (:class:`Overrides`).

A ``DelayIndex`` persists its overrides with its commits, like the mark-delete position: the
positions whose ``cancel`` must hold against the dispatcher's replay, and the positions moved
by ``reschedule`` with their new times. Both are dropped once the mark-delete passes them.

The cancelled positions are held **packed**, in memory as on disk: the catalog keeps the
overrides for every later commit, so their form is what a durable cancel costs in resident
memory. The packed form is :mod:`delayindex._cancelset`'s: half of 10 M positions cancelled
at random packs into about 0.2 B per message (per-ledger roaring bytes, the earlier form, took
1 B). ``moved`` is a plain tuple (reschedules are rare). In the
manifest's JSON (manifest format 2; format 1's ``cancelled`` list of per-ledger roaring
bitmaps is still read)::

    "overrides": {"cancelled_packed": "<base64 of the packed form>",
                  "moved": [[ledger, entry, deliver_at], ...]}

Invariants (checked when packing and on every decode; the constructor trusts packed bytes it
is given, so build one with the classmethods): ledgers ascending and each once,
every count positive, entries ascending within a ledger and below 2**32; moved positions
ascending, each once; every id non-negative and every value an int64.
"""

from __future__ import annotations

import base64
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from pyroaring import BitMap

from delayindex._cancelset import (
    _ENTRY_LIMIT,
    Int64Array,
    pack_cancelled,
    unpack_cancelled,
)

_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1


def _is_int(value: object) -> bool:
    return type(value) is int and _INT64_MIN <= value <= _INT64_MAX


@dataclass(frozen=True)
class Overrides:
    """Cancelled positions (packed: see the module docs) and moved positions with their
    times. Build one with :meth:`from_record`, :meth:`from_arrays` or :meth:`from_json`."""

    cancelled_packed: bytes = b""
    moved: tuple[tuple[int, int, int], ...] = ()

    def __post_init__(self) -> None:
        if not isinstance(self.cancelled_packed, bytes) or not isinstance(self.moved, tuple):
            raise TypeError("overrides: cancelled_packed must be bytes and moved a tuple")
        last: tuple[int, int] = (-1, -1)
        for move in self.moved:
            if not (isinstance(move, tuple) and len(move) == 3 and all(map(_is_int, move))):
                raise TypeError(f"overrides: bad moved entry {move!r:.80}")
            if move[0] < 0 or not 0 <= move[1] < _ENTRY_LIMIT or (move[0], move[1]) <= last:
                raise ValueError(f"overrides: moved positions must be valid and ascend: {move}")
            last = (move[0], move[1])

    def __bool__(self) -> bool:
        return bool(self.cancelled_packed or self.moved)

    @classmethod
    def from_arrays(
        cls,
        cancelled_ledgers: Int64Array,
        cancelled_entries: Int64Array,
        moved: Sequence[tuple[int, int, int]] = (),
    ) -> Overrides:
        """Overrides of ascending, unique cancelled positions (two int64 arrays)."""
        return cls(pack_cancelled(cancelled_ledgers, cancelled_entries), tuple(moved))

    @classmethod
    def from_record(
        cls,
        cancelled: Sequence[tuple[int, bytes]],
        moved: Sequence[tuple[int, int, int]],
    ) -> Overrides:
        """Overrides of a core's ``override_record()``: ``((ledger, portable roaring bytes),
        ...)`` ledgers ascending, and ``((ledger, entry, time), ...)`` ascending."""
        ledgers: list[Int64Array] = []
        entries: list[Int64Array] = []
        for item in cancelled:
            if not (isinstance(item, tuple) and len(item) == 2 and _is_int(item[0])):
                raise TypeError(f"overrides: bad cancelled entry {item!r:.80}")
            ledger, data = item
            if not isinstance(data, bytes):
                raise TypeError(f"overrides: ledger {ledger}: bitmap must be bytes")
            try:
                values = np.asarray(BitMap.deserialize(data).to_array(), dtype=np.int64)
            except Exception as exc:  # pyroaring raises several kinds on bad bytes
                raise ValueError(f"overrides: ledger {ledger!r}: bad bitmap ({exc})") from None
            if not len(values):
                raise ValueError(f"overrides: ledger {ledger!r}: empty bitmap")
            ledgers.append(np.full(len(values), ledger, dtype=np.int64))
            entries.append(values)
        if not ledgers:
            return cls(b"", tuple(moved))
        return cls.from_arrays(np.concatenate(ledgers), np.concatenate(entries), moved)

    def to_arrays(self) -> tuple[Int64Array, Int64Array, Int64Array, Int64Array, Int64Array]:
        """``(cancelled_ledgers, cancelled_entries, moved_ledgers, moved_entries,
        moved_times)`` int64 arrays, positions ascending."""
        ledgers, entries = unpack_cancelled(self.cancelled_packed)
        columns = [np.array([m[i] for m in self.moved], dtype=np.int64) for i in range(3)]
        return ledgers, entries, *columns  # type: ignore[return-value]

    def to_json(self) -> dict[str, Any]:
        """The manifest's JSON form (see the module docs)."""
        return {
            "cancelled_packed": base64.b64encode(self.cancelled_packed).decode("ascii"),
            "moved": [list(m) for m in self.moved],
        }

    @classmethod
    def from_json(cls, obj: object, *, packed: bool) -> Overrides:
        """Parse the JSON form: packed (manifest format 2) or, with ``packed=False``,
        per-ledger bitmaps (format 1). ``ValueError``/``TypeError`` for anything malformed,
        the other format's form included (the cancels are unpacked and checked, so damaged
        bytes are found here)."""
        forms = ("cancelled", "cancelled_packed")
        form, other = forms[::-1] if packed else forms
        if not isinstance(obj, dict):
            raise ValueError("overrides must be an object")
        if set(obj) == {other, "moved"}:
            fmt = 2 if packed else 1
            raise ValueError(f"overrides in the wrong form for manifest format {fmt}")
        if set(obj) != {form, "moved"}:
            raise ValueError(f"overrides must be an object with {form} and moved")
        if not isinstance(obj["moved"], list):
            raise ValueError("overrides: moved must be a list")
        moved = []
        for item in obj["moved"]:
            if not isinstance(item, list):
                raise ValueError(f"overrides: bad moved entry {item!r:.80}")
            moved.append(tuple(item))
        if packed:
            text = obj["cancelled_packed"]
            if not isinstance(text, str):
                raise ValueError("overrides: cancelled_packed must be a base64 string")
            try:
                blob = base64.b64decode(text, validate=True)
            except ValueError as exc:
                raise ValueError(f"overrides: cancelled_packed is not base64 ({exc})") from None
            unpack_cancelled(blob)  # raises on anything malformed
            return cls(blob, tuple(moved))
        if not isinstance(obj["cancelled"], list):
            raise ValueError("overrides: cancelled must be a list")
        record = []
        for item in obj["cancelled"]:  # format 1: [[ledger, "<base64 roaring>"], ...]
            if not (isinstance(item, list) and len(item) == 2 and isinstance(item[1], str)):
                raise ValueError(f"overrides: bad cancelled entry {item!r:.80}")
            try:
                data = base64.b64decode(item[1], validate=True)
            except ValueError as exc:
                raise ValueError(f"overrides: ledger {item[0]!r}: bad base64 ({exc})") from None
            record.append((item[0], data))
        ledgers = [ledger for ledger, _ in record]
        if any(not _is_int(x) for x in ledgers) or ledgers != sorted(set(ledgers)):
            raise ValueError("overrides: cancelled ledgers must ascend, each with its bytes")
        return cls.from_record(record, moved)
