"""Regression gate: compare a benchmark run with a stored baseline, relative to heapq.

Absolute times depend on the machine and on its load, so the gate never compares them. For each
benchmark record it computes a **ratio to the group's heapq row measured in the same run**:

* time groups: ``stats.min / stats.min of the heapq row``;
* memory groups (records with ``extra_info["rss_bytes_per_msg"]``): bytes per message over the
  heapq row's bytes per message.

Lower is better. A record **fails** when its ratio is more than ``--tolerance`` (default 0.25,
i.e. 25 %) worse than the same record's ratio in the baseline: ``run > baseline * (1 + tol)``.
Records are matched by ``(group, name)``. New records (not in the baseline), missing ones (not
in the run) and groups without exactly one heapq row are reported, never failed. The heapq row
itself is the yardstick (ratio 1) and cannot fail.

Noise: on a shared 2-core machine one quick-tier run can put any single record, the heapq
row included, 25-90 % off for a few seconds. So the gate takes **several runs** of the same
tier: each record is gated on its best ratio over them (:func:`best_ratios`; a real slowdown
shows in every run, noise rarely in all), and the stored baseline holds each record's median
ratio over several clean runs (:func:`median_baseline`). One run still works, with more noise.

Usage (from the repository root)::

    # 1. run the quick tier twice (or more), keeping pytest-benchmark's JSON
    for i in 1 2; do pytest benchmarks --benchmark-enable --bench-tier quick \
        --benchmark-json run$i.json; done
    # 2. gate them (exit 0: no regression; 1: regressions, listed; 2: unreadable input)
    python benchmarks/gate.py run1.json run2.json --baseline benchmarks/baseline-quick.json
    # refresh the stored baseline from clean runs (median ratios; only what the gate reads)
    python benchmarks/gate.py run1.json run2.json run3.json \
        --write-baseline benchmarks/baseline-quick.json

    # demonstrate a failure: make DelayIndex's timed calls twice as slow
    DELAYINDEX_BENCH_SLOWDOWN=delay_index:2 pytest benchmarks --benchmark-enable \\
        --bench-tier quick --benchmark-json slow.json
    python benchmarks/gate.py slow.json            # exit 1, the DelayIndex rows listed

The baseline may be a full pytest-benchmark JSON file or the reduced form written by
``--write-baseline`` (the same keys, fewer of them). Standard library only, so the gate runs
wherever Python does; ``delayindex bench`` imports :func:`load_records` and :func:`ratios` from
here for its table.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

DEFAULT_BASELINE = Path(__file__).resolve().parent / "baseline-quick.json"
DEFAULT_TOLERANCE = 0.25
REFERENCE_KIND = "heapq"
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
    metric: str  # "time" or "bytes/msg"
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
    return float(record["stats"]["min"])


def ratios(records: Iterable[dict[str, Any]]) -> dict[Key, Ratio]:
    """Every record's ratio to the heapq row of its group (see the module doc)."""
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
                metric="bytes/msg" if memory else "time",
                value=value,
                ratio=ratio,
            )
    return out


def best_ratios(runs: Sequence[dict[Key, Ratio]]) -> dict[Key, Ratio]:
    """Each record's best (lowest) ratio over several runs of the same tier.

    A real slowdown shows in every run; a noisy moment of a shared machine rarely hits the
    same record in each, so gating the best of two or three runs fails on regressions, not
    on noise. A record is kept from every run it appears in.
    """
    out: dict[Key, Ratio] = {}
    for run in runs:
        for key, ratio in run.items():
            held = out.get(key)
            if held is None or (
                ratio.ratio is not None and (held.ratio is None or ratio.ratio < held.ratio)
            ):
                out[key] = ratio
    return out


def median_baseline(paths: Sequence[Path]) -> dict[str, Any]:
    """A baseline whose every record carries its median ratio over the runs ``paths``.

    The first run is reduced (:func:`reduce_run`); each record's figure (``stats.min``, or
    ``rss_bytes_per_msg`` for memory) is then set to the median ratio times that run's heapq
    figure, so the stored file keeps the usual format and :func:`ratios` reads the medians back.
    """
    reduced = reduce_run(paths[0])
    if len(paths) == 1:
        return reduced
    per_run = [ratios(load_records(path)) for path in paths]
    first = per_run[0]
    for record in reduced["benchmarks"]:
        key = (str(record.get("group") or record["name"]), str(record["name"]))
        held = first.get(key)
        values = [r[key].ratio for r in per_run if key in r and r[key].ratio is not None]
        if held is None or held.ratio is None or not values:
            continue  # heapq rows need no care: their ratio is 1 in every run
        median = statistics.median(values)
        scale = median / held.ratio
        if held.metric == "bytes/msg":
            record["extra_info"]["rss_bytes_per_msg"] *= scale
        else:
            record["stats"]["min"] *= scale
    reduced["note"] += f"; median ratios of {len(paths)} runs"
    return reduced


