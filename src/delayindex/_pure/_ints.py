"""Integer conversion that behaves like the native module's ``as_i64``."""

from __future__ import annotations

from operator import index

INT64_MIN = -(2**63)
INT64_MAX = 2**63 - 1


def as_i64(value: object) -> int:
    """Convert to int64: ``TypeError`` for non-integers, ``OverflowError`` beyond int64."""
    number = value if type(value) is int else index(value)  # type: ignore[arg-type]
    if not INT64_MIN <= number <= INT64_MAX:
        raise OverflowError("int too big to convert")
    return int(number)
