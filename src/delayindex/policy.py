"""Pure rules shared by the online driver, the catalog and the offline tools.

Each rule is written once here and called from everywhere it applies, so that the online
tracker, a local rebuild and the Spark job cannot drift apart.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # annotations only: policy imports nothing at run time
    from delayindex.storage.manifest import BucketRecord

#: Most buckets one merge combines (Pulsar's MAX_MERGE_NUM).
MAX_MERGE_NUM = 4
#: Largest multiplier a retry backoff reaches (the delay doubles per failure up to this).
MAX_BACKOFF_FACTOR = 64


def backoff_delay_ms(base_ms: int, attempts: int) -> int:
    """Delay before the next retry after ``attempts`` failures (``attempts >= 1``).

    ``base_ms`` after the first failure, doubling per further failure, at most
    ``base_ms * MAX_BACKOFF_FACTOR``: a failing operation is retried ever less often, but never
    abandoned silently.

    >>> [backoff_delay_ms(1000, n) for n in (1, 2, 3, 10)]
    [1000, 2000, 4000, 64000]
    """
    return int(base_ms * min(2 ** max(attempts - 1, 0), MAX_BACKOFF_FACTOR))


def select_merge_window(
    candidates: list[tuple[bool, int, int]], merge_num: int = MAX_MERGE_NUM
) -> tuple[int, int] | None:
    """Choose adjacent buckets to merge (Pulsar's ``selectMergedBuckets`` with #26242's fixes).

    ``candidates`` lists every sealed bucket in ledger order as ``(eligible, num_messages,
    next_segment_time)``. Returns ``(first, count)`` of the window of ``count`` adjacent
    eligible buckets with the fewest messages (ties: the earliest next-segment time, then the
    leftmost), trying 4, then 3, then 2 buckets; None when no two adjacent buckets qualify.
    """
    actual = min(merge_num, len(candidates))
    while actual >= 2:
        best: tuple[int, int, int] | None = None
        for i in range(len(candidates) - actual + 1):
            window = candidates[i : i + actual]
            if all(c[0] for c in window):
                key = (sum(c[1] for c in window), min(c[2] for c in window), i)
                if best is None or key < best:
                    best = key
        if best is not None:
            return best[2], actual
        actual -= 1
    return None


def resolve_overlaps(
    records: list[BucketRecord],
) -> tuple[list[BucketRecord], list[BucketRecord]]:
    """Resolve overlapping bucket ranges (a crashed merge in Pulsar's layout): keep, drop.

    A bucket whose full range encloses an overlapping one wins (the merge result beats its
    sources); overlapping buckets where neither encloses the other are both kept out of the
    way of each other by keeping the first seen and dropping the later (it is reported).
    Ranges are compared whole, never clipped (Pulsar #26240/#26241).
    """
    kept: list[BucketRecord] = []
    dropped: list[BucketRecord] = []
    for record in sorted(records, key=lambda r: (r.start_ledger, -r.end_ledger)):
        clash = [
            k for k in kept
            if k.start_ledger <= record.end_ledger and record.start_ledger <= k.end_ledger
        ]  # fmt: skip
        if not clash:
            kept.append(record)
        elif all(
            record.start_ledger <= k.start_ledger and k.end_ledger <= record.end_ledger
            for k in clash
        ):
            for k in clash:
                kept.remove(k)
                dropped.append(k)
            kept.append(record)
        else:
            dropped.append(record)
    kept.sort(key=lambda r: r.start_ledger)
    return kept, dropped
