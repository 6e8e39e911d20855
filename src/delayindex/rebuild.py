"""Offline rebuild of an index from a topic dump, and verification of a store against a dump.

A *dump* is the topic's messages as columns (``ledger_ids``, ``entry_ids``, ``deliver_at``;
:class:`delayindex.dump.DumpColumns`, or anything with those int64 attributes, such as a
:class:`delayindex.workload.Workload`). Not delayed is ``deliver_at < 0``.

How a rebuild works (pure functions, no Spark; the Spark job calls the same ones per partition):

1. :func:`tracked_mask` keeps what :meth:`DelayIndex.add` at ``now_ms`` would track: delayed,
   not due (``deliver_at > cutoff``; cutoff = ``now_ms + tick_ms``, or ``now_ms`` when
   ``config.strict``) and, when a mark-delete position is given, after it (a dispatcher reads
   the topic from its cursor's mark-delete position on).
2. :func:`plan_buckets` turns per-ledger tracked counts into bucket ranges with the online
   tracker's sealing rule (``BucketCore.add``): in ledger order, the first tracked add of a
   strictly newer ledger seals the mutable bucket once it holds ``min_index_count_per_bucket``
   indexes. Adds that are not tracked (not delayed, due, acknowledged) neither count nor seal,
   and a ledger with no tracked message belongs to no bucket. A rebuild persists everything, so
   the last bucket is sealed too. If ``max_num_buckets > 0`` and there are more buckets, adjacent
   ones are merged with the online selection
   (:func:`~delayindex.policy.select_merge_window`) until the count fits.
3. :func:`build_bucket` sorts and cuts one bucket's indexes exactly as the online tracker's
   ``_build`` does (``build_snapshot`` with the config's segment limits).
4. :func:`rebuild_local` writes with the catalog's two-phase bulk create: one commit reserves a
   create intent per range, each object is written under its reserved key, and one commit makes
   them all live, turns every previously live bucket of the name into a delete intent and records
   the mark-delete position. A crash before the publish leaves create intents that the next
   :meth:`Catalog.open` rolls back (no orphan, old buckets untouched); a failure is rolled back
   at once. A re-run yields the same ranges and snapshot contents (only the random keys differ).

So, for a dump in position order, a rebuild equals online ingestion at ``now_ms`` with merging
off, followed by one add in a newer ledger that seals the last bucket.

:func:`verify_store` checks a store against a dump: every expected position in exactly one live
bucket with the same deliver time, no extra position (positions at or below the manifest's
mark-delete position are ignored: a reopen never delivers them), every snapshot fully decoded
with good checksums, the manifest consistent with its objects and free of pending intents, and
the store's orphans (objects no manifest references, older than a grace period) listed. Each
finding has a kind from :data:`FINDING_KINDS`. It reads only (no lock): run it on a quiet store.

Invariants: the functions here never change the dump's arrays; a rebuild changes the store only
through the catalog, so at every instant each object it wrote is referenced by the manifest;
bad input raises ``ValueError``/``TypeError`` before the store is touched.
"""

from __future__ import annotations

import itertools
import json
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

from delayindex._ints import INT64_MAX as _INT64_MAX
from delayindex._ints import INT64_MIN, as_int, int64_array
from delayindex.clock import wall_clock_ms
from delayindex.config import TrackerConfig
from delayindex.dump import is_position_sorted
from delayindex.errors import (
    ManifestConflictError,
    SnapshotCorruptError,
    SnapshotNotFoundError,
    StorageError,
)
from delayindex.garbage import find_garbage
from delayindex.model import MAX_ENTRY_ID, MAX_LEDGER_ID
from delayindex.policy import cutoff_ms, plan_ranges
from delayindex.snapshot.format import PreparedSegments, SnapshotMetadata, build_snapshot
from delayindex.storage.base import SnapshotStorage
from delayindex.storage.catalog import Catalog
from delayindex.storage.manifest import BucketRecord, Manifest, validate_key

__all__ = [
    "DEFAULT_ORPHAN_GRACE_MS",
    "FINDING_KINDS",
    "Classification",
    "Finding",
    "PositionColumns",
    "Progress",
    "RebuildReport",
    "VerifyReport",
    "abort_rebuild",
    "build_bucket",
    "check_arguments",
    "classify",
    "cutoff_for",
    "plan_buckets",
    "publish_rebuild",
    "rebuild_local",
    "tracked_mask",
    "verify_store",
    "write_bucket",
]

