"""Regression gate: compare benchmark runs with a stored baseline, the machine's speed taken out.

Each record's own figure is compared with the same record in the baseline (matched by
``(group, name)``): ``change = (run / baseline) / machine factor`` for times and ``run /
baseline`` for bytes. The figure is, by preference, ``extra_info["calibrated"]``: the median of
the record's timed calls, each over the time of a fixed loop run beside it (``calibration.py``;
the quick tier records it), which takes out the machine's slow stretches that a row's
consecutive rounds fall into together. Otherwise it is ``stats.min``; for memory groups
(records with ``extra_info["rss_bytes_per_msg"]``) the bytes per message. A calibrated figure is
only ever compared with a calibrated one. The **machine factor** is the median of ``run /
baseline`` over every time record of the run: a machine uniformly slower or faster than the
baseline's moves every record alike and cancels out, and the median over ~100 records is not
moved by a few noisy ones. (The earlier gate divided each record by its group's heapq row
instead; but a heapq row is one pure-Python set of tuples whose speed moves 1.3-1.6x with the
memory layout the earlier benchmarks left, and every row of its group moved with it.)

Two checks, both must pass:

* **per structure** (``extra_info["kind"]``: DelayIndex, InMemoryTracker, each pure build,
  TripleHeap, the shared index): the geometric mean of its time records' changes must stay within
  ``--tolerance`` (default 0.15). A structure made slower shows in all its records at once,
  while the noise of single records (up to about 1.3x between clean runs on a shared 2-core
  machine) averages out over the 15-20 records of a structure;
* **per record**: no single record's change beyond ``--row-tolerance`` (default 0.5), for a
  regression confined to one operation, and for the memory records (bytes per message).

The per-record check divides by the machine factor *of the moment*: the median change of the
:data:`LOCAL_WINDOW` records run before and after the record (:func:`local_factors`), since a
shared machine has slow stretches that the run-wide median does not see.

The baselines (heapq, SortedList, Redis rows) are compared too, in the machine factor, but
never gated; so is a record whose ``extra_info["ungated"]`` says why it cannot be (the memory
row of DelayIndex under glibc's default allocator settings, which moves up to 1.7x with the
allocator's luck: its ``-tuned`` twin is gated instead). Several runs of the same tier: each
record is gated on its best change over them.
New records (not in the baseline) and missing ones are reported, never failed.

**Confirmation** (``--confirm``, what ``delayindex bench --gate`` uses): when a run fails, its
offenders (each record past the row tolerance, every time record of a structure past the
tolerance) are run again at once in a fresh pytest process, beside a few unflagged records as a
speed reference, and each is gated on its best change over the runs; while some still fail, up
to ``--confirm-rounds`` (default 2) reruns are made. A slowdown in the code shows in every run;
an accident of one process (single records moved up to 1.9x between clean runs on a shared
2-core machine) rarely shows twice. A rerun is put on the first run's scale (its machine
factors), corrected by its speed on the references (``gate_confirm.scales``), so a machine that
sped up meanwhile cannot hide a slowdown.

Usage (from the repository root)::

    pytest benchmarks --benchmark-enable --bench-tier quick --benchmark-json run.json
    # exit 0: no regression; 1: regressions, listed; 2: unreadable input
    python benchmarks/gate.py run.json --baseline benchmarks/baseline-quick.json
    # refresh the stored baseline from clean runs (median figures; what the gate reads)
    python benchmarks/gate.py run1.json run2.json run3.json \
        --write-baseline benchmarks/baseline-quick.json

    # demonstrate a failure: make DelayIndex's timed calls 1.3 times as slow
    DELAYINDEX_BENCH_SLOWDOWN=delay_index:1.3 pytest benchmarks --benchmark-enable \
        --bench-tier quick --benchmark-json slow.json
    python benchmarks/gate.py slow.json            # exit 1: delay_index listed
    # the same on a clean run, without running it again: the injection busy-waits each timed
    # call to factor times its duration, so it scales the structure's time figures exactly
    python benchmarks/gate.py run.json --simulate-slowdown delay_index:1.3
    # a failing run's offenders run again before the verdict (see Confirmation)
    python benchmarks/gate.py run.json --confirm

The baseline may be a full pytest-benchmark JSON file or the reduced form written by
``--write-baseline`` (the same keys, fewer of them). Standard library only, so the gate runs
wherever Python does; ``delayindex bench`` imports :func:`load_records` and :func:`ratios` (each
record's ratio to its group's heapq row, for its table) from here.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import tempfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# Loaded by path (the CLI, the tests) as well as run as a script: find the sibling module.
sys.path.insert(0, str(Path(__file__).resolve().parent))
import calibration
import gate_confirm
from gate_report import report

DEFAULT_BASELINE = Path(__file__).resolve().parent / "baseline-quick.json"
DEFAULT_TOLERANCE = 0.15
DEFAULT_ROW_TOLERANCE = 0.5
REFERENCE_KIND = "heapq"
#: The baselines we compare against (not ours to gate).
REFERENCE_KINDS = frozenset({"heapq", "heapq-inline", "sortedlist", "redis"})
#: extra_info keys kept by --write-baseline (what the gate, the plots and the docs read).
KEPT_INFO = (
    "label",
    "kind",
    "size",
    "rss_bytes_per_msg",
    "bytes_per_index",
    "msgs_per_s",
    "reported_bytes_per_msg",
    "max_add_ms",
    "manifest_writes_per_seal",
    "slowdown_injected",
    "ungated",
    calibration.INFO_KEY,
)

Key = tuple[str, str]


class GateInputError(ValueError):
    """A run or baseline file that cannot be read as benchmark records."""


@dataclass(frozen=True)
class Ratio:
    """A record's figure against its group's heapq row (lower is better)."""

    group: str
    name: str
    label: str
    metric: str  # "time", "calibrated" (over the machine's speed: calibration) or "bytes/msg"
    value: float
    ratio: float | None  # None: the group has no single heapq row


def load_records(path: Path) -> list[dict[str, Any]]:
    """The benchmark records of a pytest-benchmark JSON file (full or reduced form).

    Raises:
        GateInputError: the file is missing, not JSON, or has no ``benchmarks`` list.
    """
    return _records_of(_read(path), path)


def _read(path: Path) -> Any:
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise GateInputError(f"cannot read {path}: {exc}") from None


def _records_of(data: Any, path: Path) -> list[dict[str, Any]]:
    records = data.get("benchmarks") if isinstance(data, dict) else None
    if not isinstance(records, list):
        raise GateInputError(f"{path}: no 'benchmarks' list (not pytest-benchmark JSON)")
    for record in records:
        if not isinstance(record, dict) or "name" not in record or "stats" not in record:
            raise GateInputError(f"{path}: a record without name or stats: {record!r:.200}")
    return records


def _figure(record: dict[str, Any], memory: bool) -> float:
    if memory:
        return float(record["extra_info"]["rss_bytes_per_msg"])
    if calibration.INFO_KEY in record["extra_info"]:
        return float(record["extra_info"][calibration.INFO_KEY])
    return float(record["stats"]["min"])


def _metric(record: dict[str, Any], memory: bool) -> str:
    if memory:
        return "bytes/msg"
    return "calibrated" if calibration.INFO_KEY in record["extra_info"] else "time"


def _comparable(now: Ratio, before: Ratio | None) -> bool:
    """Both time figures of one kind (a calibrated figure is not compared with a raw time)."""
    return (
        before is not None and now.metric == before.metric and now.metric != "bytes/msg"
        and before.value > 0
    )  # fmt: skip


def ratios(records: Iterable[dict[str, Any]]) -> dict[Key, Ratio]:
    """Every record's own figure (``value``: min time, or bytes/msg for memory groups) and its
    ratio to the heapq row of its group (what ``delayindex bench`` shows), by ``(group, name)``."""
    groups: dict[str, list[dict[str, Any]]] = {}
    for record in records:
        record.setdefault("extra_info", {})
        groups.setdefault(str(record.get("group") or record["name"]), []).append(record)
    out: dict[Key, Ratio] = {}
    for group, members in groups.items():
        memory = all("rss_bytes_per_msg" in r["extra_info"] for r in members)
        refs = [r for r in members if r["extra_info"].get("kind") == REFERENCE_KIND]
        base = _figure(refs[0], memory) if len(refs) == 1 else None
        for record in members:
            value = _figure(record, memory)
            ratio = value / base if base else None
            name = str(record["name"])
            out[(group, name)] = Ratio(
                group=group,
                name=name,
                label=str(record["extra_info"].get("label") or name),
                metric=_metric(record, memory),
                value=value,
                ratio=ratio,
            )
    return out


def parse_simulated(text: str) -> tuple[str, float]:
    """``KIND:FACTOR`` of ``--simulate-slowdown`` (ValueError if malformed)."""
    kind, sep, factor = text.partition(":")
    try:
        value = float(factor)
    except ValueError:
        value = float("nan")
    if not (sep and kind and value >= 1.0):
        raise ValueError(f"expected KIND:FACTOR with FACTOR >= 1, got {text!r}")
    return kind, value


def simulate_slowdown(
    records: list[dict[str, Any]], kind: str, factor: float
) -> list[dict[str, Any]]:
    """``records`` with the time figures of ``kind``'s records multiplied by ``factor``: what
    ``DELAYINDEX_BENCH_SLOWDOWN=kind:factor`` would have measured (it busy-waits each timed
    call to ``factor`` times its duration). Memory records are left alone, as the injection
    leaves them. Raises GateInputError when no time record has that kind."""
    out, hit = [], 0
    for record in records:
        info = record.get("extra_info") or {}
        if info.get("kind") == kind and "rss_bytes_per_msg" not in info:
            stats = {
                k: v * factor if k in _TIME_STATS and isinstance(v, int | float) else v
                for k, v in record["stats"].items()
            }
            if calibration.INFO_KEY in info:
                info = {**info, calibration.INFO_KEY: info[calibration.INFO_KEY] * factor}
            record = {**record, "stats": stats, "extra_info": info}
            hit += 1
        out.append(record)
    if not hit:
        raise GateInputError(f"--simulate-slowdown: no time record of kind {kind!r}")
    return out


#: The per-round time statistics a slowdown scales (pytest-benchmark's names).
_TIME_STATS = frozenset({"min", "max", "mean", "median", "q1", "q3", "stddev", "iqr", "total"})


def _ungated(records: Iterable[dict[str, Any]]) -> dict[Key, str]:
    """The records that say they are reported, not gated (``extra_info["ungated"]``: why)."""
    return {
        (str(r.get("group") or r["name"]), str(r["name"])): str(r["extra_info"]["ungated"])
        for r in records
        if r.get("extra_info", {}).get("ungated")
    }


def _kind(records: Iterable[dict[str, Any]]) -> dict[Key, str]:
    return {
        (str(r.get("group") or r["name"]), str(r["name"])): str(r["extra_info"].get("kind", ""))
        for r in records
    }


@dataclass(frozen=True)
class Change:
    """A record's figure against the baseline's, the machine's speed taken out."""

    now: Ratio
    before: Ratio
    kind: str
    # (now / before) / machine factor; memory: now / before. 1.0 = unchanged
    change: float
    # What the per-record check gates: ``change``, with the machine factor of the moment the
    # record ran (its neighbours in the run) instead of the whole run's; see local_factors.
    row_change: float = 0.0

    def __post_init__(self) -> None:
        if not self.row_change:
            object.__setattr__(self, "row_change", self.change)


