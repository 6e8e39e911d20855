"""Verification of a store against a dump: what a rebuild should have published, checked.

How it works: :func:`verify_store` classifies the dump as a rebuild would
(:mod:`delayindex.rebuild.tracked`), reads and fully decodes every live bucket of the name, and
compares: every expected position in exactly one live bucket with the same deliver time, no
extra position (positions at or below the manifest's mark-delete position are ignored: a reopen
never delivers them), every snapshot decoded with good checksums, the manifest consistent with
its objects and free of pending intents, and the store's orphans (objects no manifest
references, older than a grace period) listed. Each :class:`Finding` has a kind from
:data:`FINDING_KINDS`.

A shared index (``subscriptions`` given) is checked per subscription: the manifest must carry
exactly those records (and their lowest mark as its own, :mod:`delayindex.rebuild.shared`);
then, for each subscription, the rows the dump says it still has to receive (expected, after
its own mark) are compared with the positions the store holds after that mark, and each
position finding names the subscription (:attr:`Finding.subscription`); a
:class:`SubscriptionCheck` per subscription counts both sides.

Invariants: it reads only and takes no lock (run it on a quiet store); the dump's arrays are
never changed.
"""

from __future__ import annotations

import itertools
import json
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import numpy as np
import numpy.typing as npt

from delayindex.clock import wall_clock_ms
from delayindex.config import TrackerConfig
from delayindex.errors import SnapshotCorruptError, SnapshotNotFoundError, StorageError
from delayindex.garbage import find_garbage
from delayindex.rebuild.shared import Subscriptions, acknowledged
from delayindex.rebuild.tracked import (
    Int64Array,
    PositionColumns,
    _check_positions,
    _classify,
    _columns,
    _int,
    after_mark,
    check_arguments,
)
from delayindex.storage.base import SnapshotStorage
from delayindex.storage.manifest import BucketRecord, Manifest, SubscriptionRecord

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


@dataclass(frozen=True)
class Finding:
    """One problem :func:`verify_store` found: its ``kind`` (:data:`FINDING_KINDS`), a
    message, the snapshot it concerns (if one), how many positions or objects it covers, a
    few examples and, for a shared index's position findings, the subscription."""

    kind: str
    message: str
    snapshot_id: str | None = None
    count: int = 1
    examples: tuple[dict[str, Any], ...] = ()
    subscription: str | None = None


@dataclass(frozen=True)
class SubscriptionCheck:
    """One subscription of a shared index, as verified: its mark, the positions the dump says
    it still has to receive (``expected``), those the store would give it (``found``), and
    whether no position finding names it (``ok``)."""

    name: str
    mark_delete: tuple[int, int] | None
    expected: int
    found: int
    ok: bool


@dataclass(frozen=True)
class VerifyReport:
    """The outcome of :func:`verify_store`; ``ok`` when there is no finding.

    ``expected`` positions come from the dump, ``found`` from the live buckets (after the
    manifest's mark-delete position). ``young_unreferenced`` are unreferenced objects inside the
    grace period (not findings: a writer may be about to reference them); ``dead_letters`` are
    the name's deletes that kept failing (their objects are not part of the index). A shared
    index has one :class:`SubscriptionCheck` per subscription in ``subscriptions``.
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
    subscriptions: tuple[SubscriptionCheck, ...] = ()

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
        for sub in out["subscriptions"]:
            sub["mark_delete"] = list(sub["mark_delete"]) if sub["mark_delete"] else None
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
    subscriptions: Subscriptions | None = None,
) -> VerifyReport:
    """Check index ``name`` in ``storage`` against a dump (module docs); change nothing.

    The expected positions are the dump's rows that :func:`tracked_mask` keeps at ``now_ms``
    with ``mark_delete``. Object ages for the orphan scan are measured on the wall clock.
    With ``subscriptions`` (name -> mark, as the shared index was built with; not with
    ``mark_delete``) the store is a shared index, checked per subscription (module docs).

    Raises:
        TypeError, ValueError: bad arguments, or a position found twice in the dump.
        StorageError: the store could not be listed.
    """
    started = time.perf_counter()
    ack = acknowledged(mark_delete, subscriptions)
    config, now, mark = check_arguments(name, config, now_ms, ack.mark_delete)
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
    if manifest.subscriptions != ack.subscriptions:
        findings.append(
            Finding(
                "manifest_mismatch",
                f"the manifest's subscriptions are {_records(manifest.subscriptions)}, "
                f"expected {_records(ack.subscriptions)}",
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
        live = after_mark(fl, fe, manifest.mark_delete)
        ft, fl, fe, fb = ft[live], fl[live], fe[live], fb[live]
    ids = [r.snapshot_id for r in records]
    checks: list[SubscriptionCheck] = []
    if not ack.shared:
        findings.extend(_compare(expected, (fl, fe, ft, fb), ids))
    for sub in ack.subscriptions:  # what each subscription still has to receive
        want = after_mark(expected[0], expected[1], sub.mark_delete)
        have = after_mark(fl, fe, sub.mark_delete)
        own = [
            replace(f, subscription=sub.name,
                    message=f"subscription {sub.name!r}: {f.message}")
            for f in _compare(
                tuple(column[want] for column in expected),  # type: ignore[arg-type]
                (fl[have], fe[have], ft[have], fb[have]),
                ids,
            )
        ]  # fmt: skip
        findings.extend(own)
        checks.append(
            SubscriptionCheck(
                sub.name, sub.mark_delete, int(np.count_nonzero(want)),
                int(np.count_nonzero(have)), not own,
            )
        )  # fmt: skip
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
        subscriptions=tuple(checks),
    )


def _records(records: Sequence[SubscriptionRecord]) -> str:
    """``a@3:2, b@-`` (name and mark of each), or ``none``."""
    return (
        ", ".join(
            f"{r.name}@{'{}:{}'.format(*r.mark_delete) if r.mark_delete else '-'}" for r in records
        )
        or "none"
    )
