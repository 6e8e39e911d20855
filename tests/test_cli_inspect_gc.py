"""``delayindex inspect`` and ``delayindex gc`` on real FileStorage stores written by DelayIndex.

Acceptance: gc on a store seeded with orphan files finds and deletes exactly those and nothing
referenced; the indexes are then reopened and drained completely to prove nothing was lost.
Also: dry runs change no byte, JSON parses with stable keys, exit codes follow the docs.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from delayindex import DelayIndex, FileStorage, ManualClock, Position, TrackerConfig
from delayindex.cli import (
    EXIT_CHECK_FAILED,
    EXIT_OK,
    EXIT_STORE_ERROR,
    EXIT_USAGE,
    main,
    parse_grace,
)
from delayindex.executors import InlineExecutor
from delayindex.storage import Intent, Manifest

T0 = 1_000_000
LATER = T0 + 10**9  # everything is due
CONFIG = TrackerConfig(
    min_index_count_per_bucket=4, max_num_buckets=0, max_indexes_per_segment=2, tick_ms=0
)
HOUR_S = 3600
#: The time gc runs at (--now-ms); seeded garbage gets mtimes relative to it, never the wall clock.
GC_NOW_MS = 1_767_225_600_000  # 2026-01-01T00:00:00Z


def open_index(root: Path, name: str, clock: ManualClock) -> DelayIndex:
    return DelayIndex.open(FileStorage(root), name, CONFIG, clock=clock, executor=InlineExecutor())


def build(root: Path) -> dict[str, set[Position]]:
    """Names "t" (ledgers 1-5) and "u" (ledgers 100-103), 4 entries per ledger. The last ledger
    of each stays in the mutable bucket (memory-only); the others are sealed and durable."""
    durable: dict[str, set[Position]] = {}
    for name, ledgers in (("t", range(1, 6)), ("u", range(100, 104))):
        with open_index(root, name, ManualClock(T0)) as index:
            for ledger in ledgers:
                for entry in range(4):
                    assert index.add(ledger, entry, T0 + 10_000 * (entry + 1) + ledger)
            index.flush()
            assert len(index.buckets()) == len(ledgers) - 1
        durable[name] = {Position(lg, e) for lg in ledgers[:-1] for e in range(4)}
    return durable


def object_ids(root: Path) -> set[str]:
    return {p.name.removesuffix(".dixs") for p in (root / "objects").glob("*.dixs")}


def referenced(root: Path) -> set[str]:
    storage = FileStorage(root, clean_tmp=False)
    ids: set[str] = set()
    for name in storage.list_manifests():
        ids |= storage.read_manifest(name).referenced_ids()
    return ids


def age(path: Path, seconds: int) -> None:
    """Set the file's mtime to ``seconds`` before :data:`GC_NOW_MS`."""
    then_ns = (GC_NOW_MS - seconds * 1000) * 1_000_000
    os.utime(path, ns=(then_ns, then_ns))


def seed_garbage(root: Path) -> set[str]:
    """Old orphans (returned), a young orphan, a stale temp file and a foreign file."""
    objects = root / "objects"
    shutil.copy(next(objects.glob("t-*.dixs")), objects / "orphan-copy.dixs")
    (objects / "junk-1.dixs").write_bytes(b"left by an older version")
    for orphan in ("orphan-copy", "junk-1"):
        age(objects / f"{orphan}.dixs", HOUR_S)
    (objects / "young-1.dixs").write_bytes(b"being written by someone")
    age(objects / "young-1.dixs", 60)  # inside the default grace period (10m)
    (objects / "notes.txt").write_bytes(b"not an object: never touched")
    age(objects / "notes.txt", HOUR_S)
    (root / "tmp" / "999999999-dead.tmp").write_bytes(b"partial")
    return {"orphan-copy", "junk-1"}


def tree(root: Path) -> dict[str, tuple[bytes, int] | None]:
    """Every file's bytes and mtime (directories: None), by relative path."""
    out: dict[str, tuple[bytes, int] | None] = {}
    for path in sorted(root.rglob("*")):
        rel = str(path.relative_to(root))
        out[rel] = None if path.is_dir() else (path.read_bytes(), path.stat().st_mtime_ns)
    return out


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, Any]:
    """Run the CLI with --json; return its exit code and parsed output."""
    code = main([*argv, "--json"])
    out = capsys.readouterr().out
    return code, json.loads(out)


