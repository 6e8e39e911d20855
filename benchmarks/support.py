"""Shared plumbing of the benchmark suite: tiers, structure kinds, records, the pure build and
the slowdown hook.

Not a benchmark module: ``conftest.py`` puts this directory on ``sys.path`` so that the
``bench_*.py`` modules (imported with ``--import-mode=importlib``, so they cannot import each
other) and ``conftest.py`` share it.

* **Tiers** (``--bench-tier``): ``quick`` runs sizes 1e5 (memory at 1e5 and 1e6) and leaves out
  the groups marked ``full_tier`` (Spark) unless their file is named; ``full`` runs sizes 1e5,
  1e6 and 1e7 and every group. ``--bench-sizes`` overrides a tier's sizes, memory sizes
  included.
* **Kinds** name the structure measured by a benchmark record (``extra_info["kind"]``):
  ``delay_index``, ``in_memory``, their ``-pure`` twins (the pure-Python build in this process,
  see :func:`pure_build`), the baselines ``heapq`` (heapq + set), ``sortedlist`` (SortedList +
  set) and ``redis`` (a Redis ZSET with pipelining), for the heap group ``triple_heap`` and
  ``triple_heap-pure``, and ``shared`` (SharedDelayIndex, ``bench_shared.py``). The ``heapq``
  record of each group is the reference of the group's ratios (summary, regression gate,
  ``delayindex bench``); the shared-index groups have none (see ``bench_shared.py``).
* **Records**: every benchmark calls :func:`record` (``group``, ``label``, ``kind``, ``size``)
  and, where it measures a message rate, :func:`record_rate` (``msgs_per_s`` from the best
  round). Memory groups store ``rss_bytes_per_msg``, codec groups ``bytes_per_index``.
* **Slowdown injection** (to prove the regression gate): ``DELAYINDEX_BENCH_SLOWDOWN=KIND:FACTOR``
  (comma-separated for several kinds) makes :func:`slowed` busy-wait after every timed call of
  that kind until it took ``FACTOR`` times as long; the records say so in
  ``extra_info["slowdown_injected"]``.
"""

from __future__ import annotations

import heapq
import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import calibration

from delayindex import _impl
from delayindex._pure import codec as pure_codec

F = TypeVar("F", bound=Callable[..., Any])

SLOWDOWN_ENV = "DELAYINDEX_BENCH_SLOWDOWN"
BENCH_DIR = Path(__file__).resolve().parent
SRC_DIR = Path(_impl.__file__).resolve().parents[1]


@dataclass(frozen=True)
class Tier:
    """Sizes a tier runs at, whether it runs the ``full_tier`` groups, and whether its timed
    calls are speed-calibrated (``calibration``: what the regression gate reads)."""

    sizes: tuple[int, ...]
    memory_sizes: tuple[int, ...]
    full: bool
    calibrated: bool = False


TIERS: dict[str, Tier] = {
    "quick": Tier(sizes=(100_000,), memory_sizes=(100_000, 1_000_000), full=False, calibrated=True),
    "full": Tier(
        sizes=(100_000, 1_000_000, 10_000_000),
        memory_sizes=(100_000, 1_000_000, 10_000_000),
        full=True,
    ),
}
DEFAULT_TIER = "quick"

#: Human names of the structures; ``heapq`` is every group's reference.
KIND_LABELS: dict[str, str] = {
    "delay_index": "DelayIndex",
    "delay_index-pure": "DelayIndex (pure build)",
    "in_memory": "InMemoryTracker",
    "in_memory-pure": "InMemoryTracker (pure build)",
    "heapq": "heapq+set",
    "heapq-inline": "heapq+set, inline loop (no tracker)",
    "sortedlist": "SortedList+set",
    "redis": "Redis ZSET (pipelined)",
    "triple_heap": "TripleHeap",
    "triple_heap-pure": "TripleHeap (pure)",
    "shared": "SharedDelayIndex",
}
#: The tracker kinds, in report order.
TRACKER_KINDS = [
    "delay_index",
    "delay_index-pure",
    "in_memory",
    "in_memory-pure",
    "heapq",
    "sortedlist",
    "redis",
]


