"""The per-name manifest: which snapshots are live, and which changes are half done.

A :class:`Manifest` is the single source of truth for one name (one tracker). It lists

* ``buckets``: the live :class:`BucketRecord` s, sorted by ``start_ledger``, ranges disjoint;
* ``intents``: pending two-phase operations (:class:`Intent`). A ``create`` intent is written
  *before* its object; a ``delete`` intent replaces a live record *before* its object is
  removed. Whatever a crash interrupts, every object the protocol ever wrote is referenced here;
* ``dead_letters``: delete intents that failed ``max_delete_attempts`` times; kept (never
  forgotten) so that an operator can see and retry them;
* ``quarantined``: :class:`QuarantineRecord` s of buckets whose snapshot was found damaged or
  missing. Such an object has left the live set but is never deleted by the library or by
  ``gc``: an ``active`` record still owns its ledger range (its positions wait for a repair or
  a release); a resolved one (released, repaired, acknowledged, cleared) only keeps the damaged
  object where the operator can see it;
* optionally ``mark_delete`` (the owner's acknowledged position) and ``writer_status`` (what the
  writer held only in memory at the commit, for ``delayindex inspect``);
* for a shared index, ``subscriptions``: each subscription's name and mark-delete position
  (:class:`SubscriptionRecord`, sorted by name);
* ``overrides``: the cancel and reschedule overrides still above the mark
  (:class:`~delayindex.storage._overrides.Overrides`). These, ``subscriptions`` and
  ``quarantined`` are left out of the bytes when empty, so manifests without them encode
  exactly as before they existed.

Invariants (checked whenever a Manifest is built, hence on every decode):

* every snapshot id matches :data:`KEY_PATTERN` and appears at most once across buckets,
  intents and dead letters;
* live bucket ranges and active quarantine ranges are disjoint (``start_ledger <= end_ledger``);
* a create intent's ``replaces`` are live buckets (the sources of a merge stay live until the
  merged bucket is); a delete intent replaces nothing.

Manifests are immutable: the ``with_*``/``without_*`` helpers return new ones. ``version`` is the
compare-and-swap counter a storage backend bumps on every commit (0: nothing stored yet).

Bytes (little-endian)::

    magic b"DIXM" | format u16 (1 or 2) | length u32 | checksum u32 | payload (length bytes)

Format 2 is format 1 with the cancelled positions of ``overrides`` packed (see
``storage._overrides``); it is written only for a manifest that carries overrides, so every
other manifest stays readable by a format-1 reader, and a format-1 manifest is still read.

``payload`` is UTF-8 JSON with sorted keys; ``checksum`` is mmh3 (seed :data:`CHECKSUM_SEED`) of
magic, version, length and payload. :func:`decode_manifest` raises
:class:`~delayindex.errors.SnapshotCorruptError` naming where the bytes came from for any
damage: bad magic or version, wrong length, checksum mismatch, bad JSON, bad types or a broken
invariant.
"""

from __future__ import annotations

import bisect
import dataclasses
import itertools
import json
import re
import struct
from dataclasses import dataclass, field, replace
from typing import Any, Literal

import mmh3

from delayindex.errors import SnapshotCorruptError
from delayindex.storage._overrides import Overrides

#: Snapshot ids, object keys and manifest/lock names: safe as file names, no path traversal.
KEY_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._~-]{0,199}")

MANIFEST_MAGIC = b"DIXM"
MANIFEST_FORMAT = 2  # the newest; written only when there are overrides (else 1)
_READABLE_FORMATS = (1, 2)
CHECKSUM_SEED = 0x4449584D
_HEAD = struct.Struct("<4sHI")  # magic, format, payload length
_CRC = struct.Struct("<I")  # checksum, then the payload
_FRAME_BYTES = _HEAD.size + _CRC.size
_MAX_LEDGER = 2**63 - 1

