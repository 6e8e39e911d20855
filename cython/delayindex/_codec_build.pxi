# Codec kernels, the writing half (included right after _codec.pxi, whose helpers it uses):
# building a bucket's snapshot parts.
#
# How it works. build_segments sorts a bucket's indexes by (time, ledger, entry), cuts them into
# segments (the snapshot format's rule: max_time_step_ms, max_indexes_per_segment) and encodes
# each segment in the same pass: one portable roaring bitmap per (segment, ledger), written as
# pyroaring would after run_optimize (array, bitset or run container, whichever is smaller), all
# back to back in one blob, and the segment's times bit-packed in the bitmaps' position order.
# Everything but the final bytes objects runs without the GIL, so a background seal leaves the
# other core to the caller.
#
# Invariants: the bytes are exactly what the readers in _codec.pxi accept (the codec tests decode
# every build); the growable buffers report running out of memory (grow_buf returns NULL), never
# write past their capacity.

cdef inline void write_u16(uint8_t* p, uint16_t v) noexcept nogil:
    p[0] = v & 0xFF
    p[1] = v >> 8


cdef inline void write_u32(uint8_t* p, uint32_t v) noexcept nogil:
    p[0] = v & 0xFF
    p[1] = (v >> 8) & 0xFF
    p[2] = (v >> 16) & 0xFF
    p[3] = v >> 24


cdef Py_ssize_t roaring_write(const uint32_t* values, Py_ssize_t n, uint8_t* out,
                              int* kinds, Py_ssize_t* bounds, Py_ssize_t* nruns) noexcept nogil:
    """Portable roaring bytes of ascending distinct ``values`` into ``out`` (when not NULL);
    returns the size. Byte-identical to pyroaring's ``run_optimize(); serialize()``: per 2**16
    chunk an array (<= 4096 values), a bitset, or a run container when strictly smaller.
    ``kinds``, ``bounds`` and ``nruns`` are scratch of at least ``n + 1`` elements."""
    cdef Py_ssize_t i, j, k, n_cont = 0, pos, start, runs, run_len, header, body = 0
    cdef bint has_runs = False
    cdef uint32_t key
    i = 0
    while i < n:
        key = values[i] >> 16
        bounds[n_cont] = i
        runs = 1
        j = i + 1
        while j < n and values[j] >> 16 == key:
            if values[j] != values[j - 1] + 1:
                runs += 1
            j += 1
        nruns[n_cont] = runs
        if j - i <= ROARING_ARRAY_MAX:
            kinds[n_cont] = 2 if 2 + 4 * runs < 2 * (j - i) else 0
        else:
            kinds[n_cont] = 2 if 2 + 4 * runs < 8192 else 1
        if kinds[n_cont] == 2:
            has_runs = True
            body += 2 + 4 * runs
        elif kinds[n_cont] == 1:
            body += 8192
        else:
            body += 2 * (j - i)
        i = j
        n_cont += 1
    bounds[n_cont] = n
    if has_runs:
        header = 4 + (n_cont + 7) // 8 + 4 * n_cont
        if n_cont >= ROARING_NO_OFFSET_THRESHOLD:
            header += 4 * n_cont
    else:
        header = 8 + 8 * n_cont
    if out == NULL:
        return header + body
    memset(out, 0, header + body)
    if has_runs:
        write_u32(out, ROARING_COOKIE | ((<uint32_t> (n_cont - 1)) << 16))
        pos = 4
        for k in range(n_cont):
            if kinds[k] == 2:
                out[pos + (k >> 3)] |= <uint8_t> (1 << (k & 7))
        pos += (n_cont + 7) // 8
    else:
        write_u32(out, ROARING_COOKIE_NO_RUN)
        write_u32(out + 4, <uint32_t> n_cont)
        pos = 8
    for k in range(n_cont):
        write_u16(out + pos, <uint16_t> (values[bounds[k]] >> 16))
        write_u16(out + pos + 2, <uint16_t> (bounds[k + 1] - bounds[k] - 1))
        pos += 4
    start = header
    if not has_runs or n_cont >= ROARING_NO_OFFSET_THRESHOLD:
        for k in range(n_cont):
            write_u32(out + pos, <uint32_t> start)
            pos += 4
            if kinds[k] == 2:
                start += 2 + 4 * nruns[k]
            elif kinds[k] == 1:
                start += 8192
            else:
                start += 2 * (bounds[k + 1] - bounds[k])
    pos = header
    for k in range(n_cont):
        if kinds[k] == 0:
            for i in range(bounds[k], bounds[k + 1]):
                write_u16(out + pos, <uint16_t> (values[i] & 0xFFFF))
                pos += 2
        elif kinds[k] == 1:
            for i in range(bounds[k], bounds[k + 1]):
                j = values[i] & 0xFFFF
                out[pos + (j >> 3)] |= <uint8_t> (1 << (j & 7))
            pos += 8192
        else:
            write_u16(out + pos, <uint16_t> nruns[k])
            pos += 2
            i = bounds[k]
            while i < bounds[k + 1]:
                run_len = 1
                while (i + run_len < bounds[k + 1]
                       and values[i + run_len] == values[i + run_len - 1] + 1):
                    run_len += 1
                write_u16(out + pos, <uint16_t> (values[i] & 0xFFFF))
                write_u16(out + pos + 2, <uint16_t> (run_len - 1))
                pos += 4
                i += run_len
    return header + body


