"""MemoryStorage's random fault mode (``set_fault_rate``): per-call failures, lost acks, seeds.

A call chosen to fail must fail on every attempt (so the caller sees ``StorageError``); a share
of the failures of create, delete and commit_manifest take effect before raising. The storage's
own ``stats()`` counts attempts, so "one call, four failed attempts" is checked from the outside.
"""

from __future__ import annotations

import contextlib
import itertools
import threading
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import numpy as np
import pytest

from delayindex.errors import ManifestConflictError, StorageError
from delayindex.snapshot.format import Segment, SnapshotMetadata, build_snapshot
from delayindex.storage import MAX_ATTEMPTS, Manifest, MemoryStorage
from delayindex.storage.base import OPS
from delayindex.storage.memory import AFTER_EFFECT_OPS

Snapshot = tuple[SnapshotMetadata, list[Segment]]
NAME = "faults"


def make_snapshot(n: int = 60) -> Snapshot:
    rng = np.random.default_rng(3)
    times = rng.integers(1_000_000, 1_100_000, n)
    metadata, segments = build_snapshot(
        times, np.full(n, 7), np.arange(n), max_time_step_ms=20_000, max_indexes_per_segment=10
    )
    return metadata, list(segments)


SNAP = make_snapshot()


def seeded_storage() -> MemoryStorage:
    """A storage holding object "obj" and a committed manifest (version 1) of NAME."""
    storage = MemoryStorage()
    storage.create(*SNAP, "obj")
    storage.commit_manifest(NAME, Manifest(NAME))
    return storage


_keys = itertools.count()

# One call of every operation (keys must cover OPS; see test_every_op_is_covered). Every call
# can be repeated: creates use fresh keys, deleting "obj" twice is fine (missing = success).
CALLS: dict[str, Callable[[MemoryStorage], Any]] = {
    "create": lambda s: s.create(*SNAP, f"new-{next(_keys)}"),
    "get_metadata": lambda s: s.get_metadata("obj"),
    "get_segments": lambda s: s.get_segments("obj", 1, 2),
    "length": lambda s: s.length("obj"),
    "delete": lambda s: s.delete("obj"),
    "list_objects": lambda s: s.list_objects(),
    "list_manifests": lambda s: s.list_manifests(),
    "read_manifest": lambda s: s.read_manifest(NAME),
    "commit_manifest": lambda s: s.commit_manifest(NAME, s.read_manifest(NAME)),
    "lock": lambda s: s.lock(NAME).release(),
}


def total_faults(storage: MemoryStorage, op: str) -> int:
    return sum(storage.fault_counts()[op].values())


def test_every_op_is_covered() -> None:
    assert set(OPS) <= set(CALLS)
    counts = MemoryStorage().fault_counts()
    assert set(counts) == set(OPS)
    assert all(c == {"before": 0, "after": 0} for c in counts.values())


@pytest.mark.parametrize("op", OPS)
def test_rate_zero_is_off_and_turns_a_rate_off(op: str) -> None:
    storage = seeded_storage()
    assert storage.fault_rate == 0.0
    storage.set_fault_rate(0.9, seed=1)
    assert storage.fault_rate == 0.9
    storage.set_fault_rate(0)
    assert storage.fault_rate == 0.0
    for _ in range(20):  # at 0.9, twenty calls in a row would not all pass
        CALLS[op](storage)
    stats = storage.stats()[op]
    assert stats["calls"] >= 20
    assert stats["failures"] == stats["gave_up"] == 0
    assert total_faults(storage, op) == 0


@pytest.mark.parametrize("op", OPS)
def test_rate_one_fails_every_call_on_every_attempt(op: str) -> None:
    storage = seeded_storage()
    objects = storage.list_objects()
    manifest = storage.read_manifest(NAME)
    before = storage.stats()[op]
    storage.set_fault_rate(1.0, seed=0, ops=[op], after_share=0.0)
    for _ in range(3):
        with pytest.raises(StorageError, match=f"{op} of .* failed after {MAX_ATTEMPTS} attempts"):
            CALLS[op](storage)
    after = storage.stats()[op]
    assert after["calls"] - before["calls"] == 3
    assert after["gave_up"] - before["gave_up"] == 3
    assert after["attempts"] - before["attempts"] == 3 * MAX_ATTEMPTS
    assert after["failures"] - before["failures"] == 3 * MAX_ATTEMPTS
    assert storage.fault_counts()[op] == {"before": 3, "after": 0}
    storage.set_fault_rate(0)
    # Failed before the effect: nothing changed, and a lock was not left held.
    assert storage.list_objects() == objects
    assert storage.read_manifest(NAME) == manifest
    storage.lock(NAME).release()


