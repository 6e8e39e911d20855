"""The two-phase Catalog: every crash point of create/merge/delete (and of the repair after it).

A crash is simulated by a ``crash_hook`` that raises SimulatedCrash at the k-th protocol step;
the catalog object is then abandoned, the "process" restarted (MemoryStorage: its locks are
broken; FileStorage: the instance is closed, which drops its flocks as the kernel would, and a
new one opened on the directory) and the name reopened. After every crash, and after every crash
*during* the repair of a crash, the reopened state must satisfy:

* no orphan: the stored objects are exactly the manifest's live buckets (no intents left);
* no lost bucket: every bucket live before the operation is live, readable and unchanged,
  unless the operation removed it, and the sources of a merge stay live until the merge is.
"""

from __future__ import annotations

import contextlib
import errno
import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from delayindex import ManualClock
from delayindex.errors import (
    CommitOutcomeUnknownError,
    ManifestConflictError,
    SnapshotCorruptError,
    StorageError,
    StoreLockedError,
)
from delayindex.snapshot.format import Segment, SnapshotMetadata, build_snapshot
from delayindex.storage import (
    KEY_PATTERN,
    BucketRecord,
    Catalog,
    FileStorage,
    Intent,
    MemoryStorage,
    encode_manifest,
)

NAME = "orders"
Snapshot = tuple[SnapshotMetadata, Sequence[Segment]]
Triples = tuple[np.ndarray, np.ndarray, np.ndarray]


class SimulatedCrash(BaseException):
    """Raised by the crash hook: the process dies at this step."""


def _triples(first_ledger: int, seed: int, n: int = 60) -> Triples:
    rng = np.random.default_rng(seed)
    return (
        rng.integers(1_000_000, 1_200_000, n),
        rng.integers(first_ledger, first_ledger + 4, n),
        np.arange(n),
    )


def _build(*parts: Triples) -> Snapshot:
    times, ledgers, entries = (np.concatenate(column) for column in zip(*parts, strict=True))
    return build_snapshot(
        times, ledgers, entries, max_time_step_ms=30_000, max_indexes_per_segment=8
    )


A, B, C, D = _triples(10, 1), _triples(20, 2), _triples(30, 3), _triples(40, 4)
CONTENT: dict[tuple[int, int], Snapshot] = {
    (10, 13): _build(A),
    (20, 23): _build(B),
    (30, 33): _build(C),
    (40, 43): _build(D),
    (10, 23): _build(A, B),  # the merge of A and B
}


