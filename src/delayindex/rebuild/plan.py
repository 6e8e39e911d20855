"""Bucket ranges from per-ledger tracked counts: the rebuild's checked entry to the sealing rule.

The rule itself is :func:`delayindex.policy.plan_ranges` (the online tracker's sealing rule,
``BucketCore.add`` asking :func:`~delayindex.policy.bucket_is_full`, applied in one pass, then
the bucket bound by :func:`~delayindex.policy.select_merge_window`). This module checks the
arrays and takes the two settings from the config; the local rebuild and the Spark job both call
:func:`plan_for`, and ``tests/test_rebuild.py::test_plan_buckets_matches_the_bucket_core_sealing``
proves the plan equals what a ``BucketCore`` seals when fed the same messages.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from delayindex.config import TrackerConfig
from delayindex.policy import BucketPlan, plan_ranges
from delayindex.rebuild.tracked import Int64Array, _array, _config


def plan_for(
    ledgers_sorted_unique: Sequence[int] | Int64Array,
    counts: Sequence[int] | Int64Array,
    config: TrackerConfig,
) -> BucketPlan:
    """The :class:`~delayindex.policy.BucketPlan` (ranges, their counts, buckets before merging)
    for per-ledger tracked counts under ``config``; see :func:`plan_buckets`.

    Raises:
        ValueError: ledgers not strictly increasing or negative, counts negative, or the two
            differ in length. TypeError: bad config or non-integer arrays.
    """
    config = _config(config)
    ledgers = _array(ledgers_sorted_unique, "ledgers_sorted_unique")
    n = _array(counts, "counts")
    if len(ledgers) != len(n):
        raise ValueError(f"{len(ledgers)} ledgers but {len(n)} counts")
    if len(ledgers) and (int(ledgers[0]) < 0 or bool(np.any(np.diff(ledgers) <= 0))):
        raise ValueError("ledgers must be non-negative and strictly increasing")
    if len(n) and int(n.min()) < 0:
        raise ValueError("counts must be >= 0")
    return plan_ranges(
        ledgers.tolist(), n.tolist(), config.min_index_count_per_bucket, config.max_num_buckets
    )


def plan_buckets(
    ledgers_sorted_unique: Sequence[int] | Int64Array,
    counts: Sequence[int] | Int64Array,
    config: TrackerConfig,
) -> list[tuple[int, int]]:
    """Bucket ranges ``[(start_ledger, end_ledger), ...]`` from per-ledger tracked counts.

    The online sealing rule: a bucket starts at a ledger with tracked messages and takes the
    following ones until it holds ``min_index_count_per_bucket``; the ledger that reaches the
    count is its last (a ledger is never split). Ledgers with a zero count are ignored. The last
    bucket is included whatever its size. Then, with ``max_num_buckets > 0``, windows of
    adjacent buckets chosen by ``select_merge_window`` (the fewest messages, leftmost on ties, as
    every bucket's next segment is equally unloaded) are merged until at most
    ``max_num_buckets`` remain; the merged range spans its sources and the gaps between them.

    Raises:
        ValueError: ledgers not strictly increasing or negative, counts negative, or the two
            differ in length. TypeError: bad config or non-integer arrays.
    """
    return plan_for(ledgers_sorted_unique, counts, config).ranges
