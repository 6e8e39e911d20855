"""``delayindex inspect --schedule [--plot]`` and ``delayindex pending`` on real FileStorage
stores written by DelayIndex and SharedDelayIndex.

The CLI reads the schedule offline (``delayindex.schedule``); every count and list is checked
against the library's own ``due_histogram``/``pending`` on the index reopened at the same time
(what the offline read promises to equal), and against the positions the test cancelled,
rescheduled and left in the writer's memory. matplotlib is a ``test`` extra: ``--plot`` is
always drawn, never skipped.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from delayindex import DelayIndex, FileStorage, ManualClock, SharedDelayIndex, TrackerConfig
from delayindex.cli import EXIT_CHECK_FAILED, EXIT_OK, EXIT_STORE_ERROR, EXIT_USAGE, main
from delayindex.cli.schedule import parse_time
from delayindex.executors import InlineExecutor

T0 = 1_767_225_600_000  # 2026-01-01T00:00:00Z
MINUTE = 60_000
HOUR = 3_600_000
CONFIG = TrackerConfig(
    min_index_count_per_bucket=4, max_num_buckets=0, max_indexes_per_segment=2, tick_ms=0
)
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
CANCELLED = [(2, 1), (5, 3), (9, 0)]
MOVED = (4, 2, T0 + 20 * HOUR)  # the latest time of all: its own bin
LEDGERS = range(1, 13)


def deliver_at(ledger: int, entry: int) -> int:
    """Times spread over about 8 hours, not in ledger order."""
    return T0 + (ledger % 5) * HOUR + ledger * 7 * MINUTE + entry * MINUTE


def open_index(root: Path, now: int) -> DelayIndex:
    return DelayIndex.open(
        FileStorage(root), "t", CONFIG, clock=ManualClock(now), executor=InlineExecutor()
    )


@pytest.fixture
def store(tmp_path: Path) -> Path:
    """Index "t": 12 ledgers of 5 entries; 3 cancelled, one rescheduled; the last ledger stays
    in the writer's memory (the mutable bucket) when it closes."""
    root = tmp_path / "store"
    root.mkdir()
    with open_index(root, T0) as index:
        for ledger in LEDGERS:
            for entry in range(5):
                assert index.add(ledger, entry, deliver_at(ledger, entry))
        index.flush()
        assert index.cancel_many(*zip(*CANCELLED, strict=True)).all()
        assert index.reschedule(*MOVED)
        index.flush()
        # Ledger 12, and the moved position in the direct heap (its snapshot copy shadowed; the
        # durable override gives a reopen its new time).
        assert index.unpersisted() == 6
    return root


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def inspect_json(capsys: pytest.CaptureFixture[str], root: Path, *extra: str) -> dict[str, Any]:
    code, out, _ = run(
        capsys, "inspect", "--store", str(root), "--name", "t", "--schedule", "--json", *extra
    )
    assert code == EXIT_OK, out
    payload: dict[str, Any] = json.loads(out)
    return payload


def reopened_histogram(root: Path, now: int, edges: list[int]) -> list[int]:
    with open_index(root, now) as index:
        counts: list[int] = index.due_histogram(edges).tolist()
        return counts


