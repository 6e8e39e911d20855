"""Prometheus metrics for every open tracker of the process (the optional ``metrics`` extra).

How it works. :func:`register` installs one collector on a prometheus-client registry. At each
scrape the collector walks the process's open trackers (``InMemoryTracker``, ``DelayIndex``,
``SharedDelayIndex``; each enrolls itself when it opens and leaves when it closes) and turns
their ``stats()`` into metric families. Nothing runs on the hot path: the counters are the ones
the trackers keep anyway, and the delivery lateness histogram is counted by ``poll`` in the
cores (one bit-length per delivered message, see ``delayindex._lateness``).

Labels: ``index`` is the index name (``in-memory-<n>`` for an ``InMemoryTracker``, numbered in
the order they were created); families about a subscription also carry ``subscription``. The
lateness histogram carries ``subscription`` too: empty for a tracker that is not shared, one
series per subscription for a shared index.

Families (gauges unless noted; see ``docs/operations.md`` for what to do about each)::

    delayindex_buckets                        buckets (mutable, sealed, quarantined)
    delayindex_memory_usage_bytes             resident estimate
    delayindex_delayed                        positions tracked
    delayindex_delayed_in_memory              index entries held in memory
    delayindex_delayed_in_last_mutable_bucket entries in the mutable bucket's heap
    delayindex_bucket_merges_total            counter: merges done
    delayindex_bucket_deletes_total           counter: snapshot deletes done
    delayindex_snapshot_ops_total{op,result}  counter: storage operations by outcome
    delayindex_snapshot_op_seconds{op}        histogram: storage operation latency
    delayindex_unpersisted                    positions a crash would lose (replay needed)
    delayindex_blocked_on_persistence         1 while deliveries pause for storage
    delayindex_dead_letters                   deletes given up on (retry them: gc)
    delayindex_quarantined_buckets            damaged buckets set aside
    delayindex_problems                       distinct problems needing an operator
    delayindex_retrying_loads                 buckets whose segment reads are retried
    delayindex_cancel_overrides               cancels kept against the replay
    delayindex_reschedule_overrides           reschedules kept against the replay
    delayindex_snapshot_bytes                 bytes of snapshots in storage
    delayindex_delivery_lateness_seconds{subscription}  histogram: poll time - deliver_at
    delayindex_subscription_backlog{subscription}       positions still to receive
    delayindex_subscription_lag{subscription}           due-log keys not yet read
    delayindex_info{implementation,build}     1, labelled with the build (native or pure, and why)
    delayindex_collect_errors_total           counter: scrapes whose stats() of the index raised

A tracker whose ``stats()`` raises is left out of that scrape, never the others; the failure is
counted in ``delayindex_collect_errors_total`` and logged once per index and kind of error.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable, Iterator
from typing import Any

try:
    from prometheus_client import REGISTRY, CollectorRegistry
    from prometheus_client.core import (
        CounterMetricFamily,
        GaugeMetricFamily,
        HistogramMetricFamily,
        Metric,
    )
    from prometheus_client.registry import Collector
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError(
        "delayindex.metrics needs prometheus-client: pip install 'delayindex[metrics]'"
    ) from exc

from delayindex import _registry
from delayindex._lateness import upper_bounds_seconds
from delayindex.tracker._damage import ProblemLog
from delayindex.tracker._stats import OP_LATENCY_BOUNDS_MS

__all__ = ["DelayIndexCollector", "register"]

_OPS = ("create", "load", "delete", "merge", "recover")
Stats = dict[str, Any]


def _n(stats: Stats, key: str) -> float:
    """A number of ``stats`` (0 when this kind of tracker has no such key)."""
    value = stats.get(key)
    return float(value) if value is not None else 0.0


def _size(stats: Stats, key: str) -> float:
    """The length of a list or dict of ``stats`` (0 when absent)."""
    return float(len(stats.get(key) or ()))


def _heap_nodes(stats: Stats) -> float:
    # The mutable bucket's heap; an InMemoryTracker's one heap.
    return _n(stats, "mutable_nodes") if "mutable_nodes" in stats else _n(stats, "heap_nodes")


#: The per-index gauges: (family, help, reading of a tracker's stats()).
_GAUGES: tuple[tuple[str, str, Callable[[Stats], float]], ...] = (
    ("delayindex_buckets", "Buckets of the index (mutable, sealed and quarantined).",
     lambda s: _n(s, "buckets")),
    ("delayindex_delayed", "Delayed positions tracked (a shared index: those some "
     "subscription has still to receive).",
     lambda s: _n(s, "delayed" if "delayed" in s else "tracked")),
    ("delayindex_unpersisted", "Tracked positions a crash now would lose (the dispatcher's "
     "replay restores them).", lambda s: _n(s, "unpersisted")),
    ("delayindex_quarantined_buckets", "Damaged buckets set aside (repair or release them).",
     lambda s: _n(s, "quarantined_buckets")),
    ("delayindex_cancel_overrides", "Cancels kept against the dispatcher's replay.",
     lambda s: _n(s, "cancel_overrides")),
    ("delayindex_reschedule_overrides", "Reschedules kept against the dispatcher's replay.",
     lambda s: _n(s, "reschedule_overrides")),
    ("delayindex_snapshot_bytes", "Bytes of this index's snapshots in storage.",
     lambda s: _n(s, "snapshot_bytes")),
    ("delayindex_memory_usage_bytes", "Resident memory estimate in bytes.",
     lambda s: _n(s, "memory_bytes")),
    ("delayindex_delayed_in_memory", "Index entries held in memory (heap nodes, loaded "
     "segment keys and due-log keys).",
     lambda s: _heap_nodes(s) + _n(s, "direct_nodes") + _n(s, "loaded") + _n(s, "due_log")),
    ("delayindex_delayed_in_last_mutable_bucket", "Entries in the last, mutable bucket's heap "
     "(all of them for an in-memory tracker).", _heap_nodes),
    ("delayindex_blocked_on_persistence", "1 while deliveries pause for storage "
     "(pause_on_unpersisted, the bound reached).",
     lambda s: float(bool(s.get("blocked_on_persistence")))),
    ("delayindex_dead_letters", "Snapshot deletes given up on (fix the storage, then gc "
     "--retry-dead-letters).", lambda s: _size(s, "dead_letters")),
    ("delayindex_problems", "Distinct problems an operator must act on (see "
     "stats()['problems']).", lambda s: _size(s, "problems")),
    ("delayindex_retrying_loads", "Buckets whose segment reads failed and are retried (their "
     "messages come late).", lambda s: _size(s, "retrying_loads")),
)  # fmt: skip

# Weak, keyed by the registry object: an id() would be reused by a later registry allocated at
# a freed one's address, which would then silently get no collector.
_registered: weakref.WeakSet[CollectorRegistry] = weakref.WeakSet()
_registered_lock = threading.Lock()


def register(registry: CollectorRegistry | None = None) -> DelayIndexCollector | None:
    """Install the delayindex collector on ``registry`` (prometheus-client's default registry
    when None). Idempotent per registry: a second call returns None and changes nothing.

    Returns:
        The collector installed, or None if this registry already had one.
    """
    target = REGISTRY if registry is None else registry
    with _registered_lock:
        if target in _registered:
            return None
        collector = DelayIndexCollector()
        target.register(collector)
        _registered.add(target)
        return collector


class DelayIndexCollector(Collector):
    """Collects every open tracker's ``stats()`` at scrape time (see the module docs)."""

    def describe(self) -> list[Metric]:
        """No fixed description: the families are produced at scrape time."""
        return []

    def collect(self) -> Iterator[Metric]:
        """One family per metric, with a series per open tracker (and subscription)."""
        rows = [(_label(number, tracker), tracker) for number, tracker in _trackers()]
        snapshots = []
        for name, tracker in rows:
            try:
                stats = tracker.stats()
            except Exception as exc:  # one index's failure must not cost the others theirs
                _note_collect_error(name, exc)
                continue
            if stats.get("closed"):
                continue
            snapshots.append((name, tracker, stats))
        errors = CounterMetricFamily(
            "delayindex_collect_errors",
            "Scrapes in which the index's stats() raised (its series were missing; see the log).",
            labels=["index"],
        )
        with _errors_lock:
            for name, count in sorted(_collect_errors.items()):
                errors.add_metric([name], float(count))
        yield errors
        yield from _gauges(snapshots)
        yield from _operations(snapshots)
        yield from _lateness(snapshots)
        yield from _subscriptions(snapshots)