IntentKind = Literal["create", "delete"]
INTENT_KINDS: tuple[str, ...] = ("create", "delete")
#: States of a :class:`QuarantineRecord`: ``active`` (positions wait for repair or release),
#: then how it was resolved. Every state keeps the damaged object.
#: ``kept``: an object a manifest recovery could not adopt (it contradicts the live set).
QUARANTINE_STATES: tuple[str, ...] = (
    "active", "released", "repaired", "acknowledged", "cleared", "kept",
)  # fmt: skip
_MAX_REASON = 1000


def validate_key(key: object, what: str = "key") -> str:
    """Return ``key`` if it matches :data:`KEY_PATTERN`, else raise ValueError (TypeError)."""
    if not isinstance(key, str):
        raise TypeError(f"{what} must be a str, got {type(key).__name__}")
    if KEY_PATTERN.fullmatch(key) is None:
        raise ValueError(
            f"bad {what} {key!r}: must match {KEY_PATTERN.pattern} "
            "(1-200 chars of letters, digits, '.', '_', '~', '-', starting with a letter or digit)"
        )
    return key


def _check_int(value: object, what: str, low: int = 0, high: int = _MAX_LEDGER) -> None:
    if type(value) is not int:  # bool is an int subclass; reject it too
        raise TypeError(f"{what} must be an int, got {type(value).__name__}")
    if not low <= value <= high:
        raise ValueError(f"{what} {value} outside [{low}, {high}]")


def _check_mark(mark: object, what: str) -> None:
    if mark is None:
        return
    if not isinstance(mark, tuple) or len(mark) != 2:
        raise TypeError(f"{what} must be a (ledger_id, entry_id) tuple or None")
    _check_int(mark[0], f"{what} ledger_id")
    _check_int(mark[1], f"{what} entry_id", 0, 2**32 - 1)


def _check_range(start: int, end: int, what: str) -> None:
    _check_int(start, f"{what} start_ledger")
    _check_int(end, f"{what} end_ledger")
    if start > end:
        raise ValueError(f"{what}: start_ledger {start} > end_ledger {end}")


@dataclass(frozen=True)
class BucketRecord:
    """A live bucket: its ledger range and the snapshot that holds it."""

    start_ledger: int
    end_ledger: int
    snapshot_id: str
    num_messages: int
    num_segments: int
    snapshot_bytes: int
    #: Cancels a merge folded into the snapshot: if the object is ever found damaged, the
    #: index knows its range may hold cancels it can no longer read (absent from JSON if 0).
    folded_cancels: int = 0

    def __post_init__(self) -> None:
        _check_range(self.start_ledger, self.end_ledger, f"bucket {self.snapshot_id!r}")
        validate_key(self.snapshot_id, "snapshot id")
        _check_int(self.num_messages, "num_messages", 1)
        _check_int(self.num_segments, "num_segments", 1)
        _check_int(self.snapshot_bytes, "snapshot_bytes", 1)
        _check_int(self.folded_cancels, "folded_cancels")


@dataclass(frozen=True)
class Intent:
    """A pending step of the two-phase protocol.

    ``create``: the object ``snapshot_id`` may exist but is not live yet; ``replaces`` are the
    live buckets it will atomically supersede (a merge). ``delete``: the bucket is no longer live;
    its object may still exist. ``attempts``/``next_attempt_ms``/``last_error`` track failed
    deletes (retry with backoff, then dead letter).
    """

    kind: IntentKind
    snapshot_id: str
    start_ledger: int
    end_ledger: int
    replaces: tuple[str, ...] = ()
    attempts: int = 0
    next_attempt_ms: int = 0
    last_error: str = ""

    def __post_init__(self) -> None:
        if self.kind not in INTENT_KINDS:
            raise ValueError(f"unknown intent kind {self.kind!r}")
        validate_key(self.snapshot_id, "snapshot id")
        _check_range(self.start_ledger, self.end_ledger, f"intent {self.snapshot_id!r}")
        if not isinstance(self.replaces, tuple):
            raise TypeError("replaces must be a tuple")
        for source in self.replaces:
            validate_key(source, "replaced snapshot id")
        if len(set(self.replaces)) != len(self.replaces) or self.snapshot_id in self.replaces:
            raise ValueError(f"intent {self.snapshot_id!r}: repeated id in replaces")
        if self.kind == "delete" and self.replaces:
            raise ValueError(f"delete intent {self.snapshot_id!r} cannot replace buckets")
        _check_int(self.attempts, "attempts", 0, 2**31)
        _check_int(self.next_attempt_ms, "next_attempt_ms", 0)
        if not isinstance(self.last_error, str):
            raise TypeError("last_error must be a str")


