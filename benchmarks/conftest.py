"""Shared fixtures, options and the ratio summary of the delayindex benchmark suite.

Run (benchmarks are disabled by the project's default ``addopts``, hence ``--benchmark-enable``)::

    pytest benchmarks --benchmark-enable [--bench-sizes 100000,1000000]

* ``bench_*.py`` files in this directory are collected as test modules (see
  :func:`pytest_collect_file`); this directory is outside the default ``testpaths``.
* ``--bench-sizes`` (default ``100000,1000000``) parametrizes every sized benchmark through the
  ``size`` argument; the fixed-size groups (``heap-batch-*``, ``memory-*``) use the largest size.
* Inputs are generated once per size and cached for the session, both as int64 numpy arrays and
  as Python lists converted with ``.tolist()``, so no conversion happens inside a timed region.
* After pytest-benchmark's own tables, a summary prints for each group the speed-up of every
  benchmark over the group's baseline (the benchmark whose name contains ``heapq``):
  ``baseline min time / min time``, so ``7.4x`` means 7.4 times faster than ``heapq``. Memory
  groups print resident bytes per tracked message instead.
"""

from __future__ import annotations

import sys
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest

from delayindex import NATIVE, DelayIndex, FileStorage, InMemoryTracker, ManualClock, wall_clock_ms
from delayindex.workload import DAY_MS

sys.path.insert(0, str(Path(__file__).resolve().parent))

from baselines import HeapqSetTracker, SortedListSetTracker, delayed_subset

Int64Array = npt.NDArray[np.int64]

DEFAULT_SIZES = "100000,1000000"
BASELINE_MARK = "heapq"

_BENCH_GROUPS = pytest.StashKey[list[dict[str, Any]]]()


# -- options, collection, parametrization -------------------------------------------------------


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--bench-sizes",
        default=DEFAULT_SIZES,
        help=f"comma-separated input sizes for sized benchmarks (default: {DEFAULT_SIZES})",
    )


def pytest_configure(config: pytest.Config) -> None:
    bench_sizes(config)  # fail early, as a usage error, on a bad --bench-sizes


def pytest_collect_file(file_path: Path, parent: pytest.Collector) -> pytest.Module | None:
    """Collect ``bench_*.py`` (the default ``python_files`` only matches ``test_*.py``)."""
    if parent.session.isinitpath(file_path):
        return None  # named on the command line: pytest's own collector takes it
    if file_path.suffix == ".py" and file_path.name.startswith("bench_"):
        return pytest.Module.from_parent(parent, path=file_path)
    return None


def bench_sizes(config: pytest.Config) -> list[int]:
    """The ``--bench-sizes`` option as a list of positive ints."""
    raw = str(config.getoption("bench_sizes"))
    try:
        sizes = [int(part) for part in raw.split(",") if part.strip()]
    except ValueError:
        raise pytest.UsageError(
            f"--bench-sizes must be comma-separated ints, got {raw!r}"
        ) from None
    if not sizes or min(sizes) < 1:
        raise pytest.UsageError(f"--bench-sizes needs at least one size >= 1, got {raw!r}")
    return sizes


def size_label(n: int) -> str:
    """``100000 -> '1e5'``, ``2000000 -> '2e6'``, other sizes as plain digits."""
    digits = str(n)
    stripped = digits.rstrip("0")
    zeros = len(digits) - len(stripped)
    if len(stripped) == 1 and zeros >= 3:
        return f"{stripped}e{zeros}"
    return digits


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "size" in metafunc.fixturenames:
        sizes = bench_sizes(metafunc.config)
        metafunc.parametrize("size", sizes, ids=[size_label(n) for n in sizes])


# -- inputs ---------------------------------------------------------------------------------------


