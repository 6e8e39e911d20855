"""Python tasks over a range of ids as plain RDD jobs, with Arrow record batches in and out.

How it works. :func:`range_tasks` gives the same result as
``spark.range(0, count, 1, tasks).mapInArrow(fn, schema).toArrow()`` without Spark SQL: the ids
are split into ``tasks`` contiguous slices by ``SparkContext.parallelize`` (the same split as
``spark.range``), each slice reaches ``fn`` as one record batch with an ``id`` column, and every
batch ``fn`` yields travels back as Arrow IPC bytes, joined in the driver into one table of
``schema``. The rebuild's scan (on a dump in topic order), its build and the workers' check
run this way.

Why: on a fresh JVM the first Spark SQL job costs about 1.3 s more than the same job as an RDD
(the analyzer, the optimizer and code generation starting cold), and each later one about 0.7 s
more; the tasks here take whole slices, so nothing in Spark SQL helps them. All three jobs being
RDD jobs, their Python workers are one pool: the check starts the workers the scan and the
build reuse (pyspark pools workers per kind of job).

Invariants: a batch whose column names or types differ from ``schema`` fails the job (Spark's
``mapInArrow`` would too); tasks import nothing pandas-related (see ``arrowbuf``).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from delayindex.spark.arrowbuf import arrow, int64_array

#: A task: record batches with an ``id`` column in, record batches out (``mapInArrow``'s kind).
ArrowTask = Callable[[Iterator[Any]], Iterator[Any]]

_FIELD = re.compile(r"^\s*([A-Za-z_][A-Za-z0-9_]*)\s+(string|long)\s*$")


def arrow_schema(ddl: str) -> Any:
    """The pyarrow schema of a Spark DDL string made of ``string`` and ``long`` fields.

    Raises:
        ValueError: a field is not ``name string`` or ``name long``.
    """
    pa = arrow()
    fields = []
    for part in ddl.split(","):
        match = _FIELD.match(part)
        if match is None:
            raise ValueError(f"unsupported schema field {part.strip()!r} in {ddl!r}")
        name, kind = match.groups()
        fields.append(pa.field(name, pa.string() if kind == "string" else pa.int64()))
    return pa.schema(fields)


def _run_slice(fn: ArrowTask, ddl: str, ids: Iterable[int]) -> Iterator[bytes]:
    """Executor: one slice of ids through ``fn``; each batch it yields as Arrow IPC bytes."""
    pa = arrow()
    schema = arrow_schema(ddl)
    values = list(ids)
    # As in spark.range's mapInArrow: an empty slice gets no batch at all.
    batches = [pa.RecordBatch.from_arrays([int64_array(values)], names=["id"])] if values else []
    for out in fn(iter(batches)):
        if out.num_rows == 0:
            continue
        if out.schema.names != schema.names or out.schema.types != schema.types:
            raise ValueError(f"a task yielded {out.schema}, expected {schema}")
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, schema) as writer:
            writer.write_batch(out)
        yield sink.getvalue().to_pybytes()


def range_tasks(spark: Any, count: int, tasks: int, fn: ArrowTask, ddl: str) -> Any:
    """Run ``fn`` over the ids ``0..count-1`` in ``tasks`` tasks; all their batches as one
    pyarrow table of the schema ``ddl`` (module docs).

    Raises:
        ValueError: ``count`` or ``tasks`` below 1, or a batch of another schema.
    """
    if count < 1 or tasks < 1:
        raise ValueError(f"count and tasks must be >= 1, got {count} and {tasks}")
    pa = arrow()
    schema = arrow_schema(ddl)
    job = functools.partial(_run_slice, fn, ddl)
    pieces = spark.sparkContext.parallelize(range(count), tasks).mapPartitions(job).collect()
    tables = [pa.ipc.open_stream(piece).read_all() for piece in pieces]
    return pa.concat_tables(tables) if tables else schema.empty_table()
