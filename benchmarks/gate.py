"""Regression gate: compare benchmark runs with a stored baseline, the machine's speed taken out.

Each record's own figure is compared with the same record in the baseline (matched by
``(group, name)``): ``change = (run / baseline) / machine factor`` for times and ``run /
baseline`` for bytes. The figure (``gate_records``) is, by preference,
``extra_info["calibrated"]``: the median of the record's timed calls, each over the time of a
fixed loop run beside it (``calibration.py``; the quick tier records it), which takes out the
machine's slow stretches that a row's consecutive rounds fall into together. Otherwise it is
``stats.min``; for memory groups (records with ``extra_info["rss_bytes_per_msg"]``) the bytes
per message. A calibrated figure is only ever compared with a calibrated one.

The **machine factor** is a median of ``run / baseline`` over other records: a machine
uniformly slower or faster than the baseline's moves every record alike and cancels out. Which
records depends on the check (``gate_factors``), so that no slowdown can move its own measure.
Three checks, all must pass:

* **per structure** (``extra_info["kind"]``: DelayIndex, InMemoryTracker, each pure build,
  TripleHeap, the shared index): the geometric mean of its time records' changes, each over the
  median of every *other* kind's records, must stay within ``--tolerance`` (default 0.15). A
  structure made slower shows in all its records at once, while the noise of single records
  averages out over the records of a structure;
* **all structures together** (``all structures``): the geometric mean of every gated time
  record's change over the median of the *references* (heapq, SortedList, Redis rows: code this
  project never changes), within the same tolerance: a slowdown of everything we own;
* **per record**: no single record's change beyond ``--row-tolerance`` (default 0.5), for a
  regression confined to one operation, and for the memory records (bytes per message). It
  divides by the machine factor *of the moment*: the median of the
  ``gate_factors.LOCAL_WINDOW`` records run before and after the record, since a shared machine
  has slow stretches that a run-wide median does not see.

The baselines (heapq, SortedList, Redis rows) are never gated themselves; neither is a record
whose ``extra_info["ungated"]`` says why it cannot be (the memory row of DelayIndex under glibc's
default allocator settings, which moves up to 1.7x with the allocator's luck: its ``-tuned``
twin is gated instead). New records (not in the baseline) and missing ones are reported, never
failed.

**Several runs** of the same tier (``delayindex bench --gate`` makes two, each in its own
process): each record is gated on its best change over them, each structure on the geometric
mean of its records over all of them. A structure's speed moves with its process (the shared
index's records read 0.8-1.2x of the baseline in clean runs, together); the mean of two
processes halves that luck's spread, where the best of two would hide half a slowdown.

**Confirmation** (``--confirm``, what ``delayindex bench --gate`` uses): when the runs fail,
the offenders (each record past the row tolerance, every time record of a structure past the
tolerance) are run again at once in a fresh pytest process, beside a few unflagged records as a
speed reference. Each record is then gated on its best change over the processes, and each
failing structure on its mean over all of them: one process more makes its figure more
precise, where taking its better figure would let a real slowdown pass on one lucky process.
While some still fail, up to ``--confirm-rounds`` (default 2) reruns are made. A rerun is put
on the first runs' scale (their machine factors), corrected by its speed on the references
(``gate_confirm.scales``), so a machine that sped up meanwhile cannot hide a slowdown.

**One baseline per processor** (``gate_machine``): ``benchmarks/baselines/`` holds a baseline
for each processor the suite was recorded on (``quick-<processor>.json``), and the gate reads the
one of the runs' processor. A baseline of another processor cannot gate a run (its relative
speeds of Python and native code differ, by up to 1.7x between two structures on unchanged
code): the gate refuses it (exit 2) and says how to record one, rather than give a verdict.

Usage (from the repository root)::

    pytest benchmarks --benchmark-enable --bench-tier quick --benchmark-json run.json
    # exit 0: no regression; 1: regressions, listed; 2: unreadable input, or no baseline
    # recorded on this processor
    python benchmarks/gate.py run.json
    # record this processor's baseline from clean runs (median figures; what the gate reads),
    # named for the processor; or: delayindex bench --record-baseline
    python benchmarks/gate.py run1.json run2.json run3.json --write-baseline benchmarks/baselines

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
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# Loaded by path (the CLI, the tests) as well as run as a script: find the sibling module.
sys.path.insert(0, str(Path(__file__).resolve().parent))
import calibration
import gate_confirm
import gate_factors
import gate_machine
from gate_factors import ALL_KINDS
from gate_records import (
    GateInputError,
    Key,
    Ratio,
    comparable,
    load_records,
    ratios,
    reduce_run,
)
from gate_report import report

#: The stored baselines, one per tier and processor (``gate_machine``): ``quick-<slug>.json``.
BASELINE_DIR = Path(__file__).resolve().parent / "baselines"
DEFAULT_TOLERANCE = 0.15
DEFAULT_ROW_TOLERANCE = 0.5
#: The baselines we compare against (not ours to gate).
REFERENCE_KINDS = frozenset({"heapq", "heapq-inline", "sortedlist", "redis"})


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
    # (now / before) / its kind's machine factor; memory: now / before. 1.0 = unchanged
    change: float
    # What the per-record check gates: the share over the machine factor of the moment the
    # record ran (its neighbours in the run); see gate_factors.local_factors.
    row_change: float = 0.0
    # What the check over all our structures gates: the share over the references' factor.
    overall: float = 0.0

    def __post_init__(self) -> None:
        for name in ("row_change", "overall"):
            if not getattr(self, name):
                object.__setattr__(self, name, self.change)

    def scaled(self, now: Ratio, scale: float) -> Change:
        """This change with ``now`` as its figure and every change multiplied by ``scale``."""
        return Change(
            now, self.before, self.kind, self.change * scale, self.row_change * scale,
            self.overall * scale,
        )  # fmt: skip


def _shares(run: dict[Key, Ratio], baseline: dict[Key, Ratio]) -> dict[Key, float]:
    """``run / baseline`` of every time record comparable in both (see ``gate_factors``)."""
    return {
        key: now.value / before.value
        for key, now in run.items()
        for before in (baseline.get(key),)
        if comparable(now, before)
    }


def machine_factor(
    run: dict[Key, Ratio], baseline: dict[Key, Ratio], kinds: dict[Key, str] | None = None
) -> float:
    """How much slower this machine ran the run than the baseline's: the median ``run /
    baseline`` over the reference records (``kinds``' :data:`REFERENCE_KINDS`, at least
    ``gate_factors.MIN_REFERENCES`` of them), else over every time record present in both
    (1.0 when none)."""
    shares = _shares(run, baseline)
    return gate_factors.kind_factors(shares, kinds or {}, REFERENCE_KINDS)[ALL_KINDS]


def changes(
    run: dict[Key, Ratio],
    baseline: dict[Key, Ratio],
    kinds: dict[Key, str],
    order: Sequence[Key] = (),
) -> dict[Key, Change]:
    """Each record's :class:`Change` (records in both; reference kinds included): ``change``
    over its kind's factor, ``overall`` over the references', and, with the run's execution
    ``order``, ``row_change`` over its local factor (``gate_factors``)."""
    shares = _shares(run, baseline)
    factors = gate_factors.kind_factors(shares, kinds, REFERENCE_KINDS)
    local = gate_factors.local_factors(shares, order)
    out = {}
    for key, now in run.items():
        before = baseline.get(key)
        if before is None or before.value <= 0 or now.metric != before.metric:
            continue
        kind = kinds.get(key, "")
        if key in shares:
            share = shares[key]
            out[key] = Change(
                now, before, kind, share / factors[kind], share / local.get(key, factors[kind]),
                share / factors[ALL_KINDS],
            )  # fmt: skip
        else:  # memory: bytes per message, no machine speed in it
            out[key] = Change(now, before, kind, now.value / before.value)
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
                min(best.overall, change.overall),
            )
    return out


def structures(
    runs: Sequence[dict[Key, Change]], ungated: Collection[Key] = ()
) -> dict[str, tuple[float, int]]:
    """Each structure's ``(figure, records)``: the geometric mean of the changes of its gated
    time records over every run in ``runs`` (several processes: one process's luck averages
    out, a slowdown stays), and :data:`ALL_KINDS`'s over every gated time record of ours."""
    pool: dict[str, list[float]] = {}
    for run in runs:
        for key, change in run.items():
            if (
                change.kind in REFERENCE_KINDS or key in ungated
                or change.now.metric == "bytes/msg"
            ):  # fmt: skip
                continue
            pool.setdefault(change.kind, []).append(change.change)
            pool.setdefault(ALL_KINDS, []).append(change.overall)
    return {
        kind: (math.exp(statistics.fmean(math.log(max(v, 1e-12)) for v in values)), len(values))
        for kind, values in sorted(pool.items())
    }


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
    kinds: dict[str, tuple[float, int]] | None = None,
) -> Verdict:
    """Gate the changes (see the module doc): each structure's figure in ``kinds`` (default:
    :func:`structures` of ``run`` alone) against ``tolerance``; each record's ``row_change``
    against ``row_tolerance``. Records in ``ungated`` (their ``extra_info["ungated"]``: why) are
    reported, not gated."""
    verdict = Verdict([], [], [], 0, {}, [], [], factor)
    for key, change in sorted(run.items()):
        if change.kind in REFERENCE_KINDS:
            continue  # the baselines are not ours to gate
        if ungated and key in ungated:
            verdict.reported.append((change, ungated[key]))
            continue
        verdict.compared += 1
        if change.row_change > 1 + row_tolerance:
            verdict.regressions.append(change)
        elif change.change < 1 / (1 + tolerance):
            verdict.improvements.append(change)
    verdict.kinds = kinds if kinds is not None else structures([run], ungated or {})
    verdict.slower_kinds = [
        (kind, mean, n) for kind, (mean, n) in verdict.kinds.items() if mean > 1 + tolerance
    ]
    verdict.new = [r for key, r in sorted(run_figures.items()) if key not in baseline]
    verdict.missing = [r for key, r in sorted(baseline.items()) if key not in run_figures]
    return verdict


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
        default=None,
        help="the baseline to gate against (default: the one in benchmarks/baselines/ of the "
        "tier recorded on the runs' processor)",
    )
    parser.add_argument(
        "--any-processor",
        action="store_true",
        help="compare with a --baseline recorded on another processor anyway (its verdict "
        "then mixes the two processors' relative speeds with the code's changes)",
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
        help="the runs' --bench-tier: the rerun's with --confirm, the stored baseline's name "
        "(default quick)",
    )
    parser.add_argument(
        "--write-baseline",
        type=Path,
        metavar="OUT",
        help="write the runs' reduced form (median figures) to OUT as the new baseline, exit; "
        "OUT a directory: the file is named for the tier and the runs' processor there",
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
    baseline_path, held, problem = _baseline_for(args)
    if problem:
        print(f"gate: {problem}", file=sys.stderr)
        return 2
    try:
        if args.write_baseline is not None:
            reduced = median_baseline(args.run)
            baseline_path.write_text(json.dumps(reduced, indent=1) + "\n", encoding="utf-8")
            print(f"wrote {len(reduced['benchmarks'])} records to {baseline_path}")
            return 0
        baseline = ratios(load_records(baseline_path))
        runs, merged, factors, ungated, every = [], {}, [], {}, []
        for path in args.run:
            records = load_records(path)
            every.extend(records)
            ungated.update(_ungated(records))
            if simulated is not None:
                records = simulate_slowdown(records, *simulated)
            run = ratios(records)
            factors.append(machine_factor(run, baseline, _kind(records)))
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
    kinds = structures(runs, ungated)
    factor = statistics.median(factors)
    limits = (args.tolerance, args.row_tolerance, factor, ungated)
    verdict = compare(best, merged, baseline, *limits, kinds)
    print(
        f"gate: {', '.join(map(str, args.run))} against {baseline_path}"
        + (f" (recorded on {held})" if held is not None else "")
    )
    for _ in range(args.confirm_rounds if args.confirm else 0):
        if verdict.ok:
            break
        try:
            best, kinds, note = _confirm(verdict, every, best, runs, ungated, args.tier, simulated)
        except (GateInputError, gate_confirm.RerunError, OSError) as exc:
            print(f"gate: {exc}", file=sys.stderr)
            return 2
        print(note)
        verdict = compare(best, merged, baseline, *limits, kinds)
    for line in report(verdict, args.tolerance, args.row_tolerance):
        print(line)
    return 0 if verdict.ok else 1


def _baseline_for(
    args: argparse.Namespace,
) -> tuple[Path, gate_machine.Processor | None, str]:
    """The baseline file to read (or, with ``--write-baseline``, to write), the processor it
    names (None: unknown, or a file to write), and a problem line ("" when none): runs of
    different processors, no stored baseline for the runs' processor, or a ``--baseline``
    recorded on another one (``gate_machine`` says why that cannot gate)."""
    cpu, mixed = gate_machine.common_processor(args.run)
    if mixed:
        return Path(), None, "the runs come from different processors: " + "; ".join(mixed)
    if args.write_baseline is not None:
        if not args.write_baseline.is_dir():
            return args.write_baseline, None, ""
        if cpu is None:
            return Path(), None, "the runs name no processor: --write-baseline needs a file name"
        return args.write_baseline / gate_machine.baseline_name(args.tier, cpu), None, ""
    if args.baseline is None:
        try:
            return (*gate_machine.select_baseline(BASELINE_DIR, args.tier, cpu), "")
        except LookupError as exc:
            return Path(), None, str(exc)
    held = gate_machine.processor_of(args.baseline)
    if args.any_processor or cpu is None or held is None or held.matches(cpu):
        return args.baseline, held, ""
    refused = (
        f"{args.baseline} was recorded on {held}, the runs on {cpu}: a baseline gates only "
        "runs of its own processor (Python bytecode and compiled code change speed by "
        "different factors between processors); record one here (delayindex bench "
        "--record-baseline), or pass --any-processor to compare anyway"
    )
    return Path(), None, refused


def _confirm(
    verdict: Verdict,
    records: list[dict[str, Any]],
    best: dict[Key, Change],
    runs: list[dict[Key, Change]],
    ungated: dict[Key, str],
    tier: str,
    simulated: tuple[str, float] | None,
) -> tuple[dict[Key, Change], dict[str, tuple[float, int]], str]:
    """Run the offenders again (see Confirmation in the module doc). Returns each record's
    better change of the runs so far and this one, each structure's figure (a structure that
    failed: its mean over every process so far, this rerun of all its records appended to
    ``runs``), and a line saying what was run."""
    names = {
        (str(r.get("group") or r["name"]), str(r["name"])): str(r["fullname"])
        for r in records
        if r.get("fullname")
    }
    slow = {kind for kind, _, _ in verdict.slower_kinds}
    if ALL_KINDS in slow:  # every structure's records are the offenders
        slow |= {c.kind for c in best.values() if c.kind not in REFERENCE_KINDS}
    offenders, references = gate_confirm.targets(
        {(c.now.group, c.now.name) for c in verdict.regressions},
        slow,
        {key: (c.kind, c.now.metric, c.now.value) for key, c in best.items()},
        names,
        REFERENCE_KINDS,
    )
    if not offenders:
        note = "confirmation: no offender has a pytest node id; nothing run again"
        return best, verdict.kinds, note
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
    confirmed = {key: best[key].scaled(again[key], scale) for key, scale in scales.items()}
    runs.append(confirmed)
    pooled = structures(runs, ungated)
    kinds = {kind: pooled[kind] if kind in slow else held for kind, held in verdict.kinds.items()}
    note = (
        f"confirmation: {len(offenders)} offending benchmarks run again (with "
        f"{len(references)} references); each gated on its best change over the runs"
    )
    return best_changes([best, confirmed]), kinds, note


if __name__ == "__main__":
    sys.exit(main())
