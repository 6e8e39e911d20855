"""``delayindex inspect --watch``: the live view of a store and of the process writing it."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, start_http_server

from delayindex import FileStorage, ManualClock, SharedDelayIndex, TrackerConfig
from delayindex.cli import EXIT_OK, EXIT_USAGE, main
from delayindex.cli.watch import quantile
from delayindex.executors import InlineExecutor
from delayindex.metrics import register

T0 = 1_000_000
CONFIG = TrackerConfig(min_index_count_per_bucket=4, max_indexes_per_segment=2, tick_ms=0)


@pytest.fixture
def running(tmp_path: Path) -> Iterator[tuple[Path, str, SharedDelayIndex]]:
    """A shared index open in this process (the "running dispatcher") and its exporter."""
    registry = CollectorRegistry()
    register(registry)
    server, thread = start_http_server(0, addr="127.0.0.1", registry=registry)
    clock = ManualClock(T0)
    shared = SharedDelayIndex.open(
        FileStorage(tmp_path), "topic", CONFIG, clock=clock, executor=InlineExecutor()
    )
    a, _ = shared.subscribe("a"), shared.subscribe("b")
    for ledger in range(1, 5):
        for entry in range(4):
            shared.add(ledger, entry, T0 + 100 * ledger + entry)
    shared.flush()
    clock.set(T0 + 250)
    assert len(a.poll(100)) == 8  # ledgers 1 and 2: 150 and 50 ms late (about)
    try:
        yield tmp_path, f"http://127.0.0.1:{server.server_port}/metrics", shared
    finally:
        shared.close()
        server.shutdown()
        server.server_close()
        thread.join(5)


def test_watch_shows_the_store_and_the_running_process(
    running: tuple[Path, str, SharedDelayIndex], capsys: pytest.CaptureFixture[str]
) -> None:
    store, url, shared = running
    code = main(["inspect", "--store", str(store), "--watch", "0", "--watch-count", "2",
                 "--metrics-url", url])  # fmt: skip
    out = capsys.readouterr().out
    assert code == EXIT_OK, out
    assert "running process (exporter)" in out and "subscriptions (exporter)" in out
    assert "topic" in out and f"{len(shared):,}" in out
    backlog_b = shared.stats()["subscriptions"]["b"]["backlog"]
    assert backlog_b == 16 and "16" in out


def test_watch_json_prints_one_object_per_refresh(
    running: tuple[Path, str, SharedDelayIndex], capsys: pytest.CaptureFixture[str]
) -> None:
    store, url, shared = running
    code = main(["inspect", "--store", str(store), "--watch", "0", "--watch-count", "3",
                 "--metrics-url", url, "--json"])  # fmt: skip
    lines = [line for line in capsys.readouterr().out.splitlines() if line.strip()]
    assert code == EXIT_OK and len(lines) == 3
    for line in lines:
        payload = json.loads(line)
        assert [n["name"] for n in payload["names"]] == ["topic"]
        process = payload["process"]["indexes"]["topic"]
        assert process["delayed"] == len(shared)
        subs = process["subscriptions"]
        stats = shared.stats()["subscriptions"]
        assert subs["b"]["backlog"] == stats["b"]["backlog"] == 16
        assert subs["a"]["backlog"] == stats["a"]["backlog"] == 8
        assert subs["b"]["lateness_p99_s"] is None  # b never polled
        assert subs["a"]["lateness_p99_s"] == 0.256  # 150 ms late falls in (128, 256]


def test_watch_reports_an_unreachable_exporter_and_bad_usage(
    running: tuple[Path, str, SharedDelayIndex], capsys: pytest.CaptureFixture[str]
) -> None:
    store, _, _ = running
    code = main(["inspect", "--store", str(store), "--watch", "0", "--watch-count", "1",
                 "--metrics-url", "http://127.0.0.1:1/metrics", "--json"])  # fmt: skip
    payload = json.loads(capsys.readouterr().out)
    assert code == EXIT_OK and "cannot scrape" in payload["process"]["error"]
    with pytest.raises(SystemExit) as exc:  # argparse's own usage error
        main(["inspect", "--store", str(store), "--watch", "-1"])
    assert exc.value.code == EXIT_USAGE
    for bad in (["--metrics-url", "http://x"], ["--watch", "0", "--plot", "x.png"],
                ["--watch", "0", "--watch-count", "0"]):  # fmt: skip
        assert main(["inspect", "--store", str(store), *bad]) == EXIT_USAGE, bad
        capsys.readouterr()


def test_quantile_of_a_cumulative_histogram() -> None:
    buckets = [(0.001, 1.0), (0.002, 1.0), (0.004, 3.0), (float("inf"), 4.0)]
    assert quantile(buckets, 0.25) == 0.001
    assert quantile(buckets, 0.5) == 0.004
    assert quantile(buckets, 0.99) == float("inf")
    assert quantile([(float("inf"), 0.0)], 0.5) is None
