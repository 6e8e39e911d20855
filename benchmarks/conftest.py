"""Shared fixtures, options and the ratio summary of the delayindex benchmark suite.

Run (benchmarks are disabled by the project's default ``addopts``, hence ``--benchmark-enable``)::

    pytest benchmarks --benchmark-enable --bench-tier quick --benchmark-json run.json
    python benchmarks/gate.py run.json            # the regression gate (see gate.py)

* ``bench_*.py`` files in this directory are collected as test modules (see
  :func:`pytest_collect_file`); this directory is outside the default ``testpaths``.
* ``--bench-tier quick|full`` (default ``quick``; see ``support.TIERS``): quick runs the sized
  groups at 1e5 and memory at 1e5 and 1e6, and deselects the groups marked ``full_tier``
  (Spark) unless their file is named on the command line; full runs 1e5, 1e6 and 1e7 (memory
  too) and every group. ``--bench-sizes
  100000,1000000`` overrides the tier's sizes (memory sizes included). The fixed-size groups
  (``heap-batch-*``, ``reopen-*``, ``seal-latency-*``, ``fill-scaling-*``) use the largest size.
* Every group measures the same operation on the structures of ``support.TRACKER_KINDS`` where
  it applies: DelayIndex and InMemoryTracker (native), both again on the pure-Python build in
  this process (``support.pure_build``), and the baselines heapq + set, SortedList + set and a
  Redis ZSET with pipelining. Redis rows need ``redis-server`` on PATH and the ``redis`` client
  (the ``bench`` extra): the ``redis_client`` fixture starts a private server on 127.0.0.1 on a
  free port and stops it at the end of the session; otherwise those rows are skipped, saying
  why. With ``DELAYINDEX_NO_EXTENSIONS=1`` the default rows are already the pure build and the
  ``-pure`` rows are skipped.
* Inputs are the delayed messages of the ``gen-dump`` generator (``baselines.delayed_subset``),
  generated once per size and cached for the session, both as int64 numpy arrays and as Python
  lists converted with ``.tolist()``, so no conversion happens inside a timed region.
* The ``env`` fixture makes trackers (``env.make(kind, clock)``), keeps at most one alive (the
  previous one is closed, untimed, when the next round's setup makes a new one), prepares the
  pure build or the Redis server from the test's ``kind`` parameter, and cleans up stores.
* ``DELAYINDEX_BENCH_SLOWDOWN=KIND:FACTOR`` slows the timed calls of one kind (``support.slowed``)
  to show that the gate catches a regression.
* After pytest-benchmark's own tables, a summary prints for each group every row's ratio to the
  group's ``heapq`` row (``kind == "heapq"``): ``heapq min time / min time``, so ``7.4x`` means
  7.4 times faster than heapq. Memory groups print resident bytes per tracked message.
* The quick tier (the regression gate's) runs timed rounds with the garbage collector off
  (pytest-benchmark's ``--benchmark-disable-gc``, as ``timeit`` does), since a full collection
  inside a timed round depends on what earlier rounds left alive and made the gate's heapq
  reference vary 1.6x between clean reruns. The full tier keeps it on: its figures include
  the collector's cost, as a broker would pay it.
* A last line gives the whole run's peak resident memory, this process and every process it
  started (``memwatch``: the process tree sampled every 0.5 s, with ``getrusage`` lower
  bounds), against the machine's 24 GiB; ``--benchmark-json`` files carry it as
  ``peak_memory``.
"""

from __future__ import annotations

import gc
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest

from delayindex import NATIVE, DelayIndex, FileStorage, InMemoryTracker, _impl, wall_clock_ms
from delayindex.workload import DAY_MS

sys.path.insert(0, str(Path(__file__).resolve().parent))

import calibration
from baselines import HeapqSetTracker, RedisZsetTracker, SortedListSetTracker, delayed_subset
from memwatch import PeakMemory, PeakMemoryWatch
from summary import peak_memory_line, summary_lines
from support import (
    DEFAULT_TIER,
    KIND_LABELS,
    SLOWDOWN_ENV,
    TIERS,
    Tier,
    parse_slowdown,
    pure_build,
    size_label,
)

Int64Array = npt.NDArray[np.int64]

_BENCH_GROUPS = pytest.StashKey[list[dict[str, Any]]]()
_DESELECTED = pytest.StashKey[int]()
_WATCH = pytest.StashKey[PeakMemoryWatch]()
_PEAK = pytest.StashKey["PeakMemory | None"]()
_SCRAPER = pytest.StashKey["MetricsScraper"]()

