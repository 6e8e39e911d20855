"""``delayindex migrate``: per-subscription indexes replaced by one shared index, end to end.

Acceptance: two per-subscription ``DelayIndex`` stores of one topic with different marks are
migrated (from their snapshots, and from a topic dump); a ``SharedDelayIndex`` opened on the
result delivers to each subscription exactly the ``(clock step, batch)`` sequence its old index
delivers when reopened (on a copy of the store taken before the migration), and the old names
hold nothing any more. Failures injected into the build and into the verify leave every byte
of the old indexes as it was.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from delayindex import DelayIndex, FileStorage, ManualClock, SharedDelayIndex, TrackerConfig
from delayindex.cli import EXIT_CHECK_FAILED, EXIT_OK, EXIT_STORE_ERROR, EXIT_USAGE, main
from delayindex.errors import StorageError
from delayindex.executors import InlineExecutor
from delayindex.storage import Catalog
from delayindex.workload import generate

#: Far in the future: clearing opens the old indexes on the wall clock, and nothing may be due.
T0 = 4_000_000_000_000
CONFIG = TrackerConfig(
    min_index_count_per_bucket=60, max_num_buckets=0, max_indexes_per_segment=25, tick_ms=0
)
BUILD = ["--min-index-count-per-bucket", "60", "--max-num-buckets", "0", "--tick-ms", "0"]
OLD = {"sub1": ("orders-sub1", (9, 13)), "sub2": ("orders-sub2", (23, 2))}
FROM = [arg for sub, (name, _) in OLD.items() for arg in ("--from", f"{sub}={name}")]


def _topic() -> Any:
    """One topic: ~40 ledgers, half the messages delayed (1 s to 1 h after T0)."""
    w = generate(3000, seed=4, entries_per_ledger=70)
    delayed = w.deliver_at >= 0
    times = np.where(delayed, T0 + 1000 + (w.deliver_at - w.deliver_at.min()) % 3_600_000, -1)
    return w.ledger_ids, w.entry_ids, times


def build_old(root: Path) -> None:
    """Each subscription's own DelayIndex, fed the whole topic from its mark on (online), its
    last bucket sealed by a sentinel so that what it holds is durable."""
    ledgers, entries, times = _topic()
    for name, mark in OLD.values():
        with DelayIndex.open(
            FileStorage(root), name, CONFIG, clock=ManualClock(T0), executor=InlineExecutor()
        ) as index:
            index.set_mark_delete(*mark)
            index.add_many(ledgers, entries, times)
            assert index.add(int(ledgers.max()) + 1, 0, T0 + 10**8)  # the sentinel
            index.flush()
            index.set_mark_delete(*mark)


def _schedule() -> list[int]:
    return [T0 + step for step in range(0, 3_700_000, 97_000)] + [T0 + 10**8]


def deliveries(poll: Any, clock: ManualClock) -> list[tuple[int, tuple[Any, ...]]]:
    out = []
    for t in _schedule():
        clock.set(t)
        while batch := poll(29):
            out.append((t, tuple(batch)))
    return out


def old_deliveries(root: Path, name: str) -> list[tuple[int, tuple[Any, ...]]]:
    clock = ManualClock(T0)
    with DelayIndex.open(
        FileStorage(root), name, CONFIG, clock=clock, executor=InlineExecutor()
    ) as index:
        return deliveries(index.poll, clock)


def shared_deliveries(root: Path) -> dict[str, list[tuple[int, tuple[Any, ...]]]]:
    clock = ManualClock(T0)
    with SharedDelayIndex.open(
        FileStorage(root), "orders", CONFIG, clock=clock, executor=InlineExecutor()
    ) as shared:
        assert shared.subscriptions() == sorted(OLD)
        views = {sub: shared.subscribe(sub) for sub in OLD}
        assert {s: v.mark_delete for s, v in views.items()} == {s: m for s, (_, m) in OLD.items()}
        got: dict[str, list[tuple[int, tuple[Any, ...]]]] = {sub: [] for sub in OLD}
        for t in _schedule():  # the dispatchers poll in turns
            clock.set(t)
            for sub, view in views.items():
                while batch := view.poll(29):
                    got[sub].append((t, tuple(batch)))
        shared._check()
    return got


def tree(root: Path) -> dict[str, bytes]:
    """Every file of the old indexes (their manifests, history and objects) by path."""
    return {
        str(p.relative_to(root)): p.read_bytes()
        for p in sorted(root.rglob("*"))
        if p.is_file() and "orders-sub" in p.name
    }


def migrate(capsys: pytest.CaptureFixture[str], root: Path, *extra: str) -> tuple[int, Any]:
    argv = ["migrate", str(root), "--to", "orders", *FROM, "--now-ms", str(T0), *BUILD]
    code = main([*argv, *extra, "--json", "--no-progress"])
    return code, json.loads(capsys.readouterr().out)


def assert_old_gone(root: Path) -> None:
    storage = FileStorage(root)
    for name, _ in OLD.values():
        manifest = storage.read_manifest(name)
        assert manifest.buckets == () and manifest.intents == () and manifest.mark_delete is None
    assert all(o.id.startswith("orders-") and not o.id.startswith("orders-sub")
               for o in storage.list_objects())  # fmt: skip


# -- the acceptance -------------------------------------------------------------------------------


def test_migrate_from_the_old_snapshots_delivers_what_each_old_index_did(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    store, reference = tmp_path / "store", tmp_path / "reference"
    build_old(store)
    shutil.copytree(store, reference)
    code, report = migrate(capsys, store)
    assert code == EXIT_OK, report.get("error")
    assert report["report"]["ok"] and report["report"]["conflicts"] == 0
    assert [c["name"] for c in report["cleared"]] == ["orders-sub1", "orders-sub2"]
    assert report["report"]["build"]["mark_delete"] == [9, 13]  # the lowest mark
    checks = {c["name"]: c for c in report["report"]["verify"]["subscriptions"]}
    old = {o["subscription"]: o for o in report["report"]["old"]}
    assert {s: c["found"] for s, c in checks.items()} == {s: o["pending"] for s, o in old.items()}
    assert all(o["due"] == 0 and o["pending"] == o["positions"] for o in old.values())

    got = shared_deliveries(store)
    for sub, (name, _) in OLD.items():
        want = old_deliveries(reference, name)
        assert len(want) > 20
        assert got[sub] == want, sub
    assert_old_gone(store)


def test_migrate_from_a_dump(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from delayindex.dump import DumpColumns, write_dump  # needs the spark extra (pyarrow)

    store, reference = tmp_path / "store", tmp_path / "reference"
    build_old(store)
    shutil.copytree(store, reference)
    ledgers, entries, times = _topic()
    dump = write_dump(tmp_path / "topic.parquet", DumpColumns(ledgers, entries, times))
    code, report = migrate(capsys, store, "--dump", str(dump))
    assert code == EXIT_OK, report.get("error")
    assert report["dump"] == str(dump) and report["report"]["old"][0]["positions"] is None
    got = shared_deliveries(store)
    for sub, (name, _) in OLD.items():
        assert got[sub] == old_deliveries(reference, name), sub
    assert_old_gone(store)


def test_keep_old_builds_and_verifies_only(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    build_old(tmp_path)
    before = tree(tmp_path)
    assert (
        main(
            [
                "migrate",
                str(tmp_path),
                "--to",
                "orders",
                *FROM,
                "--now-ms",
                str(T0),
                *BUILD,
                "--keep-old",
            ]
        )
        == EXIT_OK
    )  # fmt: skip (progress bars on stderr)
    out = capsys.readouterr().out
    assert "verified orders per subscription: ok" in out and "--keep-old" in out
    assert "sub1" in out and "orders-sub2" in out
    assert tree(tmp_path) == before
    # A re-run replaces the shared index it built (the same subscriptions), then clears.
    code, report = migrate(capsys, tmp_path)
    assert code == EXIT_OK and len(report["cleared"]) == 2
    assert report["report"]["build"]["replaced"]


# -- failures: nothing old is touched --------------------------------------------------------------


def test_a_failed_build_touches_no_old_index(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    build_old(tmp_path)
    before = tree(tmp_path)
    import delayindex.rebuild.local as local
    from delayindex.rebuild.build import write_bucket as real  # the function local calls

    written = 0

    def failing(*args: Any, **kwargs: Any) -> Any:
        nonlocal written
        written += 1
        if written == 2:
            raise StorageError("injected: the disk is full")
        return real(*args, **kwargs)

    monkeypatch.setattr(local, "write_bucket", failing)
    code, report = migrate(capsys, tmp_path)
    assert code == EXIT_CHECK_FAILED and "injected" in report["error"]
    assert report["cleared"] == []
    assert tree(tmp_path) == before
    storage = FileStorage(tmp_path)
    assert storage.read_manifest("orders").buckets == ()  # rolled back
    assert {o.id for o in storage.list_objects()} == {
        i for name, _ in OLD.values() for i in storage.read_manifest(name).live_ids()
    }
    monkeypatch.undo()  # the disk has room again: a re-run completes the migration
    code, report = migrate(capsys, tmp_path)
    assert code == EXIT_OK and len(report["cleared"]) == 2


def test_a_failed_verify_touches_no_old_index(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    build_old(tmp_path)
    before = tree(tmp_path)
    import delayindex.rebuild.migrate as migration
    from delayindex.rebuild.local import rebuild_local as real  # the function migrate calls

    def lossy(*args: Any, **kwargs: Any) -> Any:  # the build "loses" one of its objects
        report = real(*args, **kwargs)
        FileStorage(tmp_path).object_path(report.buckets[1].snapshot_id).unlink()
        return report

    monkeypatch.setattr(migration, "rebuild_local", lossy)
    assert main(["migrate", str(tmp_path), "--to", "orders", *FROM, "--now-ms", str(T0),
                 *BUILD, "--no-progress"]) == EXIT_CHECK_FAILED  # fmt: skip
    out = capsys.readouterr().out
    assert "missing_snapshot" in out and "the old indexes were not touched" in out
    assert "mismatch" in out  # per subscription
    assert tree(tmp_path) == before
    monkeypatch.undo()  # a re-run replaces the shared index the failed run left
    code, report = migrate(capsys, tmp_path)
    assert code == EXIT_OK and report["report"]["build"]["replaced"]
    assert_old_gone(tmp_path)


def test_refusals_change_nothing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    build_old(tmp_path)
    storage = FileStorage(tmp_path)
    with DelayIndex.open(storage, "busy", CONFIG, clock=ManualClock(T0)) as other:
        other.add_many([1] * 61 + [2], [*range(61), 0], [T0 + 10**6] * 62)  # seals ledger 1
        other.flush()
    with DelayIndex.open(storage, "idle", CONFIG, clock=ManualClock(T0)) as other:
        other.add(1, 1, T0 + 10**6)  # in memory only: the manifest holds no bucket
    before = tree(tmp_path)
    argv = ["migrate", str(tmp_path), *FROM, "--now-ms", str(T0), "--no-progress"]
    for extra, why in (
        (["--to", "busy"], "busy already holds an index"),
        (["--to", "idle"], "idle already holds an index"),
        (["--to", "orders-sub1"], "is one of the old indexes"),
        (["--to", "orders", "--from", "sub3=nope"], "no index named 'nope'"),
        (["--to", "orders", "--from", "sub3=orders-sub1"], "its own old index"),
    ):
        assert main([*argv, *extra]) == EXIT_CHECK_FAILED, extra
        assert why in capsys.readouterr().out
    assert "orders" not in FileStorage(tmp_path).list_manifests()
    assert not FileStorage(tmp_path).lock_path("nope").exists()
    with Catalog.open(FileStorage(tmp_path), "orders-sub2"):  # a dispatcher still runs
        assert main([*argv, "--to", "orders"]) == EXIT_STORE_ERROR
    assert "locked" in capsys.readouterr().err
    for bad in (["--from", "sub1=orders-sub2"], ["--dump", str(tmp_path / "none.parquet")]):
        assert main([*argv, "--to", "orders", *bad]) == EXIT_USAGE
    capsys.readouterr()
    with pytest.raises(SystemExit) as caught:
        main(["migrate", str(tmp_path), "--to", "orders", "--from", "no-equals-sign"])
    assert caught.value.code == EXIT_USAGE
    assert tree(tmp_path) == before


def test_the_union_keeps_each_position_once_with_its_latest_deliver_time() -> None:
    from delayindex.rebuild.migrate import Columns, OldIndex, union_positions

    def old(sub: str, rows: list[tuple[int, int, int]]) -> OldIndex:
        cols = Columns(*(np.array(c, dtype=np.int64) for c in zip(*rows, strict=True)))
        return OldIndex(sub, f"idx-{sub}", None, 1, 1, 0, cols)

    a = old("a", [(2, 0, 500), (1, 1, 100), (3, 0, 700)])
    b = old("b", [(1, 1, 100), (2, 0, 900), (4, 4, 50)])
    columns, conflicts = union_positions([a, b])
    rows = list(zip(columns.ledger_ids.tolist(), columns.entry_ids.tolist(),
                    columns.deliver_at.tolist(), strict=True))  # fmt: skip
    assert rows == [(1, 1, 100), (2, 0, 900), (3, 0, 700), (4, 4, 50)]
    assert conflicts == 1  # (2, 0): 500 in a, 900 in b; never early for either
    with pytest.raises(ValueError, match="with its positions"):
        union_positions([a, OldIndex("c", "idx-c", None, 1, 0, 0, None)])
