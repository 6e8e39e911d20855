# BucketCore: the sans-IO state of DelayIndex (pure twin: delayindex/_pure/bucket.py). This file
# holds its seal, segment sources, heads heap, delivery and stats; its fields, time, sealed
# ranges and index calls are in _bucket_state.pxi, cancel, reschedule and add in
# _bucket_overrides.pxi (one class each: _BucketState <- _BucketOverrides <- BucketCore).
#
# How it works. Every tracked message is in exactly one source: the mutable heap (the last
# mutable bucket), the direct heap (non-monotonic ledgers; never persisted), or a segment source
# of a sealed bucket. A segment source is either the sealed bucket's former mutable heap (moved,
# not copied, at seal time: the seal is O(1)) or, once its snapshot is durable, a compact sorted
# array run with a cursor. ``heads`` is a small binary heap holding one key per segment source:
# its current head, or (placeholder, -1, -1) once it is used up and the bucket has an unloaded
# next segment. Delivery is a k-way merge: the smallest of the two heap tops and the heads top.
# A due placeholder stops the merge (``load_needed``); since a next segment's indexes are >= its
# placeholder, delivery stays globally ordered.
#
# The dedup index is a LedgerIndex (len(core) == len(index)). A copy whose position is not
# tracked is skipped on pop. ``stale``: positions untracked by a due re-add whose heap node may
# remain (re-tracking purges it; so does re-tracking a mark-deleted one). ``shadow``: positions
# tracked in the direct heap while their ledger is in a sealed range; their segment copies are
# obsolete.
#
# Cancel and reschedule. ``cancel`` untracks (its copies are skipped on pop like any untracked
# one) and records the position in ``cancelled``, a compact bitmap: a later add is refused
# (code 5) until the mark passes it. ``reschedule`` untracks as a due re-add does (``stale``, so
# the heap copies are purged when it is tracked again; a sealed-range position goes to the
# direct heap and its segment copies are shadowed), records ``moved[pos] = time`` (a later add
# keeps that time) and adds it at the new time. ``untrack_upto`` forgets both overrides at or
# below the mark; ``clear`` forgets them all.
#
# Eviction. Once the driver has committed the overrides, ``evict_cancels`` drops the cancels of
# every sealed range from memory (half of 10 M cancelled would otherwise stay resident until the
# mark passes them) and remembers those ranges in ``evicted`` (a LedgerRanges). Only a replayed
# or non-monotonic add reaches a sealed range, so an add of an *untracked* position whose ledger
# is evicted, or any reschedule there, answers 6 (ADD_NEED_OVERRIDES) with nothing done: the
# driver hands back the cancels of a span holding the ledger (``restore_evicted``, which
# un-evicts that span only) and calls again. ``override_gen`` counts
# the changes of the override set (monotonic across ``clear``): the driver evicts only when it
# equals the one its committed note saw, so a cancel made meanwhile is never dropped.
#
# Invariants (_check): the index's own; heads holds exactly one key per live source, equal to
# its head or placeholder, in heap order; array cursors lie within their arrays; mutable nodes

