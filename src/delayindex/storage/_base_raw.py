"""The retry layer of :class:`~delayindex.storage.base.BaseStorage`: raw primitives, retries,
statistics.

A backend provides a handful of raw primitives (``_raw_put``, ``_raw_source``, ``_raw_delete``,
...); each is *one attempt* of an operation and signals a transient failure by raising
``OSError``. :class:`RawStorage` declares them and runs every operation through
:meth:`RawStorage._retry`, which counts it in the per-operation statistics and calls the
``_fault_point`` test seam before and after the effect of each attempt.

Retries (Pulsar's ``executeWithRetry``): every raw I/O call runs up to :data:`MAX_ATTEMPTS` times
in all, immediately, while it raises ``OSError`` (transient I/O). Nothing else is retried:
``SnapshotNotFoundError``, ``SnapshotCorruptError``, ``ManifestConflictError``,
``StoreLockedError`` and ``SnapshotExistsError`` are answers, not accidents, and any other
exception is a bug that must surface unchanged. After the last failed attempt the call raises
:class:`~delayindex.errors.StorageError` naming the operation and the id, chained to the last
error. A retry must not turn a success whose acknowledgement was lost into a failure, so from the
second attempt on ``create`` accepts an existing object with identical bytes and
``commit_manifest`` accepts a stored manifest equal to the one it is committing (the callers in
``_base_objects`` and ``_base_manifests`` pass the attempt number down for that).

Invariants: no call runs on a closed storage; the counters of :data:`STAT_FIELDS` are only
changed under ``_state_lock``, once per call, so concurrent calls never lose a count.
"""

from __future__ import annotations

import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Hashable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import NamedTuple, TypeVar

from delayindex.errors import StorageError

#: Attempts per I/O operation, first try included (Pulsar: 1 + 3 retries, no backoff).
MAX_ATTEMPTS = 4
#: Operation names, as keys of :meth:`SnapshotStorage.stats`.
OPS: tuple[str, ...] = (
    "create",
    "get_metadata",
    "get_segments",
    "length",
    "delete",
    "list_objects",
    "list_manifests",
    "read_manifest",
    "commit_manifest",
    "lock",
)
#: Counters kept per operation: calls made, attempts run, attempts that raised, and calls that
#: raised ``StorageError`` because every attempt failed.
STAT_FIELDS: tuple[str, ...] = ("calls", "attempts", "failures", "gave_up")

T = TypeVar("T")


class ObjectInfo(NamedTuple):
    """One stored snapshot object, as :meth:`SnapshotStorage.list_objects` reports it."""

    id: str
    size: int
    mtime_ms: int


@dataclass(frozen=True)
class ObjectSource:
    """Random access to one stored object during one read attempt (raw-primitive result)."""

    key: str
    where: str
    size: int
    fingerprint: Hashable
    read: Callable[[int, int], bytes]  # (offset, length) -> bytes; short only at end of object


def run_with_retries(
    op: str, target: str, attempt: Callable[[int], T], counters: dict[str, int] | None = None
) -> T:
    """Run ``attempt(n)`` for n = 1..MAX_ATTEMPTS while it raises ``OSError``.

    Any other exception propagates at once. ``counters`` (if given) is updated in place with
    the keys of :data:`STAT_FIELDS`. After the last failure raises ``StorageError`` naming
    ``op`` and ``target``, chained to the last ``OSError``.
    """
    stats = counters if counters is not None else dict.fromkeys(STAT_FIELDS, 0)
    stats["calls"] += 1
    last: OSError | None = None
    for n in range(1, MAX_ATTEMPTS + 1):
        stats["attempts"] += 1
        try:
            return attempt(n)
        except OSError as exc:
            stats["failures"] += 1
            last = exc
        except BaseException:
            stats["failures"] += 1
            raise
    stats["gave_up"] += 1
    raise StorageError(
        f"{op} of {target!r} failed after {MAX_ATTEMPTS} attempts: {last!r}"
    ) from last


def _check_int(value: object, what: str) -> int:
    if type(value) is not int:
        raise TypeError(f"{what} must be an int, got {type(value).__name__}")
    return value