Int64Array = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]
#: ``progress(phase, done, total)``; :func:`rebuild_local` reports phase ``"buckets"``.
Progress = Callable[[str, int, int], None]
#: Kinds of :class:`Finding`, in the order reports list them.
FINDING_KINDS: tuple[str, ...] = (
    "missing_snapshot",
    "corrupt_snapshot",
    "manifest_mismatch",
    "missing_position",
    "extra_position",
    "wrong_deliver_time",
    "orphan",
)
#: Unreferenced objects younger than this are not orphans (a writer may be about to reference
#: them); the same default as ``delayindex gc --grace``.
DEFAULT_ORPHAN_GRACE_MS = 600_000
#: Examples kept per finding.
MAX_EXAMPLES = 10


class PositionColumns(Protocol):
    """What the rebuild reads of a dump: equal-length int64 columns, one row per message."""

    @property
    def ledger_ids(self) -> Int64Array:
        """Ledger id of each message."""
        ...

    @property
    def entry_ids(self) -> Int64Array:
        """Entry id of each message."""
        ...

    @property
    def deliver_at(self) -> Int64Array:
        """Deliver time (epoch ms) of each message; negative: not delayed."""
        ...


# -- input checks -----------------------------------------------------------------------------


def _int(value: object, what: str, low: int = INT64_MIN, high: int = _INT64_MAX) -> int:
    return as_int(what, value, low, high)


def _mark(mark_delete: object) -> tuple[int, int] | None:
    if mark_delete is None:
        return None
    if not isinstance(mark_delete, tuple | list) or len(mark_delete) != 2:
        raise TypeError(f"mark_delete must be (ledger_id, entry_id) or None, got {mark_delete!r}")
    return (
        _int(mark_delete[0], "mark_delete ledger_id", 0, MAX_LEDGER_ID),
        _int(mark_delete[1], "mark_delete entry_id", 0, MAX_ENTRY_ID),
    )


def _config(config: object) -> TrackerConfig:
    if not isinstance(config, TrackerConfig):
        raise TypeError(f"config must be a TrackerConfig, got {type(config).__name__}")
    return config


def check_arguments(
    name: str, config: object, now_ms: object, mark_delete: object
) -> tuple[TrackerConfig, int, tuple[int, int] | None]:
    """Check the arguments every rebuild and verify takes; return config, ``now_ms``, mark.

    Raises:
        ValueError: a bad index name, ``now_ms`` beyond int64, an id of the mark out of range.
        TypeError: config not a TrackerConfig, ``now_ms`` or an id not an int, a mark that is
            not a ``(ledger_id, entry_id)`` pair.
    """
    validate_key(name, "index name")
    return _config(config), _int(now_ms, "now_ms"), _mark(mark_delete)


def _array(values: object, what: str) -> Int64Array:
    return int64_array(values, what)  # strict: floats raise, never truncate


def _columns(columns: PositionColumns) -> tuple[Int64Array, Int64Array, Int64Array]:
    """The three columns as int64 arrays of equal length (no copy when they already are)."""
    try:
        raw = (columns.ledger_ids, columns.entry_ids, columns.deliver_at)
    except AttributeError as exc:
        raise TypeError(
            f"columns must have ledger_ids, entry_ids and deliver_at (a DumpColumns), "
            f"got {type(columns).__name__}"
        ) from exc
    ledgers, entries, times = (
        _array(v, n) for v, n in zip(raw, ("ledger_ids", "entry_ids", "deliver_at"), strict=True)
    )
    if not len(ledgers) == len(entries) == len(times):
        raise ValueError(
            f"columns differ in length: ledger_ids {len(ledgers)}, entry_ids {len(entries)}, "
            f"deliver_at {len(times)}"
        )
    return ledgers, entries, times


def _check_positions(ledgers: Int64Array, entries: Int64Array) -> None:
    """Raise ValueError on an id out of range or a position found twice (naming the rows)."""
    if not len(ledgers):
        return
    bad = np.flatnonzero((ledgers < 0) | (entries < 0) | (entries > MAX_ENTRY_ID))
    if len(bad):
        i = int(bad[0])
        raise ValueError(
            f"row {i}: bad position ({ledgers[i]}, {entries[i]}); need ledger_id >= 0 and "
            f"0 <= entry_id < 2**32 ({len(bad)} such rows; read dumps with "
            f"delayindex.dump.read_dump, which rejects them)"
        )
    if is_position_sorted(ledgers, entries, strict=True):
        return  # a dump in position order has no duplicate (one pass)
    order = np.lexsort((entries, ledgers))
    sl, se = ledgers[order], entries[order]
    same = np.flatnonzero((sl[1:] == sl[:-1]) & (se[1:] == se[:-1]))
    if len(same):
        k = int(same[0])
        rows = sorted((int(order[k]), int(order[k + 1])))
        raise ValueError(
            f"position ({sl[k]}, {se[k]}) appears twice (rows {rows[0]} and {rows[1]}); "
            f"read dumps with delayindex.dump.read_dump, which resolves duplicates"
        )