def machine_factor(run: dict[Key, Ratio], baseline: dict[Key, Ratio]) -> float:
    """How much slower this machine ran the whole run than the baseline's: the median over
    every time record present in both of ``run / baseline`` (1.0 when none)."""
    shares = [
        run[key].value / baseline[key].value
        for key in run
        if _comparable(run[key], baseline.get(key))
    ]
    return statistics.median(shares) if shares else 1.0


#: Time records on each side of a record whose median share is its local machine factor:
#: about six seconds of the quick tier each way, inside the slow stretches seen (about 20 s).
LOCAL_WINDOW = 6


def local_factors(
    run: dict[Key, Ratio], baseline: dict[Key, Ratio], order: Sequence[Key]
) -> dict[Key, float]:
    """Each time record's *local* machine factor: the median ``run / baseline`` of the
    :data:`LOCAL_WINDOW` time records run before it and after it (``order``: the run's
    execution order, as pytest-benchmark lists its records), itself excluded.

    A shared machine has slow stretches: in one clean run, every benchmark of a 20-second
    stretch (codec decode, reopen, replay; reference rows too) ran 1.5-1.6x slower. The
    run-wide factor does not see a stretch, a local one does; a regression of one operation
    does not move its neighbours' median. Records with fewer than three neighbours in the
    baseline get no local factor (the run-wide one applies)."""
    timed = [key for key in order if key in run and _comparable(run[key], baseline.get(key))]
    shares = [run[key].value / baseline[key].value for key in timed]
    out = {}
    for i, key in enumerate(timed):
        window = shares[max(i - LOCAL_WINDOW, 0) : i] + shares[i + 1 : i + 1 + LOCAL_WINDOW]
        if len(window) >= 3:
            out[key] = statistics.median(window)
    return out