class Env:
    """A storage plus what a restart and a failing create mean for its backend."""

    def __init__(self, kind: str, path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        self.kind, self.path, self.monkeypatch = kind, path, monkeypatch
        self.storage: MemoryStorage | FileStorage = (
            MemoryStorage() if kind == "memory" else FileStorage(path)
        )

    def restart(self) -> None:
        """The process died and a new one starts on the same storage (its disk faults gone)."""
        if isinstance(self.storage, MemoryStorage):
            self.storage.break_locks()
        else:
            self.monkeypatch.undo()
            self.storage.close()
            self.storage = FileStorage(self.path)

    def fail_creates(self, times: int, *, after: bool) -> None:
        """The next ``times`` create attempts fail (``after``: the object lands, no ack)."""
        if isinstance(self.storage, MemoryStorage):
            self.storage.inject_failure("create", times=times, after=after)
            return
        name = "fsync" if after else "link"
        real, left = getattr(os, name), [times]

        def flaky(*args: Any) -> Any:
            if left[0] and (
                not after or os.readlink(f"/proc/self/fd/{args[0]}").endswith("/objects")
            ):
                left[0] -= 1
                raise OSError(errno.EIO, f"test: {name} failed")
            return real(*args)

        self.monkeypatch.setattr(os, name, flaky)

    def close(self) -> None:
        self.monkeypatch.undo()
        self.storage.close()


@pytest.fixture(params=["memory", "file"])
def make_env(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Callable[[], Env]]:
    """``make_env()`` builds a fresh Env of the parametrized backend (several per test)."""
    envs: list[Env] = []

    def make() -> Env:
        envs.append(Env(request.param, tmp_path / f"store{len(envs)}", monkeypatch))
        return envs[-1]

    yield make
    for env in envs:
        env.close()


def _prepare(env: Env) -> dict[str, str]:
    """Three live buckets A [10,13], B [20,23], C [30,33]; returns their ids by letter."""
    with Catalog.open(env.storage, NAME) as catalog:
        return {
            letter: catalog.create_bucket(*CONTENT[rng]).snapshot_id
            for letter, rng in (("A", (10, 13)), ("B", (20, 23)), ("C", (30, 33)))
        }


def _check(env: Env, live_ranges: list[tuple[int, int]]) -> Catalog:
    """Reopen and assert the invariants; returns the (open) catalog."""
    catalog = Catalog.open(env.storage, NAME)
    manifest = catalog.manifest
    assert manifest.intents == () and manifest.dead_letters == ()
    objects = {o.id for o in env.storage.list_objects()}
    assert objects == manifest.live_ids(), "orphaned or missing snapshot objects"
    assert catalog.repair_report.missing_objects == ()
    assert [(b.start_ledger, b.end_ledger) for b in manifest.buckets] == live_ranges
    for bucket in manifest.buckets:
        metadata, segments = CONTENT[(bucket.start_ledger, bucket.end_ledger)]
        assert env.storage.get_metadata(bucket.snapshot_id) == metadata
        assert env.storage.get_segments(bucket.snapshot_id, 1, bucket.num_segments) == segments
        assert bucket.num_messages == metadata.num_messages
        assert bucket.snapshot_bytes == env.storage.length(bucket.snapshot_id)
    return catalog


@dataclass(frozen=True)
class Scenario:
    """An operation on the prepared catalog, its step names, and the outcome per crash point."""

    run: Callable[[Catalog, Env, dict[str, str]], object]
    steps: list[str]
    live_before: list[tuple[int, int]]  # live ranges if the crash comes before step `flips_at`
    live_after: list[tuple[int, int]]
    flips_at: int
    raises: type[BaseException] | None = None
    notes: list[str] = field(default_factory=list)


ABC = [(10, 13), (20, 23), (30, 33)]
DELETE_STEPS = ["delete.object_deleted", "delete.intent_dropped"]
CREATE_STEPS = ["create.begin", "create.intent_committed", "create.object_written"]


def _failed_merge(after: bool) -> Callable[[Catalog, Env, dict[str, str]], object]:
    def run(catalog: Catalog, env: Env, ids: dict[str, str]) -> object:
        env.fail_creates(4, after=after)
        return catalog.create_bucket(*CONTENT[(10, 23)], replaces=(ids["A"], ids["B"]))

    return run


SCENARIOS = {
    "create": Scenario(
        run=lambda catalog, env, ids: catalog.create_bucket(*CONTENT[(40, 43)]),
        steps=[*CREATE_STEPS, "create.bucket_live"],
        live_before=ABC,
        live_after=[*ABC, (40, 43)],
        flips_at=3,
    ),
    "merge": Scenario(
        run=lambda catalog, env, ids: catalog.create_bucket(
            *CONTENT[(10, 23)], replaces=(ids["A"], ids["B"])
        ),
        steps=[*CREATE_STEPS, "create.bucket_live", *DELETE_STEPS, *DELETE_STEPS],
        live_before=ABC,
        live_after=[(10, 23), (30, 33)],
        flips_at=3,
    ),
    "delete": Scenario(
        run=lambda catalog, env, ids: catalog.delete_bucket(ids["A"]),
        steps=["delete.begin", "delete.intent_committed", *DELETE_STEPS],
        live_before=ABC,
        live_after=[(20, 23), (30, 33)],
        flips_at=1,
    ),
    "failed_merge": Scenario(
        run=_failed_merge(after=False),
        steps=["create.begin", "create.intent_committed", "create.rolled_back", *DELETE_STEPS],
        live_before=ABC,
        live_after=ABC,
        flips_at=99,
        raises=StorageError,
    ),
    "failed_merge_object_written": Scenario(
        run=_failed_merge(after=True),
        steps=["create.begin", "create.intent_committed", "create.rolled_back", *DELETE_STEPS],
        live_before=ABC,
        live_after=ABC,
        flips_at=99,
        raises=StorageError,
    ),
}
CRASH_POINTS = [(name, k) for name, s in SCENARIOS.items() for k in range(len(s.steps))]


def _crashing_hook(steps: list[str], crash_at: int | None) -> Callable[[str], None]:
    """A crash hook that records each step in ``steps`` and dies at step number ``crash_at``."""

    def hook(step: str) -> None:
        steps.append(step)
        if len(steps) - 1 == crash_at:
            raise SimulatedCrash(step)

    return hook


def _run(env: Env, scenario: Scenario, ids: dict[str, str], crash_at: int | None) -> list[str]:
    """Run the scenario on a fresh catalog, crashing at step ``crash_at``; return the steps seen."""
    steps: list[str] = []
    catalog = Catalog.open(env.storage, NAME, crash_hook=_crashing_hook(steps, crash_at))
    assert steps == []  # nothing to repair after _prepare
    if crash_at is not None:
        with pytest.raises(SimulatedCrash):
            scenario.run(catalog, env, ids)
    elif scenario.raises is not None:
        with pytest.raises(scenario.raises):
            scenario.run(catalog, env, ids)
        catalog.close()
    else:
        scenario.run(catalog, env, ids)
        catalog.close()
    return steps


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_steps_without_a_crash(make_env: Callable[[], Env], name: str) -> None:
    scenario = SCENARIOS[name]
    env = make_env()
    ids = _prepare(env)
    assert _run(env, scenario, ids, None) == scenario.steps
    _check(env, scenario.live_after).close()


@pytest.mark.parametrize(("name", "crash_at"), CRASH_POINTS)
def test_crash_then_repair(make_env: Callable[[], Env], name: str, crash_at: int) -> None:
    scenario = SCENARIOS[name]
    expected = scenario.live_before if crash_at < scenario.flips_at else scenario.live_after
    env = make_env()
    ids = _prepare(env)
    steps = _run(env, scenario, ids, crash_at)
    assert steps == scenario.steps[: crash_at + 1]
    env.restart()
    catalog = _check(env, expected)
    if crash_at < scenario.flips_at:  # the sources (A, B) are untouched
        assert {ids["A"], ids["B"]} <= catalog.manifest.live_ids() or name == "delete"
    assert ids["C"] in catalog.manifest.live_ids()  # never involved, never lost
    catalog.close()


@pytest.mark.parametrize(("name", "crash_at"), CRASH_POINTS)
def test_crash_during_repair(make_env: Callable[[], Env], name: str, crash_at: int) -> None:
    """Crash at step k, then crash again at each step of the repair; the next open must cope."""
    scenario = SCENARIOS[name]
    expected = scenario.live_before if crash_at < scenario.flips_at else scenario.live_after
    repair_crash = 0
    while True:
        env = make_env()
        ids = _prepare(env)
        _run(env, scenario, ids, crash_at)
        env.restart()
        seen = _open_crashing_at(env, repair_crash)
        env.restart()
        _check(env, expected).close()
        if len(seen) <= repair_crash:  # the repair ran to its end: every step was crashed at
            break
        repair_crash += 1
    assert repair_crash == len(seen)


def _open_crashing_at(env: Env, index: int) -> list[str]:
    """Open the catalog with a hook that crashes at repair step ``index``; the steps seen."""
    seen: list[str] = []
    with contextlib.suppress(SimulatedCrash):
        Catalog.open(env.storage, NAME, crash_hook=_crashing_hook(seen, index)).close()
    return seen


def test_repair_report(make_env: Callable[[], Env]) -> None:
    env = make_env()
    ids = _prepare(env)
    _run(env, SCENARIOS["merge"], ids, crash_at=2)  # merged object written, not live
    env.restart()
    with Catalog.open(env.storage, NAME) as catalog:
        report = catalog.repair_report
        assert len(report.rolled_back) == 1 and report.rolled_back == report.completed_deletes
        assert report.pending_deletes == () and report.missing_objects == ()
        assert not report.clean
    env.restart()
    with Catalog.open(env.storage, NAME) as catalog:
        assert catalog.repair_report.clean


# -- failures without crashes (MemoryStorage injection) -----------------------------------------


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(1_000_000)


def _memory_catalog(clock: ManualClock, **kwargs: Any) -> tuple[MemoryStorage, Catalog]:
    storage = MemoryStorage()
    return storage, Catalog.open(storage, NAME, clock=clock, **kwargs)


def test_failed_delete_stays_pending_and_is_retried_with_backoff(clock: ManualClock) -> None:
    storage, catalog = _memory_catalog(clock, delete_retry_delay_ms=1_000)
    record = catalog.create_bucket(*CONTENT[(10, 13)])
    storage.inject_failure("delete", times=4)
    assert catalog.delete_bucket(record.snapshot_id) is False
    intent = catalog.manifest.intent(record.snapshot_id)
    assert intent is not None and intent.kind == "delete" and intent.attempts == 1
    assert intent.next_attempt_ms == 1_001_000 and "StorageError" in intent.last_error
    assert catalog.buckets() == []  # no longer live, but still referenced
    assert storage.read_manifest(NAME) == catalog.manifest  # the failure is durable
    assert [o.id for o in storage.list_objects()] == [record.snapshot_id]
    assert any("failed (attempt 1)" in p for p in catalog.problems())
    assert catalog.retry_pending_deletes().completed == ()  # not due yet
    storage.inject_failure("delete", times=4)
    clock.advance(1_000)
    report = catalog.retry_pending_deletes()
    assert report.failed == (record.snapshot_id,)
    intent = catalog.manifest.intent(record.snapshot_id)
    assert intent is not None and intent.attempts == 2 and intent.next_attempt_ms == 1_003_000
    clock.advance(2_000)
    assert catalog.retry_pending_deletes().completed == (record.snapshot_id,)
    assert catalog.manifest.intents == () and storage.list_objects() == []


def test_deletes_dead_letter_after_max_attempts(clock: ManualClock) -> None:
    storage, catalog = _memory_catalog(clock, max_delete_attempts=3, delete_retry_delay_ms=10)
    record = catalog.create_bucket(*CONTENT[(10, 13)])
    storage.inject_failure("delete", times=12)
    assert catalog.delete_bucket(record.snapshot_id) is False
    assert catalog.retry_pending_deletes(force=True).failed == (record.snapshot_id,)
    report = catalog.retry_pending_deletes(force=True)
    assert report.dead_lettered == (record.snapshot_id,)
    (dead,) = catalog.manifest.dead_letters
    assert dead.snapshot_id == record.snapshot_id and dead.attempts == 3
    assert catalog.manifest.intents == ()
    assert record.snapshot_id in catalog.manifest.referenced_ids()  # never forgotten
    catalog.close()
    with Catalog.open(storage, NAME) as reopened:  # dead letters survive and are kept
        assert reopened.manifest.dead_letters == (dead,)
        assert [o.id for o in storage.list_objects()] == [record.snapshot_id]


def test_failed_delete_during_repair_keeps_the_intent(clock: ManualClock) -> None:
    storage, catalog = _memory_catalog(clock)
    record = catalog.create_bucket(*CONTENT[(10, 13)])
    storage.inject_failure("delete", times=4)
    catalog.delete_bucket(record.snapshot_id)
    catalog.close()
    storage.inject_failure("delete", times=4)
    with Catalog.open(storage, NAME, clock=clock) as reopened:
        assert reopened.repair_report.pending_deletes == (record.snapshot_id,)
        intent = reopened.manifest.intent(record.snapshot_id)
        assert intent is not None and intent.attempts == 2
    with Catalog.open(storage, NAME, clock=clock) as reopened:
        assert reopened.repair_report.completed_deletes == (record.snapshot_id,)
        assert storage.list_objects() == []


def test_failed_merge_commit_rolls_back_and_keeps_sources(clock: ManualClock) -> None:
    """Step 3 (the commit that makes the merge live) fails: sources stay, no orphan."""
    armed = [False]

    def hook(step: str) -> None:
        if armed[0] and step == "create.object_written":
            # The commit and every re-read after it fail: its outcome is unknown.
            storage.inject_failure("manifest", times=4 + 4 * 8)

    storage, catalog = _memory_catalog(clock, crash_hook=hook)
    a = catalog.create_bucket(*CONTENT[(10, 13)])
    b = catalog.create_bucket(*CONTENT[(20, 23)])
    armed[0] = True
    with pytest.raises(CommitOutcomeUnknownError):
        catalog.create_bucket(*CONTENT[(10, 23)], replaces=(a.snapshot_id, b.snapshot_id))
    assert catalog.stale  # nothing is rolled back blindly: the next change re-reads first
    assert catalog.manifest.live_ids() == {a.snapshot_id, b.snapshot_id}
    assert len(storage.list_objects()) == 3  # the merged object, still referenced by its intent
    assert [i.kind for i in storage.read_manifest(NAME).intents] == ["create"]
    report = catalog.retry_pending_deletes()  # storage is back: finishes the rollback
    assert len(report.completed) == 1 and catalog.manifest.intents == ()
    assert {o.id for o in storage.list_objects()} == {a.snapshot_id, b.snapshot_id}
    catalog.close()
    with Catalog.open(storage, NAME) as reopened:
        assert reopened.repair_report.clean
        assert reopened.manifest.live_ids() == {a.snapshot_id, b.snapshot_id}


def test_failed_create_with_storage_back_rolls_back_in_place(clock: ManualClock) -> None:
    storage, catalog = _memory_catalog(clock)
    storage.inject_failure("create", times=4, after=True)  # written, but every ack lost
    with pytest.raises(StorageError, match="create of 'orders-10-13-"):
        catalog.create_bucket(*CONTENT[(10, 13)])
    assert catalog.manifest.intents == () and catalog.buckets() == []
    assert storage.list_objects() == []  # the written object was deleted by the rollback


def test_mismatched_segments_roll_back(clock: ManualClock) -> None:
    storage, catalog = _memory_catalog(clock)
    metadata, segments = CONTENT[(10, 13)]
    with pytest.raises(ValueError):
        catalog.create_bucket(metadata, segments[:-1])
    assert catalog.manifest.intents == () and storage.list_objects() == []


def test_manifest_written_behind_our_back_is_a_conflict(clock: ManualClock) -> None:
    storage, catalog = _memory_catalog(clock)
    record = catalog.create_bucket(*CONTENT[(10, 13)])
    rogue = storage.read_manifest(NAME).with_intent(Intent("delete", "rogue-1", 50, 60))
    storage.commit_manifest(NAME, rogue)  # bypasses the lock
    with pytest.raises(ManifestConflictError):
        catalog.create_bucket(*CONTENT[(20, 23)])
    assert catalog.manifest == storage.read_manifest(NAME)  # resynchronized
    assert {o.id for o in storage.list_objects()} == {record.snapshot_id}


def test_missing_object_is_reported_not_dropped(clock: ManualClock) -> None:
    storage, catalog = _memory_catalog(clock)
    record = catalog.create_bucket(*CONTENT[(10, 13)])
    catalog.close()
    storage.delete(record.snapshot_id)  # lost behind the catalog's back
    with Catalog.open(storage, NAME) as reopened:
        assert reopened.repair_report.missing_objects == (record.snapshot_id,)
        assert reopened.buckets() == [record]
        assert any("no snapshot object" in p for p in reopened.problems())


def test_corrupt_manifest_refuses_to_open_and_releases_the_lock() -> None:
    """Nothing to recover from: current manifest, every history copy and the object damaged."""
    storage = MemoryStorage()
    with Catalog.open(storage, NAME) as catalog:
        record = catalog.create_bucket(*CONTENT[(10, 13)])
    data = bytearray(encode_manifest(storage.read_manifest(NAME)))
    data[20] ^= 1
    storage.put_raw_manifest(NAME, bytes(data))
    for version in storage.raw_manifest_history(NAME):
        storage.put_raw_manifest_history(NAME, version, bytes(data))
    obj = bytearray(storage.raw_object(record.snapshot_id))
    obj[3] ^= 1
    storage.put_raw_object(record.snapshot_id, bytes(obj))
    with pytest.raises(SnapshotCorruptError, match=NAME):
        Catalog.open(storage, NAME)
    storage.lock(NAME).release()  # not left locked


# -- API rules ------------------------------------------------------------------------------------


def test_one_catalog_per_name(tmp_path: Path) -> None:
    storage = FileStorage(tmp_path)
    catalog = Catalog.open(storage, NAME)
    with pytest.raises(StoreLockedError, match="'orders'"):
        Catalog.open(storage, NAME)
    Catalog.open(storage, "payments").close()
    catalog.close()
    catalog.close()
    Catalog.open(storage, NAME).close()
    with pytest.raises(ValueError, match="closed"):
        catalog.create_bucket(*CONTENT[(10, 13)])
    storage.close()


def test_argument_checks_change_nothing(clock: ManualClock) -> None:
    storage, catalog = _memory_catalog(clock)
    a = catalog.create_bucket(*CONTENT[(10, 13)])
    version = catalog.manifest.version
    with pytest.raises(ValueError, match="not a live bucket"):
        catalog.create_bucket(*CONTENT[(20, 23)], replaces=("ghost",))
    with pytest.raises(ValueError, match="overlaps live buckets"):
        catalog.create_bucket(*CONTENT[(10, 23)])  # overlaps A without replacing it
    with pytest.raises(ValueError, match="repeats"):
        catalog.create_bucket(*CONTENT[(10, 23)], replaces=(a.snapshot_id, a.snapshot_id))
    with pytest.raises(ValueError, match="not a live bucket"):
        catalog.delete_bucket("ghost")
    with pytest.raises(TypeError):
        catalog.create_bucket("metadata", [])  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="bad catalog name"):
        Catalog.open(storage, "../x")
    with pytest.raises(ValueError, match="max_delete_attempts"):
        Catalog.open(storage, "other", max_delete_attempts=0)
    assert catalog.manifest.version == version and storage.read_manifest(NAME).version == version


