"""Snapshot codec benchmarks: encode and decode rate, and bytes per index on disk.

Groups ``codec-encode-<workload>`` and ``codec-decode-<workload>`` for two workloads:

``realistic``
    The realistic mix (1000 entries per ledger, half delayed; delays 70 % 1-60 s, 25 % 1-60 min,
    5 % 1-10 days): one bucket of the first ~50k delayed indexes, ending at a ledger boundary as
    the online sealing rule would, cut with the default segment rule (300 s, 5000 indexes).
``all-delayed``
    The same with every message delayed (dense entry ids: run containers).

Each group compares the native kernels with their pure-Python twins on the same bucket. Decoding
is of the whole stored object (metadata and every segment). ``extra_info`` records the index count
and the bytes per index (metadata bitmaps included), which the summary prints with the rates.

Run::

    pytest benchmarks/bench_codec.py --benchmark-enable
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from delayindex import _impl
from delayindex._pure import codec as pure_kernels
from delayindex.snapshot import build_snapshot, codec
from delayindex.workload import generate

BUCKET = 50_000
KERNELS = _impl.CODEC_KERNELS


def _bucket(delayed_fraction: float) -> tuple[Any, list[Any]]:
    w = generate(BUCKET * 3, seed=5, delayed_fraction=delayed_fraction)
    mask = w.delayed_mask
    ledgers, entries, times = w.ledger_ids[mask], w.entry_ids[mask], w.deliver_at[mask]
    boundaries = np.flatnonzero(np.diff(ledgers)) + 1
    cut = int(boundaries[np.searchsorted(boundaries, BUCKET)])
    return build_snapshot(
        times[:cut],
        ledgers[:cut],
        entries[:cut],
        max_time_step_ms=300_000,
        max_indexes_per_segment=5_000,
    )


WORKLOADS = {"realistic": 0.5, "all-delayed": 1.0}


@pytest.fixture(scope="module", params=sorted(WORKLOADS))
def bucket(request: pytest.FixtureRequest) -> tuple[str, Any, list[Any], bytes]:
    metadata, segments = _bucket(WORKLOADS[request.param])
    return request.param, metadata, segments, codec.encode_snapshot(metadata, segments)


@pytest.fixture(params=["native", "pure"])
def kernels(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Point the codec at one kernel implementation for the duration of a benchmark."""
    if request.param == "native":
        module = _impl.native_module_or_none()
        if module is None:
            pytest.fail("the native extension is not built")
    else:
        module = pure_kernels
    for name in KERNELS:
        monkeypatch.setattr(_impl, name, getattr(module, name))
    return str(request.param)


def _record(benchmark: Any, group: str, label: str, metadata: Any, data: bytes) -> None:
    benchmark.group = group
    benchmark.extra_info["label"] = label
    benchmark.extra_info["indexes"] = metadata.num_messages
    benchmark.extra_info["bytes_per_index"] = len(data) / metadata.num_messages
    benchmark.extra_info["segments"] = metadata.num_segments


def test_decode(benchmark: Any, bucket: Any, kernels: str) -> None:
    name, metadata, segments, data = bucket
    _record(benchmark, f"codec-decode-{name}", kernels, metadata, data)
    rounds = 10 if kernels == "native" else 2
    decoded_meta, decoded = benchmark.pedantic(
        codec.decode_snapshot, args=(data, "bench"), rounds=rounds, iterations=1
    )
    assert decoded_meta == metadata
    assert len(decoded) == len(segments) and decoded[-1] == segments[-1]


def test_encode(benchmark: Any, bucket: Any, kernels: str) -> None:
    name, metadata, segments, data = bucket
    _record(benchmark, f"codec-encode-{name}", kernels, metadata, data)
    encoded = benchmark.pedantic(
        codec.encode_snapshot, args=(metadata, segments), rounds=3, iterations=1
    )
    assert encoded == data
