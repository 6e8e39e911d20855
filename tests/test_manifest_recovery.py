"""The manifest is never a single point of loss: history, self-describing objects, recovery,
gc's refusal and fsck.

Each scenario builds a real index (DelayIndex on a ManualClock), closes it, damages the store
the way an operator or a disk would, reopens it, and compares what is delivered on a far clock
with what the undamaged store delivers.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from delayindex import DelayIndex, ManualClock, MemoryStorage, Position, TrackerConfig
from delayindex.cli import main
from delayindex.errors import RecoveryError, SnapshotCorruptError
from delayindex.executors import InlineExecutor
from delayindex.fsck import check_store
from delayindex.garbage import run_gc
from delayindex.snapshot.codec import encode_snapshot
from delayindex.snapshot.format import build_snapshot
from delayindex.storage import Catalog, FileStorage
from delayindex.storage.base import MANIFEST_HISTORY, BaseStorage
from delayindex.storage.manifest import encode_manifest

NAME = "orders"
T0 = 1_000_000
FAR = T0 + 10**9
OPEN_AT = T0 + 30_000  # some indexes are due, most are not
CONFIG = TrackerConfig(
    min_index_count_per_bucket=20, max_num_buckets=4, max_time_step_per_segment_ms=2_000,
    max_indexes_per_segment=8,
)  # fmt: skip


def _open(storage: BaseStorage, clock: ManualClock) -> DelayIndex:
    return DelayIndex.open(storage, NAME, CONFIG, clock=clock, executor=InlineExecutor())


def _build(storage: BaseStorage, ledgers: int = 30, acked: int = 0) -> ManualClock:
    """A closed index with several sealed buckets (merges included), some delivered."""
    clock = ManualClock(T0)
    with _open(storage, clock) as index:
        for ledger in range(1, ledgers + 1):
            for entry in range(12):
                index.add(ledger, entry, T0 + 10_000 + (ledger * 7_919 + entry * 104_729) % 500_000)
        index.flush()
        clock.set(OPEN_AT)
        assert len(index.poll(5)) == 5  # some delivered (not acknowledged)
        if acked:
            index.set_mark_delete(acked, 0)
        index.flush()
        assert len(index.buckets()) >= 2
    return clock


def _deliver_all(storage: BaseStorage) -> tuple[set[Position], DelayIndex | None, dict[str, Any]]:
    # Open before anything stored is due (recovery skips fully due segments: the dispatcher's
    # replay delivers those), then move to a far clock and poll everything.
    clock = ManualClock(OPEN_AT)
    index = _open(storage, clock)
    clock.set(FAR)
    try:
        got: set[Position] = set()
        while True:
            batch = index.poll(10_000)
            if not batch:
                break
            got |= set(batch)
        return got, None, index.stats()
    finally:
        index.close()


def _copy_memory(storage: MemoryStorage) -> MemoryStorage:
    copy = MemoryStorage()
    for info in storage.list_objects():
        copy.put_raw_object(info.id, storage.raw_object(info.id))
    for name in storage.list_manifests():
        data = storage.raw_manifest(name)
        if data is not None:
            copy.put_raw_manifest(name, data)
        for version, raw in storage.raw_manifest_history(name).items():
            copy.put_raw_manifest_history(name, version, raw)
    return copy


def _flip(data: bytes, offset: int) -> bytes:
    out = bytearray(data)
    out[offset % len(out)] ^= 0x10
    return bytes(out)


@pytest.fixture
def built() -> tuple[MemoryStorage, set[Position]]:
    storage = MemoryStorage()
    _build(storage)
    expected, _, _ = _deliver_all(_copy_memory(storage))
    assert expected
    return storage, expected


# -- history ---------------------------------------------------------------------------------------


def test_history_keeps_the_newest_generations_as_independent_copies(tmp_path: Path) -> None:
    storage = FileStorage(tmp_path)
    _build(storage)
    version = storage.read_manifest(NAME).version
    assert version > MANIFEST_HISTORY
    assert storage.manifest_history(NAME) == list(range(version, version - MANIFEST_HISTORY, -1))
    current = storage.manifest_path(NAME)
    copy = storage.manifest_history_path(NAME, version)
    assert current.read_bytes() == copy.read_bytes()
    assert os.stat(current).st_ino != os.stat(copy).st_ino  # never the same inode
    assert storage.read_manifest_generation(NAME, version) == storage.read_manifest(NAME)


def test_memory_storage_keeps_the_same_history() -> None:
    storage = MemoryStorage()
    _build(storage)
    version = storage.read_manifest(NAME).version
    assert sorted(storage.raw_manifest_history(NAME)) == list(
        range(version - MANIFEST_HISTORY + 1, version + 1)
    )


# -- self-describing objects -----------------------------------------------------------------------


def test_objects_name_their_index_range_and_generation(
    built: tuple[MemoryStorage, set[Position]],
) -> None:
    storage, _ = built
    manifest = storage.read_manifest(NAME)
    for record in manifest.buckets:
        metadata = storage.get_metadata(record.snapshot_id)
        assert metadata.index_name == NAME
        assert (metadata.start_ledger, metadata.end_ledger) == (
            record.start_ledger,
            record.end_ledger,
        )
        assert 0 < metadata.generation < manifest.version


def test_objects_without_an_origin_still_decode() -> None:
    metadata, segments = build_snapshot(
        np.array([5, 6, 7]), np.array([1, 1, 2]), np.array([0, 1, 0]),
        max_time_step_ms=10, max_indexes_per_segment=-1, start_ledger=1, end_ledger=2,
    )  # fmt: skip
    data = encode_snapshot(metadata, segments)  # no origin: the old bytes
    stamped = encode_snapshot(metadata.with_origin(NAME, 7), segments)
    assert len(stamped) - len(data) < 16  # a few bytes per object
    storage = MemoryStorage()
    storage.put_raw_object("old", data)
    old = storage.get_metadata("old")
    assert (old.index_name, old.generation, old.has_origin) == ("", 0, False)
    assert old == metadata.with_origin(NAME, 7)  # the origin is not content
    storage.put_raw_object("new", stamped)
    new = storage.get_metadata("new")
    assert (new.index_name, new.generation) == (NAME, 7)


# -- recovery --------------------------------------------------------------------------------------


def _recovered_warning(stats: dict[str, Any]) -> str:
    found: list[str] = [w for w in stats["warnings"] if "recovered from" in w]
    assert len(found) == 1, stats["warnings"]
    assert any("recovered from" in p for p in stats["storage_problems"])
    assert "at-least-once" in found[0]
    return found[0]


def test_deleted_manifest_recovers_the_exact_live_set_with_a_warning(
    built: tuple[MemoryStorage, set[Position]],
) -> None:
    storage, expected = built
    before = storage.read_manifest(NAME)
    storage.delete_raw_manifest(NAME)
    with pytest.raises(SnapshotCorruptError, match="missing"):
        storage.read_manifest(NAME)  # never mistaken for a new, empty name
    with Catalog.open(storage, NAME) as catalog:
        assert catalog.buckets() == list(before.buckets)
        assert catalog.manifest.mark_delete == before.mark_delete
        assert f"history generation {before.version}" in catalog.repair_report.recovered
    assert storage.read_manifest(NAME).version > before.version  # stored, history kept
    got, _, stats = _deliver_all(storage)
    assert got == expected
    # Recovered once and stored: the next open is an ordinary one.
    assert not any("recovered from" in w for w in stats["warnings"])


@pytest.mark.parametrize("offset", [0, 5, 13, 40, -30, -1])
def test_bit_flipped_manifest_recovers_from_history(
    built: tuple[MemoryStorage, set[Position]], offset: int
) -> None:
    storage, expected = built
    before = storage.read_manifest(NAME)
    storage.put_raw_manifest(NAME, _flip(storage.raw_manifest(NAME) or b"", offset))
    with Catalog.open(_copy_memory(storage), NAME) as catalog:
        assert catalog.buckets() == list(before.buckets)
    got, _, stats = _deliver_all(storage)
    assert got == expected
    _recovered_warning(stats)


def test_current_and_newest_generation_damaged_falls_back_a_generation(
    built: tuple[MemoryStorage, set[Position]],
) -> None:
    storage, expected = built
    version = storage.read_manifest(NAME).version
    storage.put_raw_manifest(NAME, b"garbage")
    storage.put_raw_manifest_history(
        NAME, version, _flip(storage.raw_manifest_history(NAME)[version], 20)
    )
    got, _, stats = _deliver_all(storage)
    assert expected <= got  # at-least-once: an older mark may redeliver, nothing is lost
    warning = _recovered_warning(stats)
    assert f"history generation {version - 1}" in warning


def test_everything_but_the_objects_lost_rebuilds_from_their_headers(
    built: tuple[MemoryStorage, set[Position]],
) -> None:
    storage, expected = built
    live = {b.snapshot_id for b in storage.read_manifest(NAME).buckets}
    assert {o.id for o in storage.list_objects()} == live
    storage.put_raw_manifest(NAME, _flip(storage.raw_manifest(NAME) or b"", 9))
    for version, raw in storage.raw_manifest_history(NAME).items():
        storage.put_raw_manifest_history(NAME, version, _flip(raw, 11))
    with Catalog.open(_copy_memory(storage), NAME) as catalog:
        assert {b.snapshot_id for b in catalog.buckets()} == live
    got, _, stats = _deliver_all(storage)
    assert got == expected
    assert "headers" in _recovered_warning(stats)


def test_manifest_and_history_deleted_is_not_a_new_empty_index(
    built: tuple[MemoryStorage, set[Position]],
) -> None:
    storage, expected = built
    storage.delete_raw_manifest(NAME)
    for version in storage.raw_manifest_history(NAME):
        storage.put_raw_manifest_history(NAME, version, None)
    assert storage.list_manifests() == []
    got, _, stats = _deliver_all(storage)
    assert got == expected
    _recovered_warning(stats)


def test_a_newer_merge_result_supersedes_the_buckets_it_encloses() -> None:
    """History one generation behind a merge: the merged object is adopted, its sources (still
    live in the old generation) become deletes."""
    storage = MemoryStorage()
    clock = ManualClock(T0)
    config = CONFIG.replace(max_num_buckets=0)
    with DelayIndex.open(storage, NAME, config, clock=clock, executor=InlineExecutor()) as index:
        for ledger in range(1, 9):
            for entry in range(25):
                index.add(ledger, entry, T0 + 5_000 + ledger * 100 + entry)
        index.flush()
    with Catalog.open(storage, NAME) as catalog:
        sources = catalog.buckets()[:2]
        old_version = catalog.manifest.version
        old_bytes = storage.raw_manifest_history(NAME)[old_version]
        metadata = storage.get_metadata(sources[0].snapshot_id)
        times, ledgers, entries = (
            np.concatenate(parts)
            for parts in zip(
                *(storage.get_segment_arrays(s.snapshot_id, 1, s.num_segments) for s in sources),
                strict=True,
            )
        )
        merged_meta, merged_segments = build_snapshot(
            times, ledgers, entries, max_time_step_ms=2_000, max_indexes_per_segment=8,
            start_ledger=sources[0].start_ledger, end_ledger=sources[1].end_ledger,
        )  # fmt: skip
        merged = catalog.create_bucket(
            merged_meta, merged_segments, replaces=[s.snapshot_id for s in sources]
        )
        assert metadata.generation < storage.get_metadata(merged.snapshot_id).generation
    # Lose every generation from the merge's intent on: history is behind the merge.
    version = storage.read_manifest(NAME).version
    storage.put_raw_manifest(NAME, b"\x00" * 10)
    for v in range(old_version + 1, version + 1):
        storage.put_raw_manifest_history(NAME, v, None)
    storage.put_raw_manifest_history(NAME, old_version, old_bytes)  # the survivor
    with Catalog.open(storage, NAME) as catalog:
        ids = {b.snapshot_id for b in catalog.buckets()}
        assert merged.snapshot_id in ids
        assert not ids & {s.snapshot_id for s in sources}
        assert f"history generation {old_version}" in catalog.repair_report.recovered
        assert "adopted 1" in catalog.repair_report.recovered
        assert set(catalog.repair_report.completed_deletes) >= {s.snapshot_id for s in sources}


def test_contradicting_objects_are_reported_and_kept() -> None:
    storage = MemoryStorage()
    _build(storage)
    manifest = storage.read_manifest(NAME)
    a = manifest.buckets[0]
    # An object of this index, newer than every generation, that partly overlaps a live bucket.
    metadata, segments = build_snapshot(
        np.array([T0 + 10**8]), np.array([a.end_ledger]), np.array([999]),
        max_time_step_ms=10, max_indexes_per_segment=-1,
        start_ledger=a.end_ledger, end_ledger=a.end_ledger + 10**6,
    )  # fmt: skip
    key = f"{NAME}-{a.end_ledger}-{a.end_ledger + 10**6}-0123456789ab"
    storage.create(metadata.with_origin(NAME, manifest.version + 50), segments, key)
    storage.put_raw_manifest(NAME, b"broken")
    with Catalog.open(storage, NAME) as catalog:
        assert catalog.buckets() == list(manifest.buckets)
        assert key in catalog.repair_report.recovered
        kept = [q for q in catalog.manifest.quarantined if q.state == "kept"]
        assert [q.snapshot_id for q in kept] == [key]
        assert not catalog.manifest.dead_letters  # gc --retry-dead-letters cannot delete it
    assert key in {o.id for o in storage.list_objects()}  # never deleted


def test_nothing_provable_raises_recovery_error_naming_the_file(tmp_path: Path) -> None:
    storage = FileStorage(tmp_path)
    _build(storage)
    for path in (tmp_path / "manifests").iterdir():
        path.write_bytes(_flip(path.read_bytes(), 17))
    for path in (tmp_path / "objects").iterdir():
        path.write_bytes(_flip(path.read_bytes(), 4))
    with pytest.raises(RecoveryError, match=r"orders\.manifest"):
        _open(storage, ManualClock(FAR))
    storage.lock(NAME).release()


def test_a_new_name_is_simply_empty() -> None:
    storage = MemoryStorage()
    _build(storage)
    with Catalog.open(storage, "payments") as catalog:  # objects of "orders" are not its own
        assert catalog.buckets() == [] and catalog.repair_report.clean


def test_file_storage_recovers_a_deleted_manifest(tmp_path: Path) -> None:
    storage = FileStorage(tmp_path / "a")
    _build(storage)
    storage.close()
    twin = tmp_path / "b"
    os.system(f"cp -a {tmp_path / 'a'} {twin}")
    expected, _, _ = _deliver_all(FileStorage(twin))
    storage = FileStorage(tmp_path / "a")
    storage.manifest_path(NAME).unlink()
    got, _, stats = _deliver_all(storage)
    assert got == expected
    _recovered_warning(stats)


# -- gc --------------------------------------------------------------------------------------------


def _gc(storage: BaseStorage) -> Any:
    later = time.time_ns() // 1_000_000 + 10**7  # every object is old enough
    return run_gc(storage, now_ms=later, grace_ms=0, delete=True)


@pytest.mark.parametrize(
    "damage",
    ["delete-current", "flip-current", "delete-everything", "flip-everything"],
)
def test_gc_refuses_while_a_manifest_is_missing_or_damaged(damage: str) -> None:
    storage = MemoryStorage()
    _build(storage)
    objects = {o.id for o in storage.list_objects()}
    if damage.startswith("delete"):
        storage.delete_raw_manifest(NAME)
    else:
        storage.put_raw_manifest(NAME, _flip(storage.raw_manifest(NAME) or b"", 3))
    if damage.endswith("everything"):
        for version, raw in storage.raw_manifest_history(NAME).items():
            storage.put_raw_manifest_history(
                NAME, version, None if damage.startswith("delete") else _flip(raw, 3)
            )
    report = _gc(storage)
    assert report.refused and NAME in report.refused + str(report.corrupt_manifests)
    assert report.deleted == ()
    assert {o.id for o in storage.list_objects()} == objects


def test_gc_keeps_objects_of_a_surviving_generation() -> None:
    storage = MemoryStorage()
    _build(storage)
    manifest = storage.read_manifest(NAME)
    victim = manifest.buckets[0]
    # The current manifest forgets a bucket (as a bad edit would); a history generation has it.
    from dataclasses import replace

    storage.put_raw_manifest(
        NAME,
        encode_manifest(replace(manifest, buckets=manifest.buckets[1:])),
    )
    report = _gc(storage)
    assert victim.snapshot_id not in report.deleted
    assert victim.snapshot_id in {o.id for o in storage.list_objects()}


def test_gc_still_collects_real_orphans() -> None:
    storage = MemoryStorage()
    _build(storage)
    metadata, segments = build_snapshot(
        np.array([1]), np.array([1]), np.array([1]), max_time_step_ms=10,
        max_indexes_per_segment=-1, start_ledger=1, end_ledger=1,
    )  # fmt: skip
    storage.create(metadata, segments, "stray")  # no origin: nobody's
    report = _gc(storage)
    assert report.deleted == ("stray",) and not report.refused


# -- fsck ------------------------------------------------------------------------------------------


def _fsck(store: Path, *extra: str) -> tuple[int, dict[str, Any]]:
    import contextlib
    import io

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = main(["fsck", "--store", str(store), "--json", *extra])
    return code, json.loads(out.getvalue())


def test_fsck_is_clean_on_a_clean_store(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    storage = FileStorage(tmp_path)
    _build(storage)
    storage.close()
    code = main(["fsck", "--store", str(tmp_path), "--no-progress"])
    assert code == 0
    assert "nothing is damaged" in capsys.readouterr().out
    code, payload = _fsck(tmp_path)
    assert code == 0 and payload["clean"] and payload["damaged"] == []
    assert payload["objects"] > 0 and payload["generations"] >= MANIFEST_HISTORY


def _files(root: Path) -> dict[str, list[Path]]:
    manifests = sorted((root / "manifests").iterdir())
    return {
        "object": sorted((root / "objects").iterdir()),
        "manifest": [p for p in manifests if p.name.endswith(".manifest")],
        "history": [p for p in manifests if not p.name.endswith(".manifest")],
    }


@pytest.mark.parametrize("kind", ["object", "manifest", "history"])
@pytest.mark.parametrize("where", [0.0, 0.3, 0.6, 0.95])
def test_fsck_finds_a_flipped_byte_in_each_file_kind(
    tmp_path: Path, kind: str, where: float
) -> None:
    storage = FileStorage(tmp_path)
    _build(storage)
    storage.close()
    victim = _files(tmp_path)[kind][-1]
    data = victim.read_bytes()
    victim.write_bytes(_flip(data, int(len(data) * where)))
    code, payload = _fsck(tmp_path)
    assert code == 1 and not payload["clean"]
    [found] = payload["damaged"]
    assert found["kind"] == kind and found["file"] == str(victim) and found["error"]


def test_fsck_reads_every_segment(tmp_path: Path) -> None:
    """Damage deep in a segment that inspect (metadata only) would never read."""
    storage = FileStorage(tmp_path)
    _build(storage)
    record = storage.read_manifest(NAME).buckets[0]
    path = storage.object_path(record.snapshot_id)
    data = path.read_bytes()
    path.write_bytes(_flip(data, len(data) - 6))
    storage.get_metadata(record.snapshot_id)  # the metadata still reads fine
    report = check_store(storage)
    assert [d.id for d in report.damaged] == [record.snapshot_id]


def test_fsck_reports_a_deleted_manifest(tmp_path: Path) -> None:
    storage = FileStorage(tmp_path)
    _build(storage)
    storage.manifest_path(NAME).unlink()
    report = check_store(storage)
    assert [(d.kind, d.id) for d in report.damaged] == [("manifest", NAME)]
    assert "missing" in report.damaged[0].error
