# Codec kernels, reading: varints, murmur3 checksums, and the batch decode of segments
# (decode_segments, unpack_segment_times) with its duplicate check and reusable scratch block;
# roaring_union_by_ledger for recovery. Included after _codec.pxi, whose parser, unpacker and
# radix sort it uses (see that file's header for the segment layout).
#
# How it works. Everything in a batch is decoded in one call, so that thousands of one-index
# segments cost no Python-level work each: every entry's framing and checksum is verified, its
# bitmaps parsed and times unpacked into one scratch block, then each segment is sorted by time.
#
# Invariants: as in _codec.pxi, malformed input raises ValueError and nothing reads outside a
# buffer; the scratch block is used by one decode at a time (the decode holds the GIL).


def read_varints(const uint8_t[::1] data not None, Py_ssize_t start, Py_ssize_t count):
    """Decode ``count`` unsigned LEB128 varints from ``data[start:]``.

    Returns ``(values int64 array, end position)``; ValueError if truncated or over 63 bits.
    """
    cdef Py_ssize_t pos = start, i, size = data.shape[0]
    cdef uint64_t value
    cdef int shift
    cdef uint8_t byte
    if count < 0 or start < 0:
        raise ValueError("bad varint request")
    out = np.empty(count, dtype=np.int64)
    cdef int64_t[::1] view = out
    for i in range(count):
        value = 0
        shift = 0
        while True:
            if pos >= size or shift > 56:
                raise ValueError("bad varint")
            byte = data[pos]
            pos += 1
            value |= (<uint64_t> (byte & 0x7F)) << shift
            if byte < 0x80:
                break
            shift += 7
        if value >> 63:
            raise ValueError("varint too large")
        view[i] = <int64_t> value
    return out, pos


cdef enum:
    GAP_ESCAPE = 255  # a step byte that says: the gap is in the escapes stream
# Entry ids are those of 32-bit roaring bitmaps.
cdef int64_t ENTRY_LIMIT = 4294967296


def unpack_entry_gaps(const uint8_t[::1] raw not None, Py_ssize_t start, Py_ssize_t groups):
    """Format 6's entry gaps (``delayindex.snapshot._gaps``): the ``groups`` (segment, ledger)
    entry sets whose streams begin at ``raw[start]`` and end at its end, as ``(values,
    bounds)``, group ``g`` being ``values[bounds[g]:bounds[g + 1]]`` (uint32, int64).
    ValueError unless the streams are exactly well-formed (the pure twin's checks, in its
    order and with its messages)."""
    cdef Py_ssize_t size = raw.shape[0], g, i, at, later, total = 0, n_escapes = 0, k = 0
    cdef uint64_t value
    cards, after_cards = read_varints(raw, start, groups)
    cdef const int64_t[::1] vc = cards
    for g in range(groups):
        if vc[g] < 1:
            raise ValueError("a (segment, ledger) holds no entry")
    for g in range(groups):
        if vc[g] > size:  # each later entry takes a byte at least
            raise ValueError("a (segment, ledger) holds more entries than the part has bytes")
    firsts, at = read_varints(raw, after_cards, groups)
    cdef const int64_t[::1] vf = firsts
    for g in range(groups):
        if vf[g] >= ENTRY_LIMIT:
            raise ValueError("an entry id beyond 32 bits")
        total += vc[g]
    later = total - groups
    if size - at < later:
        raise ValueError("the entry gaps are cut short")
    for i in range(at, at + later):
        if raw[i] == GAP_ESCAPE:
            n_escapes += 1
    extras, end = read_varints(raw, at + later, n_escapes)
    if end != size:
        raise ValueError("bytes after the entry gaps")
    cdef const int64_t[::1] ve = extras
    for i in range(n_escapes):
        if ve[i] >= ENTRY_LIMIT:
            raise ValueError("an entry gap beyond 32 bits")
    values = np.empty(total, dtype=np.uint32)
    bounds = np.empty(groups + 1, dtype=np.int64)
    cdef uint32_t[::1] vv = values
    cdef int64_t[::1] vb = bounds
    cdef Py_ssize_t out = 0
    vb[0] = 0
    for g in range(groups):
        value = <uint64_t> vf[g]
        vv[out] = <uint32_t> value
        out += 1
        for i in range(vc[g] - 1):
            if raw[at] == GAP_ESCAPE:
                value += GAP_ESCAPE + 1 + <uint64_t> ve[k]
                k += 1
            else:
                value += raw[at] + 1
            at += 1
            if value >= <uint64_t> ENTRY_LIMIT:
                raise ValueError("an entry id beyond 32 bits")
            vv[out] = <uint32_t> value
            out += 1
        vb[g + 1] = out
    return values, bounds


