"""The one place that chooses between native and pure-Python implementations.

The native extension ``delayindex._native`` is used when it imports, unless the environment
variable ``DELAYINDEX_NO_EXTENSIONS`` is set to a non-empty value other than ``0``, which forces
the pure twins in ``delayindex._pure`` (and ``delayindex.clock`` for the wall clock). ``NATIVE``
tells which one is active and ``BUILD`` says so in words, with the reason for a pure build
(``delayindex --version`` and every tracker's ``stats()["build"]`` show it).

An install without the extension is legitimate: the sdist falls back to the pure build where no
C compiler is found (see ``setup.py``), and says so when it is built. So an absent extension is
silent here; an extension that is present but fails to import (a broken or mismatched build)
warns, since the user asked for speed and is not getting it.
"""

from __future__ import annotations

import importlib.util
import os
import threading
import warnings
from types import ModuleType
from typing import TYPE_CHECKING

from delayindex import clock as _pure_clock
from delayindex._pure import bins as _pure_bins
from delayindex._pure import bucket as _pure_bucket
from delayindex._pure import codec as _pure_codec
from delayindex._pure import core as _pure_core
from delayindex._pure import front as _pure_front
from delayindex._pure import heap as _pure_heap
from delayindex._pure import index as _pure_index

_FORCED_PURE = os.environ.get("DELAYINDEX_NO_EXTENSIONS", "") not in ("", "0")

PureTripleHeap = _pure_heap.TripleHeap
PureBinIndex = _pure_bins.BinIndex
PureTrackerCore = _pure_core.TrackerCore
PureBucketCore = _pure_bucket.BucketCore
PureLedgerIndex = _pure_index.LedgerIndex
PureFront = _pure_front.Front
PureSharedFront = _pure_front.SharedFront
#: The pure twin of the native Lock is the lock it stands for.
PureLock = threading.Lock
PureSubFront = _pure_front.SubFront
pure_wall_clock_ms = _pure_clock.wall_clock_ms
pure_sorted_positions = _pure_heap.sorted_positions
#: The codec kernels: each is a function of both ``_native`` and ``_pure.codec``.
CODEC_KERNELS = (
    "build_segments",
    "decode_segments",
    "murmur3_32",
    "pack_times",
    "read_varints",
    "roaring_block_values",
    "roaring_cardinalities",
    "roaring_check_positions",
    "roaring_entries",
    "roaring_union_by_ledger",
    "roaring_write_block",
    "unpack_entry_gaps",
    "unpack_segment_times",
)


def native_module_or_none() -> ModuleType | None:
    """Return the native module if it is built (whatever the switch says), else ``None``."""
    try:
        from delayindex import _native
    except ImportError:
        return None
    return _native


def _load() -> tuple[ModuleType | None, str]:
    """The native module (or None) and the words for ``BUILD``."""
    if _FORCED_PURE:
        return None, "pure-Python build (forced by DELAYINDEX_NO_EXTENSIONS)"
    if importlib.util.find_spec(f"{__package__}._native") is None:
        return None, "pure-Python build (the native extension was not built at install)"
    try:
        from delayindex import _native
    except ImportError as exc:  # present but unloadable: a broken or mismatched build
        warnings.warn(
            f"delayindex native extension unavailable ({exc}); using the slower pure-Python "
            "twins. Reinstall with a C compiler to get the native hot path.",
            RuntimeWarning,
            stacklevel=3,
        )
        return None, f"pure-Python build (the native extension failed to import: {exc})"
    return _native, "native build (Cython extension delayindex._native)"


if TYPE_CHECKING:
    from threading import Lock

    from delayindex._pure.bins import BinIndex
    from delayindex._pure.bucket import BucketCore
    from delayindex._pure.codec import (
        build_segments,
        decode_segments,
        murmur3_32,
        pack_times,
        read_varints,
        roaring_block_values,
        roaring_cardinalities,
        roaring_check_positions,
        roaring_entries,
        roaring_union_by_ledger,
        roaring_write_block,
        unpack_entry_gaps,
        unpack_segment_times,
    )
    from delayindex._pure.core import TrackerCore
    from delayindex._pure.front import Front, SharedFront, SubFront
    from delayindex._pure.heap import TripleHeap, sorted_positions
    from delayindex._pure.index import LedgerIndex
    from delayindex.clock import wall_clock_ms

    NATIVE: bool
    BUILD: str
else:
    _module, BUILD = _load()
    NATIVE = _module is not None
    if _module is not None:
        TripleHeap = _module.TripleHeap
        BinIndex = _module.BinIndex
        TrackerCore = _module.TrackerCore
        BucketCore = _module.BucketCore
        LedgerIndex = _module.LedgerIndex
        Front = _module.Front
        Lock = _module.Lock
        SharedFront = _module.SharedFront
        SubFront = _module.SubFront
        wall_clock_ms = _module.wall_clock_ms
        sorted_positions = _module.sorted_positions
        _kernels = _module
    else:
        TripleHeap, TrackerCore = PureTripleHeap, PureTrackerCore
        BinIndex = PureBinIndex
        BucketCore = PureBucketCore
        LedgerIndex = PureLedgerIndex
        Front = PureFront
        Lock = PureLock
        SharedFront = PureSharedFront
        SubFront = PureSubFront
        wall_clock_ms = pure_wall_clock_ms
        sorted_positions = pure_sorted_positions
        _kernels = _pure_codec
    build_segments = _kernels.build_segments
    decode_segments = _kernels.decode_segments
    murmur3_32 = _kernels.murmur3_32
    pack_times = _kernels.pack_times
    read_varints = _kernels.read_varints
    roaring_block_values = _kernels.roaring_block_values
    roaring_cardinalities = _kernels.roaring_cardinalities
    roaring_check_positions = _kernels.roaring_check_positions
    roaring_entries = _kernels.roaring_entries
    roaring_union_by_ledger = _kernels.roaring_union_by_ledger
    roaring_write_block = _kernels.roaring_write_block
    unpack_entry_gaps = _kernels.unpack_entry_gaps
    unpack_segment_times = _kernels.unpack_segment_times


#: The short form of ``BUILD`` that ``stats()`` and the reports carry.
IMPLEMENTATION = "native" if NATIVE else "pure"

__all__ = [
    "BUILD",
    "BinIndex",
    "CODEC_KERNELS",
    "IMPLEMENTATION",
    "BucketCore",
    "Front",
    "LedgerIndex",
    "Lock",
    "PureBinIndex",
    "PureBucketCore",
    "PureFront",
    "PureLedgerIndex",
    "PureLock",
    "PureSharedFront",
    "PureSubFront",
    "NATIVE",
    "PureTrackerCore",
    "PureTripleHeap",
    "SharedFront",
    "SubFront",
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
    "roaring_block_values",
    "roaring_cardinalities",
    "roaring_check_positions",
    "roaring_entries",
    "roaring_union_by_ledger",
    "roaring_write_block",
    "sorted_positions",
    "unpack_entry_gaps",
    "unpack_segment_times",
    "wall_clock_ms",
]
