"""``delayindex inspect`` on a shared index, and ``delayindex clear`` (PIP-195's admin commands).

The shared indexes here are written online by ``SharedDelayIndex`` (two subscriptions with
different marks). Inspect's per-subscription backlog, counted offline from the snapshots'
metadata, is checked against what a reopened ``SharedDelayIndex`` says each subscription still
has (``len(subscription)``); ``clear`` is checked by reopening and draining what is left.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from delayindex import (
    DelayIndex,
    FileStorage,
    ManualClock,
    Position,
    SharedDelayIndex,
    TrackerConfig,
)
from delayindex.cli import EXIT_CHECK_FAILED, EXIT_OK, EXIT_STORE_ERROR, EXIT_USAGE, main
from delayindex.executors import InlineExecutor
from delayindex.storage import Catalog

#: Far in the future: the commands open indexes on the wall clock, and nothing may be due.
T0 = 4_000_000_000_000
CONFIG = TrackerConfig(
    min_index_count_per_bucket=10, max_num_buckets=0, max_indexes_per_segment=4, tick_ms=0
)
MARKS = {"a": (3, 4), "b": (6, 1)}
LEDGERS = range(1, 10)
ENTRIES = 8


def _deliver_at(ledger: int, entry: int) -> int:
    return T0 + 1000 * ledger + 10 * entry


def build_shared(root: Path, name: str = "topic") -> None:
    """A shared index over ledgers 1-9 (8 entries each; the last ledger in memory only)."""
    with SharedDelayIndex.open(
        FileStorage(root), name, CONFIG, clock=ManualClock(T0), executor=InlineExecutor()
    ) as shared:
        views = {n: shared.subscribe(n) for n in MARKS}
        for ledger in LEDGERS:
            for entry in range(ENTRIES):
                assert shared.add(ledger, entry, _deliver_at(ledger, entry))
        shared.flush()
        for n, mark in MARKS.items():
            views[n].set_mark_delete(*mark)


def build_plain(root: Path, name: str, mark: tuple[int, int] | None = None) -> None:
    with DelayIndex.open(
        FileStorage(root), name, CONFIG, clock=ManualClock(T0), executor=InlineExecutor()
    ) as index:
        for ledger in LEDGERS:
            index.add_many([ledger] * ENTRIES, range(ENTRIES),
                           [_deliver_at(ledger, e) for e in range(ENTRIES)])  # fmt: skip
        index.flush()
        if mark is not None:
            index.set_mark_delete(*mark)


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, Any]:
    code = main([*argv, "--json"])
    return code, json.loads(capsys.readouterr().out)


def open_shared(root: Path, name: str = "topic", now: int = T0) -> SharedDelayIndex:
    return SharedDelayIndex.open(
        FileStorage(root), name, CONFIG, clock=ManualClock(now), executor=InlineExecutor()
    )


def drain(shared: SharedDelayIndex, sub: str) -> list[Position]:
    view = shared.subscribe(sub)
    shared._topic._clock.set(T0 + 10**9)  # type: ignore[attr-defined]
    got: list[Position] = []
    while batch := view.poll(1000):
        got.extend(batch)
    return got


# -- inspect ------------------------------------------------------------------------------------


@pytest.mark.parametrize("now", [T0, T0 + 5_000])  # nothing due; ledgers 1-4 wholly due
def test_inspect_lists_each_subscription_with_its_backlog(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], now: int
) -> None:
    build_shared(tmp_path)
    build_plain(tmp_path, "plain")
    code, report = run(capsys, "inspect", "--store", str(tmp_path), "--now-ms", str(now))
    assert code == EXIT_OK
    names = {n["name"]: n for n in report["names"]}
    assert "subscriptions" not in names["plain"]  # a per-subscription index: as before
    topic = names["topic"]
    assert topic["mark_delete"] == [3, 4]  # the lowest subscription mark
    subs = {s["name"]: s for s in topic["subscriptions"]}
    assert sorted(subs) == ["a", "b"]
    assert subs["a"]["mark_delete"] == [3, 4] and subs["b"]["mark_delete"] == [6, 1]
    for s in subs.values():
        assert s["lag"] == s["backlog"]
    # The oracle: what a reopened shared index says each subscription still has.
    with open_shared(tmp_path, now=now) as shared:
        want = {n: len(shared.subscribe(n)) for n in MARKS}
    assert {n: s["backlog"] for n, s in subs.items()} == want
    assert want["a"] > want["b"] > 0
    if now == T0:  # every sealed position after each mark (ledgers 1-8 are durable)
        sealed = [(lg, e) for lg in range(1, 9) for e in range(ENTRIES)]
        assert want == {n: sum(p > m for p in sealed) for n, m in MARKS.items()}

    assert main(["inspect", "--store", str(tmp_path), "--now-ms", str(now)]) == EXIT_OK
    out = capsys.readouterr().out
    assert "subscriptions (shared index)" in out and "backlog (lag)" in out
    assert f"{want['b']:,}" in out


# -- clear --------------------------------------------------------------------------------------


def test_clear_a_per_subscription_index(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    build_plain(tmp_path, "orders-sub1", (2, 3))
    build_plain(tmp_path, "other")
    live = FileStorage(tmp_path).read_manifest("orders-sub1").live_ids()
    code, done = run(capsys, "clear", str(tmp_path), "orders-sub1")
    assert code == EXIT_OK
    assert done["kind"] == "index" and done["action"] == "cleared"
    assert set(done["deleted_snapshots"]) == live and len(live) > 3
    assert done["before"]["mark_delete"] == [2, 3] and done["after"]["mark_delete"] is None
    assert done["after"]["buckets"] == 0 and done["pending_deletes"] == []
    storage = FileStorage(tmp_path)
    assert not {o.id for o in storage.list_objects()} & live  # the objects are gone
    with DelayIndex.open(storage, "orders-sub1", CONFIG, clock=ManualClock(T0)) as index:
        assert len(index) == 0 and index.mark_delete is None
    with DelayIndex.open(storage, "other", CONFIG, clock=ManualClock(T0)) as index:
        assert len(index) == 8 * ENTRIES  # another name is untouched


def test_clear_a_shared_index_resets_every_subscription(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    build_shared(tmp_path)
    assert main(["clear", str(tmp_path), "topic"]) == EXIT_OK
    out = capsys.readouterr().out
    assert "cleared shared index topic" in out
    assert "subscriptions kept, progress and marks reset: a (was 3:4), b (was 6:1)" in out
    manifest = FileStorage(tmp_path).read_manifest("topic")
    assert manifest.buckets == () and manifest.mark_delete is None
    assert [(s.name, s.mark_delete) for s in manifest.subscriptions] == [("a", None), ("b", None)]
    assert FileStorage(tmp_path).list_objects() == []
    with open_shared(tmp_path) as shared:
        assert shared.subscriptions() == ["a", "b"] and len(shared) == 0


def test_clear_one_subscription_releases_what_only_it_needed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    build_shared(tmp_path)
    before = FileStorage(tmp_path).read_manifest("topic")
    only_a = {b.snapshot_id for b in before.buckets if b.end_ledger < MARKS["b"][0]}
    assert only_a  # buckets wholly below b's mark: a was the only one still reading them
    code, done = run(capsys, "clear", str(tmp_path), "topic", "--subscription", "a")
    assert code == EXIT_OK and done["action"] == "unsubscribed"
    assert set(done["deleted_snapshots"]) == only_a
    assert done["after"]["mark_delete"] == [6, 1] and done["after"]["subscriptions"] == {
        "b": [6, 1]
    }
    with open_shared(tmp_path) as shared:
        assert shared.subscriptions() == ["b"]
        got = drain(shared, "b")
    want = [Position(lg, e) for lg in range(1, 9) for e in range(ENTRIES) if (lg, e) > MARKS["b"]]
    assert got == want  # b keeps everything it had (ledger 9 was memory-only)

    assert main(["clear", str(tmp_path), "topic", "--subscription", "b"]) == EXIT_OK
    out = capsys.readouterr().out
    assert "dropped subscription b of shared index topic (its mark was 6:1)" in out
    assert "remaining subscriptions: none" in out
    assert "no subscription is left" not in out  # b had received everything: nothing is left


def test_dropping_the_last_subscription_says_what_the_topic_still_holds(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    build_shared(tmp_path)
    for sub in ("b", "a"):
        assert main(["clear", str(tmp_path), "topic", "--subscription", sub]) == EXIT_OK
    out = capsys.readouterr().out
    held = len(FileStorage(tmp_path).read_manifest("topic").buckets)
    assert held > 0
    assert f"no subscription is left: topic still holds {held} bucket(s)" in out
    assert main(["clear", str(tmp_path), "topic"]) == EXIT_OK  # the hint's command
    assert "cleared index topic" in capsys.readouterr().out
    assert FileStorage(tmp_path).list_objects() == []


def test_clear_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    build_shared(tmp_path)
    build_plain(tmp_path, "plain")
    store = str(tmp_path)
    assert main(["clear", store, "nope"]) == EXIT_CHECK_FAILED
    assert "no index named 'nope'" in capsys.readouterr().err
    assert main(["clear", store, "topic", "--subscription", "z"]) == EXIT_CHECK_FAILED
    assert "has no subscription 'z' (subscriptions: a, b)" in capsys.readouterr().err
    assert main(["clear", store, "plain", "--subscription", "a"]) == EXIT_CHECK_FAILED
    assert "not a shared index" in capsys.readouterr().err
    assert main(["clear", str(tmp_path / "missing"), "topic"]) == EXIT_USAGE
    with pytest.raises(SystemExit) as caught:
        main(["clear", store, "bad/name"])
    assert caught.value.code == EXIT_USAGE
    snapshot = sorted(p.name for p in (tmp_path / "objects").iterdir())
    with Catalog.open(FileStorage(tmp_path), "topic"):  # a running writer
        assert main(["clear", store, "topic"]) == EXIT_STORE_ERROR
    assert "locked" in capsys.readouterr().err
    assert sorted(p.name for p in (tmp_path / "objects").iterdir()) == snapshot


def test_clear_reports_deletes_left_pending(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    build_plain(tmp_path, "orders-sub1")

    def fail(self: FileStorage, snapshot_id: str) -> None:
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(FileStorage, "_raw_delete", fail)
    code, done = run(capsys, "clear", str(tmp_path), "orders-sub1")
    assert code == EXIT_STORE_ERROR
    assert done["after"]["buckets"] == 0  # cleared all the same
    assert done["pending_deletes"] or done["dead_letters"]  # journaled, not forgotten
    monkeypatch.undo()
    code, report = run(capsys, "gc", "--store", str(tmp_path), "--delete", "--retry-dead-letters")
    assert code == EXIT_OK, report["problems"]
    assert FileStorage(tmp_path).list_objects() == []