class RawStorage(ABC):
    """The raw primitives a backend implements, and the retry loop every operation runs in.

    Subclasses implement the ``_raw_*`` primitives; each is one attempt of an operation and
    signals transient failure by raising ``OSError``. ``_fault_point`` is a test seam that
    :class:`~delayindex.storage.memory.MemoryStorage` uses for fault injection.
    """

    def __init__(self) -> None:
        self._stats: dict[str, dict[str, int]] = {op: dict.fromkeys(STAT_FIELDS, 0) for op in OPS}
        self._state_lock = threading.Lock()  # guards stats, cache, held locks, closed
        self._closed = False

    # -- raw primitives (one attempt each; OSError = transient) ----------------------------------

    @abstractmethod
    def _raw_put(self, key: str, data: bytes, *, may_exist: bool) -> None:
        """Store ``data`` as object ``key`` atomically; never overwrite.

        If ``key`` exists: return quietly when ``may_exist`` and its bytes equal ``data`` (an
        earlier attempt of this call wrote it), else raise ``SnapshotExistsError``.
        """

    @abstractmethod
    def _raw_source(self, key: str) -> AbstractContextManager[ObjectSource]:
        """Open object ``key`` for reading (``SnapshotNotFoundError`` if missing)."""

    @abstractmethod
    def _raw_size(self, key: str) -> int:
        """Size of object ``key`` in bytes (``SnapshotNotFoundError`` if missing)."""

    @abstractmethod
    def _raw_delete(self, key: str) -> None:
        """Remove object ``key``; a missing object is success."""

    @abstractmethod
    def _raw_list(self) -> list[ObjectInfo]:
        """Every stored object."""

    @abstractmethod
    def _raw_list_manifests(self) -> list[str]:
        """The names that have a stored manifest or manifest history (any order; only names
        matching KEY_PATTERN)."""

    @abstractmethod
    def _raw_read_manifest(self, name: str) -> tuple[bytes | None, str]:
        """The stored manifest bytes of ``name`` (None if absent) and where they live."""

    @abstractmethod
    def _raw_manifest_history(self, name: str) -> list[int]:
        """The versions of ``name``'s stored history copies (any order)."""

    @abstractmethod
    def _raw_read_manifest_history(self, name: str, version: int) -> tuple[bytes | None, str]:
        """The bytes of history generation ``version`` of ``name`` (None if absent), and where."""

    @abstractmethod
    def _raw_delete_manifest_history(self, name: str, version: int) -> None:
        """Remove history generation ``version`` of ``name``; a missing one is success."""

    @abstractmethod
    def _raw_manifest_guard(self, name: str) -> AbstractContextManager[object]:
        """Mutual exclusion for one compare-and-swap of ``name``'s manifest (all writers)."""

    @abstractmethod
    def _raw_write_manifest(self, name: str, data: bytes, version: int) -> None:
        """Atomically replace ``name``'s manifest with ``data``, and store an independent copy
        of ``data`` as history generation ``version`` (replacing any copy of that version).

        The current manifest is replaced first, then the copy gets its name, so a crash in
        between never leaves history newer than the current manifest."""

    @abstractmethod
    def _raw_lock(self, name: str) -> tuple[str, Callable[[], None]]:
        """Take ``name``'s writer lock or raise ``StoreLockedError``; return (where, release)."""

    def _raw_close(self) -> None:  # noqa: B027 - optional hook
        """Free backend resources (locks are already released)."""

    def _fault_point(self, op: str, phase: str, attempt: int) -> None:  # noqa: B027 - optional hook
        """Called before (``"before"``) and after (``"after"``) the effect of every attempt;
        ``attempt`` is 1 for a call's first attempt (so a hook can tell calls apart)."""

    # -- shared machinery -------------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise ValueError(f"{self!r} is closed")

    def _retry(self, op: str, target: str, attempt: Callable[[int], T]) -> T:
        self._check_open()

        def one(n: int) -> T:
            self._fault_point(op, "before", n)
            result = attempt(n)
            self._fault_point(op, "after", n)
            return result

        counters = dict.fromkeys(STAT_FIELDS, 0)
        try:
            return run_with_retries(op, target, one, counters)
        finally:
            with self._state_lock:
                for key, value in counters.items():
                    self._stats[op][key] += value

    def stats(self) -> dict[str, dict[str, int]]:
        """See :meth:`SnapshotStorage.stats`."""
        with self._state_lock:
            return {op: dict(counters) for op, counters in self._stats.items()}