# -- options, collection, parametrization -------------------------------------------------------


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--bench-tier",
        default=DEFAULT_TIER,
        choices=sorted(TIERS),
        help="quick: sizes 1e5 (memory 1e5, 1e6), Spark left out; full: sizes 1e5, 1e6, 1e7 "
        f"and every group (default: {DEFAULT_TIER})",
    )
    parser.addoption(
        "--bench-metrics",
        action="store_true",
        help="run with delayindex.metrics registered and its HTTP exporter scraped every "
        "second from a background thread (as a Prometheus server would, more often)",
    )
    parser.addoption(
        "--bench-sizes",
        default=None,
        help="comma-separated input sizes for sized and memory benchmarks (default: the tier's)",
    )


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "full_tier: only in --bench-tier full")
    bench_sizes(config)  # fail early, as a usage error, on a bad --bench-sizes
    try:
        parse_slowdown(os.environ.get(SLOWDOWN_ENV, ""))
    except ValueError as exc:
        raise pytest.UsageError(str(exc)) from None
    if not tier(config).full:
        # The gate's tier times with the collector off (as timeit does): whether a full
        # collection lands inside a timed round depends on what earlier rounds left alive, and
        # made the heapq reference itself vary 1.6x between clean reruns.
        config.option.benchmark_disable_gc = True
    config.stash[_WATCH] = PeakMemoryWatch().start()
    if config.getoption("--bench-metrics"):
        config.stash[_SCRAPER] = MetricsScraper().start()


