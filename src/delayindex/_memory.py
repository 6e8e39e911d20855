"""Give memory freed by big background jobs back to the operating system.

Sealing and merging allocate and free many megabytes of temporary arrays on the executor
thread. glibc keeps freed memory in per-thread arenas, so without a trim the process's resident
size keeps the high-water mark of those temporaries, not the index's live size. ``malloc_trim``
returns whole free pages from every arena. Elsewhere (musl, macOS, Windows) this is a no-op.

A trim cannot return a page that a live allocation still touches. glibc's *dynamic mmap
threshold* puts them there: each time a large mmapped block is freed, the threshold rises to
its size (up to 32 MiB), and from then on the seal and merge temporaries come from the heap,
where they interleave with long-lived allocations. :func:`tune_allocator` pins the threshold
(what ``MALLOC_MMAP_THRESHOLD_`` does at start-up), so temporaries above it are mapped and
unmapped whole. It is process-wide, so the library never calls it on its own: the
``delayindex`` command line does, and an application opts in.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import sys
from collections.abc import Callable

_trim: Callable[[int], int] | None = None
_mallopt: Callable[[int, int], int] | None = None
if sys.platform.startswith("linux"):
    try:
        _libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        _trim = _libc.malloc_trim
        _mallopt = _libc.mallopt
    except (OSError, AttributeError):  # not glibc
        _trim = _mallopt = None

#: glibc's ``mallopt`` parameter number for the mmap threshold (``M_MMAP_THRESHOLD``).
_M_MMAP_THRESHOLD = -3
#: Pinned, the threshold stops rising. Any pinned value measured the same resident memory; a
#: few MiB keeps the mid-sized temporaries on the heap (glibc's initial 128 KiB mapped every
#: one of them: a 10 M fill took 10 % longer).
DEFAULT_MMAP_THRESHOLD = 4 * 1024 * 1024
_MAX_MMAP_THRESHOLD = 32 * 1024 * 1024


def release_free_memory() -> bool:
    """Return free heap pages to the OS (glibc ``malloc_trim(0)``); False if unsupported."""
    if _trim is None:
        return False
    _trim(0)
    return True


def tune_allocator(mmap_threshold: int = DEFAULT_MMAP_THRESHOLD) -> bool:
    """Pin glibc's mmap threshold for this process, so memory freed by seals and merges goes
    back to the OS instead of fragmenting the heap; False where unsupported (not glibc).

    At 10 M realistic messages, a ``DelayIndex`` holds 1.4 to 4.1 B/msg resident with glibc's
    default (dynamic) threshold, varying from run to run, and 1.4 B/msg in every run with the
    threshold pinned (``docs/benchmarks.md``). The setting is process-wide: the default is the
    same as starting the process with ``MALLOC_MMAP_THRESHOLD_=4194304``. Allocations above the
    threshold are mapped and unmapped whole, which costs page faults in code that churns through
    large temporary buffers. The library never calls it by itself; call it once at start-up.

    Raises:
        ValueError: ``mmap_threshold`` is outside ``[0, 32 MiB]``.
        TypeError: it is not an int.
    """
    if isinstance(mmap_threshold, bool) or not isinstance(mmap_threshold, int):
        raise TypeError(f"mmap_threshold must be an int, not {type(mmap_threshold).__name__}")
    if not 0 <= mmap_threshold <= _MAX_MMAP_THRESHOLD:
        raise ValueError(
            f"mmap_threshold must be in [0, {_MAX_MMAP_THRESHOLD}], got {mmap_threshold}"
        )
    if _mallopt is None:
        return False
    return bool(_mallopt(_M_MMAP_THRESHOLD, mmap_threshold))
