"""Group commit: manifest writes per sealed bucket during a burst of seals.

``seal-burst-200``
    A dispatcher adds 201 ledgers of 1 000 delayed messages each, one ``add`` call per message,
    to a DelayIndex on FileStorage (``min_index_count_per_bucket=1000``, merging off, the
    default background thread): 200 seals in a burst, each queueing a snapshot write. Timed:
    the adds plus the ``flush()`` that waits until every sealed bucket is durable. Measured in
    the same run with group commit on (defaults: 512 changes, 4 MiB, 1 ms per batch) and off
    (``group_commit_max_ops=1``), and with group commit on the pure build.
    ``extra_info["manifest_writes_per_seal"]`` is the number of manifest commits the burst made
    divided by 200; with group commit it must be at most 0.2 (asserted). Without, every seal
    costs two writes (create intent, then live record): the two-phase protocol's price for never
    leaving an orphan. For scale, InMemoryTracker (native and pure), heapq + set (the reference)
    and SortedList + set take the same adds; they persist nothing. Redis has no row.

Run::

    pytest benchmarks/bench_group_commit.py --benchmark-enable
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
from support import KIND_LABELS, record, record_rate, slowed

from delayindex import DelayIndex, FileStorage, TrackerConfig, wall_clock_ms

SEALS = 200
PER_BUCKET = 1_000
#: Messages added by one burst (the last ledger stays in the mutable bucket).
MESSAGES = (SEALS + 1) * PER_BUCKET
DAY_MS = 86_400_000
#: The acceptance bar: manifest writes per seal with group commit.
MAX_WRITES_PER_SEAL = 0.2


def _burst(index: DelayIndex, storage: FileStorage, now: int) -> dict[str, Any]:
    before = storage.stats()["commit_manifest"]["calls"]
    add = index.add
    for ledger in range(SEALS + 1):  # the last ledger stays in the mutable bucket
        for entry in range(PER_BUCKET):
            add(ledger, entry, now + DAY_MS + (entry * 7919) % 3_600_000)
    index.flush()
    writes = storage.stats()["commit_manifest"]["calls"] - before
    stats = index.stats()
    return {
        "manifest_writes": writes,
        "manifest_writes_per_seal": round(writes / SEALS, 3),
        "batches": stats["group_commit"]["batches"],
        "durable_buckets": stats["durable_buckets"],
    }


#: (kind, mode) of the group's rows; modes other than the group-commit ones are plain adds.
ROWS = [
    ("delay_index", "group_commit"),
    ("delay_index", "no_group_commit"),
    ("delay_index-pure", "group_commit"),
    ("in_memory", "adds"),
    ("in_memory-pure", "adds"),
    ("heapq", "adds"),
    ("sortedlist", "adds"),
]
LABELS = {
    "group_commit": "group commit (defaults)",
    "no_group_commit": "group commit off (group_commit_max_ops=1)",
}


def _adds(tracker: Any, now: int) -> int:
    add = tracker.add
    for ledger in range(SEALS + 1):
        for entry in range(PER_BUCKET):
            add(ledger, entry, now + DAY_MS + (entry * 7919) % 3_600_000)
    return len(tracker)


@pytest.mark.parametrize(("kind", "mode"), ROWS, ids=[f"{k}-{m}" for k, m in ROWS])
def test_seal_burst(benchmark: Any, env: Any, kind: str, mode: str) -> None:
    group = f"seal-burst-{SEALS}"
    if mode == "adds":
        record(
            benchmark,
            group,
            kind,
            f"{KIND_LABELS[kind]}: the same adds",
            size=MESSAGES,
            seals=SEALS,
        )

        def setup_adds() -> tuple[tuple[Any, ...], dict[str, Any]]:
            return (env.make(kind), wall_clock_ms()), {}

        tracked = benchmark.pedantic(slowed(kind, _adds), setup=setup_adds, rounds=3,
                                     iterations=1)  # fmt: skip
        assert tracked == MESSAGES
        record_rate(benchmark, MESSAGES)
        return
    label = LABELS[mode] + (", pure build" if kind.endswith("-pure") else "")
    record(benchmark, group, kind, label, size=MESSAGES, seals=SEALS)
    config = TrackerConfig(
        min_index_count_per_bucket=PER_BUCKET,
        max_num_buckets=0,
        group_commit_max_ops=512 if mode == "group_commit" else 1,
    )
    made: list[tuple[DelayIndex, FileStorage, Path]] = []

    def setup() -> tuple[tuple[Any, ...], dict[str, Any]]:
        for index, _, path in made:
            index.close()
            shutil.rmtree(path, ignore_errors=True)
        path = env.store()
        storage = FileStorage(path)
        index = DelayIndex.open(storage, "burst", config, clock=env.wall_clock())
        made[:] = [(index, storage, path)]
        return (index, storage, env.wall_clock()()), {}

    figures = benchmark.pedantic(slowed(kind, _burst), setup=setup, rounds=3, iterations=1)
    for index, _, _ in made:
        index.close()
    record_rate(benchmark, MESSAGES)
    benchmark.extra_info.update(figures)
    assert figures["durable_buckets"] == SEALS
    if mode == "group_commit":
        assert figures["manifest_writes_per_seal"] <= MAX_WRITES_PER_SEAL, figures
    else:
        assert figures["manifest_writes_per_seal"] >= 1.0, figures
