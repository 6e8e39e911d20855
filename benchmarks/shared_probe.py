"""The shared-index benchmark's helpers and its memory probe (``bench_shared.py``).

Not a benchmark module (``conftest.py`` puts this directory on ``sys.path``). The probe runs in
a fresh interpreter, as ``bench_memory.py``'s does::

    python -c "import sys, shared_probe; shared_probe.probe_main(sys.argv[1:])" VARIANT N

and prints one JSON object. ``VARIANT`` is one of :data:`VARIANTS`:

``delay_index``
    one DelayIndex holding the ``n`` messages, drained by one consumer;
``delay_index-x10``
    ten DelayIndexes, each holding the same ``n`` messages (what ten subscriptions with a
    delayed index each hold), each drained by its consumer;
``shared``
    one SharedDelayIndex with ten subscriptions, each draining all ``n`` messages;
``shared-stopped``
    the same plus an eleventh subscription that never polls.

Steps: generate the workload (``baselines.delayed_subset``, before any reading); ``gc.collect()``,
``malloc_trim`` and read RSS (``/proc/self/statm``): *before*; open the index(es) on FileStorage
with default settings and a :class:`~delayindex.ManualClock`, fill with ``add_many`` in batches
of 100 000 rows, ``flush()``; collect, trim and read RSS again: *held*; sum the bytes of every
file in the store(s): *disk*; move the clock past every deliver time and drain round robin
(each consumer in turn polls 1000, until every one is empty) while a ``memwatch`` watch samples
this process's resident memory every 20 ms: *drain peak*; collect, trim, read RSS: *drained*.
Per message (over ``n``, whatever the variant): ``rss_bytes_per_msg`` (held - before),
``drain_peak_bytes_per_msg`` (drain peak - before), ``drained_bytes_per_msg`` (drained -
before), ``disk_bytes_per_msg``; and ``disk_bytes``, ``received`` (per consumer),
``reported_bytes_per_msg`` (``memory_usage_bytes()`` summed over the indexes, after the fill),
``due_log`` (keys the shared index's due log holds after the drain).
"""

from __future__ import annotations

import gc
import json
import shutil
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from baselines import _rss_bytes, delayed_subset
from memwatch import PeakMemoryWatch

from delayindex import DelayIndex, FileStorage, ManualClock, SharedDelayIndex
from delayindex._memory import release_free_memory

#: Subscriptions of the shared topic (and DelayIndexes of the ``-x10`` variant).
SUBSCRIPTIONS = 10
#: Messages per poll: each consumer in turn polls this many.
POLL_BATCH = 1000
BATCH_ROWS = 100_000
VARIANTS = ("delay_index", "delay_index-x10", "shared", "shared-stopped")
#: Sampling interval of the drain's memory watch.
WATCH_INTERVAL_S = 0.02


def fill(index: Any, columns: Sequence[Any]) -> None:
    """``add_many`` every row in batches of :data:`BATCH_ROWS`, then ``flush()``."""
    for start in range(0, len(columns[0]), BATCH_ROWS):
        index.add_many(*(column[start : start + BATCH_ROWS] for column in columns))
    index.flush()


def drain_round_robin(
    consumers: Sequence[Any], batch: int = POLL_BATCH, seconds: list[float] | None = None
) -> list[int]:
    """Each consumer in turn polls ``batch`` until every one comes back empty; returns how
    many each received. With ``seconds`` (one float per consumer), adds each consumer's time
    spent inside its polls."""
    received = [0] * len(consumers)
    active = list(range(len(consumers)))
    clock = time.perf_counter
    while active:
        still = []
        for i in active:
            if seconds is None:
                got = len(consumers[i].poll(batch))
            else:
                start = clock()
                got = len(consumers[i].poll(batch))
                seconds[i] += clock() - start
            received[i] += got
            if got:
                still.append(i)
        active = still
    return received


def store_bytes(root: Path) -> int:
    """Bytes of every file below ``root`` (objects, manifest and its history)."""
    return sum(p.stat().st_size for p in root.rglob("*") if p.is_file())


def probe_main(argv: Sequence[str]) -> None:
    """Measure one variant (see the module docstring); prints one JSON object."""
    variant, n = argv[0], int(argv[1])
    if variant not in VARIANTS:
        raise SystemExit(f"unknown variant {variant!r}; expected one of {VARIANTS}")
    columns = delayed_subset(n)
    far_future = int(columns[2].max()) + 1
    clock = ManualClock(0)  # every realistic deliver_at (year 2026) is far in its future
    root = Path(tempfile.mkdtemp(prefix="delayindex-shared-probe-"))
    gc.collect()
    release_free_memory()
    before = _rss_bytes()
    indexes: list[Any]
    if variant.startswith("shared"):
        shared = SharedDelayIndex.open(FileStorage(root), "probe", clock=clock)
        consumers: list[Any] = [shared.subscribe(f"sub-{i}") for i in range(SUBSCRIPTIONS)]
        if variant == "shared-stopped":
            shared.subscribe("stopped")  # never polls
        indexes = [shared]
    else:
        count = SUBSCRIPTIONS if variant.endswith("-x10") else 1
        indexes = [
            DelayIndex.open(FileStorage(root / f"index-{i}"), "probe", clock=clock)
            for i in range(count)
        ]
        consumers = indexes
    for index in indexes:
        fill(index, columns)
    gc.collect()
    release_free_memory()
    held = _rss_bytes()
    reported = sum(index.memory_usage_bytes() for index in indexes)
    disk = store_bytes(root)
    clock.set(far_future)
    watch = PeakMemoryWatch(interval_s=WATCH_INTERVAL_S).start()
    started = time.perf_counter()
    received = drain_round_robin(consumers)
    drain_s = time.perf_counter() - started
    peak = watch.stop()
    gc.collect()
    release_free_memory()
    drained = _rss_bytes()
    if received != [n] * len(consumers):
        raise SystemExit(f"received {received}, expected {n} each")
    result: dict[str, object] = {
        "variant": variant,
        "tracked": n,
        "received": received,
        "rss_bytes_per_msg": (held - before) / n,
        "drain_peak_bytes_per_msg": ((peak.tree_peak_bytes if peak else drained) - before) / n,
        "drained_bytes_per_msg": (drained - before) / n,
        "disk_bytes": disk,
        "disk_bytes_per_msg": disk / n,
        "reported_bytes_per_msg": reported / n,
        "drain_s": drain_s,
    }
    if variant.startswith("shared"):
        result["due_log"] = indexes[0].stats()["due_log"]
    for index in indexes:
        index.close()
    shutil.rmtree(root, ignore_errors=True)
    sys.stdout.write(json.dumps(result) + "\n")
