"""Offline build and verify of a shared index (``rebuild_local(..., subscriptions=...)``).

The acceptance test: a dump rebuilt as a shared index with two subscriptions, opened with
``SharedDelayIndex`` and drained on a manual clock, delivers to each subscription exactly the
``(clock step, batch)`` sequence that a per-subscription ``DelayIndex`` rebuilt from the same
dump with that subscription's mark delivers. The other tests pin the one translation
(``acknowledged``: the topic's mark is the lowest subscription mark), the publish and rollback
of the subscription records, and verify's per-subscription findings.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from delayindex import DelayIndex, FileStorage, ManualClock, SharedDelayIndex, TrackerConfig
from delayindex.executors import InlineExecutor
from delayindex.rebuild import acknowledged, rebuild_local, tracked_mask, verify_store
from delayindex.storage import Catalog
from delayindex.storage.manifest import SubscriptionRecord
from delayindex.workload import generate

NAME = "topic"
CONFIG = TrackerConfig(
    min_index_count_per_bucket=150,
    max_num_buckets=0,
    max_indexes_per_segment=40,
    max_time_step_per_segment_ms=20_000,
)
SUBS = {"sub-b": (30, 7), "sub-a": (12, 3), "sub-c": (30, 7)}


class Cols:
    """A DumpColumns-like dump."""

    def __init__(self, ledgers: Any, entries: Any, times: Any) -> None:
        self.ledger_ids = np.asarray(ledgers, dtype=np.int64)
        self.entry_ids = np.asarray(entries, dtype=np.int64)
        self.deliver_at = np.asarray(times, dtype=np.int64)


def _dump(n: int = 4000, seed: int = 21) -> tuple[Cols, int]:
    w = generate(n, seed=seed, entries_per_ledger=40)
    return Cols(w.ledger_ids, w.entry_ids, w.deliver_at), int(w.publish_ms[0]) + 20_000


def _schedule(dump: Cols, now: int, steps: int = 30) -> list[int]:
    times = np.sort(dump.deliver_at[tracked_mask(dump, now_ms=now, config=CONFIG)])
    return sorted({*np.quantile(times, np.linspace(0, 1, steps)).astype(np.int64).tolist()})


def _drain(poll: Any, clock: ManualClock, schedule: list[int]) -> list[tuple[int, tuple[Any, ...]]]:
    out = []
    for t in schedule:
        clock.set(t)
        while got := poll(17):
            out.append((t, tuple(got)))
    return out


# -- the translation ----------------------------------------------------------------------------


def test_acknowledged_is_the_lowest_mark_with_sorted_records() -> None:
    ack = acknowledged(None, SUBS)
    assert ack.shared and ack.mark_delete == (12, 3)
    assert [r.name for r in ack.subscriptions] == ["sub-a", "sub-b", "sub-c"]
    assert ack.subscriptions[1] == SubscriptionRecord("sub-b", (30, 7))
    # A subscription that has acknowledged nothing holds the whole topic.
    assert acknowledged(None, {"x": (5, 0), "y": None}).mark_delete is None
    plain = acknowledged((4, 2))
    assert not plain.shared and plain.mark_delete == (4, 2) and plain.subscriptions == ()
    assert acknowledged([4, 2]).mark_delete == (4, 2)


@pytest.mark.parametrize(
    ("mark", "subs", "error", "match"),
    [
        ((1, 0), {"a": None}, ValueError, "not both"),
        (None, {}, ValueError, "at least one"),
        (None, [("a", None)], TypeError, "map names"),
        (None, {"a": (1, -1)}, ValueError, "entry_id"),
        (None, {"a": (1,)}, TypeError, "mark_delete"),
        (None, {"": (1, 1)}, TypeError, "subscription name"),
        (None, {3: (1, 1)}, TypeError, "must be a str"),
    ],
)
def test_acknowledged_rejects_bad_subscriptions(
    mark: Any, subs: Any, error: type[Exception], match: str
) -> None:
    with pytest.raises(error, match=match):
        acknowledged(mark, subs)


# -- the build ----------------------------------------------------------------------------------


def test_shared_rebuild_delivers_each_subscription_what_its_own_rebuild_does(
    tmp_path: Path,
) -> None:
    dump, now = _dump()
    shared_store = FileStorage(tmp_path / "shared")
    report = rebuild_local(dump, shared_store, NAME, CONFIG, now_ms=now, subscriptions=SUBS)
    assert report.mark_delete == (12, 3)
    assert [(r.name, r.mark_delete) for r in report.subscriptions] == sorted(SUBS.items())
    assert json.loads(report.to_json())["subscriptions"][0] == {
        "name": "sub-a", "mark_delete": [12, 3],
    }  # fmt: skip
    manifest = shared_store.read_manifest(NAME)
    assert manifest.mark_delete == (12, 3)
    assert manifest.subscriptions == report.subscriptions
    # The topic index holds what a per-subscription rebuild at the lowest mark holds.
    lowest = FileStorage(tmp_path / "lowest")
    plain = rebuild_local(dump, lowest, NAME, CONFIG, now_ms=now, mark_delete=(12, 3))
    assert (report.ranges, report.tracked, report.acked) == (
        plain.ranges, plain.tracked, plain.acked,
    )  # fmt: skip
    assert lowest.read_manifest(NAME).subscriptions == ()

    schedule = _schedule(dump, now)
    clock = ManualClock(now)
    shared = SharedDelayIndex.open(
        shared_store, NAME, CONFIG, clock=clock, executor=InlineExecutor()
    )
    try:
        assert shared.subscriptions() == sorted(SUBS)
        views = {name: shared.subscribe(name) for name in SUBS}
        assert {n: v.mark_delete for n, v in views.items()} == SUBS
        got = {name: [] for name in SUBS}  # type: dict[str, list[Any]]
        for t in schedule:  # the subscriptions poll in turns, as dispatchers would
            clock.set(t)
            for name, view in views.items():
                while batch := view.poll(17):
                    got[name].append((t, tuple(batch)))
        shared._check()
    finally:
        shared.close()
    for name, mark in SUBS.items():
        own = FileStorage(tmp_path / name)
        rebuild_local(dump, own, NAME, CONFIG, now_ms=now, mark_delete=mark)
        clock = ManualClock(now)
        index = DelayIndex.open(own, NAME, CONFIG, clock=clock, executor=InlineExecutor())
        try:
            want = _drain(index.poll, clock, schedule)
        finally:
            index.close()
        assert len(want) > 10
        assert got[name] == want, name


def test_a_plain_rebuild_drops_old_records_and_a_failed_one_keeps_them(tmp_path: Path) -> None:
    dump, now = _dump(2000, seed=5)
    storage = FileStorage(tmp_path)
    rebuild_local(dump, storage, NAME, CONFIG, now_ms=now, subscriptions=SUBS)
    records = storage.read_manifest(NAME).subscriptions
    assert len(records) == 3

    def fail(step: str) -> None:
        if step == "object.write":
            raise RuntimeError("disk on fire")

    failing = FileStorage(tmp_path, step_hook=fail)
    with pytest.raises(RuntimeError, match="disk on fire"):
        rebuild_local(dump, failing, NAME, CONFIG, now_ms=now, subscriptions={"z": None})
    manifest = FileStorage(tmp_path).read_manifest(NAME)
    assert manifest.subscriptions == records and manifest.mark_delete == (12, 3)
    assert manifest.intents == ()
    # A per-subscription rebuild of the name holds exactly what the dump says: no records.
    rebuild_local(dump, storage, NAME, CONFIG, now_ms=now, mark_delete=(2, 0))
    manifest = storage.read_manifest(NAME)
    assert manifest.subscriptions == () and manifest.mark_delete == (2, 0)


# -- verify -------------------------------------------------------------------------------------


def test_verify_checks_each_subscription(tmp_path: Path) -> None:
    dump, now = _dump(3000, seed=8)
    storage = FileStorage(tmp_path)
    subs = {"a": (12, 3), "b": (30, 7)}
    rebuild_local(dump, storage, NAME, CONFIG, now_ms=now, subscriptions=subs)
    report = verify_store(storage, NAME, dump, CONFIG, now_ms=now, subscriptions=subs)
    assert report.ok, report.findings
    mask = tracked_mask(dump, now_ms=now, config=CONFIG)
    after_b = mask & ((dump.ledger_ids > 30) | ((dump.ledger_ids == 30) & (dump.entry_ids > 7)))
    [a, b] = report.subscriptions
    assert (a.name, a.mark_delete, a.ok, b.name, b.ok) == ("a", (12, 3), True, "b", True)
    assert a.expected == a.found == report.expected == report.found
    assert b.expected == b.found == int(np.count_nonzero(after_b)) < a.expected
    data = json.loads(report.to_json())
    assert data["subscriptions"][1]["mark_delete"] == [30, 7]

    # Verified as a per-subscription index, the records are a mismatch.
    plain = verify_store(storage, NAME, dump, CONFIG, now_ms=now, mark_delete=(12, 3))
    assert [f.kind for f in plain.findings] == ["manifest_mismatch"]
    assert "subscriptions are a@12:3, b@30:7, expected none" in plain.findings[0].message

    # The dump says one more position above b's mark, one more between the marks: the first
    # is missing for both subscriptions, the second for a only.
    top = int(dump.ledger_ids.max())
    more = Cols(
        np.concatenate([dump.ledger_ids, [top + 1, 20]]),
        np.concatenate([dump.entry_ids, [0, 10_000]]),
        np.concatenate([dump.deliver_at, [now + 10**8, now + 10**8]]),
    )
    report = verify_store(storage, NAME, more, CONFIG, now_ms=now, subscriptions=subs)
    missing = {f.subscription: f for f in report.findings if f.kind == "missing_position"}
    assert {s: f.count for s, f in missing.items()} == {"a": 2, "b": 1}
    assert missing["b"].examples[0]["ledger_id"] == top + 1
    assert missing["a"].message.startswith("subscription 'a': 2 expected positions")
    assert [(c.name, c.ok) for c in report.subscriptions] == [("a", False), ("b", False)]

    # Other marks than the manifest's: named, and the positions between count per subscription.
    report = verify_store(
        storage, NAME, dump, CONFIG, now_ms=now, subscriptions={"a": (12, 3), "b": (20, 0)}
    )
    messages = [f.message for f in report.findings if f.kind == "manifest_mismatch"]
    assert messages == ["the manifest's subscriptions are a@12:3, b@30:7, expected a@12:3, b@20:0"]
    assert {f.subscription for f in report.findings if f.kind != "manifest_mismatch"} == set()
    assert report.ok is False


def test_verify_names_a_store_position_above_one_mark_only(tmp_path: Path) -> None:
    storage = FileStorage(tmp_path)
    dump = Cols([1, 2, 3, 4], [0, 0, 0, 0], [5000, 6000, 7000, 8000])
    rebuild_local(dump, storage, NAME, CONFIG, now_ms=0, subscriptions={"a": (1, 0), "b": (3, 0)})
    # The dump lost the row of ledger 2: the store holds it for a, not for b (below b's mark).
    fewer = Cols([1, 3, 4], [0, 0, 0], [5000, 7000, 8000])
    report = verify_store(
        storage, NAME, fewer, CONFIG, now_ms=0, subscriptions={"a": (1, 0), "b": (3, 0)}
    )
    assert [(f.kind, f.subscription, f.count) for f in report.findings] == [
        ("extra_position", "a", 1)
    ]
    assert report.findings[0].examples[0]["ledger_id"] == 2
    with Catalog.open(storage, NAME):  # verify takes no lock: a running writer is fine
        assert verify_store(
            storage, NAME, dump, CONFIG, now_ms=0, subscriptions={"a": (1, 0), "b": (3, 0)}
        ).ok