@dataclass(frozen=True)
class QuarantineRecord:
    """A bucket whose snapshot was found damaged or missing (see the module docs).

    ``first_segment`` is the first segment whose positions were not all delivered when the
    damage was found (recovery restores the positions of that segment on, if the metadata is
    still readable); ``num_messages`` counts the positions whose delivery times were lost;
    ``found_ms`` is the writer's clock when it was quarantined.
    """

    snapshot_id: str
    start_ledger: int
    end_ledger: int
    num_messages: int
    first_segment: int
    reason: str
    found_ms: int
    state: str = "active"
    #: The bucket record's ``folded_cancels`` (absent from JSON if 0).
    folded_cancels: int = 0

    def __post_init__(self) -> None:
        validate_key(self.snapshot_id, "snapshot id")
        _check_range(self.start_ledger, self.end_ledger, f"quarantine {self.snapshot_id!r}")
        _check_int(self.num_messages, "num_messages")
        _check_int(self.first_segment, "first_segment", 1, 2**31)
        _check_int(self.found_ms, "found_ms")
        if not isinstance(self.reason, str) or len(self.reason) > _MAX_REASON:
            raise TypeError(f"reason must be a str of at most {_MAX_REASON} characters")
        if self.state not in QUARANTINE_STATES:
            raise ValueError(f"unknown quarantine state {self.state!r}")
        _check_int(self.folded_cancels, "folded_cancels")

    @property
    def active(self) -> bool:
        """Whether the bucket's positions still wait for a repair or a release."""
        return self.state == "active"


#: Longest subscription name a manifest stores.
MAX_SUBSCRIPTION_NAME = 256


@dataclass(frozen=True)
class SubscriptionRecord:
    """One subscription of a shared index and its mark-delete position (None: nothing
    acknowledged yet). The shared index persists these with its commits."""

    name: str
    mark_delete: tuple[int, int] | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not 0 < len(self.name) <= MAX_SUBSCRIPTION_NAME:
            raise TypeError(
                f"subscription name must be a non-empty str of at most "
                f"{MAX_SUBSCRIPTION_NAME} characters"
            )
        _check_mark(self.mark_delete, f"subscription {self.name!r} mark_delete")


@dataclass(frozen=True)
class WriterStatus:
    """What the name's writer held only in memory when it made a commit (shown by the CLI).

    ``unpersisted``: indexes not yet in a durable snapshot (mutable bucket, direct adds, buckets
    being written or kept in memory after a failed write); ``memory_mode_buckets``: sealed
    buckets whose snapshot write failed; ``as_of_ms``: the writer's clock at the commit.
    """

    unpersisted: int
    memory_mode_buckets: int
    as_of_ms: int

    def __post_init__(self) -> None:
        _check_int(self.unpersisted, "writer_status unpersisted")
        _check_int(self.memory_mode_buckets, "writer_status memory_mode_buckets")
        _check_int(self.as_of_ms, "writer_status as_of_ms")


