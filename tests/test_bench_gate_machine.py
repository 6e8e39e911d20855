"""The regression gate's baselines per processor (``benchmarks/gate_machine.py``, ``gate.py``).

A stored baseline gates only runs of the processor that recorded it: the gate reads the
processor from pytest-benchmark's ``machine_info.cpu``, picks the stored baseline of that
processor, refuses (exit 2, saying how to record one) when there is none or when a given
``--baseline`` or one of the runs comes from another processor, and names a baseline written to
a directory after the processor. No benchmark runs here: small synthetic JSON files.
"""

from __future__ import annotations

import importlib
import json
import sys
from pathlib import Path
from typing import Any

import pytest

BENCH_DIR = Path(__file__).resolve().parents[1] / "benchmarks"
if str(BENCH_DIR) not in sys.path:
    sys.path.insert(0, str(BENCH_DIR))
gate = importlib.import_module("gate")
gate_machine = importlib.import_module("gate_machine")

XEON = {"brand_raw": "Intel(R) Xeon(R) Processor", "family": 6, "model": 207, "count": 2}
OTHER_XEON = {**XEON, "model": 143}
EPYC = {"brand_raw": "AMD EPYC", "count": 2}  # a baseline reduced before family/model were kept


def _run(cpu: dict[str, Any] | None, scale: float = 1.0) -> dict[str, Any]:
    """A run of three structures over four groups on ``cpu`` (None: no cpu recorded), with
    DelayIndex's times multiplied by ``scale``."""
    rows = [
        {
            "group": f"tracker-{group}-1e5",
            "name": f"{group}[{kind}]",
            "stats": {"min": 0.01 * (i + 2) * (j + 1) * (scale if kind == "delay_index" else 1)},
            "extra_info": {"kind": kind, "label": f"{kind} row"},
        }
        for i, group in enumerate(("add", "poll", "contains", "cancel"))
        for j, kind in enumerate(("heapq", "delay_index", "in_memory"))
    ]
    machine = {"node": "test"} if cpu is None else {"node": "test", "cpu": cpu}
    return {"machine_info": machine, "benchmarks": rows}


def _write(path: Path, data: dict[str, Any]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data), encoding="utf-8")
    return path


def test_a_processor_is_its_brand_family_and_model() -> None:
    xeon = gate_machine.processor({"cpu": XEON})
    assert xeon == gate_machine.Processor("Intel(R) Xeon(R) Processor", 6, 207)
    assert str(xeon) == "Intel(R) Xeon(R) Processor (family 6, model 207)"
    assert xeon.slug == "intel-xeon-processor-f6-m207"
    assert gate_machine.processor({"cpu": EPYC}) == gate_machine.Processor("AMD EPYC")
    assert gate_machine.processor({"cpu": EPYC}).slug == "amd-epyc"
    assert gate_machine.processor({"node": "x"}) is None
    assert gate_machine.processor({"cpu": {"brand_raw": "  "}}) is None
    assert gate_machine.processor(None) is None


def test_processors_match_by_brand_and_by_family_and_model_where_both_name_them() -> None:
    xeon, other, epyc = (gate_machine.processor({"cpu": c}) for c in (XEON, OTHER_XEON, EPYC))
    brand_only = gate_machine.Processor(XEON["brand_raw"])
    assert xeon.matches(xeon) and brand_only.matches(xeon) and xeon.matches(brand_only)
    assert not xeon.matches(other)  # same brand string, another generation
    assert not xeon.matches(epyc) and not epyc.matches(xeon)


def test_the_stored_baseline_of_the_runs_processor_is_chosen(tmp_path: Path) -> None:
    stored = tmp_path / "baselines"
    epyc = _write(stored / "quick-amd-epyc.json", _run(EPYC))
    xeon = _write(stored / "quick-intel-xeon-processor-f6-m207.json", _run(XEON))
    _write(stored / "quick-intel-xeon-processor.json", _run({"brand_raw": XEON["brand_raw"]}))
    _write(stored / "full-intel-xeon-processor-f6-m207.json", _run(XEON))
    pick = gate_machine.select_baseline
    xeon_cpu = gate_machine.processor({"cpu": XEON})
    assert pick(stored, "quick", xeon_cpu) == (xeon, xeon_cpu)  # exact first
    epyc_cpu = gate_machine.Processor("AMD EPYC")
    assert pick(stored, "quick", gate_machine.processor({"cpu": EPYC})) == (epyc, epyc_cpu)
    assert pick(stored, "quick", gate_machine.Processor("AMD EPYC", 25, 17)) == (epyc, epyc_cpu)
    with pytest.raises(LookupError) as missing:
        pick(stored, "quick", gate_machine.Processor("Ampere Altra", 8, 3))
    message = str(missing.value)
    assert "no stored quick-tier baseline was recorded on this processor, Ampere Altra" in message
    assert "quick-amd-epyc.json (AMD EPYC)" in message and "--record-baseline" in message
    assert str(stored / "quick-ampere-altra-f8-m3.json") in message
    with pytest.raises(LookupError, match="do not say which processor"):
        pick(stored, "quick", None)


