# _BucketOverrides: BucketCore's cancel, reschedule and eviction of cancels, and its add path
# (the add path sits here because reschedule re-adds). See _bucket.pxi's header, "Cancel and
# reschedule" and "Eviction", for how they work; the fields are declared in _bucket_state.pxi.
# Cdef methods are final, as in _bucket_state.pxi: calls to them stay direct.


cdef class _BucketOverrides(_BucketState):
    """BucketCore's cancel, reschedule, eviction and add (see _bucket_overrides.pxi)."""

    # -- cancel and reschedule ------------------------------------------------------------------

    @cython.final
    cdef inline bint acked(self, int64_t ledger, int64_t entry) noexcept:
        return ledger < self.mark_ledger or (
            ledger == self.mark_ledger and entry <= self.mark_entry)

    @cython.final
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

    @cython.final
    cdef inline void note_deliver_at(self, int64_t deliver_at) noexcept:
        if deliver_at < self.highest - self._tick:
            self.fixed_delay = False
        if deliver_at > self.highest:
            self.highest = deliver_at

    @cython.final
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
        sealed = ledger <= self.max_sealed_end and self.sealed_holds(ledger)
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
