"""Integer conversion that behaves like the native module's ``as_i64``."""

from __future__ import annotations

from operator import index

INT64_MIN = -(2**63)
INT64_MAX = 2**63 - 1


def as_i64(value: object) -> int:
    """Convert to int64: ``TypeError`` for non-integers and bools, ``OverflowError`` beyond
    int64."""
    if type(value) is int:
        number = value
    elif type(value) is bool:  # an int subclass, but never a position or a time
        raise TypeError("expected an int, got bool")
    else:
        number = index(value)  # type: ignore[arg-type]
    if not INT64_MIN <= number <= INT64_MAX:
        raise OverflowError("int too big to convert")
    return int(number)


def check_ids(ledger: int, entry: int) -> None:
    """``ValueError`` unless ``ledger >= 0`` and ``0 <= entry < 2**32`` (as the native twins)."""
    if ledger < 0:
        raise ValueError(f"ledger_id must be >= 0, got {ledger}")
    if not 0 <= entry <= 0xFFFFFFFF:
        raise ValueError(f"entry_id must be in [0, 2**32), got {entry}")
