"""Membership restored on first use after an open (issue 18, item 3).

How it works. Recovery used to restore every recovered bucket's positions into the core's dedup
index at open: per-message work, about 6 ns each. Now a bucket whose positions nothing at open
depends on is *lazy*: its first live segment is a placeholder (read when due, as for every
bucket), and its positions wait in ``_lazy``, undecoded (format 5 keeps them, ledger columns
included, in a part of their own). Until they are restored the tracker's core is a
:class:`LazyCore`. It answers ``len`` exactly (the core's count plus the lazy buckets' live
counts) and a few questions that do not depend on membership; any other attribute first
restores every lazy bucket, then puts the real core back in place (the tracker's and its
front's), so later calls pay nothing. Every path to the core goes through the tracker's
``_core`` or its front's ``core``, so no call can see a partial membership.

Invariants: a lazy bucket is durable, not folded, and has a source (its segment ``first``, or
a placeholder for it); ``_lazy_count`` is the sum of the lazy buckets'
live counts; no position of a lazy bucket is in the core. A bucket whose bitmaps turn out
damaged when restored is quarantined then, its positions unknown, as it would have been at
open.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from delayindex.errors import SnapshotCorruptError
from delayindex.snapshot.format import SnapshotMetadata
from delayindex.tracker._bucket import _Bucket


@dataclass
class LazyBucket:
    """A recovered bucket whose positions are not in the core yet."""

    bucket: _Bucket
    metadata: SnapshotMetadata
    first: int  # its first live segment: positions of segments first.. are restored
    count: int  # how many: the live segments' counts


class LazyCore:
    """Stands in for the core while recovered buckets' positions are lazy.

    ``len`` and the membership-free questions below answer at once; any other attribute
    restores the lazy buckets first (``owner._finish_lazy``) and then comes from the
    core itself.
    """

    __slots__ = ("_owner", "core")

    def __init__(self, owner: LazyRestoreMixin, core: Any) -> None:
        self._owner = owner
        self.core = core

    def __len__(self) -> int:
        # Under the restore's lock: ``len`` takes no tracker lock, and a restore under way in
        # another thread has moved some positions into the core but not yet out of the count.
        with self._owner._lazy_lock:
            return len(self.core) + self._owner._lazy_count

    def __getattr__(self, name: str) -> Any:
        return getattr(self._owner._finish_lazy(), name)

    # Membership-free: the clock rule, the sealed ranges, the sources, the heaps' sizes and the
    # memory held (not ``counters``: it counts the tracked positions).
    @property
    def tick_ms(self) -> int:
        return int(self.core.tick_ms)

    @tick_ms.setter
    def tick_ms(self, value: int) -> None:
        self.core.tick_ms = value

    @property
    def mutable_size(self) -> int:
        return int(self.core.mutable_size)

    @property
    def direct_size(self) -> int:
        return int(self.core.direct_size)

    def cutoff_for(self, now: int) -> int:
        return int(self.core.cutoff_for(now))

    def in_sealed_range(self, ledger: int) -> bool:
        return bool(self.core.in_sealed_range(ledger))

    def has_source(self, sid: int) -> bool:
        return bool(self.core.has_source(sid))

    def memory_bytes(self) -> int:
        return int(self.core.memory_bytes())

    def _check(self) -> None:
        self.core._check()
        self._owner._check_lazy()


class LazyRestoreMixin:
    """DelayIndex's lazy restores (state lives on the DelayIndex)."""

    # State (set in DelayIndex.__init__).
    _core: Any
    _front: Any
    _lazy: list[LazyBucket]
    _lazy_count: int
    _lazy_lock: threading.RLock

    # Provided by DelayIndex and its other mixins.
    _quarantine: Callable[..., None]

    def _defer_restores(self, core: Any, lazy: list[LazyBucket]) -> None:
        """Put the core behind a :class:`LazyCore` until ``lazy`` are restored
        (recovery, before anything else can reach the core)."""
        if not lazy:
            return
        self._lazy = lazy
        self._lazy_count = sum(d.count for d in lazy)
        self._core = self._front.core = LazyCore(self, core)

    def _restore_lazy_in(
        self, core: Any, lazy: list[LazyBucket], ledgers: npt.NDArray[np.int64]
    ) -> list[LazyBucket]:
        """Restore into ``core`` now the buckets of ``lazy`` that hold any of ``ledgers``
        (sorted; recovery applies overrides there); returns the others."""
        if not len(ledgers):
            return lazy
        needed: list[LazyBucket] = []
        keep: list[LazyBucket] = []
        for item in lazy:
            b = item.bucket
            held = np.searchsorted(ledgers, b.end, side="right") > np.searchsorted(ledgers, b.start)
            (needed if held else keep).append(item)
        self._quarantine_unrestored(self._restore_all(core, needed))
        return keep

    def _finish_lazy(self) -> Any:
        """Restore every lazy bucket and put the real core back; returns it. Idempotent
        and safe from any thread: callers hold the tracker's lock or are its only user."""
        with self._lazy_lock:
            core = self._core
            if not isinstance(core, LazyCore):
                return core
            damaged = self._restore_all(core.core, self._lazy)
            self._lazy, self._lazy_count = [], 0
            core = self._unwrap_lazy()
            self._quarantine_unrestored(damaged)  # on the real core: it calls into it
            return core

    def _drop_lazy(self) -> Any:
        """Forget the lazy buckets' positions without restoring them (close, clear: the
        snapshots keep them); returns the real core."""
        with self._lazy_lock:
            self._lazy, self._lazy_count = [], 0
            return self._unwrap_lazy()

    def _unwrap_lazy(self) -> Any:
        core = self._core
        if isinstance(core, LazyCore):
            core = core.core
            self._core = self._front.core = core
        return core

    @staticmethod
    def _restore_all(
        core: Any, items: list[LazyBucket]
    ) -> list[tuple[LazyBucket, SnapshotCorruptError]]:
        """Restore ``items``' positions into ``core``; returns those whose bitmaps turned out
        damaged (the core holds none of their positions), with why."""
        from delayindex.tracker._recovery import _restore_live  # it imports this module

        damaged = []
        for item in items:
            assert item.bucket.snapshot_id is not None
            try:
                _restore_live(core, item.metadata, item.first, item.bucket.snapshot_id)
            except SnapshotCorruptError as exc:
                damaged.append((item, exc))
        return damaged

    def _quarantine_unrestored(
        self, damaged: list[tuple[LazyBucket, SnapshotCorruptError]]
    ) -> None:
        """Quarantine the buckets whose restore failed: found now rather than at open, their
        positions unknown."""
        for item, exc in damaged:
            self._quarantine(item.bucket, exc, item.first, positions_known=False)

    def _check_lazy(self) -> None:
        """Assert the lazy buckets' invariants (see the module doc)."""
        core = self._core.core if isinstance(self._core, LazyCore) else self._core
        if sum(d.count for d in self._lazy) != self._lazy_count:
            raise AssertionError("the lazy count differs from the lazy buckets'")
        for item in self._lazy:
            b = item.bucket
            if b.state != "durable" or b.folded or not core.has_source(b.sid):
                raise AssertionError(f"lazy bucket [{b.start}, {b.end}] is not durable")
            if b.current not in (item.first - 1, item.first) or item.count < 1:
                raise AssertionError(f"lazy bucket [{b.start}, {b.end}] has moved on")
