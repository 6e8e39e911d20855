# SharedFront and SubFront: the hot calls of a shared index and of its subscriptions (pure
# twins: delayindex/_pure/front.py).
#
# How it works. SharedDelayIndex.add and Subscription.contains answer, in the usual case, from the
# topic index alone: a position that neither the due log nor a subscription's private heap holds
# ("held") is the topic index's only. So the usual case is one native call under the topic
# index's lock only: the arguments converted once, "held" as two bitmap probes (the due log's
# in-memory and spilled position sets) plus a dict probe only when some subscription has private
# copies, then the topic Front's own add or contains, lock held. A held position, or a closed
# shared index, goes to the hooks instead, with no lock held: they take the shared index's lock
# and decide again there (its rules live in delayindex.tracker.shared).
#
# Why the topic lock is enough. Under it, "not held" cannot change: a position becomes held only
# when a poll moves it from the topic index into the due log (the shared index appends to the
# log while it still holds the topic lock) or by a re-add of a position already held; a spill
# puts a chunk's positions in the spilled set before it takes them out of the in-memory one.
# Leaving the log (a trim, a clear) only drops positions every subscription has read, for which
# the topic index's "not tracked" is the right answer too. The lock order stays shared, then
# topic: a hook is called after the topic lock is released.
#
# Invariants: ``log_memory``/``log_spilled`` are the due log's own position sets (never
# replaced) and ``private_count`` the shared index's own dict, so "held" is always current; a
# SubFront's mark is its subscription's mark (``_SubState.mark`` reads and writes it here).


@cython.final
cdef class SharedFront:
    """The shared index's hot calls: ``SharedFront(topic_front, log_memory, log_spilled,
    private_count)``: the topic index's Front, the due log's two position sets
    (LedgerIndexes), the dict of positions held in private heaps. ``slow_add(ledger, entry,
    deliver_at)`` answers for a held position or a closed shared index (no lock held); without
    it every add goes to the topic index.
    """

    cdef Front topic
    cdef LedgerIndex log_memory, log_spilled
    cdef dict private_count
    cdef public object slow_add
    cdef public object diagnose  # diagnose(ledger, entry, deliver_at): names a bad argument
    cdef public bint closed

    def __cinit__(self, Front topic_front not None, LedgerIndex log_memory not None,
                  LedgerIndex log_spilled not None, dict private_count not None):
        self.topic = topic_front
        self.log_memory = log_memory
        self.log_spilled = log_spilled
        self.private_count = private_count
        self.slow_add = self.diagnose = None
        self.closed = False

    cdef inline bint held(self, object ledger, object entry, int64_t c_ledger,
                          int64_t c_entry) except -1:
        return (
            self.log_memory.ccontains(c_ledger, c_entry)
            or self.log_spilled.ccontains(c_ledger, c_entry)
            or (len(self.private_count) > 0 and (ledger, entry) in self.private_count)
        )

    def add(self, ledger, entry, deliver_at) -> bool:
        """The topic index's add under its lock, unless the position is held or the shared
        index closed (then ``slow_add``); True unless it is to be delivered now. Bad arguments
        raise first (``diagnose`` may name them)."""
        try:
            return self.cadd(ledger, entry, deliver_at)
        except (TypeError, OverflowError):  # a bad argument, or a bad clock value
            if self.diagnose is not None:
                self.diagnose(ledger, entry, deliver_at)
            raise

    cdef bint cadd(self, object ledger, object entry, object deliver_at) except -1:
        cdef int64_t c_ledger = as_i64(ledger)
        cdef int64_t c_entry = as_i64(entry)
        cdef int64_t c_time = as_i64(deliver_at)
        cdef Front topic = self.topic
        cdef bint slow = self.closed and self.slow_add is not None
        cdef int code = ADD_DELIVER_
        check_ids(c_ledger, c_entry)
        if not slow:
            topic.take()
            try:
                slow = self.slow_add is not None and self.held(ledger, entry, c_ledger, c_entry)
                if not slow:
                    code = topic.add_locked(ledger, entry, deliver_at, c_ledger, c_entry, c_time)
            finally:
                topic.give()
        if slow:
            return self.slow_add(ledger, entry, deliver_at)
        topic.after_call()
        return code != ADD_DELIVER_

    def is_held(self, ledger, entry) -> bool:
        """Whether the due log or a private heap holds the position (no lock taken)."""
        cdef int64_t c_ledger = as_i64(ledger)
        cdef int64_t c_entry = as_i64(entry)
        check_ids(c_ledger, c_entry)
        return self.held(ledger, entry, c_ledger, c_entry)

    def _check(self) -> None:
        """Nothing beyond the types to check (the attributes are typed)."""


@cython.final
cdef class SubFront:
    """A subscription's hot calls: ``SubFront(shared_front)``. ``slow_contains(ledger, entry)``
    answers for a held position (no lock held); without it the topic index answers. The
    subscription binds ``contains`` as its own (no Python frame per call)."""

    cdef SharedFront shared
    cdef public object slow_contains
    cdef public object diagnose  # diagnose(ledger, entry): raises the clearer error of a bad id
    cdef public bint detached
    cdef bint _marked
    cdef int64_t _mark_ledger, _mark_entry

    def __cinit__(self, SharedFront shared not None):
        self.shared = shared
        self.slow_contains = self.diagnose = None
        self.detached = False
        self._marked = False
        self._mark_ledger = self._mark_entry = 0

    @property
    def mark(self):
        """The subscription's mark-delete position ``(ledger, entry)``, or None."""
        return (self._mark_ledger, self._mark_entry) if self._marked else None

    @mark.setter
    def mark(self, object value):
        cdef int64_t c_ledger, c_entry
        if value is None:
            self._marked = False
            return
        ledger, entry = value
        c_ledger = as_i64(ledger)
        c_entry = as_i64(entry)
        self._mark_ledger, self._mark_entry, self._marked = c_ledger, c_entry, True

    def contains(self, ledger, entry) -> bool:
        """Whether the subscription still has to receive the position: False when closed,
        detached or acknowledged; else the topic index's answer, unless the position is held
        (then ``slow_contains``). A bad id raises; ``diagnose`` may name it first."""
        cdef int64_t c_ledger, c_entry
        cdef SharedFront shared = self.shared
        cdef Front topic = shared.topic
        cdef bint found = False, slow = False
        convert_position(ledger, entry, self.diagnose, &c_ledger, &c_entry)
        if shared.closed or self.detached:
            return False
        if self._marked and (
            c_ledger < self._mark_ledger
            or (c_ledger == self._mark_ledger and c_entry <= self._mark_entry)
        ):
            return False
        topic.take()
        try:
            slow = (self.slow_contains is not None
                    and shared.held(ledger, entry, c_ledger, c_entry))
            if not slow:
                found = topic.contains_locked(ledger, entry, c_ledger, c_entry)
        finally:
            topic.give()
        if slow:
            return self.slow_contains(ledger, entry)
        return found

    def _check(self) -> None:
        """Nothing beyond the types to check (the attributes are typed)."""