def murmur3_32(const uint8_t[::1] data not None, uint32_t seed) -> int:
    """MurmurHash3 x86_32 of ``data`` (equals ``mmh3.hash(data, seed, signed=False)``)."""
    return di_murmur3_32(&data[0] if data.shape[0] else NULL, data.shape[0], seed)


cdef int check_distinct(const int64_t* slots, const uint32_t* entries, Py_ssize_t n) except -1:
    """Fail if two of the n (slot, entry) pairs are equal. O(n + slots + entry ranges)."""
    cdef Py_ssize_t i, j, a, b, n_slots = 0, words, bitset_words = 0
    cdef Py_ssize_t* starts = NULL
    cdef uint32_t* grouped = NULL
    cdef uint64_t* bitset = NULL
    cdef uint64_t* keys = NULL
    cdef uint64_t* scratch_keys = NULL
    cdef uint32_t low, high, value
    for i in range(n):
        if slots[i] < 0:
            raise ValueError("negative slot")
        if slots[i] + 1 > n_slots:
            n_slots = slots[i] + 1
    try:
        starts = <Py_ssize_t*> calloc(n_slots + 1, sizeof(Py_ssize_t))
        grouped = <uint32_t*> malloc(max(n, 1) * sizeof(uint32_t))
        if starts == NULL or grouped == NULL:
            raise MemoryError()
        # Bucket the entries by slot (counting sort), then check each slot on its own.
        for i in range(n):
            starts[slots[i] + 1] += 1
        for i in range(n_slots):
            starts[i + 1] += starts[i]
        for i in range(n):
            grouped[starts[slots[i]]] = entries[i]
            starts[slots[i]] += 1
        for i in range(n_slots - 1, 0, -1):
            starts[i] = starts[i - 1]
        starts[0] = 0
        for i in range(n_slots):
            a = starts[i]
            b = starts[i + 1]
            if b - a < 2:
                continue
            low = grouped[a]
            high = grouped[a]
            for j in range(a, b):
                if grouped[j] < low:
                    low = grouped[j]
                if grouped[j] > high:
                    high = grouped[j]
            words = ((<Py_ssize_t> (high - low)) >> 6) + 1
            if words <= 2 * (b - a) + 16:
                if words > bitset_words:
                    free(bitset)
                    bitset = <uint64_t*> malloc(words * sizeof(uint64_t))
                    if bitset == NULL:
                        raise MemoryError()
                    bitset_words = words
                memset(bitset, 0, words * sizeof(uint64_t))
                for j in range(a, b):
                    value = grouped[j] - low
                    if (bitset[value >> 6] >> (value & 63)) & 1:
                        raise ValueError(f"entry {grouped[j]} of a ledger is in two segments")
                    bitset[value >> 6] |= (<uint64_t> 1) << (value & 63)
            else:
                if keys == NULL:
                    keys = <uint64_t*> malloc(max(n, 1) * sizeof(uint64_t))
                    scratch_keys = <uint64_t*> malloc(max(n, 1) * sizeof(uint64_t))
                    if not (keys and scratch_keys):
                        raise MemoryError()
                for j in range(b - a):
                    keys[j] = grouped[a + j]
                di_radix_sort_keys(<unsigned long long*> keys,
                                   <unsigned long long*> scratch_keys, b - a, 0, 32)
                for j in range(1, b - a):
                    if keys[j] == keys[j - 1]:
                        raise ValueError(f"entry {keys[j]} of a ledger is in two segments")
    finally:
        free(starts)
        free(grouped)
        free(bitset)
        free(keys)
        free(scratch_keys)
    return 0


