"""The process's open trackers, for scrape-time metrics (:mod:`delayindex.metrics`).

A tracker enrolls itself when it opens and withdraws when it closes; the set holds weak
references, so a tracker dropped without ``close()`` leaves it too. A shared index withdraws
its internal topic index (it reports the topic itself). Nothing here touches the hot path:
enrolling costs one set insert per open.
"""

from __future__ import annotations

import itertools
import threading
import weakref
from typing import Any

_lock = threading.Lock()
_open: weakref.WeakKeyDictionary[Any, int] = weakref.WeakKeyDictionary()
_sequence = itertools.count(1)


def enroll(tracker: Any) -> None:
    """Count ``tracker`` among the open trackers (idempotent)."""
    with _lock:
        if tracker not in _open:
            _open[tracker] = next(_sequence)


def withdraw(tracker: Any) -> None:
    """``tracker`` closed (or is reported by another): no longer listed."""
    with _lock:
        _open.pop(tracker, None)


def open_trackers() -> list[tuple[int, Any]]:
    """``(enrollment number, tracker)`` of every open tracker, oldest first."""
    with _lock:
        items = list(_open.items())
    return sorted(((number, tracker) for tracker, number in items), key=lambda p: p[0])