def roaring_write_block(const uint32_t[::1] values not None, const int64_t[:] bounds not None):
    """Each group ``values[bounds[g]:bounds[g + 1]]`` (non-empty, ascending) as a portable
    roaring bitmap written as ``build_segments`` writes it (pyroaring's bytes after
    ``run_optimize``), back to back: ``(blob, offsets)``, bitmap ``g`` at
    ``blob[offsets[g]:offsets[g + 1]]``. ValueError on bounds that do not frame ``values`` in
    non-empty groups, or a group not strictly ascending."""
    cdef Py_ssize_t g, i, n = bounds.shape[0] - 1, largest = 0, size
    if n < 0:
        raise ValueError("group bounds are empty")
    if bounds[0] != 0 or bounds[n] != values.shape[0]:
        raise ValueError("group bounds do not span the values")
    for g in range(n):
        if bounds[g + 1] <= bounds[g]:
            raise ValueError("a group is empty or its bounds decrease")
        if bounds[g + 1] - bounds[g] > largest:
            largest = bounds[g + 1] - bounds[g]
        for i in range(bounds[g] + 1, bounds[g + 1]):
            if values[i] <= values[i - 1]:
                raise ValueError("a group's values are not ascending")
    offsets = np.empty(n + 1, dtype=np.int64)
    cdef int64_t[::1] vo = offsets
    cdef int* kinds = <int*> malloc((largest + 1) * sizeof(int))
    cdef Py_ssize_t* scratch_bounds = <Py_ssize_t*> malloc((largest + 1) * sizeof(Py_ssize_t))
    cdef Py_ssize_t* nruns = <Py_ssize_t*> malloc((largest + 1) * sizeof(Py_ssize_t))
    cdef uint8_t* dst
    try:
        if kinds == NULL or scratch_bounds == NULL or nruns == NULL:
            raise MemoryError()
        vo[0] = 0
        for g in range(n):
            size = roaring_write(&values[bounds[g]], bounds[g + 1] - bounds[g], NULL, kinds,
                                 scratch_bounds, nruns)
            vo[g + 1] = vo[g] + size
        out = PyBytes_FromStringAndSize(NULL, vo[n])
        dst = <uint8_t*> PyBytes_AS_STRING(out)
        for g in range(n):
            roaring_write(&values[bounds[g]], bounds[g + 1] - bounds[g], dst + vo[g], kinds,
                          scratch_bounds, nruns)
    finally:
        free(kinds)
        free(scratch_bounds)
        free(nruns)
    return out, offsets


ctypedef struct GrowBuf:
    uint8_t* data
    size_t size
    size_t cap


cdef inline uint8_t* grow_buf(GrowBuf* b, size_t extra) noexcept nogil:
    """Room for ``extra`` more bytes at the end (NULL if out of memory)."""
    cdef size_t need = b.size + extra, cap = b.cap
    cdef uint8_t* p
    if need > cap or b.data == NULL:
        cap = cap * 2 if cap else 4096
        while cap < need:
            cap *= 2
        p = <uint8_t*> realloc(b.data, cap)
        if p == NULL:
            return NULL
        b.data = p
        b.cap = cap
    return b.data + b.size


