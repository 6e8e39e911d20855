"""The gate's confirmation rerun (``gate.py --confirm``; see Confirmation in ``gate.py``).

When a run fails the gate, its offenders are run again at once in a fresh pytest process,
beside a few unflagged *reference* records, and each offender is gated on its better change of
the two runs. This module picks what to rerun (:func:`targets`), runs it (:func:`run_again`)
and puts the rerun on the first run's scale (:func:`scales`); ``gate.py`` does the gating.
Plain data in and out (keys are ``(group, name)``), standard library only.
"""

from __future__ import annotations

import statistics
import subprocess
import sys
from collections.abc import Collection, Mapping, Sequence
from pathlib import Path

Key = tuple[str, str]
#: Unflagged records a confirmation reruns beside the offenders, as its speed reference.
REFERENCES = 8


class RerunError(Exception):
    """The rerun could not be made (pytest failed or wrote nothing)."""


def targets(
    regressions: Collection[Key],
    slow_kinds: Collection[str],
    records: Mapping[Key, tuple[str, str, float]],
    names: Mapping[Key, str],
    reference_kinds: Collection[str],
) -> tuple[list[Key], list[Key]]:
    """``(offenders, references)`` to run again, each a list of keys that have a node id in
    ``names``. ``records`` maps a key to ``(kind, metric, value)``. Offenders: the
    ``regressions`` (records past the row tolerance) and every time record of a structure in
    ``slow_kinds``. References: the :data:`REFERENCES` shortest other time records of gated
    structures (not of ``reference_kinds``; of those only when every gated one is an offender),
    whose speed in the rerun measures the machine's drift between the two runs."""
    offenders, others = [], []
    for key, (kind, metric, value) in sorted(records.items()):
        if key not in names:
            continue
        if key in regressions or (kind in slow_kinds and metric != "bytes/msg"):
            offenders.append(key)
        elif metric != "bytes/msg":
            others.append((kind in reference_kinds, value, key))
    return offenders, [key for *_, key in sorted(others)[:REFERENCES]]


def scales(
    first: Mapping[Key, float],
    rerun: Mapping[Key, tuple[float, str]],
    references: Sequence[Key],
) -> dict[Key, float]:
    """For each rerun record that is not a reference: the factor that turns its first-run
    change into its rerun change, ``(rerun / first) / drift``, where ``drift`` is the median
    ``rerun / first`` of the ``references`` (1.0 without any): the first run's machine factors
    then apply, corrected for how much faster or slower the machine ran the rerun, so neither a
    machine that slowed down nor one that sped up decides the verdict. ``rerun`` maps a key to
    ``(figure, metric)``; memory figures (``bytes/msg``) are not corrected by the drift."""
    shares = [
        rerun[key][0] / first[key] for key in references if key in rerun and first.get(key, 0) > 0
    ]
    drift = statistics.median(shares) if shares else 1.0
    out = {}
    for key, (figure, metric) in rerun.items():
        if key in references or first.get(key, 0) <= 0:
            continue
        out[key] = figure / first[key] / (drift if metric != "bytes/msg" else 1.0)
    return out


def run_again(node_ids: Sequence[str], out: Path, tier: str) -> Path:
    """Run ``node_ids`` of the suite once more in a fresh pytest process (from the repository
    root), writing pytest-benchmark's JSON to ``out``; returns ``out``.

    Raises:
        RerunError: pytest failed or wrote no results.
    """
    root = Path(__file__).resolve().parent.parent
    command = [
        sys.executable, "-m", "pytest", *node_ids, "--benchmark-enable",
        f"--bench-tier={tier}", f"--benchmark-json={out}", "-q", "-p", "no:cacheprovider",
    ]  # fmt: skip
    done = subprocess.run(command, cwd=root, capture_output=True, text=True, check=False)
    if done.returncode != 0 or not out.is_file():
        tail = (done.stdout + done.stderr).strip().splitlines()[-5:]
        raise RerunError(f"confirmation rerun failed (exit {done.returncode}): {tail}")
    return out
