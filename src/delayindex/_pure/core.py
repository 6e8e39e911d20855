"""Pure-Python twin of the native ``TrackerCore`` (see ``cython/delayindex/_core.pxi``).

Every tracked position has one bit in a per-ledger roaring bitmap (the dedup index, whose total
cardinality is ``len(core)``) and a live node in the heap. A due re-add untracks the position and
leaves its node behind as *stale*; stale nodes are dropped when they reach the head, and a stale
position that is tracked again first has its old node purged.

Cancel leaves the node behind as a *dead* one and records the position in ``_cancelled`` (a later
add is refused); reschedule does the same and records ``_moved[pos] = time``, tracking the
position at the new time. A node is live when its position is tracked and its time is the
override's (if any); the native module header has the details.

Bitmaps emptied by delivery are swept lazily (once as many positions were delivered since the
last sweep as there are bitmaps). The native twin keeps the same set in a LedgerIndex instead;
the ``bitmaps`` counter is the number of ledgers holding a position in both.

Invariants (``_check``): heap size == tracked + stale + dead; count == bitmap cardinality ==
positions with a live node; no position is both tracked and stale, or tracked and cancelled."""

from __future__ import annotations

import sys
from typing import Any

import numpy as np
import numpy.typing as npt
from pyroaring import BitMap

from delayindex._lateness import Lateness
from delayindex._pure._ints import as_i64, check_ids
from delayindex._pure._ticked import TickedCore
from delayindex._pure.bins import BinIndex
from delayindex._pure.heap import TripleHeap, _int64_column, position_columns
from delayindex._pure.index import LedgerIndex
from delayindex.model import ADD_CANCELLED, MAX_ENTRY_ID, Position

_BITMAP_OVERHEAD = 64
#: memory_bytes' estimate per reschedule override (as the native twin).
_MOVED_ENTRY_BYTES = 200


