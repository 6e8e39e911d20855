# _BucketState: the fields of BucketCore (see _bucket.pxi, whose header explains the design),
# with the parts every other part builds on: construction, time (the cutoff), the registered
# sealed ranges and the dedup index's calls. BucketCore is split over three files, each one
# class of a chain (_BucketState <- _BucketOverrides <- BucketCore), so that no file holds all of
# it; only BucketCore is exported, and the chain is an implementation detail.
#
# Cdef methods here are final: BucketCore's calls to them are direct C calls, as they were when
# it was one class (the chain adds no virtual dispatch to add, poll or contains).
#
# Invariants: see _bucket.pxi (BucketCore._check checks the fields declared here).


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


cdef class _BucketState:
    """BucketCore's fields and its construction, time, sealed ranges and index calls."""

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

    @cython.final
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

    def in_sealed_range(self, int64_t ledger) -> bool:
        """Whether ``ledger`` lies inside a registered sealed range."""
        return self.sealed_holds(ledger)

    @cython.final
    cdef bint sealed_holds(self, int64_t ledger) except -1:
        # in_sealed_range for C callers (the add path): a direct call.
        if ledger > self.max_sealed_end:
            return False
        at = self.ranges.bisect_right(ledger)
        return bool(at) and self.ranges.peekitem(at - 1)[1] >= ledger

    @cython.final
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

    @cython.final
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

    def tracked_mask_order(self, ledgers, entries):
        """An order of these rows in which slices of them cost ``tracked_mask`` least, or None
        when any order does as well (reads no state). Here None: each lookup is a probe of
        its ledger's slot, whatever the order (the pure twin's copies members per call)."""
        return None

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
