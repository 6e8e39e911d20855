# BucketCore: the sans-IO state of DelayIndex (pure twin: delayindex/_pure/bucket.py).
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
# lie in the mutable range.

from cpython.tuple cimport PyTuple_Check, PyTuple_GET_ITEM, PyTuple_GET_SIZE
from sortedcontainers import SortedDict

ctypedef struct Head:
    int64_t time
    int64_t ledger
    int64_t entry
    void* src          # borrowed _Src; heads never outlive the sources dict entry


#: How many keys ahead take_due prefetches a key's bitset word (its table slot: twice that).
cdef enum:
    PREFETCH_AHEAD = 8
    RING_MASK = 15  # take_due's ring of looked-up slots: a power of two > PREFETCH_AHEAD


cdef inline bint head_lt(const Head* a, const Head* b) noexcept nogil:
    if a.time != b.time:
        return a.time < b.time
    if a.ledger != b.ledger:
        return a.ledger < b.ledger
    return a.entry < b.entry


@cython.final
cdef class _Src:
    """One segment source: sorted int64 arrays with a cursor, or (a freshly sealed bucket) the
    mutable bucket's heap; plus the next unloaded segment's min time (-1: none)."""
    cdef object arrays
    cdef TripleHeap heap          # not None: a heap source (arrays unused)
    cdef const int64_t* times
    cdef const int64_t* ledgers
    cdef const int64_t* entries
    cdef Py_ssize_t pos, n
    cdef int64_t next_time
    cdef int64_t sid

    cdef inline Py_ssize_t remaining(self) noexcept:
        return self.heap.n if self.heap is not None else self.n - self.pos

    cdef inline void advance(self) noexcept:
        """Step past the head. An array source is read a line at a time, interleaved with
        every other source's: far more streams than the hardware prefetcher follows, so the
        next line of each column is requested here, long before the merge reaches it."""
        self.pos += 1
        if self.heap is not None:
            self.heap.cpop()
        elif (self.pos & 7) == 0 and self.pos + 8 < self.n:
            DI_PREFETCH(&self.times[self.pos + 8])
            DI_PREFETCH(&self.ledgers[self.pos + 8])
            DI_PREFETCH(&self.entries[self.pos + 8])

    cdef inline bint key(self, Head* out) noexcept:
        if self.heap is not None:
            if self.heap.n > 0:
                out.time = self.heap.data[0].time
                out.ledger = self.heap.data[0].ledger
                out.entry = self.heap.data[0].entry
            elif self.next_time >= 0:
                out.time = self.next_time
                out.ledger = -1
                out.entry = -1
            else:
                return False
        elif self.pos < self.n:
            out.time = self.times[self.pos]
            out.ledger = self.ledgers[self.pos]
            out.entry = self.entries[self.pos]
        elif self.next_time >= 0:
            out.time = self.next_time
            out.ledger = -1
            out.entry = -1
        else:
            return False
        out.src = <void*> self
        return True


cdef object _column(object values):
    return np.ascontiguousarray(np.asarray(values), dtype=np.int64)


