"""Cancel and browse at scale, in a fresh process (not a pytest-benchmark module)::

    python benchmarks/cancel_probe.py N

One DelayIndex on FileStorage filled with the first ``N`` realistic delayed messages
(``baselines.delayed_subset``) and flushed; then ``due_histogram`` with 100 equal bins over the
whole time range (three times), ``cancel_many`` of every second message, ``flush()``, and the
histogram again (now every bucket lost positions from storage, so its segments are read), and
one replayed add of a cancelled message (which takes the evicted cancels back first); then the
index is reopened with a bound of 4 buckets, so that merges take in nearly every bucket and fold
their ranges' cancels into the merged snapshots, and a replayed add again. Prints one JSON
object: resident memory per message (RSS growth, after ``gc`` and ``malloc_trim``) after
the fill, after the histograms, after the cancels (their result array dropped: it is the
caller's) and after the ``flush()`` that makes them durable (and evicts them from the core);
the histogram times; the ``cancel_many`` rate; the replayed add's time; the bytes of overrides
held in memory (the catalog's packed copy plus the core's cancels) before and after the merges.
"""

import gc
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import numpy as np
from baselines import _rss_bytes, delayed_subset

from delayindex import DelayIndex, FileStorage, ManualClock, TrackerConfig
from delayindex._memory import release_free_memory


def overrides_held(index: DelayIndex) -> int:
    """Bytes of cancel overrides the index holds in memory: the catalog's packed copy and the
    core's own bitmaps (its cancels still in memory, at the core's bytes per cancel)."""
    packed = len(index._catalog.manifest.overrides.cancelled_packed)
    in_core = int(index._core.counters()["cancel_overrides"])
    return packed + in_core  # at least 1 B per cancel kept by the core (roaring: ~1 B)


n = int(sys.argv[1])
cols = delayed_subset(n)
clock = ManualClock(0)
root = Path(tempfile.mkdtemp(prefix="cancel-probe-"))
gc.collect()
release_free_memory()
before = _rss_bytes()
index = DelayIndex.open(FileStorage(root), "p", clock=clock)
for s in range(0, n, 100_000):
    index.add_many(*(c[s : s + 100_000] for c in cols))
index.flush()
gc.collect()
release_free_memory()
held = _rss_bytes()
lo, hi = int(cols[2].min()), int(cols[2].max()) + 1
edges = np.unique(np.linspace(lo, hi, 101).astype(np.int64))
times = []
for _ in range(3):
    t = time.perf_counter()
    counts = index.due_histogram(edges)
    times.append(time.perf_counter() - t)
assert int(counts.sum()) == n, (int(counts.sum()), n)
gc.collect()
release_free_memory()
after_hist = _rss_bytes()
t = time.perf_counter()
out = index.cancel_many(cols[0][::2], cols[1][::2])
cancel_s = time.perf_counter() - t
cancelled = int(out.sum())
assert cancelled == len(out)
del out  # the caller's result array (1 B per call), not the index's
gc.collect()
release_free_memory()
after_cancel = _rss_bytes()
index.flush()
gc.collect()
release_free_memory()
after_flush = _rss_bytes()
before_merges = overrides_held(index)  # after the flush: the cancels of sealed buckets evicted
times2 = []
for _ in range(3):
    t = time.perf_counter()
    counts2 = index.due_histogram(edges)
    times2.append(time.perf_counter() - t)
assert int(counts2.sum()) == n - cancelled
# One more cancel and its flush: the note joins it to the evicted ones (decode, union, pack).
assert index.cancel(int(cols[0][1]), int(cols[1][1]))
t = time.perf_counter()
index.flush()
note_s = time.perf_counter() - t
# The dispatcher's replay re-adds a cancelled message of a sealed bucket: the evicted cancels
# come back into memory first (one decode of the manifest's packed copy).
t = time.perf_counter()
assert index.add(int(cols[0][0]), int(cols[1][0]), int(cols[2][0])) is True
restore_s = time.perf_counter() - t
assert not index.contains(int(cols[0][0]), int(cols[1][0]))
stats = index.stats()
memory_usage = index.memory_usage_bytes()
buckets = len(index.buckets())
index.flush()
index.close()
# The next merges: the index reopened with a bound of 4 buckets, so that merging takes in
# (nearly) every bucket, each merge folding its range's cancels into the merged snapshot.
gc.collect()
release_free_memory()
closed = _rss_bytes()
t = time.perf_counter()
index = DelayIndex.open(FileStorage(root), "p", TrackerConfig(max_num_buckets=4), clock=clock)
for _ in range(int(sys.argv[2]) if len(sys.argv) > 2 else 10**9):
    if not index.stats()["over_limit"]:
        break
    index.flush()  # waits for the merges started so far; each success may start another
    time.sleep(0.01)
merge_s = time.perf_counter() - t
gc.collect()
release_free_memory()
merged = _rss_bytes()
after_merges = overrides_held(index)
t = time.perf_counter()
assert index.add(int(cols[0][2]), int(cols[1][2]), int(cols[2][2])) is True
refold_s = time.perf_counter() - t
assert not index.contains(int(cols[0][2]), int(cols[1][2]))
merged_stats = index.stats()
print(
    json.dumps(
        {
            "n": n,
            "held_B_per_msg": (held - before) / n,
            "histogram_ms_clean": [round(x * 1e3, 1) for x in times],
            "cancel_many_half_s": round(cancel_s, 3),
            "cancel_many_ops_per_s": round(cancelled / cancel_s),
            "rss_change_after_histograms_B_per_msg": (after_hist - held) / n,
            "rss_change_cancel_many_B_per_msg": (after_cancel - after_hist) / n,
            "rss_change_flush_B_per_msg": (after_flush - after_cancel) / n,
            "rss_change_after_cancelling_half_B_per_msg": (after_flush - after_hist) / n,
            "histogram_ms_after_cancels": [round(x * 1e3, 1) for x in times2],
            "cancel_overrides": stats["cancel_overrides"],
            "cancel_overrides_evicted": stats.get("cancel_overrides_evicted"),
            "flush_of_one_more_cancel_s": round(note_s, 3),
            "first_replayed_cancelled_add_s": round(restore_s, 3),
            "memory_usage_bytes": memory_usage,
            "buckets": buckets,
            "overrides_held_before_merges_B_per_msg": before_merges / n,
            "reopen_and_merge_to_4_buckets_s": round(merge_s, 2),
            "overrides_held_after_merges_B_per_msg": after_merges / n,
            "rss_change_reopen_and_merges_B_per_msg": (merged - closed) / n,
            "cancel_overrides_folded": merged_stats["cancel_overrides_folded"],
            "cancel_overrides_after_merges": merged_stats["cancel_overrides"],
            "first_replayed_cancelled_add_after_merges_s": round(refold_s, 3),
            "buckets_after_merges": len(index.buckets()),
        }
    )
)
index.close()