cdef const uint8_t* checked_payload(const uint8_t[::1] buffer, Py_ssize_t pos, Py_ssize_t elen,
                                    int64_t index, int64_t count, int64_t span,
                                    Py_ssize_t segment) except NULL:
    """The packed times of the segment entry at ``buffer[pos:pos + elen]``, its checksum
    (seeded with its object entry ``index``), flags and payload length checked."""
    cdef uint32_t stored = read_u32(&buffer[pos + elen - 4])
    if di_murmur3_32(&buffer[pos], elen - 4, <uint32_t> index) != stored:
        raise ValueError(f"entry {index}: checksum mismatch")
    if buffer[pos] != 0:
        raise ValueError(f"entry {index}: unknown flags {buffer[pos]:#x}")
    if elen - 5 != (count * bit_length(<uint64_t> span) + 7) // 8:
        raise ValueError(f"segment {segment}: packed times have the wrong length")
    return &buffer[pos + 1]


# decode_segments' scratch: six int64 columns and one uint32 column per index of the largest
# segment. Kept between calls (grow-only, up to SCRATCH_KEEP_BYTES) instead of allocated per
# call: a 10 M drain decodes 2000 batches, and freeing 260 KB each time made glibc trim and
# regrow the heap, zeroing fresh (often huge) pages every load. The decode holds the GIL
# throughout, so one block suffices; ``scratch_busy`` guards it all the same.
cdef enum:
    SCRATCH_BYTES_PER_INDEX = 6 * 8 + 4
    SCRATCH_KEEP_BYTES = 8 << 20
cdef void* scratch_block = NULL
cdef Py_ssize_t scratch_cap = 0
cdef bint scratch_busy = False


cdef void* take_scratch(Py_ssize_t n) except NULL:
    """A block of ``n * SCRATCH_BYTES_PER_INDEX`` bytes: the kept one when it is free and
    ``n`` fits the keeping limit, else a fresh one (``give_scratch`` frees it)."""
    global scratch_block, scratch_cap, scratch_busy
    cdef size_t size = <size_t> n * SCRATCH_BYTES_PER_INDEX
    cdef void* fresh
    if scratch_busy or size > SCRATCH_KEEP_BYTES:
        fresh = malloc(size)
        if fresh == NULL:
            raise MemoryError()
        return fresh
    if n > scratch_cap:
        fresh = realloc(scratch_block, size)
        if fresh == NULL:
            raise MemoryError()
        scratch_block = fresh
        scratch_cap = n
    scratch_busy = True
    return scratch_block


cdef void give_scratch(void* block) noexcept:
    global scratch_busy
    if block == NULL:
        return
    if block == scratch_block:
        scratch_busy = False
    else:
        free(block)


