"""Offline rebuild (``delayindex.rebuild``): the pure transforms, the local rebuild, verify.

The acceptance test is the equivalence: a dump ingested online by a ``DelayIndex`` (ManualClock
fixed at ``now``, InlineExecutor, merging off, small buckets; then one sentinel message in a new
ledger, which seals the last real bucket as a rebuild does) and the same dump rebuilt with
``rebuild_local`` give identical bucket ranges, and after reopening both, identical full
delivery sequences ``(clock step, batch)`` when drained with a manual clock.

The other tests pin the sealing rule against the real ``BucketCore``, the tracked rule against
``DelayIndex.add``, the two-phase write (failures and kills leave no orphans; re-runs are
idempotent), and that ``verify_store`` names every seeded corruption.
"""

from __future__ import annotations

import itertools
import json
import os
import shutil
import subprocess
import sys
import textwrap
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import delayindex
from delayindex import DelayIndex, FileStorage, ManualClock, MemoryStorage, TrackerConfig, _impl
from delayindex.errors import StoreLockedError
from delayindex.executors import InlineExecutor
from delayindex.garbage import find_garbage
from delayindex.rebuild import (
    FINDING_KINDS,
    RebuildReport,
    build_bucket,
    classify,
    plan_buckets,
    rebuild_local,
    tracked_mask,
    verify_store,
)
from delayindex.storage import Catalog
from delayindex.tracker.delay_index import select_merge_window
from delayindex.workload import generate

SRC = str(Path(delayindex.__file__).resolve().parents[1])
NAME = "topic"
HOUR = 3_600_000


@dataclass(frozen=True)
class Cols:
    """A DumpColumns-like dump (``delayindex.dump`` is written separately)."""

    ledger_ids: np.ndarray
    entry_ids: np.ndarray
    deliver_at: np.ndarray

    @classmethod
    def of(cls, ledgers: Any, entries: Any, deliver: Any) -> Cols:
        return cls(*(np.asarray(a, dtype=np.int64) for a in (ledgers, entries, deliver)))

    def where(self, keep: np.ndarray) -> Cols:
        return Cols(self.ledger_ids[keep], self.entry_ids[keep], self.deliver_at[keep])

    def __len__(self) -> int:
        return len(self.ledger_ids)


def _config(**changes: Any) -> TrackerConfig:
    settings: dict[str, Any] = {
        "min_index_count_per_bucket": 150,
        "max_num_buckets": 0,
        "max_indexes_per_segment": 40,
        "max_time_step_per_segment_ms": 20_000,
    }
    return TrackerConfig(**{**settings, **changes})


def _dump(n: int, seed: int, after_ms: int = 20_000, **kwargs: Any) -> tuple[Cols, int]:
    """A generated dump in position order, and a ``now`` that leaves part of it due."""
    w = generate(n, seed=seed, **kwargs)
    return Cols(w.ledger_ids, w.entry_ids, w.deliver_at), int(w.publish_ms[0]) + after_ms


def _plan(dump: Cols, config: TrackerConfig, now: int, mark: Any = None) -> list[tuple[int, int]]:
    mask = tracked_mask(dump, now_ms=now, config=config, mark_delete=mark)
    ledgers, counts = np.unique(dump.ledger_ids[mask], return_counts=True)
    return plan_buckets(ledgers, counts, config)


def _full_last_bucket(dump: Cols, config: TrackerConfig, now: int, mark: Any = None) -> Cols:
    """Drop the last planned bucket's ledgers if it is too small for the sentinel to seal it.

    Online, a new ledger seals the mutable bucket only once it holds the minimum; every other
    bucket does by the sealing rule, so the trimmed dump ends with a full bucket.
    """
    mask = tracked_mask(dump, now_ms=now, config=config, mark_delete=mark)
    start, _ = _plan(dump, config, now, mark)[-1]
    last = mask & (dump.ledger_ids >= start)
    if np.count_nonzero(last) >= config.min_index_count_per_bucket:
        return dump
    return dump.where(dump.ledger_ids < start)


def _online(
    path: Path, dump: Cols, config: TrackerConfig, now: int, mark: Any = None
) -> FileStorage:
    """Ingest the dump online, as a dispatcher reading the topic from the mark on would."""
    storage = FileStorage(path)
    index = DelayIndex.open(
        storage, NAME, config, clock=ManualClock(now), executor=InlineExecutor()
    )
    rows = dump
    if mark is not None:
        index.set_mark_delete(*mark)
        after = (dump.ledger_ids > mark[0]) | (
            (dump.ledger_ids == mark[0]) & (dump.entry_ids > mark[1])
        )
        rows = dump.where(after)
    index.add_many(rows.ledger_ids, rows.entry_ids, rows.deliver_at)
    assert index.add(int(dump.ledger_ids.max()) + 1, 0, now + 1000 * HOUR)  # the sentinel
    index.close()
    return storage


