"""Per-call ``add`` and ``contains`` against the inline heapq + set loop, interleaved, in a fresh
process (not a pytest-benchmark module)::

    python benchmarks/percall_probe.py N ROUNDS

Why interleaved. On a shared 2-core machine a single benchmark row moves 1.5-2x between
processes (the regression gate's notes in docs/benchmarks.md), so two rows timed a minute apart
do not give a trustworthy ratio. Here every loop runs once per round, in turn, and each loop's
best round is kept: the trackers and their bar meet the same moments of the machine.

Inputs: the first ``N`` realistic delayed messages (``baselines.delayed_subset``), shifted a
day ahead of the wall clock so that every one is tracked. Each round, for ``contains``: a
filled SharedDelayIndex (ten subscriptions; the fourth one's ``contains``), DelayIndex and
InMemoryTracker, and the inline membership loop over a set; for ``add``: a fresh index of each
kind on the wall clock, and the inline dedup + push loop. The garbage collector is off while
timing. Prints one JSON object: ``best_ms`` (each loop's best round) and ``vs_inline`` (the
inline loop's best time over each tracker's: above 1 is faster than the inline loop).
"""

import gc
import json
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from baselines import delayed_subset
from shared_probe import SUBSCRIPTIONS, fill
from support import add_each, add_inline, contains_each, contains_inline

from delayindex import DelayIndex, FileStorage, InMemoryTracker, SharedDelayIndex, _impl

DAY_MS = 86_400_000
KINDS = ("shared", "delay_index", "in_memory")


def _open(kind: str, root: Path, clock: Callable[[], int]) -> tuple[Any, Any]:
    """A fresh tracker of ``kind`` and what answers ``contains`` for it."""
    if kind == "shared":
        shared = SharedDelayIndex.open(FileStorage(root), "probe", clock=clock)
        views = [shared.subscribe(f"sub-{i}") for i in range(SUBSCRIPTIONS)]
        return shared, views[3]
    if kind == "delay_index":
        index = DelayIndex.open(FileStorage(root), "probe", clock=clock)
        return index, index
    tracker = InMemoryTracker(clock=clock)
    return tracker, tracker


def _timed(best: dict[str, float], name: str, loop: Callable[..., Any], *args: Any) -> Any:
    start = time.perf_counter()
    out = loop(*args)
    best[name] = min(best.get(name, float("inf")), time.perf_counter() - start)
    return out


def run(n: int, rounds: int) -> dict[str, Any]:
    """Time every loop ``rounds`` times, interleaved (see the module doc)."""
    ledgers, entries, times = delayed_subset(n)
    now = _impl.wall_clock_ms()
    times = times + (now - int(times.min()) + DAY_MS)
    columns = (ledgers.tolist(), entries.tolist(), times.tolist())
    positions = set(zip(columns[0], columns[1], strict=True))
    root = Path(tempfile.mkdtemp(prefix="delayindex-percall-"))
    best: dict[str, float] = {}
    try:
        filled = {kind: _open(kind, root / f"filled-{kind}", _impl.wall_clock_ms) for kind in KINDS}
        for kind, (tracker, _) in filled.items():
            if kind == "in_memory":
                tracker.add_many(ledgers, entries, times)
            else:
                fill(tracker, (ledgers, entries, times))  # add_many in batches, then flush
        gc.collect()
        gc.disable()
        for _ in range(rounds):
            for kind, (_, view) in filled.items():
                hits = _timed(best, f"contains-{kind}", contains_each, view, *columns[:2])
                assert hits == n, (kind, hits)
            assert _timed(best, "contains-inline", contains_inline, positions, *columns[:2]) == n
        for tracker, _ in filled.values():
            tracker.close()
        for r in range(rounds):
            for kind in KINDS:
                tracker, _ = _open(kind, root / f"add-{kind}-{r}", _impl.wall_clock_ms)
                _timed(best, f"add-{kind}", add_each, tracker, *columns)
                assert len(tracker) == n
                tracker.close()
                gc.collect()
            heap, _ = _timed(best, "add-inline", add_inline, *columns)
            assert len(heap) == n
            del heap
    finally:
        gc.enable()
        shutil.rmtree(root, ignore_errors=True)
    ratios = {
        f"{call}-{kind}": round(best[f"{call}-inline"] / best[f"{call}-{kind}"], 3)
        for call in ("add", "contains")
        for kind in KINDS
    }
    return {
        "n": n,
        "rounds": rounds,
        "build": _impl.IMPLEMENTATION,
        "best_ms": {name: round(seconds * 1e3, 2) for name, seconds in sorted(best.items())},
        "vs_inline": ratios,
    }


if __name__ == "__main__":
    print(json.dumps(run(int(sys.argv[1]), int(sys.argv[2]))))
