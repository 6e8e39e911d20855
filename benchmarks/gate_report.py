"""The regression gate's report (``gate.py``): its verdict as lines for a person.

Offenders first (structures past the tolerance, then single records past the row tolerance),
then the per-structure table, improvements, the records reported but not gated, and the new and
missing ones. Reads a ``gate.Verdict`` and its ``gate.Change`` records by attribute only, so it
needs no import of ``gate`` (which loads this module by path).
"""

from __future__ import annotations

from typing import Any


def _line(change: Any, row: bool = False) -> str:
    unit = "bytes/msg" if change.now.metric == "bytes/msg" else "time"
    value = change.row_change if row else change.change
    local = " (local machine factor)" if row and change.row_change != change.change else ""
    return (
        f"  {change.now.group}: {change.now.label} [{change.now.name}]: {unit} "
        f"x{value:.2f} of the baseline ({value - 1:+.0%}){local}"
    )


def report(verdict: Any, tolerance: float, row_tolerance: float) -> list[str]:
    """Human-readable lines: offenders first, then the per-structure table and the rest."""
    lines = [
        f"machine factor {verdict.factor:.3f} (the reference rows' median time over the "
        "baseline's; each structure is measured against the other kinds' rows instead)"
    ]
    if verdict.ok:
        lines.append(
            f"OK: {verdict.compared} benchmarks; every structure within {tolerance:.0%} and every "
            f"benchmark within {row_tolerance:.0%} of the baseline"
        )
    if verdict.slower_kinds:
        lines.append(
            f"REGRESSION: {len(verdict.slower_kinds)} structure(s) more than {tolerance:.0%} "
            "slower than the baseline (geometric mean over their benchmarks):"
        )
        lines.extend(
            f"  {kind}: x{mean:.2f} over {n} benchmarks ({mean - 1:+.0%})"
            for kind, mean, n in verdict.slower_kinds
        )
    if verdict.regressions:
        lines.append(
            f"REGRESSION: {len(verdict.regressions)} of {verdict.compared} benchmarks are more "
            f"than {row_tolerance:.0%} worse than the baseline:"
        )
        lines.extend(_line(change, row=True) for change in verdict.regressions)
    lines.append("per structure (geometric mean of the changes): " + ", ".join(
        f"{kind} x{mean:.2f} ({n})" for kind, (mean, n) in verdict.kinds.items()
    ))  # fmt: skip
    if verdict.improvements:
        lines.append(
            f"improved by more than {tolerance:.0%} (consider refreshing the baseline: "
            "delayindex bench --record-baseline):"
        )
        lines.extend(_line(change) for change in verdict.improvements)
    if verdict.reported:
        lines.append(f"reported, not gated ({len(verdict.reported)}):")
        lines.extend(f"{_line(change)}; {why}" for change, why in verdict.reported)
    if verdict.new:
        lines.append(f"new, not in the baseline ({len(verdict.new)}; not gated):")
        lines.extend(f"  {r.group}: {r.label} [{r.name}]" for r in verdict.new)
    if verdict.missing:
        lines.append(f"in the baseline but not in this run ({len(verdict.missing)}; not gated):")
        lines.extend(f"  {r.group}: {r.label} [{r.name}]" for r in verdict.missing)
    return lines
