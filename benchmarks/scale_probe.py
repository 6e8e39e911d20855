"""``DelayIndex.add_many`` + ``flush`` of the first ``N`` realistic delayed messages on
FileStorage, in a fresh process (not a pytest-benchmark module)::

    python benchmarks/scale_probe.py N            # DELAYINDEX_NO_EXTENSIONS=1 for the pure build

Batches of 100 000 rows, as ``reopen_store`` fills (``bench_delay_index.py``); the clock is a
ManualClock a day before the first message, so all are tracked. The flush waits for every seal,
snapshot and merge the fill queued: the background writer's work counts. Prints one JSON object:
``seconds`` (the fill and the flush), ``add_many_s``, ``flush_s``, the bucket count, and each
thread's CPU seconds (``main_cpu_s``, ``writer_cpu_s``: where the time went).
"""

import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from baselines import delayed_subset

from delayindex import NATIVE, DelayIndex, FileStorage, ManualClock
from delayindex.workload import DAY_MS

BATCH_ROWS = 100_000


def _thread_cpu_seconds() -> list[float]:
    """CPU seconds of each thread of this process, largest first (Linux /proc)."""
    tick = os.sysconf("SC_CLK_TCK")
    out = []
    for stat in Path("/proc/self/task").glob("*/stat"):
        fields = stat.read_text().rsplit(")", 1)[1].split()
        out.append((int(fields[11]) + int(fields[12])) / tick)
    return sorted(out, reverse=True)


def main(n: int) -> dict[str, object]:
    ledgers, entries, deliver_at = delayed_subset(n)
    now = int(deliver_at.min()) - DAY_MS
    path = Path(tempfile.mkdtemp(prefix="delayindex-scale-"))
    try:
        index = DelayIndex.open(FileStorage(path), "scale", clock=ManualClock(now))
        started = time.perf_counter()
        for start in range(0, n, BATCH_ROWS):
            stop = start + BATCH_ROWS
            index.add_many(ledgers[start:stop], entries[start:stop], deliver_at[start:stop])
        filled = time.perf_counter()
        index.flush()
        flushed = time.perf_counter()
        cpu = _thread_cpu_seconds()
        result = {
            "n": n,
            "native": NATIVE,
            "tracked": len(index),
            "seconds": flushed - started,
            "add_many_s": filled - started,
            "flush_s": flushed - filled,
            "buckets": index.stats()["buckets"],
            "main_cpu_s": cpu[0] if cpu else None,
            "writer_cpu_s": cpu[1] if len(cpu) > 1 else None,
        }
        index.close()
        return result
    finally:
        shutil.rmtree(path, ignore_errors=True)


if __name__ == "__main__":
    print(json.dumps(main(int(float(sys.argv[1])))))