def _ranges(storage: Any, name: str = NAME) -> list[tuple[int, int]]:
    return [(b.start_ledger, b.end_ledger) for b in storage.read_manifest(name).buckets]


def _schedule(dump: Cols, config: TrackerConfig, now: int, steps: int = 40) -> list[int]:
    times = np.sort(dump.deliver_at[tracked_mask(dump, now_ms=now, config=config)])
    points = np.quantile(times, np.linspace(0, 1, steps)).astype(np.int64)
    return sorted({*points.tolist(), int(times[-1])})


def _drain(
    storage: Any, config: TrackerConfig, now: int, schedule: list[int], batch: int = 23
) -> list[tuple[int, tuple[Any, ...]]]:
    """Reopen the index and deliver everything: the list of ``(clock, batch)`` polls."""
    clock = ManualClock(now)
    out: list[tuple[int, tuple[Any, ...]]] = []
    index = DelayIndex.open(storage, NAME, config, clock=clock, executor=InlineExecutor())
    try:
        for t in schedule:
            clock.set(t)
            while got := index.poll(batch):
                out.append((t, tuple(got)))
        assert len(index) == 0
    finally:
        index.close()
    return out


def _positions(sequence: list[tuple[int, tuple[Any, ...]]]) -> list[tuple[int, int]]:
    return sorted((p.ledger_id, p.entry_id) for _, got in sequence for p in got)


def _expected(dump: Cols, config: TrackerConfig, now: int, mark: Any = None) -> list[Any]:
    mask = tracked_mask(dump, now_ms=now, config=config, mark_delete=mark)
    return sorted(zip(dump.ledger_ids[mask].tolist(), dump.entry_ids[mask].tolist(), strict=True))


# -- tracked_mask ----------------------------------------------------------------------------------


@pytest.mark.parametrize("strict", [False, True])
def test_tracked_mask_is_what_delay_index_add_tracks(strict: bool) -> None:
    now, tick = 1_000_000, 1000
    config = _config(strict=strict, tick_ms=tick)
    times = [-5, -1, 0, now - 1, now, now + 1, now + tick - 1, now + tick, now + tick + 1, 2 * now]
    dump = Cols.of([1] * len(times), range(len(times)), times)
    index = DelayIndex.open(MemoryStorage(), NAME, config, clock=ManualClock(now))
    try:
        online = index.add_many(dump.ledger_ids, dump.entry_ids, dump.deliver_at)
    finally:
        index.close()
    mask = tracked_mask(dump, now_ms=now, config=config)
    assert mask.tolist() == online.tolist()
    first = now + 1 if strict else now + tick + 1
    assert dump.deliver_at[mask].min() == first  # the boundary itself is due


def test_tracked_mask_drops_acknowledged_positions_and_counts_reasons() -> None:
    dump = Cols.of(
        [1, 1, 2, 2, 2, 3, 3, 3],
        [0, 9, 4, 5, 6, 0, 1, 2],
        [50, 50, 50, 50, 50, -1, 5, 50],
    )
    seen = classify(dump, now_ms=10, config=_config(tick_ms=0), mark_delete=(2, 5))
    assert seen.mask.tolist() == [False, False, False, False, True, False, False, True]
    assert (seen.not_delayed, seen.due, seen.acked, seen.tracked) == (1, 1, 4, 2)
    assert seen.cutoff_ms == 10
    assert tracked_mask(dump, now_ms=10, config=_config(tick_ms=0)).sum() == 6


@pytest.mark.parametrize(
    ("dump", "kwargs", "error", "match"),
    [
        (Cols.of([1, 2], [0], [5, 5]), {}, ValueError, "differ in length"),
        (Cols.of([1], [0], [5]), {"mark_delete": (1,)}, TypeError, "mark_delete"),
        (Cols.of([1], [0], [5]), {"mark_delete": (1, -1)}, ValueError, "entry_id"),
        (Cols.of([1], [0], [5]), {"now_ms": 1.5}, TypeError, "now_ms"),
        (Cols.of([1], [0], [5]), {"config": "x"}, TypeError, "TrackerConfig"),
        (Cols(np.ones(1), np.zeros(1), np.ones(1)), {}, TypeError, "integers"),
        (Cols.of([[1]], [[0]], [[5]]), {}, ValueError, "one-dimensional"),
        ("not columns", {}, TypeError, "ledger_ids"),
    ],
)
def test_tracked_mask_rejects_bad_input(dump: Any, kwargs: Any, error: Any, match: str) -> None:
    args = {"now_ms": 0, "config": _config(), **kwargs}
    with pytest.raises(error, match=match):
        tracked_mask(dump, **args)