def decode_segments(const uint8_t[::1] buffer not None, const int64_t[:] entry_lengths not None,
                    int64_t first_index, const int64_t[:] mins not None,
                    const int64_t[:] spans not None, const int64_t[:] counts not None,
                    const int64_t[:] ledger_offsets not None, const int64_t[:] ledgers not None,
                    const uint8_t[::1] blob not None, const int64_t[:] bitmap_offsets not None,
                    const int64_t[:] slots=None):
    """Verify and decode consecutive framed segment entries into (time, ledger, entry) order.

    ``buffer`` holds the entries back to back (``entry_lengths`` each); entry ``i`` is stored
    object entry ``first_index + i`` (its checksum seed) and is segment ``i`` of the per-segment
    columns ``mins``, ``spans``, ``counts``; its positions are ``ledgers[ledger_offsets[i]:
    ledger_offsets[i + 1]]`` with the matching bitmaps of the block ``blob``/``bitmap_offsets``
    (portable roaring bitmaps back to back).
    Returns ``(times, ledgers, entries, offsets)``; segment i is ``offsets[i]:offsets[i+1]``.

    With ``slots`` (aligned with ``ledgers``: a dense id per distinct ledger), it also fails if a
    position appears in two of the decoded segments; each bitmap is still parsed only once.
    """
    cdef Py_ssize_t n_seg = entry_lengths.shape[0], s, i, j, total = 0, start, n, card, got
    cdef Py_ssize_t scratch = 1, pos = 0, elen, first_ledger, last_ledger
    cdef int bits, jbits
    cdef uint64_t key, jmask
    cdef int64_t ledger, prev_ledger
    cdef const uint8_t* payload
    cdef const uint8_t* base
    cdef uint64_t* keys = NULL
    cdef int64_t* ls = NULL
    cdef int64_t* es = NULL
    cdef uint64_t* sk = NULL
    cdef int64_t* sl = NULL
    cdef int64_t* se = NULL
    cdef uint32_t* ent = NULL
    cdef void* block = NULL
    cdef uint32_t* seen_entries = NULL
    cdef int64_t* seen_slots = NULL
    cdef int64_t slot
    cdef bint check = slots is not None
    if check and slots.shape[0] != ledgers.shape[0]:
        raise ValueError("slots and ledgers differ in length")
    if not (mins.shape[0] == spans.shape[0] == counts.shape[0] == n_seg
            and ledger_offsets.shape[0] == n_seg + 1):
        raise ValueError("per-segment inputs differ in length")
    base = block_base(blob, bitmap_offsets, ledgers.shape[0])
    for s in range(n_seg):
        if counts[s] < 1 or spans[s] < 0:
            raise ValueError(f"segment {s}: bad count or span")
        if entry_lengths[s] < 5:
            raise ValueError(f"entry {first_index + s}: truncated")
        total += counts[s]
        pos += entry_lengths[s]
        if counts[s] > scratch:
            scratch = counts[s]
    if pos != buffer.shape[0]:
        raise ValueError("entry lengths do not add up to the buffer")
    out_t = np.empty(total, dtype=np.int64)
    out_l = np.empty(total, dtype=np.int64)
    out_e = np.empty(total, dtype=np.int64)
    offsets = np.empty(n_seg + 1, dtype=np.int64)
    cdef int64_t[::1] vt = out_t
    cdef int64_t[::1] vl = out_l
    cdef int64_t[::1] ve = out_e
    cdef int64_t[::1] vo = offsets
    try:
        block = take_scratch(scratch)
        keys = <uint64_t*> block
        sk = keys + scratch
        ls = <int64_t*> (sk + scratch)
        sl = ls + scratch
        es = sl + scratch
        se = es + scratch
        ent = <uint32_t*> (se + scratch)
        if check:
            seen_entries = <uint32_t*> malloc(max(total, 1) * sizeof(uint32_t))
            seen_slots = <int64_t*> malloc(max(total, 1) * sizeof(int64_t))
            if not (seen_entries and seen_slots):
                raise MemoryError()
        start = 0
        pos = 0
        for s in range(n_seg):
            elen = entry_lengths[s]
            payload = checked_payload(buffer, pos, elen, first_index + s, counts[s], spans[s], s)
            pos += elen
            n = counts[s]
            vo[s] = start
            bits = bit_length(<uint64_t> spans[s])
            first_ledger = ledger_offsets[s]
            last_ledger = ledger_offsets[s + 1]
            if not 0 <= first_ledger < last_ledger <= ledgers.shape[0]:
                raise ValueError(f"segment {s}: bad ledger offsets")
            got = 0
            prev_ledger = -1
            for i in range(first_ledger, last_ledger):
                ledger = ledgers[i]
                if ledger <= prev_ledger:
                    raise ValueError(f"segment {s}: ledgers not ascending")
                prev_ledger = ledger
                card = block_parse(base, bitmap_offsets, i, ent + got, n - got)
                if card == 0 or got + card > n:
                    raise ValueError(f"segment {s}: bitmap cardinality does not match the count")
                for j in range(got, got + card):
                    ls[j] = ledger
                    es[j] = ent[j]
                if check:
                    slot = slots[i]
                    for j in range(got, got + card):
                        seen_entries[start + j] = ent[j]
                        seen_slots[start + j] = slot
                got += card
            if got != n:
                raise ValueError(f"segment {s}: bitmap cardinality does not match the count")
            jbits = bit_length(<uint64_t> (n - 1))
            if bits + jbits <= 64:
                # Sort (time << jbits | j) alone, by its time digits: 8 bytes moved per key and
                # pass instead of the triple's 24, and j (the position order) breaks ties, so
                # the order is the stable sort's. The positions are gathered once, by j.
                for j in range(n):
                    key = unpack_one(payload, <uint64_t> j * bits, bits) if bits else 0
                    if key > <uint64_t> spans[s]:
                        raise ValueError(f"segment {s}: a packed time exceeds the span")
                    keys[j] = (key << jbits) | <uint64_t> j
                di_radix_sort_keys(<unsigned long long*> keys, <unsigned long long*> sk, n,
                                   jbits, bits)
                jmask = ((<uint64_t> 1) << jbits) - 1
                if keys[0] >> jbits != 0 or keys[n - 1] >> jbits != <uint64_t> spans[s]:
                    raise ValueError(f"segment {s}: times do not span its metadata range")
                for j in range(n):
                    i = <Py_ssize_t> (keys[j] & jmask)
                    vt[start + j] = mins[s] + <int64_t> (keys[j] >> jbits)
                    vl[start + j] = ls[i]
                    ve[start + j] = es[i]
                start += n
                continue
            # A span too wide for the packed keys: sort the (time, ledger, entry) columns.
            for j in range(n):
                keys[j] = unpack_one(payload, <uint64_t> j * bits, bits) if bits else 0
                if keys[j] > <uint64_t> spans[s]:
                    raise ValueError(f"segment {s}: a packed time exceeds the span")
            radix_sort(keys, ls, es, n, bits, sk, sl, se)
            if keys[0] != 0 or keys[n - 1] != <uint64_t> spans[s]:
                raise ValueError(f"segment {s}: times do not span its metadata range")
            for j in range(n):
                vt[start + j] = mins[s] + <int64_t> keys[j]
                vl[start + j] = ls[j]
                ve[start + j] = es[j]
            start += n
        vo[n_seg] = start
        if check:
            check_distinct(seen_slots, seen_entries, start)
    finally:
        free(seen_entries)
        free(seen_slots)
        give_scratch(block)
    return out_t, out_l, out_e, offsets