@dataclass(frozen=True)
class Manifest:
    """One name's live buckets, pending intents and dead letters, at a commit ``version``."""

    name: str
    version: int = 0
    buckets: tuple[BucketRecord, ...] = ()
    intents: tuple[Intent, ...] = ()
    dead_letters: tuple[Intent, ...] = ()
    #: The owner's last acknowledged position ``(ledger, entry)``, persisted with its commits;
    #: positions at or below it are never delivered again, even after a reopen.
    mark_delete: tuple[int, int] | None = None
    #: The writer's in-memory state at this commit (informational; absent in older manifests).
    writer_status: WriterStatus | None = None
    #: Damaged buckets moved out of the live set (their objects are kept).
    quarantined: tuple[QuarantineRecord, ...] = ()
    #: A shared index's subscriptions, sorted by name (empty for a per-subscription index).
    subscriptions: tuple[SubscriptionRecord, ...] = ()
    #: Cancel and reschedule overrides still above the mark (see ``storage._overrides``).
    overrides: Overrides = field(default_factory=Overrides)
    _live: frozenset[str] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        validate_key(self.name, "manifest name")
        _check_mark(self.mark_delete, "mark_delete")
        if self.writer_status is not None and not isinstance(self.writer_status, WriterStatus):
            raise TypeError("writer_status must be a WriterStatus or None")
        if not isinstance(self.overrides, Overrides):
            raise TypeError("overrides must be an Overrides")
        _check_int(self.version, "version", 0)
        for what, items, cls in (
            ("buckets", self.buckets, BucketRecord),
            ("intents", self.intents, Intent),
            ("dead_letters", self.dead_letters, Intent),
            ("quarantined", self.quarantined, QuarantineRecord),
            ("subscriptions", self.subscriptions, SubscriptionRecord),
        ):
            if not isinstance(items, tuple) or not all(isinstance(x, cls) for x in items):
                raise TypeError(f"{what} must be a tuple of {cls.__name__}")
        names = [sub.name for sub in self.subscriptions]
        if names != sorted(set(names)):
            raise ValueError("subscriptions must be sorted by name, each name once")
        for previous, bucket in zip(self.buckets, self.buckets[1:], strict=False):
            if bucket.start_ledger <= previous.end_ledger:
                raise ValueError(
                    f"buckets {previous.snapshot_id!r} [{previous.start_ledger}, "
                    f"{previous.end_ledger}] and {bucket.snapshot_id!r} [{bucket.start_ledger}, "
                    f"{bucket.end_ledger}] overlap or are out of order"
                )
        owned = sorted(
            [(b.start_ledger, b.end_ledger, b.snapshot_id) for b in self.buckets]
            + [(q.start_ledger, q.end_ledger, q.snapshot_id) for q in self.quarantined if q.active]
        )
        for (_, end, a), (start, _, b) in itertools.pairwise(owned):
            if start <= end:
                raise ValueError(f"the ranges of {a!r} and {b!r} overlap")
        ids = [
            *(b.snapshot_id for b in self.buckets),
            *(i.snapshot_id for i in self.intents),
            *(d.snapshot_id for d in self.dead_letters),
            *(q.snapshot_id for q in self.quarantined),
        ]
        if len(set(ids)) != len(ids):
            raise ValueError("a snapshot id appears twice in the manifest")
        live = frozenset(b.snapshot_id for b in self.buckets)
        object.__setattr__(self, "_live", live)
        claimed: set[str] = set()
        for intent in self.intents:
            missing = set(intent.replaces) - live
            if missing:
                raise ValueError(
                    f"create intent {intent.snapshot_id!r} replaces non-live {sorted(missing)}"
                )
            if claimed & set(intent.replaces):
                raise ValueError("two create intents replace the same bucket")
            claimed.update(intent.replaces)
        for dead in self.dead_letters:
            if dead.kind != "delete":
                raise ValueError(f"dead letter {dead.snapshot_id!r} is not a delete intent")

    # -- queries ---------------------------------------------------------------------------------

    def bucket(self, snapshot_id: str) -> BucketRecord | None:
        """The live bucket stored in ``snapshot_id``, or None."""
        return next((b for b in self.buckets if b.snapshot_id == snapshot_id), None)

    def intent(self, snapshot_id: str) -> Intent | None:
        """The pending intent on ``snapshot_id``, or None."""
        return next((i for i in self.intents if i.snapshot_id == snapshot_id), None)

    def live_ids(self) -> frozenset[str]:
        """Snapshot ids of the live buckets."""
        return self._live

    def referenced_ids(self) -> frozenset[str]:
        """Every snapshot id the manifest mentions (live, pending, dead-lettered, quarantined).

        After a repair with working storage, every stored object of this name is in this set.
        """
        pending = {i.snapshot_id for i in (*self.intents, *self.dead_letters)}
        return self._live | pending | {q.snapshot_id for q in self.quarantined}

    def quarantine(self, snapshot_id: str) -> QuarantineRecord | None:
        """The quarantine record of ``snapshot_id`` (active or resolved), or None."""
        return next((q for q in self.quarantined if q.snapshot_id == snapshot_id), None)

    def overlapping(self, start_ledger: int, end_ledger: int) -> tuple[BucketRecord, ...]:
        """Live buckets whose range intersects ``[start_ledger, end_ledger]``."""
        return tuple(
            b for b in self.buckets if b.start_ledger <= end_ledger and start_ledger <= b.end_ledger
        )

    # -- edits (each returns a new Manifest; the version is left to the storage's commit) --------

    def with_bucket(self, record: BucketRecord) -> Manifest:
        """Add a live bucket (kept sorted by range; ``ValueError`` if it overlaps one)."""
        starts = [b.start_ledger for b in self.buckets]
        at = bisect.bisect_left(starts, record.start_ledger)
        return replace(self, buckets=(*self.buckets[:at], record, *self.buckets[at:]))

    def without_bucket(self, snapshot_id: str) -> Manifest:
        """Drop the live bucket ``snapshot_id`` (``KeyError`` if it is not live)."""
        if snapshot_id not in self._live:
            raise KeyError(snapshot_id)
        return replace(self, buckets=tuple(b for b in self.buckets if b.snapshot_id != snapshot_id))

    def with_intent(self, intent: Intent) -> Manifest:
        """Add a pending intent (``ValueError`` if its id is already mentioned)."""
        return replace(self, intents=(*self.intents, intent))

    def without_intent(self, snapshot_id: str) -> Manifest:
        """Drop the pending intent on ``snapshot_id`` (``KeyError`` if there is none)."""
        if self.intent(snapshot_id) is None:
            raise KeyError(snapshot_id)
        return replace(self, intents=tuple(i for i in self.intents if i.snapshot_id != snapshot_id))

    def with_updated_intent(self, intent: Intent) -> Manifest:
        """Replace the pending intent with the same snapshot id, keeping its position."""
        if self.intent(intent.snapshot_id) is None:
            raise KeyError(intent.snapshot_id)
        return replace(
            self,
            intents=tuple(
                intent if i.snapshot_id == intent.snapshot_id else i for i in self.intents
            ),
        )

    def with_quarantined(self, record: QuarantineRecord) -> Manifest:
        """Move the live bucket ``record.snapshot_id`` to the quarantine as ``record``."""
        moved = self.without_bucket(record.snapshot_id)
        return replace(moved, quarantined=(*moved.quarantined, record))

    def with_quarantine_state(self, snapshot_id: str, state: str) -> Manifest:
        """Set the state of the quarantine record of ``snapshot_id`` (``KeyError`` if none)."""
        record = self.quarantine(snapshot_id)
        if record is None:
            raise KeyError(snapshot_id)
        updated = replace(record, state=state)
        return replace(
            self,
            quarantined=tuple(
                updated if q.snapshot_id == snapshot_id else q for q in self.quarantined
            ),
        )

    def with_dead_letter(self, intent: Intent) -> Manifest:
        """Move the pending intent on ``intent.snapshot_id`` to the dead letters as ``intent``."""
        moved = self.without_intent(intent.snapshot_id)
        return replace(moved, dead_letters=(*moved.dead_letters, intent))