def test_keys_are_derived_from_the_name_and_range(clock: ManualClock) -> None:
    storage, catalog = _memory_catalog(clock)
    record = catalog.create_bucket(*CONTENT[(10, 13)])
    assert record.snapshot_id.startswith("orders-10-13-")
    long_name = "n" * 200
    with Catalog.open(storage, long_name) as other:
        key = other.create_bucket(*CONTENT[(20, 23)]).snapshot_id
    assert len(key) == 200 and KEY_PATTERN.fullmatch(key) and key.endswith(key[-13:])
    assert key.startswith("n" * 100) and "-20-23-" in key


def test_buckets_and_manifest_views(clock: ManualClock) -> None:
    storage, catalog = _memory_catalog(clock)
    b = catalog.create_bucket(*CONTENT[(20, 23)])
    a = catalog.create_bucket(*CONTENT[(10, 13)])
    assert catalog.buckets() == [a, b]  # ledger order, not creation order
    assert catalog.manifest.version == storage.read_manifest(NAME).version == 4  # two commits each
    assert repr(catalog) == "Catalog('orders', v4, buckets=2)"


# -- group commit: apply_batch ------------------------------------------------------------------

E = _triples(50, 5)
CONTENT[(50, 53)] = _build(E)
BATCH_STEPS = ["batch.begin", "batch.intents_committed", "batch.objects_written", "batch.committed"]


