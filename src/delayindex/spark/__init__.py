"""Spark jobs over topic dumps: rebuild an index offline, verify a store against its topic.

``delayindex.spark`` depends on the core, never the reverse: pyspark is imported only here and
only when a session is made or a job runs (the ``spark`` extra: ``pip install
'delayindex[spark]'``; Java 17+). Typical use::

    from delayindex.spark import local_session, rebuild, verify

    spark = local_session("local[*]")
    report = rebuild(spark, "topic.parquet", "/data/store", "orders", now_ms=now)
    check = verify(spark, "topic.parquet", "/data/store", "orders", now_ms=now)
    assert check.ok

:func:`rebuild` is :func:`delayindex.spark.job.rebuild_dump` (how it works is documented
there); :func:`verify` is :func:`delayindex.spark.job.verify_dump`.
"""

from delayindex.spark.job import (
    DumpRebuildReport,
    DumpVerifyReport,
    rebuild_dump,
    verify_dump,
)
from delayindex.spark.scan import check_dump, scans_without_shuffle
from delayindex.spark.session import (
    LazySparkSession,
    SparkUnavailableError,
    check_workers,
    default_class_archive,
    find_java_home,
    java_major_version,
    local_session,
    require_spark,
    session_for,
    stop_jvm,
    stop_session,
)

rebuild = rebuild_dump
verify = verify_dump

__all__ = [
    "DumpRebuildReport",
    "DumpVerifyReport",
    "LazySparkSession",
    "SparkUnavailableError",
    "check_dump",
    "check_workers",
    "default_class_archive",
    "find_java_home",
    "java_major_version",
    "local_session",
    "rebuild",
    "rebuild_dump",
    "require_spark",
    "scans_without_shuffle",
    "session_for",
    "stop_jvm",
    "stop_session",
    "verify",
    "verify_dump",
]
