# LedgerIndex: the dedup index of tracked positions, one compact set of entry ids per ledger.
#
# How it works. An open-addressing hash table (linear probing, power-of-two capacity) maps a
# ledger id to an LSet. An LSet is a *dense bitset* over [base, base + 64 * nwords): entries of
# one ledger are written by one producer in order, and a dispatcher delays a good share of them,
# so a bitset costs well under a byte per tracked entry where roaring array containers cost two
# (and pyroaring's objects a hundred bytes more per ledger). When a ledger's entries are too
# sparse for a bitset (its span would exceed SPARSE_BITS_PER_ENTRY bits per entry beyond a small
# floor), the LSet switches for good to a pyroaring BitMap, so memory stays bounded for any
# pattern. Lookups, adds and removes are C calls with no Python objects on the dense path.
#
# Ledgers whose set becomes empty keep their slot (words freed) until ``compact`` rebuilds the
# table, which callers do lazily (O(1) amortized), so delivery never rehashes.
#
# Invariants (_check): count == sum of per-ledger counts == popcount of the bitsets plus the
# sparse cardinalities; every bitset word range lies in [0, 2**32); a slot's bitset and sparse
# set are never both present; the table's load stays under 3/4.

from cpython.ref cimport PyObject, Py_XDECREF, Py_INCREF
from libc.stdint cimport uint32_t, uint64_t
from libc.stdlib cimport calloc, free, malloc, realloc
from libc.string cimport memcpy, memset

import array as _array

cdef extern from *:
    """
    #if defined(__GNUC__) || defined(__clang__)
    #define di_popcount64(x) __builtin_popcountll(x)
    #else
    static int di_popcount64(unsigned long long x) {
        int n = 0; while (x) { x &= x - 1; n++; } return n;
    }
    #endif
    """
    int di_popcount64(unsigned long long x) nogil

ctypedef struct LSet:
    int64_t ledger          # -1: free slot
    int64_t count
    uint64_t* words
    int64_t base            # first entry covered (a multiple of 64)
    int64_t nwords
    PyObject* sparse        # owned BitMap reference when sparse, else NULL

cdef enum:
    SPARSE_BITS_PER_ENTRY = 32     # a bitset may spend at most this many bits per entry...
    SPARSE_FLOOR_WORDS = 64        # ...beyond a floor of 4096 bits per ledger


cdef inline uint64_t ledger_hash(int64_t ledger) noexcept nogil:
    cdef uint64_t h = <uint64_t> ledger * <uint64_t> 0x9E3779B97F4A7C15
    return h ^ (h >> 29)