def _run_batch(env: Env, ids: dict[str, str], crash_at: int | None) -> tuple[list[str], Any]:
    steps: list[str] = []
    catalog = Catalog.open(env.storage, NAME, crash_hook=_crashing_hook(steps, crash_at))
    try:
        result = catalog.apply_batch([CONTENT[(40, 43)], CONTENT[(50, 53)]], [ids["A"], ids["B"]])
    except SimulatedCrash:
        return steps, None
    catalog.close()
    return steps, result


def test_batch_two_commits_and_results_in_order(make_env: Callable[[], Env]) -> None:
    env = make_env()
    ids = _prepare(env)
    before = env.storage.stats()["commit_manifest"]["calls"]
    steps, result = _run_batch(env, ids, None)
    assert steps == BATCH_STEPS
    assert env.storage.stats()["commit_manifest"]["calls"] - before == 2 == result.commits
    assert [(r.start_ledger, r.end_ledger) for r in result.created] == [(40, 43), (50, 53)]
    assert result.deleted == (True, True)
    _check(env, [(30, 33), (40, 43), (50, 53)]).close()


@pytest.mark.parametrize("crash_at", range(len(BATCH_STEPS)))
def test_batch_crash_then_repair(make_env: Callable[[], Env], crash_at: int) -> None:
    env = make_env()
    ids = _prepare(env)
    steps, _ = _run_batch(env, ids, crash_at)
    assert steps == BATCH_STEPS[: crash_at + 1]
    env.restart()
    # Before the first commit nothing changed; after it the deletes are decided (rolled
    # forward) and the creates are not live until the second commit (rolled back).
    expected = {
        0: [(10, 13), (20, 23), (30, 33)],
        1: [(30, 33)],
        2: [(30, 33)],
        3: [(30, 33), (40, 43), (50, 53)],
    }[crash_at]
    _check(env, expected).close()