def build_segments(const int64_t[:] times not None, const int64_t[:] ledgers not None,
                   const int64_t[:] entries not None, int64_t max_time_step_ms,
                   int64_t max_indexes_per_segment):
    """Sort indexes, cut them into segments and encode each segment's parts, in one pass.

    Returns ``(times, ledgers, entries, mins, maxs, counts, ledger_offsets, seg_ledgers,
    blob, bitmap_offsets, packed)``: the indexes sorted by (time, ledger, entry); per segment
    its min and max time and count; per (segment, ledger) the ledger id and its portable
    roaring bitmap (as pyroaring would serialize it after ``run_optimize``), all of them back to
    back in the bytes ``blob``, bitmap ``i`` at ``blob[bitmap_offsets[i]:bitmap_offsets[i + 1]]``;
    per segment its times bit-packed in
    position order (as ``pack_times``). Positions must be distinct within a segment (checked)
    and ids in range (the caller validates). All the work but the final ``bytes`` objects runs
    without the GIL, so a background seal leaves the other core to the caller.
    """
    cdef Py_ssize_t n = times.shape[0], i, a, b, g, k, size
    cdef Py_ssize_t n_seg = 0, n_piece = 0
    cdef DiTriple* all_ = NULL
    cdef DiTriple* seg = NULL
    cdef uint32_t* vals = NULL
    cdef int* kinds = NULL
    cdef Py_ssize_t* bounds = NULL
    cdef Py_ssize_t* nruns = NULL
    cdef int64_t* seg_info = NULL        # per segment: min, max, count, n_pieces_end
    cdef int64_t* piece_info = NULL      # per piece: ledger, bitmap offset, bitmap size
    cdef int64_t* pack_info = NULL       # per segment: packed offset, packed size
    cdef GrowBuf bm_buf, pack_buf
    cdef int64_t upper, base, span
    cdef int bits, failed = 0
    cdef int64_t dup_ledger = 0, dup_entry = 0
    cdef uint8_t* dst
    cdef int64_t[:, ::1] info_view, pieces_view
    cdef int64_t[::1] bitmap_offsets_view
    if ledgers.shape[0] != n or entries.shape[0] != n:
        raise ValueError("times, ledgers and entries differ in length")
    if max_time_step_ms < 1:
        raise ValueError("max_time_step_ms must be >= 1")
    bm_buf.data = pack_buf.data = NULL
    bm_buf.size = bm_buf.cap = pack_buf.size = pack_buf.cap = 0
    t_out = np.empty(n, dtype=np.int64)
    l_out = np.empty(n, dtype=np.int64)
    e_out = np.empty(n, dtype=np.int64)
    cdef int64_t[::1] vt = t_out, vl = l_out, ve = e_out
    cdef Py_ssize_t m = n if n else 1
    try:
        all_ = <DiTriple*> malloc(m * sizeof(DiTriple))
        seg = <DiTriple*> malloc(m * sizeof(DiTriple))
        vals = <uint32_t*> malloc(m * sizeof(uint32_t))
        kinds = <int*> malloc((m + 1) * sizeof(int))
        bounds = <Py_ssize_t*> malloc((m + 1) * sizeof(Py_ssize_t))
        nruns = <Py_ssize_t*> malloc((m + 1) * sizeof(Py_ssize_t))
        seg_info = <int64_t*> malloc(4 * m * sizeof(int64_t))
        piece_info = <int64_t*> malloc(3 * m * sizeof(int64_t))
        pack_info = <int64_t*> malloc(2 * m * sizeof(int64_t))
        if not (all_ and seg and vals and kinds and bounds and nruns and seg_info
                and piece_info and pack_info):
            raise MemoryError()
        for i in range(n):
            all_[i].time = times[i]
            all_[i].ledger = ledgers[i]
            all_[i].entry = entries[i]
        with nogil:
            di_sort_triples(all_, n, 1)
            for i in range(n):
                vt[i] = all_[i].time
                vl[i] = all_[i].ledger
                ve[i] = all_[i].entry
            a = 0
            while a < n and not failed:
                if all_[a].time > INT64_MAX_ - max_time_step_ms + 1:
                    upper = INT64_MAX_
                else:
                    upper = all_[a].time + max_time_step_ms - 1
                b = a + 1
                while b < n and all_[b].time <= upper and (
                        max_indexes_per_segment == -1 or b - a < max_indexes_per_segment):
                    b += 1
                base = all_[a].time
                span = all_[b - 1].time - base
                for i in range(b - a):
                    seg[i] = all_[a + i]
                di_sort_triples(seg, b - a, 0)
                g = 0
                while g < b - a:
                    k = g
                    while k < b - a and seg[k].ledger == seg[g].ledger:
                        vals[k - g] = <uint32_t> seg[k].entry
                        if k > g and seg[k].entry == seg[k - 1].entry:
                            failed = 1
                            dup_ledger, dup_entry = seg[k].ledger, seg[k].entry
                        k += 1
                    size = roaring_write(vals, k - g, NULL, kinds, bounds, nruns)
                    dst = grow_buf(&bm_buf, size)
                    if dst == NULL:
                        failed = 2
                        break
                    roaring_write(vals, k - g, dst, kinds, bounds, nruns)
                    piece_info[3 * n_piece] = seg[g].ledger
                    piece_info[3 * n_piece + 1] = <int64_t> bm_buf.size
                    piece_info[3 * n_piece + 2] = size
                    bm_buf.size += size
                    n_piece += 1
                    g = k
                bits = bit_length(<uint64_t> span)
                size = ((b - a) * bits + 7) // 8
                dst = grow_buf(&pack_buf, size + 8)  # di_pack_bits writes 8-byte words
                if dst == NULL:
                    failed = 2
                    break
                memset(dst, 0, size + 8)
                di_pack_bits(dst, &seg[0].time, 3, b - a, base, bits)  # a triple: 3 int64
                pack_info[2 * n_seg] = <int64_t> pack_buf.size
                pack_info[2 * n_seg + 1] = size
                pack_buf.size += size
                seg_info[4 * n_seg] = base
                seg_info[4 * n_seg + 1] = all_[b - 1].time
                seg_info[4 * n_seg + 2] = b - a
                seg_info[4 * n_seg + 3] = n_piece
                n_seg += 1
                a = b
        if failed == 1:
            raise ValueError(f"position ({dup_ledger}, {dup_entry}) appears twice")
        if failed:
            raise MemoryError()
        info = np.empty((n_seg, 4), dtype=np.int64)
        pieces = np.empty((n_piece, 3), dtype=np.int64)
        info_view = info
        pieces_view = pieces
        for i in range(n_seg):
            for k in range(4):
                info_view[i, k] = seg_info[4 * i + k]
        for i in range(n_piece):
            for k in range(3):
                pieces_view[i, k] = piece_info[3 * i + k]
        # The pieces' bitmaps lie back to back in bm_buf: one block, no object per bitmap.
        bitmap_offsets = np.empty(n_piece + 1, dtype=np.int64)
        bitmap_offsets_view = bitmap_offsets
        for i in range(n_piece):
            bitmap_offsets_view[i] = piece_info[3 * i + 1]
            if i and piece_info[3 * i + 1] != piece_info[3 * i - 2] + piece_info[3 * i - 1]:
                raise AssertionError("bitmap pieces are not contiguous")
        bitmap_offsets_view[n_piece] = <int64_t> bm_buf.size
        blob = PyBytes_FromStringAndSize(<char*> bm_buf.data, bm_buf.size)
        packed = [
            PyBytes_FromStringAndSize(<char*> pack_buf.data + pack_info[2 * i],
                                      pack_info[2 * i + 1])
            for i in range(n_seg)]
    finally:
        free(all_)
        free(seg)
        free(vals)
        free(kinds)
        free(bounds)
        free(nruns)
        free(seg_info)
        free(piece_info)
        free(pack_info)
        free(bm_buf.data)
        free(pack_buf.data)
    offsets = np.zeros(n_seg + 1, dtype=np.int64)
    offsets[1:] = info[:, 3]
    return (t_out, l_out, e_out, info[:, 0].copy(), info[:, 1].copy(), info[:, 2].copy(),
            offsets, pieces[:, 0].copy(), blob, bitmap_offsets, packed)
