"""In-process snapshot storage that keeps *encoded bytes*, with fault injection for tests.

:class:`MemoryStorage` stores exactly what :class:`~delayindex.storage.file.FileStorage` would
write: each object is the codec's byte string (``encode_snapshot``) and each manifest is
``encode_manifest`` output, so every read goes through the same header, checksum and decode path
(``BaseStorage``) and every test exercises the codecs. Nothing survives the process.

Fault injection: :meth:`MemoryStorage.inject_failure` queues failures per operation; each raw
attempt of that operation consumes one (retries therefore consume them too: three failures and
the fourth attempt succeeds, four failures exhaust the retries). ``after=True`` makes the attempt
take effect first and then raise, a lost acknowledgement, which exercises the idempotent-retry
paths. Test helpers :meth:`raw_object`/:meth:`put_raw_object` (and the manifest twins, plus
:meth:`delete_raw_manifest` and the history's :meth:`raw_manifest_history`/
:meth:`put_raw_manifest_history`) read and plant bytes directly, to corrupt objects or create
orphans; :meth:`break_locks` forgets every held lock, as the death of the holding process
would.

Random faults (:meth:`MemoryStorage.set_fault_rate`) model a flaky store for soak tests. They
are drawn *per call*, not per attempt: at a call's first attempt a seeded ``random.Random``
decides whether the call fails (probability ``rate``) and how, and a failing call fails on every
one of its attempts, so the caller sees ``StorageError`` (a per-attempt rate would almost never
survive the retries). For the operations that change something (:data:`AFTER_EFFECT_OPS`) a share
of the failures let each attempt take effect first and then raise: the caller is told "failed"
although the object was written or deleted or the manifest committed. The decision is kept in a
thread-local per operation, which is sound because a thread runs one call of an operation at a
time (retries are sequential and no storage call nests another of the same operation). With a
seed and a deterministic sequence of calls (one thread) the faults are reproducible. Injected
queued failures (``inject_failure``) take precedence over random ones at each attempt.

Thread safety: one lock guards all state (including the random generator and the fault
counters); decoding happens outside it on immutable ``bytes``.
"""

from __future__ import annotations

import errno
import math
import numbers
import random
import threading
from collections.abc import Callable, Iterable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass

from delayindex.clock import wall_clock_ms
from delayindex.errors import SnapshotExistsError, SnapshotNotFoundError, StoreLockedError
from delayindex.storage.base import OPS, BaseStorage, ObjectInfo, ObjectSource
from delayindex.storage.manifest import validate_key

#: Operations that :meth:`MemoryStorage.inject_failure` accepts, and the raw operations each
#: covers ("manifest" is both reading and committing a manifest).
INJECTABLE_OPS: dict[str, tuple[str, ...]] = {
    "create": ("create",),
    "get_metadata": ("get_metadata",),
    "get_segments": ("get_segments",),
    "delete": ("delete",),
    "manifest": ("read_manifest", "commit_manifest"),
}
#: Operations whose random failures may take effect before raising (a lost acknowledgement).
#: Reads have no effect to lose, and a lock taken by a call that reports failure would be held
#: by nobody until :meth:`MemoryStorage.break_locks`, so those always fail before their effect.
AFTER_EFFECT_OPS: frozenset[str] = frozenset({"create", "delete", "commit_manifest"})
#: The phases of a random failure, as keys of :meth:`MemoryStorage.fault_counts`.
FAULT_PHASES: tuple[str, ...] = ("before", "after")


class InjectedIOError(OSError):
    """The default injected failure: a transient I/O error (retried like any ``OSError``)."""


@dataclass
class _Fault:
    remaining: int
    error: BaseException | None
    after: bool


@dataclass(frozen=True)
class _RandomFaults:
    rate: float
    ops: frozenset[str]
    after_share: float
    rng: random.Random


@dataclass
class _CallFault:
    """The random decision for one call: fail ``"before"``/``"after"`` its effect, or None."""

    phase: str | None
    counted: bool = False