def unpack_segment_times(const uint8_t[::1] buffer not None,
                         const int64_t[:] entry_lengths not None, int64_t first_index,
                         const int64_t[:] mins not None, const int64_t[:] spans not None,
                         const int64_t[:] counts not None, const int64_t[:] indexes=None):
    """Verify framed segment entries and unpack their deliver times only (in each segment's
    position order, segment after segment), without the metadata's bitmaps: the checks of
    ``decode_segments`` that do not involve positions. A histogram of a bucket whose stored
    positions are all tracked needs nothing else. Entry ``s`` is the object's entry
    ``first_index + s``, or ``indexes[s]`` when given (entries need not be consecutive)."""
    cdef Py_ssize_t n_seg = entry_lengths.shape[0], s, j, total = 0, pos = 0, start = 0, n, elen
    cdef int bits
    cdef const uint8_t* payload
    cdef uint64_t key, low, high
    cdef int64_t index
    if not (mins.shape[0] == spans.shape[0] == counts.shape[0] == n_seg):
        raise ValueError("per-segment inputs differ in length")
    if indexes is not None and indexes.shape[0] != n_seg:
        raise ValueError("one index per entry")
    for s in range(n_seg):
        index = first_index + s if indexes is None else indexes[s]
        if counts[s] < 1 or spans[s] < 0:
            raise ValueError(f"segment {s}: bad count or span")
        if entry_lengths[s] < 5:
            raise ValueError(f"entry {index}: truncated")
        total += counts[s]
        pos += entry_lengths[s]
    if pos != buffer.shape[0]:
        raise ValueError("entry lengths do not add up to the buffer")
    out = np.empty(total, dtype=np.int64)
    cdef int64_t[::1] vt = out
    pos = 0
    for s in range(n_seg):
        elen = entry_lengths[s]
        index = first_index + s if indexes is None else indexes[s]
        payload = checked_payload(buffer, pos, elen, index, counts[s], spans[s], s)
        pos += elen
        n = counts[s]
        bits = bit_length(<uint64_t> spans[s])
        low = <uint64_t> spans[s]
        high = 0
        for j in range(n):
            key = unpack_one(payload, <uint64_t> j * bits, bits) if bits else 0
            if key > <uint64_t> spans[s]:
                raise ValueError(f"segment {s}: a packed time exceeds the span")
            if key < low:
                low = key
            if key > high:
                high = key
            vt[start + j] = mins[s] + <int64_t> key
        if low != 0 or high != <uint64_t> spans[s]:
            raise ValueError(f"segment {s}: times do not span its metadata range")
        start += n
    return out


