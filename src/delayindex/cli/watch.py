"""``delayindex inspect --watch``: a live view of a store, and of the process that writes it.

How it works. Every ``SECONDS`` the view reads the store again, as a plain ``inspect`` does:
buckets, messages, quarantine, subscriptions with their backlog. The store cannot show what
a running process holds only in memory. With ``--metrics-url`` (the process's Prometheus
exporter, :mod:`delayindex.metrics`) each refresh also scrapes it and shows, per open index,
the entries in memory, unpersisted positions, whether deliveries are blocked, the problems,
the quarantined buckets, lateness p50/p99, and each subscription's backlog and lag. The view
is drawn with rich's ``Live`` and redrawn in place. With ``--json``, one JSON object is printed
per refresh, one per line. Ctrl-C ends the view; ``--watch-count N`` ends it after N refreshes,
which scripts and tests use. The exit code is the last refresh's, as for ``inspect``.
"""

from __future__ import annotations

import argparse
import io
import json
import math
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from typing import Any

from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from delayindex.cli._common import _now_ms, _UsageError

#: One store read: the exit code, the JSON report, and a function printing the human one.
Render = Callable[[Console], None]
Snapshot = Callable[[], tuple[int, dict[str, Any], Render]]

_TIMEOUT_S = 5.0


def add_watch(parser: argparse.ArgumentParser) -> None:
    """``--watch [SECONDS]``, ``--watch-count N`` and ``--metrics-url URL``."""
    parser.add_argument(
        "--watch", type=_seconds, nargs="?", const=2.0, default=None, metavar="SECONDS",
        help="redraw the view every SECONDS (default 2) until Ctrl-C",
    )  # fmt: skip
    parser.add_argument(
        "--watch-count", type=int, default=None, metavar="N",
        help="with --watch: stop after N refreshes",
    )  # fmt: skip
    parser.add_argument(
        "--metrics-url", default=None, metavar="URL",
        help="with --watch: also scrape a running process's exporter (delayindex.metrics) for "
        "what it holds in memory, unpersisted, lateness and its subscriptions",
    )  # fmt: skip


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"need 0 or more seconds, got {text!r}")
    return value


def run_watch(args: argparse.Namespace, console: Console, snapshot: Snapshot) -> int:
    """Refresh ``snapshot`` (and the exporter) every ``args.watch`` seconds; the last exit
    code."""
    if args.watch_count is not None and args.watch_count < 1:
        raise _UsageError("--watch-count must be at least 1")
    if args.metrics_url is not None:
        _parser()  # fail early, as a usage error, if prometheus-client is missing
    code, refreshes = 0, 0
    live = None if args.json else Live(console=console, auto_refresh=False)
    try:
        if live is not None:
            live.start()
        while True:
            code, payload, render = snapshot()
            process = None if args.metrics_url is None else scrape(args.metrics_url)
            if live is None:
                payload = {**payload, "process": process, "refreshed_at_ms": _now_ms()}
                console.print_json(json.dumps(payload, default=str), indent=None)
            else:
                live.update(_view(console, render, process), refresh=True)
            refreshes += 1
            if args.watch_count is not None and refreshes >= args.watch_count:
                break
            time.sleep(args.watch)
    except KeyboardInterrupt:
        pass
    finally:
        if live is not None:
            live.stop()
    return code


def _view(console: Console, render: Render, process: dict[str, Any] | None) -> Group:
    """The store report (rendered off-screen, then shown as one block) and the process's."""
    buffer = io.StringIO()
    offscreen = Console(
        file=buffer, width=console.width, force_terminal=console.is_terminal,
        color_system="auto" if console.color_system else None, highlight=False,
    )  # fmt: skip
    render(offscreen)
    parts: list[Any] = [Text.from_ansi(buffer.getvalue().rstrip("\n"))]
    if process is not None:
        parts.append(Text(""))
        parts.extend(_process_tables(process))
    return Group(*parts)


def _parser() -> Any:
    try:
        from prometheus_client.parser import text_string_to_metric_families
    except ImportError:
        raise _UsageError(
            "--metrics-url needs prometheus-client: pip install 'delayindex[metrics]'"
        ) from None
    return text_string_to_metric_families


