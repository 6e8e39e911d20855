"""The regression gate's records (``gate.py``): pytest-benchmark JSON read, each record's figure.

A record's *figure* is what the gate compares: its ``extra_info["calibrated"]`` when the run was
calibrated (``calibration.py``; the quick tier), else its ``stats.min``; bytes per message for a
memory group. :func:`ratios` gives every record's figure and its ratio to its group's heapq row
(what ``delayindex bench`` shows); :func:`reduce_run` keeps what a stored baseline needs.
Standard library only.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import calibration
from gate_machine import CPU_KEYS

#: The kind of the row each group's ratios are taken against.
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


def comparable(now: Ratio, before: Ratio | None) -> bool:
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
            "cpu": {key: cpu.get(key) for key in CPU_KEYS if key in cpu},
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
