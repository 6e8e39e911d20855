"""The one place that chooses between native and pure-Python implementations.

The native extension ``delayindex._native`` is used when it imports, unless the environment
variable ``DELAYINDEX_NO_EXTENSIONS`` is set to a non-empty value other than ``0``, which forces
the pure twins in ``delayindex._pure`` (and ``delayindex.clock`` for the wall clock). ``NATIVE``
tells which one is active. A failed import of a built-but-broken extension warns.
"""

from __future__ import annotations

import os
import warnings
from types import ModuleType
from typing import TYPE_CHECKING

from delayindex import clock as _pure_clock
from delayindex._pure import bucket as _pure_bucket
from delayindex._pure import codec as _pure_codec
from delayindex._pure import core as _pure_core
from delayindex._pure import heap as _pure_heap
from delayindex._pure import index as _pure_index

_FORCED_PURE = os.environ.get("DELAYINDEX_NO_EXTENSIONS", "") not in ("", "0")

PureTripleHeap = _pure_heap.TripleHeap
PureTrackerCore = _pure_core.TrackerCore
PureBucketCore = _pure_bucket.BucketCore
PureLedgerIndex = _pure_index.LedgerIndex
pure_wall_clock_ms = _pure_clock.wall_clock_ms
pure_sorted_positions = _pure_heap.sorted_positions
#: The codec kernels: each is a function of both ``_native`` and ``_pure.codec``.
CODEC_KERNELS = (
    "build_segments",
    "decode_segments",
    "murmur3_32",
    "pack_times",
    "read_varints",
    "roaring_cardinalities",
    "roaring_check_positions",
    "roaring_entries",
    "roaring_union_by_ledger",
)


def native_module_or_none() -> ModuleType | None:
    """Return the native module if it is built (whatever the switch says), else ``None``."""
    try:
        from delayindex import _native
    except ImportError:
        return None
    return _native


def _load() -> tuple[ModuleType | None, bool]:
    if _FORCED_PURE:
        return None, False
    try:
        from delayindex import _native
    except ImportError as exc:  # pragma: no cover - exercised only where the build failed
        warnings.warn(
            f"delayindex native extension unavailable ({exc}); using the slower pure-Python "
            "twins. Reinstall with a C compiler to get the native hot path.",
            RuntimeWarning,
            stacklevel=3,
        )
        return None, False
    return _native, True


if TYPE_CHECKING:
    from delayindex._pure.bucket import BucketCore
    from delayindex._pure.codec import (
        build_segments,
        decode_segments,
        murmur3_32,
        pack_times,
        read_varints,
        roaring_cardinalities,
        roaring_check_positions,
        roaring_entries,
        roaring_union_by_ledger,
    )
    from delayindex._pure.core import TrackerCore
    from delayindex._pure.heap import TripleHeap, sorted_positions
    from delayindex._pure.index import LedgerIndex
    from delayindex.clock import wall_clock_ms

    NATIVE: bool
else:
    _module, NATIVE = _load()
    if _module is not None:
        TripleHeap = _module.TripleHeap
        TrackerCore = _module.TrackerCore
        BucketCore = _module.BucketCore
        LedgerIndex = _module.LedgerIndex
        wall_clock_ms = _module.wall_clock_ms
        sorted_positions = _module.sorted_positions
        _kernels = _module
    else:
        TripleHeap, TrackerCore = PureTripleHeap, PureTrackerCore
        BucketCore = PureBucketCore
        LedgerIndex = PureLedgerIndex
        wall_clock_ms = pure_wall_clock_ms
        sorted_positions = pure_sorted_positions
        _kernels = _pure_codec
    build_segments = _kernels.build_segments
    decode_segments = _kernels.decode_segments
    murmur3_32 = _kernels.murmur3_32
    pack_times = _kernels.pack_times
    read_varints = _kernels.read_varints
    roaring_cardinalities = _kernels.roaring_cardinalities
    roaring_check_positions = _kernels.roaring_check_positions
    roaring_entries = _kernels.roaring_entries
    roaring_union_by_ledger = _kernels.roaring_union_by_ledger


__all__ = [
    "CODEC_KERNELS",
    "BucketCore",
    "LedgerIndex",
    "PureBucketCore",
    "PureLedgerIndex",
    "NATIVE",
    "PureTrackerCore",
    "PureTripleHeap",
    "TrackerCore",
    "TripleHeap",
    "build_segments",
    "decode_segments",
    "murmur3_32",
    "native_module_or_none",
    "pack_times",
    "pure_sorted_positions",
    "pure_wall_clock_ms",
    "read_varints",
    "roaring_cardinalities",
    "roaring_check_positions",
    "roaring_entries",
    "roaring_union_by_ledger",
    "sorted_positions",
    "wall_clock_ms",
]
