"""Segment read-ahead: what a due segment costs ``poll`` when the storage is slow.

``readahead-<n>``
    A DelayIndex over a FileStorage whose every read first waits :data:`READ_LATENCY_S` (a
    networked or cold disk; the wait releases the GIL, as real I/O does), prefilled with the
    first ``n`` delayed messages and flushed, so every sealed bucket is durable and its later
    segments are read from storage. Timed: a paced drain, as a dispatcher delivers in real
    time. The clock moves to the deliver time of every 1000th message, ``poll(1000)`` runs
    until nothing is due, and the dispatcher is then idle until its next due time (modelled by
    waiting until the read-ahead has read what it was hinted; the row without read-ahead has
    nothing to wait for). Rows, in the same run: read-ahead on (FileStorage's default) and off
    (``readahead_bytes=0``). ``extra_info``: the time spent inside ``poll`` (``poll_s``: what
    the dispatcher waits for), the longest call, the p99 call, and how many calls took over
    1 ms (``slow_polls``: a load waited for the storage). The rows' own times include the idle
    waits, so they are not gated.

Run::

    pytest benchmarks/bench_readahead.py --benchmark-enable
"""

from __future__ import annotations

import dataclasses
import shutil
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from support import record

from delayindex import DelayIndex, FileStorage, ManualClock
from delayindex.storage._base_raw import ObjectSource

#: What every storage read waits before it reads.
READ_LATENCY_S = 0.002
#: Messages due per step of the paced drain.
STEP_MESSAGES = 1000
BATCH_ROWS = 100_000

pytestmark = pytest.mark.full_tier


class SlowFileStorage(FileStorage):
    """A FileStorage whose reads each wait :data:`READ_LATENCY_S` first."""

    @contextmanager
    def _open(self, key: str) -> Iterator[ObjectSource]:
        with super()._open(key) as src:
            inner = src.read

            def read(offset: int, length: int) -> bytes:
                time.sleep(READ_LATENCY_S)
                return inner(offset, length)

            yield dataclasses.replace(src, read=read)


def _paced_drain(index: DelayIndex, clock: ManualClock, store: FileStorage, steps: Any) -> Any:
    calls: list[float] = []
    ahead = store._readahead
    if ahead is not None:  # idle until the first due time: the hints given at the seals land
        ahead.wait_idle()
    for due in steps:
        clock.set(due)
        while True:
            started = time.perf_counter()
            batch = index.poll(STEP_MESSAGES)
            calls.append(time.perf_counter() - started)
            if not batch:
                break
        if ahead is not None:
            ahead.wait_idle()
    return np.asarray(calls), len(index)


@pytest.mark.parametrize("readahead", [True, False], ids=["on", "off"])
def test_readahead(benchmark: Any, delayed: Any, size_id: str, readahead: bool) -> None:
    label = "DelayIndex, read-ahead " + ("on" if readahead else "off")
    record(benchmark, f"readahead-{size_id}", "delay_index", label, size=len(delayed))
    benchmark.extra_info["ungated"] = "includes the dispatcher's modelled idle time"
    benchmark.extra_info["read_latency_ms"] = READ_LATENCY_S * 1000
    order = np.sort(delayed.deliver_at)
    steps = [int(t) for t in order[STEP_MESSAGES - 1 :: STEP_MESSAGES]] + [delayed.far_future_ms]
    path = Path(tempfile.mkdtemp(prefix="delayindex-readahead-"))
    store = SlowFileStorage(path) if readahead else SlowFileStorage(path, readahead_bytes=0)
    clock = ManualClock(delayed.now_ms)
    index = DelayIndex.open(store, "bench", clock=clock)
    try:
        for start in range(0, len(delayed), BATCH_ROWS):
            stop = start + BATCH_ROWS
            index.add_many(
                delayed.ledgers[start:stop], delayed.entries[start:stop],
                delayed.deliver_at[start:stop],
            )  # fmt: skip
        index.flush()
        calls, left = benchmark.pedantic(
            _paced_drain, args=(index, clock, store, steps), rounds=1, iterations=1
        )
        assert left == 0
        benchmark.extra_info.update(
            poll_s=round(float(calls.sum()), 4),
            poll_max_ms=round(float(calls.max()) * 1000, 3),
            poll_p99_ms=round(float(np.percentile(calls, 99)) * 1000, 3),
            slow_polls=int((calls > 0.001).sum()),
            polls=len(calls),
            readahead=store.readahead_stats(),
        )
    finally:
        index.close()
        store.close()
        shutil.rmtree(path, ignore_errors=True)
