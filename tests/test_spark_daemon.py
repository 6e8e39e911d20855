"""The Python daemon of local sessions (``delayindex.spark._daemon``): pyspark loaded from the
installed package instead of Spark's zip, and the job's modules imported once, in the daemon.

The layout rule is tested on made-up directories; the daemon itself through the shared
``spark`` fixture (a ``local_session``), whose workers report where their modules came from.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import threading
from pathlib import Path
from typing import Any

import pytest

from delayindex.spark._daemon import (
    PRELOADED_MODULES,
    installed_pyspark_zips,
    prefer_installed_pyspark,
    preload,
)
from delayindex.spark.session import LOCAL_DAEMON_MODULE, stop_session


def _pip_layout(root: Path) -> tuple[Path, list[str]]:
    """site-packages/pyspark with its python/lib zips, as ``pip install pyspark`` lays it out."""
    home = root / "site-packages" / "pyspark"
    lib = home / "python" / "lib"
    lib.mkdir(parents=True)
    (home / "__init__.py").write_text("")
    zips = [str(lib / "pyspark.zip"), str(lib / "py4j-0.10.9.9-src.zip")]
    for z in zips:
        Path(z).write_bytes(b"")
    return home, zips


def test_the_installed_packages_own_zips_are_found(tmp_path: Path) -> None:
    home, zips = _pip_layout(tmp_path)
    path = ["", *zips, "/usr/lib/python311.zip", str(home.parent)]
    assert installed_pyspark_zips(path, str(home)) == zips


@pytest.mark.parametrize("layout", ["no-home", "distribution", "not-on-path", "no-init"])
def test_any_other_layout_is_left_alone(tmp_path: Path, layout: str) -> None:
    home, zips = _pip_layout(tmp_path)
    path = [*zips, str(home.parent)]
    spark_home: str | None = str(home)
    if layout == "no-home":
        spark_home = None
    elif layout == "distribution":  # a Spark distribution: its zips may differ from pyspark's
        dist = tmp_path / "spark-4.0.0-bin-hadoop3"
        (dist / "python" / "lib").mkdir(parents=True)
        path = [str(dist / "python" / "lib" / "pyspark.zip"), str(home.parent)]
        spark_home = str(dist)
    elif layout == "not-on-path":
        path = list(zips)
    else:
        (home / "__init__.py").unlink()
    assert installed_pyspark_zips(path, spark_home) == []


def test_prefer_installed_pyspark_moves_the_zips_last(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    home, zips = _pip_layout(tmp_path)
    monkeypatch.setenv("SPARK_HOME", str(home))
    monkeypatch.setattr(sys, "path", ["", *zips, "/x", str(home.parent)])
    assert prefer_installed_pyspark() == zips
    assert sys.path == ["", "/x", str(home.parent), *zips]


def test_preload_names_what_failed() -> None:
    assert preload(("json", "delayindex_no_such_module")) == ["delayindex_no_such_module"]
    assert "delayindex.spark.job" in PRELOADED_MODULES


@pytest.mark.spark
def test_local_workers_fork_from_the_delayindex_daemon(spark: Any) -> None:
    import pyspark

    assert spark.sparkContext.getConf().get("spark.python.daemon.module") == LOCAL_DAEMON_MODULE

    def report(_rows: Any) -> Any:
        # Pickled by value; runs in a forked worker, before it imports anything itself.
        import sys as worker_sys

        preloaded = "delayindex.spark.job" in worker_sys.modules
        import pyspark as worker_pyspark

        yield (worker_pyspark.__file__, preloaded)

    [(worker_file, preloaded)] = (
        spark.sparkContext.parallelize([0], 1).mapPartitions(report).collect()
    )
    assert preloaded
    # The driver's pyspark is the installed package; so is the workers', not Spark's zip.
    assert Path(worker_file) == Path(pyspark.__file__)


# -- stopping a session without waiting for the accumulator server's poll -----------------------


class _Server:
    def __init__(self) -> None:
        self.stopped = threading.Event()

    def shutdown(self) -> None:
        self.stopped.set()


class _Context:
    def __init__(self, server: Any) -> None:
        self._accumulatorServer = server


class _Session:
    def __init__(self, server: Any) -> None:
        self.sparkContext = _Context(server)
        self.server_at_stop: Any = "not stopped"

    def stop(self) -> None:
        self.server_at_stop = self.sparkContext._accumulatorServer


def test_stop_session_leaves_the_accumulator_server_to_a_thread() -> None:
    server = _Server()
    session = _Session(server)
    stop_session(session)
    assert session.server_at_stop is None  # pyspark's stop() no longer waits for it
    assert server.stopped.wait(10)  # but it is stopped all the same


def test_stop_session_of_a_pyspark_without_that_server_just_stops() -> None:
    session = _Session(None)
    stop_session(session)
    assert session.server_at_stop is None
    session = _Session(object())  # no shutdown(): left to stop() as it is
    server = session.sparkContext._accumulatorServer
    stop_session(session)
    assert session.server_at_stop is server


# -- a lazy session: Spark SQL only when something needs it -------------------------------------

_LAZY_SESSION = textwrap.dedent(
    """
    import sys
    from delayindex.dump import generate_dump, write_dump
    from delayindex.spark import rebuild
    from delayindex.spark.session import LazySparkSession, local_session, session_for

    dump, store = sys.argv[1:3]
    columns = generate_dump(2000, entries_per_ledger=100)
    write_dump(dump, columns)  # in topic order: the scan needs no Spark SQL
    now = int(columns.publish_time.min())
    with session_for("local[1]", lazy=True, log_level="OFF") as spark:
        print("LAZY", isinstance(spark, LazySparkSession), spark.sql_started, flush=True)
        report = rebuild(spark, dump, store, "topic", now_ms=now)
        print("REBUILT", report.tracked > 0, spark.sql_started, flush=True)
        with session_for("local[1]") as same:  # a running context: adopted, not stopped
            print("ADOPTED", same.sparkContext is spark.sparkContext, flush=True)
        print("SQL", spark.range(3).count(), spark.sql_started, flush=True)
    from pyspark import SparkContext
    print("STOPPED", SparkContext._active_spark_context is None, flush=True)
    """
)


@pytest.mark.spark
def test_a_lazy_session_starts_spark_sql_only_when_used(
    spark: Any, tmp_path: Path, run_spark_process: Any
) -> None:
    # ``spark`` only for its skip rules: the lazy session needs a JVM of its own.
    done, lines = run_spark_process(
        ["-c", _LAZY_SESSION, str(tmp_path / "d.parquet"), str(tmp_path / "s")], tmp_path
    )
    assert lines == [
        "LAZY True False",
        "REBUILT True False",  # the whole rebuild ran as RDD jobs
        "ADOPTED True",
        "SQL 3 True",
        "STOPPED True",
    ], done.stdout + done.stderr[-3000:]


# -- the command's exit after Spark: atexit handlers run, the teardown is skipped -------------

_EXIT_NOW = textwrap.dedent(
    """
    import atexit, sys, threading, time
    from pathlib import Path
    from delayindex.cli import exit_now

    out = Path(sys.argv[1])
    atexit.register(lambda: (out / "atexit").write_text("ran"))
    if sys.argv[2] == "thread":
        def late():
            time.sleep(0.3)
            (out / "thread").write_text("done")
        threading.Thread(target=late).start()
    print("printed", end="")  # no newline: still buffered when exit_now is called
    exit_now(7)
    """
)


@pytest.mark.parametrize("thread", ["none", "thread"])
def test_exit_now_runs_the_atexit_handlers_and_waits_for_threads(
    tmp_path: Path, thread: str
) -> None:
    done = subprocess.run(
        [sys.executable, "-c", _EXIT_NOW, str(tmp_path), thread],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 7, done.stderr
    assert done.stdout == "printed"
    assert (tmp_path / "atexit").read_text() == "ran"
    if thread == "thread":  # a non-daemon thread: the usual exit, which waits for it
        assert (tmp_path / "thread").read_text() == "done"


@pytest.mark.spark
def test_the_rebuild_command_exits_cleanly(
    spark: Any, tmp_path: Path, run_spark_process: Any
) -> None:
    # ``spark`` only for its skip rules: the command is its own process with its own JVM.
    from delayindex.dump import generate_dump, write_dump

    columns = generate_dump(500, entries_per_ledger=50)
    assert columns.publish_time is not None  # the generator writes one
    write_dump(tmp_path / "d.parquet", columns)
    temp = tmp_path / "tmp"
    temp.mkdir()
    args = [
        "-m", "delayindex", "rebuild", str(tmp_path / "d.parquet"),
        "--store", str(tmp_path / "store"), "--name", "topic", "--master", "local[1]",
        "--now-ms", str(int(columns.publish_time.min())), "--json", "--no-progress",
    ]  # fmt: skip
    done, _ = run_spark_process(args, tmp_path, env={"TMPDIR": str(temp)})
    report = json.loads(done.stdout)  # complete: flushed before the exit
    assert report["exit_code"] == 0 and report["tracked"] > 0
    # The session's scratch directory is removed by an atexit handler: they ran.
    assert not list(temp.glob("delayindex-spark-*")), list(temp.iterdir())