# -- plan_buckets ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("ledgers", "counts", "minimum", "expected"),
    [
        ([], [], 3, []),
        ([1, 2, 3], [0, 5, 0], 3, [(2, 2)]),  # ledgers without tracked messages join nothing
        ([1, 2, 3, 4], [1, 1, 1, 1], 3, [(1, 3), (4, 4)]),  # the ledger reaching the count ends it
        ([1, 2], [10, 1], 3, [(1, 1), (2, 2)]),  # a ledger is never split
        ([5, 9, 20], [2, 2, 2], 4, [(5, 9), (20, 20)]),  # gaps between ledger ids
        ([1, 2, 3], [1, 1, 1], 50, [(1, 3)]),  # the last bucket is kept, however small
        ([7], [1], 1, [(7, 7)]),
    ],
)
def test_plan_buckets_sealing_rule(
    ledgers: list[int], counts: list[int], minimum: int, expected: list[tuple[int, int]]
) -> None:
    config = _config(min_index_count_per_bucket=minimum)
    assert plan_buckets(ledgers, counts, config) == expected


def test_plan_buckets_merges_with_the_online_selection_until_the_count_fits() -> None:
    config = _config(min_index_count_per_bucket=1, max_num_buckets=2)
    # Windows of four: [0..3] holds 12 messages, [1..4] holds 4: the lighter one is merged.
    assert plan_buckets([1, 2, 3, 4, 5], [9, 1, 1, 1, 1], config) == [(1, 1), (2, 5)]
    # A tie goes to the leftmost window.
    assert plan_buckets([1, 2, 3, 4, 5], [9, 1, 1, 1, 9], config) == [(1, 4), (5, 5)]
    # The merged range spans the gaps between its sources.
    many = plan_buckets(list(range(0, 200, 2)), [1] * 100, config.replace(max_num_buckets=7))
    assert len(many) <= 7
    assert many[0][0] == 0 and many[-1][1] == 198
    assert all(a[1] < b[0] for a, b in itertools.pairwise(many))
    assert select_merge_window([(True, 1, 0)]) is None  # one bucket never merges


