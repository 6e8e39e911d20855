# TripleHeap: a 4-ary min-heap of signed int64 triples (time, ledger, entry).
#
# How it works. Nodes live in one malloc'd array of 24-byte structs (no Python object per
# element); children of i are 4i+1 .. 4i+4 and order is lexicographic on the triple, exactly
# like Python tuple order. Four children per node halve the depth of a binary heap, and the
# children sit side by side in two cache lines. Sifts move a "hole" instead of swapping (one
# store per level, as in Pulsar #26010), and sift-down prefetches the next level because pops on
# a large heap are bound by cache misses, not by comparisons (setup.py also turns off gcc's
# if-conversion, whose cmovs serialize those misses). The array grows by doubling, then by 1.5x past
# GROW_LINEAR nodes; realloc of a large block is an mremap, so unused capacity is never
# touched and costs no resident memory. Arrays of 1 MiB and more get a mapping of their own
# (mmap/mremap on Linux), so growing never copies and never leaves an old copy resident in the
# malloc heap, and freeing returns the memory to the OS. It shrinks by half when a quarter full.
#
# Invariants (checked by _check): 0 <= n <= cap; data is non-NULL iff cap > 0; every parent
# compares <= its children.

from libc.stdlib cimport realloc, free

cdef extern from *:
    """
    #if defined(__GNUC__) || defined(__clang__)
    #define DI_PREFETCH(p) __builtin_prefetch((p))
    #else
    #define DI_PREFETCH(p) ((void)0)
    #endif

    #if defined(__linux__)
    #ifndef _GNU_SOURCE
    #define _GNU_SOURCE
    #endif
    #include <string.h>
    #include <sys/mman.h>
    #define DI_MAP_MIN ((size_t)1 << 20)
    /* Resize a block whose placement follows its size: mapped iff >= DI_MAP_MIN bytes. */
    static void* di_resize(void* p, size_t old_bytes, size_t new_bytes) {
        int old_mapped = p != NULL && old_bytes >= DI_MAP_MIN;
        int new_mapped = new_bytes >= DI_MAP_MIN;
        void* q;
        if (new_bytes == 0) {
            if (old_mapped) munmap(p, old_bytes); else free(p);
            return NULL;
        }
        if (old_mapped && new_mapped) {
            q = mremap(p, old_bytes, new_bytes, MREMAP_MAYMOVE);
            return q == MAP_FAILED ? NULL : q;
        }
        if (!old_mapped && !new_mapped) return realloc(p, new_bytes);
        if (new_mapped) {
            q = mmap(NULL, new_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
            if (q == MAP_FAILED) return NULL;
        } else {
            q = malloc(new_bytes);
            if (q == NULL) return NULL;
        }
        if (p != NULL) {
            memcpy(q, p, old_bytes < new_bytes ? old_bytes : new_bytes);
            if (old_mapped) munmap(p, old_bytes); else free(p);
        }
        return q;
    }
    #else
    static void* di_resize(void* p, size_t old_bytes, size_t new_bytes) {
        (void)old_bytes;
        if (new_bytes == 0) { free(p); return NULL; }
        return realloc(p, new_bytes);
    }
    #endif
    """
    void DI_PREFETCH(const void *p) nogil
    void* di_resize(void* p, size_t old_bytes, size_t new_bytes) nogil

ctypedef struct Triple:
    int64_t time
    int64_t ledger
    int64_t entry

cdef enum:
    INITIAL_CAPACITY = 16
    GROW_LINEAR = 1 << 20
    SHRINK_FLOOR = 1024


cdef inline bint triple_lt(const Triple* a, const Triple* b) noexcept nogil:
    if a.time != b.time:
        return a.time < b.time
    if a.ledger != b.ledger:
        return a.ledger < b.ledger
    return a.entry < b.entry