# -- bytes ---------------------------------------------------------------------------------------


def _record_json(record: BucketRecord) -> dict[str, Any]:
    return {
        "start_ledger": record.start_ledger,
        "end_ledger": record.end_ledger,
        "snapshot_id": record.snapshot_id,
        "num_messages": record.num_messages,
        "num_segments": record.num_segments,
        "snapshot_bytes": record.snapshot_bytes,
    } | ({"folded_cancels": record.folded_cancels} if record.folded_cancels else {})


def _quarantine_json(record: QuarantineRecord) -> dict[str, Any]:
    document = dataclasses.asdict(record)
    if not record.folded_cancels:  # absent: older manifests stay byte-identical
        del document["folded_cancels"]
    return document


def _intent_json(intent: Intent) -> dict[str, Any]:
    return {
        "kind": intent.kind,
        "snapshot_id": intent.snapshot_id,
        "start_ledger": intent.start_ledger,
        "end_ledger": intent.end_ledger,
        "replaces": list(intent.replaces),
        "attempts": intent.attempts,
        "next_attempt_ms": intent.next_attempt_ms,
        "last_error": intent.last_error,
    }


def encode_manifest(manifest: Manifest) -> bytes:
    """The framed, checksummed bytes of ``manifest`` (deterministic: JSON with sorted keys)."""
    document = {
        "name": manifest.name,
        "version": manifest.version,
        "buckets": [_record_json(b) for b in manifest.buckets],
        "intents": [_intent_json(i) for i in manifest.intents],
        "dead_letters": [_intent_json(d) for d in manifest.dead_letters],
    }
    if manifest.mark_delete is not None:  # absent otherwise: older manifests stay byte-identical
        document["mark_delete"] = list(manifest.mark_delete)
    if manifest.writer_status is not None:  # likewise
        document["writer_status"] = dataclasses.asdict(manifest.writer_status)
    if manifest.quarantined:  # likewise
        document["quarantined"] = [_quarantine_json(q) for q in manifest.quarantined]
    if manifest.subscriptions:  # likewise
        document["subscriptions"] = [
            {"name": sub.name, "mark_delete": None if sub.mark_delete is None
             else list(sub.mark_delete)}
            for sub in manifest.subscriptions
        ]  # fmt: skip
    if manifest.overrides:  # likewise
        document["overrides"] = manifest.overrides.to_json()
    payload = json.dumps(document, sort_keys=True, separators=(",", ":")).encode()
    fmt = MANIFEST_FORMAT if manifest.overrides else 1
    head = _HEAD.pack(MANIFEST_MAGIC, fmt, len(payload))
    return head + _CRC.pack(mmh3.hash(head + payload, CHECKSUM_SEED, signed=False)) + payload


