"""The library's one strict int64 coercion, for scalars and columns.

Every Python-side helper that turns arguments or columns into int64 goes through here, so they
agree on what an integer is: ``int`` and numpy integers are; ``bool`` never is (it is an
``int`` subclass, but never an id or a time). Floats are refused, except where a format says
exporters write longs as floats (``integral_floats``, the topic dump's ``5.0``): then a float
is accepted only when it is finite, has no fractional part and is exact (``|x| <= 2**53``).
Nothing is ever truncated: ``5.5`` raises instead of becoming ``5``. (The native module and
``_pure/_ints.py`` mirror its scalar check ``as_i64``; they stay twins of each other.)
"""

from __future__ import annotations

import operator
from typing import Any

import numpy as np
import numpy.typing as npt

__all__ = [
    "EXACT_FLOAT", "INT64_MAX", "INT64_MIN", "as_count", "as_int", "bit_lengths", "int64_array",
]  # fmt: skip

INT64_MIN = -(2**63)
INT64_MAX = 2**63 - 1
#: Floats beyond this magnitude are not exact integers (53-bit mantissa).
EXACT_FLOAT = 2**53
#: 2**0 .. 2**62: every power of two an int64 can hold.
_POWERS_OF_TWO = np.left_shift(np.int64(1), np.arange(63, dtype=np.int64))

Int64Array = npt.NDArray[np.int64]


def as_count(value: object, name: str = "max_messages") -> int:
    """``value`` as a message count: any integral (``operator.index``-able, e.g. ``numpy.int64``)
    but bool, clamped to ``[0, 2**63 - 1]`` (a count ``<= 0`` asks for nothing).

    Raises:
        TypeError: ``value`` is a bool or not integral.
    """
    if type(value) is int:
        count = value
    elif isinstance(value, bool):
        raise TypeError(f"{name} must be an int, got bool")
    else:
        try:
            count = operator.index(value)  # type: ignore[arg-type]
        except TypeError:
            raise TypeError(f"{name} must be an int, got {type(value).__name__}") from None
    return 0 if count < 0 else min(count, INT64_MAX)


def as_int(name: str, value: object, low: int | None = None, high: int | None = None) -> int:
    """``value`` as a Python ``int`` within ``[low, high]`` (a bound of None: unbounded).

    Raises:
        TypeError: ``value`` is a bool or not an int / numpy integer (floats included).
        ValueError: outside the bounds.
    """
    if isinstance(value, bool | np.bool_) or not isinstance(value, int | np.integer):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}: {value!r}")
    number = int(value)
    if (low is not None and number < low) or (high is not None and number > high):
        lo = "-inf" if low is None else low
        hi = "inf" if high is None else high
        raise ValueError(f"{name} must be in [{lo}, {hi}], got {number}")
    return number


def _from_floats(array: npt.NDArray[Any], name: str) -> Int64Array:
    with np.errstate(invalid="ignore"):
        bad = ~np.isfinite(array) | (array != np.floor(array)) | (np.abs(array) > EXACT_FLOAT)
    if bad.any():
        first = array[np.flatnonzero(bad)[0]]
        raise TypeError(f"{name} must hold integers, got {first!r} (not truncated)")
    return np.ascontiguousarray(array, dtype=np.int64)


def _from_objects(array: npt.NDArray[Any], name: str, integral_floats: bool) -> Int64Array:
    out = np.empty(len(array), dtype=np.int64)
    for i, value in enumerate(array.tolist()):
        if integral_floats and isinstance(value, float):
            out[i] = _from_floats(np.array([value]), f"{name}[{i}]")[0]
            continue
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"{name}[{i}] must be an int, got {type(value).__name__}")
        if not INT64_MIN <= value <= INT64_MAX:
            raise ValueError(f"{name}[{i}] does not fit int64: {value}")
        out[i] = value
    return out


def int64_array(values: object, name: str, *, integral_floats: bool = False) -> Int64Array:
    """``values`` (an array or a sequence) as a 1-d C-contiguous int64 array, strictly.

    An int64 array that already is contiguous is returned as is (no copy).

    Args:
        values: the column.
        name: how errors name it.
        integral_floats: accept floats without a fractional part (``5.0``), as dumps do.

    Raises:
        TypeError: a non-integer value (a fractional or inexact float, a bool, a string).
        ValueError: not one-dimensional, or a value beyond int64.
    """
    if isinstance(values, str | bytes):
        raise TypeError(f"{name} must be a sequence of ints or an int64 array")
    try:
        array = np.asarray(values)
    except (ValueError, OverflowError) as exc:
        raise ValueError(f"{name}: {exc}") from None
    if array.ndim != 1:
        raise ValueError(f"{name} must be one-dimensional, got shape {array.shape}")
    kind = array.dtype.kind
    if kind == "i" or array.size == 0:  # an empty list comes out as float64: nothing to check
        return np.ascontiguousarray(array, dtype=np.int64)
    if kind == "u":
        if int(array.max()) > INT64_MAX:
            raise ValueError(f"{name} has a value beyond int64: {int(array.max())}")
        return np.ascontiguousarray(array, dtype=np.int64)
    if kind == "f" and integral_floats:
        return _from_floats(array, name)
    if kind == "O":
        return _from_objects(array, name, integral_floats)
    raise TypeError(f"{name} must hold integers, got dtype {array.dtype}")


def bit_lengths(values: npt.ArrayLike) -> Int64Array:
    """``int.bit_length`` of each non-negative int64 value, vectorized and exact: the count of
    powers of two at most the value (integer comparisons, no float ``log2``)."""
    found: Int64Array = np.searchsorted(
        _POWERS_OF_TWO, np.asarray(values, dtype=np.int64), side="right"
    ).astype(np.int64)
    return found
