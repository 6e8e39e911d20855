"""Pure rules shared by the online cores and driver, the catalog and the offline tools.

Each rule is written once here and called from everywhere it applies, so that the online
tracker, a local rebuild and the Spark job cannot drift apart:

* :func:`cutoff_ms`, when a message is due: the pure cores (``_pure/_ticked.py``) and the
  rebuild's classification call it; the native cores keep an inline C copy for speed, and
  ``tests/test_policy.py`` checks it against this one on a grid including the int64 edges.
* :func:`bucket_is_full`, the sealing predicate: the pure ``BucketCore.add`` asks it before a
  strictly newer ledger joins the mutable bucket, and :func:`plan_ranges` asks it to cut a whole
  topic into buckets in one pass (the rebuild's plan, local and Spark). The native core's
  ``>=`` is its inline copy; ``tests/test_rebuild.py`` proves the plan equals online sealing.
* :func:`select_merge_window`, :func:`resolve_overlaps`, :func:`backoff_delay_ms`.

Invariant: this module imports only the standard library at run time (the cores, storage and the
offline tools all import it, so it must sit below all of them); rules take plain ints and
sequences, never a config, an array type or a storage object.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Sequence
from itertools import accumulate
from typing import TYPE_CHECKING, NamedTuple

if TYPE_CHECKING:  # annotations only: policy imports only the standard library at run time
    from delayindex.storage.manifest import BucketRecord

#: Most buckets one merge combines (Pulsar's MAX_MERGE_NUM).
MAX_MERGE_NUM = 4
#: Largest multiplier a retry backoff reaches (the delay doubles per failure up to this).
MAX_BACKOFF_FACTOR = 64
#: The largest int64: the cutoff saturates here (no message is ever later).
INT64_MAX = (1 << 63) - 1


def cutoff_ms(now: int, tick_ms: int, strict: bool) -> int:
    """The cutoff at ``now``: a message is due when ``deliver_at <= cutoff``.

    ``now`` when ``strict`` (never deliver early), else ``now + tick_ms`` saturated at int64 max
    (the tick's slack lets one timer fire deliver everything due within the tick).

    >>> cutoff_ms(1000, 50, False), cutoff_ms(1000, 50, True)
    (1050, 1000)
    >>> cutoff_ms(INT64_MAX - 1, 50, False) == INT64_MAX
    True
    """
    return now if strict else min(now + tick_ms, INT64_MAX)


def bucket_is_full(held: int, min_index_count: int) -> bool:
    """Whether a mutable bucket holding ``held`` indexes is sealed before a newer ledger joins.

    Asked only at the first tracked add of a ledger strictly newer than the bucket's last one:
    a ledger is never split between buckets, so a bucket may end above the minimum.

    >>> bucket_is_full(49, 50), bucket_is_full(50, 50)
    (False, True)
    """
    return held >= min_index_count


class BucketPlan(NamedTuple):
    """Buckets cut from per-ledger tracked counts (:func:`plan_ranges`).

    ``ranges[k] = (start_ledger, end_ledger)`` and ``counts[k]`` its tracked indexes, in ledger
    order after merging; ``sealed`` is how many buckets the sealing rule gave before merging.
    """

    sealed: int
    ranges: list[tuple[int, int]]
    counts: list[int]


def plan_ranges(
    ledgers: Sequence[int], counts: Sequence[int], min_index_count: int, max_num_buckets: int
) -> BucketPlan:
    """The online sealing rule applied to a whole topic at once, then the bucket bound.

    ``ledgers`` strictly increase and ``counts`` are their tracked messages (``>= 0``; a ledger
    with none belongs to no bucket). In ledger order a bucket takes ledgers until
    :func:`bucket_is_full`; the next ledger starts the next bucket, so a ledger is never split.
    The last bucket is kept whatever its size (a rebuild persists everything). Then, while
    ``max_num_buckets > 0`` is exceeded, the window :func:`select_merge_window` picks (the
    fewest messages, leftmost on ties: every bucket's next segment is equally unloaded) is
    merged into one range spanning its sources and the gaps between them.

    >>> plan_ranges([1, 2, 3, 5, 8], [2, 0, 2, 1, 4], 3, 0)
    BucketPlan(sealed=2, ranges=[(1, 3), (5, 8)], counts=[4, 5])
    >>> plan_ranges([1, 2, 3, 5, 8], [2, 0, 2, 1, 4], 2, 1)
    BucketPlan(sealed=3, ranges=[(1, 8)], counts=[9])
    """
    kept = [(ledger, count) for ledger, count in zip(ledgers, counts, strict=True) if count > 0]
    total = list(accumulate(count for _, count in kept))
    buckets: list[tuple[int, int, int]] = []  # (start ledger, end ledger, messages)
    i, before = 0, 0
    while i < len(kept):
        j = min(_first_full(total, i, before, min_index_count), len(kept) - 1)
        buckets.append((kept[i][0], kept[j][0], total[j] - before))
        before, i = total[j], j + 1
    sealed = len(buckets)
    while 0 < max_num_buckets < len(buckets):
        chosen = select_merge_window([(True, count, 0) for _, _, count in buckets])
        assert chosen is not None  # two or more buckets, all eligible
        first, width = chosen
        window = buckets[first : first + width]
        buckets[first : first + width] = [(window[0][0], window[-1][1], sum(c for *_, c in window))]
    return BucketPlan(sealed, [(s, e) for s, e, _ in buckets], [c for *_, c in buckets])


def _first_full(total: list[int], lo: int, before: int, min_index_count: int) -> int:
    """The first index from ``lo`` whose ledger fills a bucket opened after ``before`` messages
    (``len(total)`` if none does). Running totals only grow, so the predicate is monotone along
    them and bisection finds it."""
    return bisect_left(
        total, True, lo=lo, key=lambda t: bucket_is_full(t - before, min_index_count)
    )


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
