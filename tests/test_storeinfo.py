"""delayindex.storeinfo: what ``delayindex inspect`` reports, derived as recovery would see it.

Snapshots are built with known deliver times so that the expected loaded segment, next delivery
time and due counts can be written down; stores are written through real Catalogs.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from delayindex.snapshot.codec import encode_snapshot
from delayindex.snapshot.format import Segment, SnapshotMetadata, build_snapshot
from delayindex.storage import (
    BucketRecord,
    Catalog,
    FileStorage,
    Intent,
    Manifest,
    MemoryStorage,
    WriterStatus,
)
from delayindex.storeinfo import _PROC_LOCKS as PROC_LOCKS
from delayindex.storeinfo import LockState, inspect_name, inspect_store, lock_state

T0 = 1_700_000_000_000


class SimulatedCrash(Exception):
    """Raised by a crash hook to stop a catalog between two protocol steps."""


def snap(ledger: int, offsets: list[int]) -> tuple[SnapshotMetadata, Sequence[Segment]]:
    """A bucket of ``ledger`` with one index per offset (deliver_at = T0 + offset), two per
    segment."""
    n = len(offsets)
    return build_snapshot(
        np.array([T0 + o for o in offsets]),
        np.full(n, ledger),
        np.arange(n),
        max_time_step_ms=10**9,
        max_indexes_per_segment=2,
    )


def store() -> tuple[MemoryStorage, str, str]:
    """Name "t": bucket [1, 1] with deliver offsets 10..60 (segments 10-20, 30-40, 50-60) and
    bucket [2, 2] with offsets 100..400 (segments 100-200, 300-400)."""
    storage = MemoryStorage()
    with Catalog.open(storage, "t") as catalog:
        first = catalog.create_bucket(*snap(1, [10, 20, 30, 40, 50, 60])).snapshot_id
        second = catalog.create_bucket(*snap(2, [100, 200, 300, 400])).snapshot_id
    return storage, first, second


@pytest.mark.parametrize(
    ("now", "tick", "expected"),
    [
        # (loaded segment, next delivery offset, due messages) for each bucket
        (0, 0, [(1, 10, 0), (1, 100, 0)]),
        (20, 0, [(2, 30, 2), (1, 100, 0)]),
        (19, 0, [(1, 10, 0), (1, 100, 0)]),  # segment 1's max (20) is not due at 19
        (10, 10, [(2, 30, 2), (1, 100, 0)]),  # cutoff = now + tick
        (60, 0, [(None, None, 6), (1, 100, 0)]),  # bucket 1 all due
        (250, 0, [(None, None, 6), (2, 300, 2)]),
        (400, 0, [(None, None, 6), (None, None, 4)]),
    ],
)
def test_loaded_segment_and_next_delivery_as_recovery_sees_them(
    now: int, tick: int, expected: list[tuple[int | None, int | None, int]]
) -> None:
    storage, first, second = store()
    info = inspect_name(storage, "t", now_ms=T0 + now, tick_ms=tick)
    assert [b.snapshot_id for b in info.buckets] == [first, second]
    got = [
        (
            b.loaded_segment,
            None if b.next_delivery_ms is None else b.next_delivery_ms - T0,
            b.due_messages,
        )
        for b in info.buckets
    ]
    assert got == expected
    assert [b.all_due for b in info.buckets] == [e[0] is None for e in expected]
    assert [(b.num_segments, b.num_messages) for b in info.buckets] == [(3, 6), (2, 4)]
    assert info.messages == 10 and info.snapshot_bytes == sum(
        storage.length(i) for i in (first, second)
    )
    nexts = [e[1] for e in expected if e[1] is not None]
    assert info.next_delivery_ms == (T0 + min(nexts) if nexts else None)
    assert info.version == storage.read_manifest("t").version == 4  # two commits per create
    assert info.error == "" and info.dead_letters == ()


def test_intents_dead_letters_and_messages_being_written() -> None:
    storage = MemoryStorage()
    steps: list[str] = []

    def crash(step: str) -> None:
        steps.append(step)
        if step == "create.object_written" and steps.count(step) == 2:
            raise SimulatedCrash(step)

    catalog = Catalog.open(storage, "t", crash_hook=crash, max_delete_attempts=2)
    doomed = catalog.create_bucket(*snap(1, [10, 20])).snapshot_id
    with pytest.raises(SimulatedCrash):
        catalog.create_bucket(*snap(2, [30, 40, 50]))  # written, never made live
    catalog.close()
    with Catalog.open(storage, "t", max_delete_attempts=2) as catalog:  # rolls the create back
        dead = catalog.create_bucket(*snap(3, [60])).snapshot_id
        storage.inject_failure("delete", times=4 * 4)  # two attempts of two deletes
        assert not catalog.delete_bucket(doomed)  # attempt 1: stays pending
        assert not catalog.delete_bucket(dead)  # attempt 1: stays pending
        catalog.retry_pending_deletes(force=True)  # attempt 2 of each: dead letters
    manifest = storage.read_manifest("t")
    assert {d.snapshot_id for d in manifest.dead_letters} == {doomed, dead}
    # Plant a pending create whose object exists, and one whose object is not written yet.
    written = "t-7-7-written"
    storage.put_raw_object(written, encode_snapshot(*snap(7, [1, 2, 3, 4, 5])))
    manifest = manifest.with_intent(Intent("create", written, 7, 7)).with_intent(
        Intent("create", "t-8-8-notyet", 8, 8)
    )
    storage.commit_manifest("t", manifest)
    info = inspect_name(storage, "t", now_ms=T0)
    assert [(i.kind, i.snapshot_id, i.messages) for i in info.intents] == [
        ("create", written, 5),
        ("create", "t-8-8-notyet", None),
    ]
    assert info.being_written == 5
    assert {d.snapshot_id for d in info.dead_letters} == {doomed, dead}
    for d in info.dead_letters:
        assert d.kind == "delete" and d.attempts == 2 and "InjectedIOError" in d.last_error
        assert d.next_attempt_ms > 0
    assert info.buckets == ()
    store_info = inspect_store(storage, now_ms=T0)
    assert store_info.problems() == ["t: 2 dead letters"]


def test_unreadable_snapshots_are_reported_per_bucket_and_the_walk_goes_on() -> None:
    storage, first, second = store()
    with Catalog.open(storage, "t") as catalog:
        third = catalog.create_bucket(*snap(3, [500, 600])).snapshot_id
    storage.put_raw_object(first, b"garbage")
    storage.delete(third)
    info = inspect_name(storage, "t", now_ms=T0)
    kinds = [(b.snapshot_id, b.error_kind) for b in info.buckets]
    assert kinds == [(first, "corrupt"), (second, ""), (third, "missing")]
    assert first in info.buckets[0].error and "unreadable" in info.buckets[0].error
    assert "missing" in info.buckets[2].error
    assert info.buckets[1].loaded_segment == 1  # the readable bucket is still reported
    assert info.buckets[0].loaded_segment is None and not info.buckets[0].all_due
    assert info.error_kinds() == {"corrupt", "missing"}
    problems = inspect_store(storage, now_ms=T0).problems()
    assert len(problems) == 2 and all(p.startswith("t: snapshot ") for p in problems)


def test_a_damaged_manifest_marks_its_name_only() -> None:
    storage, _, _ = store()
    storage.put_raw_manifest("bad", b"DIXM?")
    info = inspect_store(storage, now_ms=T0)
    assert [n.name for n in info.names] == ["bad", "t"]
    bad, good = info.names
    assert bad.error_kind == "corrupt" and "bad" in bad.error and bad.buckets == ()
    assert good.error == "" and len(good.buckets) == 2
    assert inspect_store(storage, now_ms=T0, names=["t"]).names == (good,)


def test_writer_status_mark_delete_and_buckets_below_the_mark() -> None:
    storage, _, _ = store()
    manifest = storage.read_manifest("t")
    status = WriterStatus(unpersisted=12, memory_mode_buckets=1, as_of_ms=T0 + 5)
    storage.commit_manifest("t", replace(manifest, mark_delete=(2, 0), writer_status=status))
    info = inspect_name(storage, "t", now_ms=T0)
    assert info.mark_delete == (2, 0)
    assert info.writer_status is not None
    assert (info.writer_status.unpersisted, info.writer_status.memory_mode_buckets) == (12, 1)
    assert info.writer_status.as_of_ms == T0 + 5
    assert [b.below_mark for b in info.buckets] == [True, False]  # [1, 1] is below ledger 2
    plain = inspect_name(storage, "t", now_ms=T0)
    storage.commit_manifest("t", replace(storage.read_manifest("t"), writer_status=None))
    assert inspect_name(storage, "t", now_ms=T0).writer_status is None
    assert plain.writer_status == info.writer_status


def test_inspect_is_read_only() -> None:
    storage, first, _ = store()
    storage.put_raw_object(first, b"garbage")
    before = ({o.id: storage.raw_object(o.id) for o in storage.list_objects()},
              storage.raw_manifest("t"))  # fmt: skip
    stats = storage.stats()
    inspect_store(storage, now_ms=T0)
    after = storage.stats()
    for op in ("create", "delete", "commit_manifest", "lock"):
        assert after[op] == stats[op], op
    assert before == (
        {o.id: storage.raw_object(o.id) for o in storage.list_objects()},
        storage.raw_manifest("t"),
    )


def test_lock_state_of_file_storage(tmp_path: Path) -> None:
    storage = FileStorage(tmp_path)
    assert lock_state(storage, "t") == LockState(False)  # never locked
    other = FileStorage(tmp_path)  # a second writer's view of the same directory
    with other.lock("t"):
        assert lock_state(storage, "t") == LockState(True, os.getpid())
        assert lock_state(storage, "u") == LockState(False)
    assert storage.lock_path("t").exists()
    assert lock_state(storage, "t") == LockState(False)  # released: the file stays
    assert lock_state(MemoryStorage(), "t") == LockState(None)  # cannot tell
    storage.lock("t").release()  # detection took no lock


def test_lock_state_is_unknown_without_proc_locks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    storage = FileStorage(tmp_path)
    assert Path(PROC_LOCKS).exists()
    storage.lock("t").release()
    monkeypatch.setattr("delayindex.storeinfo._PROC_LOCKS", str(tmp_path / "no-such-file"))
    assert lock_state(storage, "t") == LockState(None)


def test_bad_arguments(tmp_path: Path) -> None:
    storage, _, _ = store()
    calls = storage.stats()["read_manifest"]["calls"]
    with pytest.raises(TypeError):
        inspect_name(storage, "t", now_ms=float(T0))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="tick_ms"):
        inspect_name(storage, "t", now_ms=T0, tick_ms=-1)
    with pytest.raises(ValueError, match="bad"):
        inspect_name(storage, "../t", now_ms=T0)
    with pytest.raises(ValueError, match="bad"):
        lock_state(FileStorage(tmp_path), "../t")  # refused before touching the filesystem
    assert storage.stats()["read_manifest"]["calls"] == calls


def test_a_manifest_naming_a_bucket_record_works_without_a_catalog() -> None:
    storage = MemoryStorage()
    metadata, segments = snap(4, [10, 20, 30])
    storage.create(metadata, segments, "x-4")
    record = BucketRecord(4, 4, "x-4", 3, 2, storage.length("x-4"))
    storage.commit_manifest("x", Manifest("x").with_bucket(record))
    [bucket] = inspect_name(storage, "x", now_ms=T0 + 25).buckets
    assert (bucket.loaded_segment, bucket.next_delivery_ms, bucket.due_messages) == (
        2,
        T0 + 30,
        2,
    )
