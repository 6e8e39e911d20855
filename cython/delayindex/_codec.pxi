# Codec kernels, shared part: parsing of portable roaring bitmaps, bit-packing of deliver times
# and the LSD radix sort; the batch decode is in _codec_decode.pxi, the writer in
# _codec_build.pxi (all three are included, in that order, into one module by _native.pyx).
#
# How it works. A segment stores only deliver times, as (time - segment min) in bit_length(span)
# bits each, LSB-first, in *position order*: the order in which the segment's per-ledger roaring
# bitmaps enumerate positions (ledger ascending, entry ascending). Decoding parses the bitmaps
# straight from their portable bytes (no BitMap objects), unpacks the times, then sorts the
# segment by time with a stable LSD radix sort; stability keeps (ledger, entry) order among equal
# times, which yields exactly (time, ledger, entry) order.
#
# Invariants: every function validates its input completely and raises ValueError on anything
# malformed (the codec turns that into SnapshotCorruptError naming the object); nothing reads
# outside a buffer.

from libc.stdint cimport uint8_t, uint16_t, uint32_t, uint64_t
from libc.stdlib cimport calloc, free, malloc, realloc
from libc.string cimport memset
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize, PyBytes_GET_SIZE

cdef extern from *:
    """
    /* MurmurHash3 x86_32, the hash mmh3.hash(data, seed, signed=False) computes. */
    static uint32_t di_murmur3_32(const uint8_t* data, size_t len, uint32_t seed) {
        const uint32_t c1 = 0xcc9e2d51u, c2 = 0x1b873593u;
        uint32_t h = seed, k;
        size_t i, blocks = len / 4;
        for (i = 0; i < blocks; i++) {
            const uint8_t* p = data + 4 * i;
            k = (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16)
                | ((uint32_t)p[3] << 24);
            k *= c1; k = (k << 15) | (k >> 17); k *= c2;
            h ^= k; h = (h << 13) | (h >> 19); h = h * 5 + 0xe6546b64u;
        }
        k = 0;
        switch (len & 3) {
            case 3: k ^= (uint32_t)data[4 * blocks + 2] << 16; /* fall through */
            case 2: k ^= (uint32_t)data[4 * blocks + 1] << 8;  /* fall through */
            case 1: k ^= data[4 * blocks];
                    k *= c1; k = (k << 15) | (k >> 17); k *= c2; h ^= k;
        }
        h ^= (uint32_t)len;
        h ^= h >> 16; h *= 0x85ebca6bu; h ^= h >> 13; h *= 0xc2b2ae35u; h ^= h >> 16;
        return h;
    }

    #if defined(__GNUC__) || defined(__clang__)
    #define di_ctzll(x) __builtin_ctzll(x)
    #else
    static int di_ctzll(unsigned long long x) {
        int n = 0;
        while (!(x & 1)) { x >>= 1; n++; }
        return n;
    }
    #endif
    """
    int di_ctzll(unsigned long long x) nogil
    uint32_t di_murmur3_32(const uint8_t* data, size_t len, uint32_t seed) nogil


cdef enum:
    ROARING_COOKIE = 12347
    ROARING_COOKIE_NO_RUN = 12346
    ROARING_NO_OFFSET_THRESHOLD = 4
    ROARING_ARRAY_MAX = 4096
    RADIX_BITS = 11
    INSERTION_SORT_MAX = 32


cdef inline uint32_t read_u32(const uint8_t* p) noexcept nogil:
    return p[0] | (<uint32_t> p[1] << 8) | (<uint32_t> p[2] << 16) | (<uint32_t> p[3] << 24)


cdef inline uint16_t read_u16(const uint8_t* p) noexcept nogil:
    return p[0] | (<uint16_t> p[1] << 8)


cdef inline int bit_length(uint64_t v) noexcept nogil:
    cdef int n = 0
    while v:
        n += 1
        v >>= 1
    return n


