"""The one place that chooses between native and pure-Python implementations.

The native extension ``delayindex._native`` is used when it imports, unless the environment
variable ``DELAYINDEX_NO_EXTENSIONS`` is set to a non-empty value other than ``0``, which forces
the pure twins in ``delayindex._pure``. ``NATIVE`` tells which one is active.
"""

from __future__ import annotations

import os
import warnings
from typing import TYPE_CHECKING

from delayindex import clock as _pure_clock
from delayindex._pure import core as _pure_core
from delayindex._pure import heap as _pure_heap

_FORCED_PURE = os.environ.get("DELAYINDEX_NO_EXTENSIONS", "") not in ("", "0")

PureTripleHeap = _pure_heap.TripleHeap
PureTrackerCore = _pure_core.TrackerCore
pure_wall_clock_ms = _pure_clock.wall_clock_ms

if TYPE_CHECKING:
    from delayindex._pure.core import TrackerCore
    from delayindex._pure.heap import TripleHeap
    from delayindex.clock import wall_clock_ms

    NATIVE: bool
elif _FORCED_PURE:
    TripleHeap, TrackerCore, NATIVE = PureTripleHeap, PureTrackerCore, False
    wall_clock_ms = pure_wall_clock_ms
else:
    try:
        from delayindex._native import TrackerCore, TripleHeap
    except ImportError as exc:  # pragma: no cover - exercised only where the build failed
        warnings.warn(
            f"delayindex native extension unavailable ({exc}); using the slower pure-Python "
            "twins. Reinstall with a C compiler to get the native hot path.",
            RuntimeWarning,
            stacklevel=2,
        )
        TripleHeap, TrackerCore, NATIVE = PureTripleHeap, PureTrackerCore, False
        wall_clock_ms = pure_wall_clock_ms
    else:
        from delayindex._native import wall_clock_ms

        NATIVE = True


def native_module_or_none() -> object | None:
    """Return the native module if it is built (whatever the switch says), else ``None``."""
    try:
        from delayindex import _native
    except ImportError:
        return None
    return _native


__all__ = [
    "NATIVE",
    "PureTrackerCore",
    "PureTripleHeap",
    "TrackerCore",
    "TripleHeap",
    "pure_wall_clock_ms",
    "wall_clock_ms",
]