def size_label(n: int) -> str:
    """``100000 -> '1e5'``, ``2000000 -> '2e6'``, other sizes as plain digits."""
    digits = str(n)
    stripped = digits.rstrip("0")
    zeros = len(digits) - len(stripped)
    if len(stripped) == 1 and zeros >= 3:
        return f"{stripped}e{zeros}"
    return digits


def rounds_for(size: int, kind: str = "") -> int:
    """Rounds of a timed benchmark: more for cheap ones (less noise for the gate), one at 1e7."""
    if size >= 10_000_000:
        return 1
    if size >= 1_000_000:
        return 1 if kind.endswith("-pure") or kind == "redis" else 3
    return 5


def record(
    benchmark: Any, group: str, kind: str | None, label: str | None = None, *,
    size: int | None = None, **extra: Any,
) -> None:  # fmt: skip
    """Name the benchmark's group and fill the ``extra_info`` keys every report relies on."""
    benchmark.group = group
    info = benchmark.extra_info
    info["label"] = label if label is not None else KIND_LABELS[kind or ""]
    if kind is not None:
        info["kind"] = kind
        factor = slowdown_factor(kind)
        if factor != 1.0:
            info["slowdown_injected"] = factor
    if size is not None:
        info["size"] = size
    info.update(extra)


def record_rate(benchmark: Any, messages: int) -> None:
    """``extra_info["msgs_per_s"]``: ``messages`` over the best round's time."""
    best = benchmark.stats.stats.min
    if best > 0:
        benchmark.extra_info["msgs_per_s"] = round(messages / best)


# -- slowdown injection ----------------------------------------------------------------------


def parse_slowdown(text: str) -> dict[str, float]:
    """Parse ``KIND:FACTOR[,KIND:FACTOR...]``; FACTOR is a float >= 1.

    Raises:
        ValueError: a malformed item, an unknown kind or a factor below 1.
    """
    out: dict[str, float] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        kind, sep, raw = item.rpartition(":")
        if not sep or not kind:
            raise ValueError(f"{SLOWDOWN_ENV} items are KIND:FACTOR, got {item!r}")
        if kind not in KIND_LABELS:
            raise ValueError(f"{SLOWDOWN_ENV}: unknown kind {kind!r}; kinds: {sorted(KIND_LABELS)}")
        try:
            factor = float(raw)
        except ValueError:
            raise ValueError(f"{SLOWDOWN_ENV}: factor of {kind} is not a number: {raw!r}") from None
        if not factor >= 1.0:  # also refuses NaN
            raise ValueError(f"{SLOWDOWN_ENV}: factor of {kind} must be >= 1, got {raw!r}")
        out[kind] = factor
    return out


def slowdown_factor(kind: str) -> float:
    """The injected slowdown of ``kind`` (1.0: none)."""
    return parse_slowdown(os.environ.get(SLOWDOWN_ENV, "")).get(kind, 1.0)


def slowed(kind: str, fn: F) -> F:
    """``fn``, or a wrapper when a slowdown is injected for ``kind`` (it busy-waits after each
    call until the call took ``factor`` times its own duration) or the benchmark is calibrated
    (``calibration``: each call's time over the machine's speed of the moment)."""
    factor = slowdown_factor(kind)
    if factor == 1.0 and not calibration.active():
        return fn
    return calibration.timed(fn, factor)


# -- the pure build in this process ------------------------------------------------------------

_PURE_NAMES: dict[str, Any] = {
    "TripleHeap": _impl.PureTripleHeap,
    "TrackerCore": _impl.PureTrackerCore,
    "BucketCore": _impl.PureBucketCore,
    "LedgerIndex": _impl.PureLedgerIndex,
    "wall_clock_ms": _impl.pure_wall_clock_ms,
    "NATIVE": False,
    **{name: getattr(pure_codec, name) for name in _impl.CODEC_KERNELS},
}