# -- 1. what is tracked -------------------------------------------------------------------------


@dataclass(frozen=True)
class Classification:
    """Which rows an online tracker at ``now_ms`` tracks, and why the others are skipped.

    Each skipped row is counted once, by the first reason that applies in this order:
    ``not_delayed`` (``deliver_at < 0``), ``due`` (``deliver_at <= cutoff_ms``), ``acked``
    (position at or below the mark-delete position).
    """

    mask: BoolArray
    cutoff_ms: int
    not_delayed: int
    due: int
    acked: int

    @property
    def tracked(self) -> int:
        """Rows tracked."""
        return int(np.count_nonzero(self.mask))


def cutoff_for(now_ms: int, config: TrackerConfig) -> int:
    """The online cutoff at ``now_ms``: a message is due when ``deliver_at <= cutoff``."""
    return cutoff_ms(_int(now_ms, "now_ms"), config.tick_ms, config.strict)


def classify(
    columns: PositionColumns,
    *,
    now_ms: int,
    config: TrackerConfig,
    mark_delete: tuple[int, int] | None = None,
) -> Classification:
    """:func:`tracked_mask` with the counts of skipped rows by reason (see :class:`Classification`).

    Raises:
        TypeError, ValueError: bad columns, ``now_ms``, config or mark.
    """
    config = _config(config)
    ledgers, entries, times = _columns(columns)
    return _classify(ledgers, entries, times, now_ms, config, _mark(mark_delete))


def _classify(
    ledgers: Int64Array,
    entries: Int64Array,
    times: Int64Array,
    now_ms: int,
    config: TrackerConfig,
    mark: tuple[int, int] | None,
) -> Classification:
    cutoff = cutoff_for(now_ms, config)
    delayed = times >= 0
    live = delayed & (times > cutoff)
    mask = live
    if mark is not None:
        mask = live & ((ledgers > mark[0]) | ((ledgers == mark[0]) & (entries > mark[1])))
    n_delayed = int(np.count_nonzero(delayed))
    n_live = int(np.count_nonzero(live))
    return Classification(
        mask=mask,
        cutoff_ms=cutoff,
        not_delayed=len(times) - n_delayed,
        due=n_delayed - n_live,
        acked=n_live - int(np.count_nonzero(mask)),
    )


def tracked_mask(
    columns: PositionColumns,
    *,
    now_ms: int,
    config: TrackerConfig,
    mark_delete: tuple[int, int] | None = None,
) -> BoolArray:
    """For each row, whether an online tracker at ``now_ms`` tracks it.

    ``DelayIndex.add`` tracks a message when ``deliver_at > cutoff`` (cutoff = ``now_ms +
    tick_ms``, or ``now_ms`` with ``config.strict``; a negative ``deliver_at`` is never
    tracked). With ``mark_delete``, rows at or below it are acknowledged: a dispatcher reads the
    topic from the cursor's mark-delete position on, so it never adds them.

    Raises:
        TypeError, ValueError: bad columns, ``now_ms``, config or mark.
    """
    return classify(columns, now_ms=now_ms, config=config, mark_delete=mark_delete).mask


# -- 2. bucket ranges ---------------------------------------------------------------------------


def plan_buckets(
    ledgers_sorted_unique: Sequence[int] | Int64Array,
    counts: Sequence[int] | Int64Array,
    config: TrackerConfig,
) -> list[tuple[int, int]]:
    """Bucket ranges ``[(start_ledger, end_ledger), ...]`` from per-ledger tracked counts.

    The online sealing rule (module docs): a bucket starts at a ledger with tracked messages and
    takes the following ones until it holds ``min_index_count_per_bucket``; the ledger that
    reaches the count is its last (a ledger is never split). Ledgers with a zero count are
    ignored. The last bucket is included whatever its size. Then, with ``max_num_buckets > 0``,
    windows of adjacent buckets chosen by ``select_merge_window`` (the fewest messages, leftmost
    on ties, as every bucket's next segment is equally unloaded) are merged until at most
    ``max_num_buckets`` remain; the merged range spans its sources and the gaps between them.

    Raises:
        ValueError: ledgers not strictly increasing or negative, counts negative, or the two
            differ in length. TypeError: bad config or non-integer arrays.
    """
    config = _config(config)
    ledgers = _array(ledgers_sorted_unique, "ledgers_sorted_unique")
    n = _array(counts, "counts")
    if len(ledgers) != len(n):
        raise ValueError(f"{len(ledgers)} ledgers but {len(n)} counts")
    if len(ledgers) and (int(ledgers[0]) < 0 or bool(np.any(np.diff(ledgers) <= 0))):
        raise ValueError("ledgers must be non-negative and strictly increasing")
    if len(n) and int(n.min()) < 0:
        raise ValueError("counts must be >= 0")
    return plan_ranges(
        ledgers.tolist(), n.tolist(), config.min_index_count_per_bucket, config.max_num_buckets
    ).ranges


