"""Snapshot codec benchmarks: encode and decode rate, and bytes per index on disk.

Groups ``codec-encode-<workload>`` and ``codec-decode-<workload>`` for two workloads, both from
the ``gen-dump`` generator (``delayindex.dump.iter_generated``):

``realistic``
    The default topic (1000 entries per ledger, half delayed; delays 70 % 1-60 s, 25 % 1-60 min,
    5 % 1-10 days): one bucket of the first ~50k delayed indexes, ending at a ledger boundary as
    the online sealing rule would, cut with the default segment rule (300 s, 5000 indexes).
``all-delayed``
    The same with every message delayed (dense entry ids: run containers).

Rows: DelayIndex's snapshot codec with the native kernels (kind ``delay_index``) and on the pure
build (``delay_index-pure``), and the reference ``heapq``: what a heapq + set user would persist,
``pickle`` (protocol 5) of the bucket's ``(deliver_at, ledger, entry)`` tuples, and
``pickle.loads`` to read it back. Encoding starts from the built segments (``build_snapshot``'s
sort and cut are not timed; the pickle does not sort either). Decoding is of the whole stored
object (metadata and every segment). ``extra_info`` records the index count and the bytes per
index on disk (metadata bitmaps included; the pickle's size for heapq). InMemoryTracker,
SortedList and Redis have no snapshot of their own: no rows.

Run::

    pytest benchmarks/bench_codec.py --benchmark-enable
"""

from __future__ import annotations

import pickle
from typing import Any

import numpy as np
import pytest
from support import record, record_rate, slowed

from delayindex.dump import iter_generated
from delayindex.snapshot import build_snapshot, codec

BUCKET = 50_000
WORKLOADS = {"realistic": 0.5, "all-delayed": 1.0}
KINDS = ["delay_index", "delay_index-pure", "heapq"]
LABELS = {
    "delay_index": "DelayIndex snapshot codec",
    "delay_index-pure": "DelayIndex snapshot codec (pure build)",
    "heapq": "heapq list, pickled",
}


class Bucket:
    """One sealed bucket's indexes, its snapshot and the heapq user's pickle of the same."""

    def __init__(self, name: str, delayed_fraction: float) -> None:
        (chunk,) = iter_generated(BUCKET * 3, delayed_fraction=delayed_fraction)
        mask = chunk.delayed_mask
        ledgers, entries = chunk.ledger_ids[mask], chunk.entry_ids[mask]
        times = chunk.deliver_at[mask]
        boundaries = np.flatnonzero(np.diff(ledgers)) + 1
        cut = int(boundaries[np.searchsorted(boundaries, BUCKET)])
        self.name = name
        self.metadata, self.segments = build_snapshot(
            times[:cut],
            ledgers[:cut],
            entries[:cut],
            max_time_step_ms=300_000,
            max_indexes_per_segment=5_000,
        )
        self.data = codec.encode_snapshot(self.metadata, self.segments)
        self.triples = list(
            zip(times[:cut].tolist(), ledgers[:cut].tolist(), entries[:cut].tolist(), strict=True)
        )
        self.pickled = pickle.dumps(self.triples, protocol=5)


@pytest.fixture(scope="module", params=sorted(WORKLOADS))
def bucket(request: pytest.FixtureRequest) -> Bucket:
    return Bucket(request.param, WORKLOADS[request.param])


def _record(benchmark: Any, op: str, kind: str, bucket: Bucket) -> None:
    count = bucket.metadata.num_messages
    size = len(bucket.pickled) if kind == "heapq" else len(bucket.data)
    record(
        benchmark, f"codec-{op}-{bucket.name}", kind, LABELS[kind], size=count,
        indexes=count, bytes_per_index=round(size / count, 3),
        segments=bucket.metadata.num_segments,
    )  # fmt: skip


@pytest.mark.parametrize("kind", KINDS)
def test_decode(benchmark: Any, bucket: Bucket, env: Any, kind: str) -> None:
    _record(benchmark, "decode", kind, bucket)
    rounds = 2 if kind == "delay_index-pure" else 10
    if kind == "heapq":
        loaded = benchmark.pedantic(
            slowed(kind, pickle.loads), args=(bucket.pickled,), rounds=rounds, iterations=1
        )
        assert loaded == bucket.triples
    else:
        decoded_meta, decoded = benchmark.pedantic(
            slowed(kind, codec.decode_snapshot),
            args=(bucket.data, "bench"),
            rounds=rounds,
            iterations=1,
        )
        assert decoded_meta == bucket.metadata
        assert len(decoded) == len(bucket.segments) and decoded[-1] == bucket.segments[-1]
    record_rate(benchmark, bucket.metadata.num_messages)


@pytest.mark.parametrize("kind", KINDS)
def test_encode(benchmark: Any, bucket: Bucket, env: Any, kind: str) -> None:
    _record(benchmark, "encode", kind, bucket)
    if kind == "heapq":
        encoded = benchmark.pedantic(
            slowed(kind, pickle.dumps), args=(bucket.triples, 5), rounds=5, iterations=1
        )
        assert encoded == bucket.pickled
    else:
        encoded = benchmark.pedantic(
            slowed(kind, codec.encode_snapshot),
            args=(bucket.metadata, bucket.segments),
            rounds=5,
            iterations=1,
        )
        assert encoded == bucket.data
    record_rate(benchmark, bucket.metadata.num_messages)