def test_batch_failed_create_is_rolled_back_alone(make_env: Callable[[], Env]) -> None:
    env = make_env()
    ids = _prepare(env)
    with Catalog.open(env.storage, NAME) as catalog:
        env.fail_creates(4, after=False)  # every attempt of the first create fails
        result = catalog.apply_batch([CONTENT[(40, 43)], CONTENT[(50, 53)]], [ids["C"]])
        assert isinstance(result.created[0], StorageError)
        assert isinstance(result.created[1], BucketRecord)  # narrows: a record, not an error
        assert (result.created[1].start_ledger, result.created[1].end_ledger) == (50, 53)
        assert result.deleted == (True,)
    env.monkeypatch.undo()
    _check(env, [(10, 13), (20, 23), (50, 53)]).close()


def test_batch_failed_delete_stays_pending() -> None:
    clock = ManualClock(5_000)
    storage = MemoryStorage()
    with Catalog.open(storage, NAME, clock=clock, delete_retry_delay_ms=100) as catalog:
        a = catalog.create_bucket(*CONTENT[(10, 13)]).snapshot_id
        storage.inject_failure("delete", times=4)
        result = catalog.apply_batch([CONTENT[(40, 43)]], [a])
        assert result.deleted == (False,) and result.commits == 2
        intent = catalog.manifest.intent(a)
        assert intent is not None and intent.attempts == 1 and intent.next_attempt_ms == 5_100
        # An id that is only a pending intent is retried by the next batch; unknown ids are done.
        again = catalog.apply_batch([], [a, "never-existed"])
        assert again.deleted == (True, True)
        assert {o.id for o in storage.list_objects()} == catalog.manifest.live_ids()