# -- 3. one bucket's snapshot -----------------------------------------------------------------


def build_bucket(
    times: Int64Array,
    ledgers: Int64Array,
    entries: Int64Array,
    start: int,
    end: int,
    config: TrackerConfig,
    *,
    validate: bool = True,
) -> tuple[SnapshotMetadata, PreparedSegments]:
    """Sort, cut and describe one bucket's indexes exactly as the online tracker does.

    ``validate`` checks that no position appears twice (the online tracker skips it: its
    positions come from a dedup index); pass False only for rows already known distinct.

    Raises:
        ValueError: empty input, a ledger outside ``[start, end]``, a position twice, ids out of
            range. TypeError: bad config.
    """
    config = _config(config)
    return build_snapshot(
        times,
        ledgers,
        entries,
        **config.builder_settings(),
        start_ledger=start,
        end_ledger=end,
        validate=validate,
    )


def write_bucket(
    storage: SnapshotStorage,
    key: str,
    metadata: SnapshotMetadata,
    segments: PreparedSegments,
    *,
    origin: tuple[str, int] | None = None,
) -> BucketRecord:
    """Write one reserved bucket's object under ``key``; return the record to publish.

    Runs anywhere the storage is reachable (a Spark executor); the record goes back to whoever
    holds the catalog, for :func:`publish_rebuild`. ``origin`` is ``(name, generation)``: the
    index and the manifest version of the reservation's commit, stamped into the object so that
    it describes itself (``SnapshotMetadata.with_origin``).

    Raises:
        StorageError, SnapshotExistsError: the write failed; ValueError: bad key or segments.
    """
    if origin is not None:
        metadata = metadata.with_origin(*origin)
    storage.create(metadata, segments, key)
    size = storage.length(key)
    return BucketRecord(
        metadata.start_ledger,
        metadata.end_ledger,
        key,
        metadata.num_messages,
        metadata.num_segments,
        size,
    )


# -- 4. the two-phase commit --------------------------------------------------------------------


def publish_rebuild(
    catalog: Catalog, records: Sequence[BucketRecord], mark_delete: tuple[int, int] | None
) -> list[str]:
    """Phase 2 of a rebuild: make ``records`` the name's only live buckets, with ``mark_delete``.

    One commit publishes the reserved buckets, turns every other live bucket into a delete
    intent and records the mark-delete position (None clears an old one: the rebuilt buckets
    hold exactly what the dump says is unacknowledged); the replaced objects are then deleted
    (failures stay as pending intents). Returns the replaced snapshot ids.

    Raises:
        ValueError: a record does not match its reservation (see ``Catalog.publish_creates``).
        StorageError, ManifestConflictError: the commit failed; call :func:`abort_rebuild`.
    """
    catalog.note_mark_delete(_mark(mark_delete))  # carried by the publish commit
    replaced = catalog.publish_creates(records, replace_live=True)
    catalog.persist_mark_delete()  # a no-op unless the publish left it pending
    return replaced


def abort_rebuild(catalog: Catalog, previous_mark: tuple[int, int] | None) -> list[str]:
    """Undo a rebuild that reserved but did not publish: roll back its create intents now.

    ``previous_mark`` is the manifest's mark-delete position before the rebuild (restored, so a
    rollback never persists the new one). Failures are not raised: what is left stays as
    intents for the next :meth:`Catalog.open` to roll back. Returns notes on what was left.
    """
    notes: list[str] = []
    try:
        catalog.note_mark_delete(previous_mark)
        report = catalog.retry_pending_deletes(force=True)
    except (StorageError, ManifestConflictError, SnapshotCorruptError, ValueError) as exc:
        return [f"rollback failed ({exc}); the next open rolls the reservations back"]
    notes.extend(f"delete of {i!r} still pending" for i in (*report.failed, *report.dead_lettered))
    notes.extend(catalog.problems())
    return notes


