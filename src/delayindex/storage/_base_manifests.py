"""The manifest half of :class:`~delayindex.storage.base.BaseStorage`: compare-and-swap and
history generations.

``commit_manifest`` is a compare-and-swap under the backend's per-name guard
(``_raw_manifest_guard``): it stores version ``v + 1`` only if the stored version is ``v``, and
the backend replaces the current manifest atomically (``_raw_write_manifest``).

Manifest history: every commit also stores an independent copy of the new manifest as history
generation ``version`` (its own bytes, written with the same crash-safe protocol, never a link to
the current file), and prunes the copy :data:`MANIFEST_HISTORY` generations older, so the newest
:data:`MANIFEST_HISTORY` generations survive a damaged or deleted current manifest.
:meth:`ManifestsMixin.read_manifest` never mistakes a deleted manifest for a new name: when the
current manifest is missing but history exists it raises
:class:`~delayindex.errors.SnapshotCorruptError`. :meth:`ManifestsMixin.manifest_history`,
:meth:`ManifestsMixin.read_manifest_generation` and :meth:`ManifestsMixin.restore_manifest` are
what ``Catalog.open``'s recovery, ``delayindex gc`` and ``delayindex fsck`` use.

Invariants: versions only grow (a restore must be above every history generation); a damaged
stored manifest is never overwritten by a commit (only ``restore_manifest`` replaces it); a
reader sees the old manifest or the new one, never a mixture; pruning is best effort and never
fails a commit.
"""

from __future__ import annotations

from dataclasses import replace

from delayindex.errors import ManifestConflictError, SnapshotCorruptError, SnapshotNotFoundError
from delayindex.storage._base_raw import RawStorage, _check_int
from delayindex.storage.manifest import Manifest, decode_manifest, encode_manifest, validate_key

#: Manifest generations kept as independent history copies (the current one's copy included).
MANIFEST_HISTORY = 3


