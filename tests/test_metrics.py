"""The Prometheus exporter (``delayindex.metrics``), scraped over HTTP like a Prometheus server.

One test drives an InMemoryTracker, a DelayIndex and a SharedDelayIndex through seals, merges,
storage faults (a dead letter), a quarantine, cancels and polls at known lateness; starts
prometheus-client's HTTP exporter on a loopback port; scrapes it; parses the text with
prometheus-client's parser; and checks every family against ``stats()`` and against what the
test did (lateness buckets, operation counts, backlog).
"""

from __future__ import annotations

import json
import re
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from prometheus_client import CollectorRegistry, generate_latest, start_http_server
from prometheus_client.parser import text_string_to_metric_families

from delayindex import (
    DelayIndex,
    InMemoryTracker,
    ManualClock,
    MemoryStorage,
    SharedDelayIndex,
    TrackerConfig,
)
from delayindex._lateness import BUCKETS, bucket_of
from delayindex.executors import InlineExecutor
from delayindex.metrics import register
from delayindex.snapshot.codec import header_bytes_needed, read_header

T0 = 1_000_000
TINY = TrackerConfig(
    tick_ms=0,
    min_index_count_per_bucket=4,
    max_indexes_per_segment=2,
    max_num_buckets=3,
    load_retry_delay_ms=5,
    delete_retry_delay_ms=5,
    max_delete_attempts=1,  # one failed delete (of 4 attempts) makes a dead letter
)
FAMILIES = {
    "delayindex_buckets", "delayindex_memory_usage_bytes", "delayindex_delayed",
    "delayindex_delayed_in_memory", "delayindex_delayed_in_last_mutable_bucket",
    "delayindex_bucket_merges", "delayindex_bucket_deletes", "delayindex_snapshot_ops",
    "delayindex_snapshot_op_seconds", "delayindex_unpersisted", "delayindex_dead_letters",
    "delayindex_quarantined_buckets", "delayindex_delivery_lateness_seconds",
    "delayindex_subscription_backlog",
}  # fmt: skip


@pytest.fixture
def exporter() -> Iterator[tuple[CollectorRegistry, int]]:
    registry = CollectorRegistry()
    assert register(registry) is not None
    assert register(registry) is None  # idempotent
    server, thread = start_http_server(0, addr="127.0.0.1", registry=registry)
    try:
        yield registry, server.server_port
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


def test_register_installs_on_every_new_registry_even_at_a_reused_address() -> None:
    # A registry freed and another allocated at its address (CPython reuses it at once) must
    # still get the collector: registries are remembered by object, not by id().
    for _ in range(50):
        registry = CollectorRegistry()
        assert register(registry) is not None
        assert register(registry) is None
        assert "delayindex_info" in {family.name for family in registry.collect()}
        del registry