def roaring_union_by_ledger(const int64_t[:] ledgers not None, const uint8_t[::1] blob not None,
                            const int64_t[:] bitmap_offsets not None):
    """Union the bitmaps of a block (``blob``, ``bitmap_offsets``) by ledger: ``(ledger_ids,
    offsets, entries)``.

    ``ledger_ids`` ascending; the entries of ``ledger_ids[i]`` are ``entries[offsets[i]:
    offsets[i + 1]]``, ascending uint32. Recovery's hot path: a bucket's live segments hold
    thousands of small per-(segment, ledger) bitmaps, so they are parsed here in one call and
    merged through a bitset spanning each ledger's entry range (sorted instead when sparse).
    Raises ValueError on a malformed bitmap or a position in two bitmaps.
    """
    cdef Py_ssize_t n = ledgers.shape[0], i, j, a, b, got, total = 0, n_groups = 0, words
    cdef Py_ssize_t bitset_words = 0, w
    cdef uint32_t low, high, value
    cdef uint64_t word
    cdef uint64_t* bitset = NULL
    cdef const uint8_t* base = block_base(blob, bitmap_offsets, n)
    order = np.argsort(np.asarray(ledgers), kind="stable").astype(np.int64)
    cdef const int64_t[::1] vo = order
    cards = np.empty(n, dtype=np.int64)
    cdef int64_t[::1] vc = cards
    for i in range(n):
        vc[i] = block_parse(base, bitmap_offsets, i, NULL, 0)
        total += vc[i]
    a = 0
    while a < n:
        b = a + 1
        while b < n and ledgers[vo[b]] == ledgers[vo[a]]:
            b += 1
        n_groups += 1
        a = b
    ids = np.empty(n_groups, dtype=np.int64)
    offsets = np.zeros(n_groups + 1, dtype=np.int64)
    entries = np.empty(total, dtype=np.uint32)
    sparse = []
    cdef int64_t[::1] v_ids = ids
    cdef int64_t[::1] v_off = offsets
    cdef uint32_t[::1] v_ent = entries
    cdef uint32_t* out = &v_ent[0] if total else NULL
    cdef Py_ssize_t g = 0, pos = 0
    try:
        a = 0
        while a < n:
            b = a + 1
            while b < n and ledgers[vo[b]] == ledgers[vo[a]]:
                b += 1
            got = 0
            for i in range(a, b):
                got += block_parse(base, bitmap_offsets, vo[i], out + pos + got, vc[vo[i]])
            if b - a > 1 and got > 1:
                low = high = out[pos]
                for j in range(got):
                    value = out[pos + j]
                    if value < low:
                        low = value
                    if value > high:
                        high = value
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
                        value = out[pos + j] - low
                        if (bitset[value >> 6] >> (value & 63)) & 1:
                            raise ValueError(
                                f"position ({ledgers[vo[a]]}, {out[pos + j]}) is in two "
                                f"segments")
                        bitset[value >> 6] |= (<uint64_t> 1) << (value & 63)
                    j = 0
                    for w in range(words):
                        word = bitset[w]
                        while word:
                            out[pos + j] = low + <uint32_t> ((w << 6) + <uint32_t> di_ctzll(word))
                            j += 1
                            word &= word - 1
                else:
                    sparse.append(g)
            v_ids[g] = ledgers[vo[a]]
            pos += got
            v_off[g + 1] = pos
            g += 1
            a = b
    finally:
        free(bitset)
    for g in sparse:
        part = entries[offsets[g]:offsets[g + 1]]
        part.sort()
        twice = np.flatnonzero(part[1:] == part[:len(part) - 1])
        if len(twice):
            raise ValueError(f"position ({ids[g]}, {part[twice[0]]}) is in two segments")
    return ids, offsets, entries[:pos]
