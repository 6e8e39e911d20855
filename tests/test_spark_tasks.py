"""``delayindex.spark.tasks.range_tasks``: the same table as ``spark.range(...).mapInArrow``,
without Spark SQL; and its schema rule."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from delayindex.spark.tasks import arrow_schema, range_tasks

_SCHEMA = "first long, last long, n long, text string"


def _describe(batches: Iterator[Any]) -> Iterator[Any]:
    """One row per input batch: its first and last id, its size and a text (ids as seen by
    one task, so a different split of the ids would show)."""
    import pyarrow as pa

    for batch in batches:
        ids = batch.column("id").to_pylist()
        yield pa.RecordBatch.from_arrays(
            [
                pa.array([ids[0]], pa.int64()),
                pa.array([ids[-1]], pa.int64()),
                pa.array([len(ids)], pa.int64()),
                pa.array([",".join(map(str, ids))], pa.string()),
            ],
            names=["first", "last", "n", "text"],
        )


def test_arrow_schema_reads_string_and_long_fields() -> None:
    schema = arrow_schema("a long, b string")
    assert schema.names == ["a", "b"]
    assert [str(t) for t in schema.types] == ["int64", "string"]
    for bad in ("a int", "a long, ", "long"):
        with pytest.raises(ValueError, match="unsupported schema field"):
            arrow_schema(bad)


@pytest.mark.spark
@pytest.mark.parametrize(("count", "tasks"), [(1, 1), (5, 2), (7, 3), (2, 2), (3, 5)])
def test_range_tasks_splits_and_returns_what_map_in_arrow_does(
    spark: Any, count: int, tasks: int
) -> None:
    ours = range_tasks(spark, count, tasks, _describe, _SCHEMA)
    sql = spark.range(0, count, 1, tasks).mapInArrow(_describe, _SCHEMA).toArrow()
    key = [("first", "ascending")]
    assert ours.schema == sql.schema
    assert ours.sort_by(key).to_pylist() == sql.sort_by(key).to_pylist()
    assert sum(ours.column("n").to_pylist()) == count


@pytest.mark.spark
def test_range_tasks_refuses_a_batch_of_another_schema(spark: Any) -> None:
    def wrong(batches: Iterator[Any]) -> Iterator[Any]:
        import pyarrow as pa

        for batch in batches:
            yield pa.RecordBatch.from_arrays([batch.column("id")], names=["other"])

    with pytest.raises(Exception, match="a task yielded"):
        range_tasks(spark, 2, 1, wrong, "id long")


@pytest.mark.spark
def test_range_tasks_without_rows_gives_an_empty_table_of_the_schema(spark: Any) -> None:
    def nothing(batches: Iterator[Any]) -> Iterator[Any]:
        yield from ()

    table = range_tasks(spark, 3, 2, nothing, _SCHEMA)
    assert table.num_rows == 0 and table.schema == arrow_schema(_SCHEMA)
    with pytest.raises(ValueError, match="must be >= 1"):
        range_tasks(spark, 0, 1, nothing, _SCHEMA)