class ManifestsMixin(RawStorage):
    """Per-name manifests over the raw primitives: compare-and-swap, history, restore."""

    def list_manifests(self) -> list[str]:
        """See :meth:`SnapshotStorage.list_manifests`."""
        return sorted(self._retry("list_manifests", "*", lambda _: self._raw_list_manifests()))

    def _decode_stored_manifest(self, name: str) -> Manifest:
        data, where = self._raw_read_manifest(name)
        if data is None:
            history = sorted(self._raw_manifest_history(name), reverse=True)
            if history:
                # A deleted manifest is not a new name: its history proves it existed.
                raise SnapshotCorruptError(
                    f"{where}: manifest of {name!r} is missing, but history generation(s) "
                    f"{history} exist"
                )
            return Manifest(name)
        manifest = decode_manifest(data, where)
        if manifest.name != name:
            raise SnapshotCorruptError(f"{where}: holds the manifest of {manifest.name!r}")
        return manifest

    def _decode_generation(self, name: str, version: int) -> Manifest:
        data, where = self._raw_read_manifest_history(name, version)
        if data is None:
            raise SnapshotNotFoundError(f"history generation {version} of {name!r} not found")
        manifest = decode_manifest(data, where)
        if manifest.name != name or manifest.version != version:
            raise SnapshotCorruptError(
                f"{where}: holds version {manifest.version} of {manifest.name!r}, "
                f"expected version {version} of {name!r}"
            )
        return manifest

    def manifest_history(self, name: str) -> list[int]:
        """The versions of ``name``'s stored history generations, newest first (the newest is
        normally a copy of the current manifest)."""
        validate_key(name, "manifest name")
        versions = self._retry("read_manifest", name, lambda _: self._raw_manifest_history(name))
        return sorted(versions, reverse=True)

    def read_manifest_generation(self, name: str, version: int) -> Manifest:
        """History generation ``version`` of ``name``.

        Raises:
            SnapshotNotFoundError: no such generation. SnapshotCorruptError: it is damaged.
            StorageError.
        """
        validate_key(name, "manifest name")
        _check_int(version, "version")
        return self._retry(
            "read_manifest", f"{name}@{version}", lambda _: self._decode_generation(name, version)
        )

    def restore_manifest(self, name: str, manifest: Manifest) -> Manifest:
        """Store ``manifest`` (as is, version included) as ``name``'s current manifest, in place
        of a missing or damaged one: what ``Catalog.open`` commits after a recovery.

        Its version must be newer than every history generation, so versions keep growing; the
        history is pruned to the newest :data:`MANIFEST_HISTORY` generations afterwards.

        Raises:
            ValueError: bad name, a name mismatch, or a version not above the history's.
            ManifestConflictError: the current manifest is readable (nothing to restore).
            StorageError.
        """
        validate_key(name, "manifest name")
        if not isinstance(manifest, Manifest):
            raise TypeError(f"manifest must be a Manifest, got {type(manifest).__name__}")
        if manifest.name != name:
            raise ValueError(f"manifest of {manifest.name!r} restored under {name!r}")
        data = encode_manifest(manifest)

        def attempt(n: int) -> Manifest:
            with self._raw_manifest_guard(name):
                try:
                    current = self._decode_stored_manifest(name)
                except SnapshotCorruptError:
                    current = None
                if current is not None:
                    if n > 1 and current == manifest:
                        return manifest  # an earlier attempt landed; its reply was lost
                    if current.version != 0:
                        raise ManifestConflictError(
                            f"manifest {name!r} is readable (version {current.version}); "
                            "nothing to restore"
                        )
                newest = max(self._raw_manifest_history(name), default=0)
                if manifest.version <= newest and not (n > 1 and newest == manifest.version):
                    raise ValueError(
                        f"restored version {manifest.version} of {name!r} is not above its "
                        f"newest history generation {newest}"
                    )
                self._raw_write_manifest(name, data, manifest.version)
            return manifest

        restored = self._retry("commit_manifest", name, attempt)
        self._prune_history(name, restored.version, everything=True)
        return restored

    def _prune_history(self, name: str, version: int, *, everything: bool = False) -> None:
        """Drop history generations older than the newest :data:`MANIFEST_HISTORY` (best effort:
        a copy left behind is harmless, the next commit or restore prunes it)."""
        try:
            if everything:
                floor = version - MANIFEST_HISTORY
                old = [v for v in self._raw_manifest_history(name) if v <= floor]
            else:
                old = [version - MANIFEST_HISTORY] if version > MANIFEST_HISTORY else []
            for stale in old:
                self._raw_delete_manifest_history(name, stale)
        except OSError:
            pass

    def read_manifest(self, name: str) -> Manifest:
        """See :meth:`SnapshotStorage.read_manifest`."""
        validate_key(name, "manifest name")
        return self._retry("read_manifest", name, lambda _: self._decode_stored_manifest(name))

    def commit_manifest(self, name: str, manifest: Manifest) -> Manifest:
        """See :meth:`SnapshotStorage.commit_manifest`."""
        validate_key(name, "manifest name")
        if not isinstance(manifest, Manifest):
            raise TypeError(f"manifest must be a Manifest, got {type(manifest).__name__}")
        if manifest.name != name:
            raise ValueError(f"manifest of {manifest.name!r} committed under {name!r}")
        desired = replace(manifest, version=manifest.version + 1)
        data = encode_manifest(desired)

        def attempt(n: int) -> Manifest:
            with self._raw_manifest_guard(name):
                current = self._decode_stored_manifest(name)
                if current.version != manifest.version:
                    if n > 1 and current == desired:
                        return desired  # an earlier attempt committed; its reply was lost
                    raise ManifestConflictError(
                        f"manifest {name!r} is at version {current.version}; the commit "
                        f"expected version {manifest.version}"
                    )
                self._raw_write_manifest(name, data, desired.version)
            return desired

        committed = self._retry("commit_manifest", name, attempt)
        self._prune_history(name, committed.version)
        return committed