def test_schedule_counts_equal_the_library_histogram(
    store: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    payload = inspect_json(capsys, store, "--now-ms", str(T0), "--bins", "7")
    schedule = payload["names"][0]["schedule"]
    edges, counts = schedule["edges"], schedule["counts"]
    assert len(edges) == 8 and len(counts) == 7
    # Persisted: ledgers 1-11, 55 positions, minus the cancelled; the moved one still counts.
    assert sum(counts) == schedule["pending"] == 11 * 5 - len(CANCELLED)
    assert schedule["memory_only"] == 6
    assert edges[-1] == MOVED[2] + 1  # the range ends after the latest (the moved one)
    assert counts[-1] == 1  # ... which is alone in the last bin
    assert counts == reopened_histogram(store, T0, edges)


def test_cancelled_and_moved_positions_are_not_counted_at_their_old_times(
    store: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for ledger, entry in [*CANCELLED, MOVED[:2]]:
        at = deliver_at(ledger, entry)
        edges = [at, at + 1]
        payload = inspect_json(
            capsys, store, "--now-ms", str(T0), "--from", str(at), "--to", str(at + 1)
        )
        schedule = payload["names"][0]["schedule"]
        assert schedule["edges"] == edges
        same_time = (
            {(lg, e) for lg in LEDGERS[:-1] for e in range(5) if deliver_at(lg, e) == at}
            - set(CANCELLED)
            - {MOVED[:2]}
        )
        assert schedule["counts"] == [len(same_time)]
        assert schedule["counts"] == reopened_histogram(store, T0, edges)


def test_schedule_later_skips_wholly_due_segments_like_a_reopen(
    store: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    now = T0 + 3 * HOUR
    payload = inspect_json(capsys, store, "--now-ms", str(now), "--bins", "5")
    schedule = payload["names"][0]["schedule"]
    assert schedule["due_skipped"] > 0
    assert schedule["counts"] == reopened_histogram(store, now, schedule["edges"])


def test_human_histogram_has_bars_times_and_the_total(
    store: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = run(capsys, "inspect", "--store", str(store), "--schedule", "--now-ms", str(T0))
    assert code == EXIT_OK
    assert "pending schedule of index t: 52" in out
    assert "total 52 in 20 bins" in out
    assert "2026-01-01 " in out and "█" in out
    assert "6 as the writer last reported" in out  # the memory-only part is named


def test_plot_writes_a_png(store: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    png = tmp_path / "schedule.png"
    code, out, _ = run(
        capsys, "inspect", "--store", str(store), "--plot", str(png), "--now-ms", str(T0)
    )
    assert code == EXIT_OK, out
    data = png.read_bytes()
    assert data.startswith(PNG_SIGNATURE)
    assert len(data) > 10_000  # axes, bars, labels: not an empty canvas
    width, height = int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")
    assert (width, height) == (1000, 450)
    from matplotlib import image

    pixels = image.imread(png)
    assert len(np.unique(pixels.reshape(-1, pixels.shape[-1]), axis=0)) > 10  # drawn


def test_plot_without_matplotlib_says_how_to_install(
    store: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    png = tmp_path / "schedule.png"
    code, _, err = run(capsys, "inspect", "--store", str(store), "--plot", str(png))
    assert code == EXIT_USAGE
    assert "pip install" in err and "delayindex[plot]" in err
    assert not png.exists()


def test_pending_json_equals_the_library(store: Path, capsys: pytest.CaptureFixture[str]) -> None:
    start, end = T0 + HOUR, T0 + 5 * HOUR
    code, out, _ = run(
        capsys, "pending", str(store), "t", "--from", str(start), "--to", str(end),
        "--now-ms", str(T0), "--json",
    )  # fmt: skip
    assert code == EXIT_OK
    listed = json.loads(out)
    with open_index(store, T0) as index:
        expected = index.pending(start, end)
    assert listed == [
        {"deliver_at": t, "ledger_id": p.ledger_id, "entry_id": p.entry_id} for t, p in expected
    ]
    assert 0 < len(listed) < 52
    positions = {(i["ledger_id"], i["entry_id"]) for i in listed}
    assert not positions & set(CANCELLED)


def test_pending_limit_iso_times_and_the_moved_position(
    store: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = run(
        capsys, "pending", str(store), "t", "--from", "2026-01-01T19:00", "--now-ms", str(T0),
        "--json",
    )  # fmt: skip
    assert code == EXIT_OK
    assert json.loads(out) == [{"deliver_at": MOVED[2], "ledger_id": 4, "entry_id": 2}]
    code, out, _ = run(capsys, "pending", str(store), "t", "--now-ms", str(T0), "--limit", "3")
    assert code == EXIT_OK
    assert "3 listed (--limit 3; more pending in the range); 52 pending" in out
    with open_index(store, T0) as index:
        first = index.pending(limit=3)
    for t, p in first:
        assert f"{p.ledger_id}:{p.entry_id}" in out and str(t) in out


def test_shared_index_schedule_equals_the_library(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = tmp_path / "store"
    root.mkdir()

    def open_shared(now: int) -> SharedDelayIndex:
        return SharedDelayIndex.open(
            FileStorage(root), "s", CONFIG, clock=ManualClock(now), executor=InlineExecutor()
        )

    with open_shared(T0) as shared:
        a, b = shared.subscribe("a"), shared.subscribe("b")
        for ledger in LEDGERS:
            for entry in range(5):
                shared.add(ledger, entry, deliver_at(ledger, entry))
        shared.flush()
        shared.cancel(6, 2)
        a.set_mark_delete(2, 4)
        b.set_mark_delete(3, 0)
        shared.flush()
    code, out, _ = run(
        capsys, "inspect", "--store", str(root), "--schedule", "--now-ms", str(T0), "--json"
    )
    assert code == EXIT_OK
    payload = json.loads(out)
    schedule = payload["names"][0]["schedule"]
    with open_shared(T0) as shared:
        assert schedule["counts"] == shared.due_histogram(schedule["edges"]).tolist()
        expected = shared.pending(limit=10_000)
    assert sum(schedule["counts"]) == 9 * 5 - 1  # after the lowest mark (2:4), one cancelled
    code, out, _ = run(capsys, "pending", str(root), "s", "--now-ms", str(T0), "--json")
    assert code == EXIT_OK
    assert [(i["deliver_at"], i["ledger_id"], i["entry_id"]) for i in json.loads(out)] == [
        (t, p.ledger_id, p.entry_id) for t, p in expected
    ]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["inspect", "--store", "{store}", "--name", "nope", "--schedule"], "no manifest named"),
        (["pending", "{store}", "nope"], "no manifest named"),
        (
            ["inspect", "--store", "{store}", "--schedule", "--from", "5", "--to", "5"],
            "before --to",
        ),
        (["pending", "{store}", "t", "--from", "9", "--to", "3"], "must be before --to"),
        (["inspect", "--store", "{store}", "--bins", "4"], "add --schedule"),
        (["pending", "{missing}", "t"], "does not exist"),
    ],
)
def test_bad_input_is_a_usage_error(
    store: Path, argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    args = [a.format(store=store, missing=store / "missing") for a in argv]
    code, _, err = run(capsys, *args)
    assert code == EXIT_USAGE
    assert message in err


@pytest.mark.parametrize("bins", ["0", "-3", "x"])
def test_bad_bins_are_refused_by_argparse(
    store: Path, bins: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["inspect", "--store", str(store), "--schedule", "--bins", bins])
    assert exc.value.code == EXIT_USAGE
    assert "--bins" in capsys.readouterr().err


def test_plot_needs_one_name(
    store: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    DelayIndex.open(FileStorage(store), "u", CONFIG, executor=InlineExecutor()).close()
    code, _, err = run(capsys, "inspect", "--store", str(store), "--plot", str(tmp_path / "x.png"))
    assert code == EXIT_USAGE and "--plot draws one name" in err


def test_missing_snapshot_is_reported_and_not_counted(
    store: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    victim = sorted((store / "objects").glob("t-3-3-*"))
    assert victim
    for path in victim:
        path.unlink()
    code, out, _ = run(
        capsys, "inspect", "--store", str(store), "--name", "t", "--schedule", "--json",
        "--now-ms", str(T0),
    )  # fmt: skip
    assert code == EXIT_CHECK_FAILED
    schedule = json.loads(out)["names"][0]["schedule"]
    assert [e["kind"] for e in schedule["errors"]] == ["missing"]
    assert schedule["pending"] == 11 * 5 - len(CANCELLED) - 5  # ledger 3's five are gone
    code, out, err = run(capsys, "pending", str(store), "t", "--now-ms", str(T0), "--json")
    assert code == EXIT_CHECK_FAILED
    assert len(json.loads(out)) == 47 and "not counted" in err


def test_damaged_manifest_is_a_store_error(store: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for path in (store / "manifests").iterdir():
        if path.is_file():
            path.write_bytes(b"garbage")
    code, _, _ = run(capsys, "pending", str(store), "t", "--now-ms", str(T0))
    assert code == EXIT_STORE_ERROR


def test_parse_time() -> None:
    assert parse_time("1_767_225_600_000") == T0
    assert parse_time("2026-01-01T00:00:00Z") == T0
    assert parse_time("2026-01-01T01:00:00+01:00") == T0
    assert parse_time("2026-01-01 00:00:00.250") == T0 + 250


def test_a_position_moved_to_a_due_time_is_not_pending_like_a_reopen(
    store: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with open_index(store, T0) as index:
        assert index.reschedule(1, 0, T0 + 10 * MINUTE)  # not due yet at T0
    now = T0 + 30 * MINUTE  # due by now: a reopen's reschedule untracks it for delivery
    payload = inspect_json(capsys, store, "--now-ms", str(now))
    schedule = payload["names"][0]["schedule"]
    assert schedule["moved_due"] == 1
    with open_index(store, now) as index:
        assert schedule["counts"] == index.due_histogram(schedule["edges"]).tolist()
        assert not index.pending(T0 + 10 * MINUTE, T0 + 10 * MINUTE + 1)
    assert schedule["pending"] == 11 * 5 - len(CANCELLED) - 1
