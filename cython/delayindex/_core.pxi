# TrackerCore: the sans-IO state machine behind InMemoryTracker.
#
# How it works. Every tracked position has exactly one bit in a per-ledger roaring bitmap (the
# single dedup index; its total cardinality is ``count``) and one node (time, ledger, entry) in a
# TripleHeap. A due re-add untracks the position at once (Pulsar #26230) but leaves its node in
# the heap: the position goes into ``stale`` and the node is dropped when it reaches the head
# ("dedup on pop"). Re-tracking a stale position first purges its old node (O(n), rare), so a
# position never has more than one node.
#
# Bitmaps emptied by delivery are swept lazily, once as many positions have been delivered since
# the last sweep as there are bitmaps, so the sweep is O(1) amortized per delivery and the hot
# loop never asks a bitmap for its size.
#
# Invariants (checked by _check): len(heap) == count + len(stale); count == sum of bitmap
# cardinalities; every node's position is tracked or stale, never both; when stale is empty every
# heap node is tracked, which is what lets poll skip the membership test.
#
# Time comes in as an argument; the cutoff is now (strict) or now + tick, saturating at int64 max.

cdef int64_t INT64_MAX_ = 0x7FFFFFFFFFFFFFFF
cdef int64_t MAX_ENTRY = 0xFFFFFFFF

ctypedef DiPos Pos

cdef inline int check_ids(int64_t ledger, int64_t entry) except -1:
    if ledger < 0:
        raise ValueError(f"ledger_id must be >= 0, got {ledger}")
    if entry < 0 or entry > MAX_ENTRY:
        raise ValueError(f"entry_id must be in [0, 2**32), got {entry}")
    return 0