@dataclass(frozen=True)
class RebuildReport:
    """What a rebuild did.

    ``rows`` were read; ``tracked`` became indexes, the rest were skipped as ``not_delayed``,
    ``due`` or ``acked`` (:class:`Classification`). ``planned_buckets`` is the count the sealing
    rule gave before merging; ``buckets`` are the published records in ledger order;
    ``replaced`` the previously live snapshots that were replaced.
    """

    name: str
    now_ms: int
    cutoff_ms: int
    rows: int
    tracked: int
    not_delayed: int
    due: int
    acked: int
    planned_buckets: int
    buckets: tuple[BucketRecord, ...]
    replaced: tuple[str, ...] = ()
    mark_delete: tuple[int, int] | None = None
    seconds: float = 0.0
    notes: tuple[str, ...] = ()

    @property
    def ranges(self) -> list[tuple[int, int]]:
        """The published buckets' ledger ranges."""
        return [(b.start_ledger, b.end_ledger) for b in self.buckets]

    @property
    def snapshot_bytes(self) -> int:
        """Bytes written."""
        return sum(b.snapshot_bytes for b in self.buckets)

    def as_dict(self) -> dict[str, Any]:
        """Plain data (JSON-ready)."""
        out = asdict(self)
        out["mark_delete"] = list(self.mark_delete) if self.mark_delete else None
        out["snapshot_bytes"] = self.snapshot_bytes
        return out

    def to_json(self, indent: int | None = 2) -> str:
        """The report as JSON."""
        return json.dumps(self.as_dict(), indent=indent, sort_keys=True)


def _group_by_bucket(
    ledgers: Int64Array, ranges: Sequence[tuple[int, int]]
) -> tuple[npt.NDArray[np.intp], Int64Array]:
    """Row order grouping rows by bucket, and each bucket's slice bounds in that order."""
    starts = np.array([s for s, _ in ranges], dtype=np.int64)
    which = np.searchsorted(starts, ledgers, side="right") - 1
    order = np.argsort(which, kind="stable")
    bounds = np.searchsorted(which[order], np.arange(len(ranges) + 1))
    return order, bounds.astype(np.int64)


def rebuild_local(
    columns: PositionColumns,
    storage: SnapshotStorage,
    name: str,
    config: TrackerConfig,
    *,
    now_ms: int,
    mark_delete: tuple[int, int] | None = None,
    progress: Progress | None = None,
) -> RebuildReport:
    """Rebuild index ``name`` in ``storage`` from a dump, in this process (the reference path).

    Mask, plan, then the two-phase write (module docs): reserve every range in one commit,
    build and write each bucket, publish all of them in one commit that replaces whatever the
    name held and records ``mark_delete``. The result opens with :meth:`DelayIndex.open` as the
    index an online tracker would have built from the same messages at ``now_ms``.

    Args:
        columns: the dump (``DumpColumns``); positions must be distinct.
        storage: where the index lives.
        name: the index name; its writer lock is held for the whole rebuild.
        config: tracker settings (cutoff, bucket size, segment limits, ``max_num_buckets``).
        now_ms: the time the rebuilt index is as of (epoch ms).
        mark_delete: the cursor's mark-delete position, or None.
        progress: ``progress("buckets", done, total)`` after each bucket is written.

    Raises:
        TypeError, ValueError: bad arguments or a position found twice (nothing changed).
        StoreLockedError: another writer holds ``name``.
        StorageError, ManifestConflictError: the store failed; the reservations were rolled back
            (or, if that failed too, are left for the next open): the old buckets stay live.
    """
    started = time.perf_counter()
    config, now, mark = check_arguments(name, config, now_ms, mark_delete)
    if progress is not None and not callable(progress):
        raise TypeError("progress must be callable")
    ledgers, entries, times = _columns(columns)
    _check_positions(ledgers, entries)
    seen = _classify(ledgers, entries, times, now, config, mark)
    t, lg, en = times[seen.mask], ledgers[seen.mask], entries[seen.mask]
    unique, counts = np.unique(lg, return_counts=True)
    sealed = plan_buckets(unique, counts, config.replace(max_num_buckets=0))
    ranges = plan_buckets(unique, counts, config) if config.max_num_buckets > 0 else sealed
    order, bounds = _group_by_bucket(lg, ranges)
    catalog = Catalog.open(
        storage,
        name,
        **config.catalog_settings(),
    )
    try:
        previous_mark = catalog.manifest.mark_delete
        try:
            # Inside the try: a reservation whose commit outcome is unknown is rolled back too.
            keys = catalog.reserve_creates(ranges, replacing_live=True)
            origin = (name, catalog.manifest.version)
            records: list[BucketRecord] = []
            for k, ((start, end), key) in enumerate(zip(ranges, keys, strict=True)):
                rows = order[bounds[k] : bounds[k + 1]]
                # Positions were checked distinct above: skip build_snapshot's second check.
                metadata, segments = build_bucket(
                    t[rows], lg[rows], en[rows], start, end, config, validate=False
                )
                records.append(write_bucket(storage, key, metadata, segments, origin=origin))
                if progress is not None:
                    progress("buckets", k + 1, len(ranges))
            replaced = publish_rebuild(catalog, records, mark)
        except Exception as exc:
            for note in abort_rebuild(catalog, previous_mark):
                exc.add_note(note)
            raise
        notes = tuple(catalog.problems())
    finally:
        catalog.close()
    return RebuildReport(
        name=name,
        now_ms=now,
        cutoff_ms=seen.cutoff_ms,
        rows=len(times),
        tracked=len(t),
        not_delayed=seen.not_delayed,
        due=seen.due,
        acked=seen.acked,
        planned_buckets=len(sealed),
        buckets=tuple(records),
        replaced=tuple(replaced),
        mark_delete=mark,
        seconds=time.perf_counter() - started,
        notes=notes,
    )