@cython.final
cdef class BucketCore(_BucketOverrides):
    """Dedup index + mutable/direct heaps + segment-source merge (time passed in).

    ``add`` returns 0 (deliver now), 1 (tracked), 2 (already tracked), 3 (seal the mutable
    bucket first; nothing was changed) or 4 (acknowledged: at or below the mark, the highest
    ``untrack_upto`` position since the last ``clear``; not tracked and never to be delivered,
    whatever its ``deliver_at``; counted as ``acked_on_add``).
    """

    # -- seal -------------------------------------------------------------------------------

    def seal(self, int64_t sid):
        """Seal the mutable bucket into heap source ``sid``: O(1) for the index.

        The mutable heap itself becomes the source (no sort, no copy of the structure);
        untracked nodes are dropped first only if something was untracked while it filled.
        Returns an unsorted copy ``(times, ledgers, entries, start_ledger, end_ledger)`` of the
        sealed indexes, for the snapshot, and resets the mutable range to ``(-1, -1)``.
        """
        cdef int64_t start = self.mutable_start, end = self.mutable_end
        cdef TripleHeap heap = self.mutable
        cdef Py_ssize_t i, j = 0
        cdef Triple x
        if sid < 0 or sid in self.sources:
            raise ValueError(f"source id {sid} is negative or taken")
        if self.mutable_dirty:
            for i in range(heap.n):
                x = heap.data[i]
                if self.index.ccontains(x.ledger, x.entry):
                    heap.data[j] = x
                    j += 1
            if j != heap.n:
                heap.n = j
                heap._heapify()
        arrays = heap.to_arrays()
        self.mutable = TripleHeap()
        self.mutable_start = self.mutable_end = -1
        self.mutable_dirty = False
        cdef _Src src = _Src.__new__(_Src)
        src.heap = heap
        src.next_time = -1
        src.sid = sid
        self.sources[sid] = src
        cdef Head h
        if src.key(&h):
            self.heads_push(h)
        else:
            self.exhausted.append(sid)
        return arrays[0], arrays[1], arrays[2], start, end

    def source_head(self, int64_t sid):
        """The next index ``(time, ledger, entry)`` of source ``sid`` in memory, or None."""
        cdef _Src src = <_Src> self.sources[sid]
        cdef Head h
        if not src.key(&h) or h.ledger < 0:
            return None
        return (h.time, h.ledger, h.entry)

    def cut_source(self, int64_t sid, int64_t last_time, int64_t last_ledger,
                   int64_t last_entry, int64_t next_time) -> int:
        """Keep only source ``sid``'s indexes ``<= (last_time, last_ledger, last_entry)`` (the
        current segment), as a compact array, with placeholder ``next_time``; return how many.

        Used when a sealed bucket's snapshot becomes durable: the rest is in storage.
        """
        cdef _Src src = <_Src> self.sources[sid]
        cdef Triple last, x
        cdef Py_ssize_t k = 0, i
        cdef int64_t[::1] ts, ls, es
        last.time, last.ledger, last.entry = last_time, last_ledger, last_entry
        if src.heap is not None:
            k = 0
            t_arr = np.empty(src.heap.n, dtype=np.int64)
            l_arr = np.empty(src.heap.n, dtype=np.int64)
            e_arr = np.empty(src.heap.n, dtype=np.int64)
            ts, ls, es = t_arr, l_arr, e_arr
            while src.heap.n and not triple_lt(&last, &src.heap.data[0]):
                x = src.heap.cpop()
                ts[k] = x.time
                ls[k] = x.ledger
                es[k] = x.entry
                k += 1
            arrays = (t_arr[:k].copy(), l_arr[:k].copy(), e_arr[:k].copy())
        else:
            i = src.pos
            while i < src.n:
                x.time, x.ledger, x.entry = src.times[i], src.ledgers[i], src.entries[i]
                if triple_lt(&last, &x):
                    break
                i += 1
            t_all, l_all, e_all = src.arrays
            arrays = (t_all[src.pos:i].copy(), l_all[src.pos:i].copy(), e_all[src.pos:i].copy())
            k = i - src.pos
        self.set_source(sid, arrays[0], arrays[1], arrays[2], next_time)
        return k

    # -- heads heap -------------------------------------------------------------------------

    cdef int heads_push(self, Head h) except -1:
        cdef Head* grown
        cdef Py_ssize_t i, parent
        if self.nheads == self.heads_cap:
            self.heads_cap = 16 if self.heads_cap == 0 else self.heads_cap * 2
            grown = <Head*> realloc(self.heads, <size_t> self.heads_cap * sizeof(Head))
            if grown == NULL:
                raise MemoryError()
            self.heads = grown
        i = self.nheads
        self.nheads += 1
        while i > 0:
            parent = (i - 1) >> 1
            if not head_lt(&h, &self.heads[parent]):
                break
            self.heads[i] = self.heads[parent]
            i = parent
        self.heads[i] = h
        return 0

    cdef void heads_sift_down(self, Py_ssize_t i, Head h) noexcept:
        cdef Py_ssize_t n = self.nheads, c
        while True:
            c = 2 * i + 1
            if c >= n:
                break
            if c + 1 < n and head_lt(&self.heads[c + 1], &self.heads[c]):
                c += 1
            if not head_lt(&self.heads[c], &h):
                break
            self.heads[i] = self.heads[c]
            i = c
        self.heads[i] = h

    cdef void heads_pop(self) noexcept:
        self.nheads -= 1
        if self.nheads > 0:
            self.heads_sift_down(0, self.heads[self.nheads])

    cdef void heads_drop(self, void* src) noexcept:
        cdef Py_ssize_t i, j = 0
        for i in range(self.nheads):
            if self.heads[i].src != src:
                self.heads[j] = self.heads[i]
                j += 1
        if j != self.nheads:
            self.nheads = j
            i = (j - 2) // 2
            while i >= 0:
                self.heads_sift_down(i, self.heads[i])
                i -= 1

    # -- segment sources --------------------------------------------------------------------

    def set_source(self, int64_t sid, times, ledgers, entries, next_time=-1) -> None:
        """Add or replace segment source ``sid``: sorted arrays, cursor 0, placeholder."""
        t, lg, en = _column(times), _column(ledgers), _column(entries)
        if not len(t) == len(lg) == len(en):
            raise ValueError("source arrays differ in length")
        if sid < 0:
            raise ValueError("source ids are >= 0")
        cdef int64_t c_next = as_i64(next_time)
        if sid in self.sources:
            self.remove_source(sid)
        cdef _Src src = _Src.__new__(_Src)
        cdef const int64_t[::1] tv = t
        cdef const int64_t[::1] lv = lg
        cdef const int64_t[::1] ev = en
        src.arrays = (t, lg, en)
        src.n = tv.shape[0]
        src.times = &tv[0] if src.n else NULL
        src.ledgers = &lv[0] if src.n else NULL
        src.entries = &ev[0] if src.n else NULL
        src.pos = 0
        src.next_time = c_next
        src.sid = sid
        self.sources[sid] = src
        cdef Head h
        if src.key(&h):
            self.heads_push(h)
        else:
            self.exhausted.append(sid)

    def remove_source(self, int64_t sid) -> None:
        """Drop segment source ``sid`` (its indexes stay tracked)."""
        src = self.sources.pop(sid, None)
        if self.load_needed == sid:
            self.load_needed = -1
        if sid in self.exhausted:
            self.exhausted = [s for s in self.exhausted if s != sid]
        if src is not None:
            self.heads_drop(<void*> src)

    def source_remaining(self, int64_t sid) -> int:
        """Indexes source ``sid`` still holds in memory."""
        return (<_Src> self.sources[sid]).remaining()

    def has_source(self, int64_t sid) -> bool:
        """Whether ``sid`` is a segment source."""
        return sid in self.sources

    def source_ids(self) -> list:
        """Segment source ids, ascending."""
        return sorted(self.sources)

    def take_exhausted(self) -> list:
        """Ids of sources used up with no placeholder since the last call (then forgotten)."""
        out, self.exhausted = self.exhausted, []
        return [sid for sid in out if sid in self.sources]

    # -- delivery ---------------------------------------------------------------------------

    cdef inline int peek(self, Triple* key) noexcept:
        """Where the smallest key is: 0 none, 1 mutable, 2 direct, 3 heads."""
        cdef int best = 0
        cdef Triple h
        if self.mutable.n:
            key[0] = self.mutable.data[0]
            best = 1
        if self.direct.n and (best == 0 or triple_lt(&self.direct.data[0], key)):
            key[0] = self.direct.data[0]
            best = 2
        if self.nheads:
            h.time = self.heads[0].time
            h.ledger = self.heads[0].ledger
            h.entry = self.heads[0].entry
            if best == 0 or triple_lt(&h, key):
                key[0] = h
                best = 3
        return best

    cdef int pop(self, int best, Triple* got) except -1:
        """Remove the smallest (non-placeholder) key into ``got``; 1 if live, else 0."""
        cdef Head* top
        cdef _Src src
        cdef Head nxt
        if best == 3:
            top = &self.heads[0]
            got.time = top.time
            got.ledger = top.ledger
            got.entry = top.entry
            src = <_Src> top.src
            src.advance()
            if src.key(&nxt):
                self.heads_sift_down(0, nxt)
            else:
                self.heads_pop()
                self.exhausted.append(src.sid)
            if self.shadow and (got.ledger, got.entry) in self.shadow:
                return 0
        elif best == 1:
            got[0] = self.mutable.cpop()
        else:
            got[0] = self.direct.cpop()
            if self.shadow:
                self.shadow.discard((got.ledger, got.entry))
        if not self.index.ccontains(got.ledger, got.entry):
            if self.stale:
                self.stale.discard((got.ledger, got.entry))
            return 0
        return 1

    cdef int pop_raw(self, int best, Triple* got) except -1:
        """Remove the smallest (non-placeholder) key into ``got``; 0 if it is an obsolete
        segment copy (shadowed), else 1 (the caller tests membership)."""
        cdef Head* top
        cdef _Src src
        cdef Head nxt
        if best == 3:
            top = &self.heads[0]
            got.time = top.time
            got.ledger = top.ledger
            got.entry = top.entry
            src = <_Src> top.src
            src.advance()
            if src.key(&nxt):
                self.heads_sift_down(0, nxt)
            else:
                self.heads_pop()
                self.exhausted.append(src.sid)
            if self.shadow and (got.ledger, got.entry) in self.shadow:
                return 0
        elif best == 1:
            got[0] = self.mutable.cpop()
        else:
            got[0] = self.direct.cpop()
            if self.shadow:
                self.shadow.discard((got.ledger, got.entry))
        return 1

    cdef int purge(self, Triple* key) except -1:
        """Drop dead keys at the head; return where the live head (or placeholder) is."""
        cdef int best
        cdef Triple got
        while True:
            best = self.peek(key)
            if best == 0 or key.ledger < 0:
                return best
            if self.index.ccontains(key.ledger, key.entry) and not (
                    best == 3 and self.shadow and (key.ledger, key.entry) in self.shadow):
                return best
            self.pop(best, &got)
            self.n_skipped += 1

    cdef Py_ssize_t take_due(self, int64_t c_max, int64_t cutoff, Triple** bufp) except -1:
        """Pop up to ``c_max`` due live keys into ``*bufp`` (malloc'd, the caller frees), in
        (time, ledger, entry) order; stop at a due placeholder (sets ``load_needed``)."""
        cdef Triple* buf = NULL
        cdef Triple* grown
        cdef Py_ssize_t k = 0, m, i, room = 0
        cdef Triple key, got
        cdef int best
        cdef bint stop = False
        cdef LSet* ring[RING_MASK + 1]
        self.n_polls += 1
        self.load_needed = -1
        bufp[0] = NULL
        # In rounds: pop due keys into buf[k:m] (as many as are still wanted), then test and
        # remove their membership in order, keeping the live ones. Testing them as a batch lets
        # the index's cache misses overlap (prefetched a few keys ahead); the order and the
        # outcome are those of testing each key as it is popped, since popping never reads
        # the index.
        while k < c_max and not stop:
            m = k
            while m < c_max:
                best = self.peek(&key)
                if best == 0 or key.time > cutoff:
                    stop = True
                    break
                if key.ledger < 0:  # a due placeholder: load the next segment first
                    self.load_needed = (<_Src> self.heads[0].src).sid
                    stop = True
                    break
                if m == room:
                    room = 256 if room == 0 else room * 2
                    if room > c_max:
                        room = c_max
                    grown = <Triple*> realloc(buf, <size_t> room * sizeof(Triple))
                    if grown == NULL:
                        free(buf)
                        raise MemoryError()
                    buf = grown
                if not self.pop_raw(best, &got):
                    self.n_skipped += 1
                    continue
                buf[m] = got
                m += 1
            for i in range(k, min(m, k + 2 * PREFETCH_AHEAD)):
                self.index.prefetch_slot(buf[i].ledger)
            # Each key's slot is looked up once, when its word is prefetched, and kept in a
            # ring until its test (discards never move slots, and nothing is inserted here).
            for i in range(k, min(m, k + PREFETCH_AHEAD)):
                ring[i & RING_MASK] = self.index.prefetch_word(buf[i].ledger, buf[i].entry)
            for i in range(k, m):
                if i + 2 * PREFETCH_AHEAD < m:
                    self.index.prefetch_slot(buf[i + 2 * PREFETCH_AHEAD].ledger)
                if i + PREFETCH_AHEAD < m:
                    ring[(i + PREFETCH_AHEAD) & RING_MASK] = self.index.prefetch_word(
                        buf[i + PREFETCH_AHEAD].ledger, buf[i + PREFETCH_AHEAD].entry)
                got = buf[i]
                # Not tracked: a copy left by delivery, a due re-add or a mark-delete (dedup
                # on pop).
                if not self.index.cdiscard_in(ring[i & RING_MASK], got.entry):
                    if self.stale:
                        self.stale.discard((got.ledger, got.entry))
                    self.n_skipped += 1
                    continue
                buf[k] = got
                k += 1
        self.n_delivered += k
        self.mutable._maybe_shrink()
        self.direct._maybe_shrink()
        if self.index.wants_compaction():
            self.index.compact()
        if self.index.count == 0:
            self.fixed_delay = True
            self.highest = 0
        bufp[0] = buf
        return k

    def poll(self, max_n, now, list prior=None) -> list:
        """Remove up to ``max_n`` due positions, chosen in (time, ledger, entry) order.

        Stops early at a due placeholder and sets ``load_needed``. Returns the positions sorted
        by position; with ``prior`` (a list of positions sorted by position, from an earlier
        poll), merged with them into one new sorted list.
        """
        cdef int64_t c_max = as_i64(max_n)
        cdef int64_t c_now = as_i64(now)
        cdef int64_t cutoff = self.cutoff(c_now)
        cdef Triple* keys = NULL
        cdef Pos* buf = NULL
        cdef Py_ssize_t k, i
        cdef int64_t ledger, entry
        if c_max <= 0:
            self.n_polls += 1
            self.load_needed = -1
            return [] if prior is None else list(prior)
        k = self.take_due(c_max, cutoff, &keys)
        try:
            # Compact the keys into positions in place (a Pos is smaller than a Triple, and
            # position i is written only after key i, the last one it overlaps, was read).
            buf = <Pos*> keys
            for i in range(k):
                record_lateness(self.lateness, &self.lateness_ms, c_now - keys[i].time)
                ledger = keys[i].ledger
                entry = keys[i].entry
                buf[i].ledger = ledger
                buf[i].entry = entry
            di_sort_pos(buf, k)
            if prior is not None:
                return merge_positions(prior, buf, k)
            return di_positions(Position, buf, k)
        finally:
            free(keys)

    def poll_keys(self, max_n, now) -> tuple:
        """As :meth:`poll`, but return ``(times, ledgers, entries)`` int64 arrays in selection
        order (the order the shared index hands to every subscription)."""
        cdef int64_t c_max = as_i64(max_n)
        cdef int64_t cutoff = self.cutoff(as_i64(now))
        cdef Triple* keys = NULL
        cdef Py_ssize_t k = 0, i
        if c_max > 0:
            k = self.take_due(c_max, cutoff, &keys)
        else:
            self.n_polls += 1
            self.load_needed = -1
        t_arr = np.empty(k, dtype=np.int64)
        l_arr = np.empty(k, dtype=np.int64)
        e_arr = np.empty(k, dtype=np.int64)
        cdef int64_t[::1] tv = t_arr, lv = l_arr, ev = e_arr
        try:
            for i in range(k):
                tv[i] = keys[i].time
                lv[i] = keys[i].ledger
                ev[i] = keys[i].entry
        finally:
            free(keys)
        return t_arr, l_arr, e_arr

    def has_due(self, now) -> bool:
        """Whether the smallest loaded key (or a placeholder) is due at ``now``."""
        cdef int64_t cutoff = self.cutoff(as_i64(now))
        cdef Triple key
        return self.purge(&key) != 0 and key.time <= cutoff

    def next_time(self):
        """The smallest deliver time among loaded indexes and placeholders, or None."""
        cdef Triple key
        if self.purge(&key) == 0:
            return None
        return key.time

    def should_pause(self, now) -> bool:
        """Pulsar's fixed-delay detection: pause reads while delays look fixed and none is due."""
        return (self.fixed_delay_lookahead > 0 and self.fixed_delay
                and self.index.count >= self.fixed_delay_lookahead and not self.has_due(now))

    def contains(self, ledger, entry) -> bool:
        """Whether ``(ledger, entry)`` is tracked and not yet delivered."""
        cdef int64_t c_ledger = as_i64(ledger)
        cdef int64_t c_entry = as_i64(entry)
        check_ids(c_ledger, c_entry)
        return self.index.ccontains(c_ledger, c_entry)

    def __len__(self) -> int:
        return self.index.count

    @property
    def loaded(self) -> int:
        """Indexes held in memory by the sources (consumed ones excluded)."""
        cdef Py_ssize_t total = self.mutable.n + self.direct.n
        cdef _Src src
        for value in self.sources.values():
            src = <_Src> value
            total += src.remaining()
        return total

    def clear(self) -> None:
        """Drop everything: index, heaps, sources, ranges; reset fixed-delay detection."""
        self.index.clear()
        self.mutable.cclear()
        self.direct.cclear()
        self.mutable_start = self.mutable_end = -1
        self.mutable_dirty = False
        self.stale.clear()
        self.shadow.clear()
        self.cancelled.clear()
        self.moved.clear()
        self.evicted.clear()
        self.evicted_max = -1
        self.override_gen += 1
        self.nheads = 0
        self.sources.clear()
        self.ranges.clear()
        self.max_sealed_end = -1
        self.exhausted = []
        self.mark_ledger = self.mark_entry = -1
        self.load_needed = -1
        self.fixed_delay = True
        self.highest = 0

    def memory_bytes(self) -> int:
        """Resident estimate: heaps + source arrays (24 B per index) + bitmaps + containers."""
        cdef _Src src
        cdef Py_ssize_t total = (self.mutable.cap + self.direct.cap) * sizeof(Triple)
        total += self.heads_cap * sizeof(Head)
        for value in self.sources.values():
            src = <_Src> value
            total += 24 * src.n if src.heap is None else src.heap.cap * sizeof(Triple)
        total += sys.getsizeof(self.stale) + sys.getsizeof(self.shadow)
        total += self.cancelled.memory_bytes() + MOVED_ENTRY_BYTES * len(self.moved)
        return total + self.index.memory_bytes()

    def counters(self) -> dict:
        """Operation counters and gauges."""
        return {
            "tracked": self.index.count,
            "mutable_nodes": self.mutable.n,
            "direct_nodes": self.direct.n,
            "segment_sources": len(self.sources),
            "loaded": self.loaded,
            "stale_nodes": len(self.stale),
            "shadowed": len(self.shadow),
            "ledgers": self.index.nonempty,
            "add_calls": self.n_add_calls,
            "added": self.n_added,
            "duplicates": self.n_duplicates,
            "rejected": self.n_rejected,
            "untracked_on_due_add": self.n_untracked_due,
            "delivered": self.n_delivered,
            "skipped_on_pop": self.n_skipped,
            "polls": self.n_polls,
            "lateness": lateness_list(self.lateness),
            "lateness_ms": self.lateness_ms,
            "direct_adds": self.n_direct,
            "acked_on_add": self.n_acked_on_add,
            "cancelled": self.n_cancelled,
            "rescheduled": self.n_rescheduled,
            "refused_cancelled": self.n_refused_cancelled,
            "cancel_overrides": self.cancelled.count,
            "reschedule_overrides": len(self.moved),
            "evicted_cancel_ranges": len(self.evicted),
            "fixed_delay": bool(self.fixed_delay),
            "highest_deliver_at": self.highest,
        }

    def _check(self) -> None:
        """Assert the invariants listed at the top of this file."""
        cdef Py_ssize_t i
        cdef _Src src
        cdef Head h
        self.mutable._check()
        self.direct._check()
        self.index._check()
        self.evicted._check()
        if self.evicted_max != self.evicted.max:
            raise AssertionError("evicted_max is stale")
        for i in range(self.mutable.n):
            if not self.mutable_start <= self.mutable.data[i].ledger <= self.mutable_end:
                raise AssertionError("a mutable node lies outside the mutable range")
        for i in range(1, self.nheads):
            if head_lt(&self.heads[i], &self.heads[(i - 1) >> 1]):
                raise AssertionError(f"heads order broken at {i}")
        seen = {}
        for i in range(self.nheads):
            src = <_Src> self.heads[i].src
            if src.sid in seen or self.sources.get(src.sid) is not src:
                raise AssertionError(f"heads entry {i} is a duplicate or a dead source")
            seen[src.sid] = i
        for sid, value in self.sources.items():
            src = <_Src> value
            if src.heap is not None:
                src.heap._check()
            elif not 0 <= src.pos <= src.n:
                raise AssertionError(f"source {sid}: cursor {src.pos} out of range")
            if src.key(&h):
                i = seen.get(sid, -1)
                if i < 0 or (self.heads[i].time, self.heads[i].ledger, self.heads[i].entry) != (
                        h.time, h.ledger, h.entry):
                    raise AssertionError(f"source {sid}: head missing from heads")
            elif sid in seen:
                raise AssertionError(f"source {sid} is used up but still in heads")


