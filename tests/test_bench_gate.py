"""Tests of the benchmark regression gate (``benchmarks/gate.py``) and of the suite's slowdown
parser, on small synthetic pytest-benchmark JSON files (no benchmark runs here).

The gate compares each record's own figure with the stored baseline's, divided by the machine
factor (the median change of every time record); it fails when a structure's geometric mean
change passes ``--tolerance`` or one record's change passes ``--row-tolerance``. These tests pin
that: a uniformly slower machine passes, a structure 1.3x slower fails even though no single
record passes the row tolerance, one record 2x slower fails alone, a slower baseline structure
(heapq) is never gated, memory groups compare bytes per message, noise in one run of several
passes, and new or missing records are reported without failing. The committed baselines are
checked in ``test_bench_gate_machine.py``.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

BENCH_DIR = Path(__file__).resolve().parents[1] / "benchmarks"


def _load(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        f"delayindex_bench_{name}", BENCH_DIR / f"{name}.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses resolve their module by name
    spec.loader.exec_module(module)
    return module


gate = _load("gate")

KINDS = ("heapq", "delay_index", "in_memory")
GROUPS = ("add", "poll", "contains", "tracked", "cancel", "reopen")


def _record(group: str, name: str, kind: str, seconds: float, **info: Any) -> dict[str, Any]:
    return {
        "group": group,
        "name": name,
        "stats": {"min": seconds, "median": seconds, "rounds": 3},
        "extra_info": {"label": f"{kind} row", "kind": kind, **info},
    }


def _run(
    scale: float = 1.0,
    kinds: dict[str, float] | None = None,
    slower: dict[str, float] | None = None,
) -> dict[str, Any]:
    """A run: six time groups of three structures and a memory group. ``scale`` multiplies
    every time (the machine), ``kinds[kind]`` every time of a structure, ``slower[name]`` one
    record's time."""
    rows = [
        _record(f"tracker-{g}-1e5", f"{g}[{k}]", k, 0.01 * (i + 1) * (j + 2))
        for i, g in enumerate(GROUPS)
        for j, k in enumerate(KINDS)
    ]
    rows.append(_record("memory-1e5", "mem[heapq]", "heapq", 0.40, rss_bytes_per_msg=230.0))
    rows.append(
        _record("memory-1e5", "mem[delay_index]", "delay_index", 0.30, rss_bytes_per_msg=22.0)
    )
    for row in rows:
        kind = row["extra_info"]["kind"]
        row["stats"]["min"] *= (
            scale * (kinds or {}).get(kind, 1.0) * (slower or {}).get(row["name"], 1.0)
        )
    return {"machine_info": {"node": "test"}, "benchmarks": rows}


def _write(path: Path, data: dict[str, Any]) -> Path:
    path.write_text(json.dumps(data), encoding="utf-8")
    return path


def _gate(tmp_path: Path, run: dict[str, Any], baseline: dict[str, Any], *extra: str) -> int:
    run_file = _write(tmp_path / "run.json", run)
    base_file = _write(tmp_path / "base.json", baseline)
    return int(gate.main([str(run_file), "--baseline", str(base_file), *extra]))


def test_ratios_are_relative_to_the_groups_heapq_row() -> None:
    """What ``delayindex bench`` shows (not what the gate gates)."""
    ratios = gate.ratios(_run()["benchmarks"])
    assert ratios[("tracker-add-1e5", "add[delay_index]")].ratio == pytest.approx(3 / 2)
    assert ratios[("tracker-add-1e5", "add[heapq]")].ratio == pytest.approx(1.0)
    memory = ratios[("memory-1e5", "mem[delay_index]")]
    assert memory.metric == "bytes/msg" and memory.ratio == pytest.approx(22.0 / 230.0)


def test_uniformly_slower_machine_passes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert _gate(tmp_path, _run(scale=3.0), _run()) == 0
    out = capsys.readouterr().out
    assert "machine factor 3.000" in out and "OK: 13 benchmarks" in out


