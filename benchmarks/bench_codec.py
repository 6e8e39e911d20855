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
``pickle.loads`` to read it back.

Encoding is what sealing a bucket costs DelayIndex, from the bucket's ``(deliver_at, ledger,
entry)`` arrays (here in the generator's position order) to the stored bytes:
``build_snapshot`` as ``DelayIndex`` calls it (``validate=False``; the sort by time, the segment
cut, each segment's bitmaps and packed times) then ``encode_snapshot`` (metadata, compression,
framing). Both steps are timed: ``build_snapshot`` already packs the segments, so timing
``encode_snapshot`` of its result alone would leave most of the encoding out. The heapq row
pickles its tuples as they are (a heap needs no sort to be saved). Decoding is of the whole
stored object (metadata and every segment). ``extra_info`` records the index count and the bytes
per index on disk (metadata bitmaps included; the pickle's size for heapq). InMemoryTracker,
SortedList and Redis have no snapshot of their own: no rows.

Run::

    pytest benchmarks/bench_codec.py --benchmark-enable
"""

from __future__ import annotations

import pickle
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest
from support import record, record_rate, slowed

from delayindex import TrackerConfig
from delayindex.dump import iter_generated
from delayindex.snapshot import build_snapshot, codec

Int64Array = npt.NDArray[np.int64]

BUCKET = 50_000
#: The default segment cut rule (300 s, 5000 indexes per segment).
SEGMENT_SPAN_MS = TrackerConfig().max_time_step_per_segment_ms
SEGMENT_INDEXES = TrackerConfig().max_indexes_per_segment
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
        self.columns = (times[:cut], ledgers[:cut], entries[:cut])
        self.metadata, self.segments = build_snapshot(
            *self.columns,
            max_time_step_ms=SEGMENT_SPAN_MS,
            max_indexes_per_segment=SEGMENT_INDEXES,
        )
        self.data = codec.encode_snapshot(self.metadata, self.segments)
        self.triples = list(zip(*(column.tolist() for column in self.columns), strict=True))
        self.pickled = pickle.dumps(self.triples, protocol=5)


def seal(times: Int64Array, ledgers: Int64Array, entries: Int64Array) -> bytes:
    """A bucket's stored object from its indexes, as DelayIndex builds it when sealing."""
    metadata, segments = build_snapshot(
        times,
        ledgers,
        entries,
        max_time_step_ms=SEGMENT_SPAN_MS,
        max_indexes_per_segment=SEGMENT_INDEXES,
        validate=False,  # as DelayIndex._build: positions from the dedup index are distinct
    )
    return codec.encode_snapshot(metadata, segments)


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
            slowed(kind, seal), args=bucket.columns, rounds=5, iterations=1
        )
        assert encoded == bucket.data
    record_rate(benchmark, bucket.metadata.num_messages)
