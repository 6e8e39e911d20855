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
#: What a core's ``add`` returns (the native and pure twins return the same ints): deliver now,
#: now tracked, already tracked, seal the mutable bucket first (nothing done), acknowledged
#: (at or below the mark-delete: neither tracked nor delivered).
ADD_DELIVER, ADD_TRACKED, ADD_DUPLICATE, ADD_SEAL_FIRST, ADD_ACKED = 0, 1, 2, 3, 4
#: ``add`` result for a position a cancel override refuses (do not deliver, not tracked).
ADD_CANCELLED = 5
#: A ``BucketCore``'s ``add`` or ``reschedule`` result when the cancels of the position's
#: ledger were evicted from memory (they are durable): nothing was done; the driver restores
#: them (``restore_evicted``) and calls again.
ADD_NEED_OVERRIDES = 6


class Position(NamedTuple):
    """A message position ``(ledger_id, entry_id)``; tuples order it by ledger, then entry."""

    ledger_id: int
    entry_id: int