def scrape(url: str) -> dict[str, Any]:
    """The exporter at ``url`` as ``{"indexes": {...}, "error": None}`` (or the error)."""
    try:
        with urllib.request.urlopen(url, timeout=_TIMEOUT_S) as response:
            text = response.read().decode()
    except (OSError, urllib.error.URLError, ValueError) as exc:
        return {"indexes": {}, "error": f"cannot scrape {url}: {exc}"}
    samples: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in _parser()(text):
        for sample in family.samples:
            samples.setdefault(sample.name, []).append((sample.labels, sample.value))
    return {"indexes": _per_index(samples), "error": None}


_GAUGES = {
    "delayed": "delayindex_delayed",
    "in_memory": "delayindex_delayed_in_memory",
    "unpersisted": "delayindex_unpersisted",
    "blocked": "delayindex_blocked_on_persistence",
    "problems": "delayindex_problems",
    "quarantined": "delayindex_quarantined_buckets",
    "buckets": "delayindex_buckets",
}


def _per_index(samples: dict[str, list[tuple[dict[str, str], float]]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, name in _GAUGES.items():
        for labels, value in samples.get(name, ()):
            out.setdefault(labels["index"], {"subscriptions": {}})[key] = value
    histograms: dict[tuple[str, str], list[tuple[float, float]]] = {}
    for labels, value in samples.get("delayindex_delivery_lateness_seconds_bucket", ()):
        series = (labels["index"], labels.get("subscription", ""))
        histograms.setdefault(series, []).append((float(labels["le"]), value))
    for (index, sub), buckets in histograms.items():
        row = out.setdefault(index, {"subscriptions": {}})
        target = row if not sub else row["subscriptions"].setdefault(sub, {})
        target["lateness_p50_s"] = quantile(buckets, 0.5)
        target["lateness_p99_s"] = quantile(buckets, 0.99)
    for key, name in (("backlog", "delayindex_subscription_backlog"),
                      ("lag", "delayindex_subscription_lag")):  # fmt: skip
        for labels, value in samples.get(name, ()):
            row = out.setdefault(labels["index"], {"subscriptions": {}})
            row["subscriptions"].setdefault(labels["subscription"], {})[key] = value
    return out


def quantile(buckets: list[tuple[float, float]], q: float) -> float | None:
    """The upper bound of the first bucket holding the ``q`` quantile of a cumulative
    histogram ``[(le, count), ...]`` (None: empty); +Inf when it lies beyond the last bound."""
    ordered = sorted(buckets)
    total = ordered[-1][1] if ordered else 0.0
    if total <= 0:
        return None
    for bound, cumulative in ordered:
        if cumulative >= q * total:
            return bound
    return math.inf


def _process_tables(process: dict[str, Any]) -> list[Any]:
    if process.get("error"):
        return [Text(process["error"], style="red")]
    table = Table(title="running process (exporter)", title_justify="left")
    for column in ("index", "delayed", "in memory", "unpersisted", "blocked", "problems",
                   "quarantined", "lateness p50", "lateness p99"):  # fmt: skip
        table.add_column(column, justify="left" if column == "index" else "right")
    subs = Table(title="subscriptions (exporter)", title_justify="left")
    for column in ("index", "subscription", "backlog", "lag", "lateness p50", "lateness p99"):
        subs.add_column(column, justify="left" if column in ("index", "subscription") else "right")
    for index, row in sorted(process["indexes"].items()):
        table.add_row(
            index, _count(row.get("delayed")), _count(row.get("in_memory")),
            _count(row.get("unpersisted")), "yes" if row.get("blocked") else "no",
            _count(row.get("problems")), _count(row.get("quarantined")),
            _latency(row.get("lateness_p50_s")), _latency(row.get("lateness_p99_s")),
        )  # fmt: skip
        for sub, values in sorted(row["subscriptions"].items()):
            subs.add_row(
                index, sub, _count(values.get("backlog")), _count(values.get("lag")),
                _latency(values.get("lateness_p50_s")), _latency(values.get("lateness_p99_s")),
            )  # fmt: skip
    return [table, subs] if subs.row_count else [table]


def _count(value: float | None) -> str:
    return "-" if value is None else f"{int(value):,}"


def _latency(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    if math.isinf(seconds):
        return "> 131 s"
    return f"<= {seconds * 1000:g} ms"
