"""Peak memory of a whole benchmark run: this process and every process it started.

The memory groups measure one structure at a time in a fresh interpreter; this answers a
different question, whether the run as a whole fits the machine (the full tier must fit in
24 GiB at 1e7). :class:`PeakMemoryWatch` samples, every ``interval_s`` on a daemon thread, the
resident set of the process tree rooted at this process (``/proc/<pid>/statm`` of each pid
whose parent chain reaches the root, found from ``/proc/<pid>/stat``), so Spark's JVM, its
Python workers, the memory probes and a Redis server all count while they are alive. A
sample can miss a peak shorter than the interval, so the report also carries
``getrusage``'s ``ru_maxrss`` of this process and of its largest reaped child, which are
exact lower bounds. Linux only (``/proc``); elsewhere the watch reports nothing.
"""

from __future__ import annotations

import os
import resource
import threading
from dataclasses import dataclass
from pathlib import Path

PAGE_SIZE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
PROC = Path("/proc")


def _parent_map() -> dict[int, int]:
    """pid -> parent pid for every process still readable in ``/proc``."""
    parents: dict[int, int] = {}
    for entry in PROC.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue  # exited between listing and reading
        # "pid (comm) state ppid ...": comm may hold spaces and parentheses, so split after ')'.
        fields = stat[stat.rfind(")") + 2 :].split()
        parents[int(entry.name)] = int(fields[1])
    return parents


def tree_pids(root: int) -> list[int]:
    """``root`` and all its living descendants."""
    children: dict[int, list[int]] = {}
    for pid, parent in _parent_map().items():
        children.setdefault(parent, []).append(pid)
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo.extend(children.get(pid, ()))
    return out


def tree_rss_bytes(root: int) -> int:
    """Resident bytes of ``root``'s process tree now (processes that vanish count 0)."""
    total = 0
    for pid in tree_pids(root):
        try:
            total += int((PROC / str(pid) / "statm").read_text().split()[1]) * PAGE_SIZE
        except (OSError, IndexError, ValueError):
            continue
    return total


@dataclass(frozen=True)
class PeakMemory:
    """What a watch saw: the sampled tree peak and the ``ru_maxrss`` lower bounds, in bytes."""

    tree_peak_bytes: int
    self_maxrss_bytes: int
    largest_child_maxrss_bytes: int
    samples: int
    interval_s: float

    @property
    def peak_bytes(self) -> int:
        """The best estimate of the run's peak: no bound below it was exceeded."""
        return max(self.tree_peak_bytes, self.self_maxrss_bytes, self.largest_child_maxrss_bytes)

    def as_json(self) -> dict[str, float | int]:
        """A JSON-ready dict (stored in the ``--benchmark-json`` file as ``peak_memory``)."""
        return {
            "peak_bytes": self.peak_bytes,
            "tree_peak_bytes": self.tree_peak_bytes,
            "self_maxrss_bytes": self.self_maxrss_bytes,
            "largest_child_maxrss_bytes": self.largest_child_maxrss_bytes,
            "samples": self.samples,
            "interval_s": self.interval_s,
        }


class PeakMemoryWatch:
    """Samples the process tree's resident memory until :meth:`stop`."""

    def __init__(self, root: int | None = None, interval_s: float = 0.5) -> None:
        if interval_s <= 0:
            raise ValueError(f"interval_s must be > 0, got {interval_s}")
        self.root = os.getpid() if root is None else root
        self.interval_s = interval_s
        self._peak = 0
        self._samples = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="peak-memory-watch", daemon=True)
        self.enabled = PROC.is_dir()

    def start(self) -> PeakMemoryWatch:
        """Start sampling (a no-op without ``/proc``)."""
        if self.enabled:
            self._thread.start()
        return self

    def sample(self) -> int:
        """Take one sample now and return it."""
        rss = tree_rss_bytes(self.root)
        self._peak = max(self._peak, rss)
        self._samples += 1
        return rss

    def _run(self) -> None:
        while not self._stop.is_set():
            self.sample()
            self._stop.wait(self.interval_s)

    def stop(self) -> PeakMemory | None:
        """Stop sampling; the peak seen, or None when nothing could be sampled."""
        if not self.enabled:
            return None
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()
        self.sample()
        kib = 1024  # Linux reports ru_maxrss in KiB
        return PeakMemory(
            tree_peak_bytes=self._peak,
            self_maxrss_bytes=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * kib,
            largest_child_maxrss_bytes=resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * kib,
            samples=self._samples,
            interval_s=self.interval_s,
        )