def test_the_gate_reads_the_baseline_of_the_runs_processor(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The default baseline is the stored one of the runs' processor; a run 1.3x slower on the
    Xeon fails against the Xeon's baseline, though the EPYC's (as slow) would pass it."""
    stored = tmp_path / "baselines"
    _write(stored / "quick-amd-epyc.json", _run(EPYC, scale=1.3))
    _write(stored / "quick-intel-xeon-processor-f6-m207.json", _run(XEON))
    monkeypatch.setattr(gate, "BASELINE_DIR", stored)
    slower = _write(tmp_path / "run.json", _run(XEON, scale=1.3))
    assert gate.main([str(slower)]) == 1
    out = capsys.readouterr().out
    assert "quick-intel-xeon-processor-f6-m207.json (recorded on Intel(R) Xeon(R)" in out
    same = _write(tmp_path / "same.json", _run(XEON))
    assert gate.main([str(same)]) == 0


def test_no_baseline_of_the_runs_processor_exits_2(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    stored = tmp_path / "baselines"
    _write(stored / "quick-amd-epyc.json", _run(EPYC))
    monkeypatch.setattr(gate, "BASELINE_DIR", stored)
    run = _write(tmp_path / "run.json", _run(XEON))
    assert gate.main([str(run)]) == 2
    err = capsys.readouterr().err
    assert "no stored quick-tier baseline was recorded on this processor, Intel" in err


def test_a_baseline_of_another_processor_is_refused_unless_asked(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    epyc = _write(tmp_path / "epyc.json", _run(EPYC))
    run = _write(tmp_path / "run.json", _run(XEON, scale=1.3))
    assert gate.main([str(run), "--baseline", str(epyc)]) == 2
    err = capsys.readouterr().err
    assert f"{epyc} was recorded on AMD EPYC, the runs on Intel(R) Xeon(R)" in err
    assert "--any-processor" in err
    assert gate.main([str(run), "--baseline", str(epyc), "--any-processor"]) == 1
    unnamed = _write(tmp_path / "unnamed.json", _run(None))  # nothing to check: compared
    assert gate.main([str(unnamed), "--baseline", str(epyc)]) == 0


def test_runs_of_different_processors_are_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    base = _write(tmp_path / "base.json", _run(XEON))
    one = _write(tmp_path / "one.json", _run(XEON))
    two = _write(tmp_path / "two.json", _run(OTHER_XEON))
    assert gate.main([str(one), str(two), "--baseline", str(base)]) == 2
    assert "the runs come from different processors" in capsys.readouterr().err
    assert gate.main([str(one), str(two), "--write-baseline", str(tmp_path / "b.json")]) == 2


def test_a_baseline_written_to_a_directory_is_named_for_the_processor(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    stored = tmp_path / "baselines"
    stored.mkdir()
    runs = [_write(tmp_path / f"run{i}.json", _run(XEON, scale=s)) for i, s in ((1, 1), (2, 1.1))]
    assert gate.main([*map(str, runs), "--write-baseline", str(stored)]) == 0
    written = stored / "quick-intel-xeon-processor-f6-m207.json"
    assert f"wrote 12 records to {written}" in capsys.readouterr().out
    kept = json.loads(written.read_text(encoding="utf-8"))["machine_info"]["cpu"]
    assert (kept["brand_raw"], kept["family"], kept["model"]) == (XEON["brand_raw"], 6, 207)
    assert gate_machine.select_baseline(stored, "quick", gate_machine.processor({"cpu": XEON}))
    unnamed = _write(tmp_path / "unnamed.json", _run(None))
    assert gate.main([str(unnamed), "--write-baseline", str(stored)]) == 2
    assert "needs a file name" in capsys.readouterr().err


def test_every_stored_baseline_names_its_processor_and_gates_every_group() -> None:
    stored = gate_machine.stored_baselines(gate.BASELINE_DIR, "quick")
    assert stored, "benchmarks/baselines/ holds no quick-tier baseline"
    for path, cpu in stored.items():
        assert cpu is not None, f"{path} names no processor"
        records = gate.load_records(path)
        ratios = gate.ratios(records)
        groups = {r.group.rsplit("-", 1)[0] for r in ratios.values()}
        expected = {"tracker-add", "tracker-add-many", "tracker-poll", "tracker-contains",
                    "tracker-tracked-entries", "heap-push-pop", "heap-batch", "memory",
                    "reopen", "seal-latency", "seal-burst"}  # fmt: skip
        assert expected <= groups, path
        kinds = {r["extra_info"].get("kind") for r in records}
        assert {"heapq", "sortedlist", "in_memory", "in_memory-pure", "delay_index",
                "delay_index-pure"} <= kinds, path  # fmt: skip
        same = gate.changes(ratios, ratios, gate._kind(records))
        verdict = gate.compare(same, ratios, ratios, gate.DEFAULT_TOLERANCE)
        ours = [r for r in records if r["extra_info"].get("kind") not in gate.REFERENCE_KINDS]
        assert verdict.ok and verdict.compared == len(ours), path