class TrackerCore(TickedCore):
    """Heap + dedup index + fixed-delay state of an exact-timestamp tracker (time passed in).

    ``add`` returns 0 (deliver now, not tracked), 1 (newly tracked) or 2 (already tracked).
    """

    def __init__(self, tick_ms: int, strict: bool, fixed_delay_lookahead: int) -> None:
        tick_ms = as_i64(tick_ms)
        fixed_delay_lookahead = as_i64(fixed_delay_lookahead)
        if tick_ms < 0:
            raise ValueError(f"tick_ms must be >= 0, got {tick_ms}")
        if fixed_delay_lookahead < 0:
            raise ValueError(f"fixed_delay_lookahead must be >= 0, got {fixed_delay_lookahead}")
        self._heap = TripleHeap()
        self._bitmaps: dict[int, BitMap] = {}
        self._stale: set[tuple[int, int]] = set()
        self._dead = 0  # nodes of cancelled or moved-away positions (not tracked, not stale)
        self._cancelled = LedgerIndex()
        self._moved: dict[tuple[int, int], int] = {}
        self._overridden = False  # some cancel or reschedule override may exist
        self._count = 0
        self._tick = tick_ms
        self.strict = bool(strict)
        self.fixed_delay_lookahead = fixed_delay_lookahead
        self._fixed_delay = True
        self._highest = 0
        self._delivered_since_sweep = 0
        self._n = dict.fromkeys(
            ("add_calls", "added", "duplicates", "rejected", "untracked_on_due_add",
             "delivered", "stale_skipped", "polls", "cancelled", "rescheduled",
             "refused_cancelled"),
            0,
        )  # fmt: skip
        self._lateness = Lateness()  # poll's delivery lateness

    def _untrack(self, ledger: int, entry: int) -> bool:
        bm = self._bitmaps.get(ledger)
        if bm is None or entry not in bm:
            return False
        bm.remove(entry)
        self._count -= 1
        if not bm:
            del self._bitmaps[ledger]
        self._stale.add((ledger, entry))
        return True

    def _untrack_dead(self, ledger: int, entry: int) -> bool:
        """Untrack for a cancel or reschedule: the node stays behind as a dead one."""
        bm = self._bitmaps.get(ledger)
        if bm is None or entry not in bm:
            return False
        bm.remove(entry)
        self._count -= 1
        if not bm:
            del self._bitmaps[ledger]
        self._dead += 1
        return True

    def _live(self, time: int, ledger: int, entry: int) -> bool:
        """Whether a node is its position's live copy (tracked, at the override's time)."""
        if not self._stale and not self._dead:
            return True
        bm = self._bitmaps.get(ledger)
        if bm is None or entry not in bm:
            return False
        moved = self._moved.get((ledger, entry)) if self._moved else None
        return moved is None or moved == time

    def _skipped(self, ledger: int, entry: int) -> None:
        if (ledger, entry) in self._stale:
            self._stale.discard((ledger, entry))
        else:
            self._dead -= 1
        self._n["stale_skipped"] += 1

    def _add(self, ledger: int, entry: int, deliver_at: int, cutoff: int) -> int:
        n = self._n
        n["add_calls"] += 1
        if self._overridden:  # off the usual path: no cancel or reschedule was ever made
            if len(self._cancelled) and self._cancelled.contains(ledger, entry):
                n["refused_cancelled"] += 1
                return ADD_CANCELLED
            if self._moved:
                deliver_at = self._moved.get((ledger, entry), deliver_at)
        if deliver_at < 0 or deliver_at <= cutoff:
            self._fixed_delay = False
            n["rejected"] += 1
            if self._count and self._untrack(ledger, entry):
                n["untracked_on_due_add"] += 1
            return 0
        bm = self._bitmaps.get(ledger)
        if bm is None:
            bm = self._bitmaps[ledger] = BitMap()
        if entry in bm:
            n["duplicates"] += 1
            self._note_deliver_at(deliver_at)
            return 2
        if (ledger, entry) in self._stale:
            # Purge its stale node (and any dead ones a reschedule left behind).
            self._dead -= self._heap.remove(ledger, entry) - 1
            self._stale.discard((ledger, entry))
        self._heap.push(deliver_at, ledger, entry)
        bm.add(entry)
        self._count += 1
        n["added"] += 1
        self._note_deliver_at(deliver_at)
        return 1

    def add(self, ledger: int, entry: int, deliver_at: int, now: int) -> int:
        """Track ``(ledger, entry)`` until ``deliver_at``; see the class doc for the result."""
        ledger, entry, deliver_at = as_i64(ledger), as_i64(entry), as_i64(deliver_at)
        cutoff = self.cutoff_for(now)
        check_ids(ledger, entry)
        return self._add(ledger, entry, deliver_at, cutoff)

    def add_many(
        self, ledgers: object, entries: object, deliver_ats: object, now: int
    ) -> npt.NDArray[np.bool_]:
        """``add`` for each element in order; validates everything before changing anything."""
        ls, es, ts = (_int64_column(a) for a in (ledgers, entries, deliver_ats))
        if not len(ls) == len(es) == len(ts):
            raise ValueError(
                f"add_many needs sequences of equal length, got {len(ls)}, {len(es)}, {len(ts)}"
            )
        cutoff = self.cutoff_for(now)
        bad = np.flatnonzero((ls < 0) | (es < 0) | (es > MAX_ENTRY_ID))
        if len(bad):
            i = int(bad[0])
            raise ValueError(
                f"element {i}: bad position ({ls[i]}, {es[i]}); need "
                f"ledger_id >= 0 and 0 <= entry_id < 2**32"
            )
        out = np.zeros(len(ls), dtype=np.bool_)
        for i, (ledger, entry, deliver_at) in enumerate(
            zip(ls.tolist(), es.tolist(), ts.tolist(), strict=True)
        ):
            out[i] = self._add(ledger, entry, deliver_at, cutoff) != 0
        return out

    def _purge_stale_heads(self) -> None:
        heap = self._heap
        while (self._stale or self._dead) and heap:
            time, ledger, entry = heap.peek()
            if self._live(time, ledger, entry):
                return
            heap.pop()
            self._skipped(ledger, entry)

    def poll(self, max_n: int, now: int) -> list[Position]:
        """Remove up to ``max_n`` due positions, chosen in (time, ledger, entry) order.

        Returns them as a list of ``Position`` sorted by position.
        """
        max_n = as_i64(max_n)
        cutoff = self.cutoff_for(now)
        self._n["polls"] += 1
        if max_n <= 0:
            return []
        heap = self._heap
        out: list[Position] = []
        while len(out) < max_n and heap and heap.peek()[0] <= cutoff:
            time, ledger, entry = heap.pop()
            if not self._live(time, ledger, entry):
                self._skipped(ledger, entry)
                continue
            self._bitmaps[ledger].remove(entry)
            self._lateness.note(now - time)
            out.append(Position(ledger, entry))
        self._count -= len(out)
        self._n["delivered"] += len(out)
        self._delivered_since_sweep += len(out)
        if self._delivered_since_sweep > len(self._bitmaps):
            self.compact()
        if self._count == 0:
            self._reset_when_empty()
        out.sort()
        return out

    def compact(self) -> None:
        """Release bitmaps emptied by deliveries now rather than lazily."""
        for ledger in [ledger for ledger, bm in self._bitmaps.items() if not bm]:
            del self._bitmaps[ledger]
        self._delivered_since_sweep = 0

    def _reset_when_empty(self) -> None:
        self._fixed_delay = True
        self._highest = 0
        self._bitmaps.clear()
        self._delivered_since_sweep = 0
        if self._heap:
            self._n["stale_skipped"] += len(self._heap)
            self._heap.clear()
        self._stale.clear()
        self._dead = 0

    # -- cancel, reschedule, browse --------------------------------------------------------------

    def _cancel(self, ledger: int, entry: int) -> bool:
        if not self._untrack_dead(ledger, entry):
            return False
        self._cancelled.add(ledger, entry)
        self._moved.pop((ledger, entry), None)
        self._overridden = True
        self._n["cancelled"] += 1
        return True

    def cancel(self, ledger: int, entry: int) -> bool:
        """Untrack a tracked position for good: True if it was tracked. A later add of it is
        refused (``ADD_CANCELLED``) until :meth:`clear`."""
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
        returns :meth:`add`'s code for the new time (0: due now, untracked)."""
        ledger, entry, deliver_at = as_i64(ledger), as_i64(entry), as_i64(deliver_at)
        cutoff = self.cutoff_for(now)
        check_ids(ledger, entry)
        # The old node (if any) stays behind, dead: its time is not the override's (or, at the
        # same time, it is a twin that poll skips once the position is delivered).
        if not (len(self._cancelled) and self._cancelled.discard(ledger, entry)):
            self._untrack_dead(ledger, entry)
        self._moved[ledger, entry] = deliver_at
        self._overridden = True
        self._n["rescheduled"] += 1
        return self._add(ledger, entry, deliver_at, cutoff)

    def live_keys(self, first: int, last: int) -> tuple[Any, Any, Any]:
        """``(times, ledgers, entries)`` of the tracked positions with ``first <= deliver_at <=
        last``, in no particular order (nothing is removed)."""
        first, last = as_i64(first), as_i64(last)
        ts, ls, es = self._heap.to_arrays()
        keep = np.flatnonzero((ts >= first) & (ts <= last))
        rows = [
            i
            for i, t, a, b in zip(
                keep.tolist(),
                ts[keep].tolist(),
                ls[keep].tolist(),
                es[keep].tolist(),
                strict=True,
            )
            if self._live(t, a, b)
        ]
        idx = np.array(rows, dtype=np.int64)
        if self._dead and len(idx):
            _, ones = np.unique(np.stack([ls[idx], es[idx]]), axis=1, return_index=True)
            idx = idx[np.sort(ones)]
        return ts[idx], ls[idx], es[idx]

    def due_histogram(self, edges: object) -> npt.NDArray[np.int64]:
        """Tracked positions per ``[edges[i], edges[i+1])`` (``edges`` strictly increasing,
        checked by the caller); an int64 array of ``len(edges) - 1`` counts."""
        edges_arr = _int64_column(edges)
        nb = len(edges_arr) - 1
        if nb <= 0:
            return np.zeros(0, dtype=np.int64)
        times = self.live_keys(int(edges_arr[0]), int(edges_arr[-1]) - 1)[0]
        return BinIndex(edges_arr).counts(times)

    def has_due(self, now: int) -> bool:
        """Whether some tracked position is due at ``now``."""
        cutoff = self.cutoff_for(now)
        self._purge_stale_heads()
        return bool(self._heap) and self._heap.peek()[0] <= cutoff

    def next_time(self) -> int | None:
        """The smallest tracked deliver_at, or None when nothing is tracked."""
        self._purge_stale_heads()
        return self._heap.peek()[0] if self._heap else None

    def contains(self, ledger: int, entry: int) -> bool:
        """Whether ``(ledger, entry)`` is tracked and not yet delivered."""
        ledger, entry = as_i64(ledger), as_i64(entry)
        check_ids(ledger, entry)
        bm = self._bitmaps.get(ledger)
        return bm is not None and entry in bm

    def __len__(self) -> int:
        return self._count

    def clear(self) -> None:
        """Drop every tracked position, the cancel and reschedule overrides, and reset
        fixed-delay detection."""
        self._heap.clear()
        self._bitmaps.clear()
        self._stale.clear()
        self._dead = 0
        self._cancelled.clear()
        self._moved.clear()
        self._overridden = False
        self._count = 0
        self._fixed_delay = True
        self._highest = 0
        self._delivered_since_sweep = 0

    def memory_bytes(self) -> int:
        """Resident estimate: heap + bitmaps + index containers."""
        total = self._heap.nbytes + sys.getsizeof(self._bitmaps) + sys.getsizeof(self._stale)
        total += self._cancelled.memory_bytes() + sys.getsizeof(self._moved)
        total += _MOVED_ENTRY_BYTES * len(self._moved)
        return total + sum(sys.getsizeof(bm) + _BITMAP_OVERHEAD for bm in self._bitmaps.values())

    def counters(self) -> dict[str, Any]:
        """Operation counters and gauges."""
        return {
            "tracked": self._count,
            "heap_nodes": len(self._heap),
            "stale_nodes": len(self._stale),
            "dead_nodes": self._dead,
            # Ledgers holding a position (the native twin's LedgerIndex.num_ledgers).
            "bitmaps": sum(1 for bm in self._bitmaps.values() if bm),
            **self._n,
            "lateness": list(self._lateness.counts),
            "lateness_ms": self._lateness.total_ms,
            "cancel_overrides": len(self._cancelled),
            "reschedule_overrides": len(self._moved),
            "fixed_delay": self._fixed_delay,
            "highest_deliver_at": self._highest,
        }

    def _check(self) -> None:
        """Assert the invariants listed in the module docstring."""
        self._heap._check()
        cardinality = sum(len(bm) for bm in self._bitmaps.values())
        if cardinality != self._count:
            raise AssertionError(f"count {self._count} != bitmap cardinality {cardinality}")
        if len(self._heap) != self._count + len(self._stale) + self._dead:
            raise AssertionError(
                f"heap has {len(self._heap)} nodes, expected count {self._count} + stale "
                f"{len(self._stale)} + dead {self._dead}"
            )
        ts, ls, es = self._heap.to_arrays()
        live: set[tuple[int, int]] = set()
        for time, ledger, entry in zip(ts.tolist(), ls.tolist(), es.tolist(), strict=True):
            pos = (ledger, entry)
            bm = self._bitmaps.get(ledger)
            tracked = bm is not None and entry in bm
            if tracked and pos in self._stale:
                raise AssertionError(f"position {pos} is tracked and stale")
            if tracked and self._cancelled.contains(ledger, entry):
                raise AssertionError(f"position {pos} is tracked and cancelled")
            if self._live(time, ledger, entry):
                live.add(pos)
        if not self._dead and len(live) != len(ts) - len(self._stale):
            raise AssertionError("a position has two live nodes without a reschedule")
        tracked_count = sum(len(bm) for bm in self._bitmaps.values())
        if len(live) != tracked_count:
            raise AssertionError(f"{tracked_count} tracked positions, {len(live)} with a live node")
