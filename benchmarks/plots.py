"""PNG plots of pytest-benchmark runs, for ``docs/benchmarks.md``.

Usage (matplotlib comes with the ``bench`` extra)::

    python benchmarks/plots.py RUN.json [MORE.json ...] --out docs/img [--size 1000000]

Each ``RUN.json`` is the ``--benchmark-json`` output of ``pytest benchmarks --benchmark-enable``.
Records from all files are pooled; when two files hold the same benchmark (same group and series
at the same size), the one from the file named later wins, so a fresh partial run can be layered
over an older full one. Three figures are written, each only when its data is present (otherwise
a line on stderr says why it was skipped):

``memory_per_msg.png``
    Resident bytes per tracked message against N (log-log), one line per structure, from every
    record of a ``memory-<n>`` group with ``extra_info["rss_bytes_per_msg"]``. The memory group
    measures only the largest ``--bench-sizes`` of a run, so a curve needs one run per size.
``throughput.png``
    Grouped bars, msg/s on a log axis: one group of bars per tracker operation (``add``,
    ``add_many``, ``poll``, ``contains``, ``tracked_entries``, then any other ``tracker-<op>-<n>``
    group), one bar per structure, at one size (``--size``, default the largest size that has
    tracker records). The rate is ``extra_info["msgs_per_s"]`` when recorded, else
    ``size / stats.min``.
``spark_rebuild.png``
    Bars of msg/s for each row of the largest ``spark-rebuild-<n>`` group that records
    ``msgs_per_s`` (a rebuild's ``cold_msgs_per_s`` is a bar of its own); rows without a rate
    (the open of the result) are listed in the title with their time.

Keys are read defensively, since the suite's records grew over time: the structure is
``extra_info["kind"]``, else the test's ``kind``/``variant``/``mode`` parameter, else the label;
the size is ``extra_info["size"]``, else the ``size`` parameter, else the group's numeric suffix
(``memory-1e6``). All inputs are read and checked before anything is drawn, and each PNG is
written to a temporary file and renamed into place, so a bad input or a failed draw never leaves
a partial image. Exit status: 0 if at least one figure was written, 1 if there was nothing to
plot, 2 for unreadable input or a missing matplotlib.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import sys
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

#: Tracker operations in plot order; other ``tracker-<op>-<n>`` groups follow, sorted.
OPERATIONS = ("add", "add_many", "poll", "contains", "tracked_entries")
#: Display names of the suite's structure kinds; unknown kinds use their records' labels.
KIND_NAMES = {
    "delay_index": "DelayIndex",
    "in_memory": "InMemoryTracker",
    "heapq": "heapq+set",
    "sortedlist": "SortedList+set",
    "redis": "Redis ZSET (pipelined)",
}
MEMORY_PNG = "memory_per_msg.png"
THROUGHPUT_PNG = "throughput.png"
SPARK_PNG = "spark_rebuild.png"

_SIZE_SUFFIX = re.compile(r"^(?P<head>.+)-(?P<size>[1-9][0-9]*(?:e[0-9]+)?)$")


class PlotInputError(Exception):
    """A benchmark JSON file that cannot be read or is not pytest-benchmark output."""


@dataclass(frozen=True)
class Record:
    """One benchmark of a run, reduced to what the plots need."""

    group: str
    name: str
    label: str
    kind: str
    size: int | None
    min_s: float
    extra_info: dict[str, Any] = field(hash=False, compare=False)
    source: str = ""


def parse_size(text: str) -> int | None:
    """``'1e6' -> 1000000``, ``'250000' -> 250000``; None for anything else."""
    match = re.fullmatch(r"([1-9][0-9]*)(?:e([0-9]+))?", text)
    if match is None:
        return None
    mantissa, exponent = match.groups()
    return int(mantissa + "0" * int(exponent or 0))


def size_text(n: int) -> str:
    """``1000000 -> '1e6'``, ``2500000 -> '2.5e6'``, small sizes as digits."""
    if n < 1000:
        return str(n)
    exponent = math.floor(math.log10(n))
    mantissa = n / 10**exponent
    return f"{mantissa:g}e{exponent}"


def rate_text(rate: float) -> str:
    """``3_870_000 -> '3.87M'``, ``250_000 -> '250k'``."""
    if rate >= 1e6:
        return f"{rate / 1e6:.3g}M"
    if rate >= 1e3:
        return f"{rate / 1e3:.3g}k"
    return f"{rate:.3g}"


def _as_int(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int) and value > 0:
        return value
    if isinstance(value, float) and value > 0 and value.is_integer():
        return int(value)
    return None


def _record(bench: Any, source: str) -> Record | None:
    """A :class:`Record` from one entry of ``benchmarks``, or None if it has no usable time."""
    if not isinstance(bench, dict):
        return None
    stats = bench.get("stats")
    min_s = stats.get("min") if isinstance(stats, dict) else None
    if not isinstance(min_s, int | float) or isinstance(min_s, bool) or not min_s > 0:
        return None
    extra = bench.get("extra_info")
    extra = extra if isinstance(extra, dict) else {}
    params = bench.get("params")
    params = params if isinstance(params, dict) else {}
    group = str(bench.get("group") or "")
    name = str(bench.get("name") or "")
    label = str(extra.get("label") or name)
    kind = extra.get("kind")
    if not kind:
        kind = next((params[k] for k in ("kind", "variant", "mode") if params.get(k)), label)
    size = _as_int(extra.get("size")) or _as_int(params.get("size"))
    if size is None and (match := _SIZE_SUFFIX.match(group)):
        size = parse_size(match.group("size"))
    return Record(group, name, label, str(kind), size, float(min_s), extra, source)


def load_runs(paths: Iterable[Path | str]) -> list[Record]:
    """Every usable record of every file, in file order.

    Raises :class:`PlotInputError` naming the file when one cannot be read, is not JSON or has
    no ``benchmarks`` list. Entries without a positive ``stats.min`` are left out.
    """
    records: list[Record] = []
    for path in map(Path, paths):
        try:
            document = json.loads(path.read_text(encoding="utf-8"))
        except OSError as exc:
            raise PlotInputError(f"{path}: cannot read: {exc.strerror or exc}") from None
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise PlotInputError(f"{path}: not JSON: {exc}") from None
        benchmarks = document.get("benchmarks") if isinstance(document, dict) else None
        if not isinstance(benchmarks, list):
            raise PlotInputError(
                f"{path}: no 'benchmarks' list (not pytest-benchmark --benchmark-json output)"
            )
        records.extend(r for bench in benchmarks if (r := _record(bench, str(path))))
    return records


# -- data for the figures ---------------------------------------------------------------------


def memory_series(records: Sequence[Record]) -> dict[str, list[tuple[int, float]]]:
    """Line label -> ``[(n, resident bytes per message), ...]`` sorted by n.

    Lines are keyed by label (the memory group distinguishes ``add`` from ``add_many`` fills of
    the same structure by label); a later record for the same line and n replaces an earlier one.
    """
    points: dict[str, dict[int, float]] = {}
    for record in records:
        if not record.group.startswith("memory-"):
            continue  # shared-memory-<n> and the like measure other set-ups
        value = record.extra_info.get("rss_bytes_per_msg")
        if record.size is None or not isinstance(value, int | float) or isinstance(value, bool):
            continue
        points.setdefault(record.label, {})[record.size] = float(value)
    return {label: sorted(by_size.items()) for label, by_size in points.items()}


def tracker_operation(record: Record) -> str | None:
    """The tracker operation a record measures (``add_many``), or None if it is not one."""
    op = record.extra_info.get("op") or record.extra_info.get("operation")
    if op:
        return str(op).replace("-", "_")
    match = _SIZE_SUFFIX.match(record.group)
    head = match.group("head") if match else record.group
    if not head.startswith("tracker-") or head == "tracker-":
        return None
    return head.removeprefix("tracker-").replace("-", "_")


def throughput_rate(record: Record) -> float | None:
    """Messages (or operations) per second: ``msgs_per_s`` if recorded, else size / min."""
    rate = record.extra_info.get("msgs_per_s")
    if isinstance(rate, int | float) and not isinstance(rate, bool) and rate > 0:
        return float(rate)
    if record.size is None:
        return None
    return record.size / record.min_s


@dataclass
class Throughput:
    """Bars of one size: ``rates[op][kind]`` in msg/s, and display names of the kinds."""

    size: int
    operations: list[str]
    kinds: list[str]
    names: dict[str, str]
    rates: dict[str, dict[str, float]]


def throughput_table(records: Sequence[Record], size: int | None = None) -> Throughput | None:
    """The throughput bars at ``size`` (default: the largest with tracker records), or None."""
    tracker = [(r, op) for r in records if (op := tracker_operation(r)) and r.size is not None]
    if not tracker:
        return None
    if size is None:
        size = max(r.size for r, _ in tracker if r.size is not None)
    rates: dict[str, dict[str, float]] = {}
    names: dict[str, str] = {}
    kinds: list[str] = []
    for record, op in tracker:
        rate = throughput_rate(record)
        if record.size != size or rate is None:
            continue
        rates.setdefault(op, {})[record.kind] = rate
        if record.kind not in kinds:
            kinds.append(record.kind)
        # The plain-op groups' labels name the structure; add_many's name the call.
        if record.kind not in names or op == "add":
            names[record.kind] = KIND_NAMES.get(record.kind, record.label)
    if not rates:
        return None
    operations = [op for op in OPERATIONS if op in rates]
    operations += sorted(op for op in rates if op not in OPERATIONS)
    order = {kind: i for i, kind in enumerate(KIND_NAMES)}
    first_seen = {kind: i for i, kind in enumerate(kinds)}
    kinds.sort(key=lambda kind: (order.get(kind, len(order)), first_seen[kind]))
    return Throughput(size, operations, kinds, names, rates)


@dataclass
class SparkBars:
    """Rates of the Spark-rebuild group at one size, and the rows that have only a time."""

    size: int
    bars: list[tuple[str, float]]
    notes: list[str]


def spark_bars(records: Sequence[Record]) -> SparkBars | None:
    """Bars for the largest ``spark-rebuild-<n>`` group that has a rate, or None."""
    by_size: dict[int, list[Record]] = {}
    for record in records:
        if record.group.startswith("spark-rebuild") and record.size is not None:
            by_size.setdefault(record.size, []).append(record)
    for size in sorted(by_size, reverse=True):
        bars: list[tuple[str, float]] = []
        notes: list[str] = []
        latest: dict[str, Record] = {}
        for record in by_size[size]:
            latest[record.label] = record  # a later file's row replaces an earlier one
        for record in latest.values():
            rate = record.extra_info.get("msgs_per_s")
            cold = record.extra_info.get("cold_msgs_per_s")
            if isinstance(rate, int | float) and rate > 0:
                suffix = ", warm (best)" if isinstance(cold, int | float) else ""
                bars.append((record.label + suffix, float(rate)))
            else:
                notes.append(f"{record.label}: {record.min_s:.2f} s")
            if isinstance(cold, int | float) and cold > 0:
                bars.append((f"{record.label}, cold JVM", float(cold)))
        if bars:
            return SparkBars(size, bars, notes)
    return None


# -- drawing ----------------------------------------------------------------------------------


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    return plt


def _save(fig: Any, path: Path) -> None:
    """Write ``fig`` to ``path`` through a temporary file in the same directory."""
    # Not mkstemp: its 0600 mode would stick to the PNG; a plain create honours the umask.
    tmp = path.with_name(f".{path.stem}.{os.getpid()}.tmp.png")
    try:
        # No "Software" key: the PNG does not change with the matplotlib version.
        fig.savefig(tmp, format="png", dpi=110, metadata={"Software": None})
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


@contextmanager
def _figure(path: Path, figsize: tuple[float, float]) -> Iterator[Any]:
    """The axes of a new figure; when the block ends without an error the figure is laid out
    and saved to ``path`` (see :func:`_save`). The figure is closed either way."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=figsize)
    try:
        yield ax
        fig.tight_layout()
        _save(fig, path)
    finally:
        plt.close(fig)