def scrape(port: int) -> dict[str, Any]:
    """family name -> {(sample name, sorted labels): value}, read over HTTP."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        text = response.read().decode()
    out: dict[str, Any] = {}
    for family in text_string_to_metric_families(text):
        samples = out.setdefault(family.name, {})
        for s in family.samples:
            samples[s.name, tuple(sorted(s.labels.items()))] = s.value
    return out


def value(metrics: dict[str, Any], family: str, sample: str | None = None, **labels: str) -> float:
    return metrics[family][sample or family, tuple(sorted(labels.items()))]  # type: ignore[no-any-return]


def flip_segment(storage: MemoryStorage, snapshot_id: str, segment: int) -> None:
    original = storage.raw_object(snapshot_id)
    header = read_header(original[: header_bytes_needed(original, "x")], "x")
    at = header.entry_offset(segment) + header.entry_lengths[segment] // 2
    damaged = bytearray(original)
    damaged[at] ^= 0x10
    storage.put_raw_object(snapshot_id, bytes(damaged))


def check_histogram(
    metrics: dict[str, Any], family: str, counts: list[int], total: float, **labels: str
) -> None:
    """A scraped histogram equals the given per-bucket counts (cumulated) and sum."""
    series = {
        dict(lab)["le"]: v
        for (name, lab), v in metrics[family].items()
        if name == family + "_bucket" and {k: v for k, v in lab if k != "le"} == labels
    }
    assert sorted(series.values()) == list(np.cumsum(counts).astype(float))
    assert value(metrics, family, family + "_count", **labels) == sum(counts)
    assert value(metrics, family, family + "_sum", **labels) == pytest.approx(total)


def test_an_index_whose_stats_raise_is_counted_and_logged_and_costs_no_other_its_series(
    exporter: tuple[Any, int], caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    _, port = exporter
    clock = ManualClock(T0)
    good = DelayIndex.open(MemoryStorage(clock=clock), "good", TINY, clock=clock)
    bad = DelayIndex.open(MemoryStorage(clock=clock), "bad", TINY, clock=clock)
    try:
        good.add(1, 0, T0 + 100)

        def broken() -> dict[str, Any]:
            raise RuntimeError("stats exploded")

        monkeypatch.setattr(bad, "stats", broken)
        with caplog.at_level("WARNING", logger="delayindex"):
            scrape(port)
            families = scrape(port)
        delayed = families["delayindex_delayed"]
        assert delayed[("delayindex_delayed", (("index", "good"),))] == 1.0
        assert not any(("index", "bad") in labels for _, labels in delayed)
        errors = families["delayindex_collect_errors"]
        assert errors[("delayindex_collect_errors_total", (("index", "bad"),))] == 2.0
        logged = [r.getMessage() for r in caplog.records if "stats exploded" in r.getMessage()]
        assert len(logged) == 1 and "index bad" in logged[0]  # once per index and kind
    finally:
        good.close()
        bad.close()


def test_the_exporter_reports_every_family_over_http(exporter: tuple[Any, int]) -> None:
    _, port = exporter
    clock = ManualClock(T0)
    storage = MemoryStorage(clock=clock)

    # An in-memory tracker: three messages polled 0, 3 and 700 ms late.
    memory = InMemoryTracker(TrackerConfig(tick_ms=0), clock=clock)
    for entry, due in enumerate((T0 + 10, T0 + 7, T0 - 683 + 0)):
        memory.add(1, entry, max(due, T0 + 1))
    clock.set(T0 + 10)
    memory.poll(10)

    # A DelayIndex: seals, merges, a dead letter, a quarantine, cancels, polls.
    index = DelayIndex.open(storage, "metrics-di", TINY, clock=clock, executor=InlineExecutor())
    for ledger in range(1, 9):
        for entry in range(4):
            index.add(ledger, entry, T0 + 1_000 + 100 * ledger + entry)
    assert index.cancel(8, 3) and index.cancel(7, 0)
    storage.inject_failure("create", times=4)  # every attempt of the next create fails
    for entry in range(4):
        index.add(9, entry, T0 + 5_000 + entry)
    index.add(10, 0, T0 + 6_000)  # seals ledger 9's bucket: its create fails
    durable = [b for b in index.buckets() if b.state == "durable" and b.snapshot_id]
    flip_segment(storage, durable[-1].snapshot_id, 2)  # type: ignore[arg-type]
    clock.set(T0 + 1_200)
    late_di = [bucket_of(T0 + 1_200 - (T0 + 1_000 + 100 + e)) for e in range(4)]
    assert len(index.poll(4)) == 4
    storage.inject_failure("delete", times=4)  # the next delete fails: a dead letter
    clock.set(T0 + 10_000)
    while index.poll(100):
        pass
    stats = index.stats()
    assert stats["quarantined_buckets"] == 1, stats["problems"]
    assert stats["ops"]["merge"]["succeeded"] >= 1 and stats["ops"]["create"]["failed"] >= 1

    # A shared index: "a" drains, "b" never polls.
    shared = SharedDelayIndex.open(
        storage, "metrics-shared", TINY, clock=clock, executor=InlineExecutor()
    )
    a, b = shared.subscribe("a"), shared.subscribe("b")
    for entry in range(6):
        shared.add(20, entry, T0 + 10_010 + 10 * entry)
    clock.set(T0 + 10_070)
    assert len(a.poll(100)) == 6

    metrics = scrape(port)
    assert set(metrics) >= FAMILIES, sorted(FAMILIES - set(metrics))

    tracker: InMemoryTracker | DelayIndex | SharedDelayIndex  # the two loops below
    for name, tracker in (("metrics-di", index), ("metrics-shared", shared)):
        st = tracker.stats()
        assert value(metrics, "delayindex_buckets", index=name) == st["buckets"]
        assert value(metrics, "delayindex_delayed", index=name) == len(tracker)
        assert len(tracker) == st.get("delayed", st["tracked"])
        assert value(metrics, "delayindex_unpersisted", index=name) == st["unpersisted"]
        assert value(metrics, "delayindex_memory_usage_bytes", index=name) == st["memory_bytes"]
        assert value(metrics, "delayindex_dead_letters", index=name) == len(st["dead_letters"])
        assert (
            value(metrics, "delayindex_quarantined_buckets", index=name)
            == (st["quarantined_buckets"])
        )
        assert (
            value(metrics, "delayindex_delayed_in_last_mutable_bucket", index=name)
            == (st["mutable_nodes"])
        )
        assert value(metrics, "delayindex_problems", index=name) == len(st["problems"])
        assert value(metrics, "delayindex_retrying_loads", index=name) == len(st["retrying_loads"])
        assert (
            value(metrics, "delayindex_blocked_on_persistence", index=name)
            == (st["blocked_on_persistence"])
        )
        for key in ("cancel_overrides", "reschedule_overrides", "snapshot_bytes"):
            assert value(metrics, f"delayindex_{key}", index=name) == st[key], key
        kind = type(tracker).__name__
        assert value(metrics, "delayindex_info", index=name, implementation=st["implementation"],
                     build=st["build"], kind=kind) == 1  # fmt: skip
        in_memory = st["mutable_nodes"] + st["direct_nodes"] + st["loaded"] + st.get("due_log", 0)
        assert value(metrics, "delayindex_delayed_in_memory", index=name) == in_memory
        ops = st["ops"]
        assert value(metrics, "delayindex_bucket_merges", "delayindex_bucket_merges_total",
                     index=name) == ops["merge"]["succeeded"]  # fmt: skip
        assert value(metrics, "delayindex_bucket_deletes", "delayindex_bucket_deletes_total",
                     index=name) == ops["delete"]["succeeded"]  # fmt: skip
        for op, row in ops.items():
            for result, key in (("success", "succeeded"), ("failure", "failed")):
                assert value(metrics, "delayindex_snapshot_ops", "delayindex_snapshot_ops_total",
                             index=name, op=op, result=result) == row[key]  # fmt: skip
            check_histogram(metrics, "delayindex_snapshot_op_seconds", row["latency_buckets"],
                            row["total_ms"] / 1000, index=name, op=op)  # fmt: skip

    # What the test did, not only what stats() says.
    assert value(metrics, "delayindex_quarantined_buckets", index="metrics-di") == 1
    assert value(metrics, "delayindex_dead_letters", index="metrics-di") >= 1
    assert value(metrics, "delayindex_cancel_overrides", index="metrics-di") == 2
    assert value(metrics, "delayindex_delayed", index="metrics-di") == len(index)
    st = index.stats()
    check_histogram(metrics, "delayindex_delivery_lateness_seconds", st["lateness"],
                    st["lateness_ms"] / 1000, index="metrics-di", subscription="")  # fmt: skip
    assert [st["lateness"][k] >= late_di.count(k) for k in set(late_di)] == [True] * len(
        set(late_di)
    )
    shared_stats = shared.stats()["subscriptions"]
    a_counts = [0] * BUCKETS
    for entry in range(6):
        a_counts[bucket_of(60 - 10 * entry)] += 1
    check_histogram(metrics, "delayindex_delivery_lateness_seconds", a_counts,
                    sum(60 - 10 * e for e in range(6)) / 1000,
                    index="metrics-shared", subscription="a")  # fmt: skip
    assert shared_stats["a"]["lateness"] == a_counts
    check_histogram(metrics, "delayindex_delivery_lateness_seconds", [0] * BUCKETS, 0,
                    index="metrics-shared", subscription="b")  # fmt: skip
    assert value(metrics, "delayindex_subscription_backlog", index="metrics-shared",
                 subscription="b") == len(b) == 6  # fmt: skip
    assert value(metrics, "delayindex_subscription_backlog", index="metrics-shared",
                 subscription="a") == len(a) == 0  # fmt: skip
    assert value(metrics, "delayindex_subscription_lag", index="metrics-shared",
                 subscription="b") == shared_stats["b"]["lag"]  # fmt: skip

    # The in-memory tracker: its lateness (0, 3 and 9 ms late) and size.
    [memory_label] = [
        dict(lab)["index"]
        for (name, lab) in metrics["delayindex_info"]
        if dict(lab)["kind"] == "InMemoryTracker"
        and dict(lab)["index"].startswith("in-memory-")
        and value(metrics, "delayindex_delayed", index=dict(lab)["index"]) == len(memory)
        and metrics["delayindex_delivery_lateness_seconds"].get(
            ("delayindex_delivery_lateness_seconds_count",
             (("index", dict(lab)["index"]), ("subscription", ""))))
        == 3
    ]  # fmt: skip
    m_counts = [0] * BUCKETS
    for late in (0, 3, 9):
        m_counts[bucket_of(late)] += 1
    check_histogram(metrics, "delayindex_delivery_lateness_seconds", m_counts, 12 / 1000,
                    index=memory_label, subscription="")  # fmt: skip

    # Closed trackers leave the scrape.
    for tracker in (memory, index, shared):
        tracker.close()
    after = scrape(port)
    labels = {dict(lab)["index"] for (_, lab) in after.get("delayindex_info", {})}
    assert not labels & {"metrics-di", "metrics-shared", memory_label}


DOCS = Path(__file__).resolve().parent.parent / "docs"


def exported_sample_names() -> set[str]:
    """Every sample name the exporter produces with each kind of tracker open."""
    registry = CollectorRegistry()
    register(registry)
    clock = ManualClock(T0)
    storage = MemoryStorage(clock=clock)
    memory = InMemoryTracker(TrackerConfig(), clock=clock)
    index = DelayIndex.open(storage, "names-di", clock=clock, executor=InlineExecutor())
    shared = SharedDelayIndex.open(storage, "names-shared", clock=clock, executor=InlineExecutor())
    shared.subscribe("s")
    try:
        text = generate_latest(registry).decode()
    finally:
        for tracker in (memory, index, shared):
            tracker.close()
    return {s.name for f in text_string_to_metric_families(text) for s in f.samples}


def metric_names(expr: str) -> set[str]:
    return set(re.findall(r"\bdelayindex_[a-z_]+", expr))


def test_the_dashboard_is_grafana_json_and_queries_only_exported_metrics() -> None:
    dashboard = json.loads((DOCS / "grafana" / "delayindex-dashboard.json").read_text())
    assert isinstance(dashboard["title"], str) and dashboard["title"]
    assert isinstance(dashboard["uid"], str) and 0 < len(dashboard["uid"]) <= 40
    assert isinstance(dashboard["schemaVersion"], int) and dashboard["schemaVersion"] >= 30
    assert set(dashboard["time"]) == {"from", "to"}
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    panels = dashboard["panels"]
    assert panels and len({p["id"] for p in panels}) == len(panels)
    exported = exported_sample_names()
    queried: set[str] = set(metric_names(variables["index"]["query"]))
    for panel in panels:
        assert panel["type"] in {"timeseries", "stat", "gauge", "table", "bargauge"}
        assert panel["title"] and panel["targets"], panel
        grid = panel["gridPos"]
        assert all(isinstance(grid[k], int) for k in "hwxy") and grid["x"] + grid["w"] <= 24
        refs = [t["refId"] for t in panel["targets"]]
        assert len(set(refs)) == len(refs)
        for target in panel["targets"]:
            names = metric_names(target["expr"])
            assert names, target["expr"]
            assert names <= exported, (panel["title"], sorted(names - exported))
            queried |= names
    # Every family an operator alerts on is on the dashboard.
    for family in ("delayindex_quarantined_buckets", "delayindex_dead_letters",
                   "delayindex_unpersisted", "delayindex_subscription_backlog",
                   "delayindex_delivery_lateness_seconds_bucket"):  # fmt: skip
        assert family in queried, family


def test_the_runbook_alerts_query_only_exported_metrics() -> None:
    text = (DOCS / "operations.md").read_text()
    blocks = re.findall(r"```promql\n(.*?)```", text, flags=re.S)
    assert len(blocks) >= 6
    exported = exported_sample_names()
    for block in blocks:
        names = metric_names(block)
        assert names and names <= exported, (block, sorted(names - exported))


def test_every_warning_is_logged_once_per_distinct_problem(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = ManualClock(T0)
    storage = MemoryStorage(clock=clock)
    index = DelayIndex.open(storage, "logged", TINY, clock=clock, executor=InlineExecutor())
    try:
        with caplog.at_level("WARNING", logger="delayindex"):
            for ledger in range(1, 9):
                for entry in range(4):
                    index.add(ledger, entry, T0 + 1_000 + 100 * ledger + entry)
            storage.inject_failure("create", times=4)
            for entry in range(4):
                index.add(9, entry, T0 + 5_000 + entry)
            index.add(10, 0, T0 + 6_000)
            durable = [b for b in index.buckets() if b.state == "durable" and b.snapshot_id]
            flip_segment(storage, durable[-1].snapshot_id, 2)  # type: ignore[arg-type]
            storage.inject_failure("delete", times=4)
            for _ in range(3):  # the same read failure, again and again: logged once
                storage.inject_failure("get_segments", times=4)
                clock.advance(1_000)
                index.poll(1)
            clock.set(T0 + 100_000)
            while index.poll(100):
                pass
        stats = index.stats()
        logged = [r.getMessage() for r in caplog.records if r.name.startswith("delayindex")]
        assert len(stats["warnings"]) >= 4
        for warning in stats["warnings"]:
            assert sum(warning in message for message in logged) == 1, warning
        # Each problem an operator must act on was logged when it arose.
        quarantined = [b.snapshot_id for b in index.buckets() if b.state == "quarantined"]
        assert quarantined and stats["problems"]
        for snapshot_id in quarantined:
            assert snapshot_id is not None  # a stored bucket's
            assert any(snapshot_id in m and "quarantined" in m for m in logged)
        assert any("dead letter" in m for m in logged) and stats["dead_letters"]
    finally:
        index.close()