@pytest.mark.parametrize(
    ("creates", "deletes", "match"),
    [
        ([], ["A", "A"], "repeats"),
        ([], ["bad/id"], "bad snapshot id"),
    ],
)
def test_batch_bad_requests_change_nothing(
    creates: list[tuple[int, int]], deletes: list[str], match: str
) -> None:
    storage = MemoryStorage()
    with Catalog.open(storage, NAME) as catalog:
        ids = {"A": catalog.create_bucket(*CONTENT[(10, 13)]).snapshot_id}
        before = catalog.manifest
        with pytest.raises(ValueError, match=match):
            catalog.apply_batch([CONTENT[r] for r in creates], [ids.get(d, d) for d in deletes])
        assert catalog.manifest == before == storage.read_manifest(NAME)
        assert {o.id for o in storage.list_objects()} == {ids["A"]}


def test_batch_first_commit_failure_raises_and_changes_nothing() -> None:
    storage = MemoryStorage()
    with Catalog.open(storage, NAME) as catalog:
        a = catalog.create_bucket(*CONTENT[(10, 13)]).snapshot_id
        storage.inject_failure("manifest", times=8)  # the commit and the re-read after it
        with pytest.raises(StorageError):
            catalog.apply_batch([CONTENT[(40, 43)]], [a])
        assert storage.read_manifest(NAME).live_ids() == {a}
        assert {o.id for o in storage.list_objects()} == {a}


