"""FileStorage specifics: layout, fsync, atomic writes, cross-process locks, partial reads."""

from __future__ import annotations

import errno
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import delayindex
from delayindex.errors import SnapshotCorruptError, StorageError, StoreLockedError
from delayindex.snapshot.codec import read_header
from delayindex.snapshot.format import Segment, SnapshotMetadata, build_snapshot
from delayindex.storage import FileStorage, Manifest, encode_manifest

Snapshot = tuple[SnapshotMetadata, Sequence[Segment]]
SRC = str(Path(delayindex.__file__).resolve().parents[1])


class SimulatedCrash(BaseException):
    """The process 'dies' here: nothing after this point runs."""


@pytest.fixture
def snap() -> Snapshot:
    rng = np.random.default_rng(7)
    n = 300
    metadata, segments = build_snapshot(
        rng.integers(0, 600_000, n),
        rng.integers(40, 44, n),
        np.arange(n),
        max_time_step_ms=60_000,
        max_indexes_per_segment=20,
    )
    assert metadata.num_segments >= 12
    return metadata, segments


@pytest.fixture
def store(tmp_path: Path) -> Iterator[FileStorage]:
    storage = FileStorage(tmp_path / "store")
    yield storage
    storage.close()


def _tree(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


def test_layout_on_disk(store: FileStorage, snap: Snapshot) -> None:
    root = store.root
    assert _tree(root) == ["locks", "manifests", "objects", "tmp"]
    store.create(*snap, "orders-40-43-abc")
    store.commit_manifest("orders", Manifest("orders"))
    with store.lock("orders"):
        assert _tree(root) == [
            "locks",
            "locks/orders.cas",
            "locks/orders.lock",
            "manifests",
            "manifests/orders.manifest",
            "manifests/orders.manifest.1",
            "objects",
            "objects/orders-40-43-abc.dixs",
            "tmp",
        ]
        assert (root / "locks/orders.lock").read_text().strip() == str(os.getpid())
    assert store.object_path("orders-40-43-abc") == root / "objects/orders-40-43-abc.dixs"
    assert (root / "manifests/orders.manifest").read_bytes() == encode_manifest(
        Manifest("orders", version=1)
    )
    store.delete("orders-40-43-abc")
    assert not (root / "objects/orders-40-43-abc.dixs").exists()


def test_foreign_files_in_objects_are_not_listed(store: FileStorage, snap: Snapshot) -> None:
    store.create(*snap, "k")
    (store.objects_dir / "notes.txt").write_text("hi")
    (store.objects_dir / "bad name.dixs").write_text("hi")
    (store.objects_dir / "sub.dixs").mkdir()
    assert [o.id for o in store.list_objects()] == ["k"]


def test_names_cannot_escape_the_directory(store: FileStorage, tmp_path: Path) -> None:
    for name in ("../escape", "..", "a/../../b", "/abs"):
        with pytest.raises(ValueError):
            store.commit_manifest(name, Manifest("ok"))
        with pytest.raises(ValueError):
            store.lock(name)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["store"]


# -- durability ----------------------------------------------------------------------------------


@pytest.fixture
def syscalls(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, str]]:
    """Record fsync/link/replace/unlink calls as (call, path relative to the store)."""
    events: list[tuple[str, str]] = []

    def record(name: str, real: Any, path_of: Any) -> Any:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            result = real(*args, **kwargs)
            events.append((name, path_of(*args)))
            return result

        return wrapper

    def fd_path(fd: int, *_: Any) -> str:
        return os.readlink(f"/proc/self/fd/{fd}")

    monkeypatch.setattr(os, "fsync", record("fsync", os.fsync, fd_path))
    monkeypatch.setattr(os, "link", record("link", os.link, lambda src, dst: str(dst)))
    monkeypatch.setattr(os, "replace", record("replace", os.replace, lambda src, dst: str(dst)))
    return events


def _relative(events: list[tuple[str, str]], root: Path) -> list[tuple[str, str]]:
    out = []
    for call, path in events:
        rel = os.path.relpath(path, root)
        if rel.startswith("tmp/"):
            rel = "tmp/*"
        out.append((call, rel))
    return out


