# TrackerCore: the sans-IO state machine behind InMemoryTracker.
#
# How it works. Every tracked position has exactly one bit in a LedgerIndex (the single dedup
# index, dense bitsets per ledger as in BucketCore; len(core) == len(index)) and one node (time,
# ledger, entry) in a TripleHeap. A due re-add untracks the position at once (Pulsar #26230)
# but leaves its node in the heap: the position goes into ``stale`` and the node is dropped when
# it reaches the head ("dedup on pop"). Re-tracking a stale position first purges its old node
# (O(n), rare).
#
# Cancel and reschedule. ``cancel`` untracks and leaves the node behind as a *dead* one (counted
# in ``dead``; no per-position record), and puts the position in ``cancelled``, a compact bitmap
# of overrides: a later add of it is refused (``ADD_CANCELLED``), so it is never tracked again
# except by ``reschedule``. ``reschedule`` untracks the same way, records ``moved[pos] = time``
# and tracks the position at the new time; a later add keeps the override's time. A node is its
# position's *live* copy when the position is tracked and the node's time is the override's (if
# any); poll skips the others. A reschedule to a node's own time can leave two identical live
# nodes: poll delivers the first and skips the second, the browse methods count one.
#
# Ledgers emptied by delivery keep their index slot until the index asks for a compaction
# (O(1) amortized per delivery), so the hot loop never rehashes.
#
# Invariants (checked by _check): the index's own; len(heap) == len(index) + len(stale) + dead;
# len(index) == positions with a live node; no position is both tracked and stale, or
# tracked and cancelled; when stale and dead are empty every heap node is live, which is what
# lets poll skip the membership test.
#
# Time comes in as an argument; the cutoff is now (strict) or now + tick, saturating at int64 max.

cdef int64_t INT64_MAX_ = 0x7FFFFFFFFFFFFFFF

ctypedef DiPos Pos

#: ``add`` result for a position whose cancel override refuses it (delayindex.model).
cdef int ADD_CANCELLED_ = 5
#: memory_bytes' estimate per reschedule override (dict slot, tuple key, two ints).
cdef Py_ssize_t MOVED_ENTRY_BYTES = 200