def _fields(
    obj: object, keys: frozenset[str], what: str, optional: frozenset[str] = frozenset()
) -> dict[str, Any]:
    if not isinstance(obj, dict) or not keys - optional <= set(obj) <= keys:
        raise ValueError(f"{what} must be an object with exactly the keys {sorted(keys)}")
    return obj


#: Keys written only when they are not 0.
_FOLDED = frozenset(("folded_cancels",))


_RECORD_KEYS = frozenset(
    (
        "start_ledger",
        "end_ledger",
        "snapshot_id",
        "num_messages",
        "num_segments",
        "snapshot_bytes",
        "folded_cancels",
    )
)
_INTENT_KEYS = frozenset(
    (
        "kind",
        "snapshot_id",
        "start_ledger",
        "end_ledger",
        "replaces",
        "attempts",
        "next_attempt_ms",
        "last_error",
    )
)
_STATUS_KEYS = frozenset(("unpersisted", "memory_mode_buckets", "as_of_ms"))
_QUARANTINE_KEYS = frozenset(f.name for f in dataclasses.fields(QuarantineRecord))
_MANIFEST_KEYS = frozenset(("name", "version", "buckets", "intents", "dead_letters"))


def _list(obj: object, what: str) -> list[Any]:
    if not isinstance(obj, list):
        raise TypeError(f"{what} must be a list")
    return obj


def _subscription_from(obj: object) -> SubscriptionRecord:
    f = _fields(obj, frozenset(("name", "mark_delete")), "subscription")
    mark = f["mark_delete"]
    if mark is not None:
        mark = _list(mark, "subscription mark_delete")
        if len(mark) != 2:
            raise ValueError("a subscription's mark_delete must be [ledger_id, entry_id]")
        mark = (mark[0], mark[1])
    return SubscriptionRecord(f["name"], mark)


def _intent_from(obj: object) -> Intent:
    f = _fields(obj, _INTENT_KEYS, "intent")
    return Intent(
        kind=f["kind"],
        snapshot_id=f["snapshot_id"],
        start_ledger=f["start_ledger"],
        end_ledger=f["end_ledger"],
        replaces=tuple(_list(f["replaces"], "replaces")),
        attempts=f["attempts"],
        next_attempt_ms=f["next_attempt_ms"],
        last_error=f["last_error"],
    )