def changes(
    run: dict[Key, Ratio],
    baseline: dict[Key, Ratio],
    kinds: dict[Key, str],
    order: Sequence[Key] = (),
) -> dict[Key, Change]:
    """Each record's :class:`Change` (records in both; reference kinds included). With the
    run's execution ``order``, each time record's ``row_change`` uses its local machine factor
    (:func:`local_factors`)."""
    factor = machine_factor(run, baseline)
    local = local_factors(run, baseline, order)
    out = {}
    for key, now in run.items():
        before = baseline.get(key)
        if before is None or before.value <= 0 or now.metric != before.metric:
            continue
        kind = kinds.get(key, "")
        row_change = 0.0
        if now.metric != "bytes/msg":
            change = now.value / before.value / factor
            if key in local:
                row_change = now.value / before.value / local[key]
        else:
            change = now.value / before.value
        out[key] = Change(now, before, kind, change, row_change)
    return out


def _mixed_metrics(run: dict[Key, Ratio], baseline: dict[Key, Ratio]) -> list[Key]:
    """Time records in both whose figures are of different kinds (calibrated against raw): they
    cannot be compared, and a gate that compared nothing would pass."""
    return sorted(
        key for key, now in run.items()
        if key in baseline and now.metric != baseline[key].metric
    )  # fmt: skip


