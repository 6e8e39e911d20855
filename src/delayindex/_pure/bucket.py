"""Pure-Python twin of the native ``BucketCore`` (see ``cython/delayindex/_bucket.pxi``).

``BucketCore`` is the sans-IO state of :class:`~delayindex.DelayIndex`: every message it tracks
is in exactly one *source*, and delivery is a k-way merge over them.

* the **mutable** heap: the last mutable bucket (PIP-195), ledgers ``>=`` its end ledger;
* the **direct** heap: non-monotonic adds (a ledger below the mutable bucket's end or inside a
  sealed range, Pulsar #25371); never persisted, as in Pulsar;
* **segment sources**, one per sealed bucket: at first the sealed bucket's former mutable heap
  (moved at seal time, so sealing is O(1)); once its snapshot is durable, a compact run of
  ``(time, ledger, entry)`` sorted arrays with a cursor, plus an optional *placeholder*: the
  min deliver time of the bucket's next unloaded segment. A small heap (``heads``) holds one key
  per segment source: its head, or ``(placeholder, -1, -1)`` once it is used up. A due
  placeholder at the head stops the merge and names the bucket in ``load_needed``; the driver
  loads the segment and calls :meth:`set_source`. Because the next segment's indexes are ``>=``
  the placeholder, delivery stays globally ordered across buckets. A source used up with no
  placeholder is *exhausted* (:meth:`take_exhausted`).

The single dedup index is a ``LedgerIndex``; ``len(core)`` is its size. A copy of a position
that is no longer tracked is skipped when it reaches the head ("dedup on pop"), so delivery, due
re-adds (Pulsar #26230) and mark-delete only clear bits. ``stale`` holds positions untracked by a
due re-add whose heap node may still exist (re-tracking purges that node first, as it does for a
mark-deleted position), and ``shadow`` holds positions tracked in the direct heap while their
ledger lies in a sealed range: any segment copy of such a position is obsolete and skipped.

Invariants (``_check``): the index's own; mutable, direct and heap sources are valid heaps;
every array cursor is within its arrays; ``heads`` holds exactly one live key per segment
source, equal to its head or placeholder; mutable ledgers lie in the mutable range.
"""

from __future__ import annotations

import heapq
import sys
from typing import Any

import numpy as np
import numpy.typing as npt
from sortedcontainers import SortedDict

from delayindex._lateness import Lateness
from delayindex._pure._bucket_overrides import NEED_OVERRIDES, BucketOverrides
from delayindex._pure._bucket_queries import BucketQueries
from delayindex._pure._bucket_restore import BucketRestore
from delayindex._pure._ints import as_i64, check_ids
from delayindex._pure._ticked import TickedCore
from delayindex._pure.heap import TripleHeap, _int64_column, triple_columns
from delayindex._pure.index import LedgerIndex
from delayindex.model import (
    ADD_ACKED,
    ADD_CANCELLED,
    ADD_DELIVER,
    ADD_DUPLICATE,
    ADD_NEED_OVERRIDES,
    ADD_SEAL_FIRST,
    ADD_TRACKED,
    MAX_ENTRY_ID,
    Position,
)
from delayindex.policy import bucket_is_full

Int64Array = npt.NDArray[np.int64]
#: add_many converts this many elements to Python ints at a time.
_ADD_CHUNK = 1 << 14
#: ``add`` result codes (``ACKED``: at or below the mark-delete, dropped; do not deliver).
DELIVER, TRACKED, DUPLICATE, SEAL_FIRST, ACKED = (
    ADD_DELIVER, ADD_TRACKED, ADD_DUPLICATE, ADD_SEAL_FIRST, ADD_ACKED,
)  # fmt: skip


def _column(values: object) -> Int64Array:
    return np.ascontiguousarray(np.asarray(values), dtype=np.int64)


