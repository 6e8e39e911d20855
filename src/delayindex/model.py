"""Plain value types shared by every layer: positions and the id bounds they obey."""

from __future__ import annotations

from typing import NamedTuple

#: Ledger ids are signed 64-bit and non-negative: ``0 <= ledger_id < 2**63``.
MAX_LEDGER_ID = 2**63 - 1
#: Entry ids fit an unsigned 32-bit roaring bitmap: ``0 <= entry_id < 2**32``.
MAX_ENTRY_ID = 2**32 - 1
#: Deliver times are signed 64-bit epoch milliseconds.
MIN_TIME = -(2**63)
MAX_TIME = 2**63 - 1


class Position(NamedTuple):
    """A message position ``(ledger_id, entry_id)``; tuples order it by ledger, then entry."""

    ledger_id: int
    entry_id: int
