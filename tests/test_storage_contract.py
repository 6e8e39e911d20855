"""The SnapshotStorage contract, one suite run against every backend.

The ``backend`` fixture builds a MemoryStorage and a FileStorage(tmp_path) in turn and wraps the
backend-specific test seams: reading and planting raw bytes, and making an operation fail N
times (MemoryStorage.inject_failure; for FileStorage the os-level call behind the operation is
monkeypatched). Snapshots are real ones from build_snapshot, cut into many small segments.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any, cast

import numpy as np
import numpy.typing as npt
import pytest

from delayindex.errors import (
    DelayIndexError,
    ManifestConflictError,
    SnapshotCorruptError,
    SnapshotExistsError,
    SnapshotNotFoundError,
    StorageError,
    StoreLockedError,
)
from delayindex.snapshot.codec import encode_snapshot, read_header
from delayindex.snapshot.format import Segment, SnapshotMetadata, build_snapshot
from delayindex.storage import (
    MAX_ATTEMPTS,
    BucketRecord,
    FileStorage,
    Intent,
    Manifest,
    MemoryStorage,
    ObjectInfo,
    SnapshotStorage,
    encode_manifest,
)
from delayindex.storage.memory import InjectedIOError

Snapshot = tuple[SnapshotMetadata, Sequence[Segment]]


def make_snapshot(
    seed: int = 1, n: int = 150, first_ledger: int = 5, per_segment: int = 12
) -> Snapshot:
    rng = np.random.default_rng(seed)
    times = rng.integers(1_000_000, 1_100_000, n)
    ledgers = rng.integers(first_ledger, first_ledger + 4, n)
    return build_snapshot(
        times, ledgers, np.arange(n), max_time_step_ms=20_000, max_indexes_per_segment=per_segment
    )


class Backend:
    """A storage under test plus its backend-specific seams."""

    def __init__(self, kind: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        self.kind = kind
        self.monkeypatch = monkeypatch
        self.storage: MemoryStorage | FileStorage = (
            MemoryStorage() if kind == "memory" else FileStorage(tmp_path / "store")
        )

    def raw(self, snapshot_id: str) -> bytes:
        if isinstance(self.storage, MemoryStorage):
            return self.storage.raw_object(snapshot_id)
        return self.storage.object_path(snapshot_id).read_bytes()

    def plant(self, snapshot_id: str, data: bytes) -> None:
        if isinstance(self.storage, MemoryStorage):
            self.storage.put_raw_object(snapshot_id, data)
        else:  # a new inode, as any rewrite would make
            tmp = self.storage.root / "planted"
            tmp.write_bytes(data)
            os.replace(tmp, self.storage.object_path(snapshot_id))

    def plant_manifest(self, name: str, data: bytes) -> None:
        if isinstance(self.storage, MemoryStorage):
            self.storage.put_raw_manifest(name, data)
        else:
            self.storage.manifest_path(name).write_bytes(data)

    def fail(self, op: str, times: int, *, after: bool = False) -> None:
        """Make the next ``times`` attempts of ``op`` hit a transient I/O error."""
        if isinstance(self.storage, MemoryStorage):
            self.storage.inject_failure(
                "manifest" if op == "commit_manifest" else op, times=times, after=after
            )
            return
        when: Callable[..., bool] = lambda *_: True  # noqa: E731
        if after:  # the effect lands, then the directory fsync fails: a lost acknowledgement
            name = "fsync"
            when = lambda fd: os.path.isdir(f"/proc/self/fd/{fd}")  # noqa: E731
        else:
            name = {
                "create": "link",
                "get_metadata": "pread",
                "get_segments": "pread",
                "delete": "unlink",
                "commit_manifest": "replace",
            }[op]
        real = getattr(os, name)
        left = [times]

        def flaky(*args: Any, **kwargs: Any) -> Any:
            if left[0] and when(*args):
                left[0] -= 1
                raise OSError(errno.EIO, f"test: {name} failed")
            return real(*args, **kwargs)

        self.monkeypatch.setattr(os, name, flaky)


@pytest.fixture(params=["memory", "file"])
def backend(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Backend]:
    b = Backend(request.param, tmp_path, monkeypatch)
    yield b
    monkeypatch.undo()
    b.storage.close()


@pytest.fixture
def snap() -> Snapshot:
    metadata, segments = make_snapshot()
    assert metadata.num_segments >= 8  # several segments, or the range tests mean little
    return metadata, segments


# -- objects -------------------------------------------------------------------------------------


def test_backends_implement_the_protocol(backend: Backend) -> None:
    assert isinstance(backend.storage, SnapshotStorage)


def test_round_trip(backend: Backend, snap: Snapshot) -> None:
    metadata, segments = snap
    storage = backend.storage
    assert storage.create(metadata, segments, "orders-5-8-abc") == "orders-5-8-abc"
    assert storage.get_metadata("orders-5-8-abc") == metadata
    n = metadata.num_segments
    assert storage.get_segments("orders-5-8-abc", 1, n) == segments
    for i in range(1, n + 1):
        assert storage.get_segments("orders-5-8-abc", i, i) == [segments[i - 1]]
    got = storage.get_segments("orders-5-8-abc", 3, 6)
    assert isinstance(got, list) and got == segments[2:6]
    assert backend.raw("orders-5-8-abc") == encode_snapshot(metadata, segments)


def test_last_is_clamped_and_first_past_the_end_is_empty(backend: Backend, snap: Snapshot) -> None:
    metadata, segments = snap
    n = metadata.num_segments
    backend.storage.create(metadata, segments, "k")
    assert backend.storage.get_segments("k", n - 1, n + 5) == segments[n - 2 :]
    assert backend.storage.get_segments("k", 1, 2**40) == segments
    assert backend.storage.get_segments("k", n + 1, n + 3) == []
    assert backend.storage.get_segments("k", 10**6, 10**6) == []


def test_segment_arrays_match_the_segments(backend: Backend, snap: Snapshot) -> None:
    metadata, segments = snap
    n = metadata.num_segments
    backend.storage.create(metadata, segments, "k")
    for first, last in [(1, n), (2, 2), (3, n + 4), (n + 1, n + 2)]:
        times, ledgers, entries = backend.storage.get_segment_arrays("k", first, last)
        expected = list(segments[first - 1 : last])
        assert times.tolist() == [t for s in expected for t in s.times.tolist()]
        assert ledgers.tolist() == [x for s in expected for x in s.ledgers.tolist()]
        assert entries.tolist() == [x for s in expected for x in s.entries.tolist()]
    with pytest.raises(ValueError, match="bad segment range"):
        backend.storage.get_segment_arrays("k", 0, 1)
    with pytest.raises(SnapshotNotFoundError):
        backend.storage.get_segment_arrays("missing", 1, 1)


def test_segment_runs_concatenate_the_ranges(backend: Backend, snap: Snapshot) -> None:
    metadata, segments = snap
    n = metadata.num_segments
    backend.storage.create(metadata, segments, "k")
    runs = [(2, 2), (1, 1), (n + 1, n + 3), (3, n + 4)]
    want = [backend.storage.get_segment_arrays("k", a, b) for a, b in runs]
    got = backend.storage.get_segment_runs("k", runs)
    for i in range(3):
        assert got[i].tolist() == [x for w in want for x in w[i].tolist()]
    assert all(len(c) == 0 for c in backend.storage.get_segment_runs("k", []))
    calls = backend.storage.stats()["get_segments"]["calls"]
    with pytest.raises(ValueError, match="bad segment range"):
        backend.storage.get_segment_runs("k", [(1, 2), (0, 1)])
    assert backend.storage.stats()["get_segments"]["calls"] == calls  # validated first
    with pytest.raises(SnapshotNotFoundError):
        backend.storage.get_segment_runs("missing", [(1, 1)])


def test_segment_times_without_the_metadata(backend: Backend, snap: Snapshot) -> None:
    metadata, segments = snap
    n = metadata.num_segments
    backend.storage.create(metadata, segments, "k")
    columns = (metadata.mins, metadata.maxs, metadata.counts)
    runs = [(2, 2), (1, 1), (n + 1, n + 3), (3, n + 4)]
    got = backend.storage.get_segment_times("k", runs, *columns)
    # Each segment's times, in its position order: compare segment by segment as multisets.
    want = [s.times for a, b in runs for s in segments[a - 1 : min(b, n)]]
    cuts = np.cumsum([0, *(len(w) for w in want)]).tolist()
    assert cuts[-1] == len(got)
    for w, a, b in zip(want, cuts[:-1], cuts[1:], strict=True):
        assert sorted(got[a:b].tolist()) == sorted(w.tolist())
    assert len(backend.storage.get_segment_times("k", [], *columns)) == 0
    calls = backend.storage.stats()["get_segments"]["calls"]
    with pytest.raises(ValueError, match="bad segment range"):
        backend.storage.get_segment_times("k", [(1, 2), (0, 1)], *columns)
    with pytest.raises(ValueError, match="differ in length"):
        short = cast(npt.NDArray[np.int64], [1])  # a list: the columns are coerced with asarray
        backend.storage.get_segment_times("k", [(1, 1)], metadata.mins, metadata.maxs, short)
    assert backend.storage.stats()["get_segments"]["calls"] == calls  # validated first
    with pytest.raises(SnapshotNotFoundError):
        backend.storage.get_segment_times("missing", [(1, 1)], *columns)
    # Columns of another snapshot, or of the wrong length, are refused, naming the object.
    with pytest.raises(SnapshotCorruptError, match=r"k.*segment entries"):
        backend.storage.get_segment_times("k", [(1, 1)], *(c[:-1] for c in columns))
    wrong_counts = np.array(metadata.counts) + 1
    with pytest.raises(SnapshotCorruptError, match="packed times have the wrong length"):
        backend.storage.get_segment_times("k", [(1, n)], metadata.mins, metadata.maxs, wrong_counts)


@pytest.mark.parametrize(("first", "last"), [(0, 1), (-1, 3), (3, 2), (2, 1), (0, 0)])
def test_bad_ranges(backend: Backend, snap: Snapshot, first: int, last: int) -> None:
    backend.storage.create(*snap, "k")
    with pytest.raises(ValueError, match="bad segment range"):
        backend.storage.get_segments("k", first, last)


def test_non_int_bounds(backend: Backend, snap: Snapshot) -> None:
    backend.storage.create(*snap, "k")
    with pytest.raises(TypeError):
        backend.storage.get_segments("k", 1.0, 2)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        backend.storage.get_segments("k", 1, True)


def test_length_and_list_objects(backend: Backend, snap: Snapshot) -> None:
    storage = backend.storage
    assert storage.list_objects() == []
    other = make_snapshot(seed=2, n=7, first_ledger=100)
    storage.create(*snap, "b-1")
    storage.create(*other, "a-1")
    assert storage.length("b-1") == len(encode_snapshot(*snap))
    assert storage.length("a-1") == len(encode_snapshot(*other))
    listed = storage.list_objects()
    assert [(o.id, o.size) for o in listed] == [
        ("a-1", storage.length("a-1")),
        ("b-1", storage.length("b-1")),
    ]
    assert all(isinstance(o, ObjectInfo) and o.mtime_ms > 1_500_000_000_000 for o in listed)


def test_delete_is_idempotent_and_then_not_found(backend: Backend, snap: Snapshot) -> None:
    storage = backend.storage
    storage.create(*snap, "gone")
    storage.get_metadata("gone")  # warm any cache
    storage.delete("gone")
    storage.delete("gone")
    storage.delete("never-existed")
    assert storage.list_objects() == []
    for call in (
        lambda: storage.get_metadata("gone"),
        lambda: storage.get_segments("gone", 1, 1),
        lambda: storage.length("gone"),
    ):
        with pytest.raises(SnapshotNotFoundError, match="'gone'"):
            call()


def test_not_found_is_not_a_storage_error_and_is_not_retried(backend: Backend) -> None:
    with pytest.raises(SnapshotNotFoundError) as info:
        backend.storage.get_metadata("missing")
    assert isinstance(info.value, DelayIndexError) and not isinstance(info.value, StorageError)
    assert backend.storage.stats()["get_metadata"] == {
        "calls": 1,
        "attempts": 1,
        "failures": 1,
        "gave_up": 0,
    }


def test_duplicate_key_is_refused_and_the_original_kept(backend: Backend, snap: Snapshot) -> None:
    storage = backend.storage
    storage.create(*snap, "dup")
    original = backend.raw("dup")
    other = make_snapshot(seed=9)
    for metadata, segments in (other, snap):  # even identical bytes: create never overwrites
        with pytest.raises(StorageError, match="already exists") as info:
            storage.create(metadata, segments, "dup")
        assert isinstance(info.value, SnapshotExistsError)
    assert backend.raw("dup") == original
    assert storage.stats()["create"]["attempts"] == 3  # not retried


@pytest.mark.parametrize("key", ["", "../x", "a/b", ".x", "-x", "a" * 201, "a b", "x\u00e9"])
def test_bad_keys_and_names(backend: Backend, snap: Snapshot, key: str) -> None:
    storage = backend.storage
    for call in (
        lambda: storage.create(*snap, key),
        lambda: storage.get_metadata(key),
        lambda: storage.get_segments(key, 1, 1),
        lambda: storage.length(key),
        lambda: storage.delete(key),
        lambda: storage.read_manifest(key),
        lambda: storage.commit_manifest(key, Manifest("ok")),
        lambda: storage.lock(key),
    ):
        with pytest.raises(ValueError, match="bad"):
            call()
    assert all(s["calls"] == 0 for s in storage.stats().values())  # refused before any I/O
    assert storage.list_objects() == []


def test_mismatched_segments_are_a_value_error(backend: Backend, snap: Snapshot) -> None:
    metadata, segments = snap
    with pytest.raises(ValueError):
        backend.storage.create(metadata, segments[:-1], "k")
    assert backend.storage.list_objects() == []


# -- corruption ----------------------------------------------------------------------------------


def test_corrupt_objects_are_detected_and_named(backend: Backend, snap: Snapshot) -> None:
    metadata, segments = snap
    storage = backend.storage
    storage.create(metadata, segments, "victim")
    assert storage.get_metadata("victim") == metadata  # cache warm: must not mask damage
    good = backend.raw("victim")
    header = read_header(good, "x")
    seg5 = header.entry_offset(5)
    # A byte inside segment 5 only breaks reads that include segment 5.
    damaged = bytearray(good)
    damaged[seg5 + 1] ^= 0x40
    backend.plant("victim", bytes(damaged))
    assert storage.get_metadata("victim") == metadata
    assert storage.get_segments("victim", 1, 4) == segments[:4]
    with pytest.raises(SnapshotCorruptError, match="victim"):
        storage.get_segments("victim", 5, 5)
    with pytest.raises(SnapshotCorruptError, match="victim"):
        storage.get_segments("victim", 2, 9)
    # Header, entry table or metadata damage breaks every read.
    for position in (0, 5, header.header_bytes - 1, header.header_bytes + 3):
        damaged = bytearray(good)
        damaged[position] ^= 0x01
        backend.plant("victim", bytes(damaged))
        for call in (
            lambda: storage.get_metadata("victim"),
            lambda: storage.get_segments("victim", 1, 1),
        ):
            with pytest.raises(SnapshotCorruptError, match="victim"):
                call()
    assert storage.stats()["get_metadata"]["gave_up"] == 0  # corruption is never retried


def test_truncated_and_extended_objects_are_corrupt(backend: Backend, snap: Snapshot) -> None:
    backend.storage.create(*snap, "t")
    good = backend.raw("t")
    for data in (good[: len(good) - 1], good[:100], good[:3], b"", good + b"\x00"):
        backend.plant("t", data)
        with pytest.raises(SnapshotCorruptError, match=r"objects/t(\.dixs)?: "):
            backend.storage.get_metadata("t")


def test_orphan_planted_object_is_listed(backend: Backend, snap: Snapshot) -> None:
    backend.plant("orphan-1", encode_snapshot(*snap))
    assert [o.id for o in backend.storage.list_objects()] == ["orphan-1"]
    assert backend.storage.get_metadata("orphan-1") == snap[0]


# -- manifests -----------------------------------------------------------------------------------


def _manifest(name: str = "orders") -> Manifest:
    return (
        Manifest(name)
        .with_bucket(BucketRecord(1, 4, f"{name}-1-4-a", 10, 2, 300))
        .with_intent(Intent("delete", f"{name}-5-6-b", 5, 6, attempts=1, last_error="x"))
    )


def test_missing_manifest_is_empty_version_zero(backend: Backend) -> None:
    assert backend.storage.read_manifest("orders") == Manifest("orders", version=0)


def test_manifest_compare_and_swap(backend: Backend) -> None:
    storage = backend.storage
    v1 = storage.commit_manifest("orders", _manifest())
    assert v1.version == 1 and v1 == replace(_manifest(), version=1)
    assert storage.read_manifest("orders") == v1
    v2 = storage.commit_manifest("orders", v1.without_intent("orders-5-6-b"))
    assert v2.version == 2 and v2.intents == ()
    for stale in (_manifest(), v1, replace(v2, version=5)):
        with pytest.raises(ManifestConflictError, match="version 2"):
            storage.commit_manifest("orders", stale)
    assert storage.read_manifest("orders") == v2
    assert storage.read_manifest("other") == Manifest("other")  # names are independent
    assert storage.commit_manifest("other", _manifest("other")).version == 1
    assert storage.stats()["commit_manifest"]["gave_up"] == 0


def test_manifest_name_must_match(backend: Backend) -> None:
    with pytest.raises(ValueError, match="committed under"):
        backend.storage.commit_manifest("orders", Manifest("other"))
    with pytest.raises(TypeError):
        backend.storage.commit_manifest("orders", {"name": "orders"})  # type: ignore[arg-type]


def test_corrupt_manifest_is_reported_and_not_overwritten(backend: Backend) -> None:
    storage = backend.storage
    v1 = storage.commit_manifest("orders", _manifest())
    data = bytearray(encode_manifest(v1))
    data[-3] ^= 0x20
    backend.plant_manifest("orders", bytes(data))
    with pytest.raises(SnapshotCorruptError, match="orders"):
        storage.read_manifest("orders")
    with pytest.raises(SnapshotCorruptError, match="orders"):
        storage.commit_manifest("orders", v1)
    backend.plant_manifest("orders", encode_manifest(replace(_manifest("other"), version=3)))
    with pytest.raises(SnapshotCorruptError, match="manifest of 'other'"):
        storage.read_manifest("orders")


def test_list_manifests_names_every_committed_manifest_sorted(backend: Backend) -> None:
    storage = backend.storage
    assert storage.list_manifests() == []
    storage.read_manifest("never")  # reading a missing manifest does not create one
    with storage.lock("locked-only"):  # neither does taking a name's lock
        assert storage.list_manifests() == []
    for name in ("orders", "b.x", "Zed", "a-1"):
        storage.commit_manifest(name, _manifest(name))
    v2 = storage.commit_manifest("orders", storage.read_manifest("orders"))
    assert v2.version == 2
    assert storage.list_manifests() == sorted(["orders", "b.x", "Zed", "a-1"])
    # A damaged manifest is still listed: listing names does not decode anything.
    backend.plant_manifest("a-1", b"junk")
    assert storage.list_manifests() == ["Zed", "a-1", "b.x", "orders"]
    assert storage.stats()["list_manifests"]["calls"] == 4
    storage.close()
    with pytest.raises(ValueError, match="closed"):
        storage.list_manifests()


def test_file_list_manifests_ignores_foreign_files(tmp_path: Path) -> None:
    storage = FileStorage(tmp_path / "store")
    storage.commit_manifest("orders", _manifest())
    for junk in (".hidden.manifest", "notes.txt", "orders.manifest.bak", "a b.manifest"):
        (storage.manifests_dir / junk).write_bytes(b"x")
    (storage.manifests_dir / "dir.manifest").mkdir()
    assert storage.list_manifests() == ["orders"]


def test_file_list_manifests_is_retried(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    storage = FileStorage(tmp_path / "store")
    storage.commit_manifest("orders", _manifest())
    real, left = os.scandir, [MAX_ATTEMPTS - 1]

    def flaky(path: Any) -> Any:
        if left[0]:
            left[0] -= 1
            raise OSError(errno.EIO, "test: scandir failed")
        return real(path)

    monkeypatch.setattr(os, "scandir", flaky)
    assert storage.list_manifests() == ["orders"]
    assert storage.stats()["list_manifests"] == {
        "calls": 1,
        "attempts": 4,
        "failures": 3,
        "gave_up": 0,
    }
    left[0] = MAX_ATTEMPTS
    with pytest.raises(StorageError, match=r"^list_manifests of '\*' failed after 4 attempts"):
        storage.list_manifests()


# -- locks ---------------------------------------------------------------------------------------


def test_lock_is_exclusive_per_name(backend: Backend) -> None:
    storage = backend.storage
    handle = storage.lock("orders")
    assert handle.held
    with pytest.raises(StoreLockedError) as info:
        storage.lock("orders")
    assert "'orders'" in str(info.value) and handle.where in str(info.value)
    with storage.lock("payments") as other:  # other names are independent
        assert other.held
    assert not other.held
    handle.release()
    handle.release()  # idempotent
    assert not handle.held
    storage.lock("orders").release()  # free again


def test_close_releases_locks_and_refuses_use(backend: Backend, snap: Snapshot) -> None:
    storage = backend.storage
    handle = storage.lock("orders")
    storage.close()
    storage.close()
    assert not handle.held
    with pytest.raises(ValueError, match="closed"):
        storage.create(*snap, "k")
    with pytest.raises(ValueError, match="closed"):
        storage.read_manifest("orders")


# -- retries -------------------------------------------------------------------------------------


def _run(storage: SnapshotStorage, op: str, snap: Snapshot) -> Callable[[], object]:
    return {
        "create": lambda: storage.create(*snap, "new"),
        "get_metadata": lambda: storage.get_metadata("old"),
        "get_segments": lambda: storage.get_segments("old", 2, 3),
        "delete": lambda: storage.delete("old"),
        "commit_manifest": lambda: storage.commit_manifest("orders", Manifest("orders")),
    }[op]


def _state(backend: Backend) -> tuple[list[str], Manifest, list[str]]:
    storage = backend.storage
    tmp = [] if isinstance(storage, MemoryStorage) else sorted(os.listdir(storage.tmp_dir))
    return [o.id for o in storage.list_objects()], storage.read_manifest("orders"), tmp


def _delta(storage: SnapshotStorage, op: str, start: dict[str, int]) -> dict[str, int]:
    return {k: v - start[k] for k, v in storage.stats()[op].items()}


OPS = ["create", "get_metadata", "get_segments", "delete", "commit_manifest"]


@pytest.mark.parametrize("op", OPS)
def test_three_failures_then_success(backend: Backend, snap: Snapshot, op: str) -> None:
    storage = backend.storage
    storage.create(*snap, "old")
    start = storage.stats()[op]
    backend.fail(op, MAX_ATTEMPTS - 1)
    result = _run(storage, op, snap)()
    if op == "get_segments":
        assert result == snap[1][1:3]
    elif op == "get_metadata":
        assert result == snap[0]
    objects, manifest, tmp = _state(backend)
    assert ("new" in objects) == (op == "create") and ("old" in objects) == (op != "delete")
    assert manifest.version == (1 if op == "commit_manifest" else 0)
    assert tmp == []
    assert _delta(storage, op, start) == {"calls": 1, "attempts": 4, "failures": 3, "gave_up": 0}


@pytest.mark.parametrize("op", OPS)
def test_four_failures_give_up_and_change_nothing(
    backend: Backend, snap: Snapshot, op: str
) -> None:
    storage = backend.storage
    storage.create(*snap, "old")
    before = _state(backend)
    start = storage.stats()[op]
    backend.fail(op, MAX_ATTEMPTS)
    with pytest.raises(StorageError) as info:
        _run(storage, op, snap)()
    target = {"create": "'new'", "commit_manifest": "'orders'"}.get(op, "'old'")
    assert str(info.value).startswith(f"{op} of {target} failed after 4 attempts")
    assert isinstance(info.value.__cause__, OSError)
    assert _delta(storage, op, start) == {"calls": 1, "attempts": 4, "failures": 4, "gave_up": 1}
    assert _state(backend) == before
    _run(storage, op, snap)()  # the failures are used up: works again


@pytest.mark.parametrize("op", ["create", "commit_manifest"])
def test_a_lost_acknowledgement_is_not_a_failure(backend: Backend, snap: Snapshot, op: str) -> None:
    """The first attempt takes effect but reports an error; the retry must see success."""
    storage = backend.storage
    backend.fail(op, 1, after=True)
    if op == "create":
        assert storage.create(*snap, "new") == "new"
        assert storage.get_segments("new", 1, 100) == snap[1]
    else:
        assert storage.commit_manifest("orders", _manifest()).version == 1
        assert storage.read_manifest("orders").version == 1
    assert storage.stats()[op] == {"calls": 1, "attempts": 2, "failures": 1, "gave_up": 0}


# -- MemoryStorage specifics -----------------------------------------------------------------------


def test_memory_injection_rules(snap: Snapshot) -> None:
    storage = MemoryStorage()
    with pytest.raises(ValueError, match="unknown op"):
        storage.inject_failure("length")
    with pytest.raises(ValueError, match="times"):
        storage.inject_failure("create", times=0)
    storage.inject_failure("manifest", times=2)
    assert storage.pending_failures("manifest") == 2
    # "manifest" covers reads and commits; each failed attempt uses one up and is retried.
    assert storage.read_manifest("n") == Manifest("n")
    assert storage.stats()["read_manifest"] == {
        "calls": 1,
        "attempts": 3,
        "failures": 2,
        "gave_up": 0,
    }
    storage.inject_failure("manifest")
    assert storage.commit_manifest("n", Manifest("n")).version == 1
    assert storage.stats()["commit_manifest"]["failures"] == 1
    assert storage.pending_failures("manifest") == 0
    # A non-OSError is not transient: it propagates at once, unwrapped.
    storage.inject_failure("create", error=KeyError("boom"), times=3)
    with pytest.raises(KeyError, match="boom"):
        storage.create(*snap, "k")
    assert storage.pending_failures("create") == 2
    assert storage.stats()["create"]["attempts"] == 1
    # A custom OSError is retried like the default one.
    storage = MemoryStorage()
    storage.inject_failure("get_metadata", error=TimeoutError("slow"), times=4)
    storage.create(*snap, "k")
    with pytest.raises(StorageError, match="TimeoutError") as info:
        storage.get_metadata("k")
    assert isinstance(info.value.__cause__, TimeoutError)


def test_memory_default_injected_error_is_transient_io() -> None:
    storage = MemoryStorage()
    storage.inject_failure("delete", times=4)
    with pytest.raises(StorageError) as info:
        storage.delete("x")
    cause = info.value.__cause__
    assert isinstance(cause, InjectedIOError) and isinstance(cause, OSError)
    assert cause.errno == errno.EIO


def test_memory_break_locks_does_not_free_a_new_holder() -> None:
    storage = MemoryStorage()
    stale = storage.lock("orders")
    storage.break_locks()  # the holder "died"
    fresh = storage.lock("orders")
    stale.release()  # a late release by the dead holder must not free the new one
    with pytest.raises(StoreLockedError):
        storage.lock("orders")
    fresh.release()
    storage.lock("orders")


def test_memory_uses_the_given_clock(snap: Snapshot) -> None:
    storage = MemoryStorage(clock=lambda: 1_234)
    storage.create(*snap, "k")
    assert storage.list_objects()[0].mtime_ms == 1_234