#: Per index name: the scrapes in which its stats() raised (kept for the process's life).
_collect_errors: dict[str, int] = {}
_errors_lock = threading.Lock()
_problems = ProblemLog("delayindex.metrics")


def _note_collect_error(name: str, exc: Exception) -> None:
    with _errors_lock:
        _collect_errors[name] = _collect_errors.get(name, 0) + 1
        _problems.append(
            f"index {name}: stats() raised at scrape time ({exc!r}); its series are missing "
            "from the scrape until it works again: this is a bug, please report it",
            key=f"{name}:{type(exc).__name__}",
        )


def _trackers() -> list[tuple[int, Any]]:
    return _registry.open_trackers()


def _label(number: int, tracker: Any) -> str:
    name = getattr(tracker, "name", None)
    return name if isinstance(name, str) else f"in-memory-{number}"


def _gauges(snapshots: list[tuple[str, Any, Stats]]) -> Iterator[Metric]:
    for family, doc, reading in _GAUGES:
        gauge = GaugeMetricFamily(family, doc, labels=["index"])
        for name, _, stats in snapshots:
            gauge.add_metric([name], reading(stats))
        yield gauge
    info = GaugeMetricFamily(
        "delayindex_info", "1 per open tracker, labelled with its build.",
        labels=["index", "implementation", "build", "kind"],
    )  # fmt: skip
    for name, tracker, stats in snapshots:
        labels = [str(stats.get("implementation", "")), str(stats.get("build", ""))]
        info.add_metric([name, *labels, type(tracker).__name__], 1.0)
    yield info


