"""Cancel and reschedule for the pure ``BucketCore`` (a mixin; the native twin's are in
``cython/delayindex/_bucket_overrides.pxi``; ``_bucket.pxi``'s header explains the design).

``cancel`` untracks (copies are skipped on pop like any untracked one) and records the position
in ``_cancelled`` (a later add is refused, code 5). ``reschedule`` untracks as a due re-add does
(``_stale``: heap copies are purged when it is tracked again; a sealed-range position goes to the
direct heap with its segment copies shadowed), records ``_moved[pos] = time`` and adds it at the
new time. ``untrack_upto`` forgets both overrides at or below the mark; ``clear`` all of them.

Eviction (see the native twin's header): ``evict_cancels`` drops the cancels of sealed ranges
from memory once the driver has made them durable, remembering those ranges in ``_evicted``;
an add of an untracked position there, or a reschedule there, then answers
``ADD_NEED_OVERRIDES`` (nothing done) until the driver hands them back (``restore_evicted``).
``override_gen`` counts the changes of the override set, so the driver evicts only what its
last commit carried.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from delayindex._pure._ints import as_i64, check_ids
from delayindex._pure.heap import position_columns
from delayindex._pure.index import LedgerIndex
from delayindex._ranges import LedgerRanges
from delayindex.model import ADD_ACKED, ADD_NEED_OVERRIDES, MAX_LEDGER_ID

#: memory_bytes' estimate per reschedule override (as the native twin).
MOVED_ENTRY_BYTES = 200
#: What ``_override_on_add`` answers for a position whose evicted cancels must come back first.
NEED_OVERRIDES = object()


class BucketOverrides:
    """The override state and methods ``BucketCore`` mixes in."""

    _cancelled: LedgerIndex
    _moved: dict[tuple[int, int], int]
    _overridden: bool
    _evicted: LedgerRanges
    _ranges: Any
    override_gen: int
    _index: LedgerIndex
    _stale: set[tuple[int, int]]
    _shadow: set[tuple[int, int]]
    _mark: tuple[int, int]
    _n: dict[str, int]

    if TYPE_CHECKING:  # provided by BucketCore and TickedCore

        def _untrack(self, ledger: int, entry: int) -> bool: ...

        def _add(self, ledger: int, entry: int, deliver_at: int, cutoff: int) -> int: ...

        def cutoff_for(self, now: int) -> int: ...

    def _init_overrides(self) -> None:
        self._cancelled = LedgerIndex()
        self._moved = {}
        self._overridden = False  # some override may exist (keeps the add path cheap)
        self._evicted = LedgerRanges()  # ranges whose cancels are held by the driver only
        # Monotonic across clear(): the driver compares it with the one it noted.
        self.override_gen = getattr(self, "override_gen", -1) + 1

    def _cancel(self, ledger: int, entry: int) -> bool:
        if not self._untrack(ledger, entry):
            return False
        self.override_gen += 1
        self._cancelled.add(ledger, entry)
        self._moved.pop((ledger, entry), None)
        self._overridden = True
        self._shadow.discard((ledger, entry))
        self._n["cancelled"] += 1
        return True

    def cancel(self, ledger: int, entry: int) -> bool:
        """Untrack a tracked position for good: True if it was tracked. A later add of it is
        refused (code 5) until the mark passes it or :meth:`clear`."""
        ledger, entry = as_i64(ledger), as_i64(entry)
        check_ids(ledger, entry)
        return self._cancel(ledger, entry)

    def cancel_many(self, ledgers: object, entries: object) -> npt.NDArray[np.bool_]:
        """:meth:`cancel` for each element, validated as a whole first; a bool array."""
        ls, es = position_columns(ledgers, entries, "cancel_many")
        return np.array(
            [self._cancel(a, b) for a, b in zip(ls.tolist(), es.tolist(), strict=True)],
            dtype=np.bool_,
        )

    def reschedule(self, ledger: int, entry: int, deliver_at: int, now: int) -> int:
        """Move a position, tracked or not, to ``deliver_at`` (an override later adds keep);
        returns :meth:`add`'s code for the new time. On 3 (seal first) the override is recorded
        and the position untracked: seal and call again."""
        ledger, entry, deliver_at = as_i64(ledger), as_i64(entry), as_i64(deliver_at)
        cutoff = self.cutoff_for(as_i64(now))
        check_ids(ledger, entry)
        if (ledger, entry) <= self._mark:
            self._n["add_calls"] += 1
            self._n["acked_on_add"] += 1
            return ADD_ACKED
        if ledger in self._evicted:
            return ADD_NEED_OVERRIDES
        self.override_gen += 1
        self._cancelled.discard(ledger, entry)
        self._untrack(ledger, entry)
        self._stale.add((ledger, entry))
        self._shadow.discard((ledger, entry))
        self._moved[ledger, entry] = deliver_at
        self._overridden = True
        self._n["rescheduled"] += 1
        return self._add(ledger, entry, deliver_at, cutoff)

    def restore_overrides(
        self,
        cancelled_ledgers: Any,
        cancelled_entries: Any,
        moved_ledgers: Any,
        moved_entries: Any,
        moved_times: Any,
    ) -> None:
        """Record stored overrides (recovery, or a shared index's held positions) without
        changing what is tracked: the caller cancels or reschedules the tracked ones first.
        Positions at or below the mark are skipped. A position has one override: a moved one
        replaces its cancel (a reschedule revives), then a cancelled one replaces its move."""
        self.override_gen += 1
        for ledger, entry, time in zip(
            np.asarray(moved_ledgers).tolist(), np.asarray(moved_entries).tolist(),
            np.asarray(moved_times).tolist(), strict=True,
        ):  # fmt: skip
            check_ids(ledger, entry)
            if (ledger, entry) > self._mark:
                self._cancelled.discard(ledger, entry)
                self._moved[ledger, entry] = time
                self._overridden = True
        for ledger, entry in zip(
            np.asarray(cancelled_ledgers).tolist(), np.asarray(cancelled_entries).tolist(),
            strict=True,
        ):  # fmt: skip
            check_ids(ledger, entry)
            if (ledger, entry) > self._mark:
                self._cancelled.add(ledger, entry)
                self._moved.pop((ledger, entry), None)
                self._overridden = True

    def needs_restore(self, ledger: int, entry: int) -> bool:
        """Whether an add of the position would answer ``ADD_NEED_OVERRIDES``: it is above
        the mark, untracked, and its ledger's cancels are evicted."""
        return (
            ledger in self._evicted
            and (ledger, entry) > self._mark
            and not self._index.contains(ledger, entry)
        )

    def evict_cancels(self) -> int:
        """Drop from memory the cancels of every sealed range (the driver holds them durably);
        returns how many. Their ranges join the evicted ones."""
        evicted = 0
        for start, end in list(self._ranges.items()):
            removed = int(self._cancelled.remove_ledgers(start, end))
            if removed:
                evicted += removed
                self._evicted.add(start, end)
        if evicted:
            self._cancelled.compact()  # the emptied ledgers' slots go too
        return evicted

    def evict_range(self, start: int, end: int, drop: bool) -> int:
        """Mark ledgers ``start..end`` evicted: their cancels are held by the driver (a
        merge folded them into its bucket). With ``drop``, the cancels of the range leave
        memory (returns how many); without, those in memory stay (they are still answered)."""
        check_ids(start, 0)
        check_ids(end, 0)
        if start > end:
            raise ValueError(f"empty ledger range {start}..{end}")
        removed = 0
        if drop:
            removed = int(self._cancelled.remove_ledgers(start, end))
            if removed:
                self._cancelled.compact()
        self._evicted.add(start, end)
        self._overridden = True  # adds must look at the evicted ranges
        return removed

    def restore_evicted(
        self, ledgers: Any, entries: Any, start: int = 0, end: int = MAX_LEDGER_ID
    ) -> int:
        """Take back the evicted cancels of ledgers ``start..end`` (default: all of them) from
        the driver's durable record (ascending, as two int64 arrays; positions outside that
        span or the evicted ranges, or at or below the mark, are skipped, and so are
        rescheduled ones: a move is newer than a cancel folded before it); returns how many
        came back. The span is not evicted afterwards."""
        ls, es = np.asarray(ledgers, dtype=np.int64), np.asarray(entries, dtype=np.int64)
        if len(ls) != len(es):
            raise ValueError("ledgers and entries differ in length")
        start, end = as_i64(start), as_i64(end)
        if not 0 <= start <= end:
            raise ValueError(f"empty ledger range {start}..{end}")
        keep = self._evicted.mask(ls) & (ls >= start) & (ls <= end)
        restored = 0
        for ledger, entry in zip(ls[keep].tolist(), es[keep].tolist(), strict=True):
            check_ids(ledger, entry)
            if (ledger, entry) > self._mark and (ledger, entry) not in self._moved:
                restored += int(self._cancelled.add(ledger, entry))
        self._evicted.remove(start, end)
        return restored

    def evicted_ranges(self) -> list[tuple[int, int]]:
        """The ranges whose cancels are evicted, ascending."""
        return list(self._evicted)

    def evicted_mask(self, ledgers: Any) -> npt.NDArray[np.bool_]:
        """Whether each ledger lies in an evicted range."""
        return self._evicted.mask(ledgers)

    def override_of(self, ledger: int, entry: int) -> str | int | None:
        """The override an add of the position meets: None, ``"cancelled"``, or the
        rescheduled deliver time (at or below the mark: None, the mark decides). Call
        :meth:`needs_restore` first: evicted cancels are not seen here."""
        if (ledger, entry) <= self._mark:
            return None
        if len(self._cancelled) and self._cancelled.contains(ledger, entry):
            return "cancelled"
        return self._moved.get((ledger, entry)) if self._moved else None

    def override_record(
        self,
    ) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64], tuple[tuple[int, int, int], ...]]:
        """The overrides for the manifest: ``(cancelled_ledgers, cancelled_entries, ((ledger,
        entry, time), ...))``: the cancelled positions as two int64 arrays and the moved ones
        as a tuple, both ascending (no per-entry Python objects)."""
        ledgers, entries = self._cancelled.positions()
        return ledgers, entries, tuple((p[0], p[1], t) for p, t in sorted(self._moved.items()))

    def _override_on_add(self, ledger: int, entry: int, deliver_at: int) -> object:
        """The deliver time an add of the position takes (the override's, if any), None when
        a cancel override refuses it, or :data:`NEED_OVERRIDES`."""
        if not self._overridden:
            return deliver_at
        if len(self._cancelled) and self._cancelled.contains(ledger, entry):
            return None
        if ledger <= self._evicted.max and self.needs_restore(ledger, entry):
            return NEED_OVERRIDES
        if self._moved:
            return self._moved.get((ledger, entry), deliver_at)
        return deliver_at

    def _forget_overrides_upto(self, ledger: int, entry: int) -> None:
        if len(self._evicted):
            self._evicted.drop_below(ledger)
        if len(self._cancelled):
            self._cancelled.remove_upto(ledger, entry)
        if self._moved:
            self._moved = {p: t for p, t in self._moved.items() if p > (ledger, entry)}

    def _override_counters(self) -> dict[str, int]:
        return {
            "cancel_overrides": len(self._cancelled),
            "reschedule_overrides": len(self._moved),
            "evicted_cancel_ranges": len(self._evicted),
        }

    def _override_bytes(self) -> int:
        return self._cancelled.memory_bytes() + MOVED_ENTRY_BYTES * len(self._moved)