def test_create_fsyncs_the_file_then_the_directory(
    store: FileStorage, snap: Snapshot, syscalls: list[tuple[str, str]]
) -> None:
    store.create(*snap, "k")
    # The temp file is made durable before it gets its name, and the name after.
    assert _relative(syscalls, store.root) == [
        ("fsync", "tmp/*"),
        ("link", "objects/k.dixs"),
        ("fsync", "objects"),
    ]
    assert os.listdir(store.tmp_dir) == []


def test_manifest_commit_fsyncs_and_replaces_atomically(
    store: FileStorage, syscalls: list[tuple[str, str]]
) -> None:
    store.commit_manifest("orders", Manifest("orders"))
    # Two fsync'ed temp files (the manifest and its independent history copy), two renames,
    # the manifest first, and one directory sync that makes both names durable.
    assert _relative(syscalls, store.root) == [
        ("fsync", "tmp/*"),
        ("fsync", "tmp/*"),
        ("replace", "manifests/orders.manifest"),
        ("replace", "manifests/orders.manifest.1"),
        ("fsync", "manifests"),
    ]


def test_delete_fsyncs_the_directory(
    store: FileStorage, snap: Snapshot, syscalls: list[tuple[str, str]]
) -> None:
    store.create(*snap, "k")
    syscalls.clear()
    store.delete("k")
    assert _relative(syscalls, store.root) == [("fsync", "objects")]


