"""The benchmark suite's terminal summary (``conftest.pytest_terminal_summary``): one line per
group, every row against the group's heapq row, and the run's peak memory.

Plain functions of pytest-benchmark's flat records (dicts with ``group``, ``name``, ``min`` and
``extra_info``); no pytest import, so tests can call them on hand-made records.
"""

from __future__ import annotations

from typing import Any

from gate_records import REFERENCE_KIND
from memwatch import PeakMemory

#: The machine's memory, which the whole run (the full tier at 1e7 included) must stay within.
MACHINE_MEMORY_BYTES = 24 * 2**30


def _label(bench: dict[str, Any]) -> str:
    label = bench["extra_info"].get("label")
    return str(label) if label else str(bench["name"])


def _format_seconds(seconds: float) -> str:
    if seconds >= 1:
        return f"{seconds:.2f} s"
    return f"{seconds * 1e3:.1f} ms"


def _group_sort_key(group: str) -> tuple[str, int]:
    head, _, tail = group.rpartition("-")
    try:
        return head, int(float(tail))
    except ValueError:
        return group, 0


#: bench_shared.py's ratios (extra_info key -> what the summary calls it).
_SHARED_RATIOS = {
    "memory_vs_one": "held/one DelayIndex",
    "drain_peak_vs_one": "drain peak/one DelayIndex",
    "disk_vs_one": "disk/one DelayIndex",
    "drain_peak_vs_running": "drain peak/without the stopped one",
    "drained_vs_running": "drained/without the stopped one",
}


def _notes(bench: dict[str, Any], *first: str) -> str:
    """The group-specific figures of a record, for the summary."""
    info = bench["extra_info"]
    parts = list(first)
    if "bytes_per_index" in info:
        parts.append(f"{info['bytes_per_index']:.2f} B/index")
    if "manifest_writes_per_seal" in info:
        parts.append(f"{info['manifest_writes_per_seal']} manifest writes/seal")
    if "max_add_ms" in info:
        parts.append(f"longest add {info['max_add_ms']:.1f} ms, p99.99 {info['p9999_add_ms']} ms")
    if "reported_bytes_per_msg" in info:
        parts.append(f"memory_usage_bytes {info['reported_bytes_per_msg']:.1f} B/msg")
    if "drain_peak_bytes_per_msg" in info:
        parts.append(f"drain peak {info['drain_peak_bytes_per_msg']:.1f} B/msg")
    for key, what in _SHARED_RATIOS.items():
        if info.get(key) is not None:
            parts.append(f"{what} x{info[key]:.2f}")
    if "per_sub_msgs_per_s" in info:
        parts.append(f"{info['per_sub_msgs_per_s'] / 1e6:.2f} M msg/s per subscription")
        if info.get("per_sub_slowest_msgs_per_s") not in (None, info["per_sub_msgs_per_s"]):
            slowest = info["per_sub_slowest_msgs_per_s"] / 1e6
            parts.append(f"slowest subscription {slowest:.2f} M msg/s in its own polls")
    if "slowdown_injected" in info:
        parts.append(f"SLOWED x{info['slowdown_injected']}")
    return f" ({'; '.join(parts)})" if parts else ""


def summary_lines(benchmarks: list[dict[str, Any]]) -> list[str]:
    """One line per group: every row against the group's ``heapq`` row."""
    groups: dict[str, list[dict[str, Any]]] = {}
    for bench in benchmarks:
        groups.setdefault(str(bench["group"]), []).append(bench)
    lines = []
    for group, members in sorted(groups.items(), key=lambda item: _group_sort_key(item[0])):
        refs = [b for b in members if b["extra_info"].get("kind") == REFERENCE_KIND]
        ref = refs[0] if len(refs) == 1 else None
        if all("rss_bytes_per_msg" in b["extra_info"] for b in members):
            lines.append(f"{group}: RSS " + _memory_line(ref, members))
            continue
        parts = []
        for bench in sorted(members, key=lambda b: b["min"]):
            text = f"{_label(bench)} {_format_seconds(bench['min'])}"
            if ref is not None and bench is not ref:
                text += f" = {_times(ref['min'] / bench['min'])}"
            parts.append(text + _notes(bench))
        head = f"speed-up over {_label(ref)}" if ref is not None else "no single heapq row"
        lines.append(f"{group} [{head}]: " + ", ".join(parts))
    return lines


def _times(ratio: float) -> str:
    return f"{ratio:.1f}x" if ratio >= 1 else f"{ratio:.2g}x"


def _memory_line(ref: dict[str, Any] | None, members: list[dict[str, Any]]) -> str:
    parts = []
    for bench in sorted(members, key=lambda b: b["extra_info"]["rss_bytes_per_msg"]):
        per_msg = bench["extra_info"]["rss_bytes_per_msg"]
        first = []
        if ref is not None and bench is not ref and per_msg > 0:
            first.append(f"heapq uses {_times(ref['extra_info']['rss_bytes_per_msg'] / per_msg)}")
        parts.append(f"{_label(bench)} {per_msg:.1f} B/msg" + _notes(bench, *first))
    return ", ".join(parts)


def peak_memory_line(peak: PeakMemory) -> str:
    """One summary line: the run's peak resident memory against the machine's."""
    gib = 2**30
    verdict = "within" if peak.peak_bytes <= MACHINE_MEMORY_BYTES else "OVER"
    return (
        f"peak memory of the whole run (this process and its children): "
        f"{peak.peak_bytes / gib:.2f} GiB, {verdict} {MACHINE_MEMORY_BYTES / gib:.0f} GiB "
        f"(process tree sampled every {peak.interval_s:g} s, {peak.samples} samples: "
        f"{peak.tree_peak_bytes / gib:.2f} GiB; largest single process "
        f"{max(peak.self_maxrss_bytes, peak.largest_child_maxrss_bytes) / gib:.2f} GiB)"
    )
