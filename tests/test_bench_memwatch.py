"""Tests of ``benchmarks/memwatch.py``: the run-wide peak memory the benchmark suite reports.

A child process that holds a known amount of memory must show up in the tree's resident bytes
(so Spark's JVM or a memory probe counts toward the full tier's 24 GiB), and a watch must keep
the peak after the child exits.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import time
from pathlib import Path
from types import ModuleType

import pytest

MEMWATCH_PATH = Path(__file__).resolve().parents[1] / "benchmarks" / "memwatch.py"
HELD = 256 * 2**20
CHILD = (
    "import sys; buf = bytearray({held}); buf[::4096] = b'x' * len(buf[::4096]);"
    "print('ready', flush=True); sys.stdin.readline()"
)

pytestmark = pytest.mark.skipif(not Path("/proc/self/statm").exists(), reason="needs Linux /proc")


def _load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("delayindex_bench_memwatch", MEMWATCH_PATH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


memwatch = _load()


def _hold_memory() -> subprocess.Popen[str]:
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD.format(held=HELD)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert child.stdout is not None and child.stdout.readline().strip() == "ready"
    return child


def test_tree_counts_a_child_and_the_watch_keeps_its_peak() -> None:
    before = memwatch.tree_rss_bytes(memwatch.os.getpid())
    watch = memwatch.PeakMemoryWatch(interval_s=0.05).start()
    with _hold_memory() as child:
        assert child.pid in memwatch.tree_pids(memwatch.os.getpid())
        during = memwatch.tree_rss_bytes(memwatch.os.getpid())
        assert during - before >= 0.9 * HELD
        time.sleep(0.2)  # several samples while the child holds its memory
        assert child.stdin is not None
        child.stdin.write("\n")
        child.stdin.flush()
        child.wait(timeout=30)
    peak = watch.stop()
    assert peak is not None and peak.samples >= 2
    assert peak.tree_peak_bytes - before >= 0.9 * HELD
    assert peak.largest_child_maxrss_bytes >= 0.9 * HELD  # reaped: getrusage knows it too
    assert peak.peak_bytes >= peak.tree_peak_bytes
    assert set(peak.as_json()) >= {"peak_bytes", "tree_peak_bytes", "samples"}


def test_a_process_outside_the_tree_is_not_counted() -> None:
    assert 1 not in memwatch.tree_pids(memwatch.os.getpid())
    with pytest.raises(ValueError, match="interval_s"):
        memwatch.PeakMemoryWatch(interval_s=0)
