"""Give memory freed by big background jobs back to the operating system.

Sealing and merging allocate and free many megabytes of temporary arrays on the executor
thread. glibc keeps freed memory in per-thread arenas, so without a trim the process's resident
size keeps the high-water mark of those temporaries, not the index's live size. ``malloc_trim``
returns whole free pages from every arena. Elsewhere (musl, macOS, Windows) this is a no-op.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import sys
from collections.abc import Callable

_trim: Callable[[int], int] | None = None
if sys.platform.startswith("linux"):
    try:
        _libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        _trim = _libc.malloc_trim
    except (OSError, AttributeError):  # not glibc
        _trim = None


def release_free_memory() -> bool:
    """Return free heap pages to the OS (glibc ``malloc_trim(0)``); False if unsupported."""
    if _trim is None:
        return False
    _trim(0)
    return True