@cython.final
cdef class LedgerIndex:
    """Set of tracked positions ``(ledger, entry)``: dense bitsets per ledger, sparse fallback.

    ``add``/``discard`` return whether the set changed. ``len`` is the number of positions.
    """

    cdef LSet* slots
    cdef Py_ssize_t cap
    cdef Py_ssize_t used          # slots holding a ledger (empty sets included)
    cdef Py_ssize_t nonempty      # ledgers with count > 0
    cdef Py_ssize_t count
    cdef LSet* last               # cache: slot of the most recent lookup

    def __cinit__(self):
        self.slots = NULL
        self.cap = 0
        self.used = self.nonempty = self.count = 0
        self.last = NULL

    def __dealloc__(self):
        self.free_all()

    cdef void free_all(self) noexcept:
        cdef Py_ssize_t i
        if self.slots != NULL:
            for i in range(self.cap):
                if self.slots[i].ledger >= 0:
                    free(self.slots[i].words)
                    Py_XDECREF(self.slots[i].sparse)
            free(self.slots)
        self.slots = NULL
        self.cap = self.used = self.nonempty = self.count = 0
        self.last = NULL

    # -- table --------------------------------------------------------------------------------

    cdef LSet* find(self, int64_t ledger) noexcept:
        cdef Py_ssize_t i, mask
        cdef LSet* s
        if self.last != NULL and self.last.ledger == ledger:
            return self.last
        if self.cap == 0:
            return NULL
        mask = self.cap - 1
        i = <Py_ssize_t> (ledger_hash(ledger) & <uint64_t> mask)
        while True:
            s = &self.slots[i]
            if s.ledger == ledger:
                self.last = s
                return s
            if s.ledger < 0:
                return NULL
            i = (i + 1) & mask

    cdef int rehash(self, Py_ssize_t new_cap, bint drop_empty) except -1:
        cdef LSet* old = self.slots
        cdef Py_ssize_t old_cap = self.cap, i, j, mask = new_cap - 1
        cdef LSet* fresh = <LSet*> malloc(<size_t> new_cap * sizeof(LSet))
        if fresh == NULL:
            raise MemoryError()
        for i in range(new_cap):
            fresh[i].ledger = -1
        self.used = 0
        for i in range(old_cap):
            if old[i].ledger < 0:
                continue
            if drop_empty and old[i].count == 0:
                free(old[i].words)
                Py_XDECREF(old[i].sparse)
                continue
            j = <Py_ssize_t> (ledger_hash(old[i].ledger) & <uint64_t> mask)
            while fresh[j].ledger >= 0:
                j = (j + 1) & mask
            fresh[j] = old[i]
            self.used += 1
        free(old)
        self.slots = fresh
        self.cap = new_cap
        self.last = NULL
        return 0

    cdef LSet* find_or_insert(self, int64_t ledger) except NULL:
        cdef LSet* s = self.find(ledger)
        cdef Py_ssize_t i, mask
        if s != NULL:
            return s
        if (self.used + 1) * 4 > self.cap * 3:
            self.rehash(16 if self.cap == 0 else self.cap * 2, False)
        mask = self.cap - 1
        i = <Py_ssize_t> (ledger_hash(ledger) & <uint64_t> mask)
        while self.slots[i].ledger >= 0:
            i = (i + 1) & mask
        s = &self.slots[i]
        s.ledger = ledger
        s.count = 0
        s.words = NULL
        s.base = 0
        s.nwords = 0
        s.sparse = NULL
        self.used += 1
        self.last = s
        return s

    # -- one set ------------------------------------------------------------------------------

    cdef int make_sparse(self, LSet* s) except -1:
        """Move a ledger's entries from its bitset into a pyroaring BitMap, for good."""
        values = self.dense_range(s, 0, 0xFFFFFFFF)
        bm = BitMap(values)
        Py_INCREF(bm)
        s.sparse = <PyObject*> bm
        free(s.words)
        s.words = NULL
        s.nwords = 0
        s.base = 0
        return 0

    cdef int grow(self, LSet* s, int64_t entry) except -1:
        """Widen the bitset to cover ``entry`` (upward growth keeps 50% slack)."""
        cdef int64_t lo = entry & ~(<int64_t> 63)
        cdef int64_t new_base, new_end, end, n
        cdef uint64_t* fresh
        if s.words == NULL:
            s.words = <uint64_t*> calloc(1, sizeof(uint64_t))
            if s.words == NULL:
                raise MemoryError()
            s.base = lo
            s.nwords = 1
            return 0
        end = s.base + 64 * s.nwords
        new_base = lo if lo < s.base else s.base
        new_end = lo + 64 if lo + 64 > end else end
        n = (new_end - new_base) >> 6
        if n > SPARSE_FLOOR_WORDS and n * 64 > SPARSE_BITS_PER_ENTRY * (s.count + 1):
            self.make_sparse(s)
            return 0
        if new_base == s.base:  # growing upward: amortize with slack, within the limits
            n = max(n, s.nwords + (s.nwords >> 1) + 1)
            if (n * 64 > SPARSE_BITS_PER_ENTRY * (s.count + 1) and n > SPARSE_FLOOR_WORDS):
                n = (new_end - new_base) >> 6
            if new_base + 64 * n > 0x100000000:
                n = (0x100000000 - new_base) >> 6
            fresh = <uint64_t*> realloc(s.words, <size_t> n * sizeof(uint64_t))
            if fresh == NULL:
                raise MemoryError()
            memset(fresh + s.nwords, 0, <size_t> (n - s.nwords) * sizeof(uint64_t))
        else:
            fresh = <uint64_t*> calloc(<size_t> n, sizeof(uint64_t))
            if fresh == NULL:
                raise MemoryError()
            memcpy(fresh + ((s.base - new_base) >> 6), s.words,
                   <size_t> s.nwords * sizeof(uint64_t))
            free(s.words)
        s.words = fresh
        s.base = new_base
        s.nwords = n
        return 0

    cdef int cadd(self, int64_t ledger, int64_t entry) except -1:
        """Add a position; 1 if it was new, else 0."""
        cdef LSet* s = self.find_or_insert(ledger)
        cdef int64_t off
        cdef uint64_t bit
        if s.sparse == NULL:
            off = entry - s.base
            if s.words == NULL or off < 0 or off >= 64 * s.nwords:
                self.grow(s, entry)
        if s.sparse != NULL:
            bm = <object> s.sparse
            if entry in bm:
                return 0
            bm.add(entry)
        else:
            off = entry - s.base
            bit = (<uint64_t> 1) << (off & 63)
            if s.words[off >> 6] & bit:
                return 0
            s.words[off >> 6] |= bit
        if s.count == 0:
            self.nonempty += 1
        s.count += 1
        self.count += 1
        return 1

    cdef inline void prefetch_slot(self, int64_t ledger) noexcept:
        """Start loading the first table slot ``ledger`` probes (a batch's membership tests
        run a few keys behind their prefetches, so the cache misses overlap)."""
        if self.cap:
            DI_PREFETCH(&self.slots[<Py_ssize_t> (ledger_hash(ledger) & <uint64_t> (self.cap - 1))])

    cdef inline LSet* prefetch_word(self, int64_t ledger, int64_t entry) noexcept:
        """Start loading the bitset word of ``(ledger, entry)`` (its slot should be cached);
        return the ledger's slot (NULL: none) for :meth:`cdiscard_in`. The slot stays valid
        until the next insert or compaction (a discard never moves a slot)."""
        cdef LSet* s = self.find(ledger)
        cdef int64_t off
        if s != NULL and s.words != NULL:
            off = entry - s.base
            if 0 <= off < 64 * s.nwords:
                DI_PREFETCH(&s.words[off >> 6])
        return s

    cdef inline bint ccontains(self, int64_t ledger, int64_t entry) except -1:
        cdef LSet* s = self.find(ledger)
        cdef int64_t off
        if s == NULL or s.count == 0:
            return False
        if s.sparse != NULL:
            return entry in <object> s.sparse
        off = entry - s.base
        if off < 0 or off >= 64 * s.nwords:
            return False
        return (s.words[off >> 6] >> (off & 63)) & 1

    cdef void emptied(self, LSet* s) noexcept:
        free(s.words)
        s.words = NULL
        s.nwords = 0
        self.nonempty -= 1

    cdef int cdiscard(self, int64_t ledger, int64_t entry) except -1:
        """Remove a position; 1 if it was there, else 0."""
        return self.cdiscard_in(self.find(ledger), entry)

    cdef int cdiscard_in(self, LSet* s, int64_t entry) except -1:
        """:meth:`cdiscard` of ``entry`` in the ledger whose slot is ``s`` (NULL: absent), as
        :meth:`find` or :meth:`prefetch_word` returned it."""
        cdef int64_t off
        cdef uint64_t bit
        if s == NULL or s.count == 0:
            return 0
        if s.sparse != NULL:
            bm = <object> s.sparse
            if entry not in bm:
                return 0
            bm.discard(entry)
        else:
            off = entry - s.base
            if off < 0 or off >= 64 * s.nwords:
                return 0
            bit = (<uint64_t> 1) << (off & 63)
            if not (s.words[off >> 6] & bit):
                return 0
            s.words[off >> 6] &= ~bit
        s.count -= 1
        self.count -= 1
        if s.count == 0:
            self.emptied(s)
        return 1

    # -- Python API ---------------------------------------------------------------------------

    def add(self, int64_t ledger, int64_t entry) -> bool:
        """Add ``(ledger, entry)``; True if it was not there."""
        check_ids(ledger, entry)
        return self.cadd(ledger, entry) == 1

    def discard(self, int64_t ledger, int64_t entry) -> bool:
        """Remove ``(ledger, entry)``; True if it was there."""
        check_ids(ledger, entry)
        return self.cdiscard(ledger, entry) == 1

    def add_many(self, const int64_t[:] ledgers not None, const int64_t[:] entries not None) -> int:
        """Add every ``(ledgers[i], entries[i])``, validated as a whole first; return how many
        were new."""
        cdef Py_ssize_t i, n = ledgers.shape[0], added = 0
        if entries.shape[0] != n:
            raise ValueError(f"ledgers and entries differ in length ({n} != {entries.shape[0]})")
        for i in range(n):
            check_ids(ledgers[i], entries[i])
        for i in range(n):
            added += self.cadd(ledgers[i], entries[i])
        return added

    def discard_many(self, const int64_t[:] ledgers not None,
                     const int64_t[:] entries not None) -> int:
        """Remove every ``(ledgers[i], entries[i])``, validated as a whole first; return how
        many were there."""
        cdef Py_ssize_t i, n = ledgers.shape[0], removed = 0
        if entries.shape[0] != n:
            raise ValueError(f"ledgers and entries differ in length ({n} != {entries.shape[0]})")
        for i in range(n):
            check_ids(ledgers[i], entries[i])
        for i in range(n):
            removed += self.cdiscard(ledgers[i], entries[i])
        return removed

    def contains(self, int64_t ledger, int64_t entry) -> bool:
        """Whether ``(ledger, entry)`` is in the set."""
        check_ids(ledger, entry)
        return self.ccontains(ledger, entry)

    def contains_many(self, ledgers, entries):
        """For each position, whether it is in the set: a bool array (the ids are not
        validated; a position out of range is simply absent)."""
        cdef const int64_t[::1] ls = np.ascontiguousarray(ledgers, dtype=np.int64)
        cdef const int64_t[::1] es = np.ascontiguousarray(entries, dtype=np.int64)
        cdef Py_ssize_t i, k = ls.shape[0]
        if es.shape[0] != k:
            raise ValueError("ledgers and entries differ in length")
        out = np.zeros(k, dtype=np.bool_)
        cdef uint8_t[::1] view = out.view(np.uint8)
        for i in range(k):
            # Out of range: absent (a sparse ledger's BitMap would raise on such an id).
            if es[i] < 0 or es[i] > MAX_ENTRY:
                continue
            view[i] = self.ccontains(ls[i], es[i])
        return out

    def __len__(self) -> int:
        return self.count

    @property
    def num_ledgers(self) -> int:
        """Ledgers holding at least one position."""
        return self.nonempty

    def ledger_count(self, int64_t ledger) -> int:
        """Positions of ``ledger`` in the set."""
        cdef LSet* s = self.find(ledger)
        return 0 if s == NULL else s.count

    def ledgers(self) -> list:
        """Ledgers holding at least one position, ascending."""
        cdef Py_ssize_t i
        out = [self.slots[i].ledger for i in range(self.cap)
               if self.slots[i].ledger >= 0 and self.slots[i].count > 0]
        out.sort()
        return out

    def ledger_counts(self) -> tuple:
        """``(ledgers, counts)`` int64 arrays: each non-empty ledger, ascending, and how many
        positions it holds."""
        cdef Py_ssize_t i, k = 0
        ledgers = np.empty(self.nonempty, dtype=np.int64)
        counts = np.empty(self.nonempty, dtype=np.int64)
        cdef int64_t[::1] ls = ledgers, cs = counts
        for i in range(self.cap):
            if self.slots[i].ledger >= 0 and self.slots[i].count > 0:
                ls[k] = self.slots[i].ledger
                cs[k] = self.slots[i].count
                k += 1
        order = np.argsort(ledgers[:k], kind="stable")
        return ledgers[:k][order], counts[:k][order]

    def positions(self) -> tuple:
        """Every position, ascending: ``(ledgers, entries)`` int64 arrays (the whole set in
        two arrays, without a Python object per ledger for the dense ones)."""
        order, counts = self.ledger_counts()
        entries = np.empty(int(counts.sum()), dtype=np.int64)
        cdef int64_t[::1] out = entries
        cdef Py_ssize_t k = 0, n
        cdef int64_t w, ledger
        cdef uint64_t word
        cdef LSet* s
        for ledger in order.tolist():
            s = self.find(ledger)
            if s.sparse != NULL:
                part = np.frombuffer((<object> s.sparse).to_array(), dtype=np.uint32)
                n = len(part)
                entries[k:k + n] = part
                k += n
                continue
            for w in range(s.nwords):
                word = s.words[w]
                while word:
                    out[k] = s.base + (w << 6) + di_ctzll(word)
                    word &= word - 1
                    k += 1
        return np.repeat(order, counts), entries

    def bitmap(self, int64_t ledger, int64_t first=0, int64_t last=0xFFFFFFFF):
        """The entries of ``ledger`` in ``[first, last]`` as a new pyroaring BitMap (empty if
        none)."""
        cdef LSet* s = self.find(ledger)
        if s == NULL or s.count == 0 or last < first:
            return BitMap()
        if s.sparse != NULL:
            out = (<object> s.sparse).copy()
            if first > 0:
                out.remove_range(0, first)
            if last < 0xFFFFFFFF:
                out.remove_range(last + 1, 0x100000000)
            return out
        return BitMap(self.dense_range(s, first, last))

    cdef object dense_range(self, LSet* s, int64_t low, int64_t high):
        """The entries of a dense ledger in ``[low, high]`` as a uint32 array.array; only the
        words overlapping the range are scanned (a read window must not cost the whole ledger)."""
        cdef int64_t w_lo = (low - s.base) >> 6 if low > s.base else 0
        cdef int64_t w_hi = (high - s.base) >> 6 if high < s.base + 64 * s.nwords else s.nwords - 1
        cdef int64_t cap = high - low + 1 if high - low + 1 < s.count else s.count
        cdef int64_t w, n = 0, value
        cdef uint64_t word
        out = _array.array("I", bytes(4 * cap))
        cdef uint32_t[::1] view = out
        for w in range(w_lo, w_hi + 1):
            word = s.words[w]
            while word:
                value = s.base + (w << 6) + di_ctzll(word)
                word &= word - 1
                if low <= value <= high:
                    view[n] = <uint32_t> value
                    n += 1
        del view
        del out[n:]
        return out

    def restore(self, int64_t ledger, entries) -> int:
        """Add every entry of ``entries`` (a BitMap or integer array) to ``ledger``; return
        how many were new."""
        cdef const uint32_t[::1] values
        if isinstance(entries, BitMap):
            arr = np.array(entries.to_array(), dtype=np.uint32)
        else:
            arr = np.ascontiguousarray(entries, dtype=np.uint32)
        values = arr
        if values.shape[0] == 0:
            return 0
        return self.crestore(ledger, &values[0], values.shape[0])

    cdef Py_ssize_t crestore(self, int64_t ledger, const uint32_t* values,
                             Py_ssize_t k) except -1:
        """Add ``values[:k]`` (entries, as snapshots give them) to ``ledger``; return how many
        were new. A bitset ledger is grown once to the values' span and its bits set in one
        pass (recovery's hot loop); a sparse one takes them one by one."""
        cdef Py_ssize_t i, added = 0
        cdef int64_t off, base
        cdef uint32_t low, high
        cdef uint64_t bit
        cdef uint64_t* words
        cdef LSet* s
        if k == 0:
            return 0
        if ledger < 0:
            raise ValueError(f"ledger_id must be >= 0, got {ledger}")
        s = self.find_or_insert(ledger)
        low = high = values[0]
        for i in range(1, k):  # no order is assumed: the span bounds every write below
            if values[i] < low:
                low = values[i]
            elif values[i] > high:
                high = values[i]
        if s.sparse == NULL and (s.words == NULL or low < s.base):
            self.grow(s, low)
        if s.sparse == NULL and high >= s.base + 64 * s.nwords:
            self.grow(s, high)
        if s.sparse != NULL:
            for i in range(k):
                added += self.cadd(ledger, values[i])
            return added
        words = s.words
        base = s.base
        for i in range(k):
            off = values[i] - base
            bit = (<uint64_t> 1) << (off & 63)
            if not (words[off >> 6] & bit):
                words[off >> 6] |= bit
                added += 1
        if added:
            if s.count == 0:
                self.nonempty += 1
            s.count += added
            self.count += added
        return added

    def remove_upto(self, int64_t ledger, int64_t entry) -> int:
        """Remove every position ``<= (ledger, entry)``; return how many."""
        cdef Py_ssize_t i, w, removed = 0
        cdef LSet* s
        cdef int64_t off, before
        for i in range(self.cap):
            s = &self.slots[i]
            if s.ledger < 0 or s.ledger > ledger or s.count == 0:
                continue
            if s.ledger < ledger or entry >= 0xFFFFFFFF:
                removed += s.count
                self.count -= s.count
                s.count = 0
                if s.sparse != NULL:
                    (<object> s.sparse).clear()
                self.emptied(s)
                continue
            before = s.count
            if s.sparse != NULL:
                bm = <object> s.sparse
                bm.remove_range(0, entry + 1)
                s.count = len(bm)
            else:
                off = entry + 1 - s.base       # clear bits [0, off)
                if off > 0:
                    for w in range(s.nwords):
                        if (w + 1) * 64 <= off:
                            s.words[w] = 0
                        elif w * 64 < off:
                            s.words[w] &= ~(((<uint64_t> 1) << (off - w * 64)) - 1)
                    s.count = 0
                    for w in range(s.nwords):
                        s.count += di_popcount64(s.words[w])
            removed += before - s.count
            self.count -= before - s.count
            if s.count == 0:
                self.emptied(s)
        return removed

    def remove_ledgers(self, int64_t start, int64_t end) -> int:
        """Remove every position of ledgers ``start..end``; return how many."""
        cdef Py_ssize_t i, removed = 0
        cdef LSet* s
        for i in range(self.cap):
            s = &self.slots[i]
            if s.ledger < start or s.ledger > end or s.count == 0:
                continue
            removed += s.count
            self.count -= s.count
            s.count = 0
            if s.sparse != NULL:
                (<object> s.sparse).clear()
            self.emptied(s)
        return removed

    def compact(self) -> None:
        """Drop the slots of emptied ledgers (rebuilds the table)."""
        cdef Py_ssize_t new_cap = 16
        while (self.nonempty + 1) * 4 > new_cap * 3:
            new_cap *= 2
        if self.cap:
            self.rehash(new_cap, True)

    cdef inline bint wants_compaction(self) noexcept:
        return self.used > 64 and self.used > 2 * self.nonempty

    def clear(self) -> None:
        """Remove everything."""
        self.free_all()

    def memory_bytes(self) -> int:
        """Resident bytes: the table, the bitsets, and sparse BitMaps."""
        cdef Py_ssize_t i, total = self.cap * sizeof(LSet)
        for i in range(self.cap):
            if self.slots[i].ledger >= 0:
                total += self.slots[i].nwords * 8
                if self.slots[i].sparse != NULL:
                    total += sys.getsizeof(<object> self.slots[i].sparse) + BITMAP_OVERHEAD
        return total

    def _check(self) -> None:
        """Assert the invariants listed at the top of this file."""
        cdef Py_ssize_t i, w, total = 0, nonempty = 0, used = 0, n
        cdef LSet* s
        for i in range(self.cap):
            s = &self.slots[i]
            if s.ledger < 0:
                continue
            used += 1
            if s.sparse != NULL:
                if s.words != NULL:
                    raise AssertionError(f"ledger {s.ledger}: both a bitset and a BitMap")
                n = len(<object> s.sparse)
            else:
                n = 0
                for w in range(s.nwords):
                    n += di_popcount64(s.words[w])
                if s.nwords and (s.base < 0 or s.base % 64 or s.base + 64 * s.nwords > 2**32):
                    raise AssertionError(f"ledger {s.ledger}: bad bitset range")
            if n != s.count:
                raise AssertionError(f"ledger {s.ledger}: count {s.count} != {n}")
            total += n
            nonempty += n > 0
            if self.find(s.ledger) != s:
                raise AssertionError(f"ledger {s.ledger} is not reachable by lookup")
        if total != self.count or nonempty != self.nonempty or used != self.used:
            raise AssertionError(
                f"totals: count {self.count}/{total}, ledgers {self.nonempty}/{nonempty}, "
                f"slots {self.used}/{used}")
        if self.cap and self.used * 4 > self.cap * 3:
            raise AssertionError("hash table overloaded")