@dataclass
class Triples:
    """Random ``(time, ledger, entry)`` triples for the heap benchmarks."""

    times: Int64Array
    ledgers: Int64Array
    entries: Int64Array
    time_list: list[int] = field(repr=False)
    ledger_list: list[int] = field(repr=False)
    entry_list: list[int] = field(repr=False)

    def __len__(self) -> int:
        return len(self.times)

    @cached_property
    def expected(self) -> list[tuple[int, int, int]]:
        """All triples in pop order (computed on first use, outside any timed region)."""
        return sorted(zip(self.time_list, self.ledger_list, self.entry_list, strict=True))


@dataclass
class Delayed:
    """The first ``n`` delayed messages of the realistic workload, shifted into the future.

    ``deliver_at`` is shifted by a constant so that every message is more than a day after
    ``now_ms`` (the wall clock when the session's inputs were built): all of them are tracked
    by a wall-clock tracker and by a :class:`ManualClock` starting at ``now_ms``. The shift keeps
    the order and spacing of the realistic delays.
    """

    ledgers: Int64Array
    entries: Int64Array
    deliver_at: Int64Array
    ledger_list: list[int] = field(repr=False)
    entry_list: list[int] = field(repr=False)
    deliver_list: list[int] = field(repr=False)
    now_ms: int
    far_future_ms: int

    def __len__(self) -> int:
        return len(self.ledgers)


def _make_triples(n: int, seed: int = 12345) -> Triples:
    rng = np.random.default_rng(seed)
    times = rng.integers(0, 10**12, size=n, dtype=np.int64)
    ledgers = rng.integers(0, 10**5, size=n, dtype=np.int64)
    entries = np.arange(n, dtype=np.int64)
    return Triples(times, ledgers, entries, times.tolist(), ledgers.tolist(), entries.tolist())


def _make_delayed(n: int, now_ms: int) -> Delayed:
    ledgers, entries, deliver_at = delayed_subset(n)
    deliver_at = deliver_at + (max(0, now_ms - int(deliver_at.min())) + DAY_MS)
    return Delayed(
        ledgers,
        entries,
        deliver_at,
        ledgers.tolist(),
        entries.tolist(),
        deliver_at.tolist(),
        now_ms=now_ms,
        far_future_ms=int(deliver_at.max()) + DAY_MS,
    )


@pytest.fixture(scope="session")
def session_now_ms() -> int:
    """Wall-clock epoch ms when the session's inputs were first requested."""
    return wall_clock_ms()


@pytest.fixture(scope="session")
def triples_cache() -> Callable[[int], Triples]:
    """``get(n)``: random heap triples of size ``n``, built once per size."""
    cache: dict[int, Triples] = {}

    def get(n: int) -> Triples:
        if n not in cache:
            cache[n] = _make_triples(n)
        return cache[n]

    return get


@pytest.fixture(scope="session")
def delayed_cache(session_now_ms: int) -> Callable[[int], Delayed]:
    """``get(n)``: the first ``n`` delayed messages of the realistic workload, built once."""
    cache: dict[int, Delayed] = {}

    def get(n: int) -> Delayed:
        if n not in cache:
            cache[n] = _make_delayed(n, session_now_ms)
        return cache[n]

    return get


@pytest.fixture(scope="session")
def max_size(pytestconfig: pytest.Config) -> int:
    """Largest ``--bench-sizes`` value: the size of the fixed-size groups."""
    return max(bench_sizes(pytestconfig))


@pytest.fixture(scope="session")
def max_size_id(max_size: int) -> str:
    """Short label of the largest size (``1e6``)."""
    return size_label(max_size)


@pytest.fixture
def size_id(size: int) -> str:
    """Short label of the current size for group names (``1e6``)."""
    return size_label(size)


@pytest.fixture
def triples(triples_cache: Callable[[int], Triples], size: int) -> Triples:
    return triples_cache(size)


@pytest.fixture
def delayed(delayed_cache: Callable[[int], Delayed], size: int) -> Delayed:
    return delayed_cache(size)


# -- trackers -------------------------------------------------------------------------------------