@pytest.mark.parametrize(
    ("ledgers", "counts", "match"),
    [
        ([2, 1], [1, 1], "strictly increasing"),
        ([1, 1], [1, 1], "strictly increasing"),
        ([-1, 1], [1, 1], "non-negative"),
        ([1, 2], [1, -1], "counts must be >= 0"),
        ([1, 2], [1], "2 ledgers but 1 counts"),
    ],
)
def test_plan_buckets_rejects_bad_input(ledgers: list[int], counts: list[int], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        plan_buckets(ledgers, counts, _config())


@st.composite
def _rows(draw: st.DrawFn) -> tuple[Cols, int]:
    """Distinct positions in position order; deliver times mixing not delayed, due and later."""
    n_ledgers = draw(st.integers(1, 12))
    ledgers = np.cumsum(draw(st.lists(st.integers(1, 3), min_size=n_ledgers, max_size=n_ledgers)))
    rows: list[tuple[int, int, int]] = []
    for ledger in ledgers.tolist():
        size = draw(st.integers(0, 6))
        kinds = draw(st.lists(st.sampled_from([-1, 100, 5000, 9000]), min_size=size, max_size=size))
        rows.extend((ledger, e, t) for e, t in enumerate(kinds))
    minimum = draw(st.integers(1, 8))
    if not rows:
        rows = [(1, 0, 5000)]
    return Cols.of(*zip(*rows, strict=True)), minimum


@given(_rows())
def test_plan_buckets_matches_the_bucket_core_sealing(case: tuple[Cols, int]) -> None:
    dump, minimum = case
    now, config = 1000, _config(min_index_count_per_bucket=minimum, tick_ms=0)
    core = _impl.BucketCore(0, False, 0, minimum)
    sealed: list[tuple[int, int]] = []
    columns = (dump.ledger_ids.tolist(), dump.entry_ids.tolist(), dump.deliver_at.tolist())
    for ledger, entry, t in zip(*columns, strict=True):
        if core.add(ledger, entry, t, now) == 3:
            start, end = core.seal(len(sealed))[3:]
            sealed.append((start, end))
            core.add_range(start, end)
            assert core.add(ledger, entry, t, now) == 1
    if core.mutable_range[0] >= 0:
        sealed.append(core.mutable_range)  # a rebuild seals the last bucket too
    assert _plan(dump, config, now) == sealed


# -- build_bucket ----------------------------------------------------------------------------------


def test_build_bucket_cuts_with_the_config_segment_limits() -> None:
    config = _config(max_indexes_per_segment=3, max_time_step_per_segment_ms=100)
    times = np.array([1000, 1001, 1002, 1003, 1500, 1501], dtype=np.int64)
    ledgers = np.array([5, 5, 6, 6, 6, 7], dtype=np.int64)
    entries = np.arange(6, dtype=np.int64)
    metadata, segments = build_bucket(times[::-1], ledgers[::-1], entries[::-1], 4, 9, config)
    assert (metadata.start_ledger, metadata.end_ledger) == (4, 9)
    assert metadata.counts.tolist() == [3, 1, 2]  # three per segment, then a time step
    assert segments.times.tolist() == times.tolist()  # sorted by (time, ledger, entry)
    with pytest.raises(ValueError, match="outside"):
        build_bucket(times, ledgers, entries, 6, 9, config)
    with pytest.raises(ValueError, match="at least one"):
        build_bucket(times[:0], ledgers[:0], entries[:0], 4, 9, config)
    with pytest.raises(ValueError, match="twice"):
        build_bucket(times[:2], ledgers[:2], np.zeros(2, dtype=np.int64), 4, 9, config)


# -- the equivalence (acceptance) ------------------------------------------------------------------

#: Case name: (workload arguments, config changes, mark-delete position).
EQUIVALENCE_CASES: dict[str, tuple[dict[str, Any], dict[str, Any], tuple[int, int] | None]] = {
    "realistic": ({"seed": 1, "entries_per_ledger": 37}, {}, None),
    "fixed-ties-strict": (
        {"seed": 2, "entries_per_ledger": 100, "delay_mix": "fixed", "after_ms": 60_400},
        {"strict": True},
        None,
    ),
    "midnight-burst": (
        {"seed": 3, "entries_per_ledger": 250, "delay_mix": "midnight-burst"},
        {},
        None,
    ),
    "uniform-mark": ({"seed": 4, "entries_per_ledger": 60, "delay_mix": "uniform"}, {}, (40, 17)),
    "realistic-mark-strict": ({"seed": 5, "entries_per_ledger": 45}, {"strict": True}, (70, 0)),
}


@pytest.mark.parametrize("case", sorted(EQUIVALENCE_CASES))
def test_rebuild_equals_online_ingestion(tmp_path: Path, case: str) -> None:
    workload, settings, mark = EQUIVALENCE_CASES[case]
    config = _config(**settings)
    dump, now = _dump(8000, **workload)
    dump = _full_last_bucket(dump, config, now, mark)
    online = _online(tmp_path / "online", dump, config, now, mark)
    rebuilt = FileStorage(tmp_path / "rebuilt")
    report = rebuild_local(dump, rebuilt, NAME, config, now_ms=now, mark_delete=mark)

    ranges = _ranges(online)
    assert len(ranges) >= 8  # many buckets, or the test proves little
    assert _ranges(rebuilt) == ranges == report.ranges == _plan(dump, config, now, mark)
    assert rebuilt.read_manifest(NAME).mark_delete == online.read_manifest(NAME).mark_delete == mark
    assert verify_store(online, NAME, dump, config, now_ms=now, mark_delete=mark).ok

    schedule = _schedule(dump, config, now)
    delivered_online = _drain(online, config, now, schedule)
    delivered_rebuilt = _drain(rebuilt, config, now, schedule)
    assert delivered_rebuilt == delivered_online
    assert _positions(delivered_rebuilt) == _expected(dump, config, now, mark)


def test_rebuild_respects_max_num_buckets(tmp_path: Path) -> None:
    dump, now = _dump(6000, seed=6, entries_per_ledger=50)
    unmerged, merged = _config(), _config(max_num_buckets=4)
    plain, bounded = FileStorage(tmp_path / "plain"), FileStorage(tmp_path / "bounded")
    first = rebuild_local(dump, plain, NAME, unmerged, now_ms=now)
    report = rebuild_local(dump, bounded, NAME, merged, now_ms=now)
    assert first.planned_buckets == report.planned_buckets == len(first.buckets) > 10
    assert len(report.buckets) <= 4
    assert report.ranges == _ranges(bounded) == _plan(dump, merged, now)
    assert sum(b.num_messages for b in report.buckets) == report.tracked == first.tracked
    assert verify_store(bounded, NAME, dump, merged, now_ms=now).ok
    # Delivery is a global (time, ledger, entry) order: bucket boundaries do not change it.
    schedule = _schedule(dump, unmerged, now)
    assert _drain(bounded, merged, now, schedule) == _drain(plain, unmerged, now, schedule)


# -- rebuild_local ---------------------------------------------------------------------------------


def test_rebuild_is_idempotent_and_replaces_what_was_there(tmp_path: Path) -> None:
    dump, now = _dump(5000, seed=7, entries_per_ledger=40)
    config, storage = _config(), FileStorage(tmp_path)
    calls: list[tuple[str, int, int]] = []
    first = rebuild_local(dump, storage, NAME, config, now_ms=now, mark_delete=(3, 2))
    contents = [storage.get_segment_arrays(b.snapshot_id, 1, b.num_segments) for b in first.buckets]
    again = rebuild_local(
        dump,
        storage,
        NAME,
        config,
        now_ms=now,
        mark_delete=(3, 2),
        progress=lambda *args: calls.append(args),
    )
    assert again.ranges == first.ranges
    assert set(again.replaced) == {b.snapshot_id for b in first.buckets}
    assert calls == [("buckets", k, len(again.buckets)) for k in range(1, len(again.buckets) + 1)]
    manifest = storage.read_manifest(NAME)
    assert manifest.intents == () and manifest.mark_delete == (3, 2)
    assert {o.id for o in storage.list_objects()} == {b.snapshot_id for b in again.buckets}
    for old, new, arrays in zip(first.buckets, again.buckets, contents, strict=True):
        # Same content; the bytes differ by the stamped generation (compressed metadata).
        assert (old.num_messages, old.num_segments) == (new.num_messages, new.num_segments)
        assert abs(old.snapshot_bytes - new.snapshot_bytes) <= 8
        assert storage.get_metadata(new.snapshot_id).index_name == NAME
        assert storage.get_metadata(new.snapshot_id).generation > 0
        now_held = storage.get_segment_arrays(new.snapshot_id, 1, new.num_segments)
        assert all(np.array_equal(a, b) for a, b in zip(arrays, now_held, strict=True))
    # A rebuild without a mark clears the old one; nothing tracked leaves no bucket at all.
    empty = rebuild_local(dump, storage, NAME, config, now_ms=now + 1000 * 24 * HOUR)
    assert empty.buckets == () and empty.tracked == 0 and empty.due > 0
    assert storage.read_manifest(NAME).mark_delete is None
    assert storage.list_objects() == []


def test_rebuild_report_counts_and_json(tmp_path: Path) -> None:
    dump, now = _dump(3000, seed=8, entries_per_ledger=30)
    report = rebuild_local(
        dump, FileStorage(tmp_path), NAME, _config(), now_ms=now, mark_delete=(10, 0)
    )
    assert isinstance(report, RebuildReport)
    assert (
        report.rows == len(dump) == report.tracked + report.not_delayed + report.due + report.acked
    )
    assert min(report.not_delayed, report.due, report.acked, report.tracked) > 0
    data = json.loads(report.to_json())
    assert data["mark_delete"] == [10, 0]
    assert data["snapshot_bytes"] == report.snapshot_bytes > 0
    assert [(b["start_ledger"], b["end_ledger"]) for b in data["buckets"]] == report.ranges


def test_rebuild_rejects_bad_input_before_touching_the_store(tmp_path: Path) -> None:
    storage, config = FileStorage(tmp_path), _config()
    duplicate = Cols.of([1, 2, 1], [0, 0, 0], [10**15, 10**15, 10**15])
    with pytest.raises(ValueError, match=r"position \(1, 0\) appears twice \(rows 0 and 2\)"):
        rebuild_local(duplicate, storage, NAME, config, now_ms=0)
    with pytest.raises(ValueError, match="row 1: bad position"):
        rebuild_local(Cols.of([1, 1], [0, 2**32], [5, 5]), storage, NAME, config, now_ms=0)
    with pytest.raises(ValueError, match="index name"):
        rebuild_local(Cols.of([1], [0], [5]), storage, "bad/name", config, now_ms=0)
    with pytest.raises(TypeError, match="progress"):
        rebuild_local(Cols.of([1], [0], [5]), storage, NAME, config, now_ms=0, progress=3)  # type: ignore[arg-type]
    assert storage.list_objects() == [] and storage.list_manifests() == []
    with Catalog.open(storage, NAME), pytest.raises(StoreLockedError):
        rebuild_local(Cols.of([1], [0], [5]), storage, NAME, config, now_ms=0)


def test_failed_rebuild_rolls_back_and_keeps_the_old_index(tmp_path: Path) -> None:
    dump, now = _dump(4000, seed=9, entries_per_ledger=40)
    other, _ = _dump(4000, seed=10, entries_per_ledger=40)
    config = _config()
    rebuild_local(dump, FileStorage(tmp_path), NAME, config, now_ms=now, mark_delete=(2, 0))
    writes = 0

    def fail_third_object(step: str) -> None:
        nonlocal writes
        if step == "object.write":
            writes += 1
            if writes == 3:
                raise RuntimeError("disk on fire")

    storage = FileStorage(tmp_path, step_hook=fail_third_object)
    with pytest.raises(RuntimeError, match="disk on fire"):
        rebuild_local(other, storage, NAME, config, now_ms=now)
    storage.step_hook = None
    manifest = storage.read_manifest(NAME)
    assert manifest.intents == () and manifest.mark_delete == (2, 0)
    assert {o.id for o in storage.list_objects()} == manifest.live_ids()
    report = verify_store(
        storage, NAME, dump, config, now_ms=now, mark_delete=(2, 0), orphan_grace_ms=0
    )
    assert report.ok, report.findings


_KILLED_CHILD = textwrap.dedent(
    """
    import os, sys
    from delayindex import FileStorage
    from delayindex.config import TrackerConfig
    from delayindex.rebuild import rebuild_local
    from delayindex.workload import generate

    path, step, nth = sys.argv[1], sys.argv[2], int(sys.argv[3])
    seen = 0

    def kill(name):
        global seen
        if name == step:
            seen += 1
            if seen == nth:
                os._exit(9)  # no cleanup of any kind: as if the machine lost power

    w = generate(4000, seed=10, entries_per_ledger=40)
    config = TrackerConfig(min_index_count_per_bucket=150, max_num_buckets=0,
                           max_indexes_per_segment=40, max_time_step_per_segment_ms=20_000)
    rebuild_local(w, FileStorage(path, step_hook=kill), "topic", config,
                  now_ms=int(w.publish_ms[0]) + 20_000)
    sys.exit(3)  # the kill point was never reached
    """
)


@pytest.mark.parametrize(
    ("step", "nth", "survivor"),
    [("object.link", 2, "old"), ("manifest.dirsync", 2, "new")],  # mid-write, publish landed
)
def test_killed_rebuild_leaves_no_orphan_after_the_next_open(
    tmp_path: Path, step: str, nth: int, survivor: str
) -> None:
    old, now = _dump(4000, seed=9, entries_per_ledger=40)
    new, _ = _dump(4000, seed=10, entries_per_ledger=40)
    config = _config()
    rebuild_local(old, FileStorage(tmp_path), NAME, config, now_ms=now)
    env = {**os.environ, "PYTHONPATH": SRC}
    child = subprocess.run(
        [sys.executable, "-c", _KILLED_CHILD, str(tmp_path), step, str(nth)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert child.returncode == 9, child.stderr
    storage = FileStorage(tmp_path)
    assert storage.read_manifest(NAME).intents  # the kill left work for the repair
    Catalog.open(storage, NAME).close()  # the next open repairs
    manifest = storage.read_manifest(NAME)
    assert manifest.intents == ()
    assert {o.id for o in storage.list_objects()} == manifest.live_ids()
    assert find_garbage(storage, now_ms=0, grace_ms=0).orphans == ()
    expected = old if survivor == "old" else new
    report = verify_store(storage, NAME, expected, config, now_ms=now, orphan_grace_ms=0)
    assert report.ok, report.findings
    # A re-run finishes the job.
    rebuild_local(new, storage, NAME, config, now_ms=now)
    assert verify_store(storage, NAME, new, config, now_ms=now, orphan_grace_ms=0).ok


# -- verify_store ----------------------------------------------------------------------------------


@pytest.fixture
def rebuilt(tmp_path: Path) -> tuple[FileStorage, Cols, int, TrackerConfig]:
    dump, now = _dump(4000, seed=11, entries_per_ledger=40)
    config = _config()
    storage = FileStorage(tmp_path / "store")
    rebuild_local(dump, storage, NAME, config, now_ms=now)
    return storage, dump, now, config


def _tracked_rows(dump: Cols, config: TrackerConfig, now: int) -> np.ndarray:
    return np.flatnonzero(tracked_mask(dump, now_ms=now, config=config))


def test_verify_clean_store_is_ok(rebuilt: Any) -> None:
    storage, dump, now, config = rebuilt
    report = verify_store(storage, NAME, dump, config, now_ms=now)
    assert report.ok and report.findings == () and report.counts() == {}
    assert report.expected == report.found == len(_tracked_rows(dump, config, now))
    assert report.buckets == len(storage.read_manifest(NAME).buckets) > 1
    data = json.loads(report.to_json())
    assert data["ok"] is True and data["counts"] == {}


def test_verify_names_a_deleted_snapshot(rebuilt: Any) -> None:
    storage, dump, now, config = rebuilt
    victim = storage.read_manifest(NAME).buckets[1]
    storage.object_path(victim.snapshot_id).unlink()
    report = verify_store(FileStorage(storage.root), NAME, dump, config, now_ms=now)
    assert report.kinds() == {"missing_snapshot", "missing_position"}
    [missing] = [f for f in report.findings if f.kind == "missing_snapshot"]
    assert missing.snapshot_id == victim.snapshot_id
    assert report.counts()["missing_position"] == victim.num_messages


@pytest.mark.parametrize("where", ["magic", "middle", "last"])
def test_verify_names_a_flipped_byte(rebuilt: Any, where: str) -> None:
    storage, dump, now, config = rebuilt
    victim = storage.read_manifest(NAME).buckets[-1]
    path = storage.object_path(victim.snapshot_id)
    data = bytearray(path.read_bytes())
    offset = {"magic": 0, "middle": len(data) // 2, "last": len(data) - 1}[where]
    data[offset] ^= 0x10
    path.write_bytes(bytes(data))
    report = verify_store(FileStorage(storage.root), NAME, dump, config, now_ms=now)
    corrupt = [f for f in report.findings if f.kind == "corrupt_snapshot"]
    assert [f.snapshot_id for f in corrupt] == [victim.snapshot_id]
    assert not report.ok


def test_verify_names_missing_extra_and_wrong_positions(tmp_path: Path) -> None:
    dump, now = _dump(3000, seed=12, entries_per_ledger=40)
    config = _config()
    rows = _tracked_rows(dump, config, now)
    gone, moved = int(rows[5]), int(rows[-7])
    seeded = Cols(dump.ledger_ids.copy(), dump.entry_ids.copy(), dump.deliver_at.copy())
    seeded.deliver_at[moved] += 1
    seeded = seeded.where(np.arange(len(dump)) != gone)
    extra = Cols.of([int(dump.ledger_ids[-1]) + 1], [0], [now + HOUR])
    store_dump = Cols(
        *(
            np.concatenate([a, b])
            for a, b in zip(
                (seeded.ledger_ids, seeded.entry_ids, seeded.deliver_at),
                (extra.ledger_ids, extra.entry_ids, extra.deliver_at),
                strict=True,
            )
        )
    )
    storage = FileStorage(tmp_path)
    rebuild_local(store_dump, storage, NAME, config, now_ms=now)
    report = verify_store(storage, NAME, dump, config, now_ms=now)
    assert report.counts() == {"missing_position": 1, "extra_position": 1, "wrong_deliver_time": 1}
    by_kind = {f.kind: f.examples[0] for f in report.findings}
    assert by_kind["missing_position"] == {
        "ledger_id": int(dump.ledger_ids[gone]),
        "entry_id": int(dump.entry_ids[gone]),
        "deliver_at": int(dump.deliver_at[gone]),
    }
    assert (by_kind["extra_position"]["ledger_id"], by_kind["extra_position"]["entry_id"]) == (
        int(extra.ledger_ids[0]),
        0,
    )
    wrong = by_kind["wrong_deliver_time"]
    assert (wrong["ledger_id"], wrong["entry_id"]) == (
        int(dump.ledger_ids[moved]),
        int(dump.entry_ids[moved]),
    )
    assert wrong["deliver_at"] == wrong["expected_deliver_at"] + 1
    assert wrong["snapshot_id"] in storage.read_manifest(NAME).live_ids()


def test_verify_names_a_position_held_twice(tmp_path: Path) -> None:
    config, storage = _config(), FileStorage(tmp_path)
    dump = Cols.of([1, 1, 2], [0, 1, 0], [10_000, 20_000, 30_000])
    with Catalog.open(storage, NAME) as catalog:
        # Within one snapshot a position found twice is corruption (the bitmaps overlap).
        metadata, segments = build_bucket(
            np.array([10_000, 20_000, 900_000], dtype=np.int64),
            np.ones(3, dtype=np.int64),
            np.array([0, 1, 0], dtype=np.int64),
            1,
            1,
            config,
            validate=False,
        )
        twice = catalog.create_bucket(metadata, segments)
    report = verify_store(storage, NAME, dump, config, now_ms=0)
    assert [(f.kind, f.snapshot_id) for f in report.findings if f.snapshot_id] == [
        ("corrupt_snapshot", twice.snapshot_id)
    ]
    # Across snapshots: only a manifest that lies about a range lets two buckets share one.
    with Catalog.open(storage, NAME) as catalog:
        catalog.delete_bucket(twice.snapshot_id)
        catalog.create_bucket(
            *build_bucket(
                np.array([10_000, 20_000]), np.array([1, 1]), np.array([0, 1]), 1, 1, config
            )
        )
    with Catalog.open(storage, "scratch") as catalog:  # objects are shared by every name
        b = catalog.create_bucket(
            *build_bucket(
                np.array([90_000, 30_000]), np.array([1, 2]), np.array([0, 0]), 1, 2, config
            )
        )
    lying = replace(b, start_ledger=2)  # the object holds ledger 1 too
    storage.commit_manifest(NAME, storage.read_manifest(NAME).with_bucket(lying))
    report = verify_store(storage, NAME, dump, config, now_ms=0)
    assert report.counts() == {"manifest_mismatch": 2, "extra_position": 1}
    [extra] = [f for f in report.findings if f.kind == "extra_position"]
    assert extra.examples[0]["deliver_at"] == 90_000 and "second copies" in extra.message


def test_verify_lists_old_orphans_and_spares_young_ones(rebuilt: Any) -> None:
    storage, dump, now, config = rebuilt
    source = storage.object_path(storage.read_manifest(NAME).buckets[0].snapshot_id)
    shutil.copy(source, storage.object_path("leftover-1-2-abc"))
    os.utime(storage.object_path("leftover-1-2-abc"), (1_000_000, 1_000_000))  # 1970: old
    shutil.copy(source, storage.object_path("fresh-1-2-abc"))
    report = verify_store(storage, NAME, dump, config, now_ms=now)
    assert [(f.kind, f.snapshot_id) for f in report.findings] == [("orphan", "leftover-1-2-abc")]
    assert report.young_unreferenced == ("fresh-1-2-abc",)


def test_verify_names_manifest_mismatches(rebuilt: Any) -> None:
    storage, dump, now, config = rebuilt
    with Catalog.open(storage, NAME) as catalog:
        catalog.reserve_creates([(10**6, 10**6)])  # a reservation nobody published
    report = verify_store(storage, NAME, dump, config, now_ms=now, mark_delete=(1, 0))
    messages = [f.message for f in report.findings if f.kind == "manifest_mismatch"]
    assert len(messages) == 2
    assert any("pending create intent" in m for m in messages)
    assert any("mark-delete is None, expected (1, 0)" in m for m in messages)
    # The positions at or below the mark are not expected; the store still holds one of them.
    acked = tracked_mask(dump, now_ms=now, config=config) & (dump.ledger_ids == 1)
    acked &= dump.entry_ids == 0
    assert report.counts().get("extra_position", 0) == int(np.count_nonzero(acked))
    assert set(report.kinds()) <= set(FINDING_KINDS)


def test_rebuild_and_verify_a_dump_file_read_back(tmp_path: Path) -> None:
    from delayindex.dump import generate_dump, read_dump, write_dump  # needs the spark extra

    dump = generate_dump(3000, entries_per_ledger=40, seed=13)
    path = write_dump(tmp_path / "dump.parquet", dump)
    columns, rejects = read_dump(path)
    assert rejects.ok and len(columns) == len(dump)
    now, config, storage = int(dump.deliver_at.max()) - HOUR, _config(), FileStorage(tmp_path / "s")
    report = rebuild_local(columns, storage, NAME, config, now_ms=now)
    assert report.tracked == int(np.count_nonzero(dump.deliver_at > now + config.tick_ms)) > 0
    assert verify_store(storage, NAME, dump, config, now_ms=now).ok
