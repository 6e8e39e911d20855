# cython: language_level=3, embedsignature=True
"""Native hot path of delayindex: the triple heap and the exact-timestamp tracker core.

Each class here has a pure-Python twin in ``delayindex._pure`` with the same API;
``delayindex._impl`` picks one (``DELAYINDEX_NO_EXTENSIONS=1`` forces the pure one).
"""

cimport cython
from cpython.bool cimport PyBool_Check
from cpython.long cimport PyLong_AsLongLong, PyLong_CheckExact
from libc.stdint cimport int64_t, uint8_t
from libc.time cimport timespec

cdef extern from "<time.h>" nogil:
    int clock_gettime(int clk_id, timespec* tp)
    int CLOCK_REALTIME

cdef extern from *:
    """
    /* The int objects of recent ledger ids (table 0) and entry ids (table 1), direct-mapped
       by value. A poll hands out one Position per message; a drain of a large backlog
       allocated and freed two ints per message for ids that recur all the time (a topic's
       open ledgers, entry ids below the ledger size). A slot holds a reference to its int
       (at most 2 x 16384 small ints, about 1.5 MB when every slot is used). Called with the
       GIL held only. */
    #define DI_INT_CACHE_SLOTS 16384
    static PyObject* di_int_objs[2][DI_INT_CACHE_SLOTS];
    static long long di_int_vals[2][DI_INT_CACHE_SLOTS];

    static PyObject* di_cached_int(int table, long long value) {
        size_t slot = (size_t) ((unsigned long long) value & (DI_INT_CACHE_SLOTS - 1));
        PyObject* obj = di_int_objs[table][slot];
        if (obj != NULL && di_int_vals[table][slot] == value) {
            Py_INCREF(obj);
            return obj;
        }
        obj = PyLong_FromLongLong(value);
        if (obj == NULL) return NULL;
        Py_XDECREF(di_int_objs[table][slot]);
        Py_INCREF(obj);
        di_int_objs[table][slot] = obj;
        di_int_vals[table][slot] = value;
        return obj;
    }

    /* A 2-tuple of a tuple subclass, built the way CPython's tuple_subtype_new builds one.
       It holds only ints, so it can never be part of a cycle: untrack it from the GC as
       CPython does for such tuples, which keeps gen-0 collections cheap during big polls. */
    static PyObject* di_make_pair(PyObject* type, PyObject* first, long long second) {
        PyTypeObject* tp = (PyTypeObject*) type;
        PyObject* item = di_cached_int(1, second);
        if (item == NULL) return NULL;
        PyObject* pair = tp->tp_alloc(tp, 2);
        if (pair == NULL) { Py_DECREF(item); return NULL; }
        Py_INCREF(first);
        PyTuple_SET_ITEM(pair, 0, first);
        PyTuple_SET_ITEM(pair, 1, item);
        if (PyObject_GC_IsTracked(pair)) PyObject_GC_UnTrack(pair);
        return pair;
    }

    /* A (time, ledger, entry) tuple of ints, untracked by the GC like the pair above: popping
       a million of them must not make every gen-0 collection walk them. */
    static PyObject* di_int_triple(long long a, long long b, long long c) {
        PyObject* t = PyTuple_New(3);
        PyObject* x;
        if (t == NULL) return NULL;
        if ((x = PyLong_FromLongLong(a)) == NULL) goto fail;
        PyTuple_SET_ITEM(t, 0, x);
        if ((x = PyLong_FromLongLong(b)) == NULL) goto fail;
        PyTuple_SET_ITEM(t, 1, x);
        if ((x = PyLong_FromLongLong(c)) == NULL) goto fail;
        PyTuple_SET_ITEM(t, 2, x);
        if (PyObject_GC_IsTracked(t)) PyObject_GC_UnTrack(t);
        return t;
    fail:
        Py_DECREF(t);
        return NULL;
    }

    /* Positions to sort; an inlined quicksort beats qsort's indirect compares 3-4x here. */
    typedef struct { long long ledger; long long entry; } DiPos;

    static inline int di_pos_lt(const DiPos* a, const DiPos* b) {
        return a->ledger < b->ledger || (a->ledger == b->ledger && a->entry < b->entry);
    }

    /* (time, ledger, entry) triples; sorted either by all three or by (ledger, entry). */
    typedef struct { long long time; long long ledger; long long entry; } DiTriple;

    static inline int di_tle_lt(const DiTriple* a, const DiTriple* b) {
        if (a->time != b->time) return a->time < b->time;
        if (a->ledger != b->ledger) return a->ledger < b->ledger;
        return a->entry < b->entry;
    }

    static inline int di_le_lt(const DiTriple* a, const DiTriple* b) {
        return a->ledger < b->ledger || (a->ledger == b->ledger && a->entry < b->entry);
    }

    #define DI_DEFINE_SORT(NAME, LT)                                                       \
    static void NAME(DiTriple* a, Py_ssize_t n) {                                        \
        while (n > 16) {                                                                 \
            Py_ssize_t i = 0, j = n - 1, mid = n / 2;                                    \
            DiTriple t, pivot;                                                           \
            if (LT(&a[mid], &a[0])) { t = a[mid]; a[mid] = a[0]; a[0] = t; }             \
            if (LT(&a[j], &a[0])) { t = a[j]; a[j] = a[0]; a[0] = t; }                   \
            if (LT(&a[j], &a[mid])) { t = a[j]; a[j] = a[mid]; a[mid] = t; }             \
            pivot = a[mid];                                                              \
            for (;;) {                                                                   \
                while (LT(&a[i], &pivot)) i++;                                           \
                while (LT(&pivot, &a[j])) j--;                                           \
                if (i >= j) break;                                                       \
                t = a[i]; a[i] = a[j]; a[j] = t;                                         \
                i++; j--;                                                                \
            }                                                                            \
            if (j + 1 < n - j - 1) { NAME(a, j + 1); a += j + 1; n -= j + 1; }           \
            else { NAME(a + j + 1, n - j - 1); n = j + 1; }                              \
        }                                                                                \
        for (Py_ssize_t i = 1; i < n; i++) {                                             \
            DiTriple x = a[i];                                                           \
            Py_ssize_t k = i;                                                            \
            while (k > 0 && LT(&x, &a[k - 1])) { a[k] = a[k - 1]; k--; }                 \
            a[k] = x;                                                                    \
        }                                                                                \
    }
    DI_DEFINE_SORT(di_sort_tle, di_tle_lt)
    DI_DEFINE_SORT(di_sort_le, di_le_lt)

    /* Bit-pack times[i * stride] - base (i < n) in `bits` bits each, LSB first, back to
       back: the segment format's packed times (pack_times, and build_segments from its
       triples with stride 3). `dst` must be zeroed and hold 8 bytes past the packed size: on
       a little-endian machine a value of at most 57 bits, shifted to its first bit's place,
       is OR-ed in as one unaligned 64-bit word instead of bit by bit. */
    static void di_pack_bits(uint8_t* dst, const long long* times, Py_ssize_t stride,
                             Py_ssize_t n, long long base, int bits) {
        uint64_t bitpos = 0;
        for (Py_ssize_t i = 0; i < n; i++) {
            uint64_t v = (uint64_t)times[i * stride] - (uint64_t)base;
    #if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
            if (bits <= 57) {
                uint64_t w;
                uint8_t* p = dst + (bitpos >> 3);
                memcpy(&w, p, 8);
                w |= v << (bitpos & 7);
                memcpy(p, &w, 8);
                bitpos += (uint64_t)bits;
                continue;
            }
    #endif
            for (int b = 0; b < bits; b++) {
                if ((v >> b) & 1) dst[(bitpos + b) >> 3] |= (uint8_t)(1u << ((bitpos + b) & 7));
            }
            bitpos += (uint64_t)bits;
        }
    }

    /* Bits needed for v (0 for 0). */
    static inline int di_bits(unsigned long long v) {
        return v ? 64 - __builtin_clzll(v) : 0;
    }

    static inline unsigned long long di_shl(unsigned long long v, int s) {
        return s >= 64 ? 0 : v << s;
    }

    static inline unsigned long long di_shr(unsigned long long v, int s) {
        return s >= 64 ? 0 : v >> s;
    }

    /* The low `bits` bits set (none for 0; all 64 for 64). */
    static inline unsigned long long di_low_mask(int bits) {
        return bits ? ~0ULL >> (64 - bits) : 0;
    }

    static void di_qsort_pos(DiPos* a, Py_ssize_t n) {
        while (n > 16) {
            Py_ssize_t i = 0, j = n - 1, mid = n / 2;
            DiPos t, pivot;
            if (di_pos_lt(&a[mid], &a[0])) { t = a[mid]; a[mid] = a[0]; a[0] = t; }
            if (di_pos_lt(&a[j], &a[0])) { t = a[j]; a[j] = a[0]; a[0] = t; }
            if (di_pos_lt(&a[j], &a[mid])) { t = a[j]; a[j] = a[mid]; a[mid] = t; }
            pivot = a[mid];
            for (;;) {
                while (di_pos_lt(&a[i], &pivot)) i++;
                while (di_pos_lt(&pivot, &a[j])) j--;
                if (i >= j) break;
                t = a[i]; a[i] = a[j]; a[j] = t;
                i++; j--;
            }
            /* recurse into the smaller side, loop on the larger: O(log n) stack */
            if (j + 1 < n - j - 1) { di_qsort_pos(a, j + 1); a += j + 1; n -= j + 1; }
            else { di_qsort_pos(a + j + 1, n - j - 1); n = j + 1; }
        }
        for (Py_ssize_t i = 1; i < n; i++) {
            DiPos x = a[i];
            Py_ssize_t k = i;
            while (k > 0 && di_pos_lt(&x, &a[k - 1])) { a[k] = a[k - 1]; k--; }
            a[k] = x;
        }
    }

    /* Stable sort of n keys by their bits [shift, shift + bits), the bits below shift kept in
       the order given: insertion sort up to 32 keys, else an LSD radix sort. Its digits are 8
       bits below 4096 keys (a poll's 1000: clearing and summing 2048 counters per pass cost
       more than the keys' own moves) and 11 bits above; a pass whose digit is the same for
       every key moves nothing. tmp is scratch of n keys; the result is in keys. The one
       keys-only sort of the module: positions (di_sort_pos), a segment's (time, index) keys,
       the duplicate checks' entry ids and the build's packed triples (di_sort_triples). */
    static void di_radix_sort_keys(unsigned long long* keys, unsigned long long* tmp,
                                   Py_ssize_t n, int shift, int bits) {
        Py_ssize_t i, j, count[1 << 11];
        unsigned long long *src = keys, *dst = tmp, *swap, k, dmask;
        int digit = n < 4096 ? 8 : 11, end = shift + bits;
        if (n <= 32) {
            for (i = 1; i < n; i++) {
                k = keys[i];
                for (j = i; j > 0 && (keys[j - 1] >> shift) > (k >> shift); j--)
                    keys[j] = keys[j - 1];
                keys[j] = k;
            }
            return;
        }
        dmask = (1ULL << digit) - 1;
        for (; shift < end; shift += digit) {
            Py_ssize_t total = 0, c, d;
            memset(count, 0, sizeof(count));
            for (i = 0; i < n; i++) count[(src[i] >> shift) & dmask]++;
            if (count[(src[0] >> shift) & dmask] == n) continue;  /* one digit: no moves */
            for (d = 0; d <= (Py_ssize_t) dmask; d++) {
                c = count[d]; count[d] = total; total += c;
            }
            for (i = 0; i < n; i++) dst[count[(src[i] >> shift) & dmask]++] = src[i];
            swap = src; src = dst; dst = swap;
        }
        if (src != keys) memcpy(keys, src, (size_t) n * sizeof(unsigned long long));
    }

    /* Sort positions (unique or not; ledgers >= 0, entries in [0, 2**32)). A poll's positions
       span few ledger bits, so each packs into one key (ledger - min) << entry_bits | entry,
       and the radix sort of the keys beats the quicksort's mispredicted compares 3-4x; the
       positions are rebuilt from the sorted keys. Falls back to the quicksort when the keys
       would not fit or memory is short. */
    static void di_sort_pos(DiPos* a, Py_ssize_t n) {
        Py_ssize_t i;
        long long minl, maxl, mine, maxe;
        unsigned long long *keys, lspan, emask;
        int lbits, ebits;
        if (n <= 64) { di_qsort_pos(a, n); return; }
        minl = maxl = a[0].ledger;
        mine = maxe = a[0].entry;
        for (i = 0; i < n; i++) {
            if (a[i].ledger < minl) minl = a[i].ledger;
            if (a[i].ledger > maxl) maxl = a[i].ledger;
            if (a[i].entry < mine) mine = a[i].entry;
            if (a[i].entry > maxe) maxe = a[i].entry;
        }
        if (minl < 0 || mine < 0 || maxe > 0xFFFFFFFFLL) { di_qsort_pos(a, n); return; }
        lspan = (unsigned long long) maxl - (unsigned long long) minl;
        lbits = di_bits(lspan);
        ebits = di_bits((unsigned long long) maxe);
        if (lbits + ebits > 64) { di_qsort_pos(a, n); return; }
        keys = (unsigned long long*) malloc(2 * (size_t) n * sizeof(unsigned long long));
        if (keys == NULL) { di_qsort_pos(a, n); return; }
        for (i = 0; i < n; i++)
            keys[i] = ((unsigned long long) (a[i].ledger - minl) << ebits)
                      | (unsigned long long) a[i].entry;
        di_radix_sort_keys(keys, keys + n, n, 0, lbits + ebits);
        emask = di_low_mask(ebits);
        for (i = 0; i < n; i++) {
            a[i].ledger = (long long) ((unsigned long long) minl + (keys[i] >> ebits));
            a[i].entry = (long long) (keys[i] & emask);
        }
        free(keys);
    }

    /* Sort triples by (time, ledger, entry) (by_time) or by (ledger, entry, time) (else: the
       order by position when positions are distinct). A bucket's triples span few bits of
       each field, so each triple packs whole into one key (its fields less their minimums, in
       sort order) and the radix sort of the keys beats the quicksort's mispredicted three-way
       compares; the triples are rebuilt from the sorted keys. Falls back to the quicksort
       (di_sort_tle or di_sort_le) when the keys would not fit 64 bits, an id is negative or
       memory is short. */
    static void di_sort_triples(DiTriple* a, Py_ssize_t n, int by_time) {
        Py_ssize_t i;
        long long mint, maxt, minl, maxl, maxe;
        unsigned long long *keys, k, tmask, lmask, emask;
        int tbits, lbits, ebits, negative = 0;
        if (n > 64) {
            mint = maxt = a[0].time;
            minl = maxl = a[0].ledger;
            maxe = a[0].entry;
            for (i = 0; i < n; i++) {
                if (a[i].time < mint) mint = a[i].time;
                if (a[i].time > maxt) maxt = a[i].time;
                if (a[i].ledger < minl) minl = a[i].ledger;
                if (a[i].ledger > maxl) maxl = a[i].ledger;
                if (a[i].entry > maxe) maxe = a[i].entry;
                if (a[i].entry < 0) negative = 1;
            }
            tbits = di_bits((unsigned long long) maxt - (unsigned long long) mint);
            lbits = di_bits((unsigned long long) maxl - (unsigned long long) minl);
            ebits = di_bits((unsigned long long) maxe);
            keys = (negative || minl < 0 || tbits + lbits + ebits > 64) ? NULL
                : (unsigned long long*) malloc(2 * (size_t) n * sizeof(unsigned long long));
            if (keys != NULL) {
                tmask = di_low_mask(tbits);
                lmask = di_low_mask(lbits);
                emask = di_low_mask(ebits);
                for (i = 0; i < n; i++) {
                    unsigned long long t = (unsigned long long) a[i].time
                                           - (unsigned long long) mint;
                    unsigned long long l = (unsigned long long) (a[i].ledger - minl);
                    unsigned long long e = (unsigned long long) a[i].entry;
                    keys[i] = by_time ? di_shl(t, lbits + ebits) | di_shl(l, ebits) | e
                                      : di_shl(l, ebits + tbits) | di_shl(e, tbits) | t;
                }
                di_radix_sort_keys(keys, keys + n, n, 0, tbits + lbits + ebits);
                for (i = 0; i < n; i++) {
                    k = keys[i];
                    if (by_time) {
                        a[i].time = (long long) ((unsigned long long) mint
                                                 + di_shr(k, lbits + ebits));
                        a[i].ledger = minl + (long long) (di_shr(k, ebits) & lmask);
                        a[i].entry = (long long) (k & emask);
                    } else {
                        a[i].ledger = minl + (long long) di_shr(k, ebits + tbits);
                        a[i].entry = (long long) (di_shr(k, tbits) & emask);
                        a[i].time = (long long) ((unsigned long long) mint + (k & tmask));
                    }
                }
                free(keys);
                return;
            }
        }
        if (by_time) di_sort_tle(a, n); else di_sort_le(a, n);
    }

    /* A list of ``type`` pairs (Position) of n positions sorted by position. */
    static PyObject* di_positions(PyObject* type, const DiPos* a, Py_ssize_t n) {
        PyObject* out = PyList_New(n);
        PyObject* ledger = NULL;
        PyObject* pair;
        long long prev = 0;
        Py_ssize_t i;
        if (out == NULL) return NULL;
        for (i = 0; i < n; i++) {
            if (ledger == NULL || a[i].ledger != prev) {
                Py_XDECREF(ledger);
                prev = a[i].ledger;
                ledger = di_cached_int(0, prev);
                if (ledger == NULL) goto fail;
            }
            pair = di_make_pair(type, ledger, a[i].entry);
            if (pair == NULL) goto fail;
            PyList_SET_ITEM(out, i, pair);
        }
        Py_XDECREF(ledger);
        return out;
    fail:
        Py_XDECREF(ledger);
        Py_DECREF(out);  /* the unset items are NULL: list_dealloc skips them */
        return NULL;
    }
    """
    ctypedef struct DiPos:
        long long ledger
        long long entry
    void di_sort_pos(DiPos* a, Py_ssize_t n) nogil
    void di_radix_sort_keys(unsigned long long* keys, unsigned long long* tmp, Py_ssize_t n,
                            int shift, int bits) nogil
    ctypedef struct DiTriple:
        long long time
        long long ledger
        long long entry
    void di_pack_bits(uint8_t* dst, const long long* times, Py_ssize_t stride, Py_ssize_t n,
                      long long base, int bits) nogil
    void di_sort_triples(DiTriple* a, Py_ssize_t n, int by_time) nogil
    object di_make_pair(object type, object first, long long second)
    list di_positions(object type, const DiPos* a, Py_ssize_t n)
    tuple di_int_triple(long long a, long long b, long long c)