def open_delay_index(clock: Callable[[], int]) -> DelayIndex:
    """A DelayIndex with default settings on a fresh FileStorage directory (under /tmp)."""
    return DelayIndex.open(FileStorage(tempfile.mkdtemp(prefix="delayindex-bench-")), "bench",
                           clock=clock)  # fmt: skip


#: Tracker kinds: factories taking a clock. Names containing "heapq" are the groups' baselines.
TRACKER_FACTORIES: dict[str, Callable[[Callable[[], int]], Any]] = {
    "in_memory": lambda clock: InMemoryTracker(clock=clock),
    "delay_index": open_delay_index,
    "heapq": HeapqSetTracker,
    "sortedlist": SortedListSetTracker,
}


@pytest.fixture
def manual_clock(session_now_ms: int) -> ManualClock:
    """A :class:`ManualClock` at ``session_now_ms`` (every ``Delayed`` message is tracked)."""
    return ManualClock(session_now_ms)


@pytest.fixture(scope="session")
def make_tracker() -> Callable[[str, Callable[[], int]], Any]:
    """``make_tracker(kind, clock)`` -> a fresh tracker of ``kind`` (see TRACKER_FACTORIES)."""

    def make(kind: str, clock: Callable[[], int]) -> Any:
        return TRACKER_FACTORIES[kind](clock)

    return make


def _fill(tracker: Any, data: Delayed) -> None:
    if isinstance(tracker, InMemoryTracker | DelayIndex):
        tracker.add_many(data.ledgers, data.entries, data.deliver_at)
        if isinstance(tracker, DelayIndex):
            tracker.flush()  # sealed buckets durable: the realistic steady state
    else:
        add = tracker.add
        for ledger_id, entry_id, deliver_at in zip(
            data.ledger_list, data.entry_list, data.deliver_list, strict=True
        ):
            add(ledger_id, entry_id, deliver_at)
    if len(tracker) != len(data):
        raise AssertionError(f"prefill tracked {len(tracker)} of {len(data)} messages")


@pytest.fixture(scope="session")
def prefill() -> Callable[[Any, Delayed], None]:
    """``prefill(tracker, delayed)``: track every message (add_many where available)."""
    return _fill


# -- summary --------------------------------------------------------------------------------------


@pytest.hookimpl(wrapper=True)
def pytest_benchmark_group_stats(
    config: pytest.Config, benchmarks: list[dict[str, Any]], group_by: str
) -> Iterator[None]:
    """Keep this run's flat benchmark records for :func:`pytest_terminal_summary`."""
    config.stash[_BENCH_GROUPS] = [bench for bench in benchmarks if bench.get("path") is None]
    return (yield)


def _label(bench: dict[str, Any]) -> str:
    label = bench["extra_info"].get("label")
    return str(label) if label else str(bench["name"])


def _format_seconds(seconds: float) -> str:
    if seconds >= 1:
        return f"{seconds:.2f} s"
    return f"{seconds * 1e3:.1f} ms"


def summary_lines(benchmarks: list[dict[str, Any]]) -> list[str]:
    """One line per group: speed-ups over the ``heapq`` baseline, or bytes per message."""
    groups: dict[str, list[dict[str, Any]]] = {}
    for bench in benchmarks:
        groups.setdefault(str(bench["group"]), []).append(bench)
    lines = []
    for group, members in sorted(groups.items(), key=lambda item: _group_sort_key(item[0])):
        baselines = [b for b in members if BASELINE_MARK in b["name"]]
        others = [b for b in members if BASELINE_MARK not in b["name"]]
        if all("indexes" in b["extra_info"] for b in members):
            lines.append(f"{group}: " + _codec_line(members))
        elif all("max_add_ms" in b["extra_info"] for b in members):
            lines.append(f"{group}: " + _latency_line(members))
        elif all("manifest_writes_per_seal" in b["extra_info"] for b in members):
            lines.append(
                f"{group}: manifest writes per seal: "
                + ", ".join(
                    f"{_label(b)} {b['extra_info']['manifest_writes_per_seal']} "
                    f"({b['extra_info']['batches']} batches, {_format_seconds(b['min'])})"
                    for b in members
                )
            )
        elif all("rss_bytes_per_msg" in b["extra_info"] for b in members):
            lines.append(f"{group}: " + _memory_line(baselines, others))
        elif len(baselines) == 1:
            lines.append(f"{group}: " + _speed_line(baselines[0], others))
        else:
            times = ", ".join(f"{_label(b)} {_format_seconds(b['min'])}" for b in members)
            lines.append(f"{group}: (no single heapq baseline) min {times}")
    return lines