def gc_argv(root: Path, *options: str) -> list[str]:
    """``gc`` on ``root`` at :data:`GC_NOW_MS`, with ``options``."""
    return ["gc", "--store", str(root), "--now-ms", str(GC_NOW_MS), *options]


def run_gc(capsys: pytest.CaptureFixture[str], root: Path, *options: str) -> tuple[int, Any]:
    """:func:`run` of ``gc`` at :data:`GC_NOW_MS`."""
    code, report = run(capsys, *gc_argv(root, *options))
    assert report["now_ms"] == GC_NOW_MS
    return code, report


def drain(root: Path, name: str) -> set[Position]:
    clock = ManualClock(T0)
    with open_index(root, name, clock) as index:
        count = len(index)
        clock.set(LATER)
        got: list[Position] = []
        while batch := index.poll(1000):
            got.extend(batch)
        assert len(got) == len(set(got)) == count and len(index) == 0
    return set(got)


def edit_manifest(root: Path, name: str, edit: Any) -> Manifest:
    storage = FileStorage(root, clean_tmp=False)
    manifest = storage.read_manifest(name)
    return storage.commit_manifest(name, edit(manifest))


# -- acceptance -----------------------------------------------------------------------------------


def test_gc_deletes_exactly_the_seeded_orphans_and_nothing_referenced(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    durable = build(tmp_path)
    live = object_ids(tmp_path)
    assert live == referenced(tmp_path) and len(live) == 4 + 3
    orphans = seed_garbage(tmp_path)

    code, dry = run_gc(capsys, tmp_path)
    assert code == EXIT_CHECK_FAILED
    assert {o["id"] for o in dry["orphans"]} == orphans
    assert {o["id"] for o in dry["young"]} == {"young-1"}
    assert dry["referenced"] == len(live) and dry["objects"] == len(live) + 3
    assert dry["temp_files"] == ["999999999-dead.tmp"] and dry["deleted"] == []
    assert object_ids(tmp_path) == live | orphans | {"young-1"}

    code, report = run_gc(capsys, tmp_path, "--delete", "--grace", "10m")
    assert code == EXIT_OK, report["problems"]
    assert set(report["deleted"]) == orphans
    assert report["failed"] == [] and report["skipped"] == []
    assert report["removed_temp_files"] == ["999999999-dead.tmp"]
    assert object_ids(tmp_path) == live | {"young-1"}  # exactly the orphans went
    assert (tmp_path / "objects" / "notes.txt").exists()
    assert list((tmp_path / "tmp").iterdir()) == []

    # Nothing referenced was lost: every durable position comes back, once.
    for name, positions in durable.items():
        assert drain(tmp_path, name) == positions

    # gc with grace 0 now takes the young orphan too, and still nothing else.
    code, report = run_gc(capsys, tmp_path, "--delete", "--grace", "0")
    assert code == EXIT_OK and report["deleted"] == ["young-1"]


def test_dry_runs_and_inspect_change_no_byte(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    build(tmp_path)
    seed_garbage(tmp_path)
    ids = sorted(i for i in object_ids(tmp_path) if i.startswith("t-"))

    def journal(m: Manifest) -> Manifest:
        pending, dead = (m.bucket(i) for i in ids[:2])
        assert pending is not None and dead is not None
        d_intent = Intent("delete", dead.snapshot_id, dead.start_ledger, dead.end_ledger)
        return (
            m.without_bucket(pending.snapshot_id)
            .with_intent(
                Intent("delete", pending.snapshot_id, pending.start_ledger, pending.end_ledger)
            )
            .without_bucket(dead.snapshot_id)
            .with_intent(d_intent)
            .with_dead_letter(replace(d_intent, attempts=10, last_error="OSError: [Errno 5]"))
        )

    edit_manifest(tmp_path, "t", journal)
    before = tree(tmp_path)
    for argv in (
        gc_argv(tmp_path, "--json"),
        gc_argv(tmp_path, "--grace", "0"),
        ["inspect", "--store", str(tmp_path), "--json"],
        ["inspect", "--store", str(tmp_path), "--now-ms", str(T0)],
    ):
        assert main(argv) == EXIT_CHECK_FAILED, argv
        assert tree(tmp_path) == before, argv
    out = capsys.readouterr().out
    assert "dry run: nothing was changed" in out and "dead letters" in out


# -- gc -------------------------------------------------------------------------------------------


def test_gc_resumes_pending_deletes_and_retries_dead_letters_on_request(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    build(tmp_path)
    pending, dead = sorted(i for i in object_ids(tmp_path) if i.startswith("u-"))[:2]

    def journal(m: Manifest) -> Manifest:
        p, d = m.bucket(pending), m.bucket(dead)
        assert p is not None and d is not None
        d_intent = Intent("delete", dead, d.start_ledger, d.end_ledger)
        return (
            m.without_bucket(pending)
            .with_intent(Intent("delete", pending, p.start_ledger, p.end_ledger, attempts=2))
            .without_bucket(dead)
            .with_intent(d_intent)
            .with_dead_letter(replace(d_intent, attempts=10, last_error="OSError: gone wrong"))
        )

    edit_manifest(tmp_path, "u", journal)
    code, dry = run_gc(capsys, tmp_path)
    assert code == EXIT_CHECK_FAILED and dry["orphans"] == []
    [u] = [n for n in dry["names"] if n["name"] == "u"]
    assert (u["pending_deletes"], u["dead_letters"], u["action"]) == (
        [pending],
        [dead],
        "would-resume",
    )
    assert dry["problems"] == ["u: 1 unfinished intents", "u: 1 dead letters"]

    code, report = run_gc(capsys, tmp_path, "--delete")
    [u] = [n for n in report["names"] if n["name"] == "u"]
    assert u["action"] == "resumed" and u["completed"] == [pending]
    assert u["remaining_dead_letters"] == [dead]
    assert code == EXIT_CHECK_FAILED and report["problems"] == ["u: 1 dead letters"]
    assert pending not in object_ids(tmp_path) and dead in object_ids(tmp_path)

    code, report = run_gc(capsys, tmp_path, "--delete", "--retry-dead-letters")
    [u] = [n for n in report["names"] if n["name"] == "u"]
    assert code == EXIT_OK and u["retried"] == [dead] and u["remaining_dead_letters"] == []
    assert dead not in object_ids(tmp_path)
    assert object_ids(tmp_path) == referenced(tmp_path)


def test_gc_skips_a_name_whose_writer_is_running(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    build(tmp_path)
    victim = sorted(i for i in object_ids(tmp_path) if i.startswith("t-"))[0]

    def journal(m: Manifest) -> Manifest:
        b = m.bucket(victim)
        assert b is not None
        intent = Intent("delete", victim, b.start_ledger, b.end_ledger)
        return m.without_bucket(victim).with_intent(intent)

    edit_manifest(tmp_path, "t", journal)
    with FileStorage(tmp_path).lock("t"):  # a running writer of "t" (another FileStorage)
        code, report = run_gc(capsys, tmp_path, "--delete")
        [t] = [n for n in report["names"] if n["name"] == "t"]
        assert t["action"] == "in-use" and t["pending_deletes"] == [victim]
        assert victim in object_ids(tmp_path)  # left to its writer
        assert code == EXIT_OK, report["problems"]
        code, info = run(capsys, "inspect", "--store", str(tmp_path), "--name", "t")
        [t] = info["names"]
        assert t["writer"] == {"held": True, "pid": os.getpid()}
    code, info = run(capsys, "inspect", "--store", str(tmp_path), "--name", "t")
    assert info["names"][0]["writer"] == {"held": False, "pid": None}
    code, report = run_gc(capsys, tmp_path, "--delete")
    assert code == EXIT_OK and victim not in object_ids(tmp_path)


def test_a_corrupt_manifest_stops_gc_with_exit_3_and_deletes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    build(tmp_path)
    seed_garbage(tmp_path)
    manifest = tmp_path / "manifests" / "u.manifest"
    manifest.write_bytes(manifest.read_bytes()[:-5])
    before = tree(tmp_path)
    code, report = run_gc(capsys, tmp_path, "--delete", "--grace", "0")
    assert code == EXIT_STORE_ERROR
    assert [c["name"] for c in report["corrupt_manifests"]] == ["u"]
    assert "refusing to delete anything" in report["refused"] and report["deleted"] == []
    assert tree(tmp_path) == before
    code, info = run(capsys, "inspect", "--store", str(tmp_path))
    assert code == EXIT_STORE_ERROR
    t, u = info["names"]
    assert t["error"] == "" and len(t["buckets"]) == 4
    assert u["error_kind"] == "corrupt" and "u.manifest" in u["error"]
    assert main(gc_argv(tmp_path)) == EXIT_STORE_ERROR
    assert "damaged manifest u" in capsys.readouterr().out


def test_io_failures_exit_3(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    build(tmp_path)

    def broken(self: FileStorage) -> list[Any]:
        raise OSError(5, "disk on fire")

    monkeypatch.setattr(FileStorage, "_raw_list", broken)
    assert main(gc_argv(tmp_path)) == EXIT_STORE_ERROR
    err = capsys.readouterr().err
    assert "store error" in err and "list_objects" in err and "disk on fire" in err


# -- inspect --------------------------------------------------------------------------------------


def test_inspect_reports_buckets_as_recovery_sees_them(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    build(tmp_path)
    now = T0 + 25_000  # ledger L's deliver times: T0+10_000+L, 20_000+L, 30_000+L, 40_000+L
    code, info = run(capsys, "inspect", "--store", str(tmp_path), "--now-ms", str(now))
    assert code == EXIT_OK and info["problems"] == [] and info["now_ms"] == now
    t, u = info["names"]
    assert (t["name"], u["name"]) == ("t", "u")
    assert [(b["start_ledger"], b["end_ledger"]) for b in t["buckets"]] == [
        (i, i) for i in (1, 2, 3, 4)
    ]
    for b in t["buckets"]:
        ledger = b["start_ledger"]
        # Two indexes per segment: segment 1 (10_000, 20_000) is all due, segment 2 is not.
        assert (b["num_segments"], b["num_messages"], b["loaded_segment"]) == (2, 4, 2)
        assert b["next_delivery_ms"] == T0 + 30_000 + ledger and b["due_messages"] == 2
        assert b["all_due"] is False and b["error"] == ""
    assert t["messages"] == 16 and t["next_delivery_ms"] == T0 + 30_001
    assert t["writer"] == {"held": False, "pid": None}
    assert t["intents"] == [] and t["dead_letters"] == [] and t["being_written"] == 0
    code, info = run(capsys, "inspect", "--store", str(tmp_path), "--now-ms", str(LATER))
    assert all(b["all_due"] for n in info["names"] for b in n["buckets"])
    assert info["names"][0]["next_delivery_ms"] is None
    code, info = run(capsys, "inspect", "--store", str(tmp_path), "--name", "u", "--name", "u")
    assert [n["name"] for n in info["names"]] == ["u"]


def test_inspect_reports_an_unreadable_snapshot_and_exits_1(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    build(tmp_path)
    victim = sorted(i for i in object_ids(tmp_path) if i.startswith("t-"))[1]
    path = tmp_path / "objects" / f"{victim}.dixs"
    data = bytearray(path.read_bytes())
    data[12] ^= 0xFF
    path.write_bytes(bytes(data))
    code, info = run(capsys, "inspect", "--store", str(tmp_path), "--now-ms", str(T0))
    assert code == EXIT_CHECK_FAILED
    buckets = info["names"][0]["buckets"]
    assert [b["error_kind"] for b in buckets] == ["", "corrupt", "", ""]
    assert victim in buckets[1]["error"] and len(info["problems"]) == 1
    assert main(["inspect", "--store", str(tmp_path), "--now-ms", str(T0)]) == EXIT_CHECK_FAILED
    out = capsys.readouterr().out
    assert "1 problem(s)" in out and "snapshot unreadable" in out


def test_inspect_human_output(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    build(tmp_path)
    clock = ManualClock(T0)
    with open_index(tmp_path, "t", clock):  # a running writer holds "t"
        assert main(["inspect", "--store", str(tmp_path), "--now-ms", str(T0 + 25_000)]) == 0
    out = capsys.readouterr().out
    assert f"writer: running (pid {os.getpid()})" in out
    assert "writer: none" in out  # "u"
    assert "ledgers" in out and "next delivery" in out and "ok:" in out
    assert "unpersisted:" in out


def test_json_keys_are_stable(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    build(tmp_path)
    _, info = run(capsys, "inspect", "--store", str(tmp_path))
    assert set(info) == {"command", "store", "now_ms", "tick_ms", "names", "problems", "exit_code"}
    name = info["names"][0]
    assert set(name) == {
        "name", "version", "buckets", "intents", "dead_letters", "mark_delete", "writer_status",
        "writer", "error", "error_kind", "messages", "snapshot_bytes", "being_written",
        "next_delivery_ms", "quarantined",
    }  # fmt: skip
    assert set(name["buckets"][0]) == {
        "start_ledger", "end_ledger", "snapshot_id", "num_segments", "num_messages",
        "snapshot_bytes", "loaded_segment", "next_delivery_ms", "due_messages", "below_mark",
        "all_due", "error", "error_kind",
    }  # fmt: skip
    _, report = run_gc(capsys, tmp_path)
    assert set(report) == {
        "command", "store", "now_ms", "grace_ms", "delete", "objects", "object_bytes",
        "referenced", "manifests", "orphans", "young", "corrupt_manifests", "names",
        "temp_files", "deleted", "skipped", "failed", "removed_temp_files", "refused",
        "store_error", "orphan_bytes", "problems", "exit_code",
    }  # fmt: skip
    assert report["grace_ms"] == 600_000 and report["exit_code"] == EXIT_OK
    assert set(report["names"][0]) == {
        "name", "pending_deletes", "pending_creates", "dead_letters", "action", "completed",
        "retried", "remaining_intents", "remaining_dead_letters", "error",
    }  # fmt: skip


# -- usage ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "ms"),
    [("0", 0), ("250ms", 250), ("30s", 30_000), ("10m", 600_000), ("2h", 7_200_000),
     ("1d", 86_400_000), (" 5m ", 300_000)],
)  # fmt: skip
def test_grace_values(text: str, ms: int) -> None:
    assert parse_grace(text) == ms


@pytest.mark.parametrize("text", ["10", "600", "-1m", "1.5h", "10x", "", "m", "10 m", "1w"])
def test_bad_grace_values_are_usage_errors(
    tmp_path: Path, text: str, capsys: pytest.CaptureFixture[str]
) -> None:
    FileStorage(tmp_path)
    with pytest.raises(SystemExit) as exc:
        main(gc_argv(tmp_path, "--grace", text))
    assert exc.value.code == EXIT_USAGE
    assert "grace" in capsys.readouterr().err


def test_usage_errors_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    missing = tmp_path / "missing"
    for command in ("inspect", "gc"):
        assert main([command, "--store", str(missing)]) == EXIT_USAGE
        assert "does not exist" in capsys.readouterr().err
    assert not missing.exists()  # never created
    plain = tmp_path / "plain"
    plain.mkdir()
    assert main(["gc", "--store", str(plain), "--delete"]) == EXIT_USAGE
    assert "not a delayindex store" in capsys.readouterr().err
    assert list(plain.iterdir()) == []
    afile = tmp_path / "file"
    afile.write_text("x")
    assert main(["inspect", "--store", str(afile)]) == EXIT_USAGE
    build(tmp_path / "s")
    assert main(["inspect", "--store", str(tmp_path / "s"), "--name", "nope"]) == EXIT_USAGE
    assert "no manifest named nope" in capsys.readouterr().err
    assert main(["gc", "--store", str(tmp_path / "s"), "--retry-dead-letters"]) == EXIT_USAGE
    assert "needs --delete" in capsys.readouterr().err
    for argv in (
        ["inspect"],
        ["gc", "--store", str(tmp_path), "--name", "../x"],
        ["gc", "--store", str(tmp_path), "--now-ms", "-1"],
    ):
        with pytest.raises(SystemExit) as exc:
            main(argv)
        assert exc.value.code == EXIT_USAGE


def test_help_documents_exit_codes(capsys: pytest.CaptureFixture[str]) -> None:
    for command in ("inspect", "gc"):
        with pytest.raises(SystemExit) as exc:
            main([command, "--help"])
        assert exc.value.code == 0
        out = " ".join(capsys.readouterr().out.split())
        assert "Exit codes: 0 ok" in out and "3 store error" in out


def test_gc_human_output_with_progress(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    build(tmp_path)
    seed_garbage(tmp_path)
    assert main(gc_argv(tmp_path, "--delete")) == EXIT_OK
    out = capsys.readouterr().out
    assert "deleted 2 orphans" in out and "orphan-copy" in out and "young-1" in out
    assert "removed 1 stale temp files" in out and "nothing left to collect" in out
