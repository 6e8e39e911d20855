"""Delivery lateness: how long after its ``deliver_at`` a message was handed out by ``poll``.

How it works. Each tracker core counts, in ``poll``, every position it hands out into one of
:data:`BUCKETS` counters by ``late = now - deliver_at`` (milliseconds): counter 0 holds
``late <= 0`` (on time, or up to one tick early), counter ``k`` in ``1..BUCKETS-2`` holds
``2**(k-2) < late <= 2**(k-1)`` (counter 1 is exactly 1 ms), and the last counter everything
later than ``2**(BUCKETS-3)`` ms (about 131 s). So the bucket of a value is one bit-length, no
search: the native cores compute it with one count-leading-zeros instruction per message. The
core also sums the positive lateness, for a Prometheus histogram's ``_sum``.

This module is the rule's one place in Python: :func:`bucket_of`, the :class:`Lateness`
counters the pure cores and the shared index's subscriptions keep (one delivery at a time, or a
batch with :func:`batch`), and :func:`upper_bounds_seconds` (the exporter's ``le`` labels).
The native cores implement :func:`bucket_of` in C; ``tests/test_lateness.py`` checks both
builds and the batch form against it.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from delayindex._ints import bit_lengths

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


class Lateness:
    """Delivery lateness counters: :data:`BUCKETS` counts and the positive lateness summed
    (ms). The pure cores note one delivery at a time, the shared index a batch at once."""

    __slots__ = ("counts", "total_ms")

    def __init__(self) -> None:
        self.counts = [0] * BUCKETS
        self.total_ms = 0

    def note(self, late_ms: int) -> None:
        """One delivery ``late_ms`` milliseconds after its deliver time."""
        self.counts[bucket_of(late_ms)] += 1
        if late_ms > 0:
            self.total_ms += late_ms

    def note_many(self, now: int, times: npt.NDArray[np.int64]) -> None:
        """Deliveries at ``now`` of keys due at ``times`` (vectorized :meth:`note`)."""
        self.add(*batch(now, times))

    def add(self, counts: list[int], total_ms: int) -> None:
        """Add counts computed elsewhere (:func:`batch`)."""
        self.counts = [a + b for a, b in zip(self.counts, counts, strict=True)]
        self.total_ms += total_ms


def batch(now: int, times: npt.NDArray[np.int64]) -> tuple[list[int], int]:
    """The counts and positive lateness sum of deliveries at ``now`` of keys due at
    ``times``: :func:`bucket_of` of each, vectorized."""
    if not len(times):
        return [0] * BUCKETS, 0
    late = np.int64(now) - times
    buckets = np.zeros(len(late), dtype=np.int64)
    positive = late > 0
    if positive.any():
        # bucket_of: bit_length(late - 1) + 1 for late >= 1, capped at the last counter.
        buckets[positive] = np.minimum(bit_lengths(late[positive] - 1) + 1, BUCKETS - 1)
    counts = np.bincount(buckets, minlength=BUCKETS).tolist()
    return counts, int(late[positive].sum())