@contextmanager
def pure_build() -> Iterator[None]:
    """Point ``delayindex._impl`` at the pure-Python twins while the block runs.

    Every module reaches the native structures and kernels through ``_impl.<name>`` at the time
    of use, so trackers made (and used, and closed) inside the block are exactly what
    ``DELAYINDEX_NO_EXTENSIONS=1`` gives, in this process and on the same inputs. Nothing else
    may run meanwhile: a native tracker used inside the block would get pure kernels.
    """
    saved = {name: getattr(_impl, name) for name in _PURE_NAMES}
    for name, value in _PURE_NAMES.items():
        setattr(_impl, name, value)
    try:
        yield
    finally:
        for name, value in saved.items():
            setattr(_impl, name, value)


# -- probes in a fresh interpreter -------------------------------------------------------------


def run_probe(code: str, args: Sequence[str], *, pure: bool = False) -> dict[str, Any]:
    """Run ``python -c CODE ARGS...`` in this directory and return the JSON object on its last
    line of output. The environment is this process's with ``src`` and this directory put
    first on ``PYTHONPATH`` (and ``DELAYINDEX_NO_EXTENSIONS=1`` when ``pure``), so the probe
    imports the same package and the suite's helper modules.

    Raises:
        AssertionError: the probe failed (its stderr is in the message).
    """
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(SRC_DIR), str(BENCH_DIR), *filter(None, [env.get("PYTHONPATH")])]
    )
    if pure:
        env["DELAYINDEX_NO_EXTENSIONS"] = "1"
    completed = subprocess.run(
        [sys.executable, "-c", code, *args],
        env=env,
        cwd=BENCH_DIR,
        capture_output=True,
        text=True,
        timeout=3600,
        check=False,
    )
    if completed.returncode != 0:
        raise AssertionError(
            f"probe {' '.join(args)} failed ({completed.returncode}):\n{completed.stderr}"
        )
    result: dict[str, Any] = json.loads(completed.stdout.strip().splitlines()[-1])
    return result


# -- the per-call loops (bench_tracker, bench_shared) ---------------------------------------------


def add_each(tracker: Any, ledgers: list[int], entries: list[int], deliver_ats: list[int]) -> Any:
    """Per-call ``tracker.add`` of every message (Redis: then send what is still queued)."""
    add = tracker.add
    for ledger_id, entry_id, deliver_at in zip(ledgers, entries, deliver_ats, strict=True):
        add(ledger_id, entry_id, deliver_at)
    sync = getattr(tracker, "sync", None)
    if sync is not None:  # Redis: send what is still queued
        sync()
    return tracker  # freed after the timer stops


def add_inline(ledgers: list[int], entries: list[int], deliver_ats: list[int]) -> Any:
    """The inline heapq + set loop: the dedup and the push in the loop body (no tracker)."""
    heap: list[tuple[int, int, int]] = []
    positions: set[tuple[int, int]] = set()
    push = heapq.heappush
    for ledger_id, entry_id, deliver_at in zip(ledgers, entries, deliver_ats, strict=True):
        position = (ledger_id, entry_id)
        if position not in positions:
            positions.add(position)
            push(heap, (deliver_at, ledger_id, entry_id))
    return heap, positions  # freed after the timer stops


def contains_inline(positions: set[tuple[int, int]], ledgers: list[int], entries: list[int]) -> int:
    """The inline membership loop over ``positions``: how many of the positions are in it."""
    hits = 0
    for ledger_id, entry_id in zip(ledgers, entries, strict=True):
        if (ledger_id, entry_id) in positions:
            hits += 1
    return hits


def contains_each(tracker: Any, ledgers: list[int], entries: list[int]) -> int:
    """Per-call ``tracker.contains`` of every position: how many it holds."""
    contains = tracker.contains
    hits = 0
    for ledger_id, entry_id in zip(ledgers, entries, strict=True):
        if contains(ledger_id, entry_id):
            hits += 1
    return hits
