"""Topic dumps (``delayindex.dump``): round trips, every reject reason in every format, strict
mode, directories of parts, the generator's shapes and determinism, and ``delayindex gen-dump``.

Bad rows are seeded by writing files directly (pyarrow, or text by hand), never through
``write_dump``, which refuses invalid ids.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, cast

import numpy as np
import numpy.typing as npt
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from delayindex.cli import EXIT_OK, EXIT_USAGE, main
from delayindex.dump import (
    DUMP_FORMATS,
    ENTRY_ID_LIMIT,
    GEN_BLOCK_ROWS,
    MAX_EXAMPLES,
    REASONS,
    DumpColumns,
    DumpError,
    DumpWriter,
    RejectReport,
    check_rows,
    detect_format,
    find_conflicts,
    find_duplicates,
    generate_dump,
    iter_generated,
    read_dump,
    resolve_duplicates,
    validate_batch,
    write_dump,
)
from delayindex.workload import DAY_MS, DEFAULT_START_MS

COLUMN_NAMES = ("ledger_id", "entry_id", "deliver_at", "publish_time")


def assert_same(got: DumpColumns, want: DumpColumns) -> None:
    """Column-by-column equality (publish_time too, when either has it)."""
    assert len(got) == len(want)
    for name in ("ledger_ids", "entry_ids", "deliver_at"):
        np.testing.assert_array_equal(getattr(got, name), getattr(want, name), err_msg=name)
    if want.publish_time is None:
        assert got.publish_time is None
    else:
        assert got.publish_time is not None
        np.testing.assert_array_equal(got.publish_time, want.publish_time)


def dump_columns(
    ledger_ids: npt.ArrayLike,
    entry_ids: npt.ArrayLike,
    deliver_at: npt.ArrayLike,
    publish_time: npt.ArrayLike | None = None,
) -> DumpColumns:
    """``DumpColumns`` of array-likes, which it coerces (the casts only satisfy mypy: its
    dataclass fields, hence its ``__init__``, are annotated with the coerced type)."""
    return DumpColumns(
        cast(npt.NDArray[np.int64], ledger_ids),
        cast(npt.NDArray[np.int64], entry_ids),
        cast(npt.NDArray[np.int64], deliver_at),
        cast("npt.NDArray[np.int64] | None", publish_time),
    )


# -- round trips ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name", ["d.parquet", "d.jsonl", "d.csv", "d.json", "d.csv.gz", "d.jsonl.zst"]
)
def test_round_trip(tmp_path: Path, name: str) -> None:
    columns = generate_dump(3000, entries_per_ledger=128, delayed_fraction=0.4, seed=3)
    path = write_dump(tmp_path / name, columns)
    got, report = read_dump(path)
    assert_same(got, columns)
    assert report.ok and report.total_rows == report.kept_rows == 3000
    assert report.counts == dict.fromkeys(REASONS, 0)
    assert sorted(os.listdir(tmp_path)) == [name]  # no temporary file left behind


def test_not_delayed_is_written_as_null(tmp_path: Path) -> None:
    columns = generate_dump(2000, delayed_fraction=0.25, seed=1)
    table = pq.read_table(write_dump(tmp_path / "d.parquet", columns))
    assert table.column("deliver_at").null_count == int(np.count_nonzero(~columns.delayed_mask))
    assert table.column("ledger_id").null_count == 0
    first_line = (write_dump(tmp_path / "d.jsonl", columns)).read_text().splitlines()[0]
    assert set(json.loads(first_line)) == set(COLUMN_NAMES)


def test_explicit_format_wins_over_the_name(tmp_path: Path) -> None:
    columns = generate_dump(500, seed=2)
    path = write_dump(tmp_path / "dump.data", columns, fmt="csv")
    assert path.read_text().startswith("ledger_id,entry_id,deliver_at,publish_time")
    assert_same(read_dump(path, fmt="csv")[0], columns)
    with pytest.raises(DumpError, match="cannot tell the dump format"):
        read_dump(path)
    with pytest.raises(DumpError, match="unknown dump format"):
        read_dump(path, fmt="xml")
    assert detect_format("a/part-0.snappy.parquet") == "parquet"
    assert detect_format("x.ndjson.gz") == "jsonl"
    assert detect_format("x.txt") is None


def test_empty_dumps(tmp_path: Path) -> None:
    empty = generate_dump(0)
    assert len(empty) == 0 and empty.publish_time is not None
    for fmt in DUMP_FORMATS:
        got, report = read_dump(write_dump(tmp_path / f"e.{fmt}", empty))
        assert len(got) == 0 and report.total_rows == 0 and report.ok


def test_missing_publish_time_column_is_fine(tmp_path: Path) -> None:
    full = generate_dump(300, seed=5)
    columns = DumpColumns(full.ledger_ids, full.entry_ids, full.deliver_at)
    for fmt in DUMP_FORMATS:
        got, report = read_dump(write_dump(tmp_path / f"p.{fmt}", columns))
        assert report.ok and got.publish_time is None
        assert_same(got, columns)


def test_missing_required_column_is_a_dump_error(tmp_path: Path) -> None:
    pq.write_table(pa.table({"ledger_id": [1], "entry_id": [0]}), tmp_path / "m.parquet")
    with pytest.raises(DumpError, match=r"missing column.*deliver_at"):
        read_dump(tmp_path / "m.parquet")
    (tmp_path / "m.csv").write_text("ledger_id,deliver_at\n1,5\n")
    with pytest.raises(DumpError, match=r"missing column.*entry_id"):
        read_dump(tmp_path / "m.csv")
    with pytest.raises(FileNotFoundError):
        read_dump(tmp_path / "absent.parquet")
    (tmp_path / "junk.parquet").write_bytes(b"not parquet at all")
    with pytest.raises(DumpError, match="not a readable Parquet file"):
        read_dump(tmp_path / "junk.parquet")


def test_json_writers_omit_null_fields(tmp_path: Path) -> None:
    # Spark's JSON writer drops null fields: a missing deliver_at means "not delayed", a missing
    # ledger_id is a null id (counted, never dropped silently).
    path = tmp_path / "omit.jsonl"
    path.write_text('{"ledger_id": 1, "entry_id": 0}\n{"entry_id": 1, "deliver_at": 9}\n')
    got, report = read_dump(path)
    assert got.deliver_at.tolist() == [-1]
    assert report.counts["null_id"] == 1
    assert report.examples["null_id"][0]["row"] == 1


# -- every reject reason, in every format ---------------------------------------------------------

# (ledger_id, entry_id, deliver_at, expected reason or None if kept); cells as Python values.
SEEDED: list[tuple[Any, Any, Any, str | None]] = [
    (1, 0, 100, None),  # 0
    (None, 1, 100, "null_id"),  # 1
    ("abc", 2, 100, "wrong_type"),  # 2
    (-1, 3, 100, "negative_id"),  # 3
    (1, ENTRY_ID_LIMIT, 100, "entry_id_too_large"),  # 4
    (1, ENTRY_ID_LIMIT - 1, 100, None),  # 5: the largest entry id
    (2, 0, 500, None),  # 6
    (2, 0, 500, "duplicate"),  # 7: identical to row 6
    (3, 0, 100, "conflicting_duplicate"),  # 8
    (3, 0, 200, "conflicting_duplicate"),  # 9
    (3, 0, 100, "conflicting_duplicate"),  # 10: agrees with row 8, still rejected
    (4, 5, "soon", "wrong_type"),  # 11
    (4, 0, None, None),  # 12: not delayed
    (4, 1, -5, None),  # 13: not delayed
    (4, None, 7, "null_id"),  # 14
    (1.5, 2, 7, "wrong_type"),  # 15
    ("5.0", 0, 9, None),  # 16: an integral float written as text
    (2**63, 0, 9, "wrong_type"),  # 17: beyond int64
    (0, -7, 9, "negative_id"),  # 18
]
KEPT = [(1, 0, 100), (1, ENTRY_ID_LIMIT - 1, 100), (2, 0, 500), (4, 0, -1), (4, 1, -1), (5, 0, 9)]


def expected_counts() -> dict[str, int]:
    counts = dict.fromkeys(REASONS, 0)
    for *_, reason in SEEDED:
        if reason is not None:
            counts[reason] += 1
    return counts


def rows_of(reason: str) -> list[int]:
    return [i for i, row in enumerate(SEEDED) if row[3] == reason]


def write_seeded(path: Path, fmt: str) -> None:
    cells = [row[:3] for row in SEEDED]
    if fmt == "jsonl":
        lines = [json.dumps(dict(zip(COLUMN_NAMES, row, strict=False))) for row in cells]
        path.write_text("\n".join(lines) + "\n")
    elif fmt == "csv":
        text = ["ledger_id,entry_id,deliver_at"]
        text += [",".join("" if c is None else str(c) for c in row) for row in cells]
        path.write_text("\n".join(text) + "\n")
    else:  # Parquet holds one type per column: strings, the way a loose exporter writes them
        columns = list(zip(*cells, strict=True))
        table = pa.table(
            {
                name: pa.array([None if c is None else str(c) for c in col], pa.string())
                for name, col in zip(COLUMN_NAMES, columns, strict=False)
            }
        )
        pq.write_table(table, path)


def check_seeded(got: DumpColumns, report: RejectReport, file: str | None = None) -> None:
    assert report.counts == expected_counts()
    assert report.total_rows == len(SEEDED)
    assert report.errors == sum(report.counts[r] for r in REASONS if r != "duplicate") == 12
    assert report.duplicates == 1 and report.kept_rows == len(KEPT) and not report.ok
    assert list(zip(got.ledger_ids, got.entry_ids, got.deliver_at, strict=True)) == KEPT
    for reason in REASONS:
        examples = report.examples[reason]
        assert [ex["row"] for ex in examples] == rows_of(reason)[:MAX_EXAMPLES], reason
        for ex in examples:
            assert ex["detail"]
            if file is not None:
                assert ex["file"] == file and ex["file_row"] == ex["row"]
    wrong = {ex["row"]: ex for ex in report.examples["wrong_type"]}
    assert wrong[2]["ledger_id"] == "abc" and "ledger_id" in wrong[2]["detail"]
    assert "deliver_at" in wrong[11]["detail"]
    assert "2**32" in report.examples["entry_id_too_large"][0]["detail"]
    assert "repeats row 6" in report.examples["duplicate"][0]["detail"]
    assert "200" in report.examples["conflicting_duplicate"][0]["detail"]
    json.dumps(report.to_json())  # examples are JSON-ready


@pytest.mark.parametrize("fmt", DUMP_FORMATS)
def test_every_reason_is_counted_with_examples(tmp_path: Path, fmt: str) -> None:
    path = tmp_path / f"bad.{fmt}"
    write_seeded(path, fmt)
    got, report = read_dump(path)
    check_seeded(got, report, file=str(path))


@pytest.mark.parametrize("fmt", DUMP_FORMATS)
def test_strict_fails_on_the_first_problem(tmp_path: Path, fmt: str) -> None:
    path = tmp_path / f"bad.{fmt}"
    write_seeded(path, fmt)
    with pytest.raises(DumpError, match="null_id at row 1") as caught:
        read_dump(path, strict=True)
    assert caught.value.report is not None and caught.value.report.counts["null_id"] == 2


def test_strict_accepts_identical_duplicates_but_not_conflicts(tmp_path: Path) -> None:
    dup = pa.table({"ledger_id": [1, 1, 2], "entry_id": [0, 0, 0], "deliver_at": [5, 5, None]})
    pq.write_table(dup, tmp_path / "dup.parquet")
    got, report = read_dump(tmp_path / "dup.parquet", strict=True)
    assert len(got) == 2 and report.ok and report.duplicates == 1
    clash = pa.table({"ledger_id": [1, 1], "entry_id": [0, 0], "deliver_at": [5, None]})
    pq.write_table(clash, tmp_path / "clash.parquet")
    with pytest.raises(DumpError, match="conflicting_duplicate at row 0"):
        read_dump(tmp_path / "clash.parquet", strict=True)
    got, report = read_dump(tmp_path / "clash.parquet")
    assert len(got) == 0 and report.counts["conflicting_duplicate"] == 2


def test_typed_parquet_and_json_bad_numbers(tmp_path: Path) -> None:
    # Typed columns (no strings): nulls, negatives, 2**32, fractions, NaN, unsigned overflow.
    table = pa.table(
        {
            "ledger_id": pa.array([1, None, 3, 4, 5, 2**63 + 1], pa.uint64()),
            "entry_id": pa.array([0, 0, -1, 2**32, 0, 0], pa.int64()),
            "deliver_at": pa.array([1.0, 2.0, 3.0, 4.0, 2.5, float("nan")], pa.float64()),
            "publish_time": pa.array([7, 7, 7, 7, 7, None], pa.int32()),
        }
    )
    pq.write_table(table, tmp_path / "t.parquet")
    got, report = read_dump(tmp_path / "t.parquet")
    assert (report.counts["null_id"], report.counts["negative_id"]) == (1, 1)
    assert report.counts["entry_id_too_large"] == 1
    assert report.counts["wrong_type"] == 2  # 2.5, and a uint64 beyond int64
    assert got.ledger_ids.tolist() == [1] and got.deliver_at.tolist() == [1]
    assert got.publish_time is not None and got.publish_time.tolist() == [7]

    lines = [
        '{"ledger_id": 1, "entry_id": 0, "deliver_at": 5}',
        '{"ledger_id": 2, "entry_id": 0, "deliver_at": 5.5}',
        '{"ledger_id": 3, "entry_id": 0, "deliver_at": 99999999999999999999}',
        '{"ledger_id": 4, "entry_id": 4294967296, "deliver_at": null}',
        '{"ledger_id": 5, "entry_id": 0, "deliver_at": 1e3}',
    ]
    (tmp_path / "t.jsonl").write_text("\n".join(lines) + "\n")
    got, report = read_dump(tmp_path / "t.jsonl")
    assert report.counts["wrong_type"] == 2 and report.counts["entry_id_too_large"] == 1
    assert list(zip(got.ledger_ids, got.deliver_at, strict=True)) == [(1, 5), (5, 1000)]


def test_json_with_mixed_types_and_odd_values(tmp_path: Path) -> None:
    lines = [
        '{"ledger_id": "7", "entry_id": 0, "deliver_at": " 12 "}',
        '{"ledger_id": 8, "entry_id": 0, "deliver_at": true}',
        '{"ledger_id": 9, "entry_id": [1], "deliver_at": 3}',
        '{"ledger_id": "+10", "entry_id": "0x1", "deliver_at": 3}',
        '{"ledger_id": 11, "entry_id": 0, "deliver_at": "1767225600000.0", "other": "x"}',
    ]
    (tmp_path / "m.jsonl").write_text("\n".join(lines) + "\n")
    got, report = read_dump(tmp_path / "m.jsonl")
    assert report.counts["wrong_type"] == 3  # true, [1], "0x1" (hex is not accepted)
    assert [ex["row"] for ex in report.examples["wrong_type"]] == [1, 2, 3]
    assert report.examples["wrong_type"][0]["deliver_at"] is True  # the original cell
    assert list(zip(got.ledger_ids, got.deliver_at, strict=True)) == [(7, 12), (11, 1767225600000)]
    (tmp_path / "broken.jsonl").write_text('{"ledger_id": 1}\n{"ledger_id": \n')
    with pytest.raises(DumpError, match="line 2 is not JSON"):
        read_dump(tmp_path / "broken.jsonl")


def test_malformed_csv_is_a_dump_error(tmp_path: Path) -> None:
    (tmp_path / "bad.csv").write_text("ledger_id,entry_id,deliver_at\n1,2,3\n4,5\n")
    with pytest.raises(DumpError, match=r"bad\.csv"):
        read_dump(tmp_path / "bad.csv")


# -- batches, positions ---------------------------------------------------------------------------


def test_validate_batch_on_pandas_and_arrow() -> None:
    frame = pd.DataFrame(
        {
            "ledger_id": [3, "x", 1, 1],  # an object column with mixed types
            "entry_id": [0, 0, 5, 5],
            "deliver_at": [10.0, 10.0, np.nan, np.nan],
        }
    )
    columns, report = validate_batch(frame, row_offset=100)
    assert list(zip(columns.ledger_ids, columns.entry_ids, columns.deliver_at, strict=True)) == [
        (1, 5, -1),
        (3, 0, 10),
    ]
    assert report.counts["wrong_type"] == 1 and report.counts["duplicate"] == 1
    assert report.examples["wrong_type"][0]["row"] == 101
    assert report.examples["wrong_type"][0]["ledger_id"] == "x"
    assert report.examples["duplicate"][0]["row"] == 103
    table = pa.Table.from_pandas(frame.iloc[[0, 2]], preserve_index=False)
    columns, report = validate_batch(table, row_numbers=[7, 9])
    assert len(columns) == 2 and report.ok and report.total_rows == 2
    with pytest.raises(TypeError, match="pyarrow Table"):
        validate_batch([1, 2, 3])
    with pytest.raises(DumpError, match="missing column"):
        validate_batch(pd.DataFrame({"ledger_id": [1]}))
    with pytest.raises(ValueError, match="row_numbers has 1 entries for 2 rows"):
        validate_batch(table, row_numbers=[1])
    with pytest.raises(ValueError, match="row_numbers has 1 entries for 2 rows"):
        resolve_duplicates(dump_columns([1, 2], [0, 0], [1, 1]), [5])


def test_conflicts_across_batches_reject_every_row() -> None:
    # check_rows per batch, resolve_duplicates over all rows of the ledger (the Spark recipe):
    # the position conflicts across batches, so all three rows go, including the identical pair.
    first = pa.table({"ledger_id": [5, 5], "entry_id": [1, 2], "deliver_at": [10, 20]})
    second = pa.table({"ledger_id": [5, 5], "entry_id": [1, 1], "deliver_at": [10, 11]})
    a, rows_a, report = check_rows(first)
    b, rows_b, report_b = check_rows(second, row_offset=2)
    report.merge(report_b)
    columns, rows, report = resolve_duplicates(
        DumpColumns.concat([a, b]), np.concatenate([rows_a, rows_b]), report
    )
    assert columns.entry_ids.tolist() == [2] and rows.tolist() == [1]
    assert report.counts["conflicting_duplicate"] == 3 and report.duplicates == 0
    assert [ex["row"] for ex in report.examples["conflicting_duplicate"]] == [0, 2, 3]


def test_find_conflicts_and_duplicates() -> None:
    ledgers = [1, 1, 1, 2, 2, 3, 3, 3]
    entries = [0, 0, 1, 0, 0, 0, 0, 0]
    deliver = [5, 5, 5, 1, 2, -1, -1, -1]
    assert find_conflicts(ledgers, entries, deliver).tolist() == [0, 0, 0, 1, 1, 0, 0, 0]
    assert find_duplicates(ledgers, entries, deliver).tolist() == [0, 1, 0, 0, 0, 0, 1, 1]
    assert find_conflicts([], [], []).tolist() == []
    with pytest.raises(ValueError, match="sorted"):
        find_conflicts([2, 1], [0, 0], [1, 1])
    with pytest.raises(ValueError, match="length"):
        find_duplicates([1, 2], [0, 0], [1])


def test_resolve_duplicates_sorts_unordered_rows() -> None:
    columns = dump_columns([3, 1, 2, 1], [0, 9, 0, 9], [7, 8, -1, 8], [1, 2, 3, 4])
    got, rows, report = resolve_duplicates(columns, [10, 11, 12, 13])
    assert got.ledger_ids.tolist() == [1, 2, 3] and rows.tolist() == [11, 12, 10]
    assert got.publish_time is not None and got.publish_time.tolist() == [2, 3, 1]
    assert report.duplicates == 1 and report.examples["duplicate"][0]["row"] == 13


# -- directories of parts -------------------------------------------------------------------------


def test_directory_of_parts(tmp_path: Path) -> None:
    whole = generate_dump(3000, entries_per_ledger=100, seed=11)
    dump = tmp_path / "dump"
    dump.mkdir()
    for i, lo in enumerate(range(0, 3000, 1000)):
        write_dump(dump / f"part-{i:05d}.snappy.parquet", whole.take(slice(lo, lo + 1000)))
    (dump / "_SUCCESS").write_text("")
    (dump / ".part-00000.snappy.parquet.crc").write_bytes(b"\x00")
    (dump / "_temporary").mkdir()
    got, report = read_dump(dump)
    assert_same(got, whole)
    assert report.ok and report.total_rows == 3000


def test_directory_rows_and_conflicts_span_parts(tmp_path: Path) -> None:
    dump = tmp_path / "dump"
    dump.mkdir()
    (dump / "part-0.csv").write_text("ledger_id,entry_id,deliver_at\n1,0,5\n1,1,6\n")
    (dump / "part-1.csv").write_text("ledger_id,entry_id,deliver_at\n1,2,7\nx,0,1\n1,0,99\n")
    got, report = read_dump(dump)
    assert list(zip(got.ledger_ids, got.entry_ids, strict=True)) == [(1, 1), (1, 2)]
    (wrong,) = report.examples["wrong_type"]
    assert (wrong["row"], wrong["file"], wrong["file_row"]) == (3, "part-1.csv", 1)
    conflict = report.examples["conflicting_duplicate"]
    assert [(ex["row"], ex["file"], ex["file_row"]) for ex in conflict] == [
        (0, "part-0.csv", 0),
        (4, "part-1.csv", 2),
    ]


def test_directory_errors(tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "_SUCCESS").write_text("")
    with pytest.raises(DumpError, match="no part files"):
        read_dump(empty)
    mixed = tmp_path / "mixed"
    mixed.mkdir()
    write_dump(mixed / "a.csv", generate_dump(5))
    write_dump(mixed / "b.parquet", generate_dump(5))
    with pytest.raises(DumpError, match="several formats"):
        read_dump(mixed)
    nested = tmp_path / "nested"
    (nested / "ledger=1").mkdir(parents=True)
    with pytest.raises(DumpError, match="sub-directories"):
        read_dump(nested)
    odd = tmp_path / "odd"
    odd.mkdir()
    write_dump(odd / "part-0", generate_dump(5), fmt="jsonl")
    with pytest.raises(DumpError, match="cannot tell the format of part-0"):
        read_dump(odd)
    assert len(read_dump(odd, fmt="json")[0]) == 5


# -- writing --------------------------------------------------------------------------------------


def test_writer_is_atomic(tmp_path: Path) -> None:
    path = tmp_path / "d.parquet"
    write_dump(path, generate_dump(10))
    before = path.read_bytes()
    bad = dump_columns([1, 2], [0, ENTRY_ID_LIMIT], [5, 5])
    for fmt in DUMP_FORMATS:
        with pytest.raises(ValueError, match="2\\*\\*32"):
            write_dump(path, bad, fmt=fmt)
    with pytest.raises(ValueError, match=">= 0"):
        write_dump(path, dump_columns([-1], [0], [5]))
    assert path.read_bytes() == before
    assert os.listdir(tmp_path) == ["d.parquet"]
    with pytest.raises(ValueError, match="every chunk"), DumpWriter(tmp_path / "x.csv") as w:
        w.write(generate_dump(3))
        w.write(dump_columns([9], [0], [1]))
    assert os.listdir(tmp_path) == ["d.parquet"]
    with pytest.raises(DumpError, match="Parquet files are compressed inside"):
        DumpWriter(tmp_path / "d.parquet.gz")


def test_dump_columns_contract() -> None:
    columns = dump_columns([1, 2], [0, 0], [-7, 5])
    assert columns.deliver_at.tolist() == [-1, 5] and columns.deliver_at.dtype == np.int64
    assert columns.delayed_mask.tolist() == [False, True] and len(columns) == 2
    with pytest.raises(ValueError, match="equal lengths"):
        dump_columns([1, 2], [0], [5, 5])
    with pytest.raises(ValueError, match="one-dimensional"):
        dump_columns([[1]], [[0]], [[5]])


def test_reject_report_merge_and_json() -> None:
    a = RejectReport(total_rows=10)
    a.record("wrong_type", 2, [{"row": 9, "detail": "x"}, {"row": 3, "detail": "y"}])
    b = RejectReport(total_rows=5)
    b.record("wrong_type", 6, [{"row": i, "detail": "z"} for i in range(10, 16)])
    b.record("duplicate", 1)
    a.merge(b)
    assert a.total_rows == 15 and a.errors == 8 and a.kept_rows == 6
    assert [ex["row"] for ex in a.examples["wrong_type"]] == [3, 9, 10, 11, 12]
    assert "8 rejected (wrong_type 8)" in a.summary() and "1 duplicate" in a.summary()
    again = RejectReport.from_json(json.loads(json.dumps(a.to_json())))
    assert again.to_json() == a.to_json()
    assert a.first_problem() == "wrong_type at row 3: y"
    with pytest.raises(ValueError, match="unknown reason"):
        a.record("typo", 1)


# -- generator ------------------------------------------------------------------------------------


def test_generator_is_deterministic_by_seed() -> None:
    a = generate_dump(20_000, seed=4)
    assert_same(generate_dump(20_000, seed=4), a)
    assert not np.array_equal(generate_dump(20_000, seed=5).deliver_at, a.deliver_at)
    assert_same(generate_dump(5000, seed=4), a.take(slice(0, 5000)))  # a prefix


def test_generator_blocks_concatenate_and_prefix() -> None:
    n = GEN_BLOCK_ROWS + 10
    chunks = list(iter_generated(n, delay_mix="uniform", seed=1))
    assert [len(c) for c in chunks] == [GEN_BLOCK_ROWS, 10]
    whole = generate_dump(n, delay_mix="uniform", seed=1)
    assert_same(DumpColumns.concat(chunks), whole)
    assert_same(
        generate_dump(GEN_BLOCK_ROWS - 3, delay_mix="uniform", seed=1),
        whole.take(slice(0, GEN_BLOCK_ROWS - 3)),
    )


def test_positions_and_publish_times() -> None:
    columns = generate_dump(
        2500, entries_per_ledger=1000, first_ledger=40, start_ms=1_000, publish_rate=500
    )
    assert columns.ledger_ids.tolist()[::1000] == [40, 41, 42]
    assert columns.entry_ids[999] == 999 and columns.entry_ids[1000] == 0
    assert columns.publish_time is not None
    i = np.arange(2500)
    np.testing.assert_array_equal(columns.publish_time, 1_000 + i * 1000 // 500)
    assert (np.diff(columns.publish_time) >= 0).all()


@pytest.mark.parametrize("fraction", [0.0, 0.3, 1.0])
def test_delayed_fraction(fraction: float) -> None:
    share = generate_dump(50_000, delayed_fraction=fraction).delayed_mask.mean()
    assert share == pytest.approx(fraction, abs=0.01)
    if fraction in (0.0, 1.0):
        assert share == fraction


def delays(mix: str, n: int = 40_000) -> tuple[DumpColumns, np.ndarray[Any, Any]]:
    columns = generate_dump(n, delayed_fraction=1.0, delay_mix=mix, seed=9)
    assert columns.publish_time is not None
    return columns, columns.deliver_at - columns.publish_time


def test_delay_mix_fixed_and_uniform() -> None:
    _, fixed = delays("fixed")
    assert set(fixed.tolist()) == {60_000}
    _, uniform = delays("uniform")
    assert uniform.min() >= 1_000 and uniform.max() <= 3_600_000
    assert uniform.min() < 20_000 and uniform.max() > 3_580_000
    assert np.median(uniform) == pytest.approx(1_800_000, rel=0.05)


def test_delay_mix_realistic() -> None:
    _, delay = delays("realistic", 100_000)
    seconds = (delay >= 1_000) & (delay <= 60_000)
    minutes = (delay > 60_000) & (delay <= 3_600_000)
    days = (delay >= DAY_MS) & (delay <= 10 * DAY_MS)
    assert (seconds | minutes | days).all()
    assert seconds.mean() == pytest.approx(0.70, abs=0.01)
    assert minutes.mean() == pytest.approx(0.25, abs=0.01)
    assert days.mean() == pytest.approx(0.05, abs=0.005)


def test_delay_mix_midnight_burst() -> None:
    columns, delay = delays("midnight-burst", 100_000)
    assert columns.publish_time is not None
    next_midnight = (columns.publish_time // DAY_MS + 1) * DAY_MS
    burst = columns.deliver_at == next_midnight
    assert burst.mean() == pytest.approx(0.5, abs=0.01)
    assert len(np.unique(columns.deliver_at[burst])) == 1  # one midnight: a single huge tie
    assert delay[~burst].min() >= 1_000  # the rest follows the realistic mix


def test_generator_arguments_are_checked() -> None:
    with pytest.raises(TypeError):
        generate_dump(True)
    with pytest.raises(ValueError, match="n must be"):
        generate_dump(-1)
    with pytest.raises(ValueError, match="unknown delay_mix"):
        generate_dump(10, delay_mix="bursty")
    with pytest.raises(ValueError, match="entries_per_ledger"):
        generate_dump(10, entries_per_ledger=ENTRY_ID_LIMIT + 1)
    with pytest.raises(ValueError, match="delayed_fraction"):
        generate_dump(10, delayed_fraction=1.5)
    with pytest.raises(ValueError, match="overflow"):
        generate_dump(10, start_ms=2**63 - 10)


def test_generated_dump_defaults() -> None:
    columns = generate_dump(1000)
    assert columns.ledger_ids[0] == 1 and columns.publish_time is not None
    assert columns.publish_time[0] == DEFAULT_START_MS


# -- gen-dump CLI ---------------------------------------------------------------------------------


def test_gen_dump_cli_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "d.csv"
    argv = ["gen-dump", str(out), "--messages", "4000", "--entries-per-ledger", "300"]
    argv += ["--delayed-fraction", "0.2", "--delay-mix", "fixed", "--seed", "3", "--json"]
    assert main(argv) == EXIT_OK
    captured = capsys.readouterr()
    summary = json.loads(captured.out)
    assert captured.err == ""  # --json: no progress bar
    assert summary["messages"] == 4000 and summary["format"] == "csv"
    assert summary["ledgers"] == 14 and summary["last_ledger"] == 14
    want = generate_dump(
        4000, entries_per_ledger=300, delayed_fraction=0.2, delay_mix="fixed", seed=3
    )
    assert summary["delayed"] == int(want.delayed_mask.sum())
    got, report = read_dump(out)
    assert report.ok
    assert_same(got, want)


def test_gen_dump_cli_human_and_format(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "dump"
    assert (
        main(["gen-dump", str(out), "--messages", "100", "--format", "json", "--no-progress"]) == 0
    )
    captured = capsys.readouterr()
    assert "gen-dump" in captured.out and "100" in captured.out and captured.err == ""
    assert_same(read_dump(out, fmt="jsonl")[0], generate_dump(100))


def test_gen_dump_cli_shows_progress_on_a_terminal(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FORCE_COLOR", "1")  # rich treats stderr as a terminal
    monkeypatch.setenv("TTY_COMPATIBLE", "1")
    assert main(["gen-dump", str(tmp_path / "a.parquet"), "--messages", "10"]) == EXIT_OK
    assert "rows" in capsys.readouterr().err
    assert main(["gen-dump", str(tmp_path / "b.parquet"), "--messages", "10", "--no-progress"]) == 0
    assert capsys.readouterr().err == ""


def test_gen_dump_cli_usage_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "d.parquet"
    assert main(["gen-dump", str(out), "--messages", "10", "--no-progress"]) == EXIT_OK
    before = out.read_bytes()
    assert main(["gen-dump", str(out), "--messages", "20", "--no-progress"]) == EXIT_USAGE
    assert "exists" in capsys.readouterr().err and out.read_bytes() == before
    assert main(["gen-dump", str(out), "--messages", "20", "--force", "--json"]) == EXIT_OK
    assert len(read_dump(out)[0]) == 20
    capsys.readouterr()
    mismatch = ["gen-dump", str(tmp_path / "x.csv"), "--messages", "5", "--format", "parquet"]
    assert main(mismatch) == EXIT_USAGE
    assert "does not match" in capsys.readouterr().err
    assert main(["gen-dump", str(tmp_path), "--messages", "5"]) == EXIT_USAGE
    too_many = ["gen-dump", str(tmp_path / "y.csv"), "--messages", "5"]
    assert main([*too_many, "--entries-per-ledger", str(2**32 + 1)]) == EXIT_USAGE
    assert main([*too_many, "--start-ms", str(2**63 - 2)]) == EXIT_USAGE
    assert not (tmp_path / "x.csv").exists() and not (tmp_path / "y.csv").exists()
    for bad in (
        ["--delayed-fraction", "1.5"],
        ["--delayed-fraction", "abc"],
        ["--delay-mix", "bursty"],
        ["--messages", "-1"],
        ["--format", "xml"],
    ):
        with pytest.raises(SystemExit) as exc:
            main([*too_many, *bad])
        assert exc.value.code == EXIT_USAGE
    with pytest.raises(SystemExit) as exc:
        main(["gen-dump", str(out)])  # --messages is required
    assert exc.value.code == EXIT_USAGE


# -- no silent truncation -------------------------------------------------------------------------


def _write_fractional(path: Path, fmt: str) -> None:
    """Rows 0-2: 5.5 as an entry id, a deliver time, a publish time; row 3: integral floats."""
    rows = [
        (1, 5.5, 100.0, 7.0),
        (2, 5.0, 100.5, 7.0),
        (3, 5.0, 100.0, 7.25),
        (4.0, 5.0, 100.0, 7.0),
    ]
    if fmt == "parquet":
        cols = list(zip(*rows, strict=True))
        table = pa.table(
            {n: pa.array(c, pa.float64()) for n, c in zip(COLUMN_NAMES, cols, strict=True)}
        )
        pq.write_table(table, path)
    elif fmt == "csv":
        path.write_text(
            ",".join(COLUMN_NAMES) + "\n" + "".join(f"{a},{b},{c},{d}\n" for a, b, c, d in rows)
        )
    else:
        path.write_text(
            "".join(json.dumps(dict(zip(COLUMN_NAMES, r, strict=True))) + "\n" for r in rows)
        )


@pytest.mark.parametrize("fmt", DUMP_FORMATS)
def test_fractional_values_are_rejected_never_truncated(tmp_path: Path, fmt: str) -> None:
    path = tmp_path / f"f.{fmt}"
    _write_fractional(path, fmt)
    got, report = read_dump(path)
    assert report.counts["wrong_type"] == 3 and report.errors == 3
    assert [ex["row"] for ex in report.examples["wrong_type"]] == [0, 1, 2]
    assert "5.5" in report.examples["wrong_type"][0]["detail"]
    # Only the integral-float row survives, as exact integers (5.0 is accepted, 5.5 is not 5).
    assert got.ledger_ids.tolist() == [4] and got.entry_ids.tolist() == [5]
    assert got.deliver_at.tolist() == [100] and got.publish_time is not None
    assert got.publish_time.tolist() == [7]
    with pytest.raises(DumpError, match="wrong_type at row 0"):
        read_dump(path, strict=True)


def test_fractional_values_in_a_batch_are_rejected() -> None:
    frame = pd.DataFrame({"ledger_id": [1, 2], "entry_id": [5.5, 5.0], "deliver_at": [1.0, 2.0]})
    got, report = validate_batch(frame)
    assert report.counts["wrong_type"] == 1 and got.entry_ids.tolist() == [5]


def test_dump_columns_refuse_fractions() -> None:
    assert dump_columns([1.0], [5.0], [9.0]).entry_ids.tolist() == [5]  # integral floats: fine
    for bad in ([5.5], [float("nan")], [2.0**60]):
        with pytest.raises(TypeError, match="not truncated"):
            dump_columns([1], bad, [9])
    with pytest.raises(TypeError):
        find_conflicts([1, 1], [0, 0.5], [5, 5])
    with pytest.raises(TypeError):
        resolve_duplicates(dump_columns([1], [0], [5]), row_numbers=[0.5])