@cython.final
cdef class TripleHeap:
    """Min-heap of ``(time, ledger, entry)`` int64 triples in one flat array.

    ``push``/``pop`` are O(log n); ``pop_due`` and ``push_many`` move whole batches per call.
    Popping or peeking an empty heap raises ``IndexError``.
    """

    cdef Triple* data
    cdef Py_ssize_t n
    cdef Py_ssize_t cap

    def __cinit__(self):
        self.data = NULL
        self.n = 0
        self.cap = 0

    def __dealloc__(self):
        di_resize(self.data, <size_t> self.cap * sizeof(Triple), 0)
        self.data = NULL

    # -- memory -------------------------------------------------------------------------------

    cdef int _resize(self, Py_ssize_t new_cap) except -1:
        cdef Triple* p
        if new_cap == 0:
            self.cclear()
            return 0
        p = <Triple*> di_resize(self.data, <size_t> self.cap * sizeof(Triple),
                                <size_t> new_cap * sizeof(Triple))
        if p == NULL:
            raise MemoryError(f"TripleHeap cannot grow to {new_cap} entries")
        self.data = p
        self.cap = new_cap
        return 0

    cdef int reserve(self, Py_ssize_t need) except -1:
        """Make room for ``need`` nodes in total."""
        cdef Py_ssize_t new_cap
        if need <= self.cap:
            return 0
        new_cap = self.cap if self.cap > 0 else INITIAL_CAPACITY
        while new_cap < need:
            new_cap = new_cap * 2 if new_cap < GROW_LINEAR else new_cap + new_cap // 2
        return self._resize(new_cap)

    cdef inline void _maybe_shrink(self) noexcept:
        # Best effort: a failed shrinking realloc leaves the (valid) larger block in place.
        cdef Triple* p
        cdef Py_ssize_t new_cap
        if self.cap > SHRINK_FLOOR and self.n < self.cap // 4:
            new_cap = self.cap // 2
            p = <Triple*> di_resize(self.data, <size_t> self.cap * sizeof(Triple),
                                    <size_t> new_cap * sizeof(Triple))
            if p != NULL:
                self.data = p
                self.cap = new_cap

    # -- core operations (C level, used by the tracker core) ----------------------------------

    cdef inline void _sift_up(self, Py_ssize_t i, Triple x) noexcept nogil:
        cdef Py_ssize_t parent
        cdef Triple* d = self.data
        while i > 0:
            parent = (i - 1) >> 2
            if not triple_lt(&x, &d[parent]):
                break
            d[i] = d[parent]
            i = parent
        d[i] = x

    cdef inline void _sift_down(self, Py_ssize_t i, Triple x) noexcept nogil:
        cdef Py_ssize_t n = self.n
        cdef Py_ssize_t first, last, best, c
        cdef Triple* d = self.data
        while True:
            first = 4 * i + 1
            if first >= n:
                break
            last = first + 4 if first + 4 <= n else n
            best = first
            for c in range(first + 1, last):
                if triple_lt(&d[c], &d[best]):
                    best = c
            if not triple_lt(&d[best], &x):
                break
            if 4 * best + 1 < n:
                DI_PREFETCH(&d[4 * best + 1])
                DI_PREFETCH(&d[4 * best + 3])
            d[i] = d[best]
            i = best
        d[i] = x

    cdef int cpush(self, int64_t time, int64_t ledger, int64_t entry) except -1:
        cdef Triple x
        if self.n == self.cap:
            self.reserve(self.n + 1)
        x.time = time
        x.ledger = ledger
        x.entry = entry
        self.n += 1
        self._sift_up(self.n - 1, x)
        return 0

    cdef inline Triple cpop(self) noexcept:
        """Remove and return the head. The caller guarantees n > 0."""
        cdef Triple top = self.data[0]
        self.n -= 1
        if self.n > 0:
            self._sift_down(0, self.data[self.n])
        return top

    cdef void _heapify(self) noexcept nogil:
        cdef Py_ssize_t i = (self.n - 2) // 4
        while i >= 0:
            self._sift_down(i, self.data[i])
            i -= 1

    cdef Py_ssize_t remove_position(self, int64_t ledger, int64_t entry) noexcept:
        """Drop every node at (ledger, entry); O(n). Returns how many were dropped."""
        cdef Py_ssize_t i, j = 0
        cdef Py_ssize_t removed
        for i in range(self.n):
            if self.data[i].ledger == ledger and self.data[i].entry == entry:
                continue
            if i != j:
                self.data[j] = self.data[i]
            j += 1
        removed = self.n - j
        if removed:
            self.n = j
            self._heapify()
            self._maybe_shrink()
        return removed

    cdef void cclear(self) noexcept:
        di_resize(self.data, <size_t> self.cap * sizeof(Triple), 0)
        self.data = NULL
        self.n = 0
        self.cap = 0

    # -- Python API ---------------------------------------------------------------------------

    def push(self, time, ledger, entry) -> None:
        """Insert the triple ``(time, ledger, entry)`` of ints (``OverflowError`` past int64)."""
        self.cpush(as_i64(time), as_i64(ledger), as_i64(entry))

    def push_many(self, const int64_t[:] times not None, const int64_t[:] ledgers not None,
                  const int64_t[:] entries not None) -> None:
        """Insert ``(times[i], ledgers[i], entries[i])`` for every i (int64 arrays of equal length).

        Large batches are appended and re-heapified in O(n + k); small ones are sifted in.
        """
        cdef Py_ssize_t k = times.shape[0]
        cdef Py_ssize_t i, start
        cdef Triple x
        if ledgers.shape[0] != k or entries.shape[0] != k:
            raise ValueError(
                f"push_many needs arrays of equal length, got {k}, {ledgers.shape[0]}, "
                f"{entries.shape[0]}")
        if k == 0:
            return
        self.reserve(self.n + k)
        start = self.n
        if k >= start:
            for i in range(k):
                x.time = times[i]
                x.ledger = ledgers[i]
                x.entry = entries[i]
                self.data[start + i] = x
            self.n = start + k
            self._heapify()
        else:
            for i in range(k):
                x.time = times[i]
                x.ledger = ledgers[i]
                x.entry = entries[i]
                self.n += 1
                self._sift_up(self.n - 1, x)

    def peek(self) -> tuple:
        """Return the smallest triple without removing it."""
        if self.n == 0:
            raise IndexError("peek from an empty TripleHeap")
        return di_int_triple(self.data[0].time, self.data[0].ledger, self.data[0].entry)

    def pop(self) -> tuple:
        """Remove and return the smallest triple."""
        cdef Triple top
        if self.n == 0:
            raise IndexError("pop from an empty TripleHeap")
        top = self.cpop()
        self._maybe_shrink()
        return di_int_triple(top.time, top.ledger, top.entry)

    def pop_due(self, cutoff, max_n) -> tuple:
        """Pop up to ``max_n`` heads whose time is ``<= cutoff``, in heap order.

        Returns three int64 numpy arrays ``(times, ledgers, entries)``.
        """
        cdef Py_ssize_t k = 0
        cdef Py_ssize_t room = 0
        cdef Triple* buf = NULL
        cdef Triple* grown
        cdef Triple top
        cdef int64_t[::1] ts, ls, es
        cdef Py_ssize_t i
        cdef int64_t c_cutoff = as_i64(cutoff)
        cdef int64_t c_max = as_i64(max_n)
        try:
            while k < c_max and self.n > 0 and self.data[0].time <= c_cutoff:
                if k == room:
                    room = 64 if room == 0 else room * 2
                    grown = <Triple*> realloc(buf, <size_t> room * sizeof(Triple))
                    if grown == NULL:
                        raise MemoryError()
                    buf = grown
                buf[k] = self.cpop()
                k += 1
            self._maybe_shrink()
            out_t = np.empty(k, dtype=np.int64)
            out_l = np.empty(k, dtype=np.int64)
            out_e = np.empty(k, dtype=np.int64)
            ts = out_t
            ls = out_l
            es = out_e
            for i in range(k):
                ts[i] = buf[i].time
                ls[i] = buf[i].ledger
                es[i] = buf[i].entry
        except BaseException:
            # Nothing popped may be lost: put the batch back before re-raising.
            for i in range(k):
                self.cpush(buf[i].time, buf[i].ledger, buf[i].entry)
            raise
        finally:
            free(buf)
        return out_t, out_l, out_e

    def remove(self, ledger, entry) -> int:
        """Remove every triple at position ``(ledger, entry)``; O(n). Returns the count removed."""
        return self.remove_position(as_i64(ledger), as_i64(entry))

    def clear(self) -> None:
        """Remove everything and release the array."""
        self.cclear()

    def __len__(self) -> int:
        return self.n

    def __bool__(self) -> bool:
        return self.n > 0

    @property
    def nbytes(self) -> int:
        """Bytes held by the node array (capacity x 24)."""
        return self.cap * sizeof(Triple)

    def to_arrays(self) -> tuple:
        """Copy the nodes, in storage (heap) order, into three int64 numpy arrays."""
        out_t = np.empty(self.n, dtype=np.int64)
        out_l = np.empty(self.n, dtype=np.int64)
        out_e = np.empty(self.n, dtype=np.int64)
        cdef int64_t[::1] ts = out_t
        cdef int64_t[::1] ls = out_l
        cdef int64_t[::1] es = out_e
        cdef Py_ssize_t i
        for i in range(self.n):
            ts[i] = self.data[i].time
            ls[i] = self.data[i].ledger
            es[i] = self.data[i].entry
        return out_t, out_l, out_e

    def _check(self) -> None:
        """Assert the heap invariants; raises ``AssertionError`` naming the broken node."""
        cdef Py_ssize_t i, parent
        if not (0 <= self.n <= self.cap):
            raise AssertionError(f"TripleHeap size {self.n} outside capacity {self.cap}")
        if (self.data == NULL) != (self.cap == 0):
            raise AssertionError("TripleHeap data pointer and capacity disagree")
        for i in range(1, self.n):
            parent = (i - 1) >> 2
            if triple_lt(&self.data[i], &self.data[parent]):
                child_node = self.data[i]
                parent_node = self.data[parent]
                raise AssertionError(
                    f"TripleHeap order broken at node {i}: "
                    f"{(child_node.time, child_node.ledger, child_node.entry)} < parent "
                    f"{(parent_node.time, parent_node.ledger, parent_node.entry)}")

    def __repr__(self) -> str:
        return f"<TripleHeap n={self.n} capacity={self.cap}>"