# -- verify -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Finding:
    """One problem :func:`verify_store` found: its ``kind`` (:data:`FINDING_KINDS`), a
    message, the snapshot it concerns (if one), how many positions or objects it covers and a
    few examples."""

    kind: str
    message: str
    snapshot_id: str | None = None
    count: int = 1
    examples: tuple[dict[str, Any], ...] = ()


@dataclass(frozen=True)
class VerifyReport:
    """The outcome of :func:`verify_store`; ``ok`` when there is no finding.

    ``expected`` positions come from the dump, ``found`` from the live buckets (after the
    manifest's mark-delete position). ``young_unreferenced`` are unreferenced objects inside the
    grace period (not findings: a writer may be about to reference them); ``dead_letters`` are
    the name's deletes that kept failing (their objects are not part of the index).
    """

    name: str
    now_ms: int
    cutoff_ms: int
    expected: int
    found: int
    buckets: int
    segments: int
    findings: tuple[Finding, ...] = ()
    young_unreferenced: tuple[str, ...] = ()
    dead_letters: tuple[str, ...] = ()
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        """No finding."""
        return not self.findings

    def counts(self) -> dict[str, int]:
        """Findings per kind (positions or objects they cover), only kinds that occur."""
        out: dict[str, int] = {}
        for f in self.findings:
            out[f.kind] = out.get(f.kind, 0) + f.count
        return {k: out[k] for k in FINDING_KINDS if k in out}

    def kinds(self) -> set[str]:
        """The kinds of the findings."""
        return {f.kind for f in self.findings}

    def as_dict(self) -> dict[str, Any]:
        """Plain data (JSON-ready), with ``ok`` and the per-kind counts."""
        out = asdict(self)
        out["ok"] = self.ok
        out["counts"] = self.counts()
        return out

    def to_json(self, indent: int | None = 2) -> str:
        """The report as JSON."""
        return json.dumps(self.as_dict(), indent=indent, sort_keys=True)


@dataclass
class _Found:
    """Positions read from the live buckets, with the index of the bucket holding each."""

    times: list[Int64Array] = field(default_factory=list)
    ledgers: list[Int64Array] = field(default_factory=list)
    entries: list[Int64Array] = field(default_factory=list)
    bucket: list[npt.NDArray[np.intp]] = field(default_factory=list)
    segments: int = 0


def _read_bucket(
    storage: SnapshotStorage, record: BucketRecord, out: _Found, k: int
) -> list[Finding]:
    """Fully decode one live bucket into ``out``; findings for what is wrong with it."""
    sid = record.snapshot_id
    where = f"bucket [{record.start_ledger}, {record.end_ledger}]"
    try:
        size = storage.length(sid)
        metadata = storage.get_metadata(sid, check_bitmaps=True)
        t, lg, en = storage.get_segment_arrays(sid, 1, max(metadata.num_segments, 1))
    except SnapshotNotFoundError:
        return [Finding("missing_snapshot", f"{where}: snapshot {sid!r} does not exist", sid)]
    except (SnapshotCorruptError, StorageError, ValueError) as exc:
        return [Finding("corrupt_snapshot", f"{where}: snapshot {sid!r}: {exc}", sid)]
    findings: list[Finding] = []
    facts = {
        "snapshot_bytes": (record.snapshot_bytes, size),
        "start_ledger": (record.start_ledger, metadata.start_ledger),
        "end_ledger": (record.end_ledger, metadata.end_ledger),
        "num_messages": (record.num_messages, metadata.num_messages),
        "num_segments": (record.num_segments, metadata.num_segments),
    }
    for what, (recorded, actual) in facts.items():
        if recorded != actual:
            findings.append(
                Finding(
                    "manifest_mismatch",
                    f"{where}: the manifest says {what} = {recorded}, snapshot {sid!r} has "
                    f"{actual}",
                    sid,
                )
            )
    if len(t) != metadata.num_messages:
        findings.append(
            Finding(
                "corrupt_snapshot",
                f"{where}: snapshot {sid!r} decodes to {len(t)} indexes, its metadata "
                f"counts {metadata.num_messages}",
                sid,
            )
        )
    outside = np.flatnonzero((lg < record.start_ledger) | (lg > record.end_ledger))
    if len(outside):
        findings.append(
            Finding(
                "manifest_mismatch",
                f"{where}: snapshot {sid!r} holds {len(outside)} positions outside its range",
                sid,
                len(outside),
                tuple(
                    {"ledger_id": int(lg[i]), "entry_id": int(en[i])}
                    for i in outside[:MAX_EXAMPLES]
                ),
            )
        )
    out.times.append(t)
    out.ledgers.append(lg)
    out.entries.append(en)
    out.bucket.append(np.full(len(t), k, dtype=np.intp))
    out.segments += metadata.num_segments
    return findings