def best_changes(runs: Sequence[dict[Key, Change]]) -> dict[Key, Change]:
    """Each record's best (lowest) change over several runs of the same tier: a real
    slowdown shows in every run, a noisy moment of a shared machine rarely in all."""
    out: dict[Key, Change] = {}
    for run in runs:
        for key, change in run.items():
            if key not in out:
                out[key] = change
                continue
            best = out[key]
            out[key] = Change(
                best.now if best.change <= change.change else change.now,
                best.before,
                best.kind,
                min(best.change, change.change),
                min(best.row_change, change.row_change),
            )
    return out


def median_baseline(paths: Sequence[Path]) -> dict[str, Any]:
    """A baseline whose every record carries its median figure over the runs ``paths``, each
    run's times first scaled to the first run's machine speed (:func:`machine_factor`)."""
    reduced = reduce_run(paths[0])
    if len(paths) == 1:
        return reduced
    per_run = [ratios(load_records(path)) for path in paths]
    first = per_run[0]
    factors = [machine_factor(run, first) for run in per_run]
    for record in reduced["benchmarks"]:
        key = (str(record.get("group") or record["name"]), str(record["name"]))
        held = first.get(key)
        if held is None:
            continue
        scale = 1.0 if held.metric == "bytes/msg" else None
        values = [
            run[key].value / (scale or factor)
            for run, factor in zip(per_run, factors, strict=True)
            if key in run and run[key].metric == held.metric
        ]
        median = statistics.median(values)
        if held.metric == "bytes/msg":
            record["extra_info"]["rss_bytes_per_msg"] = median
        elif held.metric == "calibrated":
            record["extra_info"][calibration.INFO_KEY] = median
        else:
            record["stats"]["min"] = median
    reduced["note"] += f"; median figures of {len(paths)} runs, speed-normalized"
    return reduced