@cython.final
cdef class TrackerCore:
    """Heap + dedup index + fixed-delay state of an exact-timestamp tracker (time passed in).

    ``add`` returns 0 (deliver now, not tracked), 1 (newly tracked) or 2 (already tracked).
    """

    cdef TripleHeap heap
    cdef dict bitmaps            # ledger id -> pyroaring.BitMap of tracked entry ids
    cdef set stale               # (ledger, entry) whose heap node is no longer tracked
    cdef object last_bm          # cache: bitmap of the most recently used ledger
    cdef int64_t last_ledger
    cdef Py_ssize_t count
    cdef int64_t _tick
    cdef readonly bint strict
    cdef readonly int64_t fixed_delay_lookahead
    cdef bint fixed_delay
    cdef int64_t highest
    # counters
    cdef int64_t n_add_calls, n_tracked, n_duplicates, n_rejected, n_untracked_due
    cdef int64_t n_delivered, n_stale_skipped, n_polls
    cdef int64_t delivered_since_sweep

    def __cinit__(self, int64_t tick_ms, bint strict, int64_t fixed_delay_lookahead):
        if tick_ms < 0:
            raise ValueError(f"tick_ms must be >= 0, got {tick_ms}")
        if fixed_delay_lookahead < 0:
            raise ValueError(f"fixed_delay_lookahead must be >= 0, got {fixed_delay_lookahead}")
        self.heap = TripleHeap()
        self.bitmaps = {}
        self.stale = set()
        self.last_bm = None
        self.last_ledger = -1
        self.count = 0
        self._tick = tick_ms
        self.strict = strict
        self.fixed_delay_lookahead = fixed_delay_lookahead
        self.fixed_delay = True
        self.highest = 0

    @property
    def tick_ms(self) -> int:
        """The tick used for the non-strict cutoff and fixed-delay detection."""
        return self._tick

    @tick_ms.setter
    def tick_ms(self, int64_t value) -> None:
        if value < 0:
            raise ValueError(f"tick_ms must be >= 0, got {value}")
        self._tick = value

    cdef inline int64_t cutoff(self, int64_t now) noexcept:
        # delayindex.policy.cutoff_ms inline (tests/test_policy.py checks that they agree).
        if self.strict:
            return now
        if now > INT64_MAX_ - self._tick:
            return INT64_MAX_
        return now + self._tick

    def cutoff_for(self, now) -> int:
        """Return the cutoff for ``now``: a message is due when deliver_at <= cutoff."""
        return self.cutoff(as_i64(now))

    # -- dedup index --------------------------------------------------------------------------

    cdef inline object bitmap(self, int64_t ledger, bint create):
        cdef object bm
        if self.last_bm is not None and ledger == self.last_ledger:
            return self.last_bm
        bm = self.bitmaps.get(ledger)
        if bm is None:
            if not create:
                return None
            bm = BitMap()
            self.bitmaps[ledger] = bm
        self.last_ledger = ledger
        self.last_bm = bm
        return bm

    cdef inline void drop_if_empty(self, int64_t ledger, object bm):
        if not bm:
            del self.bitmaps[ledger]
            if ledger == self.last_ledger:
                self.last_bm = None

    cdef void sweep_empty_bitmaps(self):
        empty = [ledger for ledger, bm in self.bitmaps.items() if not bm]
        for ledger in empty:
            del self.bitmaps[ledger]
        self.last_bm = None
        self.delivered_since_sweep = 0

    cdef bint untrack(self, int64_t ledger, int64_t entry) except -1:
        cdef object bm = self.bitmap(ledger, False)
        if bm is None or entry not in bm:
            return False
        bm.remove(entry)
        self.count -= 1
        self.drop_if_empty(ledger, bm)
        self.stale.add((ledger, entry))
        return True

    # -- add ----------------------------------------------------------------------------------

    cdef int cadd(self, int64_t ledger, int64_t entry, int64_t deliver_at,
                  int64_t cutoff) except -1:
        cdef object bm
        self.n_add_calls += 1
        if deliver_at < 0 or deliver_at <= cutoff:
            # Expiry is checked before dedup: a due re-add untracks (Pulsar #26230).
            self.fixed_delay = False
            self.n_rejected += 1
            if self.count and self.untrack(ledger, entry):
                self.n_untracked_due += 1
            return 0
        bm = self.bitmap(ledger, True)
        if entry in bm:
            self.n_duplicates += 1
            self.note_deliver_at(deliver_at)
            return 2
        if self.stale and (ledger, entry) in self.stale:
            self.heap.remove_position(ledger, entry)
            self.stale.discard((ledger, entry))
        self.heap.cpush(deliver_at, ledger, entry)
        bm.add(entry)
        self.count += 1
        self.n_tracked += 1
        self.note_deliver_at(deliver_at)
        return 1

    cdef inline void note_deliver_at(self, int64_t deliver_at) noexcept:
        # Out of order by more than a tick means delays are not fixed (Pulsar #16609).
        if deliver_at < self.highest - self._tick:
            self.fixed_delay = False
        if deliver_at > self.highest:
            self.highest = deliver_at

    def add(self, ledger, entry, deliver_at, now) -> int:
        """Track ``(ledger, entry)`` until ``deliver_at``; see the class doc for the result.

        Non-int arguments raise ``TypeError``, values beyond int64 ``OverflowError``, and
        out-of-range ids ``ValueError``; none of them changes any state.
        """
        cdef int64_t c_ledger = as_i64(ledger)
        cdef int64_t c_entry = as_i64(entry)
        cdef int64_t c_deliver_at = as_i64(deliver_at)
        cdef int64_t c_now = as_i64(now)
        check_ids(c_ledger, c_entry)
        return self.cadd(c_ledger, c_entry, c_deliver_at, self.cutoff(c_now))

    def add_many(self, const int64_t[:] ledgers not None, const int64_t[:] entries not None,
                 const int64_t[:] deliver_ats not None, now):
        """``add`` for each element in order; validates everything before changing anything.

        Returns a numpy bool array: True where the position is now tracked.
        """
        cdef Py_ssize_t k = ledgers.shape[0]
        cdef Py_ssize_t i
        cdef int64_t cutoff = self.cutoff(as_i64(now))
        cdef uint8_t[::1] view
        if entries.shape[0] != k or deliver_ats.shape[0] != k:
            raise ValueError(
                f"add_many needs sequences of equal length, got {k}, {entries.shape[0]}, "
                f"{deliver_ats.shape[0]}")
        for i in range(k):
            if ledgers[i] < 0 or entries[i] < 0 or entries[i] > MAX_ENTRY:
                raise ValueError(
                    f"element {i}: bad position ({ledgers[i]}, {entries[i]}); need "
                    f"ledger_id >= 0 and 0 <= entry_id < 2**32")
        out = np.zeros(k, dtype=np.bool_)
        view = out.view(np.uint8)
        self.heap.reserve(self.heap.n + k)
        for i in range(k):
            view[i] = self.cadd(ledgers[i], entries[i], deliver_ats[i], cutoff) != 0
        return out

    # -- delivery -----------------------------------------------------------------------------

    cdef void purge_stale_heads(self):
        cdef Triple top
        while self.stale and self.heap.n > 0:
            top = self.heap.data[0]
            bm = self.bitmap(top.ledger, False)
            if bm is not None and top.entry in bm:
                return
            self.heap.cpop()
            self.stale.discard((top.ledger, top.entry))
            self.n_stale_skipped += 1
        self.heap._maybe_shrink()

    def poll(self, max_n, now) -> list:
        """Remove up to ``max_n`` due positions, chosen in (time, ledger, entry) order.

        Returns them as a list of ``Position`` sorted by position.
        """
        cdef int64_t c_max = as_i64(max_n)
        cdef int64_t cutoff = self.cutoff(as_i64(now))
        cdef Pos* buf = NULL
        cdef Pos* grown
        cdef Py_ssize_t k = 0, room = 0, i
        cdef Triple top
        cdef object bm
        cdef bint check
        cdef list out
        cdef int64_t prev
        cdef object ledger_obj
        self.n_polls += 1
        if c_max <= 0:
            return []
        try:
            while k < c_max and self.heap.n > 0 and self.heap.data[0].time <= cutoff:
                if k == room:
                    room = 256 if room == 0 else room * 2
                    if room > c_max:
                        room = c_max
                    grown = <Pos*> realloc(buf, <size_t> room * sizeof(Pos))
                    if grown == NULL:
                        raise MemoryError()
                    buf = grown
                top = self.heap.cpop()
                bm = self.bitmap(top.ledger, False)
                if self.stale:
                    if bm is None or top.entry not in bm:
                        self.stale.discard((top.ledger, top.entry))
                        self.n_stale_skipped += 1
                        continue
                bm.discard(top.entry)
                buf[k].ledger = top.ledger
                buf[k].entry = top.entry
                k += 1
            self.count -= k
            self.n_delivered += k
            self.delivered_since_sweep += k
            self.heap._maybe_shrink()
            di_sort_pos(buf, k)
            out = [None] * k
            prev = -1
            ledger_obj = None
            for i in range(k):
                if buf[i].ledger != prev:
                    prev = buf[i].ledger
                    ledger_obj = prev
                out[i] = di_make_pair(Position, ledger_obj, buf[i].entry)
        finally:
            free(buf)
        if self.delivered_since_sweep > len(self.bitmaps):
            self.sweep_empty_bitmaps()
        if self.count == 0:
            self.reset_when_empty()
        return out

    cdef void reset_when_empty(self):
        self.fixed_delay = True
        self.highest = 0
        self.bitmaps.clear()
        self.last_bm = None
        self.delivered_since_sweep = 0
        if self.heap.n:
            # Only stale nodes are left.
            self.n_stale_skipped += self.heap.n
            self.heap.cclear()
        self.stale.clear()

    def has_due(self, now) -> bool:
        """Whether some tracked position is due at ``now``."""
        cdef int64_t cutoff = self.cutoff(as_i64(now))
        self.purge_stale_heads()
        return self.heap.n > 0 and self.heap.data[0].time <= cutoff

    def next_time(self):
        """The smallest tracked deliver_at, or None when nothing is tracked."""
        self.purge_stale_heads()
        if self.heap.n == 0:
            return None
        return self.heap.data[0].time

    def should_pause(self, now) -> bool:
        """Pulsar's fixed-delay detection: pause reads while delays look fixed and none is due."""
        return (self.fixed_delay_lookahead > 0 and self.fixed_delay
                and self.count >= self.fixed_delay_lookahead and not self.has_due(now))

    def contains(self, ledger, entry) -> bool:
        """Whether ``(ledger, entry)`` is tracked and not yet delivered."""
        cdef int64_t c_ledger = as_i64(ledger)
        cdef int64_t c_entry = as_i64(entry)
        check_ids(c_ledger, c_entry)
        bm = self.bitmap(c_ledger, False)
        return bm is not None and c_entry in bm

    def __len__(self) -> int:
        return self.count

    def compact(self) -> None:
        """Release bitmaps emptied by deliveries now rather than lazily."""
        self.sweep_empty_bitmaps()

    def clear(self) -> None:
        """Drop every tracked position and reset fixed-delay detection."""
        self.heap.cclear()
        self.bitmaps.clear()
        self.stale.clear()
        self.last_bm = None
        self.count = 0
        self.fixed_delay = True
        self.highest = 0
        self.delivered_since_sweep = 0

    def memory_bytes(self) -> int:
        """Resident estimate: heap array + bitmaps + index containers."""
        cdef Py_ssize_t total = self.heap.cap * sizeof(Triple)
        total += sys.getsizeof(self.bitmaps) + sys.getsizeof(self.stale)
        for bm in self.bitmaps.values():
            total += sys.getsizeof(bm) + BITMAP_OVERHEAD
        return total

    def counters(self) -> dict:
        """Operation counters and gauges."""
        return {
            "tracked": self.count,
            "heap_nodes": self.heap.n,
            "stale_nodes": len(self.stale),
            "bitmaps": len(self.bitmaps),
            "add_calls": self.n_add_calls,
            "added": self.n_tracked,
            "duplicates": self.n_duplicates,
            "rejected": self.n_rejected,
            "untracked_on_due_add": self.n_untracked_due,
            "delivered": self.n_delivered,
            "stale_skipped": self.n_stale_skipped,
            "polls": self.n_polls,
            "fixed_delay": bool(self.fixed_delay),
            "highest_deliver_at": self.highest,
        }

    def _check(self) -> None:
        """Assert the invariants listed at the top of this file."""
        self.heap._check()
        cardinality = 0
        for bm in self.bitmaps.values():
            cardinality += len(bm)
        if cardinality != self.count:
            raise AssertionError(f"count {self.count} != bitmap cardinality {cardinality}")
        if self.heap.n != self.count + len(self.stale):
            raise AssertionError(
                f"heap has {self.heap.n} nodes, expected count {self.count} + stale "
                f"{len(self.stale)}")
        seen = set()
        for i in range(self.heap.n):
            pos = (self.heap.data[i].ledger, self.heap.data[i].entry)
            if pos in seen:
                raise AssertionError(f"position {pos} has two heap nodes")
            seen.add(pos)
            bm = self.bitmaps.get(pos[0])
            tracked = bm is not None and pos[1] in bm
            if tracked == (pos in self.stale):
                raise AssertionError(f"position {pos}: tracked={tracked}, stale={not tracked}")