def test_only_the_chosen_ops_fail() -> None:
    storage = seeded_storage()
    storage.set_fault_rate(1.0, ops=["length", "read_manifest"])
    with pytest.raises(StorageError):
        storage.length("obj")
    with pytest.raises(StorageError):
        storage.read_manifest(NAME)
    storage.get_metadata("obj")
    storage.list_objects()
    storage.create(*SNAP, "other")
    assert total_faults(storage, "length") == total_faults(storage, "read_manifest") == 1
    assert all(
        total_faults(storage, op) == 0 for op in OPS if op not in ("length", "read_manifest")
    )


def test_segment_arrays_share_the_get_segments_op() -> None:
    storage = seeded_storage()
    storage.set_fault_rate(1.0, ops=["get_segments"])
    with pytest.raises(StorageError):
        storage.get_segment_arrays("obj", 1, 3)
    assert storage.fault_counts()["get_segments"]["before"] == 1
    storage.set_fault_rate(0)
    times, _, _ = storage.get_segment_arrays("obj", 1, 3)
    assert len(times) == sum(len(s.times) for s in SNAP[1][:3])


def test_per_call_not_per_attempt() -> None:
    """Each call either succeeds at its first attempt or fails all of them."""
    storage = seeded_storage()
    storage.set_fault_rate(0.3, seed=11, ops=["length"])
    failed = 0
    for _ in range(500):
        try:
            storage.length("obj")
        except StorageError:
            failed += 1
    stats = storage.stats()["length"]
    assert 100 < failed < 200  # ~150 expected; fixed by the seed
    assert stats["gave_up"] == failed == total_faults(storage, "length")
    assert stats["attempts"] == (500 - failed) + MAX_ATTEMPTS * failed
    assert stats["failures"] == MAX_ATTEMPTS * failed


def test_per_call_decisions_do_not_leak_across_threads() -> None:
    storage = seeded_storage()
    storage.set_fault_rate(0.3, seed=5, ops=["length", "get_metadata"])
    errors: list[BaseException] = []

    def work(op: str) -> None:
        for _ in range(200):
            try:
                CALLS[op](storage)
            except StorageError:
                pass
            except BaseException as exc:  # pragma: no cover - reported below
                errors.append(exc)

    threads = [threading.Thread(target=work, args=(op,)) for op in ["length", "get_metadata"] * 2]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    stats = storage.stats()
    for op in ("length", "get_metadata"):
        gave_up = stats[op]["gave_up"]
        assert gave_up == total_faults(storage, op) > 0
        assert stats[op]["attempts"] == (400 - gave_up) + MAX_ATTEMPTS * gave_up


def test_lost_acknowledgement_of_create() -> None:
    storage = MemoryStorage()
    storage.set_fault_rate(1.0, ops=["create"], after_share=1.0)
    with pytest.raises(StorageError):
        storage.create(*SNAP, "obj")
    assert storage.fault_counts()["create"] == {"before": 0, "after": 1}
    # Every attempt ran: the later ones found identical bytes (the idempotent retry path).
    assert storage.stats()["create"]["attempts"] == MAX_ATTEMPTS
    storage.set_fault_rate(0)
    assert storage.get_metadata("obj") == SNAP[0]  # written, although reported failed
    assert [o.id for o in storage.list_objects()] == ["obj"]


def test_lost_acknowledgement_of_delete() -> None:
    storage = seeded_storage()
    storage.set_fault_rate(1.0, ops=["delete"], after_share=1.0)
    with pytest.raises(StorageError):
        storage.delete("obj")
    assert storage.fault_counts()["delete"] == {"before": 0, "after": 1}
    storage.set_fault_rate(0)
    assert storage.list_objects() == []


def test_lost_acknowledgement_of_commit_manifest() -> None:
    storage = seeded_storage()
    base = storage.read_manifest(NAME)
    wanted = replace(base, mark_delete=(4, 2))
    storage.set_fault_rate(1.0, ops=["commit_manifest"], after_share=1.0)
    with pytest.raises(StorageError):
        storage.commit_manifest(NAME, wanted)
    assert storage.fault_counts()["commit_manifest"] == {"before": 0, "after": 1}
    stored = storage.read_manifest(NAME)  # reads are not failing
    # Committed (once: later attempts found it there), although reported failed.
    assert stored == replace(wanted, version=base.version + 1)
    storage.set_fault_rate(0)
    with pytest.raises(ManifestConflictError):  # a naive caller retrying finds it moved
        storage.commit_manifest(NAME, wanted)


@pytest.mark.parametrize("op", sorted(set(OPS) - AFTER_EFFECT_OPS))
def test_ops_without_an_effect_to_lose_fail_before(op: str) -> None:
    storage = seeded_storage()
    storage.set_fault_rate(1.0, ops=[op], after_share=1.0)
    with pytest.raises(StorageError):
        CALLS[op](storage)
    assert storage.fault_counts()[op] == {"before": 1, "after": 0}
    if op == "lock":
        storage.set_fault_rate(0)
        storage.lock(NAME).release()  # the failed call did not leave the lock taken