@cython.final
cdef class BucketCore:
    """Dedup index + mutable/direct heaps + segment-source merge (time passed in).

    ``add`` returns 0 (deliver now), 1 (tracked), 2 (already tracked), 3 (seal the mutable
    bucket first; nothing was changed) or 4 (acknowledged: at or below the mark, the highest
    ``untrack_upto`` position since the last ``clear``; not tracked and never to be delivered,
    whatever its ``deliver_at``; counted as ``acked_on_add``).
    """

    cdef LedgerIndex index        # the single dedup index; len(core) == len(index)
    cdef TripleHeap mutable
    cdef TripleHeap direct
    cdef int64_t mutable_start, mutable_end
    cdef set stale
    cdef set shadow
    cdef LedgerIndex cancelled    # cancel overrides (a re-add is refused)
    cdef dict moved               # (ledger, entry) -> deliver_at: reschedule overrides
    cdef object evicted           # LedgerRanges whose cancels only the driver holds
    cdef int64_t evicted_max      # evicted.max, for the add path's cheap test
    cdef public int64_t override_gen
    cdef dict sources
    cdef Head* heads
    cdef Py_ssize_t nheads, heads_cap
    cdef object ranges
    cdef int64_t max_sealed_end
    cdef list exhausted
    cdef int64_t mark_ledger, mark_entry     # highest untrack_upto position
    cdef bint mutable_dirty                  # something was untracked since the last seal
    cdef public int64_t load_needed
    cdef int64_t _tick
    cdef readonly bint strict
    cdef readonly int64_t fixed_delay_lookahead
    cdef readonly int64_t min_index_count
    cdef bint fixed_delay
    cdef int64_t highest
    cdef int64_t n_add_calls, n_added, n_duplicates, n_rejected, n_untracked_due
    cdef int64_t n_delivered, n_skipped, n_polls, n_direct, n_acked_on_add
    cdef int64_t n_cancelled, n_rescheduled, n_refused_cancelled
    cdef int64_t lateness[LATENESS_BUCKETS]  # poll's delivery lateness counters
    cdef int64_t lateness_ms

    def __cinit__(self, int64_t tick_ms, bint strict, int64_t fixed_delay_lookahead,
                  int64_t min_index_count_per_bucket):
        if tick_ms < 0:
            raise ValueError(f"tick_ms must be >= 0, got {tick_ms}")
        if fixed_delay_lookahead < 0:
            raise ValueError("fixed_delay_lookahead must be >= 0")
        if min_index_count_per_bucket < 1:
            raise ValueError("min_index_count_per_bucket must be >= 1")
        self._tick = tick_ms
        self.strict = strict
        self.fixed_delay_lookahead = fixed_delay_lookahead
        self.min_index_count = min_index_count_per_bucket
        self.index = LedgerIndex()
        self.mutable = TripleHeap()
        self.direct = TripleHeap()
        self.mutable_start = self.mutable_end = -1
        self.stale = set()
        self.shadow = set()
        self.cancelled = LedgerIndex()
        self.moved = {}
        self.evicted = _LedgerRanges()
        self.evicted_max = -1
        self.sources = {}
        self.heads = NULL
        self.ranges = SortedDict()
        self.max_sealed_end = -1
        self.exhausted = []
        self.mark_ledger = self.mark_entry = -1
        self.load_needed = -1
        self.fixed_delay = True

    def __dealloc__(self):
        free(self.heads)

    # -- time -------------------------------------------------------------------------------

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
        """The cutoff for ``now``: a message is due when deliver_at <= cutoff."""
        return self.cutoff(as_i64(now))

    # -- sealed ranges ----------------------------------------------------------------------

    def add_range(self, int64_t start, int64_t end) -> None:
        """Register a sealed bucket's ledger range (must not overlap a registered one)."""
        if not 0 <= start <= end:
            raise ValueError(f"bad range [{start}, {end}]")
        at = self.ranges.bisect_right(end)
        if at and self.ranges.peekitem(at - 1)[1] >= start:
            raise ValueError(f"range [{start}, {end}] overlaps a sealed range")
        self.ranges[start] = end
        if end > self.max_sealed_end:
            self.max_sealed_end = end

    def remove_range(self, int64_t start) -> None:
        """Forget the sealed range starting at ``start``."""
        del self.ranges[start]
        self.max_sealed_end = self.ranges.peekitem(-1)[1] if self.ranges else -1

    cpdef bint in_sealed_range(self, int64_t ledger):
        """Whether ``ledger`` lies inside a registered sealed range."""
        if ledger > self.max_sealed_end:
            return False
        at = self.ranges.bisect_right(ledger)
        return bool(at) and self.ranges.peekitem(at - 1)[1] >= ledger

    cdef bint crosses_sealed(self, int64_t ledger) except -1:
        """Whether a sealed range lies between the mutable bucket's end and ``ledger``."""
        if self.max_sealed_end <= self.mutable_end:
            return False
        at = self.ranges.bisect_right(self.mutable_end)
        return at < len(self.ranges) and self.ranges.peekitem(at)[0] < ledger

    @property
    def mutable_range(self) -> tuple:
        """``(start, end)`` ledgers of the last mutable bucket; ``(-1, -1)`` when reset."""
        return (self.mutable_start, self.mutable_end)

    @property
    def mutable_size(self) -> int:
        """Nodes in the mutable heap (stale ones included)."""
        return self.mutable.n

    @property
    def direct_size(self) -> int:
        """Nodes in the direct heap (stale ones included)."""
        return self.direct.n

    # -- index ------------------------------------------------------------------------------

    cdef bint untrack(self, int64_t ledger, int64_t entry) except -1:
        if not self.index.cdiscard(ledger, entry):
            return False
        self.mutable_dirty = True
        return True

    def restore(self, int64_t ledger, bitmap) -> int:
        """Track every entry of ``bitmap`` (a BitMap or uint32 array) in ``ledger`` (recovery);
        return how many were new."""
        return self.index.restore(ledger, bitmap)

    def restore_many(self, ledgers, offsets, entries) -> int:
        """``restore`` each ledger ``ledgers[i]`` with ``entries[offsets[i]:offsets[i + 1]]``
        (recovery: one native loop over the ledgers of a bucket)."""
        cdef const int64_t[::1] lv = np.ascontiguousarray(ledgers, dtype=np.int64)
        cdef const int64_t[::1] ov = np.ascontiguousarray(offsets, dtype=np.int64)
        cdef const uint32_t[::1] ev = np.ascontiguousarray(entries, dtype=np.uint32)
        cdef Py_ssize_t i, added = 0, n = lv.shape[0]
        if ov.shape[0] != n + 1 or (n and (ov[0] < 0 or ov[n] > ev.shape[0])):
            raise ValueError("offsets do not frame the entries")
        for i in range(n):
            if ov[i + 1] < ov[i]:
                raise ValueError("offsets do not ascend")
            if ov[i + 1] > ov[i]:
                added += self.index.crestore(lv[i], &ev[ov[i]], ov[i + 1] - ov[i])
        return added

    def restore_block(self, ledgers, const uint8_t[::1] blob not None, offsets,
                      int64_t expected=-1) -> int:
        """Track the positions of a bitmap block, bitmap ``i`` holding entries of ledger
        ``ledgers[i]`` (recovery: a snapshot's live segments parsed straight into the index,
        with no union arrays between). Every position must be new: the block's ledgers hold
        nothing yet (recovery restores buckets of disjoint ranges into an empty index). Returns
        how many were tracked.

        Raises:
            ValueError: a malformed bitmap, a position in two bitmaps, or (``expected`` >= 0)
                other than ``expected`` positions; the block's ledger span then holds nothing
                again.
        """
        cdef const int64_t[::1] lv = np.ascontiguousarray(ledgers, dtype=np.int64)
        cdef const int64_t[::1] ov = np.ascontiguousarray(offsets, dtype=np.int64)
        cdef Py_ssize_t n = lv.shape[0], i, got, k, cap = 0, added = 0
        cdef int64_t low = 0, high = -1
        cdef uint32_t* buf = NULL
        cdef uint32_t* grown
        cdef const uint8_t* base = block_base(blob, ov, n)
        if n:
            low = high = lv[0]
            for i in range(1, n):
                low = min(low, lv[i])
                high = max(high, lv[i])
        try:
            for i in range(n):
                got = block_parse(base, ov, i, buf, cap)  # one pass, unless it did not fit
                if got > cap:
                    grown = <uint32_t*> realloc(buf, <size_t> max(got, 4096) * sizeof(uint32_t))
                    if grown == NULL:
                        raise MemoryError()
                    buf, cap = grown, max(got, 4096)
                    got = block_parse(base, ov, i, buf, cap)
                k = self.index.crestore(lv[i], buf, got)
                added += k
                if k != got:
                    raise ValueError(f"a position of ledger {lv[i]} is in two segments")
            if expected >= 0 and added != expected:
                raise ValueError(f"the bitmaps hold {added} positions, expected {expected}")
        except BaseException:
            if n:
                self.index.remove_ledgers(low, high)
            raise
        finally:
            free(buf)
        return added

    def index_bitmap(self, int64_t ledger, int64_t first=0, int64_t last=0xFFFFFFFF):
        """A new BitMap of ``ledger``'s tracked entries in ``[first, last]``, or None when the
        ledger has none at all."""
        if self.index.ledger_count(ledger) == 0:
            return None
        return self.index.bitmap(ledger, first, last)

    def tracked_mask(self, ledgers, entries):
        """For each position, whether it is tracked."""
        return self.index.contains_many(ledgers, entries)

    def tracked_in_range(self, int64_t start, int64_t end):
        """Tracked positions of ledgers ``start..end`` whose authoritative copy is not in the
        direct heap, as ``(ledgers, entries)`` int64 arrays in position order."""
        ls, es = [], []
        for ledger in self.index.ledgers():
            if start <= ledger <= end:
                entries = [e for e in self.index.bitmap(ledger)
                           if not self.shadow or (ledger, e) not in self.shadow]
                ls.extend([ledger] * len(entries))
                es.extend(entries)
        return np.array(ls, dtype=np.int64), np.array(es, dtype=np.int64)

    def count_upto(self, int64_t ledger, int64_t entry) -> int:
        """How many tracked positions are ``<= (ledger, entry)``."""
        cdef Py_ssize_t total = 0
        for led in self.index.ledgers():
            if led < ledger:
                total += self.index.ledger_count(led)
            elif led == ledger and entry >= 0:
                total += len(self.index.bitmap(led, 0, entry))
        return total

    def untrack_upto(self, int64_t ledger, int64_t entry) -> int:
        """Untrack every position ``<= (ledger, entry)`` (mark-delete); return how many."""
        if (ledger, entry) > (self.mark_ledger, self.mark_entry):
            self.mark_ledger, self.mark_entry = ledger, entry
        removed = self.index.remove_upto(ledger, entry)
        self.mutable_dirty = True
        if self.shadow:
            self.shadow = {p for p in self.shadow if p > (ledger, entry)}
        if self.evicted_max >= 0:
            self.evicted.drop_below(ledger)
            self.evicted_max = self.evicted.max
        if self.cancelled.count:
            self.cancelled.remove_upto(ledger, entry)
        if self.moved:
            self.moved = {p: t for p, t in self.moved.items() if p > (ledger, entry)}
        return removed

    # -- cancel and reschedule ------------------------------------------------------------------

    cdef inline bint acked(self, int64_t ledger, int64_t entry) noexcept:
        return ledger < self.mark_ledger or (
            ledger == self.mark_ledger and entry <= self.mark_entry)

    cdef bint ccancel(self, int64_t ledger, int64_t entry) except -1:
        if not self.untrack(ledger, entry):
            return False
        self.override_gen += 1
        self.cancelled.cadd(ledger, entry)
        if self.moved:
            self.moved.pop((ledger, entry), None)
        if self.shadow:
            self.shadow.discard((ledger, entry))
        self.n_cancelled += 1
        return True

    def cancel(self, ledger, entry) -> bool:
        """Untrack a tracked position for good: True if it was tracked. A later add of it is
        refused (code 5) until the mark passes it or :meth:`clear`."""
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
        returns :meth:`add`'s code for the new time. On 3 (seal first) the override is recorded
        and the position untracked: seal and call again."""
        cdef int64_t c_ledger = as_i64(ledger)
        cdef int64_t c_entry = as_i64(entry)
        cdef int64_t c_deliver_at = as_i64(deliver_at)
        cdef int64_t c_now = as_i64(now)
        check_ids(c_ledger, c_entry)
        if self.acked(c_ledger, c_entry):
            self.n_add_calls += 1
            self.n_acked_on_add += 1
            return 4
        if c_ledger <= self.evicted_max and c_ledger in self.evicted:
            return 6
        self.override_gen += 1
        if self.cancelled.count:
            self.cancelled.cdiscard(c_ledger, c_entry)
        self.untrack(c_ledger, c_entry)
        # Its copies may remain anywhere: heap copies are purged when it is tracked again, a
        # sealed-range one goes to the direct heap with its segment copies shadowed.
        self.stale.add((c_ledger, c_entry))
        if self.shadow:
            self.shadow.discard((c_ledger, c_entry))
        self.moved[(c_ledger, c_entry)] = c_deliver_at
        self.n_rescheduled += 1
        return self.cadd(c_ledger, c_entry, c_deliver_at, self.cutoff(c_now))

    def live_keys(self, int64_t first, int64_t last):
        """``(times, ledgers, entries)`` of the tracked positions in memory (mutable and
        direct heaps, segment sources from their cursors) with ``first <= time <= last``, in
        no particular order; segments still in storage are the caller's."""
        cdef _Src src
        from delayindex._pure._bucket_queries import live_rows
        parts = [self.mutable.to_arrays()]
        for value in self.sources.values():
            src = <_Src> value
            if src.heap is not None:
                parts.append(src.heap.to_arrays())
            else:
                parts.append(tuple(np.asarray(c)[src.pos:] for c in src.arrays))
        return live_rows(self.tracked_mask, self.shadow, parts, self.direct.to_arrays(),
                         first, last)

    def ledger_counts(self):
        """``(ledgers, counts)``: the tracked positions per ledger, ledgers ascending."""
        return self.index.ledger_counts()

    def authoritative_mask(self, ledgers, entries):
        """For segment copies read from storage: tracked and not shadowed by a direct copy."""
        live = self.tracked_mask(ledgers, entries)
        if self.shadow:
            live &= np.array([pos not in self.shadow for pos in
                              zip(np.asarray(ledgers).tolist(), np.asarray(entries).tolist())],
                             dtype=np.bool_)
        return live

    def restore_overrides(self, const int64_t[:] cancelled_ledgers not None,
                          const int64_t[:] cancelled_entries not None,
                          const int64_t[:] moved_ledgers not None,
                          const int64_t[:] moved_entries not None,
                          const int64_t[:] moved_times not None) -> None:
        """Record stored overrides (recovery, or a shared index's held positions) without
        changing what is tracked: the caller cancels or reschedules the tracked ones first.
        Positions at or below the mark are skipped. A position has one override: a moved one
        replaces its cancel (a reschedule revives), then a cancelled one replaces its move."""
        cdef Py_ssize_t i
        self.override_gen += 1
        for i in range(moved_ledgers.shape[0]):
            check_ids(moved_ledgers[i], moved_entries[i])
            if not self.acked(moved_ledgers[i], moved_entries[i]):
                if self.cancelled.count:
                    self.cancelled.cdiscard(moved_ledgers[i], moved_entries[i])
                self.moved[(moved_ledgers[i], moved_entries[i])] = moved_times[i]
        for i in range(cancelled_ledgers.shape[0]):
            check_ids(cancelled_ledgers[i], cancelled_entries[i])
            if not self.acked(cancelled_ledgers[i], cancelled_entries[i]):
                self.cancelled.cadd(cancelled_ledgers[i], cancelled_entries[i])
                if self.moved:
                    self.moved.pop((cancelled_ledgers[i], cancelled_entries[i]), None)

    def needs_restore(self, int64_t ledger, int64_t entry) -> bool:
        """Whether an add of the position would answer 6 (ADD_NEED_OVERRIDES): it is above the
        mark, untracked, and its ledger's cancels are evicted."""
        return (ledger <= self.evicted_max and not self.acked(ledger, entry)
                and not self.index.ccontains(ledger, entry) and ledger in self.evicted)

    def evict_cancels(self) -> int:
        """Drop from memory the cancels of every sealed range (the driver holds them durably);
        returns how many. Their ranges join the evicted ones."""
        cdef int64_t evicted = 0, removed
        for start, end in list(self.ranges.items()):
            removed = self.cancelled.remove_ledgers(start, end)
            if removed:
                evicted += removed
                self.evicted.add(start, end)
        if evicted:
            self.cancelled.compact()  # the emptied ledgers' slots go too
        self.evicted_max = self.evicted.max
        return evicted

    def evict_range(self, int64_t start, int64_t end, bint drop) -> int:
        """Mark ledgers ``start..end`` evicted: their cancels are held by the driver (a
        merge folded them into its bucket). With ``drop``, the cancels of the range leave
        memory (returns how many); without, those in memory stay (they are still answered)."""
        cdef int64_t removed = 0
        check_ids(start, 0)
        check_ids(end, 0)
        if start > end:
            raise ValueError(f"empty ledger range {start}..{end}")
        if drop:
            removed = self.cancelled.remove_ledgers(start, end)
            if removed:
                self.cancelled.compact()
        self.evicted.add(start, end)
        self.evicted_max = self.evicted.max
        return removed

    def restore_evicted(self, ledgers, entries, int64_t start=0,
                        int64_t end=0x7FFFFFFFFFFFFFFF) -> int:
        """Take back the evicted cancels of ledgers ``start..end`` (default: all of them) from
        the driver's durable record (ascending, as two int64 arrays; positions outside that
        span or the evicted ranges, or at or below the mark, are skipped, and so are
        rescheduled ones: a move is newer than a cancel folded before it); returns how many
        came back. The span is not evicted afterwards."""
        ledger_column = np.ascontiguousarray(ledgers, dtype=np.int64)
        entry_column = np.ascontiguousarray(entries, dtype=np.int64)
        if len(ledger_column) != len(entry_column):
            raise ValueError("ledgers and entries differ in length")
        if not 0 <= start <= end:
            raise ValueError(f"empty ledger range {start}..{end}")
        cdef const int64_t[:] ls = ledger_column
        cdef const int64_t[:] es = entry_column
        cdef const uint8_t[:] keep = self.evicted.mask(ledger_column).view(np.uint8)
        cdef Py_ssize_t i
        cdef int64_t restored = 0
        for i in range(ls.shape[0]):
            if keep[i] and start <= ls[i] <= end:
                check_ids(ls[i], es[i])
                if not self.acked(ls[i], es[i]) and not (
                        self.moved and (ls[i], es[i]) in self.moved):
                    restored += self.cancelled.cadd(ls[i], es[i])
        self.evicted.remove(start, end)
        self.evicted_max = self.evicted.max
        return restored

    def evicted_ranges(self) -> list:
        """The ranges whose cancels are evicted, ascending."""
        return list(self.evicted)

    def evicted_mask(self, ledgers):
        """Whether each ledger lies in an evicted range."""
        return self.evicted.mask(ledgers)

    def override_of(self, int64_t ledger, int64_t entry):
        """The override an add of the position meets: None, ``"cancelled"``, or the
        rescheduled deliver time (at or below the mark: None, the mark decides). Call
        :meth:`needs_restore` first: evicted cancels are not seen here."""
        if self.acked(ledger, entry):
            return None
        if self.cancelled.count and self.cancelled.ccontains(ledger, entry):
            return "cancelled"
        if self.moved:
            return self.moved.get((ledger, entry))
        return None

    def override_record(self) -> tuple:
        """The overrides for the manifest: ``(cancelled_ledgers, cancelled_entries, ((ledger,
        entry, time), ...))``: the cancelled positions as two int64 arrays and the moved ones
        as a tuple, both ascending (no per-entry Python objects)."""
        ledgers, entries = self.cancelled.positions()
        return ledgers, entries, tuple((p[0], p[1], t) for p, t in sorted(self.moved.items()))

    def untrack_ledgers(self, int64_t start, int64_t end) -> int:
        """Untrack every position of ledgers ``start..end``; return how many."""
        self.mutable_dirty = True
        return self.index.remove_ledgers(start, end)

    # -- add --------------------------------------------------------------------------------

    cdef inline void note_deliver_at(self, int64_t deliver_at) noexcept:
        if deliver_at < self.highest - self._tick:
            self.fixed_delay = False
        if deliver_at > self.highest:
            self.highest = deliver_at

    cdef int cadd(self, int64_t ledger, int64_t entry, int64_t deliver_at,
                  int64_t cutoff) except -1:
        cdef bint sealed, to_mutable
        cdef object moved_to
        if ledger < self.mark_ledger or (ledger == self.mark_ledger and entry <= self.mark_entry):
            # Acknowledged: never delivered nor tracked, due or not (checked before expiry).
            self.n_add_calls += 1
            self.n_acked_on_add += 1
            return 4
        if self.cancelled.count and self.cancelled.ccontains(ledger, entry):
            self.n_add_calls += 1
            self.n_refused_cancelled += 1
            return 5
        if (ledger <= self.evicted_max and not self.index.ccontains(ledger, entry)
                and ledger in self.evicted):
            return 6  # nothing done: the driver restores the evicted cancels, then again
        if self.moved:
            moved_to = self.moved.get((ledger, entry))
            if moved_to is not None:
                deliver_at = moved_to
        if deliver_at < 0 or deliver_at <= cutoff:
            # Expiry before dedup: a due re-add untracks (Pulsar #26230).
            self.n_add_calls += 1
            self.fixed_delay = False
            self.n_rejected += 1
            if self.index.count and self.untrack(ledger, entry):
                self.n_untracked_due += 1
                self.stale.add((ledger, entry))
                if self.shadow:
                    self.shadow.discard((ledger, entry))
            return 0
        if self.index.ccontains(ledger, entry):
            self.n_add_calls += 1
            self.n_duplicates += 1
            self.note_deliver_at(deliver_at)
            return 2
        sealed = ledger <= self.max_sealed_end and self.in_sealed_range(ledger)
        to_mutable = not sealed and ledger >= self.mutable_end
        if to_mutable and ledger > self.mutable_end:
            if self.mutable.n >= self.min_index_count:  # policy.bucket_is_full, inline
                return 3
            if self.mutable_start >= 0 and self.crosses_sealed(ledger):
                # A bucket never spans a sealed range (after a reopen, sealed buckets can lie
                # above the mutable one): seal what there is first, or restart the range.
                if self.mutable.n:
                    return 3
                self.mutable_start = self.mutable_end = -1
        self.n_add_calls += 1
        if self.stale and (ledger, entry) in self.stale:
            # An old node may remain (a due re-add): purge it first. (A position at or below
            # the mark never gets here, so a mark-deleted node is never re-tracked.)
            self.mutable.remove_position(ledger, entry)
            self.direct.remove_position(ledger, entry)
            self.stale.discard((ledger, entry))
        if to_mutable:
            self.mutable.cpush(deliver_at, ledger, entry)
            if self.mutable_start < 0:
                self.mutable_start = ledger
            self.mutable_end = ledger
        else:
            self.direct.cpush(deliver_at, ledger, entry)
            self.n_direct += 1
            if sealed:
                self.shadow.add((ledger, entry))
        self.index.cadd(ledger, entry)
        self.n_added += 1
        self.note_deliver_at(deliver_at)
        return 1

    def add(self, ledger, entry, deliver_at, now) -> int:
        """Track ``(ledger, entry)`` until ``deliver_at``; see the class doc for the result."""
        cdef int64_t c_ledger = as_i64(ledger)
        cdef int64_t c_entry = as_i64(entry)
        cdef int64_t c_deliver_at = as_i64(deliver_at)
        cdef int64_t c_now = as_i64(now)
        check_ids(c_ledger, c_entry)
        return self.cadd(c_ledger, c_entry, c_deliver_at, self.cutoff(c_now))

    def add_many(self, const int64_t[:] ledgers not None, const int64_t[:] entries not None,
                 const int64_t[:] deliver_ats not None, now, out not None, Py_ssize_t start):
        """``add`` elements ``start..`` in order, writing ``out[i]`` (True = do not deliver:
        tracked, already tracked, or at or below the mark).

        Returns the index of the first element that needs a seal first or its evicted cancels
        back (code 6; nothing done for it), or the length when all were added. With
        ``start == 0`` everything is validated first.
        """
        cdef Py_ssize_t k = ledgers.shape[0]
        cdef Py_ssize_t i
        cdef int code
        cdef int64_t cutoff = self.cutoff(as_i64(now))
        cdef uint8_t[::1] view = out.view(np.uint8)
        if entries.shape[0] != k or deliver_ats.shape[0] != k or view.shape[0] != k:
            raise ValueError(
                f"add_many needs sequences of equal length, got {k}, {entries.shape[0]}, "
                f"{deliver_ats.shape[0]}")
        if start == 0:
            for i in range(k):
                if ledgers[i] < 0 or entries[i] < 0 or entries[i] > MAX_ENTRY:
                    raise ValueError(
                        f"element {i}: bad position ({ledgers[i]}, {entries[i]}); need "
                        f"ledger_id >= 0 and 0 <= entry_id < 2**32")
        for i in range(start, k):
            code = self.cadd(ledgers[i], entries[i], deliver_ats[i], cutoff)
            if code == 3 or code == 6:
                return i
            view[i] = code != 0
        return k

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