# Delivery lateness counters (the rule: delayindex._lateness.bucket_of).
DEF LATENESS_BUCKETS = 20

cdef extern from *:
    """
    /* Counter of a lateness in ms: 0 for <= 0, else bit_length(late - 1) + 1, capped. */
    static inline int di_lateness_bucket(long long late) {
        int k;
        if (late <= 0) return 0;
        if (late == 1) return 1;
        k = 65 - __builtin_clzll((unsigned long long) (late - 1));
        return k > 19 ? 19 : k;
    }
    """
    int di_lateness_bucket(long long late) nogil


cdef inline void record_lateness(int64_t* counts, int64_t* total, int64_t late) noexcept:
    counts[di_lateness_bucket(late)] += 1
    if late > 0:
        total[0] += late


cdef list lateness_list(int64_t* counts):
    return [counts[i] for i in range(LATENESS_BUCKETS)]


from operator import index as _index

import sys

import numpy as np
from pyroaring import BitMap

from delayindex._ranges import LedgerRanges as _LedgerRanges
from delayindex.model import Position


def wall_clock_ms() -> int:
    """Return the current wall-clock time in epoch milliseconds."""
    cdef timespec ts
    clock_gettime(CLOCK_REALTIME, &ts)
    return <int64_t> ts.tv_sec * 1000 + ts.tv_nsec // 1000000