def test_after_share_splits_the_failures() -> None:
    storage = MemoryStorage()
    storage.set_fault_rate(0.5, seed=3, ops=["delete"], after_share=0.25)
    for _ in range(800):
        with contextlib.suppress(StorageError):
            storage.delete("missing")
    counts = storage.fault_counts()["delete"]
    assert 300 < counts["before"] + counts["after"] < 500
    assert 0.15 < counts["after"] / (counts["before"] + counts["after"]) < 0.35


def pattern(seed: int, calls: int = 300) -> tuple[list[bool], dict[str, dict[str, int]]]:
    """Which of a fixed sequence of calls succeeded, and the fault counters afterwards."""
    storage = seeded_storage()
    ops = ("length", "get_metadata", "list_objects", "commit_manifest")
    storage.set_fault_rate(0.2, seed=seed, ops=ops)
    out = []
    for i in range(calls):
        op = ops[i % len(ops)]
        try:
            CALLS[op](storage)
            out.append(True)
        except StorageError:
            out.append(False)
    return out, storage.fault_counts()


def test_same_seed_same_faults() -> None:
    first, counts = pattern(42)
    assert (first, counts) == pattern(42)
    assert first != pattern(43)[0]
    assert 30 < first.count(False) < 90  # ~60 expected
    assert counts["commit_manifest"]["after"] > 0  # lost acks are drawn from the seed too


def test_reseeding_restarts_the_sequence() -> None:
    storage = seeded_storage()
    runs = []
    for _ in range(2):
        storage.set_fault_rate(0.5, seed=9, ops=["length"])
        run = []
        for _ in range(100):
            try:
                storage.length("obj")
                run.append(True)
            except StorageError:
                run.append(False)
        runs.append(run)
    assert runs[0] == runs[1]
    assert storage.fault_counts()["length"]["before"] == 2 * runs[0].count(False)


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"rate": -0.1}, ValueError, "rate must be in"),
        ({"rate": 1.5}, ValueError, "rate must be in"),
        ({"rate": float("nan")}, ValueError, "rate must be in"),
        ({"rate": "0.1"}, TypeError, "rate must be a real number"),
        ({"rate": True}, TypeError, "rate must be a real number"),
        ({"rate": 0.1, "after_share": 2}, ValueError, "after_share must be in"),
        ({"rate": 0.1, "after_share": None}, TypeError, "after_share must be a real"),
        ({"rate": 0.1, "seed": "7"}, TypeError, "seed must be an int"),
        ({"rate": 0.1, "seed": 1.0}, TypeError, "seed must be an int"),
        ({"rate": 0.1, "seed": False}, TypeError, "seed must be an int"),
        ({"rate": 0.1, "ops": "create"}, TypeError, "not the str"),
        ({"rate": 0.1, "ops": 5}, TypeError, "iterable of operation names"),
        ({"rate": 0.1, "ops": []}, ValueError, "ops is empty"),
        ({"rate": 0.1, "ops": ["create", "nope"]}, ValueError, "unknown op 'nope'"),
        ({"rate": 0.1, "ops": ["manifest"]}, ValueError, "unknown op 'manifest'"),
        ({"rate": 0.1, "ops": [1]}, ValueError, "unknown op 1"),
        ({"rate": 0, "ops": ["nope"]}, ValueError, "unknown op"),  # checked even when off
    ],
)
def test_bad_arguments_change_nothing(
    kwargs: dict[str, Any], error: type[Exception], match: str
) -> None:
    storage = seeded_storage()
    storage.set_fault_rate(1.0, seed=1, ops=["length"])
    with pytest.raises(error, match=match):
        storage.set_fault_rate(**kwargs)
    assert storage.fault_rate == 1.0
    with pytest.raises(StorageError):
        storage.length("obj")  # the previous setting is still in force
    storage.get_metadata("obj")


def test_queued_failures_still_work_and_take_precedence() -> None:
    storage = seeded_storage()
    storage.inject_failure("create", times=3)  # three attempts fail, the fourth succeeds
    storage.create(*SNAP, "a")
    assert storage.stats()["create"]["attempts"] == 1 + MAX_ATTEMPTS  # seeding + this call
    assert storage.pending_failures("create") == 0
    # With random faults on another op, the queue of this op is unaffected.
    storage.set_fault_rate(1.0, ops=["length"])
    storage.inject_failure("get_metadata", times=MAX_ATTEMPTS)
    with pytest.raises(StorageError):
        storage.get_metadata("obj")
    storage.get_metadata("obj")
    assert total_faults(storage, "get_metadata") == 0  # queued failures are not counted here
    # Both on one op: the queued failure is consumed first, the random one still fails the call.
    storage.set_fault_rate(1.0, ops=["get_metadata"])
    storage.inject_failure("get_metadata", times=1)
    with pytest.raises(StorageError):
        storage.get_metadata("obj")
    assert storage.pending_failures("get_metadata") == 0
    assert total_faults(storage, "get_metadata") == 1
