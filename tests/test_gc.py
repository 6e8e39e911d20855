"""delayindex.garbage: orphans found and collected exactly, intents resumed, nothing else touched.

Stores are MemoryStorage instances on a settable clock (so object ages are exact) written through
real Catalogs; FileStorage is used where its temp files matter. The CLI and a full DelayIndex
round trip are in test_cli_inspect_gc.py.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from delayindex.clock import ManualClock
from delayindex.errors import StorageError
from delayindex.garbage import GcReport, find_garbage, run_gc
from delayindex.snapshot.codec import encode_snapshot
from delayindex.snapshot.format import Segment, SnapshotMetadata, build_snapshot
from delayindex.storage import (
    BucketRecord,
    Catalog,
    FileStorage,
    Manifest,
    MemoryStorage,
    ObjectInfo,
)

T0 = 1_700_000_000_000
MINUTE = 60_000
HOUR = 60 * MINUTE


class SimulatedCrash(Exception):
    """Raised by a crash hook to stop a catalog between two protocol steps."""


def snap(
    first_ledger: int, n: int = 20, seed: int = 1
) -> tuple[SnapshotMetadata, Sequence[Segment]]:
    rng = np.random.default_rng(seed)
    return build_snapshot(
        rng.integers(T0, T0 + HOUR, n),
        np.full(n, first_ledger),
        np.arange(n),
        max_time_step_ms=10 * MINUTE,
        max_indexes_per_segment=5,
    )


def state(storage: MemoryStorage) -> tuple[list[tuple[str, bytes]], dict[str, bytes | None]]:
    """Every object's bytes and every manifest's bytes: equal states are byte-identical."""
    objects = [(o.id, storage.raw_object(o.id)) for o in storage.list_objects()]
    return objects, {n: storage.raw_manifest(n) for n in storage.list_manifests()}


def referenced(storage: MemoryStorage) -> set[str]:
    ids: set[str] = set()
    for name in storage.list_manifests():
        ids |= storage.read_manifest(name).referenced_ids()
    return ids


class Store:
    """Name "a": two live buckets and a pending delete. Name "b": one live bucket and a dead
    letter. Orphans: "orphan-old" (2 h old), "junk-old" (not even a snapshot, 2 h old),
    "orphan-young" (1 min old). Now is T0 + 2 h; grace 1 h."""

    def __init__(self) -> None:
        self.clock = ManualClock(T0)
        self.storage = MemoryStorage(clock=self.clock)
        with Catalog.open(self.storage, "a", clock=self.clock) as a:
            self.a_live = [a.create_bucket(*snap(ledger)).snapshot_id for ledger in (1, 2)]
            self.a_pending = a.create_bucket(*snap(3)).snapshot_id
            self.storage.inject_failure("delete", times=4)
            assert not a.delete_bucket(self.a_pending)
        with Catalog.open(self.storage, "b", clock=self.clock, max_delete_attempts=1) as b:
            self.b_live = b.create_bucket(*snap(1)).snapshot_id
            self.b_dead = b.create_bucket(*snap(2)).snapshot_id
            self.storage.inject_failure("delete", times=4)
            assert not b.delete_bucket(self.b_dead)
            assert [d.snapshot_id for d in b.manifest.dead_letters] == [self.b_dead]
        self.storage.put_raw_object("orphan-old", encode_snapshot(*snap(9)))
        self.storage.put_raw_object("junk-old", b"not a snapshot")
        self.clock.set(T0 + 2 * HOUR - MINUTE)
        self.storage.put_raw_object("orphan-young", encode_snapshot(*snap(10)))
        self.clock.set(T0 + 2 * HOUR)

    def gc(self, **kwargs: Any) -> GcReport:
        return run_gc(self.storage, now_ms=self.clock(), grace_ms=HOUR, **kwargs)


def test_dry_run_finds_orphans_and_changes_nothing() -> None:
    s = Store()
    before = state(s.storage)
    stats = s.storage.stats()
    report = find_garbage(s.storage, now_ms=s.clock(), grace_ms=HOUR)
    assert [o.id for o in report.orphans] == ["junk-old", "orphan-old"]
    assert [o.age_ms for o in report.orphans] == [2 * HOUR, 2 * HOUR]
    assert [(o.id, o.age_ms) for o in report.young] == [("orphan-young", MINUTE)]
    assert report.objects == len(referenced(s.storage)) + 3
    assert report.referenced == len(referenced(s.storage))
    assert report.manifests == ("a", "b")
    assert report.orphan_bytes == sum(o.size for o in report.orphans)
    a, b = report.names
    assert (a.name, a.pending_deletes, a.dead_letters, a.action) == (
        "a",
        (s.a_pending,),
        (),
        "would-resume",
    )
    assert (b.name, b.pending_deletes, b.dead_letters, b.action) == (
        "b",
        (),
        (s.b_dead,),
        "none",  # dead letters are retried only on request
    )
    assert not report.delete and report.deleted == () and report.refused == ""
    problems = report.problems()
    assert any("2 orphaned objects" in p for p in problems)
    assert any(p.startswith("a: 1 unfinished intents") for p in problems)
    assert any(p.startswith("b: 1 dead letters") for p in problems)
    # Changes nothing at all: same bytes, and no delete, commit or lock was even attempted.
    assert state(s.storage) == before
    after = s.storage.stats()
    for op in ("delete", "commit_manifest", "lock", "create"):
        assert after[op] == stats[op], op
    assert run_gc(s.storage, now_ms=s.clock(), grace_ms=HOUR) == report  # delete=False


def test_collect_deletes_exactly_the_old_orphans_and_resumes_intents() -> None:
    s = Store()
    keep = referenced(s.storage) - {s.a_pending}  # the pending delete is finished by gc
    report = s.gc(delete=True)
    assert report.delete
    assert report.deleted == ("junk-old", "orphan-old")
    assert report.failed == () and report.skipped == ()
    assert {o.id for o in s.storage.list_objects()} == keep | {"orphan-young"}
    a, b = report.names
    assert a.action == "resumed" and a.completed == (s.a_pending,)
    assert a.remaining_intents == () and a.remaining_dead_letters == ()
    assert s.storage.read_manifest("a").intents == ()
    # Dead letters are only retried on request: "b" is left alone and still counts.
    assert b.action == "none" and b.remaining_dead_letters == (s.b_dead,)
    assert report.problems() == ["b: 1 dead letters"]
    assert s.b_dead in {o.id for o in s.storage.list_objects()}

    again = s.gc(delete=True, retry_dead_letters=True)
    [_, b] = again.names
    assert b.action == "resumed" and b.retried == (s.b_dead,)
    assert b.remaining_dead_letters == ()
    assert again.deleted == () and again.problems() == []
    assert {o.id for o in s.storage.list_objects()} == (keep - {s.b_dead}) | {"orphan-young"}
    # Live buckets are untouched and still readable.
    for snapshot_id in [*s.a_live, s.b_live]:
        assert s.storage.get_metadata(snapshot_id).num_messages == 20


def test_a_corrupt_manifest_makes_gc_refuse_to_delete_anything() -> None:
    s = Store()
    s.storage.put_raw_manifest("c", b"DIXM but not really")
    before = state(s.storage)
    report = s.gc(delete=True, retry_dead_letters=True)
    assert report.corrupt_manifests[0][0] == "c"
    assert "refusing to delete anything" in report.refused
    assert report.deleted == ()
    assert [n.action for n in report.names] == ["would-resume", "none"]
    assert state(s.storage) == before  # not even the intents were resumed
    assert report.problems()[0] == report.refused


def test_the_recheck_spares_candidates_that_changed_after_the_scan() -> None:
    clock = ManualClock(T0)
    storage = MemoryStorage(clock=clock)
    data = encode_snapshot(*snap(1))
    for orphan in ("orphan-1", "orphan-2", "orphan-3", "orphan-4"):
        storage.put_raw_object(orphan, data)
    storage.commit_manifest("a", Manifest("a"))
    clock.set(T0 + 2 * HOUR)
    changed: list[str] = []

    def meddle(phase: str, done: int, total: int) -> None:
        if phase == "manifests" and not changed:  # after the listing, during the scan
            late = Manifest("late").with_bucket(BucketRecord(1, 1, "orphan-1", 20, 4, len(data)))
            storage.commit_manifest("late", late)
            storage.delete("orphan-2")
            storage.put_raw_object("orphan-3", data)  # rewritten: young again
            changed.append(phase)

    report = run_gc(storage, now_ms=clock(), grace_ms=HOUR, delete=True, progress=meddle)
    assert changed and [o.id for o in report.orphans] == [f"orphan-{i}" for i in (1, 2, 3, 4)]
    assert report.deleted == ("orphan-4",)
    assert {(k.id, k.reason.split(":")[0]) for k in report.skipped} == {
        ("orphan-1", "referenced by a manifest now"),
        ("orphan-2", "gone before gc deleted it"),
        ("orphan-3", "rewritten"),
    }
    assert {o.id for o in storage.list_objects()} == {"orphan-1", "orphan-3"}


def test_a_manifest_damaged_during_gc_stops_the_orphan_deletes() -> None:
    clock = ManualClock(T0)
    storage = MemoryStorage(clock=clock)
    storage.put_raw_object("orphan-1", b"x")
    storage.commit_manifest("a", Manifest("a"))
    clock.set(T0 + 2 * HOUR)

    def damage(phase: str, done: int, total: int) -> None:
        storage.put_raw_manifest("a", b"garbage")

    report = run_gc(storage, now_ms=clock(), grace_ms=HOUR, delete=True, progress=damage)
    assert report.deleted == () and "became unreadable" in report.refused
    assert [o.id for o in storage.list_objects()] == ["orphan-1"]


def test_a_name_held_by_a_running_writer_is_skipped() -> None:
    s = Store()
    manifest = s.storage.read_manifest("a")
    with s.storage.lock("a"):
        report = s.gc(delete=True)
    a = report.names[0]
    assert a.action == "in-use" and a.pending_deletes == (s.a_pending,)
    assert s.storage.read_manifest("a") == manifest  # its writer handles its intents
    assert report.deleted == ("junk-old", "orphan-old")
    assert not any(p.startswith("a:") for p in report.problems())


def test_failed_orphan_deletes_are_reported() -> None:
    clock = ManualClock(T0)
    storage = MemoryStorage(clock=clock)
    storage.put_raw_object("orphan-1", b"x")
    storage.put_raw_object("orphan-2", b"y")
    clock.set(T0 + HOUR)
    storage.inject_failure("delete", times=4)  # every attempt of the first delete
    report = run_gc(storage, now_ms=clock(), grace_ms=0, delete=True)
    assert [f.id for f in report.failed] == ["orphan-1"]
    assert "failed after 4 attempts" in report.failed[0].error
    assert report.deleted == ("orphan-2",)
    assert report.problems() == ["1 orphan deletes failed"]


def test_a_create_intent_is_rolled_back_and_its_object_deleted() -> None:
    clock = ManualClock(T0)
    storage = MemoryStorage(clock=clock)

    def crash(step: str) -> None:
        if step == "create.object_written":
            raise SimulatedCrash(step)

    catalog = Catalog.open(storage, "a", clock=clock, crash_hook=crash)
    with pytest.raises(SimulatedCrash):
        catalog.create_bucket(*snap(1))
    catalog.close()  # the process "died": the lock goes, the create intent stays
    [intent] = storage.read_manifest("a").intents
    assert intent.kind == "create"
    dry = run_gc(storage, now_ms=T0, grace_ms=0)
    assert dry.orphans == () and dry.names[0].pending_creates == (intent.snapshot_id,)
    report = run_gc(storage, now_ms=T0, grace_ms=0, delete=True)
    assert report.names[0].completed == (intent.snapshot_id,)
    assert storage.list_objects() == [] and storage.read_manifest("a").intents == ()
    assert report.problems() == []


def test_names_limit_the_intents_but_not_the_orphan_scan() -> None:
    s = Store()
    report = s.gc(delete=True, retry_dead_letters=True, names={"b"})
    assert [n.name for n in report.names] == ["b"]
    assert report.deleted == ("junk-old", "orphan-old")
    assert s.storage.read_manifest("a").intents != ()  # "a" was not resumed


def test_progress_reports_each_phase() -> None:
    s = Store()
    seen: list[tuple[str, int, int]] = []
    s.gc(delete=True, progress=lambda *args: seen.append(args))
    assert seen == [("manifests", 1, 2), ("manifests", 2, 2), ("deletes", 1, 2), ("deletes", 2, 2)]


def test_grace_protects_objects_with_future_mtimes() -> None:
    clock = ManualClock(T0 + HOUR)  # a writer whose clock runs ahead
    storage = MemoryStorage(clock=clock)
    storage.put_raw_object("ahead", b"x")
    report = run_gc(storage, now_ms=T0, grace_ms=0, delete=True)
    assert [o.id for o in report.young] == ["ahead"] and report.deleted == ()


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"now_ms": T0, "grace_ms": -1}, ValueError),
        ({"now_ms": float(T0), "grace_ms": 0}, TypeError),
        ({"now_ms": T0, "grace_ms": True}, TypeError),
        ({"now_ms": T0, "grace_ms": 0, "delete": True, "max_delete_attempts": 0}, ValueError),
    ],
)
def test_bad_arguments(kwargs: dict[str, object], error: type[Exception]) -> None:
    storage = MemoryStorage()
    storage.put_raw_object("orphan-1", b"x")
    with pytest.raises(error):
        run_gc(storage, **kwargs)  # type: ignore[arg-type]
    assert [o.id for o in storage.list_objects()] == ["orphan-1"]


def test_listing_failures_raise_storage_errors(monkeypatch: pytest.MonkeyPatch) -> None:
    storage = MemoryStorage()

    def broken() -> list[str]:
        raise OSError(5, "listing failed")

    monkeypatch.setattr(storage, "_raw_list_manifests", broken)
    with pytest.raises(StorageError, match="list_manifests"):
        find_garbage(storage, now_ms=T0, grace_ms=0)


def test_file_storage_stale_temp_files(tmp_path: Path) -> None:
    storage = FileStorage(tmp_path)
    stale = storage.tmp_dir / "999999999-dead.tmp"  # beyond any pid_max: its writer is gone
    stale.write_bytes(b"partial")
    alive = storage.tmp_dir / f"{os.getpid()}-live.tmp"
    alive.write_bytes(b"being written")
    reopened = FileStorage(tmp_path, clean_tmp=False)
    assert reopened.removed_temp_files == [] and stale.exists()
    dry = find_garbage(reopened, now_ms=T0, grace_ms=0)
    assert dry.temp_files == ("999999999-dead.tmp",) and stale.exists()
    assert dry.problems() == ["1 stale temp files"]
    report = run_gc(reopened, now_ms=T0, grace_ms=0, delete=True)
    assert report.removed_temp_files == ("999999999-dead.tmp",)
    assert not stale.exists() and alive.exists()
    assert report.problems() == []


def test_objects_are_listed_before_any_manifest_is_read() -> None:
    calls: list[str] = []

    class Recording(MemoryStorage):
        def list_objects(self) -> list[ObjectInfo]:
            calls.append("list_objects")
            return super().list_objects()

        def list_manifests(self) -> list[str]:
            calls.append("list_manifests")
            return super().list_manifests()

        def read_manifest(self, name: str) -> Manifest:
            calls.append("read_manifest")
            return super().read_manifest(name)

    storage = Recording()
    storage.commit_manifest("a", Manifest("a"))
    storage.put_raw_object("orphan-1", b"x")
    calls.clear()
    run_gc(storage, now_ms=T0, grace_ms=0, delete=True)
    # The scan, then the re-check before deleting: each lists objects first.
    assert calls == ["list_objects", "list_manifests", "read_manifest"] * 2