# Bytes a BitMap costs beyond what sys.getsizeof reports: the Python object and roaring header.
cdef Py_ssize_t BITMAP_OVERHEAD = 64


cdef inline int64_t as_i64(object value) except? -1:
    """Convert an int (or anything with __index__) to int64; floats and bools raise TypeError."""
    if not PyLong_CheckExact(value):
        if PyBool_Check(value):  # an int subclass, but never a position or a time
            raise TypeError("expected an int, got bool")
        value = _index(value)
    return PyLong_AsLongLong(value)


cdef int64_t MAX_ENTRY = 0xFFFFFFFF


cdef inline int check_ids(int64_t ledger, int64_t entry) except -1:
    if ledger < 0:
        raise ValueError(f"ledger_id must be >= 0, got {ledger}")
    if entry < 0 or entry > MAX_ENTRY:
        raise ValueError(f"entry_id must be in [0, 2**32), got {entry}")
    return 0


include "_heap.pxi"
include "_index.pxi"
include "_bins.pxi"
include "_core.pxi"
include "_codec.pxi"
include "_codec_decode.pxi"
include "_codec_build.pxi"
include "_bucket_state.pxi"
include "_bucket_overrides.pxi"
include "_bucket.pxi"
include "_lock.pxi"
include "_front.pxi"
include "_shared_front.pxi"