def test_a_crash_mid_manifest_write_leaves_the_old_manifest(
    store: FileStorage, monkeypatch: pytest.MonkeyPatch
) -> None:
    v1 = store.commit_manifest("orders", Manifest("orders"))
    real_write = os.write

    def torn_write(fd: int, data: Any) -> int:
        real_write(fd, bytes(data)[: len(data) // 2])
        raise SimulatedCrash

    monkeypatch.setattr(os, "write", torn_write)
    with pytest.raises(SimulatedCrash):
        store.commit_manifest("orders", v1)
    monkeypatch.undo()
    assert store.read_manifest("orders") == v1  # readers never see the torn file


def test_temp_files_are_ignored_and_cleaned_on_open(store: FileStorage, snap: Snapshot) -> None:
    store.commit_manifest("orders", Manifest("orders"))
    dead = store.tmp_dir / "999999999-0123456789abcdef.tmp"  # pid_max is far below this
    dead.write_bytes(encode_manifest(Manifest("orders", version=9))[:20])
    junk = store.tmp_dir / "garbage"
    junk.write_bytes(b"\x00" * 10)
    mine = store.tmp_dir / f"{os.getpid()}-feedface.tmp"  # a live writer's: must stay
    mine.write_bytes(b"in flight")
    assert store.read_manifest("orders").version == 1
    assert [o.id for o in store.list_objects()] == []
    reopened = FileStorage(store.root)
    assert reopened.removed_temp_files == sorted([dead.name, junk.name])
    assert sorted(os.listdir(store.tmp_dir)) == [mine.name]
    assert reopened.read_manifest("orders").version == 1
    reopened.close()


def test_failed_object_write_leaves_no_temp_file(
    store: FileStorage, snap: Snapshot, monkeypatch: pytest.MonkeyPatch
) -> None:
    def full_disk(fd: int, data: Any) -> int:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "write", full_disk)
    with pytest.raises(
        StorageError, match=r"^create of 'k' failed after 4 attempts: .*No space left"
    ):
        store.create(*snap, "k")
    monkeypatch.undo()
    assert os.listdir(store.tmp_dir) == [] and store.list_objects() == []


def test_lost_acknowledgement_exhausting_retries_leaves_the_object(
    store: FileStorage, snap: Snapshot, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Linked, but the directory fsync keeps failing: the caller must treat it as maybe-written."""
    real = os.fsync

    def no_dir_fsync(fd: int) -> None:
        if os.path.isdir(f"/proc/self/fd/{fd}"):
            raise OSError(errno.EIO, "dir fsync failed")
        real(fd)

    monkeypatch.setattr(os, "fsync", no_dir_fsync)
    with pytest.raises(StorageError):
        store.create(*snap, "k")
    monkeypatch.undo()
    assert [o.id for o in store.list_objects()] == ["k"]  # the Catalog's rollback deletes it
    assert store.get_segments("k", 1, 100) == snap[1]


def test_without_hard_links_create_still_never_overwrites(
    store: FileStorage, snap: Snapshot, monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_links(src: Any, dst: Any) -> None:
        raise OSError(errno.EOPNOTSUPP, "Operation not supported")

    monkeypatch.setattr(os, "link", no_links)
    store.create(*snap, "k")
    assert store.get_segments("k", 1, 100) == snap[1]
    with pytest.raises(StorageError, match="already exists"):
        store.create(*snap, "k")
    assert os.listdir(store.tmp_dir) == []


# -- locks across processes ----------------------------------------------------------------------

_CHILD = textwrap.dedent(
    """
    import sys
    from delayindex.storage import FileStorage, StoreLockedError
    storage = FileStorage(sys.argv[1])
    try:
        storage.lock("orders")
    except StoreLockedError as exc:
        print(f"{type(exc).__name__}: {exc}")
        sys.exit(3)
    print("locked")
    """
)


def _child(path: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": SRC}
    return subprocess.run(
        [sys.executable, "-c", _CHILD, str(path)],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_lock_excludes_other_processes(store: FileStorage) -> None:
    handle = store.lock("orders")
    held = _child(store.root)
    assert held.returncode == 3, held.stderr
    assert held.stdout.startswith("StoreLockedError: 'orders' is locked by another writer")
    assert f"(held by pid {os.getpid()})" in held.stdout
    assert str(store.lock_path("orders")) in held.stdout
    handle.release()
    free = _child(store.root)
    assert (free.returncode, free.stdout.strip()) == (0, "locked"), free.stderr
    store.lock("orders").release()  # the child's exit freed it


def test_second_instance_in_one_process_is_excluded(store: FileStorage) -> None:
    other = FileStorage(store.root)
    with store.lock("orders"), pytest.raises(StoreLockedError, match=r"locks/orders\.lock"):
        other.lock("orders")
    with other.lock("orders"):
        pass
    other.close()


# -- reads ---------------------------------------------------------------------------------------


def test_truncated_files_are_corrupt_and_named(store: FileStorage, snap: Snapshot) -> None:
    store.create(*snap, "t")
    path = store.object_path("t")
    good = path.read_bytes()
    header = read_header(good, "x")
    lengths = {0, 1, 9, header.header_bytes - 1, header.header_bytes, header.entry_offset(1)}
    lengths |= {header.entry_offset(5) + 2, len(good) - 1, *range(0, len(good), 97)}
    for length in sorted(lengths):
        os.truncate(path, length)
        for call in (lambda: store.get_metadata("t"), lambda: store.get_segments("t", 1, 1)):
            with pytest.raises(SnapshotCorruptError) as info:
                call()
            assert str(info.value).startswith(str(path)), (length, str(info.value))
        path.write_bytes(good)  # back to whole, for the next length


@pytest.fixture
def preads(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, int]]:
    """Record every os.pread as (offset, length)."""
    calls: list[tuple[int, int]] = []
    real = os.pread

    def wrapper(fd: int, length: int, offset: int) -> bytes:
        calls.append((offset, length))
        return real(fd, length, offset)

    monkeypatch.setattr(os, "pread", wrapper)
    return calls


def test_get_segments_reads_only_what_it_needs(
    store: FileStorage, snap: Snapshot, preads: list[tuple[int, int]]
) -> None:
    metadata, segments = snap
    store.create(metadata, segments, "p")
    path = store.object_path("p")
    header = read_header(path.read_bytes(), "x")
    assert store.get_segments("p", 5, 6) == segments[4:6]
    seg5, seg7 = header.entry_offset(5), header.entry_offset(7)
    entry0 = (header.entry_offset(0), header.entry_lengths[0])
    assert preads[-2:] == [entry0, (seg5, seg7 - seg5)]  # metadata, then segments 5-6 at once
    read = sum(length for _, length in preads)
    assert read == header.header_bytes + header.entry_lengths[0] + seg7 - seg5 < header.total_bytes
    preads.clear()
    assert store.get_segments("p", 9, 9) == [segments[8]]  # metadata now comes from the cache
    seg9 = header.entry_offset(9)
    assert preads[-1] == (seg9, header.entry_lengths[9])
    assert all(offset < header.header_bytes or offset == seg9 for offset, _ in preads)


def test_damage_elsewhere_does_not_block_a_read(store: FileStorage, snap: Snapshot) -> None:
    metadata, segments = snap
    store.create(metadata, segments, "p")
    path = store.object_path("p")
    data = bytearray(path.read_bytes())
    header = read_header(bytes(data), "x")
    data[header.entry_offset(8) + 1] ^= 0xFF  # damage segment 8 only
    fresh = FileStorage(store.root)  # no cached metadata
    path.write_bytes(bytes(data))
    assert fresh.get_segments("p", 2, 3) == segments[1:3]
    with pytest.raises(SnapshotCorruptError, match=f"{path}: .*8"):
        fresh.get_segments("p", 8, 8)
    fresh.close()


def test_metadata_cache_follows_the_file(store: FileStorage, snap: Snapshot) -> None:
    metadata, segments = snap
    store.create(metadata, segments, "c")
    assert store.get_metadata("c") == metadata
    other = build_snapshot([5, 6], [1, 2], [0, 0], max_time_step_ms=10, max_indexes_per_segment=1)
    store.delete("c")
    FileStorage(store.root).create(*other, "c")  # same id recreated by another writer
    assert store.get_metadata("c") == other[0]
    assert store.get_segments("c", 1, 9) == other[1]


# -- step hook (crash injection) -----------------------------------------------------------------


class _StepLog:
    """A step hook recording ``(step, what is on disk just before it)``."""

    def __init__(self) -> None:
        self.steps: list[str] = []
        self.storage: FileStorage | None = None
        self.seen: list[tuple[str, bool, bool]] = []

    def __call__(self, step: str) -> None:
        self.steps.append(step)
        storage = self.storage
        assert storage is not None
        # Raw filesystem looks only: the hook must not call back into the storage.
        obj = storage.object_path("k").exists()
        manifest = storage.manifest_path("orders").exists()
        self.seen.append((step, obj, manifest))


@pytest.fixture
def hooked(tmp_path: Path) -> Iterator[tuple[FileStorage, _StepLog]]:
    log = _StepLog()
    storage = FileStorage(tmp_path / "store", step_hook=log)
    log.storage = storage
    yield storage, log
    storage.close()


OBJECT_STEPS = ["object.write", "object.fsync", "object.link", "object.dirsync"]
MANIFEST_STEPS = [
    "manifest.write", "manifest.fsync", "manifest.history.write", "manifest.history.fsync",
    "manifest.rename", "manifest.history.rename", "manifest.dirsync",
]  # fmt: skip


def test_step_hook_sees_create_commit_delete_in_order(
    hooked: tuple[FileStorage, _StepLog], snap: Snapshot
) -> None:
    storage, log = hooked
    storage.create(*snap, "k")
    assert log.steps == OBJECT_STEPS
    # Each step is announced before it happens: the object gets its name at the link.
    assert [(s, obj) for s, obj, _ in log.seen] == [
        ("object.write", False),
        ("object.fsync", False),
        ("object.link", False),
        ("object.dirsync", True),
    ]
    log.steps.clear()
    log.seen.clear()
    storage.commit_manifest("orders", Manifest("orders"))
    assert log.steps == MANIFEST_STEPS
    # No manifest file until the rename; it exists when the directory is synced.
    assert [m for _, _, m in log.seen] == [False, False, False, False, False, True, True]
    log.steps.clear()
    log.seen.clear()
    storage.delete("k")
    assert [(s, obj) for s, obj, _ in log.seen] == [
        ("object.delete", True),
        ("object.delete.dirsync", False),
    ]


def test_reads_and_locks_are_not_steps(
    hooked: tuple[FileStorage, _StepLog], snap: Snapshot
) -> None:
    storage, log = hooked
    storage.create(*snap, "k")
    storage.commit_manifest("orders", Manifest("orders"))
    log.steps.clear()
    storage.get_metadata("k")
    storage.get_segments("k", 1, 3)
    storage.read_manifest("orders")
    storage.list_objects()
    storage.length("k")
    storage.delete("missing")  # deleting nothing still unlinks (a no-op) and syncs the dir
    with storage.lock("orders"):
        pass
    assert log.steps == ["object.delete", "object.delete.dirsync"]


def test_without_hard_links_the_hook_sees_the_rename(
    hooked: tuple[FileStorage, _StepLog], snap: Snapshot, monkeypatch: pytest.MonkeyPatch
) -> None:
    storage, log = hooked

    def no_links(src: Any, dst: Any) -> None:
        raise OSError(errno.EOPNOTSUPP, "Operation not supported")

    monkeypatch.setattr(os, "link", no_links)
    storage.create(*snap, "k")
    # The link is attempted (and refused) before the fallback rename.
    assert log.steps == ["object.write", "object.fsync", "object.link", "object.rename",
                         "object.dirsync"]  # fmt: skip


def test_an_oserror_from_the_hook_is_a_transient_failure(tmp_path: Path, snap: Snapshot) -> None:
    steps: list[str] = []
    failed: list[str] = []

    def flaky(step: str) -> None:
        steps.append(step)
        if step == "object.dirsync" and not failed:
            failed.append(step)
            raise OSError(errno.EIO, "injected")

    with FileStorage(tmp_path / "store", step_hook=flaky) as storage:
        storage.create(*snap, "k")
        # The second attempt finds its own object in place and only syncs the directory.
        assert steps == [*OBJECT_STEPS, "object.dirsync"]
        assert storage.stats()["create"] == {"calls": 1, "attempts": 2, "failures": 1, "gave_up": 0}
        assert storage.get_segments("k", 1, 100) == snap[1]
        assert os.listdir(storage.tmp_dir) == []


def test_a_crash_in_the_hook_leaves_nothing_half_written(tmp_path: Path, snap: Snapshot) -> None:
    """Dying before each step of a create, in a real child process: the reopened storage has
    either no object or the complete one, and no temp file."""
    script = textwrap.dedent(
        """
        import os, sys
        from delayindex.snapshot.format import build_snapshot
        from delayindex.storage import FileStorage
        import numpy as np

        def die(step):
            if step == sys.argv[2]:
                os._exit(77)

        metadata, segments = build_snapshot(
            np.arange(50), np.full(50, 3), np.arange(50),
            max_time_step_ms=10, max_indexes_per_segment=8,
        )
        FileStorage(sys.argv[1], step_hook=die).create(metadata, segments, "k")
        """
    )
    env = {**os.environ, "PYTHONPATH": SRC}
    for i, step in enumerate(OBJECT_STEPS):
        root = tmp_path / f"s{i}"
        done = subprocess.run(
            [sys.executable, "-c", script, str(root), step],
            env=env, capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
        assert done.returncode == 77, done.stderr
        assert os.listdir(root / "tmp") != [] or step == "object.dirsync"
        storage = FileStorage(root)  # removes the dead writer's temp file
        assert os.listdir(storage.tmp_dir) == []
        ids = [o.id for o in storage.list_objects()]
        assert ids == (["k"] if step == "object.dirsync" else [])
        if ids:
            assert storage.get_metadata("k").num_messages == 50
        storage.close()


def test_step_hook_must_be_callable(tmp_path: Path) -> None:
    with pytest.raises(TypeError, match="step_hook"):
        FileStorage(tmp_path / "store", step_hook="object.write")  # type: ignore[arg-type]
    assert not (tmp_path / "store").exists()  # refused before anything was created


# -- a directory that cannot be created or used ---------------------------------------------------


def test_path_under_a_regular_file_raises_storage_error(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    target = blocker / "store"
    with pytest.raises(StorageError, match="a-file/store") as info:
        FileStorage(target)
    assert isinstance(info.value.__cause__, NotADirectoryError)
    assert "directory" in str(info.value)


def test_path_that_is_a_regular_file_raises_storage_error(tmp_path: Path) -> None:
    target = tmp_path / "store"
    target.write_text("")
    with pytest.raises(StorageError, match="store") as info:
        FileStorage(target)
    assert isinstance(info.value.__cause__, OSError)


def test_permission_denied_raises_storage_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Tests run as root, which ignores directory permissions: make mkdir refuse instead.
    def refuse(path: Any, mode: int = 0o777, *args: Any, **kwargs: Any) -> None:
        raise PermissionError(13, "Permission denied", str(path))

    monkeypatch.setattr(os, "mkdir", refuse)
    target = tmp_path / "read-only" / "store"
    with pytest.raises(StorageError) as info:
        FileStorage(target)
    assert str(target) in str(info.value) and "Permission denied" in str(info.value)
    assert isinstance(info.value.__cause__, PermissionError)
    assert not target.exists()