cdef list merge_positions(list prior, const Pos* buf, Py_ssize_t k):
    """``prior`` (positions sorted by position) merged with ``buf[:k]`` (sorted) into a new
    list: one pass, comparing ints, where ``list.sort`` would compare tuples in Python."""
    cdef Py_ssize_t n = len(prior), i = 0, j = 0, o = 0
    cdef list out = [None] * (n + k)
    cdef object item = None
    cdef int64_t ledger = 0, entry = 0
    cdef bint have = False
    while i < n or j < k:
        if i < n and not have:
            item = prior[i]
            if not PyTuple_Check(item) or PyTuple_GET_SIZE(item) != 2:
                raise TypeError(f"prior[{i}] is not a position")
            ledger = <object> PyTuple_GET_ITEM(item, 0)
            entry = <object> PyTuple_GET_ITEM(item, 1)
            have = True
        if j >= k or (have and (ledger < buf[j].ledger
                                or (ledger == buf[j].ledger and entry <= buf[j].entry))):
            out[o] = item
            i += 1
            have = False
        else:
            out[o] = di_make_pair(Position, buf[j].ledger, buf[j].entry)
            j += 1
        o += 1
    return out


def sorted_positions(const int64_t[:] ledgers not None, const int64_t[:] entries not None):
    """``Position`` s of two int64 columns, sorted by position (the shared index's poll
    batches; the same construction as ``BucketCore.poll``)."""
    cdef Py_ssize_t i, n = ledgers.shape[0]
    cdef Pos* buf
    if entries.shape[0] != n:
        raise ValueError(f"ledgers and entries differ in length ({n} != {entries.shape[0]})")
    if n == 0:
        return []
    buf = <Pos*> malloc(<size_t> n * sizeof(Pos))
    if buf == NULL:
        raise MemoryError()
    try:
        for i in range(n):
            buf[i].ledger = ledgers[i]
            buf[i].entry = entries[i]
        di_sort_pos(buf, n)
        return di_positions(Position, buf, n)
    finally:
        free(buf)