cdef Py_ssize_t roaring_parse(const uint8_t* data, Py_ssize_t size, uint32_t* out,
                              Py_ssize_t capacity) except -2:
    """Parse a portable roaring bitmap into ascending uint32 values.

    Writes at most ``capacity`` values to ``out`` (out may be NULL with capacity 0 to count).
    Returns the cardinality. Raises ValueError on any malformed input.
    """
    cdef Py_ssize_t pos = 0, n_containers, i, j, k, header_end, card_total = 0
    cdef uint32_t cookie
    cdef bint has_runs = False
    cdef const uint8_t* run_flags = NULL
    cdef const uint8_t* descr
    cdef uint32_t key, prev_key = 0, card, value, prev_value
    cdef uint16_t n_runs, start, length
    cdef uint64_t word
    cdef Py_ssize_t run_total
    cdef bint have_prev_key = False
    if size < 4:
        raise ValueError("roaring: truncated cookie")
    cookie = read_u32(data)
    if (cookie & 0xFFFF) == ROARING_COOKIE:
        has_runs = True
        n_containers = (cookie >> 16) + 1
        pos = 4
        if pos + (n_containers + 7) // 8 > size:
            raise ValueError("roaring: truncated run flags")
        run_flags = data + pos
        pos += (n_containers + 7) // 8
        if n_containers % 8 and run_flags[n_containers // 8] >> (n_containers % 8):
            raise ValueError("roaring: run flags set for containers that do not exist")
    elif cookie == ROARING_COOKIE_NO_RUN:
        if size < 8:
            raise ValueError("roaring: truncated size")
        n_containers = read_u32(data + 4)
        pos = 8
    else:
        raise ValueError("roaring: bad cookie")
    if n_containers > 65536:
        raise ValueError("roaring: too many containers")
    if pos + 4 * n_containers > size:
        raise ValueError("roaring: truncated container headers")
    descr = data + pos
    pos += 4 * n_containers
    if not has_runs or n_containers >= ROARING_NO_OFFSET_THRESHOLD:
        if pos + 4 * n_containers > size:
            raise ValueError("roaring: truncated offsets")
        header_end = pos + 4 * n_containers
        # Offsets must point exactly where sequential parsing finds each container.
        pos = header_end
    else:
        header_end = pos
    for i in range(n_containers):
        key = read_u16(descr + 4 * i)
        card = <uint32_t> read_u16(descr + 4 * i + 2) + 1
        if have_prev_key and key <= prev_key:
            raise ValueError("roaring: container keys not increasing")
        have_prev_key = True
        prev_key = key
        if not has_runs or n_containers >= ROARING_NO_OFFSET_THRESHOLD:
            if <Py_ssize_t> read_u32(descr + 4 * n_containers + 4 * i) != pos:
                raise ValueError("roaring: container offset mismatch")
        if has_runs and (run_flags[i >> 3] >> (i & 7)) & 1:
            if pos + 2 > size:
                raise ValueError("roaring: truncated run container")
            n_runs = read_u16(data + pos)
            pos += 2
            if pos + 4 * <Py_ssize_t> n_runs > size:
                raise ValueError("roaring: truncated runs")
            run_total = 0
            for j in range(n_runs):
                start = read_u16(data + pos + 4 * j)
                length = read_u16(data + pos + 4 * j + 2)
                if <uint32_t> start + length > 0xFFFF:
                    raise ValueError("roaring: run past the container end")
                if j > 0 and start <= prev_value:
                    raise ValueError("roaring: runs overlap or are unordered")
                prev_value = <uint32_t> start + length  # last value of this run
                for k in range(<Py_ssize_t> length + 1):
                    if card_total + run_total + k < capacity:
                        out[card_total + run_total + k] = (key << 16) | (start + k)
                run_total += <Py_ssize_t> length + 1
            if run_total != card:
                raise ValueError("roaring: run container cardinality mismatch")
            pos += 4 * <Py_ssize_t> n_runs
        elif card <= ROARING_ARRAY_MAX:
            if pos + 2 * <Py_ssize_t> card > size:
                raise ValueError("roaring: truncated array container")
            for j in range(card):
                value = read_u16(data + pos + 2 * j)
                if j > 0 and value <= prev_value:
                    raise ValueError("roaring: array values not increasing")
                prev_value = value
                if card_total + j < capacity:
                    out[card_total + j] = (key << 16) | value
            pos += 2 * <Py_ssize_t> card
        else:
            if pos + 8192 > size:
                raise ValueError("roaring: truncated bitset container")
            k = 0
            for j in range(1024):
                word = 0
                for value in range(8):
                    word |= (<uint64_t> data[pos + 8 * j + value]) << (8 * value)
                while word:
                    value = <uint32_t> (64 * j) + <uint32_t> di_ctzll(word)
                    if card_total + k < capacity:
                        out[card_total + k] = (key << 16) | value
                    k += 1
                    word &= word - 1
            if k != card:
                raise ValueError("roaring: bitset cardinality mismatch")
            pos += 8192
        card_total += card
    if pos != size:
        raise ValueError("roaring: trailing bytes")
    return card_total


def roaring_entries(const uint8_t[::1] data not None):
    """Parse a portable roaring bitmap into an ascending uint32 numpy array (ValueError if bad)."""
    cdef Py_ssize_t n = roaring_parse(&data[0] if data.shape[0] else NULL, data.shape[0], NULL, 0)
    out = np.empty(n, dtype=np.uint32)
    cdef uint32_t[::1] view = out
    if n:
        roaring_parse(&data[0], data.shape[0], &view[0], n)
    return out


cdef const uint8_t* block_base(const uint8_t[::1] blob, const int64_t[:] offsets,
                               Py_ssize_t n) except? NULL:
    """Check the frame of a bitmap block (``n`` portable bitmaps back to back in ``blob``,
    bitmap ``i`` at ``blob[offsets[i]:offsets[i + 1]]``) and return its base pointer (NULL when
    empty). O(1): each bitmap's own bounds are checked when it is parsed (``block_parse``), so
    reading a few segments of a large bucket costs nothing per bitmap it does not read."""
    if offsets.shape[0] != n + 1:
        raise ValueError("bitmap offsets and bitmaps differ in length")
    if offsets[0] != 0 or offsets[n] != blob.shape[0]:
        raise ValueError("bitmap offsets do not span the bitmap block")
    return &blob[0] if blob.shape[0] else NULL


cdef inline Py_ssize_t block_parse(const uint8_t* base, const int64_t[:] offsets, Py_ssize_t i,
                                   uint32_t* out, Py_ssize_t cap) except -2:
    """``roaring_parse`` of bitmap ``i`` of a block framed by ``block_base``."""
    cdef int64_t start = offsets[i], stop = offsets[i + 1]
    # Within the block: offsets[0] == 0 and offsets[n] == its length were checked.
    if not 0 <= start <= stop <= offsets[offsets.shape[0] - 1]:
        raise ValueError("bitmap offsets decrease or leave the block")
    return roaring_parse(base + start if stop > start else NULL, stop - start, out, cap)


def roaring_cardinalities(const uint8_t[::1] blob not None, const int64_t[:] offsets not None):
    """Validate each portable roaring bitmap of a block (``blob`` with ``offsets``, one more
    than the bitmaps) and return their cardinalities (int64 array)."""
    cdef Py_ssize_t i, n = offsets.shape[0] - 1
    if n < 0:
        raise ValueError("bitmap offsets are empty")
    cdef const uint8_t* base = block_base(blob, offsets, n)
    out = np.empty(n, dtype=np.int64)
    cdef int64_t[::1] view = out
    for i in range(n):
        view[i] = block_parse(base, offsets, i, NULL, 0)
    return out


def roaring_block_values(const uint8_t[::1] blob not None, const int64_t[:] offsets not None):
    """Parse every portable roaring bitmap of a block (``blob`` with ``offsets``, one more than
    the bitmaps): ``(values, cards)``, the bitmaps' values back to back as uint32 (each one's
    ascending) and each one's cardinality (int64). ValueError if a bitmap is malformed."""
    cdef Py_ssize_t i, pos = 0, n = offsets.shape[0] - 1
    cards = roaring_cardinalities(blob, offsets)  # checks the frame and every bitmap
    cdef const int64_t[::1] vc = cards
    cdef const uint8_t* base = block_base(blob, offsets, n)
    values = np.empty(int(cards.sum()), dtype=np.uint32)
    cdef uint32_t[::1] vv = values
    for i in range(n):
        if vc[i]:
            block_parse(base, offsets, i, &vv[pos], vc[i])
            pos += vc[i]
    return values, cards


def roaring_check_positions(const int64_t[:] ledgers not None, const uint8_t[::1] blob not None,
                            const int64_t[:] offsets not None):
    """Validate a bitmap block (``blob``, ``offsets``) aligned with ``ledgers``; fail if a
    (ledger, entry) appears twice.

    Returns the cardinalities (int64 array). Bitmaps of one ledger that appear several times
    (one per segment) must be disjoint: their entries are marked in a bitset spanning the
    group's entry range (sorted instead when that range is sparse).
    """
    cdef Py_ssize_t n = ledgers.shape[0], i, j, a, b, total, got, card, largest = 0
    cdef Py_ssize_t words, bitset_words = 0
    cdef uint32_t low, high, value
    cdef uint32_t* buf = NULL
    cdef uint64_t* bitset = NULL
    cdef uint64_t* keys = NULL
    cdef uint64_t* scratch_keys = NULL
    cdef const uint8_t* base = block_base(blob, offsets, n)
    cards = np.zeros(n, dtype=np.int64)
    cdef int64_t[::1] vc = cards
    cdef int64_t[::1] vo = np.argsort(np.asarray(ledgers), kind="stable").astype(np.int64)
    # Count every bitmap (validating it); size scratch for the largest multi-bitmap group.
    a = 0
    while a < n:
        b = a + 1
        while b < n and ledgers[vo[b]] == ledgers[vo[a]]:
            b += 1
        total = 0
        for i in range(a, b):
            vc[vo[i]] = block_parse(base, offsets, vo[i], NULL, 0)
            total += vc[vo[i]]
        if b - a > 1 and total > largest:
            largest = total
        a = b
    if largest == 0:
        return cards
    try:
        buf = <uint32_t*> malloc(largest * sizeof(uint32_t))
        if buf == NULL:
            raise MemoryError()
        a = 0
        while a < n:
            b = a + 1
            while b < n and ledgers[vo[b]] == ledgers[vo[a]]:
                b += 1
            if b - a > 1:
                got = 0
                for i in range(a, b):
                    card = block_parse(base, offsets, vo[i], buf + got, largest - got)
                    got += card
                low = buf[0]
                high = buf[0]
                for j in range(got):
                    if buf[j] < low:
                        low = buf[j]
                    if buf[j] > high:
                        high = buf[j]
                words = ((<Py_ssize_t> (high - low)) >> 6) + 1
                if words <= 2 * got + 16:
                    if words > bitset_words:
                        free(bitset)
                        bitset = <uint64_t*> malloc(words * sizeof(uint64_t))
                        if bitset == NULL:
                            raise MemoryError()
                        bitset_words = words
                    memset(bitset, 0, words * sizeof(uint64_t))
                    for j in range(got):
                        value = buf[j] - low
                        if (bitset[value >> 6] >> (value & 63)) & 1:
                            raise ValueError(
                                f"position ({ledgers[vo[a]]}, {buf[j]}) is in two segments")
                        bitset[value >> 6] |= (<uint64_t> 1) << (value & 63)
                else:
                    if keys == NULL:
                        keys = <uint64_t*> malloc(largest * sizeof(uint64_t))
                        scratch_keys = <uint64_t*> malloc(largest * sizeof(uint64_t))
                        if not (keys and scratch_keys):
                            raise MemoryError()
                    for j in range(got):
                        keys[j] = buf[j]
                    di_radix_sort_keys(<unsigned long long*> keys,
                                       <unsigned long long*> scratch_keys, got, 0, 32)
                    for j in range(1, got):
                        if keys[j] == keys[j - 1]:
                            raise ValueError(
                                f"position ({ledgers[vo[a]]}, {keys[j]}) is in two segments")
            a = b
    finally:
        free(buf)
        free(bitset)
        free(keys)
        free(scratch_keys)
    return cards


def pack_times(const int64_t[:] times not None, int64_t base, int64_t span):
    """Bit-pack ``times - base`` at ``bit_length(span)`` bits each, LSB-first.

    Every ``times[i] - base`` must lie in ``[0, span]`` (ValueError otherwise).
    """
    cdef Py_ssize_t n = times.shape[0], i, nbytes
    cdef int bits
    cdef uint8_t* buf
    if span < 0:
        raise ValueError("span must be >= 0")
    bits = bit_length(<uint64_t> span)
    for i in range(n):
        if times[i] < base or <uint64_t> times[i] - <uint64_t> base > <uint64_t> span:
            raise ValueError(f"time {times[i]} outside [{base}, {base + span}]")
    nbytes = (n * bits + 7) // 8
    out = bytearray(nbytes + 8)  # zeroed, with the 8 bytes di_pack_bits may touch past the end
    buf = out
    cdef const int64_t[::1] flat = np.ascontiguousarray(times, dtype=np.int64)
    if nbytes:
        di_pack_bits(buf, <const long long*> &flat[0], 1, n, base, bits)
    return PyBytes_FromStringAndSize(<char*> buf, nbytes)


cdef inline uint64_t unpack_one(const uint8_t* buf, uint64_t bitpos, int bits) noexcept nogil:
    cdef uint64_t v = 0
    cdef int b = 0, take
    cdef uint64_t byte_index = bitpos >> 3
    cdef int shift = bitpos & 7
    while b < bits:
        take = 8 - shift
        if take > bits - b:
            take = bits - b
        v |= (<uint64_t> ((buf[byte_index] >> shift) & ((1 << take) - 1))) << b
        b += take
        byte_index += 1
        shift = 0
    return v


cdef inline void copy_triples(uint64_t* keys, int64_t* ledgers, int64_t* entries,
                              const uint64_t* src_keys, const int64_t* src_ledgers,
                              const int64_t* src_entries, Py_ssize_t n) noexcept nogil:
    cdef Py_ssize_t i
    for i in range(n):
        keys[i] = src_keys[i]
        ledgers[i] = src_ledgers[i]
        entries[i] = src_entries[i]


cdef void radix_sort(uint64_t* keys, int64_t* ls, int64_t* es, Py_ssize_t n, int bits,
                     uint64_t* tk, int64_t* tl, int64_t* te) noexcept nogil:
    """Stable sort of (key, ledger, entry) by key; tk/tl/te are scratch buffers of size n."""
    cdef Py_ssize_t i, j
    cdef Py_ssize_t count[1 << RADIX_BITS]
    cdef int shift
    cdef uint64_t k, mask = (1 << RADIX_BITS) - 1
    cdef int64_t xl, xe
    if n <= INSERTION_SORT_MAX:
        for i in range(1, n):
            k = keys[i]
            xl = ls[i]
            xe = es[i]
            j = i
            while j > 0 and keys[j - 1] > k:
                keys[j] = keys[j - 1]
                ls[j] = ls[j - 1]
                es[j] = es[j - 1]
                j -= 1
            keys[j] = k
            ls[j] = xl
            es[j] = xe
        return
    shift = 0
    while shift < bits:
        memset(count, 0, sizeof(count))
        for i in range(n):
            count[(keys[i] >> shift) & mask] += 1
        j = 0
        for i in range(1 << RADIX_BITS):
            k = count[i]
            count[i] = j
            j += k
        for i in range(n):
            k = (keys[i] >> shift) & mask
            tk[count[k]] = keys[i]
            tl[count[k]] = ls[i]
            te[count[k]] = es[i]
            count[k] += 1
        copy_triples(keys, ls, es, tk, tl, te, n)
        shift += RADIX_BITS
