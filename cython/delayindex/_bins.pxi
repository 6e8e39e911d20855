# BinIndex: which due_histogram bin a time falls in, in O(1) for almost every time.
#
# How it works. The range [edges[0], edges[-1]) is cut into CELLS cells by a monotonic map
# cell(t) = min(floor(double(t - low) * scale), CELLS - 1). An inner edge e lies strictly inside
# a cell exactly when cell(e - 1) == cell(e); such cells are marked -1 and their times binary
# searched. Every other cell holds no edge, so all its times share one bin: the number of inner
# edges e with cell(e) <= the cell (the monotonic map makes this exact whatever the rounding).
# With 100 bins at most 99 of 4096 cells need the search.

from libc.stdint cimport int32_t, uint64_t
from libc.string cimport memset

cdef enum:
    BIN_CELLS = 4096


@cython.final
cdef class BinIndex:
    """Bin lookup for strictly increasing int64 ``edges`` (at least two, checked by the
    caller)."""

    cdef const int64_t[:] edges
    cdef Py_ssize_t nb
    cdef int64_t low, high
    cdef double scale
    cdef int32_t cell_bin[BIN_CELLS]

    def __cinit__(self, const int64_t[:] edges not None):
        cdef Py_ssize_t j, c, running = 0
        if edges.shape[0] < 2:
            raise ValueError("edges needs at least two values")
        self.edges = edges
        self.nb = edges.shape[0] - 1
        self.low = edges[0]
        self.high = edges[self.nb]
        self.scale = BIN_CELLS / <double> (<uint64_t> self.high - <uint64_t> self.low)
        memset(self.cell_bin, 0, sizeof(self.cell_bin))
        for j in range(1, self.nb):  # starts: inner edges per cell
            self.cell_bin[self.cell(edges[j])] += 1
        for c in range(BIN_CELLS):
            running += self.cell_bin[c]
            self.cell_bin[c] = <int32_t> running
        for j in range(1, self.nb):
            c = self.cell(edges[j])
            if self.cell(edges[j] - 1) == c:
                self.cell_bin[c] = -1

    cdef inline Py_ssize_t cell(self, int64_t t) noexcept nogil:
        cdef Py_ssize_t c = <Py_ssize_t> (<double> (<uint64_t> t - <uint64_t> self.low)
                                          * self.scale)
        return c if c < BIN_CELLS else BIN_CELLS - 1

    cdef inline Py_ssize_t find(self, int64_t t) noexcept nogil:
        """The bin of ``t``, or -1 outside ``[edges[0], edges[-1])``."""
        cdef Py_ssize_t lo, hi, mid, b
        if t < self.low or t >= self.high:
            return -1
        b = self.cell_bin[self.cell(t)]
        if b >= 0:
            return b
        lo = 0
        hi = self.nb
        while hi - lo > 1:  # the last edge <= t
            mid = (lo + hi) >> 1
            if self.edges[mid] <= t:
                lo = mid
            else:
                hi = mid
        return lo

    def counts(self, const int64_t[:] times not None):
        """How many of ``times`` fall in each bin (times outside the edges are not counted):
        an int64 array of ``len(edges) - 1`` counts."""
        cdef Py_ssize_t i, b
        out = np.zeros(self.nb, dtype=np.int64)
        cdef int64_t[::1] c = out
        with nogil:
            for i in range(times.shape[0]):
                b = self.find(times[i])
                if b >= 0:
                    c[b] += 1
        return out