def test_retry_dead_letters_requeues_and_deletes() -> None:
    storage = MemoryStorage()
    with Catalog.open(storage, NAME, max_delete_attempts=1) as catalog:
        a = catalog.create_bucket(*CONTENT[(10, 13)]).snapshot_id
        storage.inject_failure("delete", times=4)
        assert catalog.delete_bucket(a) is False
        assert [d.snapshot_id for d in catalog.manifest.dead_letters] == [a]
        with pytest.raises(ValueError, match="not dead letters"):
            catalog.retry_dead_letters(["nope"])
        report = catalog.retry_dead_letters()
        assert report.completed == (a,) and catalog.manifest.dead_letters == ()
        assert storage.list_objects() == [] and catalog.manifest.intents == ()
        assert catalog.retry_dead_letters().completed == ()


def test_writer_status_rides_on_commits() -> None:
    from delayindex.storage import WriterStatus

    storage = MemoryStorage()
    with Catalog.open(storage, NAME) as catalog:
        status = WriterStatus(unpersisted=12, memory_mode_buckets=1, as_of_ms=99)
        catalog.note_writer_status(status)
        assert storage.read_manifest(NAME).writer_status is None  # never committed on its own
        catalog.create_bucket(*CONTENT[(10, 13)])
        assert storage.read_manifest(NAME).writer_status == status


def test_batch_overlapping_creates_fail_alone() -> None:
    storage = MemoryStorage()
    with Catalog.open(storage, NAME) as catalog:
        a = catalog.create_bucket(*CONTENT[(10, 13)]).snapshot_id
        result = catalog.apply_batch([CONTENT[(10, 23)], CONTENT[(40, 43)], CONTENT[(40, 43)]], [])
        first, second, third = result.created
        assert isinstance(first, ValueError) and "overlaps" in str(first)  # the live A
        assert not isinstance(second, Exception)
        assert isinstance(third, ValueError)  # the create before it in the batch
        assert catalog.manifest.live_ids() == {a, second.snapshot_id}
        assert {o.id for o in storage.list_objects()} == catalog.manifest.live_ids()


def _lose_acks_at(storage: MemoryStorage, step: str) -> Callable[[str], None]:
    """A hook that, at ``step``, makes the next commit land with every acknowledgement lost and
    every re-read after it fail: the commit's outcome is unknown."""

    def hook(seen: str) -> None:
        if seen == step:
            storage.inject_failure("manifest", times=4, after=True)
            storage.inject_failure("manifest", times=4 * 8)

    return hook


def test_batch_commit_with_unknown_outcome_is_acknowledged_by_the_retry() -> None:
    storage = MemoryStorage()
    catalog = Catalog.open(
        storage, NAME, crash_hook=_lose_acks_at(storage, "batch.objects_written")
    )
    result = catalog.apply_batch([CONTENT[(40, 43)]], [])
    [outcome] = result.created
    assert isinstance(outcome, CommitOutcomeUnknownError) and catalog.stale
    [live] = storage.read_manifest(NAME).buckets  # it did land
    catalog._crash_hook = None
    again = catalog.apply_batch([CONTENT[(40, 43)]], [])  # resyncs, then finds it live
    assert again.created == (live,) and again.commits == 0 and not catalog.stale
    assert {o.id for o in storage.list_objects()} == {live.snapshot_id}
    catalog.close()