def _readable_log_axis(axis: Any, text: Callable[[float], str]) -> None:
    """Ticks at 1, 2 and 5 times each power of ten, labelled with ``text``."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullLocator

    axis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    axis.set_minor_locator(NullLocator())
    axis.set_major_formatter(FuncFormatter(lambda value, _pos: text(value)))


def plot_memory(series: dict[str, list[tuple[int, float]]], path: Path) -> None:
    """Log-log lines of bytes per message against N."""
    with _figure(path, (7.5, 4.8)) as ax:
        for label, points in sorted(series.items(), key=lambda item: -item[1][-1][1]):
            xs = [n for n, _ in points]
            ys = [b for _, b in points]
            # The figures go in the legend: point labels of close lines would overlap.
            values = " / ".join(f"{y:.3g}" for y in ys)
            ax.plot(xs, ys, marker="o", label=f"{label}: {values} B")
        ax.set_xscale("log")
        ax.set_yscale("log")
        _readable_log_axis(ax.yaxis, lambda y: f"{y:g}")
        sizes = sorted({n for points in series.values() for n, _ in points})
        ax.set_xticks(sizes, [size_text(n) for n in sizes])
        ax.minorticks_off()
        ax.set_xlabel("tracked messages N")
        ax.set_ylabel("resident bytes per message (RSS growth / N)")
        ax.set_title("Memory per tracked message")
        ax.grid(True, which="major", alpha=0.3)
        ax.legend(fontsize=8)


def plot_throughput(table: Throughput, path: Path) -> None:
    """Grouped bars: operations on x, one bar per structure, msg/s on a log axis."""
    with _figure(path, (max(7.5, 1.6 * len(table.operations) + 2), 4.8)) as ax:
        width = 0.8 / len(table.kinds)
        for i, kind in enumerate(table.kinds):
            xs, ys = [], []
            for j, op in enumerate(table.operations):
                if kind in table.rates[op]:
                    xs.append(j + (i - (len(table.kinds) - 1) / 2) * width)
                    ys.append(table.rates[op][kind])
            bars = ax.bar(xs, ys, width, label=table.names[kind])
            ax.bar_label(bars, [rate_text(y) for y in ys], fontsize=7, padding=1)
        ax.set_yscale("log")
        _readable_log_axis(ax.yaxis, rate_text)
        ax.set_xticks(range(len(table.operations)), table.operations)
        ax.set_ylabel("messages per second (contains: lookups per second)")
        ax.set_title(f"Tracker throughput at N = {size_text(table.size)}")
        ax.grid(True, axis="y", which="major", alpha=0.3)
        ax.legend(fontsize=8)


def plot_spark(spark: SparkBars, path: Path) -> None:
    """Horizontal bars of msg/s for the rebuild and the online ingestion of one dump."""
    from matplotlib.ticker import FuncFormatter

    with _figure(path, (7.5, 1.2 + 0.6 * len(spark.bars))) as ax:
        labels = [label for label, _ in spark.bars]
        rates = [rate for _, rate in spark.bars]
        bars = ax.barh(range(len(rates)), rates, color="tab:blue")
        ax.bar_label(bars, [rate_text(r) + " msg/s" for r in rates], fontsize=8, padding=2)
        ax.set_yticks(range(len(labels)), labels, fontsize=8)
        ax.invert_yaxis()
        ax.set_xlim(0, max(rates) * 1.25)
        ax.xaxis.set_major_formatter(FuncFormatter(lambda value, _pos: rate_text(value)))
        ax.set_xlabel("messages of the dump per second")
        title = f"Spark rebuild vs online ingestion, {size_text(spark.size)}-message dump"
        if spark.notes:
            title += "\n" + "; ".join(spark.notes)
        ax.set_title(title, fontsize=10)


def write_plots(
    records: Sequence[Record], out: Path, size: int | None = None
) -> tuple[list[Path], list[str]]:
    """Draw every figure whose data is present into ``out``; returns (written, skip reasons)."""
    written: list[Path] = []
    skipped: list[str] = []
    series = memory_series(records)
    table = throughput_table(records, size)
    spark = spark_bars(records)
    if series or table is not None or spark is not None:
        out.mkdir(parents=True, exist_ok=True)
    if series:
        plot_memory(series, out / MEMORY_PNG)
        written.append(out / MEMORY_PNG)
    else:
        skipped.append(f"{MEMORY_PNG}: no record has extra_info['rss_bytes_per_msg']")
    if table is not None:
        plot_throughput(table, out / THROUGHPUT_PNG)
        written.append(out / THROUGHPUT_PNG)
    elif size is not None:
        skipped.append(f"{THROUGHPUT_PNG}: no tracker-<op>-<n> record at size {size}")
    else:
        skipped.append(f"{THROUGHPUT_PNG}: no tracker-<op>-<n> group with a size")
    if spark is not None:
        plot_spark(spark, out / SPARK_PNG)
        written.append(out / SPARK_PNG)
    else:
        skipped.append(f"{SPARK_PNG}: no spark-rebuild-<n> group with msgs_per_s")
    return written, skipped


def _positive_size(text: str) -> int:
    size = parse_size(text.replace("_", ""))
    if size is None:
        raise argparse.ArgumentTypeError(
            f"expected a positive size such as 1000000 or 1e6: {text!r}"
        )
    return size


def main(argv: Sequence[str] | None = None) -> int:
    """Command line entry point; returns the exit status."""
    parser = argparse.ArgumentParser(
        prog="plots.py",
        description="Write PNG plots of pytest-benchmark JSON runs (see the module docstring).",
    )
    parser.add_argument(
        "runs",
        nargs="+",
        type=Path,
        metavar="RUN.json",
        help="--benchmark-json output; later files win on duplicates",
    )
    parser.add_argument(
        "--out", type=Path, default=Path("docs/img"), help="output directory (default: docs/img)"
    )
    parser.add_argument(
        "--size",
        type=_positive_size,
        default=None,
        help="N of the throughput bars (default: the largest measured)",
    )
    args = parser.parse_args(argv)
    try:
        records = load_runs(args.runs)
    except PlotInputError as exc:
        print(f"plots.py: {exc}", file=sys.stderr)
        return 2
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        print("plots.py: matplotlib is required: pip install -e '.[bench]'", file=sys.stderr)
        return 2
    written, skipped = write_plots(records, args.out, args.size)
    for reason in skipped:
        print(f"skipped {reason}", file=sys.stderr)
    for path in written:
        print(f"wrote {path}")
    if not written:
        print("plots.py: nothing to plot", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
