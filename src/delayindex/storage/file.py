"""The embedded default storage: snapshots and manifests as files in one local directory.

Directory layout (``FileStorage(path)`` creates what is missing)::

    <path>/
      objects/<id>.dixs          one immutable snapshot object per id (codec layout)
      manifests/<name>.manifest  the manifest of each name (manifest framing)
      manifests/<name>.manifest.<version>
                                 history: independent copies of the newest generations
      locks/<name>.lock          writer lock of a name (flock; holds the holder's pid, for messages)
      locks/<name>.cas           short lock that serializes one manifest compare-and-swap
      tmp/<pid>-<uuid>.tmp       files being written; never read

Write protocol (objects and manifests): write the bytes to a new file in ``tmp/``, ``fsync`` it,
move it into place atomically, then ``fsync`` the target directory so the new name is durable.
A manifest commit writes two temp files, the new manifest and its history copy (separate files
with their own bytes: a bit flip in one never damages the other), renames the manifest, then the
copy, and syncs ``manifests/`` once for both; the copy ``MANIFEST_HISTORY`` (3) generations
older is then unlinked (not synced: a resurrected old copy is harmless).
Objects move with ``os.link`` (fails if the id exists, so an object is never overwritten; the
temp name is then unlinked); filesystems without hard links fall back to an existence check and
``os.replace``. Manifests move with ``os.replace`` (readers see the old file or the new one).
A crash leaves at worst a file in ``tmp/``: readers ignore ``tmp/``, and opening the storage
deletes temp files whose writer process is gone.

Reads open the object, ``fstat`` it, ``pread`` the fixed header prefix and the entry table, then
only the entries needed (metadata comes from a small LRU cache keyed by inode, size and mtime).
A file whose size differs from what its header announces, or whose bytes fail a check, raises
:class:`~delayindex.errors.SnapshotCorruptError` naming the file path.

Locks: ``lock(name)`` takes ``fcntl.flock(LOCK_EX | LOCK_NB)`` on ``locks/<name>.lock``; a second
holder, in this process or another, gets :class:`~delayindex.errors.StoreLockedError` naming the
name, the lock file and the holder's pid. The kernel drops the lock when the holder dies. Lock
files are never deleted (deleting a lock file races with its next holder).

Retries: ``OSError`` s from these system calls are transient and retried (see ``base``), except
``FileNotFoundError`` on an object, which means "not found".

Step hook: ``FileStorage(path, step_hook=hook)`` calls ``hook(step)`` just *before* each durable
filesystem step, so a test can kill the process (or raise) at every point where a crash leaves a
different state on disk. The step names are stable:

==========================  =============================================================
``object.write``            the object's temp file was created, nothing written yet
``object.fsync``            the temp file is written, not yet fsync'ed
``object.link``             the temp file is durable; ``os.link`` to its final name next
``object.rename``           (no hard links) ``os.replace`` to the final name next
``object.dirsync``          the object has its name; ``objects/`` is fsync'ed next
``object.delete``           ``unlink`` of an object next
``object.delete.dirsync``   the object is unlinked; ``objects/`` is fsync'ed next
``manifest.write``          the new manifest's temp file was created, nothing written yet
``manifest.fsync``          the manifest temp file is written, not yet fsync'ed
``manifest.history.write``  the history copy's own temp file was created, nothing written
``manifest.history.fsync``  the history copy is written, not yet fsync'ed
``manifest.rename``         ``os.replace`` over ``manifests/<name>.manifest`` next
``manifest.history.rename`` ``os.replace`` to ``manifests/<name>.manifest.<version>`` next
``manifest.dirsync``        both have their names; ``manifests/`` is fsync'ed next
``manifest.history.prune``  ``unlink`` of the history copy that fell out of the window next
==========================  =============================================================

Removing a temp file is not a step (temp files are garbage whatever happens), nor are reads,
locks and the directory setup of the constructor. The hook runs once per attempt, inside the
storage call and possibly while the caller holds its own locks, so it must not call back into
the storage or its user. An ``OSError`` it raises counts as a transient failure of the attempt
(retried); any other exception propagates unchanged.
"""

from __future__ import annotations

import errno
import fcntl
import os
import uuid
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, suppress
from pathlib import Path