def _fraction(value: object, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{what} must be a real number in [0, 1], got {type(value).__name__}")
    out = float(value)
    if not (math.isfinite(out) and 0.0 <= out <= 1.0):
        raise ValueError(f"{what} must be in [0, 1], got {value!r}")
    return out


def _op_set(ops: Iterable[str] | None) -> frozenset[str]:
    if ops is None:
        return frozenset(OPS)
    if isinstance(ops, str):  # an iterable of one-letter "ops": surely a mistake
        raise TypeError(f"ops must be an iterable of operation names, not the str {ops!r}")
    try:
        names = list(ops)
    except TypeError:
        raise TypeError(f"ops must be an iterable of operation names, got {ops!r}") from None
    for name in names:
        if not isinstance(name, str) or name not in OPS:
            raise ValueError(f"unknown op {name!r}; expected some of {list(OPS)}")
    if not names:
        raise ValueError("ops is empty; to turn random faults off use rate=0")
    return frozenset(names)


@dataclass(frozen=True)
class _Stored:
    data: bytes
    mtime_ms: int
    generation: int


class MemoryStorage(BaseStorage):
    """A :class:`~delayindex.storage.base.SnapshotStorage` held in a dict of encoded bytes.

    Args:
        clock: epoch-ms clock for ``ObjectInfo.mtime_ms`` (default: the wall clock).
        metadata_cache_size: decoded metadata kept (LRU); 0 disables the cache.
    """

    def __init__(
        self, *, clock: Callable[[], int] | None = None, metadata_cache_size: int = 128
    ) -> None:
        super().__init__(metadata_cache_size=metadata_cache_size)
        self._clock = clock or wall_clock_ms
        self._lock = threading.Lock()
        self._objects: dict[str, _Stored] = {}
        self._manifests: dict[str, bytes] = {}
        self._history: dict[str, dict[int, bytes]] = {}  # name -> version -> bytes
        self._cas_lock = threading.Lock()
        self._locked: dict[str, int] = {}  # name -> token of the current holder
        self._lock_tokens = 0
        self._faults: dict[str, list[_Fault]] = {op: [] for op in INJECTABLE_OPS}
        self._generation = 0
        self._injected = 0
        self._random: _RandomFaults | None = None
        self._fault_counts = {op: dict.fromkeys(FAULT_PHASES, 0) for op in OPS}
        self._calls = threading.local()  # .faults: op -> _CallFault of this thread's call

    def __repr__(self) -> str:
        return f"MemoryStorage(objects={len(self._objects)}, manifests={len(self._manifests)})"

    # -- fault injection and test helpers --------------------------------------------------------

    def inject_failure(
        self, op: str, error: BaseException | None = None, times: int = 1, *, after: bool = False
    ) -> None:
        """Make the next ``times`` raw attempts of ``op`` raise ``error``.

        Args:
            op: one of ``"create"``, ``"get_metadata"``, ``"get_segments"``, ``"delete"``,
                ``"manifest"`` (reading and committing manifests).
            error: the exception to raise; default a fresh :class:`InjectedIOError` each time.
                ``OSError`` s are retried; anything else propagates unchanged at once.
            times: how many attempts fail (>= 1); queued after earlier injections of ``op``.
            after: let the attempt take effect before raising (a lost acknowledgement).
        """
        if op not in INJECTABLE_OPS:
            raise ValueError(f"unknown op {op!r}; expected one of {sorted(INJECTABLE_OPS)}")
        if type(times) is not int or times < 1:
            raise ValueError(f"times must be an int >= 1, got {times!r}")
        with self._lock:
            self._faults[op].append(_Fault(times, error, after))

    def pending_failures(self, op: str) -> int:
        """How many injected failures of ``op`` are still queued."""
        with self._lock:
            return sum(f.remaining for f in self._faults[op])

    def clear_faults(self) -> None:
        """The storage works again: drop every queued failure and stop random ones."""
        with self._lock:
            for queue in self._faults.values():
                queue.clear()
            self._random = None

    def set_fault_rate(
        self,
        rate: float,
        *,
        seed: int | None = None,
        ops: Iterable[str] | None = None,
        after_share: float = 0.5,
    ) -> None:
        """Make each call of the chosen operations fail with probability ``rate``.

        A call chosen to fail fails on every attempt, so it raises ``StorageError`` after its
        retries (see the module docstring). Replaces any earlier setting; the counters of
        :meth:`fault_counts` keep counting. Arguments are all checked before anything changes.

        Args:
            rate: probability in ``[0, 1]`` that a call fails; 0 turns random faults off.
            seed: seed of the ``random.Random`` that draws the faults (None: unseeded).
            ops: operation names (keys of :meth:`stats`) to fail; None means all of them.
            after_share: share in ``[0, 1]`` of the failures of :data:`AFTER_EFFECT_OPS` that
                take effect before raising (lost acknowledgements); other ops ignore it.

        Raises:
            TypeError: a number is not a real number, ``seed`` is not an int or None, or
                ``ops`` is a str or not iterable.
            ValueError: ``rate`` or ``after_share`` is outside ``[0, 1]`` (or NaN), or ``ops``
                is empty or names an unknown operation.
        """
        chosen_rate = _fraction(rate, "rate")
        share = _fraction(after_share, "after_share")
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
            raise TypeError(f"seed must be an int or None, got {type(seed).__name__}")
        names = _op_set(ops)
        settings = None
        if chosen_rate > 0.0:
            settings = _RandomFaults(chosen_rate, names, share, random.Random(seed))
        with self._lock:
            self._random = settings

    @property
    def fault_rate(self) -> float:
        """The current random failure rate per call (0.0 when random faults are off)."""
        with self._lock:
            return 0.0 if self._random is None else self._random.rate

    def fault_counts(self) -> dict[str, dict[str, int]]:
        """Calls failed by random faults: ``{op: {"before": n, "after": n}}`` for every op.

        ``"after"`` counts calls whose effect happened although they reported failure. Queued
        failures of :meth:`inject_failure` are not counted here.
        """
        with self._lock:
            return {op: dict(counts) for op, counts in self._fault_counts.items()}

    def _fault_point(self, op: str, phase: str, attempt: int) -> None:
        if attempt == 1 and phase == "before":
            self._draw_call_fault(op)
        self._queued_fault_point(op, phase)
        faults: dict[str, _CallFault] | None = getattr(self._calls, "faults", None)
        call = faults.get(op) if faults is not None else None
        if call is None or call.phase != phase:
            return
        if not call.counted:  # once per call, not per attempt
            call.counted = True
            with self._lock:
                self._fault_counts[op][phase] += 1
        raise InjectedIOError(errno.EIO, f"random failure of {op} ({phase}, attempt {attempt})")

    def _draw_call_fault(self, op: str) -> None:
        """Decide at a call's first attempt whether (and how) the whole call fails."""
        phase: str | None = None
        with self._lock:
            settings = self._random
            if (
                settings is not None
                and op in settings.ops
                and settings.rng.random() < settings.rate
            ):
                phase = "before"
                if op in AFTER_EFFECT_OPS and settings.rng.random() < settings.after_share:
                    phase = "after"
        faults: dict[str, _CallFault] | None = getattr(self._calls, "faults", None)
        if faults is None:
            faults = self._calls.faults = {}
        faults[op] = _CallFault(phase)

    def _queued_fault_point(self, op: str, phase: str) -> None:
        key = next((k for k, ops in INJECTABLE_OPS.items() if op in ops), None)
        if key is None:
            return
        with self._lock:
            queue = self._faults[key]
            if not queue or queue[0].after != (phase == "after"):
                return
            fault = queue[0]
            fault.remaining -= 1
            if fault.remaining == 0:
                queue.pop(0)
            self._injected += 1
            count = self._injected
        if fault.error is None:
            raise InjectedIOError(errno.EIO, f"injected failure #{count} of {op} ({phase})")
        raise fault.error.with_traceback(None)

    def raw_object(self, snapshot_id: str) -> bytes:
        """The stored bytes of an object (``SnapshotNotFoundError`` if missing)."""
        with self._lock:
            stored = self._objects.get(snapshot_id)
        if stored is None:
            raise SnapshotNotFoundError(f"snapshot {snapshot_id!r} not found (memory)")
        return stored.data

    def put_raw_object(self, snapshot_id: str, data: bytes) -> None:
        """Store (or overwrite) arbitrary bytes as an object: plants corrupt or orphan objects."""
        validate_key(snapshot_id, "snapshot id")
        with self._lock:
            self._generation += 1
            self._objects[snapshot_id] = _Stored(bytes(data), self._clock(), self._generation)

    def raw_manifest(self, name: str) -> bytes | None:
        """The stored manifest bytes of ``name`` (None if none)."""
        with self._lock:
            return self._manifests.get(name)

    def put_raw_manifest(self, name: str, data: bytes) -> None:
        """Store arbitrary bytes as ``name``'s manifest (to test damaged manifests)."""
        validate_key(name, "manifest name")
        with self._lock:
            self._manifests[name] = bytes(data)

    def delete_raw_manifest(self, name: str) -> None:
        """Remove ``name``'s current manifest (its history stays), as an operator's mistake
        would."""
        with self._lock:
            self._manifests.pop(name, None)

    def raw_manifest_history(self, name: str) -> dict[int, bytes]:
        """The stored history copies of ``name``: ``{version: bytes}``."""
        with self._lock:
            return dict(self._history.get(name, {}))

    def put_raw_manifest_history(self, name: str, version: int, data: bytes | None) -> None:
        """Store arbitrary bytes as history generation ``version`` of ``name`` (None removes
        it), to test damaged or missing history."""
        validate_key(name, "manifest name")
        with self._lock:
            versions = self._history.setdefault(name, {})
            if data is None:
                versions.pop(version, None)
            else:
                versions[version] = bytes(data)
            if not versions:
                del self._history[name]

    def break_locks(self) -> None:
        """Forget every held writer lock, as the death of the holding process would."""
        with self._lock:
            self._locked.clear()

    # -- raw primitives ----------------------------------------------------------------------

    def _raw_put(self, key: str, data: bytes, *, may_exist: bool) -> None:
        with self._lock:
            existing = self._objects.get(key)
            if existing is not None:
                if may_exist and existing.data == data:
                    return
                raise SnapshotExistsError(f"snapshot {key!r} already exists (memory)")
            self._generation += 1
            self._objects[key] = _Stored(data, self._clock(), self._generation)

    @contextmanager
    def _open(self, key: str) -> Iterator[ObjectSource]:
        with self._lock:
            stored = self._objects.get(key)
        if stored is None:
            raise SnapshotNotFoundError(f"snapshot {key!r} not found (memory)")
        data = stored.data

        def read(offset: int, length: int) -> bytes:
            return data[offset : offset + length]

        yield ObjectSource(key, f"memory:objects/{key}", len(data), stored.generation, read)

    def _raw_source(self, key: str) -> AbstractContextManager[ObjectSource]:
        return self._open(key)

    def _raw_size(self, key: str) -> int:
        return len(self.raw_object(key))

    def _raw_delete(self, key: str) -> None:
        with self._lock:
            self._objects.pop(key, None)

    def _raw_list(self) -> list[ObjectInfo]:
        with self._lock:
            return [ObjectInfo(k, len(v.data), v.mtime_ms) for k, v in self._objects.items()]

    def _raw_list_manifests(self) -> list[str]:
        with self._lock:
            return list(self._manifests.keys() | self._history.keys())

    def _raw_manifest_history(self, name: str) -> list[int]:
        with self._lock:
            return list(self._history.get(name, ()))

    def _raw_read_manifest_history(self, name: str, version: int) -> tuple[bytes | None, str]:
        with self._lock:
            data = self._history.get(name, {}).get(version)
        return data, f"memory:manifests/{name}.manifest.{version}"

    def _raw_delete_manifest_history(self, name: str, version: int) -> None:
        with self._lock:
            versions = self._history.get(name)
            if versions is not None:
                versions.pop(version, None)
                if not versions:
                    del self._history[name]

    def _raw_read_manifest(self, name: str) -> tuple[bytes | None, str]:
        with self._lock:
            return self._manifests.get(name), f"memory:manifests/{name}"

    def _raw_manifest_guard(self, name: str) -> AbstractContextManager[object]:
        # Reads and writes take self._lock separately; this second lock serializes whole
        # compare-and-swaps so that two committers cannot interleave their read and write.
        return self._cas_lock

    def _raw_write_manifest(self, name: str, data: bytes, version: int) -> None:
        with self._lock:
            self._manifests[name] = data
            # bytes are immutable: sharing the object is an independent copy in every sense
            # that matters here (put_raw_* replaces, never mutates, stored bytes).
            self._history.setdefault(name, {})[version] = data

    def _raw_lock(self, name: str) -> tuple[str, Callable[[], None]]:
        where = f"memory:locks/{name}"
        with self._lock:
            if name in self._locked:
                raise StoreLockedError(
                    f"{name!r} is locked by another writer of this MemoryStorage ({where})"
                )
            self._lock_tokens += 1
            token = self._locked[name] = self._lock_tokens

        def release() -> None:
            with self._lock:
                if self._locked.get(name) == token:  # not broken and re-taken meanwhile
                    del self._locked[name]

        return where, release