class MetricsScraper:
    """delayindex.metrics on the default registry, its exporter on a loopback port, and a
    thread scraping it every ``period_s`` seconds (counting scrapes and their failures)."""

    def __init__(self, period_s: float = 1.0) -> None:
        self.period_s, self.scrapes, self.failures = period_s, 0, 0
        self._stop = threading.Event()

    def start(self) -> MetricsScraper:
        from prometheus_client import start_http_server

        import delayindex.metrics

        delayindex.metrics.register()
        self._server, _ = start_http_server(0, addr="127.0.0.1")
        self._thread = threading.Thread(target=self._run, name="bench-scraper", daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        url = f"http://127.0.0.1:{self._server.server_port}/metrics"
        while not self._stop.wait(self.period_s):
            try:
                with urllib.request.urlopen(url, timeout=10) as response:
                    response.read()
                self.scrapes += 1
            except OSError:
                self.failures += 1

    def stop(self) -> str:
        self._stop.set()
        self._thread.join(10)
        self._server.shutdown()
        return f"metrics: {self.scrapes} scrapes of the exporter, {self.failures} failed"


def _peak_memory(config: pytest.Config) -> PeakMemory | None:
    """Stop the run's memory watch (once) and return what it saw."""
    if _PEAK not in config.stash:
        watch = config.stash.get(_WATCH, None)
        config.stash[_PEAK] = None if watch is None else watch.stop()
    return config.stash[_PEAK]


def pytest_benchmark_update_json(
    config: pytest.Config, benchmarks: list[Any], output_json: dict[str, Any]
) -> None:
    """Store the run's peak memory (``memwatch``) in the ``--benchmark-json`` file."""
    peak = _peak_memory(config)
    if peak is not None:
        output_json["peak_memory"] = peak.as_json()


def pytest_collect_file(file_path: Path, parent: pytest.Collector) -> pytest.Module | None:
    """Collect ``bench_*.py`` (the default ``python_files`` only matches ``test_*.py``)."""
    if parent.session.isinitpath(file_path):
        return None  # named on the command line: pytest's own collector takes it
    if file_path.suffix == ".py" and file_path.name.startswith("bench_"):
        return pytest.Module.from_parent(parent, path=file_path)
    return None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Deselect the ``full_tier`` groups in the quick tier, unless their file was named."""
    if tier(config).full:
        return

    kept: list[pytest.Item] = []
    dropped: list[pytest.Item] = []
    for item in items:
        full_only = item.get_closest_marker("full_tier") is not None
        (dropped if full_only and not item.session.isinitpath(item.path) else kept).append(item)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        config.stash[_DESELECTED] = len(dropped)
        items[:] = kept


def tier(config: pytest.Config) -> Tier:
    """The ``--bench-tier`` in force."""
    return TIERS[str(config.getoption("bench_tier"))]


def _parse_sizes(raw: str) -> list[int]:
    try:
        sizes = [int(float(part)) for part in raw.split(",") if part.strip()]
    except ValueError:
        raise pytest.UsageError(
            f"--bench-sizes must be comma-separated ints, got {raw!r}"
        ) from None
    if not sizes or min(sizes) < 1:
        raise pytest.UsageError(f"--bench-sizes needs at least one size >= 1, got {raw!r}")
    return sizes


def bench_sizes(config: pytest.Config) -> list[int]:
    """The sizes of the sized groups: ``--bench-sizes`` or the tier's."""
    raw = config.getoption("bench_sizes")
    return _parse_sizes(str(raw)) if raw is not None else list(tier(config).sizes)


def memory_sizes(config: pytest.Config) -> list[int]:
    """The sizes of the memory groups: ``--bench-sizes`` or the tier's memory sizes."""
    raw = config.getoption("bench_sizes")
    return _parse_sizes(str(raw)) if raw is not None else list(tier(config).memory_sizes)


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "size" in metafunc.fixturenames:
        sizes = bench_sizes(metafunc.config)
        metafunc.parametrize("size", sizes, ids=[size_label(n) for n in sizes])
    if "mem_size" in metafunc.fixturenames:
        sizes = memory_sizes(metafunc.config)
        metafunc.parametrize("mem_size", sizes, ids=[size_label(n) for n in sizes])


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
    """The first ``n`` delayed messages of the gen-dump workload, shifted into the future.

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
    times = rng.integers(1, 10**12, size=n, dtype=np.int64)
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
    """``get(n)``: the first ``n`` delayed messages of the gen-dump workload, built once."""
    cache: dict[int, Delayed] = {}

    def get(n: int) -> Delayed:
        if n not in cache:
            cache[n] = _make_delayed(n, session_now_ms)
        return cache[n]

    return get


@pytest.fixture(scope="session")
def max_size(pytestconfig: pytest.Config) -> int:
    """Largest size of the sized groups: the size of the fixed-size groups."""
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


@pytest.fixture(autouse=True)
def _frozen_inputs() -> Iterator[None]:
    """Collect garbage, then keep everything alive now out of the collector's scans.

    The session's cached inputs (millions of Python ints in lists) would otherwise be walked by
    every full collection a benchmark triggers, charging the structure under test for the size
    of the inputs, and varying with whatever earlier benchmarks left behind.
    """
    gc.collect()
    gc.freeze()
    yield
    gc.unfreeze()


@pytest.fixture(autouse=True)
def _calibrated(request: pytest.FixtureRequest) -> Iterator[None]:
    """In a calibrated tier, each benchmark's ``extra_info["calibrated"]``: the median of its
    timed calls' time over the machine's speed at the moment (``calibration``)."""
    if not tier(request.config).calibrated:
        yield
        return
    calibration.begin()
    try:
        yield
    finally:
        collector = calibration.end()
    bench = request.node.funcargs.get("benchmark")
    if collector is not None and collector.samples and bench is not None:
        bench.extra_info[calibration.INFO_KEY] = collector.figure()
        bench.extra_info["calibration_loop_ms"] = round(statistics.median(collector.loops) * 1e3, 4)
        bench.extra_info["calibrated_samples"] = [round(x, 6) for x in collector.samples]


# -- Redis ----------------------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.fixture(scope="session")
def redis_client() -> Iterator[Any]:
    """A client of a private ``redis-server`` on 127.0.0.1 (started here, stopped at the end).

    Skips, saying why, when ``redis-server`` is not on PATH or the ``redis`` client package is
    missing. The server keeps nothing on disk (no RDB, no AOF).
    """
    server = shutil.which("redis-server")
    if server is None:
        pytest.skip("redis-server is not on PATH: the Redis ZSET baseline is not measured")
    try:
        import redis
    except ImportError:
        pytest.skip("the redis client package is missing (pip install -e '.[bench]')")
    port = _free_port()
    workdir = tempfile.mkdtemp(prefix="delayindex-bench-redis-")
    process = subprocess.Popen(
        [server, "--bind", "127.0.0.1", "--port", str(port), "--save", "", "--appendonly", "no",
         "--dir", workdir, "--loglevel", "warning"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )  # fmt: skip
    client = redis.Redis(host="127.0.0.1", port=port)
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                client.ping()
                break
            except redis.ConnectionError:
                if process.poll() is not None or time.monotonic() > deadline:
                    stderr = process.stderr.read().decode() if process.stderr else ""
                    process.kill()
                    pytest.fail(f"redis-server did not start on port {port}: {stderr}")
                time.sleep(0.05)
        yield client
    finally:
        client.close()
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        if process.stderr is not None:
            process.stderr.close()
        shutil.rmtree(workdir, ignore_errors=True)


# -- trackers -------------------------------------------------------------------------------------


class BenchEnv:
    """Makes the trackers of one benchmark and cleans up after it (see the module doc)."""

    def __init__(self, request: pytest.FixtureRequest) -> None:
        self._request = request
        self._live: list[Any] = []
        self._stores: list[Path] = []
        self._pure = False
        self._pure_cm: Any = None

    def prepare(self, kind: str) -> None:
        """Make ``kind`` usable in this test: skip, start Redis or swap in the pure build."""
        if kind not in KIND_LABELS:
            raise ValueError(f"unknown kind {kind!r}")
        if kind.startswith("triple_heap"):
            return  # the heap group picks its heap class itself
        if kind.endswith("-pure"):
            if not NATIVE:
                pytest.skip(
                    "the native extension is not in use: the default rows are the pure build"
                )
            if not self._pure:
                self._pure_cm = pure_build()
                self._pure_cm.__enter__()
                self._pure = True
        elif kind == "redis":
            self._request.getfixturevalue("redis_client")

    def store(self) -> Path:
        """A fresh FileStorage directory, removed at teardown."""
        path = Path(tempfile.mkdtemp(prefix="delayindex-bench-"))
        self._stores.append(path)
        return path

    def wall_clock(self) -> Callable[[], int]:
        """The wall clock of the build in use (the pure one inside ``pure_build``)."""
        clock: Callable[[], int] = _impl.wall_clock_ms
        return clock

    def make(self, kind: str, clock: Callable[[], int] | None = None) -> Any:
        """A fresh tracker of ``kind`` on ``clock`` (default: the build's wall clock).

        The previously made tracker is closed first: one live tracker at a time, so that a
        DelayIndex's background writes of the last round never overlap the next round.
        """
        self.prepare(kind)
        self.release()
        the_clock = clock if clock is not None else self.wall_clock()
        tracker: Any
        if kind.startswith("delay_index"):
            tracker = DelayIndex.open(FileStorage(self.store()), "bench", clock=the_clock)
        elif kind.startswith("in_memory"):
            tracker = InMemoryTracker(clock=the_clock)
        elif kind == "heapq":
            tracker = HeapqSetTracker(the_clock)
        elif kind == "sortedlist":
            tracker = SortedListSetTracker(the_clock)
        elif kind == "redis":
            tracker = RedisZsetTracker(self._request.getfixturevalue("redis_client"), the_clock)
        else:
            raise ValueError(f"{kind!r} is not a tracker kind")
        self._live.append(tracker)
        return tracker

    def release(self) -> None:
        """Close every live tracker and remove its store (untimed)."""
        while self._live:
            tracker = self._live.pop()
            close = getattr(tracker, "close", None)
            if close is not None:
                close()
        while self._stores:
            shutil.rmtree(self._stores.pop(), ignore_errors=True)

    def teardown(self) -> None:
        """Release everything, then restore the native build."""
        try:
            self.release()
        finally:
            if self._pure:
                self._pure_cm.__exit__(None, None, None)
                self._pure = False


@pytest.fixture
def env(request: pytest.FixtureRequest) -> Iterator[BenchEnv]:
    """The test's :class:`BenchEnv`, prepared for its ``kind`` parameter if it has one."""
    bench_env = BenchEnv(request)
    try:
        callspec = getattr(request.node, "callspec", None)
        kind = callspec.params.get("kind") if callspec is not None else None
        if isinstance(kind, str) and kind in KIND_LABELS:
            bench_env.prepare(kind)
        yield bench_env
    finally:
        bench_env.teardown()


def fill(tracker: Any, data: Delayed) -> None:
    """Track every message of ``data``: ``add_many`` where the tracker has it, else ``add``."""
    if isinstance(tracker, InMemoryTracker | DelayIndex | RedisZsetTracker):
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
    return fill


# -- summary --------------------------------------------------------------------------------------


@pytest.hookimpl(wrapper=True)
def pytest_benchmark_group_stats(
    config: pytest.Config, benchmarks: list[dict[str, Any]], group_by: str
) -> Iterator[None]:
    """Keep this run's flat benchmark records for :func:`pytest_terminal_summary`."""
    config.stash[_BENCH_GROUPS] = [bench for bench in benchmarks if bench.get("path") is None]
    return (yield)


@pytest.hookimpl(trylast=True)
def pytest_terminal_summary(
    terminalreporter: pytest.TerminalReporter, config: pytest.Config
) -> None:
    benchmarks = config.stash.get(_BENCH_GROUPS, [])
    if not benchmarks:
        return
    implementation = "native" if NATIVE else "pure (DELAYINDEX_NO_EXTENSIONS or no build)"
    terminalreporter.write_sep(
        "=",
        f"delayindex vs heapq (min times; tier {config.getoption('bench_tier')}; "
        f"default build: {implementation})",
    )
    for line in summary_lines(benchmarks):
        terminalreporter.write_line(line)
    peak = _peak_memory(config)
    if peak is not None:
        terminalreporter.write_line(peak_memory_line(peak))
    deselected = config.stash.get(_DESELECTED, 0)
    if deselected:
        terminalreporter.write_line(
            f"({deselected} full-tier benchmarks deselected: use --bench-tier full)"
        )
    if os.environ.get(SLOWDOWN_ENV):
        terminalreporter.write_line(
            f"{SLOWDOWN_ENV}={os.environ[SLOWDOWN_ENV]}: injected slowdown, not a real run"
        )
    scraper = config.stash.get(_SCRAPER, None)
    if scraper is not None:
        terminalreporter.write_line(scraper.stop())
