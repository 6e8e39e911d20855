"""Pure-Python twin of the native ``TrackerCore`` (see ``cython/delayindex/_core.pxi``).

Every tracked position has one bit in a per-ledger roaring bitmap (the dedup index, whose total
cardinality is ``len(core)``) and one node in the heap. A due re-add untracks the position and
leaves its node behind as *stale*; stale nodes are dropped when they reach the head, and a stale
position that is tracked again first has its old node purged, so no position ever has two nodes.

Bitmaps emptied by delivery are swept lazily (once as many positions were delivered since the
last sweep as there are bitmaps), exactly as the native core does.

Invariants (``_check``): heap size == tracked count + stale count; count == bitmap cardinality;
every node's position is tracked or stale, never both.
"""

from __future__ import annotations

import sys
from typing import Any

import numpy as np
import numpy.typing as npt
from pyroaring import BitMap

from delayindex._pure._ints import as_i64, check_ids
from delayindex._pure._ticked import TickedCore
from delayindex._pure.heap import TripleHeap, _int64_column
from delayindex.model import MAX_ENTRY_ID, Position

_BITMAP_OVERHEAD = 64


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
        self._count = 0
        self._tick = tick_ms
        self.strict = bool(strict)
        self.fixed_delay_lookahead = fixed_delay_lookahead
        self._fixed_delay = True
        self._highest = 0
        self._delivered_since_sweep = 0
        self._n = dict.fromkeys(
            ("add_calls", "added", "duplicates", "rejected", "untracked_on_due_add",
             "delivered", "stale_skipped", "polls"),
            0,
        )  # fmt: skip

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

    def _add(self, ledger: int, entry: int, deliver_at: int, cutoff: int) -> int:
        n = self._n
        n["add_calls"] += 1
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
            self._heap.remove(ledger, entry)
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
        while self._stale and heap:
            _, ledger, entry = heap.peek()
            bm = self._bitmaps.get(ledger)
            if bm is not None and entry in bm:
                return
            heap.pop()
            self._stale.discard((ledger, entry))
            self._n["stale_skipped"] += 1

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
            _, ledger, entry = heap.pop()
            bm = self._bitmaps.get(ledger)
            if bm is None or entry not in bm:
                self._stale.discard((ledger, entry))
                self._n["stale_skipped"] += 1
                continue
            bm.remove(entry)
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
        """Drop every tracked position and reset fixed-delay detection."""
        self._heap.clear()
        self._bitmaps.clear()
        self._stale.clear()
        self._count = 0
        self._fixed_delay = True
        self._highest = 0
        self._delivered_since_sweep = 0

    def memory_bytes(self) -> int:
        """Resident estimate: heap + bitmaps + index containers."""
        total = self._heap.nbytes + sys.getsizeof(self._bitmaps) + sys.getsizeof(self._stale)
        return total + sum(sys.getsizeof(bm) + _BITMAP_OVERHEAD for bm in self._bitmaps.values())

    def counters(self) -> dict[str, Any]:
        """Operation counters and gauges."""
        return {
            "tracked": self._count,
            "heap_nodes": len(self._heap),
            "stale_nodes": len(self._stale),
            "bitmaps": len(self._bitmaps),
            **self._n,
            "fixed_delay": self._fixed_delay,
            "highest_deliver_at": self._highest,
        }

    def _check(self) -> None:
        """Assert the invariants listed in the module docstring."""
        self._heap._check()
        cardinality = sum(len(bm) for bm in self._bitmaps.values())
        if cardinality != self._count:
            raise AssertionError(f"count {self._count} != bitmap cardinality {cardinality}")
        if len(self._heap) != self._count + len(self._stale):
            raise AssertionError(
                f"heap has {len(self._heap)} nodes, expected count {self._count} + stale "
                f"{len(self._stale)}"
            )
        _, ls, es = self._heap.to_arrays()
        seen: set[tuple[int, int]] = set()
        for pos in zip(ls.tolist(), es.tolist(), strict=True):
            if pos in seen:
                raise AssertionError(f"position {pos} has two heap nodes")
            seen.add(pos)
            bm = self._bitmaps.get(pos[0])
            tracked = bm is not None and pos[1] in bm
            if tracked == (pos in self._stale):
                raise AssertionError(f"position {pos}: tracked={tracked}, stale={not tracked}")
