"""Spark sessions made outside ``delayindex.spark``: their Python workers are checked up front;
and the class archive of ``local_session``, written by one session's JVM and mapped by the next.

A session whose workers run a Python without delayindex must fail with
:class:`~delayindex.spark.SparkUnavailableError` saying how to fix it, before the first stage,
not with a worker's bare ``ModuleNotFoundError``. Such a session needs its own JVM (a process
has one SparkContext, and the shared ``spark`` fixture holds it), so it runs in a subprocess
whose workers run this interpreter with ``-S``: no site-packages, hence no delayindex (pyspark
itself still comes from the ``PYTHONPATH`` Spark gives its workers).
"""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from delayindex.spark import check_workers

pytestmark = pytest.mark.spark

_BAD_SESSION = textwrap.dedent(
    """
    import os, sys
    from delayindex.dump import generate_dump, write_dump
    from delayindex.spark import SparkUnavailableError, rebuild, verify
    from delayindex.spark.session import QUICK_START_OPTIONS, find_java_home

    os.environ["JAVA_HOME"] = find_java_home()
    from pyspark.sql import SparkSession

    worker_python, dump, store = sys.argv[1:4]
    spark = (
        SparkSession.builder.master("local[1]")
        .appName("bad-workers")
        .config("spark.pyspark.python", worker_python)
        .config("spark.driver.extraJavaOptions", QUICK_START_OPTIONS)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.driver.host", "127.0.0.1")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("OFF")
    columns = generate_dump(200, entries_per_ledger=50)
    write_dump(dump, columns)
    now = int(columns.publish_time.max()) + 1
    for job in (rebuild, verify):
        if job is verify:  # verify needs a store; the rebuild must not have made one
            print("STORE", os.path.exists(store), flush=True)
            from delayindex import FileStorage

            FileStorage(store).close()
        try:
            job(spark, dump, store, "topic", now_ms=now)
        except SparkUnavailableError as exc:
            print("UNAVAILABLE", job.__name__, exc, flush=True)
        except Exception as exc:
            print("OTHER", job.__name__, type(exc).__name__, exc, flush=True)
        else:
            print("RAN", job.__name__, flush=True)
    spark.stop()
    """
)


def test_workers_that_can_import_delayindex_pass_once(spark: Any) -> None:
    answer = check_workers(spark)
    import delayindex

    if answer is not None:  # None: an earlier test already checked this application
        version, path = answer.split(" ", 1)
        assert version == delayindex.__version__
        assert Path(path) == Path(delayindex.__file__)
    assert check_workers(spark) is None  # cached: no second job


def test_workers_without_delayindex_fail_up_front(
    spark: Any, tmp_path: Path, run_spark_process: Any
) -> None:
    # ``spark`` only for its skip rules (Java, pyspark); the bad session is another process's.
    worker = tmp_path / "python-without-delayindex"
    worker.write_text(f'#!/bin/sh\nexec "{sys.executable}" -S "$@"\n')
    worker.chmod(0o755)
    store = tmp_path / "store"
    done, lines = run_spark_process(
        ["-c", _BAD_SESSION, str(worker), str(tmp_path / "d.parquet"), str(store)],
        tmp_path,
        env={"PYSPARK_PYTHON": str(worker)},
    )
    assert len(lines) == 3, done.stdout + done.stderr[-3000:]
    assert lines[1] == "STORE False"  # the rebuild was refused before it made the store
    for line, job in zip(lines[::2], ("rebuild_dump", "verify_dump"), strict=True):
        assert line.startswith(f"UNAVAILABLE {job} "), line
        assert "cannot import delayindex" in line and "PYSPARK_PYTHON" in line
        assert "ModuleNotFoundError: No module named 'delayindex'" in line


# -- the class archive: written by one session's JVM, mapped by the next ---------------------------

_ARCHIVE_SESSIONS = textwrap.dedent(
    """
    import sys
    from pathlib import Path
    from pyspark import SparkContext
    from delayindex.spark import local_session, stop_jvm

    archive = Path(sys.argv[1])
    for round in ("first", "second"):
        spark = local_session("local[1]", class_archive=archive, log_level="OFF")
        maps = Path(f"/proc/{SparkContext._gateway.proc.pid}/maps")
        mapped = maps.is_file() and str(archive) in maps.read_text()
        print("ROUND", round, spark.range(5).count(), mapped, flush=True)
        spark.stop()
        stop_jvm()  # waits for the JVM: the first one writes the archive as it exits
        print("FILES", round, sorted(p.name for p in archive.parent.iterdir()), flush=True)
    """
)


def test_a_class_archive_is_written_once_then_mapped(
    spark: Any, tmp_path: Path, run_spark_process: Any
) -> None:
    # ``spark`` only for its skip rules; these sessions need their own JVMs, one after another.
    archive = tmp_path / "cache" / "classes.jsa"
    done, _ = run_spark_process(["-c", _ARCHIVE_SESSIONS, str(archive)], tmp_path, timeout=600)
    lines = done.stdout.splitlines()
    assert all(line.split(" ")[0] in ("ROUND", "FILES") for line in lines), lines  # no JVM log
    on_linux = sys.platform.startswith("linux")
    assert lines == [
        "ROUND first 5 False",  # no archive yet: the JVM loads its classes from the jars
        "FILES first ['classes.jsa']",  # written when it exited, no temporary file left
        f"ROUND second 5 {on_linux}",  # mapped (visible in /proc on Linux)
        "FILES second ['classes.jsa']",
    ]