def _latency_line(members: list[dict[str, Any]]) -> str:
    parts = []
    for bench in members:
        info = bench["extra_info"]
        text = f"{_label(bench)} longest add {info['max_add_ms']:.1f} ms"
        text += f" (p99.99 {info['p9999_add_ms']:.2f} ms"
        if "seals" in info:
            text += f", {info['seals']} seals, {info['merges']} merges"
        parts.append(text + ")")
    return "; ".join(parts)


def _codec_line(members: list[dict[str, Any]]) -> str:
    parts = []
    for bench in sorted(members, key=lambda b: b["min"]):
        info = bench["extra_info"]
        rate = info["indexes"] / bench["min"]
        parts.append(f"{_label(bench)} {rate / 1e6:.1f} M indexes/s")
    info = members[0]["extra_info"]
    return f"{', '.join(parts)}; {info['bytes_per_index']:.2f} B/index on disk"


def _group_sort_key(group: str) -> tuple[str, int]:
    head, _, tail = group.rpartition("-")
    try:
        return head, int(float(tail))
    except ValueError:
        return group, 0


def _speed_line(baseline: dict[str, Any], others: list[dict[str, Any]]) -> str:
    base = _label(baseline)
    parts = []
    for i, bench in enumerate(sorted(others, key=lambda b: b["min"])):
        ratio = baseline["min"] / bench["min"]
        suffix = ""
        if i == 0:
            suffix = f" faster than {base}" if ratio >= 1 else f" the speed of {base}"
        parts.append(f"{_label(bench)} {ratio:.1f}x{suffix}")
    if not parts:
        parts.append(f"{base} only")
    mins = ", ".join(f"{_label(b)} {_format_seconds(b['min'])}" for b in [baseline, *others])
    return f"{', '.join(parts)}  [min: {mins}]"


def _memory_line(baselines: list[dict[str, Any]], others: list[dict[str, Any]]) -> str:
    parts = []
    for bench in [*others, *baselines]:
        info = bench["extra_info"]
        text = f"{_label(bench)} {info['rss_bytes_per_msg']:.1f} B/msg"
        if "reported_bytes_per_msg" in info:
            text += f" (memory_usage_bytes {info['reported_bytes_per_msg']:.1f})"
        parts.append(text)
    line = "RSS " + ", ".join(parts)
    if len(baselines) == 1 and others:
        base = baselines[0]["extra_info"]["rss_bytes_per_msg"]
        best = min(b["extra_info"]["rss_bytes_per_msg"] for b in others)
        if best > 0:
            line += f"; {_label(baselines[0])} uses {base / best:.1f}x the memory"
    return line


@pytest.hookimpl(trylast=True)
def pytest_terminal_summary(
    terminalreporter: pytest.TerminalReporter, config: pytest.Config
) -> None:
    benchmarks = config.stash.get(_BENCH_GROUPS, [])
    if not benchmarks:
        return
    implementation = "native" if NATIVE else "pure (DELAYINDEX_NO_EXTENSIONS or no build)"
    terminalreporter.write_sep(
        "=", f"delayindex vs heapq baselines (min times; delayindex: {implementation})"
    )
    for line in summary_lines(benchmarks):
        terminalreporter.write_line(line)
