"""The Spark rebuild's build step: reserved buckets in, their objects written by the executors.

How it works (step 3 of :mod:`delayindex.spark.job`; an RDD job over the bucket numbers,
:func:`~delayindex.spark.tasks.range_tasks`, no shuffle): :func:`build_step` returns the
:data:`~delayindex.rebuild.BuildStep` the driver hands to :meth:`RebuildRun.publish
<delayindex.rebuild.RebuildRun.publish>`. Its job gives each task whole buckets; a task
gathers each bucket's rows from every scratch file the scan wrote (binary search on the sorted
ledger column of a memory-mapped file), checks their number against the plan's count, builds
the snapshot with :func:`~delayindex.rebuild.build_bucket` and writes it under its reserved key
with ``FileStorage(store).create`` (:func:`_write_reserved`).

Invariants: an executor writes only under a key that is still reserved, and checks again after
writing (deleting its object otherwise), so a straggling task that outlives a rollback cannot
leave an orphan; a retried task whose earlier attempt already wrote the object accepts it when
the bytes are identical. The records come back in ledger order, one per reserved bucket.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from delayindex import rebuild
from delayindex.config import TrackerConfig
from delayindex.errors import SnapshotExistsError
from delayindex.snapshot.codec import encode_snapshot
from delayindex.snapshot.format import PreparedSegments, SnapshotMetadata
from delayindex.spark.arrowbuf import Int64Array, arrow, int64_array, string_array
from delayindex.spark.scan import Phase
from delayindex.spark.tasks import range_tasks
from delayindex.storage.file import FileStorage
from delayindex.storage.manifest import BucketRecord

_BUILD_SCHEMA = (
    "key string, start_ledger long, end_ledger long, num_messages long, num_segments long, "
    "snapshot_bytes long, status string"
)


@dataclass(frozen=True)
class _BuildParams:
    """What every build task needs (pickled to the executors)."""

    store: str
    config: TrackerConfig
    reservation: rebuild.Reservation
    scratch: tuple[str, ...]


def _reserved(storage: FileStorage, name: str, key: str) -> bool:
    intent = storage.read_manifest(name).intent(key)
    return intent is not None and intent.kind == "create"


def _write_reserved(
    storage: FileStorage,
    name: str,
    key: str,
    metadata: SnapshotMetadata,
    segments: PreparedSegments,
    generation: int = 0,
) -> BucketRecord | None:
    """Write a bucket under its reserved key; None (and no object) if the reservation is gone.

    The object is stamped with its origin ``(name, generation)`` (self-describing objects).

    The check after the write closes the race with a rollback: a rollback commits its delete
    intents before it deletes, so either it deletes this object or this check sees the intent
    gone and deletes it here.
    """
    if not _reserved(storage, name, key):
        return None
    metadata = metadata.with_origin(name, generation)
    try:
        record = rebuild.write_bucket(storage, key, metadata, segments)
    except SnapshotExistsError:
        # A retried task: the earlier attempt wrote it. Identical bytes are the same bucket.
        stored = storage.object_path(key).read_bytes()
        if stored != encode_snapshot(metadata, segments):
            raise
        record = BucketRecord(
            metadata.start_ledger,
            metadata.end_ledger,
            key,
            metadata.num_messages,
            metadata.num_segments,
            len(stored),
        )
    if not _reserved(storage, name, key):
        storage.delete(key)
        return None
    return record


def _gather(arrays: list[Int64Array], start: int, end: int) -> Int64Array:
    """Rows of ledgers ``start..end`` from every scratch array (each sorted by ledger)."""
    parts = []
    for arr in arrays:
        ledgers = arr[0]
        lo = int(np.searchsorted(ledgers, start, side="left"))
        hi = int(np.searchsorted(ledgers, end, side="right"))
        if hi > lo:
            parts.append(np.asarray(arr[:, lo:hi]))
    if not parts:
        return np.empty((3, 0), dtype=np.int64)
    return np.concatenate(parts, axis=1)


def _build_partition(params: _BuildParams, batches: Iterator[Any]) -> Iterator[Any]:
    """Executor: build and write the snapshots of the buckets whose numbers arrive."""
    pa = arrow()
    schema = pa.schema(
        [("key", pa.string())]
        + [(c, pa.int64()) for c in ("start_ledger", "end_ledger", "num_messages",
                                     "num_segments", "snapshot_bytes")]
        + [("status", pa.string())]
    )  # fmt: skip
    storage = FileStorage(params.store, clean_tmp=False)  # other hosts' temp files: not ours
    arrays = [np.load(path, mmap_mode="r") for path in params.scratch]
    try:
        for batch in batches:
            out: list[tuple[str, int, int, int, int, int, str]] = []
            for index in batch.column(0).to_pylist():
                start, end, key, expected = params.reservation.buckets[index]
                rows = _gather(arrays, start, end)
                if rows.shape[1] != expected:
                    raise RuntimeError(
                        f"bucket [{start}, {end}]: scratch files hold {rows.shape[1]} rows, "
                        f"the scan counted {expected}"
                    )
                metadata, segments = rebuild.build_bucket(
                    rows[2], rows[0], rows[1], start, end, params.config, validate=False
                )
                name, generation = params.reservation.origin
                record = _write_reserved(storage, name, key, metadata, segments, generation)
                if record is None:
                    out.append((key, start, end, 0, 0, 0, "aborted"))
                else:
                    out.append(
                        (key, start, end, record.num_messages, record.num_segments,
                         record.snapshot_bytes, "ok")
                    )  # fmt: skip
            columns = list(zip(*out, strict=True)) if out else [()] * len(schema)
            yield pa.RecordBatch.from_arrays(
                [
                    string_array(c) if f.type == pa.string() else int64_array(c)
                    for c, f in zip(columns, schema, strict=True)
                ],
                schema=schema,
            )
    finally:
        storage.close()


def _build(spark: Any, params: _BuildParams, phase: Phase) -> list[BucketRecord]:
    """Run the build job (under ``phase("build")``); the records of every bucket, in ledger order.

    Raises:
        RuntimeError: a task found its reservation gone (the rebuild was rolled back meanwhile).
    """
    buckets = params.reservation.buckets
    if not buckets:
        return []
    tasks = max(1, min(len(buckets), 2 * spark.sparkContext.defaultParallelism))
    build = functools.partial(_build_partition, params)
    with phase("build"):
        collected = range_tasks(spark, len(buckets), tasks, build, _BUILD_SCHEMA).to_pylist()
    aborted = [r["key"] for r in collected if r["status"] != "ok"]
    if aborted:
        raise RuntimeError(f"reservations vanished while writing {aborted[:5]}")
    records = sorted(
        (
            BucketRecord(r["start_ledger"], r["end_ledger"], r["key"], r["num_messages"],
                         r["num_segments"], r["snapshot_bytes"])
            for r in collected
        ),
        key=lambda b: b.start_ledger,
    )  # fmt: skip
    if [r.snapshot_id for r in records] != [b.key for b in buckets]:
        raise RuntimeError("the build job did not return exactly one record per bucket")
    return records


def build_step(
    spark: Any, store: str, config: TrackerConfig, scratch: Sequence[str], phase: Phase
) -> rebuild.BuildStep:
    """The build step for :meth:`RebuildRun.publish <delayindex.rebuild.RebuildRun.publish>`:
    a Spark job that builds and writes every reserved bucket from the scan's ``scratch`` files
    into the FileStorage at ``store``."""

    def step(reservation: rebuild.Reservation) -> list[BucketRecord]:
        return _build(spark, _BuildParams(store, config, reservation, tuple(scratch)), phase)

    return step
