"""The browse rules every tracker (and the offline ``delayindex.schedule``) shares: argument
checks for ``pending`` and ``due_histogram``, the ordered selection of ``pending`` from unordered
live keys, and the bin counts. It sits below ``tracker/`` so that the offline tools use the same
rules without importing the tracker.

A core hands over the live keys of a time range in no particular order (``live_keys``); the
front picks the first ``limit`` in ``(deliver_at, ledger, entry)`` order here. The selection is
O(n): ``numpy.argpartition`` finds the ``limit``-th smallest time, and only the keys up to that
time (ties included) are sorted.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from delayindex import _impl
from delayindex._ints import as_count, int64_array
from delayindex.model import MAX_TIME, MIN_TIME, Position

Int64Array = npt.NDArray[np.int64]


def time_range(start_ms: object, end_ms: object) -> tuple[int, int] | None:
    """``pending``'s ``[start_ms, end_ms)`` as inclusive int64 bounds ``(first, last)`` for a
    core's ``live_keys`` (None: unbounded), or None when the range is empty.

    Raises:
        TypeError: a bound is not an int (bools and floats included) or None.
        ValueError: a bound does not fit int64.
    """
    start = MIN_TIME if start_ms is None else _bound("start_ms", start_ms)
    if end_ms is None:
        return start, MAX_TIME  # unbounded: MAX_TIME itself included
    end = _bound("end_ms", end_ms)
    return (start, end - 1) if end > start else None


def _bound(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int | np.integer):
        raise TypeError(f"{name} must be an int or None, got {type(value).__name__}")
    if not MIN_TIME <= int(value) <= MAX_TIME:
        raise ValueError(f"{name} must fit int64, got {value}")
    return int(value)


def histogram_edges(edges: object) -> Int64Array:
    """``due_histogram``'s edges as an int64 array: at least two, strictly increasing.

    Raises:
        TypeError: a value is not an integer. ValueError: fewer than two edges, not strictly
        increasing, or a value beyond int64.
    """
    if isinstance(edges, str | bytes) or not hasattr(edges, "__len__"):
        raise TypeError("edges must be a sequence of ints or an int64 array")
    out = int64_array(edges, "edges")
    if len(out) < 2:
        raise ValueError(f"edges needs at least two values, got {len(out)}")
    if not bool(np.all(out[1:] > out[:-1])):
        raise ValueError("edges must be strictly increasing")
    return out


def select_pending(
    times: Int64Array, ledgers: Int64Array, entries: Int64Array, limit: object
) -> list[tuple[int, Position]]:
    """The first ``limit`` keys in ``(deliver_at, ledger, entry)`` order, as
    ``(deliver_at, Position)`` pairs."""
    count = as_count(limit, "limit")
    if count == 0 or not len(times):
        return []
    if count < len(times):
        # Keep every key at or below the count-th smallest time (ties decide by position).
        threshold = times[np.argpartition(times, count - 1)[count - 1]]
        keep = times <= threshold
        times, ledgers, entries = times[keep], ledgers[keep], entries[keep]
    order = np.lexsort((entries, ledgers, times))[:count]
    return [
        (t, Position(led, ent))
        for t, led, ent in zip(
            times[order].tolist(), ledgers[order].tolist(), entries[order].tolist(), strict=True
        )
    ]


def bin_counts(bins: Int64Array, times: Int64Array) -> Int64Array:
    """How many of ``times`` (all within ``[bins[0], bins[-1])``) fall in each bin."""
    return _impl.BinIndex(bins).counts(times)
