"""Shared fixtures: implementation pairs (native/pure), clocks, hypothesis profiles, Spark.

Tests import the *installed* package (``--import-mode=importlib``). The public API uses whatever
``delayindex._impl`` selected (``DELAYINDEX_NO_EXTENSIONS=1`` forces pure; CI runs the suite both
ways); structure-level tests additionally run every available twin in the same session.

Spark tests (marked ``spark``) share one session-scoped local SparkSession (one JVM for the
run). They skip when pyspark/pyarrow or a Java 17+ is missing, except under ``CI``, where a
missing Spark set-up fails them instead: CI must run them.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, settings

from delayindex import ManualClock, _impl

settings.register_profile(
    "ci", max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.register_profile("dev", max_examples=60, deadline=None)
settings.register_profile("thorough", max_examples=2000, deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci" if os.environ.get("CI") else "dev"))

NATIVE_BUILT = _impl.native_module_or_none() is not None


def _native(name: str) -> Any:
    module = _impl.native_module_or_none()
    if module is None:
        pytest.fail("the native extension delayindex._native is not built; reinstall the package")
    return getattr(module, name)


HEAP_IMPLS: dict[str, Callable[[], Any]] = {
    "native": lambda: _native("TripleHeap"),
    "pure": lambda: _impl.PureTripleHeap,
}
CORE_IMPLS: dict[str, Callable[[], Any]] = {
    "native": lambda: _native("TrackerCore"),
    "pure": lambda: _impl.PureTrackerCore,
}

BIN_IMPLS: dict[str, Callable[[], Any]] = {
    "native": lambda: _native("BinIndex"),
    "pure": lambda: _impl.PureBinIndex,
}


@pytest.fixture(params=sorted(HEAP_IMPLS))
def heap_cls(request: pytest.FixtureRequest) -> Any:
    """Each TripleHeap implementation in turn (the heap contract suite binds to this)."""
    return HEAP_IMPLS[request.param]()


@pytest.fixture(params=sorted(CORE_IMPLS))
def core_cls(request: pytest.FixtureRequest) -> Any:
    """Each TrackerCore implementation in turn."""
    return CORE_IMPLS[request.param]()


@pytest.fixture(params=sorted(BIN_IMPLS))
def bin_cls(request: pytest.FixtureRequest) -> Any:
    """Each BinIndex implementation in turn."""
    return BIN_IMPLS[request.param]()


@pytest.fixture
def clock() -> ManualClock:
    """A manual clock at t = 1_000_000 ms."""
    return ManualClock(1_000_000)


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    """One local SparkSession for the whole run: ``local[2]``, 2 shuffle partitions, quick JVM
    start. Skips without pyspark/pyarrow/Java 17+, but fails under ``CI``."""
    from delayindex.spark import SparkUnavailableError, find_java_home, local_session, require_spark

    try:
        require_spark()
        if find_java_home() is None:
            raise SparkUnavailableError("no Java 17+ found (JAVA_HOME, PATH, /usr/lib/jvm)")
    except SparkUnavailableError as exc:
        if os.environ.get("CI"):
            pytest.fail(f"Spark tests must run in CI: {exc}")
        pytest.skip(f"Spark unavailable: {exc}")
    session = local_session("local[2]", shuffle_partitions=2, app_name="delayindex-tests")
    yield session
    session.stop()


def run_spark_process(
    args: Sequence[str],
    cwd: Path,
    env: dict[str, str] | None = None,
    timeout: float = 300,
) -> tuple[subprocess.CompletedProcess[str], list[str]]:
    """Run ``python *args`` in ``cwd`` (the environment plus ``env``, the driver bound to the
    loopback), assert that it exited 0, and return it with its *tagged* lines: the stdout lines
    whose first word is upper case (the script's reports, not the JVM's log)."""
    done = subprocess.run(
        [sys.executable, *args],
        cwd=cwd,
        env={**os.environ, "SPARK_LOCAL_IP": "127.0.0.1", **(env or {})},
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    tagged = [line for line in done.stdout.splitlines() if line.split(" ")[0].isupper()]
    return done, tagged


@pytest.fixture(name="run_spark_process")
def _run_spark_process_fixture() -> Callable[
    ..., tuple[subprocess.CompletedProcess[str], list[str]]
]:
    """:func:`run_spark_process`, for tests whose Spark session needs a JVM of its own (a
    process has one SparkContext, and the shared ``spark`` fixture holds it)."""
    return run_spark_process