class _Source:
    """Sorted arrays with a cursor, or (a freshly sealed bucket) the mutable heap itself."""

    __slots__ = ("entries", "heap", "ledgers", "next_time", "pos", "times")

    def __init__(
        self,
        times: Int64Array,
        ledgers: Int64Array,
        entries: Int64Array,
        next_time: int,
        heap: TripleHeap | None = None,
    ) -> None:
        self.times = times.tolist()
        self.ledgers = ledgers.tolist()
        self.entries = entries.tolist()
        self.pos = 0
        self.next_time = next_time
        self.heap = heap

    def remaining(self) -> int:
        return len(self.heap) if self.heap is not None else len(self.times) - self.pos

    def key(self) -> tuple[int, int, int] | None:
        if self.heap is not None:
            if self.heap:
                return self.heap.peek()
            return (self.next_time, -1, -1) if self.next_time >= 0 else None
        if self.pos < len(self.times):
            p = self.pos
            return (self.times[p], self.ledgers[p], self.entries[p])
        if self.next_time >= 0:
            return (self.next_time, -1, -1)
        return None


class BucketCore(BucketOverrides, BucketQueries, BucketRestore, TickedCore):
    """Dedup index + mutable/direct heaps + segment-source merge (time passed in).

    ``add`` returns 0 (deliver now), 1 (tracked), 2 (already tracked), 3 (the mutable bucket
    must be sealed first: call :meth:`seal`, register the bucket, then add again; nothing was
    changed) or 4 (acknowledged: the position is at or below the mark, the highest
    :meth:`untrack_upto` position since the last :meth:`clear`; it is not tracked and must not
    be delivered, whatever its ``deliver_at``: not delayed and due ones included, since an
    acknowledged position is never delivered; counted as ``acked_on_add``).
    """

    def __init__(
        self,
        tick_ms: int,
        strict: bool,
        fixed_delay_lookahead: int,
        min_index_count_per_bucket: int,
    ) -> None:
        tick_ms = as_i64(tick_ms)
        if tick_ms < 0:
            raise ValueError(f"tick_ms must be >= 0, got {tick_ms}")
        if as_i64(fixed_delay_lookahead) < 0:
            raise ValueError("fixed_delay_lookahead must be >= 0")
        if as_i64(min_index_count_per_bucket) < 1:
            raise ValueError("min_index_count_per_bucket must be >= 1")
        self._tick = tick_ms
        self.strict = bool(strict)
        self.fixed_delay_lookahead = int(fixed_delay_lookahead)
        self.min_index_count = int(min_index_count_per_bucket)
        self._index = LedgerIndex()  # the single dedup index; len(core) == len(index)
        self._mutable = TripleHeap()
        self._mutable_start = -1
        self._mutable_end = -1
        self._direct = TripleHeap()
        self._stale: set[tuple[int, int]] = set()
        self._init_overrides()
        self._shadow: set[tuple[int, int]] = set()
        self._sources: dict[int, _Source] = {}
        self._heads: list[tuple[int, int, int, int]] = []
        self._ranges: SortedDict = SortedDict()  # start -> end of sealed buckets
        self._max_sealed_end = -1
        self._exhausted: list[int] = []
        self._mark = (-1, -1)  # highest untrack_upto position
        self._mutable_dirty = False  # something was untracked since the last seal
        self.load_needed = -1
        self._fixed_delay = True
        self._highest = 0
        self._n = dict.fromkeys(
            ("add_calls", "added", "duplicates", "rejected", "untracked_on_due_add",
             "delivered", "skipped_on_pop", "polls", "direct_adds", "acked_on_add",
             "cancelled", "rescheduled", "refused_cancelled"),
            0,
        )  # fmt: skip
        self._lateness = Lateness()  # poll's delivery lateness

    # -- time -------------------------------------------------------------------------------

    # -- sealed ranges ----------------------------------------------------------------------

    def add_range(self, start: int, end: int) -> None:
        """Register a sealed bucket's ledger range (must not overlap a registered one)."""
        if not 0 <= start <= end:
            raise ValueError(f"bad range [{start}, {end}]")
        at = self._ranges.bisect_right(end)
        if at and self._ranges.peekitem(at - 1)[1] >= start:
            raise ValueError(f"range [{start}, {end}] overlaps a sealed range")
        self._ranges[start] = end
        self._max_sealed_end = max(self._max_sealed_end, end)

    def remove_range(self, start: int) -> None:
        """Forget the sealed range starting at ``start``."""
        del self._ranges[start]
        self._max_sealed_end = self._ranges.peekitem(-1)[1] if self._ranges else -1

    def in_sealed_range(self, ledger: int) -> bool:
        """Whether ``ledger`` lies inside a registered sealed range."""
        if ledger > self._max_sealed_end:
            return False
        at = self._ranges.bisect_right(ledger)
        return bool(at) and self._ranges.peekitem(at - 1)[1] >= ledger

    def _crosses_sealed(self, ledger: int) -> bool:
        """Whether a sealed range lies between the mutable bucket's end and ``ledger``."""
        if self._max_sealed_end <= self._mutable_end:
            return False
        at = self._ranges.bisect_right(self._mutable_end)
        return at < len(self._ranges) and int(self._ranges.peekitem(at)[0]) < ledger

    @property
    def mutable_range(self) -> tuple[int, int]:
        """``(start, end)`` ledgers of the last mutable bucket; ``(-1, -1)`` when reset."""
        return (self._mutable_start, self._mutable_end)

    @property
    def mutable_size(self) -> int:
        """Nodes in the mutable heap (stale ones included)."""
        return len(self._mutable)

    @property
    def direct_size(self) -> int:
        """Nodes in the direct heap (stale ones included)."""
        return len(self._direct)

    # -- index ------------------------------------------------------------------------------

    def _untrack(self, ledger: int, entry: int) -> bool:
        if not self._index.discard(ledger, entry):
            return False
        self._mutable_dirty = True
        return True

    def untrack_upto(self, ledger: int, entry: int) -> int:
        """Untrack every position ``<= (ledger, entry)`` (mark-delete); return how many."""
        self._mark = max(self._mark, (ledger, entry))
        removed = self._index.remove_upto(ledger, entry)
        self._mutable_dirty = True
        if self._shadow:
            self._shadow = {p for p in self._shadow if p > (ledger, entry)}
        self._forget_overrides_upto(ledger, entry)
        return removed

    def untrack_ledgers(self, start: int, end: int) -> int:
        """Untrack every position of ledgers ``start..end`` (a trimmed bucket); return how many."""
        self._mutable_dirty = True
        return self._index.remove_ledgers(start, end)

    # -- add --------------------------------------------------------------------------------

    def _add(self, ledger: int, entry: int, deliver_at: int, cutoff: int) -> int:
        # Every caller has converted and checked the ids and the time (int64, ids in range),
        # so the heaps and the index are fed through their unchecking entry points.
        n = self._n
        mark = self._mark
        if ledger <= mark[0] and (ledger, entry) <= mark:
            # Acknowledged: never delivered nor tracked, due or not (checked before expiry).
            n["add_calls"] += 1
            n["acked_on_add"] += 1
            return ACKED
        moved_to = self._override_on_add(ledger, entry, deliver_at)
        if moved_to is None:
            n["add_calls"] += 1
            n["refused_cancelled"] += 1
            return ADD_CANCELLED
        if moved_to is NEED_OVERRIDES:
            return ADD_NEED_OVERRIDES  # nothing done: the driver restores them, then again
        deliver_at = moved_to  # type: ignore[assignment]
        if deliver_at < 0 or deliver_at <= cutoff:
            n["add_calls"] += 1
            self._fixed_delay = False
            n["rejected"] += 1
            if len(self._index) and self._untrack(ledger, entry):
                n["untracked_on_due_add"] += 1
                self._stale.add((ledger, entry))
                self._shadow.discard((ledger, entry))
            return DELIVER
        if self._index._has(ledger, entry):  # every caller checked the ids
            n["add_calls"] += 1
            n["duplicates"] += 1
            self._note_deliver_at(deliver_at)
            return DUPLICATE
        sealed = self.in_sealed_range(ledger)
        to_mutable = not sealed and ledger >= self._mutable_end
        if to_mutable and ledger > self._mutable_end:
            if bucket_is_full(len(self._mutable), self.min_index_count):
                return SEAL_FIRST
            if self._mutable_start >= 0 and self._crosses_sealed(ledger):
                # A bucket never spans a sealed range (after a reopen, sealed buckets can lie
                # above the mutable one): seal what there is first, or restart the range.
                if self._mutable:
                    return SEAL_FIRST
                self._mutable_start = self._mutable_end = -1
        n["add_calls"] += 1
        if self._stale and (ledger, entry) in self._stale:
            # An old node may remain (a due re-add): purge it first. (A position at or below
            # the mark never gets here, so a mark-deleted node is never re-tracked.)
            self._mutable.remove(ledger, entry)
            self._direct.remove(ledger, entry)
            self._stale.discard((ledger, entry))
        if to_mutable:
            self._mutable._push_int64(deliver_at, ledger, entry)
            if self._mutable_start < 0:
                self._mutable_start = ledger
            self._mutable_end = ledger
        else:
            self._direct._push_int64(deliver_at, ledger, entry)
            n["direct_adds"] += 1
            if sealed:
                self._shadow.add((ledger, entry))
        self._index._insert(ledger, entry)
        n["added"] += 1
        self._note_deliver_at(deliver_at)
        return TRACKED

    def add(self, ledger: int, entry: int, deliver_at: int, now: int) -> int:
        """Track ``(ledger, entry)`` until ``deliver_at``; see the class doc for the result."""
        ledger, entry, deliver_at = as_i64(ledger), as_i64(entry), as_i64(deliver_at)
        cutoff = self.cutoff_for(now)
        check_ids(ledger, entry)
        return self._add(ledger, entry, deliver_at, cutoff)

    def add_many(
        self,
        ledgers: object,
        entries: object,
        deliver_ats: object,
        now: int,
        out: npt.NDArray[np.bool_],
        start: int,
    ) -> int:
        """``add`` elements ``start..`` in order, writing ``out[i]`` (True = do not deliver:
        tracked, already tracked, or at or below the mark).

        Returns the index of the first element that needs a seal first or its evicted cancels
        back (``ADD_NEED_OVERRIDES``; nothing done for it),
        or the length when all were added. With ``start == 0`` everything is validated before
        anything changes.
        """
        ls, es, ts = (_int64_column(a) for a in (ledgers, entries, deliver_ats))
        if not len(ls) == len(es) == len(ts) == len(out):
            raise ValueError(
                f"add_many needs sequences of equal length, got {len(ls)}, {len(es)}, {len(ts)}"
            )
        cutoff = self.cutoff_for(now)
        if start == 0:
            bad = np.flatnonzero((ls < 0) | (es < 0) | (es > MAX_ENTRY_ID))
            if len(bad):
                i = int(bad[0])
                raise ValueError(
                    f"element {i}: bad position ({ls[i]}, {es[i]}); need "
                    f"ledger_id >= 0 and 0 <= entry_id < 2**32"
                )
        # Converted to Python ints a chunk at a time: a seal returns mid-batch and the front
        # calls again from there, so converting everything each time would be quadratic.
        for low in range(start, len(ls), _ADD_CHUNK):
            high = min(low + _ADD_CHUNK, len(ls))
            lsl, esl, tsl = ls[low:high].tolist(), es[low:high].tolist(), ts[low:high].tolist()
            for j in range(high - low):
                code = self._add(lsl[j], esl[j], tsl[j], cutoff)
                if code in (SEAL_FIRST, ADD_NEED_OVERRIDES):
                    return low + j
                out[low + j] = code != DELIVER
        return len(ls)

    # -- seal -------------------------------------------------------------------------------

    def seal(self, sid: int) -> tuple[Int64Array, Int64Array, Int64Array, int, int]:
        """Seal the mutable bucket into heap source ``sid`` (the heap itself moves; O(1)).

        Untracked nodes are dropped first only if something was untracked while it filled.
        Returns an unsorted copy ``(times, ledgers, entries, start_ledger, end_ledger)`` of the
        sealed indexes, for the snapshot, and resets the mutable range to ``(-1, -1)``.
        """
        if sid < 0 or sid in self._sources:
            raise ValueError(f"source id {sid} is negative or taken")
        heap = self._mutable
        if self._mutable_dirty:
            t, lg, en = heap.to_arrays()
            keep = self.tracked_mask(lg, en)
            if not keep.all():
                heap = TripleHeap()
                heap.push_many(t[keep], lg[keep], en[keep])
        t, lg, en = heap.to_arrays()
        start, end = self._mutable_start, self._mutable_end
        self._mutable = TripleHeap()
        self._mutable_start = self._mutable_end = -1
        self._mutable_dirty = False
        empty = np.empty(0, dtype=np.int64)
        src = _Source(empty, empty, empty, -1, heap)
        self._sources[sid] = src
        key = src.key()
        if key is None:
            self._exhausted.append(sid)
        else:
            heapq.heappush(self._heads, (*key, sid))
        return t, lg, en, start, end

    def source_head(self, sid: int) -> tuple[int, int, int] | None:
        """The next index ``(time, ledger, entry)`` of source ``sid`` in memory, or None."""
        key = self._sources[sid].key()
        return None if key is None or key[1] < 0 else key

    def cut_source(
        self, sid: int, last_time: int, last_ledger: int, last_entry: int, next_time: int
    ) -> int:
        """Keep only source ``sid``'s indexes ``<= (last_time, last_ledger, last_entry)`` as a
        compact array, with placeholder ``next_time``; return how many."""
        src = self._sources[sid]
        last = (last_time, last_ledger, last_entry)
        kept: list[tuple[int, int, int]] = []
        if src.heap is not None:
            while src.heap and src.heap.peek() <= last:
                kept.append(src.heap.pop())
        else:
            i = src.pos
            while i < len(src.times) and (src.times[i], src.ledgers[i], src.entries[i]) <= last:
                kept.append((src.times[i], src.ledgers[i], src.entries[i]))
                i += 1
        self.set_source(sid, *triple_columns(kept), next_time)
        return len(kept)

    # -- segment sources --------------------------------------------------------------------

    def set_source(
        self,
        sid: int,
        times: object,
        ledgers: object,
        entries: object,
        next_time: int = -1,
    ) -> None:
        """Add or replace segment source ``sid``: sorted arrays, cursor 0, placeholder."""
        t, lg, en = (_column(a) for a in (times, ledgers, entries))
        if not len(t) == len(lg) == len(en):
            raise ValueError("source arrays differ in length")
        if sid < 0:
            raise ValueError("source ids are >= 0")
        if sid in self._sources:
            self.remove_source(sid)
        src = _Source(t, lg, en, as_i64(next_time))
        self._sources[sid] = src
        key = src.key()
        if key is None:
            self._exhausted.append(sid)
        else:
            heapq.heappush(self._heads, (*key, sid))

    def remove_source(self, sid: int) -> None:
        """Drop segment source ``sid`` (its indexes stay tracked; nothing else changes)."""
        self._sources.pop(sid, None)
        if self.load_needed == sid:
            self.load_needed = -1
        self._exhausted = [s for s in self._exhausted if s != sid]
        self._heads = [h for h in self._heads if h[3] != sid]
        heapq.heapify(self._heads)

    def source_remaining(self, sid: int) -> int:
        """Indexes source ``sid`` still holds in memory."""
        return self._sources[sid].remaining()

    def has_source(self, sid: int) -> bool:
        """Whether ``sid`` is a segment source."""
        return sid in self._sources

    def source_ids(self) -> list[int]:
        """Segment source ids, ascending."""
        return sorted(self._sources)

    def take_exhausted(self) -> list[int]:
        """Ids of sources used up with no placeholder since the last call (then forgotten)."""
        out, self._exhausted = self._exhausted, []
        return [sid for sid in out if sid in self._sources]

    # -- delivery ---------------------------------------------------------------------------

    def _peek(self) -> tuple[tuple[int, int, int] | None, int]:
        """The smallest key of any source, and where: 0 none, 1 mutable, 2 direct, 3 heads."""
        heads = self._heads
        while heads and heads[0][3] not in self._sources:
            heapq.heappop(heads)
        key: tuple[int, int, int] | None = None
        best = 0
        if self._mutable:
            key, best = self._mutable.peek(), 1
        if self._direct:
            k = self._direct.peek()
            if key is None or k < key:
                key, best = k, 2
        if heads:
            h = heads[0]
            if key is None or h[:3] < key:
                key, best = h[:3], 3
        return key, best

    def _pop(self, best: int) -> tuple[int, int, bool]:
        """Remove the smallest key (not a placeholder); return it and whether it is live.

        A live key's position is tracked and this copy is the authoritative one.
        """
        if best == 3:
            heads = self._heads
            _, ledger, entry, sid = heads[0]
            src = self._sources[sid]
            src.pos += 1
            if src.heap is not None:
                src.heap.pop()
            nxt = src.key()
            if nxt is None:
                heapq.heappop(heads)
                self._exhausted.append(sid)
            else:
                heapq.heapreplace(heads, (*nxt, sid))
            if self._shadow and (ledger, entry) in self._shadow:
                return ledger, entry, False  # the direct heap holds the authoritative copy
        else:
            _, ledger, entry = (self._mutable if best == 1 else self._direct).pop()
            if best == 2 and self._shadow:
                self._shadow.discard((ledger, entry))
        if not self._index.contains(ledger, entry):
            self._stale.discard((ledger, entry))
            return ledger, entry, False
        return ledger, entry, True

    def _purge(self) -> tuple[int, int, int] | None:
        """Drop dead keys at the head; return the live head key (or a placeholder) or None."""
        while True:
            key, best = self._peek()
            if key is None or key[1] < 0:
                return key
            obsolete = best == 3 and (key[1], key[2]) in self._shadow
            if not obsolete and self._index.contains(key[1], key[2]):
                return key
            self._pop(best)
            self._n["skipped_on_pop"] += 1

    def _take_due(self, max_n: int, now: int) -> list[tuple[int, int, int]]:
        """Pop up to ``max_n`` due live keys in (time, ledger, entry) order; stop at a due
        placeholder (sets :attr:`load_needed`)."""
        max_n = as_i64(max_n)
        cutoff = self.cutoff_for(now)
        self._n["polls"] += 1
        self.load_needed = -1
        out: list[tuple[int, int, int]] = []
        if max_n <= 0:
            return out
        skipped = 0
        while len(out) < max_n:
            key, best = self._peek()
            if key is None or key[0] > cutoff:
                break
            if key[1] < 0:  # a due placeholder: the next segment must be loaded first
                self.load_needed = self._heads[0][3]
                break
            ledger, entry, live = self._pop(best)
            if live:
                self._index.discard(ledger, entry)
                out.append((key[0], ledger, entry))
            else:
                skipped += 1
        self._n["delivered"] += len(out)
        self._n["skipped_on_pop"] += skipped
        if len(self._index) == 0:  # emptied: fixed-delay detection starts over
            self._fixed_delay = True
            self._highest = 0
        return out

    def poll(self, max_n: int, now: int, prior: list[Position] | None = None) -> list[Position]:
        """Remove up to ``max_n`` due positions, chosen in (time, ledger, entry) order.

        Stops early at a due placeholder and sets :attr:`load_needed` to its source. Returns
        the positions sorted by position; with ``prior`` (sorted, from an earlier poll), merged
        with them into one new sorted list.
        """
        keys = self._take_due(max_n, now)
        for time, _, _ in keys:
            self._lateness.note(now - time)
        new = [Position(ledger, entry) for _, ledger, entry in keys]
        return sorted(new if prior is None else [*prior, *new])

    def poll_keys(self, max_n: int, now: int) -> tuple[Int64Array, Int64Array, Int64Array]:
        """As :meth:`poll`, but return ``(times, ledgers, entries)`` int64 arrays in selection
        order (the order the shared index hands to every subscription)."""
        keys = self._take_due(max_n, now)
        table = np.array(keys, dtype=np.int64).reshape(-1, 3)
        return table[:, 0].copy(), table[:, 1].copy(), table[:, 2].copy()

    def _head_key(self) -> tuple[int, int, int] | None:
        return self._purge()

    def has_due(self, now: int) -> bool:
        """Whether the smallest loaded key (or a placeholder) is due at ``now``."""
        key = self._head_key()
        return key is not None and key[0] <= self.cutoff_for(now)

    def next_time(self) -> int | None:
        """The smallest deliver time among loaded indexes and placeholders, or None."""
        key = self._head_key()
        return None if key is None else key[0]

    def contains(self, ledger: int, entry: int) -> bool:
        """Whether ``(ledger, entry)`` is tracked and not yet delivered."""
        ledger, entry = as_i64(ledger), as_i64(entry)
        check_ids(ledger, entry)
        return self._index.contains(ledger, entry)

    def __len__(self) -> int:
        return len(self._index)

    @property
    def loaded(self) -> int:
        """Indexes held in memory by the sources (consumed ones excluded)."""
        return (
            len(self._mutable)
            + len(self._direct)
            + sum(s.remaining() for s in self._sources.values())
        )

    def clear(self) -> None:
        """Drop everything: index, heaps, sources, ranges; reset fixed-delay detection."""
        self._index.clear()
        self._mutable.clear()
        self._direct.clear()
        self._mutable_start = self._mutable_end = -1
        self._mutable_dirty = False
        self._stale.clear()
        self._shadow.clear()
        self._init_overrides()
        self._sources.clear()
        self._heads.clear()
        self._ranges.clear()
        self._max_sealed_end = -1
        self._exhausted.clear()
        self._mark = (-1, -1)
        self.load_needed = -1
        self._fixed_delay = True
        self._highest = 0

    def memory_bytes(self) -> int:
        """Resident estimate: heaps + source arrays (24 B per index) + bitmaps + containers."""
        total = self._mutable.nbytes + self._direct.nbytes
        total += sum(
            24 * len(s.times) if s.heap is None else s.heap.nbytes for s in self._sources.values()
        )
        total += sys.getsizeof(self._stale) + sys.getsizeof(self._shadow) + self._override_bytes()
        return total + sys.getsizeof(self._heads) + self._index.memory_bytes()

    def counters(self) -> dict[str, Any]:
        """Operation counters and gauges."""
        return {
            "tracked": len(self._index),
            "mutable_nodes": len(self._mutable),
            "direct_nodes": len(self._direct),
            "segment_sources": len(self._sources),
            "loaded": self.loaded,
            "stale_nodes": len(self._stale),
            "shadowed": len(self._shadow),
            "ledgers": self._index.num_ledgers,
            **self._n,
            "lateness": list(self._lateness.counts),
            "lateness_ms": self._lateness.total_ms,
            **self._override_counters(),
            "fixed_delay": self._fixed_delay,
            "highest_deliver_at": self._highest,
        }

    def _check(self) -> None:
        """Assert the invariants listed in the module docstring."""
        self._mutable._check()
        self._direct._check()
        self._index._check()
        _, ls, _ = self._mutable.to_arrays()
        if len(ls) and not (self._mutable_start <= ls.min() and ls.max() <= self._mutable_end):
            raise AssertionError("a mutable node lies outside the mutable range")
        live = {h[3] for h in self._heads if h[3] in self._sources}
        for sid, src in self._sources.items():
            if src.heap is not None:
                src.heap._check()
            elif not 0 <= src.pos <= len(src.times):
                raise AssertionError(f"source {sid}: cursor {src.pos} out of range")
            key = src.key()
            if key is not None and (*key, sid) not in self._heads:
                raise AssertionError(f"source {sid}: head {key} missing from heads")
            if key is None and sid in live:
                raise AssertionError(f"source {sid} is used up but still in heads")
        if len([h for h in self._heads if h[3] in self._sources]) != len(live):
            raise AssertionError("a source has two keys in heads")
        self._evicted._check()