def _operations(snapshots: list[tuple[str, Any, dict[str, Any]]]) -> Iterator[Metric]:
    merges = CounterMetricFamily(
        "delayindex_bucket_merges", "Bucket merges done.", labels=["index"]
    )
    deletes = CounterMetricFamily(
        "delayindex_bucket_deletes", "Snapshot deletes done.", labels=["index"]
    )
    ops = CounterMetricFamily(
        "delayindex_snapshot_ops", "Storage operations by kind and outcome.",
        labels=["index", "op", "result"],
    )  # fmt: skip
    seconds = HistogramMetricFamily(
        "delayindex_snapshot_op_seconds", "Storage operation latency.", labels=["index", "op"]
    )
    bounds = [str(b / 1000.0) for b in OP_LATENCY_BOUNDS_MS] + ["+Inf"]
    for name, _, stats in snapshots:
        table = stats.get("ops")
        if not table:
            continue  # an in-memory tracker has no storage
        merges.add_metric([name], float(table["merge"]["succeeded"]))
        deletes.add_metric([name], float(table["delete"]["succeeded"]))
        for op in _OPS:
            row = table[op]
            ops.add_metric([name, op, "success"], float(row["succeeded"]))
            ops.add_metric([name, op, "failure"], float(row["failed"]))
            cumulative, running = [], 0
            for bound, count in zip(bounds, row["latency_buckets"], strict=True):
                running += count
                cumulative.append((bound, float(running)))
            seconds.add_metric([name, op], cumulative, sum_value=row["total_ms"] / 1000.0)
    yield from (merges, deletes, ops, seconds)


def _lateness(snapshots: list[tuple[str, Any, dict[str, Any]]]) -> Iterator[Metric]:
    family = HistogramMetricFamily(
        "delayindex_delivery_lateness_seconds",
        "Delivery lateness: poll time minus deliver_at (0: on time or up to a tick early).",
        labels=["index", "subscription"],
    )
    bounds = ["+Inf" if b == float("inf") else repr(b) for b in upper_bounds_seconds()]
    for name, _, stats in snapshots:
        subscriptions = stats.get("subscriptions")
        if subscriptions is None:
            _add_histogram(family, [name, ""], bounds, stats["lateness"], stats["lateness_ms"])
        else:
            for sub, row in subscriptions.items():
                _add_histogram(family, [name, sub], bounds, row["lateness"], row["lateness_ms"])
    yield family


def _add_histogram(
    family: HistogramMetricFamily, labels: list[str], bounds: list[str],
    counts: list[int], total_ms: int,
) -> None:  # fmt: skip
    cumulative, running = [], 0
    for bound, count in zip(bounds, counts, strict=True):
        running += int(count)
        cumulative.append((bound, float(running)))
    family.add_metric(labels, cumulative, sum_value=total_ms / 1000.0)


def _subscriptions(snapshots: list[tuple[str, Any, dict[str, Any]]]) -> Iterator[Metric]:
    backlog = GaugeMetricFamily(
        "delayindex_subscription_backlog",
        "Positions a subscription has still to receive (a slow or stopped subscription).",
        labels=["index", "subscription"],
    )
    lag = GaugeMetricFamily(
        "delayindex_subscription_lag",
        "Due-log keys a subscription has not read yet (it holds that much storage).",
        labels=["index", "subscription"],
    )
    for name, _, stats in snapshots:
        for sub, row in (stats.get("subscriptions") or {}).items():
            backlog.add_metric([name, sub], float(row["backlog"]))
            lag.add_metric([name, sub], float(row["lag"]))
    yield from (backlog, lag)
