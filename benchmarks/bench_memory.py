"""Memory benchmark: resident bytes per tracked message, each tracker in a fresh interpreter.

Group ``memory-<largest n>`` (``1e6`` by default). For each variant a subprocess
(``sys.executable -c``, same environment, ``PYTHONPATH`` extended with ``src`` and this
directory) runs :func:`baselines.probe_main`, which

1. generates the realistic workload and slices out the first ``n`` delayed messages (numpy
   arrays) - before measuring;
2. reads RSS from ``/proc/self/statm`` (resident pages x page size) after ``gc.collect()``;
3. adds the ``n`` messages (all tracked), runs ``gc.collect()`` and reads RSS again;
4. prints ``(RSS after - RSS before) / n`` and, for InMemoryTracker, its own
   ``memory_usage_bytes() / len``.

Variants: ``delay_index-add_many`` (DelayIndex with default settings on FileStorage,
``add_many`` in batches of 100 000 rows, then ``flush()``), ``in_memory-add_many``,
``in_memory-add`` (per-call ``add``) and the baseline ``heapq`` (``HeapqSetTracker``, per-call
``add``). Both RSS readings follow ``gc.collect()`` and ``malloc_trim`` (freed heap pages back to
the OS), for every variant alike. Per-call variants convert the
arrays to Python ints in chunks of 4096 rows as they add them, so a tracker that keeps
references to the ints (the baseline's tuples do) is charged for them, as it would be in a
broker, while the input lists of pre-converted ints would otherwise share them and hide ~3 ints
(~80-96 B) per message.

The timed part is the subprocess run itself (one round; it includes interpreter start-up and
workload generation, so the time is not a tracker speed). The figures are stored in
``benchmark.extra_info`` (``rss_bytes_per_msg``, ``reported_bytes_per_msg``; they appear in
``--benchmark-json`` output) and printed in the terminal summary. Expected at 1e6: about 25 B per
message for InMemoryTracker, 160-260 B for heapq + set.

Run::

    pytest benchmarks/bench_memory.py --benchmark-enable
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import delayindex

BENCH_DIR = Path(__file__).resolve().parent
SRC_DIR = Path(delayindex.__file__).resolve().parent.parent

PROBE_CODE = "import sys, baselines; baselines.probe_main(sys.argv[1:])"
LABELS = {
    "delay_index-add_many": "DelayIndex add_many",
    "in_memory-add_many": "InMemoryTracker add_many",
    "in_memory-add": "InMemoryTracker add",
    "heapq": "heapq+set",
}


def _probe_env() -> dict[str, str]:
    env = dict(os.environ)
    paths = [str(SRC_DIR), str(BENCH_DIR)]
    if env.get("PYTHONPATH"):
        paths.append(env["PYTHONPATH"])
    env["PYTHONPATH"] = os.pathsep.join(paths)
    return env


def _run_probe(variant: str, n: int) -> dict[str, Any]:
    completed = subprocess.run(
        [sys.executable, "-c", PROBE_CODE, variant, str(n)],
        env=_probe_env(),
        cwd=BENCH_DIR,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    if completed.returncode != 0:
        raise AssertionError(
            f"memory probe {variant} failed ({completed.returncode}):\n{completed.stderr}"
        )
    result: dict[str, Any] = json.loads(completed.stdout.strip().splitlines()[-1])
    return result


@pytest.mark.parametrize("variant", list(LABELS))
def test_memory(benchmark: Any, max_size: int, max_size_id: str, variant: str) -> None:
    benchmark.group = f"memory-{max_size_id}"
    benchmark.extra_info["label"] = LABELS[variant]

    result = benchmark.pedantic(_run_probe, args=(variant, max_size), rounds=1, iterations=1)
    assert result["tracked"] == max_size
    benchmark.extra_info["rss_bytes_per_msg"] = round(result["rss_bytes_per_msg"], 2)
    if "buckets" in result:
        benchmark.extra_info["buckets"] = result["buckets"]
    if "reported_bytes_per_msg" in result:
        benchmark.extra_info["reported_bytes_per_msg"] = round(result["reported_bytes_per_msg"], 2)