def decode_manifest(data: bytes, where: str) -> Manifest:
    """Verify and decode manifest bytes; damage raises SnapshotCorruptError naming ``where``."""
    data = bytes(data)
    if len(data) < _FRAME_BYTES:
        raise SnapshotCorruptError(f"{where}: truncated manifest ({len(data)} bytes)")
    magic, fmt, length = _HEAD.unpack_from(data)
    (stored,) = _CRC.unpack_from(data, _HEAD.size)
    if magic != MANIFEST_MAGIC:
        raise SnapshotCorruptError(f"{where}: bad magic {magic!r} (not a delayindex manifest)")
    if fmt not in _READABLE_FORMATS:
        raise SnapshotCorruptError(f"{where}: unsupported manifest format {fmt}")
    if len(data) != _FRAME_BYTES + length:
        raise SnapshotCorruptError(
            f"{where}: manifest is {len(data)} bytes, its header says {_FRAME_BYTES + length}"
        )
    payload = data[_FRAME_BYTES:]
    if mmh3.hash(data[: _HEAD.size] + payload, CHECKSUM_SEED, signed=False) != stored:
        raise SnapshotCorruptError(f"{where}: manifest checksum mismatch")
    try:
        document = json.loads(payload)
        mark = None
        status = None
        if isinstance(document, dict) and "mark_delete" in document:
            document = dict(document)
            mark = _list(document.pop("mark_delete"), "mark_delete")
            if len(mark) != 2:
                raise ValueError("mark_delete must be [ledger_id, entry_id]")
        if isinstance(document, dict) and "writer_status" in document:
            document = dict(document)
            status = WriterStatus(**_fields(document.pop("writer_status"), _STATUS_KEYS, "status"))
        quarantined: tuple[QuarantineRecord, ...] = ()
        if isinstance(document, dict) and "quarantined" in document:
            document = dict(document)
            quarantined = tuple(
                QuarantineRecord(**_fields(q, _QUARANTINE_KEYS, "quarantine record", _FOLDED))
                for q in _list(document.pop("quarantined"), "quarantined")
            )
        subscriptions: tuple[SubscriptionRecord, ...] = ()
        if isinstance(document, dict) and "subscriptions" in document:
            document = dict(document)
            subscriptions = tuple(
                _subscription_from(sub)
                for sub in _list(document.pop("subscriptions"), "subscriptions")
            )
        overrides = Overrides()
        if isinstance(document, dict) and "overrides" in document:
            document = dict(document)
            overrides = Overrides.from_json(document.pop("overrides"), packed=fmt == 2)
        f = _fields(document, _MANIFEST_KEYS, "manifest")
        buckets = []
        for obj in _list(f["buckets"], "buckets"):
            r = _fields(obj, _RECORD_KEYS, "bucket", _FOLDED)
            buckets.append(
                BucketRecord(
                    start_ledger=r["start_ledger"],
                    end_ledger=r["end_ledger"],
                    snapshot_id=r["snapshot_id"],
                    num_messages=r["num_messages"],
                    num_segments=r["num_segments"],
                    snapshot_bytes=r["snapshot_bytes"],
                    folded_cancels=r.get("folded_cancels", 0),
                )
            )
        return Manifest(
            name=f["name"],
            version=f["version"],
            buckets=tuple(buckets),
            intents=tuple(_intent_from(i) for i in _list(f["intents"], "intents")),
            dead_letters=tuple(_intent_from(d) for d in _list(f["dead_letters"], "dead_letters")),
            mark_delete=None if mark is None else (mark[0], mark[1]),
            writer_status=status,
            quarantined=quarantined,
            subscriptions=subscriptions,
            overrides=overrides,
        )
    except (ValueError, TypeError) as exc:  # json.JSONDecodeError and UnicodeDecodeError included
        raise SnapshotCorruptError(f"{where}: invalid manifest: {exc}") from None