def _manifest_findings(manifest: Manifest) -> list[Finding]:
    findings = [
        Finding(
            "manifest_mismatch",
            f"pending {i.kind} intent for {i.snapshot_id!r} (ledgers [{i.start_ledger}, "
            f"{i.end_ledger}]): an unfinished change; opening the index repairs it",
            i.snapshot_id,
        )
        for i in manifest.intents
    ]
    ordered = sorted(manifest.buckets, key=lambda b: b.start_ledger)
    for a, b in itertools.pairwise(ordered):
        if b.start_ledger <= a.end_ledger:
            findings.append(
                Finding(
                    "manifest_mismatch",
                    f"buckets [{a.start_ledger}, {a.end_ledger}] ({a.snapshot_id!r}) and "
                    f"[{b.start_ledger}, {b.end_ledger}] ({b.snapshot_id!r}) overlap",
                    b.snapshot_id,
                )
            )
    return findings


def _example(ledger: int, entry: int, **extra: Any) -> dict[str, Any]:
    return {"ledger_id": ledger, "entry_id": entry, **extra}


def _compare(
    expected: tuple[Int64Array, Int64Array, Int64Array],
    found: tuple[Int64Array, Int64Array, Int64Array, npt.NDArray[np.intp]],
    ids: Sequence[str],
) -> list[Finding]:
    """Position findings: missing, extra (or held twice), wrong deliver time."""
    el, ee, et = expected
    fl, fe, ft, fb = found
    ledgers = np.concatenate([el, fl])
    entries = np.concatenate([ee, fe])
    times = np.concatenate([et, ft])
    source = np.concatenate([np.zeros(len(el), np.int8), np.ones(len(fl), np.int8)])
    bucket = np.concatenate([np.full(len(el), -1, np.intp), fb])
    # Sorted by position, the expected row (source 0) first in each group.
    order = np.lexsort((source, entries, ledgers))
    L, E, T, S, B = (a[order] for a in (ledgers, entries, times, source, bucket))
    start = np.ones(len(L), dtype=np.bool_)
    if len(L) > 1:
        start[1:] = (L[1:] != L[:-1]) | (E[1:] != E[:-1])
    group = np.cumsum(start) - 1
    heads = np.flatnonzero(start)
    n_expected = np.bincount(group, weights=(S == 0)).astype(np.int64)
    n_found = np.bincount(group, weights=(S == 1)).astype(np.int64)
    findings: list[Finding] = []

    def report(kind: str, rows: npt.NDArray[np.intp], message: str, **cols: Any) -> None:
        if not len(rows):
            return
        examples = tuple(
            _example(
                int(L[i]),
                int(E[i]),
                **{k: (v(i) if callable(v) else v) for k, v in cols.items()},
            )
            for i in rows[:MAX_EXAMPLES]
        )
        findings.append(Finding(kind, message.format(n=len(rows)), None, len(rows), examples))

    missing = heads[(n_expected == 1) & (n_found == 0)]
    report(
        "missing_position",
        missing,
        "{n} expected positions are in no bucket",
        deliver_at=lambda i: int(T[i]),
    )
    found_rows = np.flatnonzero(S == 1)
    g = group[found_rows]
    extra = found_rows[n_expected[g] == 0]
    report(
        "extra_position",
        extra,
        "{n} indexes in the store are not expected (not in the dump, not delayed, due or "
        "acknowledged)",
        deliver_at=lambda i: int(T[i]),
        snapshot_id=lambda i: ids[int(B[i])],
    )
    # A second copy of an expected position (an unexpected one is already reported whole).
    twice = found_rows[(n_expected[g] == 1) & (n_found[g] > 1) & (found_rows != heads[g] + 1)]
    report(
        "extra_position",
        twice,
        "{n} indexes are second copies of a position held by another bucket (or segment)",
        deliver_at=lambda i: int(T[i]),
        snapshot_id=lambda i: ids[int(B[i])],
    )
    first_copies = found_rows[(n_expected[g] == 1) & (found_rows == heads[g] + 1)]
    wrong = first_copies[T[first_copies] != T[heads[group[first_copies]]]]
    report(
        "wrong_deliver_time",
        wrong,
        "{n} positions have another deliver time in the store than in the dump",
        deliver_at=lambda i: int(T[i]),
        expected_deliver_at=lambda i: int(T[heads[group[i]]]),
        snapshot_id=lambda i: ids[int(B[i])],
    )
    return findings