@cython.final
cdef class TrackerCore:
    """Heap + dedup index + fixed-delay state of an exact-timestamp tracker (time passed in).

    ``add`` returns 0 (deliver now, not tracked), 1 (newly tracked) or 2 (already tracked).
    """

    cdef TripleHeap heap
    cdef LedgerIndex index       # tracked positions
    cdef set stale               # (ledger, entry) whose heap node is no longer tracked
    cdef Py_ssize_t dead         # nodes of cancelled positions (neither tracked nor stale)
    cdef LedgerIndex cancelled   # cancel overrides (a re-add is refused)
    cdef dict moved              # (ledger, entry) -> deliver_at: reschedule overrides
    cdef int64_t _tick
    cdef readonly bint strict
    cdef readonly int64_t fixed_delay_lookahead
    cdef bint fixed_delay
    cdef int64_t highest
    # counters
    cdef int64_t n_add_calls, n_tracked, n_duplicates, n_rejected, n_untracked_due
    cdef int64_t n_delivered, n_stale_skipped, n_polls
    cdef int64_t n_cancelled, n_rescheduled, n_refused_cancelled
    cdef int64_t lateness[LATENESS_BUCKETS]  # poll's delivery lateness counters
    cdef int64_t lateness_ms

    def __cinit__(self, int64_t tick_ms, bint strict, int64_t fixed_delay_lookahead):
        if tick_ms < 0:
            raise ValueError(f"tick_ms must be >= 0, got {tick_ms}")
        if fixed_delay_lookahead < 0:
            raise ValueError(f"fixed_delay_lookahead must be >= 0, got {fixed_delay_lookahead}")
        self.heap = TripleHeap()
        self.index = LedgerIndex()
        self.stale = set()
        self.dead = 0
        self.cancelled = LedgerIndex()
        self.moved = {}
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

    cdef bint untrack(self, int64_t ledger, int64_t entry) except -1:
        if not self.index.cdiscard(ledger, entry):
            return False
        self.stale.add((ledger, entry))
        return True

    cdef bint untrack_dead(self, int64_t ledger, int64_t entry) except -1:
        """Untrack for a cancel: the node stays behind as a dead one (no stale record: the
        cancel override keeps the position from being tracked again, except by reschedule,
        which purges the node)."""
        if not self.index.cdiscard(ledger, entry):
            return False
        self.dead += 1
        return True

    cdef inline void skipped(self, int64_t ledger, int64_t entry):
        """Account for a node that is not its position's live copy, taken off the heap: the
        stale node of an untracked position, else a dead one."""
        key = (ledger, entry)
        if key in self.stale:
            self.stale.discard(key)
        else:
            self.dead -= 1
        self.n_stale_skipped += 1

    # -- add ----------------------------------------------------------------------------------

    cdef int cadd(self, int64_t ledger, int64_t entry, int64_t deliver_at,
                  int64_t cutoff) except -1:
        cdef object moved_to
        self.n_add_calls += 1
        if self.cancelled.count and self.cancelled.ccontains(ledger, entry):
            self.n_refused_cancelled += 1
            return ADD_CANCELLED_
        if self.moved:
            moved_to = self.moved.get((ledger, entry))
            if moved_to is not None:
                deliver_at = moved_to
        if deliver_at < 0 or deliver_at <= cutoff:
            # Expiry is checked before dedup: a due re-add untracks (Pulsar #26230).
            self.fixed_delay = False
            self.n_rejected += 1
            if self.index.count and self.untrack(ledger, entry):
                self.n_untracked_due += 1
            return 0
        if self.index.ccontains(ledger, entry):
            self.n_duplicates += 1
            self.note_deliver_at(deliver_at)
            return 2
        if self.stale and (ledger, entry) in self.stale:
            # Purge its stale node (and any dead ones a reschedule left behind).
            self.dead -= self.heap.remove_position(ledger, entry) - 1
            self.stale.discard((ledger, entry))
        self.heap.cpush(deliver_at, ledger, entry)
        self.index.cadd(ledger, entry)
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
        while (self.stale or self.dead) and self.heap.n > 0:
            top = self.heap.data[0]
            if self.live(top.time, top.ledger, top.entry):
                return
            self.heap.cpop()
            self.skipped(top.ledger, top.entry)
        self.heap._maybe_shrink()

    def poll(self, max_n, now) -> list:
        """Remove up to ``max_n`` due positions, chosen in (time, ledger, entry) order.

        Returns them as a list of ``Position`` sorted by position.
        """
        cdef int64_t c_max = as_i64(max_n)
        cdef int64_t c_now = as_i64(now)
        cdef int64_t cutoff = self.cutoff(c_now)
        cdef Pos* buf = NULL
        cdef Pos* grown
        cdef Py_ssize_t k = 0, room = 0, i
        cdef Triple top
        cdef object bm
        cdef bint check
        cdef list out
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
                if (self.stale or self.dead) and not self.live(top.time, top.ledger, top.entry):
                    self.skipped(top.ledger, top.entry)
                    continue
                self.index.cdiscard(top.ledger, top.entry)
                record_lateness(self.lateness, &self.lateness_ms, c_now - top.time)
                buf[k].ledger = top.ledger
                buf[k].entry = top.entry
                k += 1
            self.n_delivered += k
            self.heap._maybe_shrink()
            di_sort_pos(buf, k)
            out = di_positions(Position, buf, k)
        finally:
            free(buf)
        if self.index.wants_compaction():
            self.index.compact()
        if self.index.count == 0:
            self.reset_when_empty()
        return out

    cdef void reset_when_empty(self):
        self.fixed_delay = True
        self.highest = 0
        self.index.clear()
        if self.heap.n:
            # Only stale and dead nodes are left.
            self.n_stale_skipped += self.heap.n
            self.heap.cclear()
        self.stale.clear()
        self.dead = 0

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

    # -- cancel, reschedule, browse --------------------------------------------------------------

    cdef bint ccancel(self, int64_t ledger, int64_t entry) except -1:
        if not self.untrack_dead(ledger, entry):
            return False
        self.cancelled.cadd(ledger, entry)
        if self.moved:
            self.moved.pop((ledger, entry), None)
        self.n_cancelled += 1
        return True

    def cancel(self, ledger, entry) -> bool:
        """Untrack a tracked position for good: True if it was tracked. A later add of it is
        refused (``ADD_CANCELLED``) until :meth:`clear`."""
        cdef int64_t c_ledger = as_i64(ledger)
        cdef int64_t c_entry = as_i64(entry)
        check_ids(c_ledger, c_entry)
        return self.ccancel(c_ledger, c_entry)

    def cancel_many(self, const int64_t[:] ledgers not None, const int64_t[:] entries not None):
        """:meth:`cancel` for each element, validated as a whole first; a bool array."""
        cdef Py_ssize_t k = ledgers.shape[0], i
        cdef uint8_t[::1] view
        if entries.shape[0] != k:
            raise ValueError(
                f"cancel_many needs sequences of equal length, got {k}, {entries.shape[0]}")
        for i in range(k):
            if ledgers[i] < 0 or entries[i] < 0 or entries[i] > MAX_ENTRY:
                raise ValueError(
                    f"element {i}: bad position ({ledgers[i]}, {entries[i]}); need "
                    f"ledger_id >= 0 and 0 <= entry_id < 2**32")
        out = np.zeros(k, dtype=np.bool_)
        view = out.view(np.uint8)
        for i in range(k):
            view[i] = self.ccancel(ledgers[i], entries[i])
        return out

    def reschedule(self, ledger, entry, deliver_at, now) -> int:
        """Move a position, tracked or not, to ``deliver_at`` (an override later adds keep);
        returns :meth:`add`'s code for the new time (0: due now, untracked)."""
        cdef int64_t c_ledger = as_i64(ledger)
        cdef int64_t c_entry = as_i64(entry)
        cdef int64_t c_deliver_at = as_i64(deliver_at)
        cdef int64_t c_now = as_i64(now)
        check_ids(c_ledger, c_entry)
        # The old node (if any) stays behind, dead: its time is not the override's (or, at the
        # same time, it is a twin that poll skips once the position is delivered).
        if not (self.cancelled.count and self.cancelled.cdiscard(c_ledger, c_entry)):
            self.untrack_dead(c_ledger, c_entry)
        self.moved[(c_ledger, c_entry)] = c_deliver_at
        self.n_rescheduled += 1
        return self.cadd(c_ledger, c_entry, c_deliver_at, self.cutoff(c_now))

    cdef inline bint live(self, int64_t time, int64_t ledger, int64_t entry):
        """Whether a node is its position's live copy (tracked, and at the override's time)."""
        cdef object moved_to
        if not self.stale and not self.dead:
            return True
        if not self.index.ccontains(ledger, entry):
            return False
        if self.moved:
            moved_to = self.moved.get((ledger, entry))
            return moved_to is None or moved_to == time
        return True

    def live_keys(self, int64_t first, int64_t last) -> tuple:
        """``(times, ledgers, entries)`` of the tracked positions with ``first <= deliver_at <=
        last``, in no particular order (nothing is removed)."""
        cdef Py_ssize_t i, k = 0
        cdef Triple node
        cdef Triple* data = self.heap.data
        for i in range(self.heap.n):
            if first <= data[i].time <= last:
                k += 1
        times = np.empty(k, dtype=np.int64)
        ledgers = np.empty(k, dtype=np.int64)
        entries = np.empty(k, dtype=np.int64)
        cdef int64_t[::1] ts = times, ls = ledgers, es = entries
        k = 0
        for i in range(self.heap.n):
            node = data[i]
            if first <= node.time <= last and self.live(node.time, node.ledger, node.entry):
                ts[k] = node.time
                ls[k] = node.ledger
                es[k] = node.entry
                k += 1
        if self.dead and k:
            # Twin nodes at the same time (a reschedule to a node's own time): keep one.
            _, ones = np.unique(np.stack([ledgers[:k], entries[:k]]), axis=1, return_index=True)
            ones.sort()
            return times[ones], ledgers[ones], entries[ones]
        return times[:k], ledgers[:k], entries[:k]

    def due_histogram(self, const int64_t[:] edges not None):
        """Tracked positions per ``[edges[i], edges[i+1])`` (``edges`` strictly increasing,
        checked by the caller); an int64 array of ``len(edges) - 1`` counts."""
        cdef Py_ssize_t nb = edges.shape[0] - 1, i, b
        cdef Triple* data = self.heap.data
        if nb <= 0:
            return np.zeros(0, dtype=np.int64)
        if self.dead:  # twin nodes may exist: count distinct live positions
            return BinIndex(edges).counts(self.live_keys(edges[0], edges[nb] - 1)[0])
        cdef BinIndex bins = BinIndex(edges)
        counts = np.zeros(nb, dtype=np.int64)
        cdef int64_t[::1] c = counts
        cdef bint all_live = not self.stale
        for i in range(self.heap.n):
            b = bins.find(data[i].time)
            if b >= 0 and (all_live or self.live(data[i].time, data[i].ledger, data[i].entry)):
                c[b] += 1
        return counts

    def should_pause(self, now) -> bool:
        """Pulsar's fixed-delay detection: pause reads while delays look fixed and none is due."""
        return (self.fixed_delay_lookahead > 0 and self.fixed_delay
                and self.index.count >= self.fixed_delay_lookahead and not self.has_due(now))

    def contains(self, ledger, entry) -> bool:
        """Whether ``(ledger, entry)`` is tracked and not yet delivered."""
        cdef int64_t c_ledger = as_i64(ledger)
        cdef int64_t c_entry = as_i64(entry)
        check_ids(c_ledger, c_entry)
        return self.ccontains(c_ledger, c_entry)

    cdef inline bint ccontains(self, int64_t ledger, int64_t entry) except -1:
        return self.index.ccontains(ledger, entry)

    def __len__(self) -> int:
        return self.index.count

    def compact(self) -> None:
        """Release the index's sets emptied by deliveries now rather than lazily."""
        self.index.compact()

    def clear(self) -> None:
        """Drop every tracked position, the cancel and reschedule overrides, and reset
        fixed-delay detection."""
        self.heap.cclear()
        self.index.clear()
        self.stale.clear()
        self.dead = 0
        self.cancelled.clear()
        self.moved.clear()
        self.fixed_delay = True
        self.highest = 0

    def memory_bytes(self) -> int:
        """Resident estimate: heap array + dedup index + override containers."""
        cdef Py_ssize_t total = self.heap.cap * sizeof(Triple)
        total += self.index.memory_bytes() + sys.getsizeof(self.stale)
        total += self.cancelled.memory_bytes() + sys.getsizeof(self.moved)
        return total + MOVED_ENTRY_BYTES * len(self.moved)

    def counters(self) -> dict:
        """Operation counters and gauges."""
        return {
            "tracked": self.index.count,
            "heap_nodes": self.heap.n,
            "stale_nodes": len(self.stale),
            "dead_nodes": self.dead,
            "bitmaps": self.index.num_ledgers,
            "add_calls": self.n_add_calls,
            "added": self.n_tracked,
            "duplicates": self.n_duplicates,
            "rejected": self.n_rejected,
            "untracked_on_due_add": self.n_untracked_due,
            "delivered": self.n_delivered,
            "stale_skipped": self.n_stale_skipped,
            "polls": self.n_polls,
            "lateness": lateness_list(self.lateness),
            "lateness_ms": self.lateness_ms,
            "cancelled": self.n_cancelled,
            "rescheduled": self.n_rescheduled,
            "refused_cancelled": self.n_refused_cancelled,
            "cancel_overrides": len(self.cancelled),
            "reschedule_overrides": len(self.moved),
            "fixed_delay": bool(self.fixed_delay),
            "highest_deliver_at": self.highest,
        }

    def _check(self) -> None:
        """Assert the invariants listed at the top of this file."""
        self.heap._check()
        self.index._check()
        if self.heap.n != self.index.count + len(self.stale) + self.dead:
            raise AssertionError(
                f"heap has {self.heap.n} nodes, expected count {self.index.count} + stale "
                f"{len(self.stale)} + dead {self.dead}")
        live = set()
        for i in range(self.heap.n):
            node = self.heap.data[i]
            pos = (node.ledger, node.entry)
            tracked = self.index.contains(*pos)
            if tracked and pos in self.stale:
                raise AssertionError(f"position {pos} is tracked and stale")
            if tracked and self.cancelled.contains(*pos):
                raise AssertionError(f"position {pos} is tracked and cancelled")
            if self.live(node.time, node.ledger, node.entry):
                live.add(pos)
        if not self.dead and len(live) != self.heap.n - len(self.stale):
            raise AssertionError("a position has two live nodes without a reschedule")
        if len(live) != self.index.count:
            raise AssertionError(
                f"{self.index.count} tracked positions, {len(live)} with a live node")