def test_merge_commit_with_unknown_outcome_raises_and_resync_tells() -> None:
    storage = MemoryStorage()
    with Catalog.open(storage, NAME) as catalog:
        a = catalog.create_bucket(*CONTENT[(10, 13)]).snapshot_id
        b = catalog.create_bucket(*CONTENT[(20, 23)]).snapshot_id
    catalog = Catalog.open(
        storage, NAME, crash_hook=_lose_acks_at(storage, "create.object_written")
    )
    with pytest.raises(CommitOutcomeUnknownError) as caught:
        catalog.create_bucket(*CONTENT[(10, 23)], replaces=(a, b))
    assert a in caught.value.snapshot_ids and b in caught.value.snapshot_ids
    assert {a, b} <= {o.id for o in storage.list_objects()}  # sources not deleted blindly
    catalog._crash_hook = None
    manifest = catalog.resync()
    [merged] = manifest.buckets
    assert (merged.start_ledger, merged.end_ledger) == (10, 23)
    assert {i.snapshot_id for i in manifest.intents} == {a, b}  # now delete intents
    catalog.retry_pending_deletes(force=True)
    assert {o.id for o in storage.list_objects()} == {merged.snapshot_id}
    catalog.close()


# -- bulk creates written by someone else (offline rebuild) ----------------------------------------


def _write(storage: Any, key: str, snapshot: Snapshot) -> Any:
    from delayindex.storage import BucketRecord

    metadata, segments = snapshot
    storage.create(metadata, segments, key)
    return BucketRecord(
        metadata.start_ledger, metadata.end_ledger, key, metadata.num_messages,
        metadata.num_segments, storage.length(key),
    )  # fmt: skip


def test_reserve_then_publish_replacing_the_live_buckets(make_env: Callable[[], Env]) -> None:
    env = make_env()
    ids = _prepare(env)
    with Catalog.open(env.storage, NAME) as catalog:
        with pytest.raises(ValueError, match="overlaps a live bucket"):
            catalog.reserve_creates([(10, 23)])
        keys = catalog.reserve_creates([(10, 23), (40, 43)], replacing_live=True)
        ranges = [(10, 23), (40, 43)]
        records = [_write(env.storage, k, CONTENT[r]) for k, r in zip(keys, ranges, strict=True)]
        assert catalog.manifest.live_ids() == set(ids.values())  # untouched until publish
        replaced = catalog.publish_creates(records, replace_live=True)
        assert sorted(replaced) == sorted(ids.values())
    _check(env, [(10, 23), (40, 43)]).close()


@pytest.mark.parametrize("crash_after", ["reserve.committed", "written"])
def test_killed_bulk_create_leaves_no_orphan(make_env: Callable[[], Env], crash_after: str) -> None:
    env = make_env()
    ids = _prepare(env)
    catalog = Catalog.open(env.storage, NAME)
    keys = catalog.reserve_creates([(40, 43)])
    if crash_after == "written":
        _write(env.storage, keys[0], CONTENT[(40, 43)])
    env.restart()  # the job dies: the catalog is abandoned
    _check(env, [(10, 13), (20, 23), (30, 33)]).close()
    assert set(ids.values()) == {o.id for o in env.storage.list_objects()}


def test_publish_checks_what_was_written() -> None:
    from delayindex.storage import BucketRecord

    storage = MemoryStorage()
    with Catalog.open(storage, NAME) as catalog:
        [key] = catalog.reserve_creates([(40, 43)])
        metadata, _ = CONTENT[(40, 43)]
        missing = BucketRecord(40, 43, key, metadata.num_messages, metadata.num_segments, 10)
        with pytest.raises(ValueError, match="not written"):
            catalog.publish_creates([missing])
        record = _write(storage, key, CONTENT[(40, 43)])
        with pytest.raises(ValueError, match="bytes"):
            catalog.publish_creates([replace_size(record, record.snapshot_bytes + 1)])
        with pytest.raises(ValueError, match="not a reserved create"):
            catalog.publish_creates([replace_size(record, 0, snapshot_id="other-40-43")])
        catalog.publish_creates([record])
        assert catalog.manifest.live_ids() == {key} and catalog.manifest.intents == ()


def replace_size(record: Any, size: int, **changes: Any) -> Any:
    from dataclasses import replace

    return replace(record, snapshot_bytes=max(size, 1), **changes)