from delayindex.errors import (
    SnapshotExistsError,
    SnapshotNotFoundError,
    StorageError,
    StoreLockedError,
)
from delayindex.storage.base import BaseStorage, ObjectInfo, ObjectSource
from delayindex.storage.manifest import KEY_PATTERN

OBJECT_SUFFIX = ".dixs"
MANIFEST_SUFFIX = ".manifest"
LOCK_SUFFIX = ".lock"
CAS_SUFFIX = ".cas"
TMP_SUFFIX = ".tmp"
#: errnos of ``os.link`` meaning "this filesystem has no hard links".
_NO_HARDLINKS = frozenset({errno.EPERM, errno.EOPNOTSUPP, errno.ENOTSUP, errno.ENOSYS})


#: FileStorage's default read-ahead: a realistic segment batch is about 8 KB on disk, so this
#: holds the next batch of hundreds of buckets.
DEFAULT_READAHEAD_BYTES = 4 * 1024 * 1024


def _pid_alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # EPERM: it exists but belongs to someone else
        return True
    return True


def _unlink_quiet(path: Path) -> None:
    with suppress(FileNotFoundError):
        os.unlink(path)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class FileStorage(BaseStorage):
    """A :class:`~delayindex.storage.base.SnapshotStorage` on a local directory (layout above).

    Several processes may share one directory: objects are immutable and unique, manifest
    commits are serialized by a per-name flock, and writers of a name exclude each other with
    :meth:`lock`.

    Args:
        path: the root directory (created with its subdirectories if missing).
        metadata_cache_size: decoded metadata kept (LRU); 0 disables the cache.
        readahead_bytes: segment bytes a background thread may hold after reading them ahead
            of a tracker's :meth:`prefetch_segments` hints (a DelayIndex hints a bucket's next
            batch once it comes due within a minute and is not due yet); 0 turns read-ahead
            off.
        clean_tmp: delete the temp files of dead writers now (listed in
            ``removed_temp_files``); False leaves ``tmp/`` alone, for read-only tools.
        step_hook: called with a step name before every durable filesystem step (the table in
            the module docs); a test seam for crash injection.

    Raises:
        StorageError: the directory cannot be created or used (chained to the OSError).
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        metadata_cache_size: int = 128,
        readahead_bytes: int = DEFAULT_READAHEAD_BYTES,
        clean_tmp: bool = True,
        step_hook: Callable[[str], None] | None = None,
    ) -> None:
        super().__init__(metadata_cache_size=metadata_cache_size, readahead_bytes=readahead_bytes)
        if step_hook is not None and not callable(step_hook):
            raise TypeError("step_hook must be a callable taking a step name")
        self.step_hook = step_hook
        self.root = Path(path)
        self.objects_dir = self.root / "objects"
        self.manifests_dir = self.root / "manifests"
        self.locks_dir = self.root / "locks"
        self.tmp_dir = self.root / "tmp"
        try:
            created = False
            for directory in (self.objects_dir, self.manifests_dir, self.locks_dir, self.tmp_dir):
                if not directory.is_dir():
                    directory.mkdir(parents=True, exist_ok=True)
                    created = True
            if created:
                _fsync_dir(self.root)
            self.removed_temp_files = self.remove_stale_temp_files() if clean_tmp else []
        except OSError as exc:
            raise StorageError(
                f"cannot use {str(self.root)!r} as a FileStorage directory "
                f"({type(exc).__name__}: {exc.strerror or exc}): pass a directory path whose "
                "parents are directories and that this process may create and write"
            ) from exc

    def __repr__(self) -> str:
        return f"FileStorage({str(self.root)!r})"

    # -- paths -------------------------------------------------------------------------------

    def object_path(self, snapshot_id: str) -> Path:
        """Where object ``snapshot_id`` lives (the id must already be validated)."""
        return self.objects_dir / f"{snapshot_id}{OBJECT_SUFFIX}"

    def manifest_path(self, name: str) -> Path:
        """Where the manifest of ``name`` lives."""
        return self.manifests_dir / f"{name}{MANIFEST_SUFFIX}"

    def manifest_history_path(self, name: str, version: int) -> Path:
        """Where history generation ``version`` of ``name``'s manifest lives."""
        return self.manifests_dir / f"{name}{MANIFEST_SUFFIX}.{version}"

    def lock_path(self, name: str) -> Path:
        """The writer-lock file of ``name``."""
        return self.locks_dir / f"{name}{LOCK_SUFFIX}"

    # -- helpers ------------------------------------------------------------------------------

    def stale_temp_files(self) -> list[str]:
        """Names of the files in ``tmp/`` whose writer process no longer runs, sorted."""
        stale = []
        for entry in os.scandir(self.tmp_dir):
            if not entry.is_file(follow_symlinks=False):
                continue
            pid_text = entry.name.split("-", 1)[0]
            if entry.name.endswith(TMP_SUFFIX) and pid_text.isdigit() and _pid_alive(int(pid_text)):
                continue
            stale.append(entry.name)
        return sorted(stale)

    def remove_stale_temp_files(self) -> list[str]:
        """Delete the temp files left by writers that no longer run; return their names."""
        stale = self.stale_temp_files()
        for name in stale:
            _unlink_quiet(self.tmp_dir / name)
        return stale

    def _step(self, step: str) -> None:
        """Announce the durable filesystem step about to happen to the step hook, if any."""
        if self.step_hook is not None:
            self.step_hook(step)

    def _write_temp(self, data: bytes, kind: str) -> Path:
        """A durable temp file holding ``data`` (written, fsync'ed and closed).

        ``kind`` (``"object"`` or ``"manifest"``) prefixes the step names.
        """
        path = self.tmp_dir / f"{os.getpid()}-{uuid.uuid4().hex}{TMP_SUFFIX}"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
        try:
            self._step(f"{kind}.write")
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            self._step(f"{kind}.fsync")
            os.fsync(fd)
        except BaseException:
            os.close(fd)
            _unlink_quiet(path)
            raise
        os.close(fd)
        return path

    @staticmethod
    def _read_all(path: Path) -> bytes:
        with open(path, "rb") as f:
            return f.read()

    def _check_existing(self, key: str, path: Path, data: bytes, may_exist: bool) -> None:
        if may_exist and self._read_all(path) == data:
            return
        raise SnapshotExistsError(f"snapshot {key!r} already exists: {path}")

    # -- raw primitives ----------------------------------------------------------------------

    def _raw_put(self, key: str, data: bytes, *, may_exist: bool) -> None:
        final = self.object_path(key)
        if os.path.lexists(final):
            self._check_existing(key, final, data, may_exist)
        else:
            tmp = self._write_temp(data, "object")
            try:
                self._step("object.link")
                os.link(tmp, final)
            except FileExistsError:
                self._check_existing(key, final, data, may_exist)
            except OSError as exc:
                if exc.errno not in _NO_HARDLINKS:
                    raise
                # No hard links here: check, then rename. Keys are unique per writer and a
                # name's writer holds its lock, so nobody races us for this id.
                if os.path.lexists(final):
                    self._check_existing(key, final, data, may_exist)
                else:
                    self._step("object.rename")
                    os.replace(tmp, final)
            finally:
                _unlink_quiet(tmp)
        # Also when the object already existed: the earlier attempt may have failed right here.
        self._step("object.dirsync")
        _fsync_dir(self.objects_dir)

    @contextmanager
    def _open(self, key: str) -> Iterator[ObjectSource]:
        path = self.object_path(key)
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            raise SnapshotNotFoundError(f"snapshot {key!r} not found: {path}") from None
        try:
            st = os.fstat(fd)

            def read(offset: int, length: int) -> bytes:
                first = os.pread(fd, length, offset)
                if len(first) == length or not first:  # whole, or at the end of the file
                    return first
                chunks, got = [first], len(first)
                while got < length:
                    chunk = os.pread(fd, length - got, offset + got)
                    if not chunk:
                        break
                    chunks.append(chunk)
                    got += len(chunk)
                return b"".join(chunks)

            fingerprint = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
            yield ObjectSource(key, str(path), st.st_size, fingerprint, read)
        finally:
            os.close(fd)

    def _raw_source(self, key: str) -> AbstractContextManager[ObjectSource]:
        return self._open(key)

    def _raw_size(self, key: str) -> int:
        path = self.object_path(key)
        try:
            return os.stat(path).st_size
        except FileNotFoundError:
            raise SnapshotNotFoundError(f"snapshot {key!r} not found: {path}") from None

    def _raw_delete(self, key: str) -> None:
        self._step("object.delete")
        _unlink_quiet(self.object_path(key))
        self._step("object.delete.dirsync")
        _fsync_dir(self.objects_dir)

    def _raw_list(self) -> list[ObjectInfo]:
        out = []
        for entry in os.scandir(self.objects_dir):
            key = entry.name[: -len(OBJECT_SUFFIX)]
            if not entry.name.endswith(OBJECT_SUFFIX) or KEY_PATTERN.fullmatch(key) is None:
                continue
            try:
                if not entry.is_file(follow_symlinks=False):
                    continue
                st = entry.stat(follow_symlinks=False)
            except FileNotFoundError:  # deleted while we listed
                continue
            out.append(ObjectInfo(key, st.st_size, st.st_mtime_ns // 1_000_000))
        return out

    def _manifest_files(self) -> Iterator[tuple[str, int | None]]:
        """``(name, None)`` per current manifest file, ``(name, version)`` per history copy."""
        for entry in os.scandir(self.manifests_dir):
            stem, _, tail = entry.name.rpartition(".")
            version: int | None = None
            if tail.isdigit() and tail.isascii() and stem.endswith(MANIFEST_SUFFIX):
                version = int(tail)
            else:
                stem = entry.name
            if not stem.endswith(MANIFEST_SUFFIX):
                continue
            name = stem[: -len(MANIFEST_SUFFIX)]
            if KEY_PATTERN.fullmatch(name) is None:
                continue
            try:
                if entry.is_file():  # as read_manifest sees it (a symlink to a file counts)
                    yield name, version
            except OSError:
                continue

    def _raw_list_manifests(self) -> list[str]:
        return sorted({name for name, _ in self._manifest_files()})

    def _raw_manifest_history(self, name: str) -> list[int]:
        prefix = f"{name}{MANIFEST_SUFFIX}."
        out = []
        for entry in os.scandir(self.manifests_dir):
            tail = entry.name[len(prefix) :]
            if entry.name.startswith(prefix) and tail.isdigit() and tail.isascii():
                out.append(int(tail))
        return out

    def _raw_read_manifest_history(self, name: str, version: int) -> tuple[bytes | None, str]:
        path = self.manifest_history_path(name, version)
        try:
            return self._read_all(path), str(path)
        except FileNotFoundError:
            return None, str(path)

    def _raw_delete_manifest_history(self, name: str, version: int) -> None:
        self._step("manifest.history.prune")
        _unlink_quiet(self.manifest_history_path(name, version))

    def _raw_read_manifest(self, name: str) -> tuple[bytes | None, str]:
        path = self.manifest_path(name)
        try:
            return self._read_all(path), str(path)
        except FileNotFoundError:
            return None, str(path)

    @contextmanager
    def _cas(self, name: str) -> Iterator[None]:
        fd = os.open(self.locks_dir / f"{name}{CAS_SUFFIX}", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # closing the only descriptor releases the flock

    def _raw_manifest_guard(self, name: str) -> AbstractContextManager[object]:
        return self._cas(name)

    def _raw_write_manifest(self, name: str, data: bytes, version: int) -> None:
        tmp = self._write_temp(data, "manifest")
        copy: Path | None = None
        try:
            # The history copy is a file of its own (never a hard link to the same inode), so
            # damage to one of them leaves the other readable.
            copy = self._write_temp(data, "manifest.history")
            self._step("manifest.rename")
            os.replace(tmp, self.manifest_path(name))
            self._step("manifest.history.rename")
            os.replace(copy, self.manifest_history_path(name, version))
        finally:
            _unlink_quiet(tmp)
            if copy is not None:
                _unlink_quiet(copy)
        self._step("manifest.dirsync")
        _fsync_dir(self.manifests_dir)

    def _raw_lock(self, name: str) -> tuple[str, Callable[[], None]]:
        path = self.lock_path(name)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip()
            os.close(fd)
            by = f" (held by pid {holder})" if holder.isdigit() else ""
            raise StoreLockedError(
                f"{name!r} is locked by another writer{by}: lock file {path}"
            ) from None
        except BaseException:
            os.close(fd)
            raise
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        except OSError:  # the pid is only for messages; the flock is what counts
            pass

        def release() -> None:
            os.close(fd)  # drops the flock

        return str(path), release