@dataclass
class Verdict:
    """What :func:`compare` found."""

    regressions: list[Change]  # single records past the row tolerance
    slower_kinds: list[tuple[str, float, int]]  # (kind, geometric mean change, records)
    improvements: list[Change]
    compared: int
    kinds: dict[str, tuple[float, int]]
    new: list[Ratio]
    missing: list[Ratio]
    factor: float
    reported: list[tuple[Change, str]] = field(default_factory=list)  # ungated: (change, why)

    @property
    def ok(self) -> bool:
        """No structure and no single record is past its tolerance."""
        return not self.regressions and not self.slower_kinds


def compare(
    run: dict[Key, Change],
    run_figures: dict[Key, Ratio],
    baseline: dict[Key, Ratio],
    tolerance: float,
    row_tolerance: float = DEFAULT_ROW_TOLERANCE,
    factor: float = 1.0,
    ungated: dict[Key, str] | None = None,
) -> Verdict:
    """Gate the changes (see the module doc): per structure (kind) on the geometric mean of
    its records' changes against ``tolerance``; per record against ``row_tolerance``. Records
    in ``ungated`` (their ``extra_info["ungated"]``: why) are reported, not gated."""
    verdict = Verdict([], [], [], 0, {}, [], [], factor)
    per_kind: dict[str, list[float]] = {}
    for key, change in sorted(run.items()):
        if change.kind in REFERENCE_KINDS:
            continue  # the baselines are not ours to gate
        if ungated and key in ungated:
            verdict.reported.append((change, ungated[key]))
            continue
        verdict.compared += 1
        if change.now.metric != "bytes/msg":  # memory records are gated one by one
            per_kind.setdefault(change.kind, []).append(change.change)
        if change.row_change > 1 + row_tolerance:
            verdict.regressions.append(change)
        elif change.change < 1 / (1 + tolerance):
            verdict.improvements.append(change)
    for kind, values in sorted(per_kind.items()):
        mean = math.exp(statistics.fmean(math.log(max(v, 1e-12)) for v in values))
        verdict.kinds[kind] = (mean, len(values))
        if mean > 1 + tolerance:
            verdict.slower_kinds.append((kind, mean, len(values)))
    verdict.new = [r for key, r in sorted(run_figures.items()) if key not in baseline]
    verdict.missing = [r for key, r in sorted(baseline.items()) if key not in run_figures]
    return verdict


