"""Delivery lateness: how long after its ``deliver_at`` a message was handed out by ``poll``.

How it works. Each tracker core counts, in ``poll``, every position it hands out into one of
:data:`BUCKETS` counters by ``late = now - deliver_at`` (milliseconds): counter 0 holds
``late <= 0`` (on time, or up to one tick early), counter ``k`` in ``1..BUCKETS-2`` holds
``2**(k-2) < late <= 2**(k-1)`` (counter 1 is exactly 1 ms), and the last counter everything
later than ``2**(BUCKETS-3)`` ms (about 131 s). So the bucket of a value is one bit-length, no
search: the native cores compute it with one count-leading-zeros instruction per message. The
core also sums the positive lateness, for a Prometheus histogram's ``_sum``.

This module is the rule's one place in Python: :func:`bucket_of` (the pure cores),
:func:`add_lateness` (vectorized, for the shared index's subscriptions) and
:func:`upper_bounds_seconds` (the exporter's ``le`` labels). The native twins implement
:func:`bucket_of` in C; a test checks them against it.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

#: Counters per tracker: on time, 1 ms, 2 ms, 4 ms, ... 2**17 ms, later.
BUCKETS = 20


def bucket_of(late_ms: int) -> int:
    """The counter a lateness of ``late_ms`` milliseconds falls in."""
    if late_ms <= 0:
        return 0
    return min((late_ms - 1).bit_length() + 1, BUCKETS - 1)


def upper_bounds_seconds() -> list[float]:
    """Each counter's inclusive upper bound in seconds (the last is +Inf)."""
    return [0.0] + [2.0 ** (k - 1) / 1000.0 for k in range(1, BUCKETS - 1)] + [float("inf")]


def add_lateness(counts: npt.NDArray[np.int64], now: int, times: npt.NDArray[np.int64]) -> int:
    """Count deliveries at ``now`` of keys due at ``times`` into ``counts`` (length
    :data:`BUCKETS`); returns the positive lateness added up, in milliseconds."""
    if not len(times):
        return 0
    late = np.int64(now) - times
    positive = np.maximum(late, 0)
    # bit_length(late - 1) + 1 for late >= 1, by float log2 on exact small ints (< 2**53).
    buckets = np.zeros(len(late), dtype=np.int64)
    pos = late > 0
    if pos.any():
        minus = (late[pos] - 1).astype(np.float64)
        bits = np.where(minus > 0, np.floor(np.log2(np.maximum(minus, 1))) + 1, 0)
        buckets[pos] = np.minimum(bits.astype(np.int64) + 1, BUCKETS - 1)
    counts += np.bincount(buckets, minlength=BUCKETS)
    return int(positive.sum())