def verify_store(
    storage: SnapshotStorage,
    name: str,
    columns: PositionColumns,
    config: TrackerConfig,
    *,
    now_ms: int,
    mark_delete: tuple[int, int] | None = None,
    orphan_grace_ms: int = DEFAULT_ORPHAN_GRACE_MS,
) -> VerifyReport:
    """Check index ``name`` in ``storage`` against a dump (module docs); change nothing.

    The expected positions are the dump's rows that :func:`tracked_mask` keeps at ``now_ms``
    with ``mark_delete``. Object ages for the orphan scan are measured on the wall clock.

    Raises:
        TypeError, ValueError: bad arguments, or a position found twice in the dump.
        StorageError: the store could not be listed.
    """
    started = time.perf_counter()
    config, now, mark = check_arguments(name, config, now_ms, mark_delete)
    grace = _int(orphan_grace_ms, "orphan_grace_ms", 0)
    ledgers, entries, times = _columns(columns)
    _check_positions(ledgers, entries)
    seen = _classify(ledgers, entries, times, now, config, mark)
    expected = (ledgers[seen.mask], entries[seen.mask], times[seen.mask])
    findings: list[Finding] = []
    try:
        manifest = storage.read_manifest(name)
    except SnapshotCorruptError as exc:
        findings.append(Finding("manifest_mismatch", f"the manifest of {name!r}: {exc}"))
        manifest = Manifest(name)
    findings.extend(_manifest_findings(manifest))
    if manifest.mark_delete != mark:
        findings.append(
            Finding(
                "manifest_mismatch",
                f"the manifest's mark-delete is {manifest.mark_delete}, expected {mark}",
            )
        )
    records = sorted(manifest.buckets, key=lambda b: b.start_ledger)
    found = _Found()
    for k, record in enumerate(records):
        findings.extend(_read_bucket(storage, record, found, k))

    def joined(parts: list[Any], dtype: Any) -> Any:
        return np.concatenate(parts) if parts else np.empty(0, dtype=dtype)

    ft, fl, fe = (joined(p, np.int64) for p in (found.times, found.ledgers, found.entries))
    fb = joined(found.bucket, np.intp)
    if manifest.mark_delete is not None:  # acknowledged: a reopen never delivers these
        ml, me = manifest.mark_delete
        live = (fl > ml) | ((fl == ml) & (fe > me))
        ft, fl, fe, fb = ft[live], fl[live], fe[live], fb[live]
    findings.extend(_compare(expected, (fl, fe, ft, fb), [r.snapshot_id for r in records]))
    garbage = find_garbage(storage, now_ms=wall_clock_ms(), grace_ms=grace, names=[name])
    findings.extend(
        Finding(
            "orphan",
            f"object {orphan.id!r} ({orphan.size} bytes, {orphan.age_ms // 1000} s old) is "
            f"referenced by no manifest; `delayindex gc --delete` removes it",
            orphan.id,
        )
        for orphan in garbage.orphans
    )
    if garbage.refused:
        findings.append(Finding("manifest_mismatch", f"orphan scan incomplete: {garbage.refused}"))
    rank = {kind: i for i, kind in enumerate(FINDING_KINDS)}
    findings.sort(key=lambda f: rank[f.kind])
    return VerifyReport(
        name=name,
        now_ms=now,
        cutoff_ms=seen.cutoff_ms,
        expected=len(expected[0]),
        found=len(fl),
        buckets=len(records),
        segments=found.segments,
        findings=tuple(findings),
        young_unreferenced=tuple(o.id for o in garbage.young),
        dead_letters=tuple(d.snapshot_id for d in manifest.dead_letters),
        seconds=time.perf_counter() - started,
    )
