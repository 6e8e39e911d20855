"""Speed-calibrated timing: each timed call's own time over the machine's speed at that moment.

Why. The 2-core KVM machines this suite runs on change speed in stretches: a fixed pure-Python
loop pinned to one vCPU ran 1.0-2.0x its best time, in stretches from a fraction of a second to
several seconds, each vCPU on its own (2026-11-29). A benchmark's rounds follow each other within
a second or two, so they often all fall into one stretch: single records' ``stats.min`` moved
1.5-2.6x between clean runs, and no stored baseline could gate them (docs/benchmarks.md, "The
quick tier and the regression gate"). Measured the same way, a call's time divided by the time
of a fixed loop run just before and just after it, on the same thread, moved 2-6 % between
processes (median of the calls) while the raw times moved 1.4-1.6x.

How. While a :class:`Collector` is active (:func:`begin`, one per benchmark: the quick tier's
``conftest`` fixture), :func:`timed` wraps every timed call (``support.slowed``). Before and after
the call a calibration loop (:data:`KERNEL_LOOPS` steps over a list of small ints, about 1.5 ms,
no allocation) is timed, unless one ran within :data:`INTERVAL_S` (short calls share it). The
call's *sample* is its own time, an injected slowdown's busy-wait included, over the faster of
the two loops beside it. The record's figure (``extra_info["calibrated"]``, :data:`INFO_KEY`,
unitless) is the **median** of its samples (:func:`figure_of`):

* a hiccup in one loop does not count (the faster loop is taken);
* a slow stretch over a call and its loops cancels out;
* a round whose two loops both ran slower than the call (the loop and the call do not always
  run at the same speed: on one vCPU and then the other, or beside a busy neighbour) makes a
  sample too *low*, and a hiccup in the call one too high; the median of a record's five
  samples leaves out up to two of either.

Until session 21 the figure was the least sample, as pytest-benchmark's is its least round. On
2026-12-06 that picked such low samples: the native TripleHeap's push-pop row read samples of
62.8, 62.1, 61.9, 57.1 and 33.3 (the last round's loops 1.4 ms against 0.8 ms before, the call's
own time unchanged), so the structure read x0.82 on clean code and a simulated 1.3x slowdown of
it passed the gate. Over five gate runs of clean code (two processes each), the native
TripleHeap (four records per gate) read x0.82-1.01 by the least sample and x0.87-0.93 by the
median (docs/benchmarks.md, "Session 21"). The median was tried once before (session 17) and
dropped because some 1e5 rows alternated 1.0x and 1.7x rounds within a process; the gate's two
processes and its confirmation rerun are what answer a process whose rounds are slow.
``extra_info["calibration_loop_ms"]`` is the loop's median time (the machine's speed during the
record) and ``calibrated_samples`` every sample, from which :func:`figure_of` can recompute a
stored run's figure.

The calibrations run inside pytest-benchmark's rounds, so a calibrated run's ordinary time
figures are a little higher (about 3 ms per round): the quick tier (what the gate reads) is
calibrated, the full tier (what the docs' tables quote) is not.

Standard library only: the gate (``gate.py``) reads :data:`INFO_KEY` from here.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from functools import wraps
from typing import Any, TypeVar

F = TypeVar("F", bound=Callable[..., Any])

#: ``extra_info`` key of a record's calibrated figure (least call time over loop time).
INFO_KEY = "calibrated"
#: Steps of the calibration loop: about 1.5 ms of pure Python on the reference machine.
KERNEL_LOOPS = 50_000
#: What the loop walks: small ints only, so it allocates nothing. (A loop summing ``range``
#: allocates an int per step, and ran 1.6-3.2 ms by the allocator's state alone.)
_STEPS = [3] * KERNEL_LOOPS
#: A calibration younger than this stands for the machine's speed now (slow stretches last
#: longer), so a run of short calls does not pay one per call.
INTERVAL_S = 0.02


def _loop_seconds() -> float:
    """Time of the calibration loop (pure-Python bytecode over a list) on this thread, now."""
    start = time.perf_counter()
    acc = 0
    for step in _STEPS:
        acc ^= step
    return time.perf_counter() - start


def _stretched(
    fn: Callable[..., Any], factor: float, clock: Callable[[], float], *args: Any, **kwargs: Any
) -> tuple[Any, float]:
    """Call ``fn`` and busy-wait (a slower structure burns CPU, not sleep) until the call took
    ``factor`` times its own duration: ``(result, seconds taken)``."""
    start = clock()
    result = fn(*args, **kwargs)
    if factor != 1.0:
        until = start + (clock() - start) * factor
        while clock() < until:
            pass
    return result, clock() - start


def figure_of(samples: list[float]) -> float | None:
    """A record's figure from its calibrated samples: their median (None: no sample)."""
    return statistics.median(samples) if samples else None


class Collector:
    """The calibrated samples of one benchmark's timed calls. ``clock`` and ``loop`` (the
    calibration loop's timing) are injected for tests."""

    def __init__(
        self,
        clock: Callable[[], float] = time.perf_counter,
        loop: Callable[[], float] = _loop_seconds,
    ) -> None:
        self.samples: list[float] = []
        self.loops: list[float] = []  # every calibration's time (seconds)
        self._clock = clock
        self._loop = loop
        self._speed = 0.0
        self._speed_at = float("-inf")

    def _current_speed(self) -> float:
        if self._clock() - self._speed_at > INTERVAL_S:
            self._speed = self._loop()
            self._speed_at = self._clock()
            self.loops.append(self._speed)
        return self._speed

    def call(self, fn: Callable[..., Any], factor: float, *args: Any, **kwargs: Any) -> Any:
        """Call ``fn``, stretched to ``factor`` times its duration, and keep its calibrated
        sample."""
        before = self._current_speed()
        result, own = _stretched(fn, factor, self._clock, *args, **kwargs)
        after = self._current_speed()
        self.samples.append(own / min(before, after))
        return result

    def figure(self) -> float | None:
        """The record's figure, :func:`figure_of` its samples (None: no timed call ran)."""
        return figure_of(self.samples)


_active: Collector | None = None


def begin(collector: Collector | None = None) -> Collector:
    """Start collecting for one benchmark (what :func:`timed` wrappers report to), into
    ``collector`` or a new one."""
    global _active
    _active = collector if collector is not None else Collector()
    return _active


def end() -> Collector | None:
    """Stop collecting; the benchmark's collector (None: none was active)."""
    global _active
    collector, _active = _active, None
    return collector


def active() -> bool:
    """Whether a benchmark is being calibrated now."""
    return _active is not None


def timed(fn: F, factor: float = 1.0) -> F:
    """``fn`` wrapped to report each call's calibrated sample to the active collector (and to
    stretch it ``factor`` times), or to only stretch it when none is active."""

    @wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        collector = _active
        if collector is not None:
            return collector.call(fn, factor, *args, **kwargs)
        return _stretched(fn, factor, time.perf_counter, *args, **kwargs)[0]

    return wrapper  # type: ignore[return-value]