@dataclass
class Verdict:
    """What :func:`compare` found."""

    regressions: list[tuple[Ratio, Ratio]]
    improvements: list[tuple[Ratio, Ratio]]
    compared: int
    new: list[Ratio]
    missing: list[Ratio]
    unreferenced: list[str]

    @property
    def ok(self) -> bool:
        """No record is more than the tolerance worse than its baseline."""
        return not self.regressions


def compare(run: dict[Key, Ratio], baseline: dict[Key, Ratio], tolerance: float) -> Verdict:
    """Compare the run's ratios with the baseline's (see the module doc)."""
    verdict = Verdict([], [], 0, [], [], [])
    unreferenced = set()
    for key, now in sorted(run.items()):
        before = baseline.get(key)
        if before is None:
            verdict.new.append(now)
            continue
        if now.ratio is None or before.ratio is None:
            unreferenced.add(now.group)
            continue
        verdict.compared += 1
        if now.ratio > before.ratio * (1 + tolerance):
            verdict.regressions.append((now, before))
        elif now.ratio < before.ratio / (1 + tolerance):
            verdict.improvements.append((now, before))
    verdict.missing = [ratio for key, ratio in sorted(baseline.items()) if key not in run]
    verdict.unreferenced = sorted(unreferenced)
    return verdict


def _line(now: Ratio, before: Ratio) -> str:
    assert now.ratio is not None and before.ratio is not None
    change = now.ratio / before.ratio - 1
    return (
        f"  {now.group}: {now.label} [{now.name}]: {now.metric} ratio to heapq "
        f"{now.ratio:.3g} vs baseline {before.ratio:.3g} ({change:+.0%})"
    )


def report(verdict: Verdict, tolerance: float) -> list[str]:
    """Human-readable lines: offenders first, then what was not compared."""
    lines = []
    if verdict.regressions:
        lines.append(
            f"REGRESSION: {len(verdict.regressions)} of {verdict.compared} benchmarks are more "
            f"than {tolerance:.0%} worse than the baseline, relative to heapq:"
        )
        lines.extend(_line(now, before) for now, before in verdict.regressions)
    else:
        lines.append(
            f"OK: {verdict.compared} benchmarks within {tolerance:.0%} of the baseline, "
            "relative to heapq"
        )
    if verdict.improvements:
        lines.append(f"improved by more than {tolerance:.0%} (consider refreshing the baseline):")
        lines.extend(_line(now, before) for now, before in verdict.improvements)
    if verdict.new:
        lines.append(f"new, not in the baseline ({len(verdict.new)}; not gated):")
        lines.extend(f"  {r.group}: {r.label} [{r.name}]" for r in verdict.new)
    if verdict.missing:
        lines.append(f"in the baseline but not in this run ({len(verdict.missing)}; not gated):")
        lines.extend(f"  {r.group}: {r.label} [{r.name}]" for r in verdict.missing)
    if verdict.unreferenced:
        lines.append(
            "groups without a single heapq row (not gated): " + ", ".join(verdict.unreferenced)
        )
    return lines


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
        description="Fail when a benchmark's ratio to heapq (same run) is more than the "
        "tolerance worse than in the stored baseline. Exit 0 ok, 1 regression, 2 bad input.",
    )
    parser.add_argument(
        "run",
        type=Path,
        nargs="+",
        help="pytest-benchmark JSON of the run to check; with several runs of the same tier, "
        "each benchmark's best ratio is gated (with --write-baseline: its median is stored)",
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
        help="allowed relative worsening of a ratio (default 0.25 = 25%%)",
    )
    parser.add_argument(
        "--write-baseline",
        type=Path,
        metavar="OUT",
        help="write the runs' reduced form (median ratios) to OUT as the new baseline, exit",
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the gate; returns the exit code."""
    args = build_parser().parse_args(argv)
    if not args.tolerance >= 0:
        print("gate: --tolerance must be >= 0", file=sys.stderr)
        return 2
    try:
        if args.write_baseline is not None:
            reduced = median_baseline(args.run)
            args.write_baseline.write_text(json.dumps(reduced, indent=1) + "\n", encoding="utf-8")
            print(f"wrote {len(reduced['benchmarks'])} records to {args.write_baseline}")
            return 0
        run = best_ratios([ratios(load_records(path)) for path in args.run])
        baseline = ratios(load_records(args.baseline))
    except (GateInputError, OSError) as exc:
        print(f"gate: {exc}", file=sys.stderr)
        return 2
    verdict = compare(run, baseline, args.tolerance)
    print(f"gate: {', '.join(map(str, args.run))} against {args.baseline}")
    for line in report(verdict, args.tolerance):
        print(line)
    return 0 if verdict.ok else 1


if __name__ == "__main__":
    sys.exit(main())