def test_a_structure_slower_than_tolerance_fails_though_no_record_does(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = _run(scale=1.7, kinds={"delay_index": 1.3})
    assert _gate(tmp_path, run, _run()) == 1
    out = capsys.readouterr().out
    assert "REGRESSION: 1 structure(s)" in out and "delay_index: x1.30 over 6 benchmarks" in out
    assert "benchmarks are more than" not in out  # no single record past 50 %
    assert _gate(tmp_path, _run(kinds={"delay_index": 1.1}), _run()) == 0
    assert _gate(tmp_path, _run(kinds={"delay_index": 1.1}), _run(), "--tolerance", "0.05") == 1


def test_a_slowdown_of_every_structure_is_caught_against_the_references(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Two of the three kinds are ours: both 1.3x slower moved the run-wide median with them,
    and every structure read x1.0. The references (heapq) are code we never change."""
    run = _run(scale=1.7, kinds={"delay_index": 1.3, "in_memory": 1.3})
    assert _gate(tmp_path, run, _run(scale=1.0)) == 1
    out = capsys.readouterr().out
    assert "machine factor 1.700" in out and "all structures: x1.30 over 12 benchmarks" in out
    assert _gate(tmp_path, _run(scale=1.7, kinds={"delay_index": 1.1, "in_memory": 1.1}),
                 _run()) == 0  # fmt: skip


def test_a_structures_slowdown_is_not_diluted_by_its_own_records(tmp_path: Path) -> None:
    """Each structure is measured against the other kinds' records only."""
    shares = {("g", f"r{i}"): 1.3 for i in range(8)} | {("g", f"q{i}"): 1.0 for i in range(5)}
    kinds = {key: "delay_index" if key[1][0] == "r" else "heapq" for key in shares}
    factors = gate.gate_factors.kind_factors(shares, kinds, gate.REFERENCE_KINDS)
    assert factors["delay_index"] == 1.0 and factors["heapq"] == 1.3
    assert factors[gate.ALL_KINDS] == 1.0
    # Fewer references than MIN_REFERENCES: every record measures the machine.
    few = {key: kind for key, kind in kinds.items() if key != ("g", "q0")}
    del shares[("g", "q0")]
    assert gate.gate_factors.kind_factors(shares, few, gate.REFERENCE_KINDS)[gate.ALL_KINDS] == 1.3


def test_a_structure_is_gated_on_its_mean_over_the_runs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A record's best change over several runs is gated, but a structure's figure is its
    geometric mean over all of them: the best of two would hide half a slowdown."""
    base = _write(tmp_path / "base.json", _run())
    slow = _write(tmp_path / "a.json", _run(kinds={"delay_index": 1.44}))
    clean = _write(tmp_path / "b.json", _run(scale=2.0))
    assert gate.main([str(slow), str(clean), "--baseline", str(base)]) == 1
    assert "delay_index: x1.20 over 12 benchmarks" in capsys.readouterr().out
    mild = _write(tmp_path / "c.json", _run(kinds={"delay_index": 1.2}))
    assert gate.main([str(mild), str(clean), "--baseline", str(base)]) == 0


def test_one_record_far_slower_fails_and_is_listed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert _gate(tmp_path, _run(slower={"poll[in_memory]": 2.0}), _run()) == 1
    out = capsys.readouterr().out
    assert "REGRESSION: 1 of 13 benchmarks are more than 50% worse" in out
    assert "tracker-poll-1e5: in_memory row [poll[in_memory]]: time x2.00" in out
    # Within 50 %, and the structure's mean (1.4 ** (1/6)) within 15 %:
    assert _gate(tmp_path, _run(slower={"poll[in_memory]": 1.4}), _run()) == 0
    assert _gate(tmp_path, _run(slower={"poll[in_memory]": 1.4}), _run(),
                 "--row-tolerance", "0.2") == 1  # fmt: skip


def test_the_baselines_are_never_gated_but_measure_the_machine(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert _gate(tmp_path, _run(kinds={"heapq": 2.0}), _run()) == 0
    assert _gate(tmp_path, _run(slower={"add[heapq]": 0.5, "poll[heapq]": 3.0}), _run()) == 0
    # Every reference twice as fast and ours unchanged: the machine ran twice as fast, so all
    # our structures together are slower (a reference row itself is never listed).
    capsys.readouterr()
    assert _gate(tmp_path, _run(kinds={"heapq": 0.5}), _run()) == 1
    out = capsys.readouterr().out
    assert "all structures: x2.00 over 12 benchmarks" in out and "heapq row [" not in out


def test_memory_groups_compare_bytes_not_time(tmp_path: Path) -> None:
    # The probe's wall time is not gated:
    slow_probe = _run(slower={"mem[delay_index]": 10.0})
    assert _gate(tmp_path, slow_probe, _run()) == 0
    fatter = _run()
    fatter["benchmarks"][-1]["extra_info"]["rss_bytes_per_msg"] = 40.0  # x1.8: one record
    assert _gate(tmp_path, fatter, _run()) == 1


def test_new_and_missing_are_reported_not_failed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = _run()
    run["benchmarks"].pop(2)  # add[in_memory] missing
    run["benchmarks"].append(_record("seal-burst", "burst[a]", "delay_index", 0.3))
    assert _gate(tmp_path, run, _run()) == 0
    out = capsys.readouterr().out
    assert "new, not in the baseline (1" in out and "burst[a]" in out
    assert "in the baseline but not in this run (1" in out and "add[in_memory]" in out


@pytest.mark.parametrize(
    "content", ["not json", json.dumps({"no": "benchmarks"}), json.dumps({"benchmarks": [{}]})]
)
def test_unreadable_input_exits_2(
    tmp_path: Path, content: str, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text(content, encoding="utf-8")
    base = _write(tmp_path / "base.json", _run())
    assert gate.main([str(bad), "--baseline", str(base)]) == 2
    assert gate.main([str(base), "--baseline", str(bad)]) == 2
    assert gate.main([str(tmp_path / "missing.json"), "--baseline", str(base)]) == 2
    assert "gate: " in capsys.readouterr().err


def test_negative_tolerances_are_refused(tmp_path: Path) -> None:
    assert _gate(tmp_path, _run(), _run(), "--tolerance", "-0.1") == 2
    assert _gate(tmp_path, _run(), _run(), "--row-tolerance", "-0.1") == 2


def test_write_baseline_keeps_what_the_gate_reads(tmp_path: Path) -> None:
    full = _run()
    full["benchmarks"][1]["stats"]["data"] = [0.05] * 100  # pytest-benchmark keeps samples
    full["benchmarks"][1]["extra_info"]["phases"] = {"x": 1}
    source = _write(tmp_path / "run.json", full)
    reduced = tmp_path / "reduced.json"
    assert gate.main([str(source), "--write-baseline", str(reduced)]) == 0
    data = json.loads(reduced.read_text(encoding="utf-8"))
    assert "data" not in data["benchmarks"][1]["stats"]
    assert "phases" not in data["benchmarks"][1]["extra_info"]
    assert gate.ratios(gate.load_records(reduced)) == gate.ratios(full["benchmarks"])
    slower = _write(tmp_path / "slow.json", _run(slower={"poll[delay_index]": 2.0}))
    assert gate.main([str(slower), "--baseline", str(reduced)]) == 1


def test_gate_runs_as_a_script(tmp_path: Path) -> None:
    base = _write(tmp_path / "base.json", _run())
    slow = _write(tmp_path / "slow.json", _run(kinds={"in_memory": 1.3}))
    done = subprocess.run(
        [sys.executable, str(BENCH_DIR / "gate.py"), str(slow), "--baseline", str(base)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 1, done.stderr
    assert "REGRESSION" in done.stdout and "in_memory: x1.30" in done.stdout


def test_several_runs_gate_each_record_on_its_best_change(tmp_path: Path) -> None:
    """Noise in one run (a different record each time) passes; a slowdown in every run fails."""
    base = _write(tmp_path / "base.json", _run())
    noisy_a = _write(tmp_path / "a.json", _run(slower={"add[delay_index]": 2.0}))
    noisy_b = _write(tmp_path / "b.json", _run(slower={"poll[delay_index]": 2.0}))
    assert gate.main([str(noisy_a), "--baseline", str(base)]) == 1  # one run alone: noise fails
    assert gate.main([str(noisy_a), str(noisy_b), "--baseline", str(base)]) == 0
    slow_a = _write(tmp_path / "sa.json", _run(kinds={"delay_index": 1.3}))
    slow_b = _write(tmp_path / "sb.json", _run(scale=2.0, kinds={"delay_index": 1.35}))
    assert gate.main([str(slow_a), str(slow_b), "--baseline", str(base)]) == 1


def test_baseline_from_several_runs_stores_speed_normalized_medians(tmp_path: Path) -> None:
    runs = [
        _write(
            tmp_path / f"r{i}.json",
            _run(scale=scale, slower={"add[delay_index]": factor}),
        )
        for i, (scale, factor) in enumerate([(1.0, 1.0), (2.0, 1.4), (0.5, 3.0)])
    ]
    out = tmp_path / "base.json"
    assert gate.main([*map(str, runs), "--write-baseline", str(out)]) == 0
    stored = gate.ratios(gate.load_records(out))
    # Each run scaled back to the first run's speed: 0.03 x (1.0, 1.4, 3.0) -> median 1.4.
    assert stored[("tracker-add-1e5", "add[delay_index]")].value == pytest.approx(0.03 * 1.4)
    assert stored[("tracker-poll-1e5", "poll[delay_index]")].value == pytest.approx(0.06)
    assert stored[("memory-1e5", "mem[delay_index]")].value == pytest.approx(22.0)
    assert "median figures of 3 runs" in json.loads(out.read_text(encoding="utf-8"))["note"]


# -- the suite's slowdown hook ------------------------------------------------------------------


@pytest.fixture(scope="module")
def support() -> ModuleType:
    return _load("support")


def test_parse_slowdown(support: ModuleType) -> None:
    assert support.parse_slowdown("") == {}
    assert support.parse_slowdown("delay_index:2, in_memory-pure:1.5") == {
        "delay_index": 2.0,
        "in_memory-pure": 1.5,
    }


@pytest.mark.parametrize("text", ["delay_index", "nope:2", "heapq:x", "heapq:0.5", "heapq:nan"])
def test_parse_slowdown_refuses_bad_items(support: ModuleType, text: str) -> None:
    with pytest.raises(ValueError, match="DELAYINDEX_BENCH_SLOWDOWN"):
        support.parse_slowdown(text)


def test_slowed_is_the_function_itself_without_injection(
    support: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(support.SLOWDOWN_ENV, raising=False)
    assert support.slowed("heapq", len) is len
    monkeypatch.setenv(support.SLOWDOWN_ENV, "heapq:3")
    wrapped = support.slowed("heapq", len)
    assert wrapped is not len and wrapped([1, 2]) == 2
    assert support.slowed("delay_index", len) is len


def test_a_simulated_slowdown_equals_the_injected_one(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # The gate on a clean run with --simulate-slowdown says what it says of a run whose
    # structure really was that much slower.
    clean = _run(scale=1.2)
    assert _gate(tmp_path, clean, _run()) == 0
    assert _gate(tmp_path, clean, _run(), "--simulate-slowdown", "delay_index:1.3") == 1
    simulated = capsys.readouterr().out.split("REGRESSION", 1)[1]
    assert _gate(tmp_path, _run(scale=1.2, kinds={"delay_index": 1.3}), _run()) == 1
    injected = capsys.readouterr().out.split("REGRESSION", 1)[1]
    assert simulated == injected and "delay_index: x1.30" in simulated
    # Memory records are not slowed (the injection slows timed calls only).
    records = gate.simulate_slowdown(clean["benchmarks"], "delay_index", 2.0)
    memory = [r for r in records if "rss_bytes_per_msg" in r["extra_info"]]
    assert [r["stats"]["min"] for r in memory] == [
        r["stats"]["min"] for r in clean["benchmarks"] if "rss_bytes_per_msg" in r["extra_info"]
    ]
    assert clean["benchmarks"][1]["stats"]["min"] == pytest.approx(0.01 * 3 * 1.2)  # not mutated


@pytest.mark.parametrize("bad", ["delay_index", "delay_index:0.5", ":1.3", "delay_index:x"])
def test_a_bad_simulated_slowdown_is_refused(tmp_path: Path, bad: str) -> None:
    assert _gate(tmp_path, _run(), _run(), "--simulate-slowdown", bad) == 2


def test_a_simulated_slowdown_of_an_unknown_kind_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert _gate(tmp_path, _run(), _run(), "--simulate-slowdown", "nothing:1.3") == 2
    assert "no time record of kind 'nothing'" in capsys.readouterr().err
    out = tmp_path / "b.json"
    run_file = _write(tmp_path / "r.json", _run())
    code = gate.main(
        [str(run_file), "--simulate-slowdown", "delay_index:1.3", "--write-baseline", str(out)]
    )
    assert code == 2 and not out.exists()


def test_a_record_that_says_it_is_ungated_is_reported_not_gated(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = _run()
    memory = next(r for r in run["benchmarks"] if r["name"] == "mem[delay_index]")
    memory["extra_info"]["rss_bytes_per_msg"] *= 2  # the allocator's luck, say
    assert _gate(tmp_path, run, _run()) == 1  # gated, it fails
    capsys.readouterr()
    memory["extra_info"]["ungated"] = "allocator-dependent"
    assert _gate(tmp_path, run, _run()) == 0
    out = capsys.readouterr().out
    assert "reported, not gated (1):" in out
    assert "mem[delay_index]]: bytes/msg x2.00 of the baseline (+100%); allocator-dependent" in out


def _long_run(stretch: range = range(0), slower: dict[str, float] | None = None) -> dict[str, Any]:
    """A quick tier's worth of records (40 groups of three structures), in execution order;
    the records at the indexes of ``stretch`` 1.6x slower (a slow moment of the machine)."""
    rows = [
        _record(f"g{i}-1e5", f"op{i}[{k}]", k, 0.01 * (1 + i % 7) * (j + 2))
        for i in range(40)
        for j, k in enumerate(KINDS)
    ]
    for n, row in enumerate(rows):
        row["stats"]["min"] *= (1.6 if n in stretch else 1.0) * (slower or {}).get(row["name"], 1.0)
    return {"machine_info": {"node": "test"}, "benchmarks": rows}


def test_a_slow_stretch_of_the_run_is_not_a_regression(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Fifteen consecutive records (reference rows too) 1.6x slower: the machine, for a while.
    assert _gate(tmp_path, _long_run(range(50, 65)), _long_run()) == 0
    # Without the local factor the same run fails: the stretch is what the test is about.
    saved = gate.gate_factors.LOCAL_WINDOW
    try:
        gate.gate_factors.LOCAL_WINDOW = 0
        assert _gate(tmp_path, _long_run(range(50, 65)), _long_run()) == 1
    finally:
        gate.gate_factors.LOCAL_WINDOW = saved
    # One record alone 1.6x slower among unchanged neighbours is still a regression.
    capsys.readouterr()
    assert _gate(tmp_path, _long_run(slower={"op9[delay_index]": 1.6}), _long_run()) == 1
    assert "op9[delay_index]]: time x1.60 of the baseline (+60%)" in capsys.readouterr().out


# -- confirmation rerun (--confirm) -------------------------------------------------------------


def _named(run: dict[str, Any]) -> dict[str, Any]:
    """``run`` with pytest node ids, as a real pytest-benchmark JSON file has them."""
    for row in run["benchmarks"]:
        row["fullname"] = f"benchmarks/bench_x.py::{row['name']}"
    return run


@pytest.fixture
def rerun(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """Replaces the real rerun: ``calls`` records the node ids asked for; ``run`` is the run
    whose records for those ids the rerun returns."""
    state: dict[str, Any] = {"calls": [], "run": _named(_run())}

    def fake(node_ids: list[str], out: Path, tier: str) -> Path:
        state["calls"].append((list(node_ids), tier))
        wanted = set(node_ids)
        rows = [r for r in state["run"]["benchmarks"] if r["fullname"] in wanted]
        return _write(out, {"benchmarks": rows})

    monkeypatch.setattr(gate.gate_confirm, "run_again", fake)
    return state


def test_confirm_reruns_only_a_failing_runs_offenders_and_references(
    tmp_path: Path, rerun: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    # One record 2x slower in the run, as it was in the rerun: confirmed, still a regression.
    rerun["run"] = _named(_run(slower={"add[delay_index]": 2.0}))
    slow = _named(_run(slower={"add[delay_index]": 2.0}))
    assert _gate(tmp_path, slow, _run(), "--confirm") == 1
    assert len(rerun["calls"]) == 2  # still failing after the first: --confirm-rounds (2)
    (ids, tier), again = rerun["calls"]
    assert again == (ids, tier)
    assert tier == "quick" and ids[0] == "benchmarks/bench_x.py::add[delay_index]"
    references = ids[1:]
    assert len(references) == gate.gate_confirm.REFERENCES
    assert not any("heapq" in name or "add[delay_index]" in name for name in references)
    assert "confirmation: 1 offending benchmarks run again" in capsys.readouterr().out
    # A clean run reruns nothing; one round when asked for one.
    assert _gate(tmp_path, _named(_run()), _run(), "--confirm") == 0
    assert len(rerun["calls"]) == 2
    assert _gate(tmp_path, slow, _run(), "--confirm", "--confirm-rounds", "1") == 1
    assert len(rerun["calls"]) == 3


def test_confirm_passes_an_accident_of_one_process(tmp_path: Path, rerun: dict[str, Any]) -> None:
    """A record slow in the run but not in the rerun (a layout or scheduling accident)."""
    noisy = _named(_run(slower={"add[delay_index]": 2.0}))
    assert _gate(tmp_path, noisy, _run()) == 1  # without --confirm it fails
    assert _gate(tmp_path, noisy, _run(), "--confirm") == 0


def test_confirm_keeps_a_structures_slowdown(tmp_path: Path, rerun: dict[str, Any]) -> None:
    rerun["run"] = _named(_run(kinds={"in_memory": 1.3}))
    assert _gate(tmp_path, _named(_run(kinds={"in_memory": 1.3})), _run(), "--confirm") == 1
    (ids, _), _ = rerun["calls"]
    offenders = [name for name in ids if "in_memory" in name]
    assert len(offenders) == len(GROUPS)  # every time record of the slower structure


def test_confirm_reruns_every_structure_when_all_are_slower(
    tmp_path: Path, rerun: dict[str, Any]
) -> None:
    everything = {"delay_index": 1.3, "in_memory": 1.3}
    rerun["run"] = _named(_run(kinds=everything))
    assert _gate(tmp_path, _named(_run(kinds=everything)), _run(), "--confirm") == 1
    (ids, _), _ = rerun["calls"]
    assert sum("heapq" not in name for name in ids) == 2 * len(GROUPS)
    assert any("heapq" in name for name in ids)  # the drift is measured on the references
    # An accident of the first process (the rerun is clean) passes.
    rerun["run"] = _named(_run())
    assert _gate(tmp_path, _named(_run(kinds=everything)), _run(), "--confirm") == 0


def test_confirm_gates_a_structure_on_its_mean_over_the_processes(
    tmp_path: Path, rerun: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    """1.5x in the run and clean in the rerun: x1.22 over the two processes, still failing
    (the better of the two, x1.0, would have let it pass); 1.2x and clean: x1.10, passing."""
    rerun["run"] = _named(_run())
    assert _gate(tmp_path, _named(_run(kinds={"in_memory": 1.5})), _run(), "--confirm",
                 "--confirm-rounds", "1") == 1  # fmt: skip
    assert "in_memory: x1.22 over 12 benchmarks" in capsys.readouterr().out
    assert _gate(tmp_path, _named(_run(kinds={"in_memory": 1.21})), _run(), "--confirm") == 0


def test_confirm_corrects_for_a_machine_that_sped_up(tmp_path: Path, rerun: dict[str, Any]) -> None:
    """The rerun ran 1.3x faster across the board (references too): the slowdown stays."""
    rerun["run"] = _named(_run(scale=1 / 1.3, kinds={"in_memory": 1.3}))
    assert _gate(tmp_path, _named(_run(kinds={"in_memory": 1.3})), _run(), "--confirm") == 1
    # ... and a machine that slowed down does not turn a clean rerun into a regression.
    rerun["run"] = _named(_run(scale=1.5))
    noisy = _named(_run(slower={"add[delay_index]": 2.0}))
    assert _gate(tmp_path, noisy, _run(), "--confirm") == 0


def test_confirm_applies_a_simulated_slowdown_to_the_rerun_too(
    tmp_path: Path, rerun: dict[str, Any]
) -> None:
    clean = _named(_run())
    assert _gate(tmp_path, clean, _run(), "--confirm", "--simulate-slowdown", "in_memory:1.3") == 1
    assert rerun["calls"]


def test_a_failed_rerun_exits_2(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def broken(node_ids: list[str], out: Path, tier: str) -> Path:
        raise gate.gate_confirm.RerunError("confirmation rerun failed (exit 4): ['no tests']")

    monkeypatch.setattr(gate.gate_confirm, "run_again", broken)
    slow = _named(_run(slower={"add[delay_index]": 2.0}))
    assert _gate(tmp_path, slow, _run(), "--confirm") == 2
    assert "confirmation rerun failed" in capsys.readouterr().err


def test_confirm_stops_rerunning_once_it_passes(tmp_path: Path, rerun: dict[str, Any]) -> None:
    noisy = _named(_run(slower={"add[delay_index]": 2.0}))
    assert _gate(tmp_path, noisy, _run(), "--confirm", "--confirm-rounds", "5") == 0
    assert len(rerun["calls"]) == 1


def test_confirm_rounds_must_be_positive(tmp_path: Path) -> None:
    assert _gate(tmp_path, _run(), _run(), "--confirm", "--confirm-rounds", "0") == 2


# -- speed-calibrated figures (benchmarks/calibration.py) -----------------------------------------


def _calibrated(run: dict[str, Any], speed: float = 1.0) -> dict[str, Any]:
    """``run`` as a calibrated tier records it: each time record also carries its time over the
    calibration loop's (``speed``: how slow the loop ran; the raw times keep the noise)."""
    for row in run["benchmarks"]:
        if "rss_bytes_per_msg" not in row["extra_info"]:
            row["extra_info"]["calibrated"] = row["stats"]["min"] * 100 / speed
    return run


def test_calibrated_figures_are_gated_instead_of_raw_times(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Raw times 2x noisy on one record, calibrated figures steady: passes.
    run = _calibrated(_run(slower={"poll[in_memory]": 2.0}), speed=2.0)
    for row in run["benchmarks"]:
        if row["name"] != "poll[in_memory]" and "calibrated" in row["extra_info"]:
            row["extra_info"]["calibrated"] *= 2.0  # only that record's moment was slow
    assert _gate(tmp_path, run, _calibrated(_run())) == 0
    # A structure 1.3x slower in calibrated figures fails although its raw times do not move.
    slower = _calibrated(_run())
    for row in slower["benchmarks"]:
        if row["extra_info"]["kind"] == "delay_index" and "calibrated" in row["extra_info"]:
            row["extra_info"]["calibrated"] *= 1.3
    assert _gate(tmp_path, slower, _calibrated(_run())) == 1
    assert "delay_index: x1.30 over 6 benchmarks" in capsys.readouterr().out


def test_a_calibrated_figure_is_never_compared_with_a_raw_time(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    figures = gate.ratios(_calibrated(_run())["benchmarks"])
    assert figures[("tracker-add-1e5", "add[delay_index]")].metric == "calibrated"
    raw = gate.ratios(_run()["benchmarks"])
    changed = gate.changes(figures, raw, {})
    assert all(c.now.metric == "bytes/msg" for c in changed.values())  # only the memory rows
    assert gate.machine_factor(figures, raw) == 1.0  # nothing comparable: no factor


def test_a_run_and_baseline_of_different_kinds_are_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Nothing would be compared, and a gate that compares nothing must not pass.
    assert _gate(tmp_path, _calibrated(_run()), _run()) == 2
    assert "calibrated on one side only" in capsys.readouterr().err
    assert _gate(tmp_path, _run(), _calibrated(_run())) == 2


def test_simulated_slowdown_and_baselines_carry_the_calibrated_figure(tmp_path: Path) -> None:
    clean = _calibrated(_run())
    records = gate.simulate_slowdown(clean["benchmarks"], "delay_index", 1.3)
    row = next(r for r in records if r["name"] == "add[delay_index]")
    assert row["extra_info"]["calibrated"] == pytest.approx(0.03 * 100 * 1.3)
    assert clean["benchmarks"][1]["extra_info"]["calibrated"] == pytest.approx(3.0)  # kept
    runs = [
        _write(
            tmp_path / f"r{i}.json",
            _calibrated(_run(slower={"add[delay_index]": f}), speed=s),
        )
        for i, (s, f) in enumerate([(1.0, 1.0), (2.0, 1.4), (0.5, 3.0)])
    ]
    out = tmp_path / "base.json"
    assert gate.main([*map(str, runs), "--write-baseline", str(out)]) == 0
    stored = gate.ratios(gate.load_records(out))
    assert stored[("tracker-add-1e5", "add[delay_index]")].metric == "calibrated"
    assert stored[("tracker-add-1e5", "add[delay_index]")].value == pytest.approx(3.0 * 1.4)


@pytest.fixture(scope="module")
def calibration() -> ModuleType:
    return _load("calibration")


def _fake_collector(calibration: ModuleType, loops: list[float]) -> Any:
    """An active collector on a fake clock (one second per reading) whose calibration loops
    take ``loops`` seconds, in turn."""
    ticks = iter(range(10_000))
    times = iter(loops)
    return calibration.begin(
        calibration.Collector(clock=lambda: float(next(ticks)), loop=lambda: next(times))
    )


def test_a_calibrated_call_is_its_time_over_the_loops(calibration: ModuleType) -> None:
    _fake_collector(calibration, [2.0] * 4)
    assert calibration.active()
    wrapped = calibration.timed(lambda x: x + 1)
    assert wrapped(1) == 2 and wrapped(2) == 3
    collector = calibration.end()
    assert collector.figure() == pytest.approx(1 / 2.0)  # 1 s call over a 2 s loop
    assert collector.loops == [2.0] * 4  # before and after each call (1 s apart: not shared)
    assert not calibration.active() and calibration.end() is None


def test_a_calibrated_call_keeps_its_injected_slowdown(calibration: ModuleType) -> None:
    collector = _fake_collector(calibration, [1.0] * 4)
    calibration.timed(lambda: None, factor=3.0)()  # 1 s of its own, busy-waited to 3 s and more
    calibration.timed(lambda: None)()
    calibration.end()
    assert collector.samples == [4.0, 1.0]  # the wait's own last reading counts too
    assert calibration.timed(len, factor=1.0)([1]) == 1  # no collector: just the call


def test_a_sample_takes_the_faster_loop_and_the_figure_the_median_sample(
    calibration: ModuleType,
) -> None:
    # A hiccup in the second loop, a slow third one.
    collector = _fake_collector(calibration, [2.0, 4.0, 3.0, 1.0])
    calibration.timed(lambda: None)()
    calibration.timed(lambda: None)()
    calibration.end()
    assert collector.samples == [1 / 2.0, 1 / 1.0]
    assert collector.figure() == 0.75


def test_a_round_whose_loops_ran_slow_does_not_move_the_figure(calibration: ModuleType) -> None:
    """Five 1 s calls; the last one's loops ran at 1.9 s against 1.0 s (the call's own speed
    unchanged): its sample reads low, and the least sample would have been it (session 21's
    TripleHeap row read x0.64 so)."""
    collector = _fake_collector(calibration, [1.0] * 8 + [1.9, 1.9])
    for _ in range(5):
        calibration.timed(lambda: None)()
    calibration.end()
    assert collector.samples[-1] == pytest.approx(1 / 1.9)
    assert collector.figure() == 1.0
    assert calibration.figure_of(collector.samples) == collector.figure()
    assert calibration.figure_of([]) is None and collector.figure() != min(collector.samples)
