"""What a shared index needs from its topic index (a :class:`DelayIndex`).

:class:`~delayindex.SharedDelayIndex` pops due keys with their times in selection order
(``_poll_keys``), counts what a subscription has acknowledged above the topic's mark
(``_count_upto``) and keeps its subscription records in the topic's manifest, carried by the
topic's commits like the mark-delete position (``_note_subscriptions``).
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from delayindex.model import MAX_TIME
from delayindex.storage.catalog import Catalog
from delayindex.storage.manifest import SubscriptionRecord
from delayindex.tracker._bucket import Int64Array


class TopicMixin:
    """DelayIndex's members for a shared index (state lives on the DelayIndex)."""

    _catalog: Catalog
    _core: Any
    _lock: threading.Lock
    _queued: deque[Callable[[], None]]
    _check_open: Callable[[], None]
    _now: Callable[[], int]
    _load: Callable[[int, int], None]
    _after_take: Callable[[int], None]
    _submit_queued: Callable[[], None]
    _restore_evicted: Callable[[int], None]
    _overrides_dirty: bool
    _overrides_used: bool

    def _poll_keys(
        self,
        max_messages: int,
        sink: Callable[[Int64Array, Int64Array, Int64Array], object] | None = None,
    ) -> tuple[Int64Array, Int64Array, Int64Array]:
        """:meth:`poll` as ``(times, ledgers, entries)`` arrays in selection order (for the
        shared index, which hands that one order to every subscription); ``sink`` is given
        them before the lock is released."""
        with self._lock:
            self._check_open()
            now = self._now()
            want = min(max_messages, MAX_TIME)
            parts = [self._core.poll_keys(want, now)]
            got = len(parts[0][0])
            while self._core.load_needed >= 0 and got < want:  # as DelayIndex.poll
                self._load(self._core.load_needed, now)
                parts.append(self._core.poll_keys(want - got, now))
                got += len(parts[-1][0])
            self._after_take(now)
            keys = _one_order(parts)
            if sink is not None:
                sink(*keys)
        if self._queued:
            self._submit_queued()
        return keys

    def _ensure_overrides(self, ledger: int, entry: int) -> None:
        """Before reading the overrides of a position the topic index does not track (a
        shared index's re-add of a held one): take back evicted cancels it needs."""
        with self._lock:
            self._check_open()
            if self._core.needs_restore(ledger, entry):
                self._restore_evicted(ledger)

    def _count_upto(self, ledger: int, entry: int) -> int:
        """How many tracked positions are ``<= (ledger, entry)``."""
        with self._lock:
            self._check_open()
            return int(self._core.count_upto(ledger, entry))

    def _record_overrides(
        self,
        cancelled: Sequence[tuple[int, int]] = (),
        moved: Sequence[tuple[int, int, int]] = (),
    ) -> None:
        """Record cancel or reschedule overrides of positions the topic index does not track
        (a shared index's held positions), persisted like the index's own."""
        with self._lock:
            self._check_open()
            self._core.restore_overrides(
                *(np.array([p[i] for p in cancelled], dtype=np.int64) for i in (0, 1)),
                *(np.array([m[i] for m in moved], dtype=np.int64) for i in (0, 1, 2)),
            )
            self._overrides_dirty = self._overrides_used = True

    def _note_subscriptions(self, records: tuple[SubscriptionRecord, ...]) -> None:
        """Carry a shared index's subscription records with the next commit (and close)."""
        with self._lock:
            self._check_open()
            self._catalog.note_subscriptions(records)

    def _stored_subscriptions(self) -> tuple[SubscriptionRecord, ...]:
        """The subscription records the manifest held at open (or noted since)."""
        with self._lock:
            return self._catalog.manifest.subscriptions


def _one_order(
    parts: list[tuple[Int64Array, Int64Array, Int64Array]],
) -> tuple[Int64Array, Int64Array, Int64Array]:
    """The keys of one pop's parts as one selection order."""
    if len(parts) == 1:
        return parts[0]
    times, ledgers, entries = (np.concatenate(column) for column in zip(*parts, strict=True))
    # A load adds keys after the placeholder that asked for it, but the placeholder of a
    # bucket whose reads failed was moved later (its keys come late): one pop, one order.
    order = np.lexsort((entries, ledgers, times))
    return times[order], ledgers[order], entries[order]
