"""The main job (``delayindex demo``): dump, Spark rebuild, open, dispatch, verify, drain."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from delayindex.demo import run_demo

pytestmark = pytest.mark.spark


def test_pipeline_verifies_end_to_end(spark: Any, tmp_path: Path) -> None:
    stages: list[str] = []
    result = run_demo(20_000, seed=3, workdir=tmp_path, spark=spark, progress=stages.append)
    assert result.ok, result.as_dict()
    assert len(stages) == 5  # dump, rebuild, open + dispatch, verify, drain (Spark given)
    assert 0 < result.expected < result.messages  # about half are delayed
    assert result.recovered == result.expected == result.delivered
    assert result.buckets >= 1 and result.snapshot_bytes > 0
    assert 0 < result.short_dispatch_delivered < result.expected
    assert result.verify_ok and result.verify_findings == {}
    assert result.lost == result.early == result.delivered_twice == result.objects_left == 0
    assert (tmp_path / "topic.parquet").exists()  # a given workdir is kept


def test_pipeline_result_flags_problems() -> None:
    from delayindex.demo import DemoResult

    good = DemoResult(expected=5, recovered=5, verify_ok=True)
    assert good.ok
    for broken in (
        {"lost": 1},
        {"early": 1},
        {"delivered_twice": 1},
        {"unexpected": 1},
        {"objects_left": 1},
        {"verify_ok": False},
        {"recovered": 4},
        {"rejected_rows": 1},
    ):
        fields: dict[str, Any] = {"expected": 5, "recovered": 5, "verify_ok": True, **broken}
        assert not DemoResult(**fields).ok