def reduce_run(path: Path) -> dict[str, Any]:
    """The parts of a pytest-benchmark JSON file a baseline keeps."""
    data = _read(path)
    records = _records_of(data, path)
    machine = data.get("machine_info") or {}
    cpu = machine.get("cpu") or {}
    return {
        "note": "reduced pytest-benchmark JSON of a quick-tier run; see benchmarks/gate.py",
        "machine_info": {
            **{
                key: machine.get(key)
                for key in ("node", "machine", "python_version", "release", "system")
            },
            "cpu": {key: cpu.get(key) for key in ("brand_raw", "count", "hz_actual_friendly")},
        },
        "commit_info": {
            key: data.get("commit_info", {}).get(key) for key in ("id", "dirty", "branch")
        },
        "datetime": data.get("datetime"),
        "benchmarks": [
            {
                "group": record.get("group"),
                "name": record["name"],
                "stats": {key: record["stats"].get(key) for key in ("min", "median", "rounds")},
                "extra_info": {
                    key: record.get("extra_info", {})[key]
                    for key in KEPT_INFO
                    if key in record.get("extra_info", {})
                },
            }
            for record in records
        ],
    }


def build_parser() -> argparse.ArgumentParser:
    """The gate's command line."""
    parser = argparse.ArgumentParser(
        prog="python benchmarks/gate.py",
        description="Fail when a structure (the geometric mean of its benchmarks) or a single "
        "benchmark got slower than the stored baseline by more than the tolerance, the "
        "machine's speed taken out. Exit 0 ok, 1 regression, 2 bad input.",
    )
    parser.add_argument(
        "run",
        type=Path,
        nargs="+",
        help="pytest-benchmark JSON of the run to check; with several runs of the same tier, "
        "each benchmark's best change is gated (with --write-baseline: its median is stored)",
    )
    parser.add_argument(
        "--baseline",
        type=Path,
        default=DEFAULT_BASELINE,
        help="stored baseline (default: benchmarks/baseline-quick.json)",
    )
    parser.add_argument(
        "--tolerance",
        type=float,
        default=DEFAULT_TOLERANCE,
        help="allowed slowdown of a structure: the geometric mean of its benchmarks' changes "
        "(default 0.15 = 15%%)",
    )
    parser.add_argument(
        "--row-tolerance",
        type=float,
        default=DEFAULT_ROW_TOLERANCE,
        help="allowed slowdown of any single benchmark (default 0.5 = 50%%)",
    )
    parser.add_argument(
        "--simulate-slowdown",
        metavar="KIND:FACTOR",
        help="multiply the time figures of one structure (an extra_info kind, e.g. "
        "delay_index) in every run by FACTOR before gating: checks on clean runs that the gate "
        "would catch that slowdown",
    )
    parser.add_argument(
        "--confirm",
        action="store_true",
        help="when the run fails, run its offenders again at once (with a few other records as "
        "a speed reference) and gate each on its best change over the runs",
    )
    parser.add_argument(
        "--confirm-rounds",
        type=int,
        default=2,
        help="with --confirm: reruns at most (each of what still fails; default 2)",
    )
    parser.add_argument(
        "--tier",
        default="quick",
        help="with --confirm: the --bench-tier of the rerun (default quick, as the run's)",
    )
    parser.add_argument(
        "--write-baseline",
        type=Path,
        metavar="OUT",
        help="write the runs' reduced form (median figures) to OUT as the new baseline, exit",
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the gate; returns the exit code."""
    args = build_parser().parse_args(argv)
    if not (args.tolerance >= 0 and args.row_tolerance >= 0 and args.confirm_rounds >= 1):
        print(
            "gate: --tolerance and --row-tolerance must be >= 0, --confirm-rounds >= 1",
            file=sys.stderr,
        )
        return 2
    try:
        simulated = (
            None if args.simulate_slowdown is None else parse_simulated(args.simulate_slowdown)
        )
    except ValueError as exc:
        print(f"gate: {exc}", file=sys.stderr)
        return 2
    if simulated is not None and args.write_baseline is not None:
        print("gate: --simulate-slowdown does not go with --write-baseline", file=sys.stderr)
        return 2
    try:
        if args.write_baseline is not None:
            reduced = median_baseline(args.run)
            args.write_baseline.write_text(json.dumps(reduced, indent=1) + "\n", encoding="utf-8")
            print(f"wrote {len(reduced['benchmarks'])} records to {args.write_baseline}")
            return 0
        baseline = ratios(load_records(args.baseline))
        runs, merged, factors, ungated, every = [], {}, [], {}, []
        for path in args.run:
            records = load_records(path)
            every.extend(records)
            ungated.update(_ungated(records))
            if simulated is not None:
                records = simulate_slowdown(records, *simulated)
            run = ratios(records)
            factors.append(machine_factor(run, baseline))
            order = [(str(r.get("group") or r["name"]), str(r["name"])) for r in records]
            runs.append(changes(run, baseline, _kind(records), order))
            merged.update(run)
    except (GateInputError, OSError) as exc:
        print(f"gate: {exc}", file=sys.stderr)
        return 2
    mixed = _mixed_metrics(merged, baseline)
    if mixed:
        print(
            f"gate: {len(mixed)} timed records are calibrated on one side only (e.g. "
            f"{mixed[0][1]}): record the baseline with the run's tier (quick: calibrated)",
            file=sys.stderr,
        )
        return 2
    best = best_changes(runs)
    factor = statistics.median(factors)
    verdict = compare(best, merged, baseline, args.tolerance, args.row_tolerance, factor, ungated)
    print(f"gate: {', '.join(map(str, args.run))} against {args.baseline}")
    for _ in range(args.confirm_rounds if args.confirm else 0):
        if verdict.ok:
            break
        try:
            best, note = _confirm(verdict, every, best, args.tier, simulated)
        except (GateInputError, gate_confirm.RerunError, OSError) as exc:
            print(f"gate: {exc}", file=sys.stderr)
            return 2
        print(note)
        verdict = compare(
            best, merged, baseline, args.tolerance, args.row_tolerance, factor, ungated
        )
    for line in report(verdict, args.tolerance, args.row_tolerance):
        print(line)
    return 0 if verdict.ok else 1


def _confirm(
    verdict: Verdict,
    records: list[dict[str, Any]],
    best: dict[Key, Change],
    tier: str,
    simulated: tuple[str, float] | None,
) -> tuple[dict[Key, Change], str]:
    """Run the offenders again (see Confirmation in the module doc); each record's better
    change of the runs so far and this one, and a line saying what was run."""
    names = {
        (str(r.get("group") or r["name"]), str(r["name"])): str(r["fullname"])
        for r in records
        if r.get("fullname")
    }
    offenders, references = gate_confirm.targets(
        {(c.now.group, c.now.name) for c in verdict.regressions},
        {kind for kind, _, _ in verdict.slower_kinds},
        {key: (c.kind, c.now.metric, c.now.value) for key, c in best.items()},
        names,
        REFERENCE_KINDS,
    )
    if not offenders:
        return best, "confirmation: no offender has a pytest node id; nothing run again"
    with tempfile.TemporaryDirectory(prefix="gate-confirm-") as tmp:
        out = gate_confirm.run_again(
            [names[k] for k in offenders + references], Path(tmp) / "rerun.json", tier
        )
        rerun = load_records(out)
    if simulated is not None and any(
        (r.get("extra_info") or {}).get("kind") == simulated[0] for r in rerun
    ):
        rerun = simulate_slowdown(rerun, *simulated)
    again = ratios(rerun)
    figures = {key: (r.value, r.metric) for key, r in again.items()}
    scales = gate_confirm.scales({k: c.now.value for k, c in best.items()}, figures, references)
    confirmed = {
        key: Change(again[key], was.before, was.kind, was.change * scale, was.row_change * scale)
        for key, scale in scales.items()
        for was in (best[key],)
    }
    note = (
        f"confirmation: {len(offenders)} offending benchmarks run again (with "
        f"{len(references)} references); each gated on its best change over the runs"
    )
    return best_changes([best, confirmed]), note


if __name__ == "__main__":
    sys.exit(main())
