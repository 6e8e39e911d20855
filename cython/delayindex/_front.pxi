# Front: the hot calls of a tracker (pure twin: delayindex/_pure/front.py).
#
# How it works. A tracker's public ``add``, ``contains``, ``cancel``, ``poll`` and
# ``tracked_entries`` each take its lock, read its clock and call its core. Done in Python that
# is about two thirds of a call; here it is one native call: the arguments are converted once,
# the lock's bound ``acquire``/``release`` are called directly, the default wall clock is read
# with clock_gettime (any other clock is called), and a native core (TrackerCore or BucketCore)
# is reached through its C methods. Any other core (the closed stand-in) is called through
# Python, so the tracker swaps ``core`` on close and the front follows.
#
# What a tracker adds around the core call stays the tracker's, as hooks the front calls only
# when they apply: ``seal`` when a BucketCore answers "seal first" (then the add is retried),
# ``restore`` when it answers "evicted cancels needed" (likewise),
# ``arming.update`` when an add tracks a message due before the armed timer (and after each
# poll, unless ``after_poll`` is set: it re-arms itself), ``check_open`` before a poll, ``load``
# when a poll stops at a due segment placeholder (then the poll goes on, merging into what it
# has), and ``submit`` after the lock is released when ``queued`` (a list) is not empty.
# ``closed``, set by the tracker under its lock, makes ``contains`` and ``tracked_entries``
# answer as for an empty tracker.
#
# Invariants (_check): ``tcore``/``bcore`` is ``core`` when ``core`` is of that type, else None.

cdef int ADD_DELIVER_ = 0
cdef int ADD_TRACKED_ = 1
cdef int ADD_SEAL_FIRST_ = 3
cdef int ADD_NEED_OVERRIDES_ = 6


cdef int convert_position(object ledger, object entry, object diagnose, int64_t* c_ledger,
                          int64_t* c_entry) except -1:
    # A call's position as int64s, checked; a TypeError/OverflowError goes through
    # ``diagnose(ledger, entry)`` first (a tracker's hook that names the bad argument).
    try:
        c_ledger[0] = as_i64(ledger)
        c_entry[0] = as_i64(entry)
    except (TypeError, OverflowError):
        if diagnose is not None:
            diagnose(ledger, entry)
        raise
    return check_ids(c_ledger[0], c_entry[0])


@cython.final
cdef class Front:
    """One native call per hot tracker call: lock, clock, core, hooks.

    ``Front(lock, clock, core)``: ``lock`` has ``acquire()``/``release()`` (a
    ``threading.Lock``), ``clock()`` returns epoch ms, ``core`` is the tracker's core.
    """

    cdef object _acquire, _release, _clock, _core   # the bound methods keep the lock
    cdef Lock _nlock   # the lock when it is a native Lock (taken from C), else None
    cdef bint _wall
    cdef TrackerCore tcore
    cdef BucketCore bcore
    cdef public object arming   # ArmingRule or None
    cdef public object seal     # called (lock held) when the core answers "seal first"
    cdef public object restore  # called (lock held) when it answers "evicted cancels needed"
    cdef public object queued   # a Sized (a deque) or None: not empty after a call -> submit()
    cdef public object submit
    cdef public object check_open   # called (lock held) before a poll; raises when closed
    cdef public object load         # load(source_id, now), lock held: a placeholder came due
    cdef public object after_poll   # after_poll(now), lock held: replaces the timer re-arm
    cdef public object diagnose     # diagnose(*args) on a TypeError/OverflowError of add or
    #                                 contains: raises the clearer error (the trackers bind
    #                                 these two methods as their own: no Python frame per call)
    cdef public bint closed

    def __cinit__(self, object lock, object clock, object core):
        if not callable(clock):
            raise TypeError("clock must be callable")
        self._acquire = lock.acquire
        self._release = lock.release
        self._nlock = lock if type(lock) is Lock else None
        self._clock = clock
        self._wall = clock is wall_clock_ms
        self.arming = self.seal = self.restore = self.queued = self.submit = None
        self.check_open = self.load = self.after_poll = self.diagnose = None
        self.closed = False
        self.core = core

    @property
    def core(self):
        """The tracker's core; set it when the tracker replaces its core."""
        return self._core

    @core.setter
    def core(self, object value):
        self._core = value
        self.tcore = value if type(value) is TrackerCore else None
        self.bcore = value if type(value) is BucketCore else None

    cdef inline int take(self) except -1:
        # Acquire the tracker's lock: from C for a native Lock, else its bound method.
        if self._nlock is not None:
            return self._nlock.cacquire()
        self._acquire()
        return 0

    cdef inline int give(self) except -1:
        # Release the tracker's lock (held by the caller).
        if self._nlock is not None:
            self._nlock.crelease()
            return 0
        self._release()
        return 0

    cdef inline int64_t now(self) except? -1:
        cdef timespec ts
        if self._wall:
            clock_gettime(CLOCK_REALTIME, &ts)
            return <int64_t> ts.tv_sec * 1000 + ts.tv_nsec // 1000000
        return as_i64(self._clock())

    cdef int core_add(self, object ledger, object entry, object deliver_at, int64_t c_ledger,
                      int64_t c_entry, int64_t c_time, int64_t now) except -1:
        if self.tcore is not None:
            return self.tcore.cadd(c_ledger, c_entry, c_time, self.tcore.cutoff(now))
        if self.bcore is not None:
            return self.bcore.cadd(c_ledger, c_entry, c_time, self.bcore.cutoff(now))
        return self._core.add(ledger, entry, deliver_at, now)

    def add(self, ledger, entry, deliver_at) -> bool:
        """``core.add`` at the clock's now, under the lock; True unless it is to be delivered
        now. Bad arguments raise before anything happens (``diagnose`` may name them)."""
        cdef int64_t c_ledger, c_entry, c_time
        try:
            c_ledger = as_i64(ledger)
            c_entry = as_i64(entry)
            c_time = as_i64(deliver_at)
            check_ids(c_ledger, c_entry)
            return self.cadd(ledger, entry, deliver_at, c_ledger, c_entry, c_time)
        except (TypeError, OverflowError):  # a bad argument, or a bad clock value
            if self.diagnose is not None:
                self.diagnose(ledger, entry, deliver_at)
            raise

    cdef bint cadd(self, object ledger, object entry, object deliver_at, int64_t c_ledger,
                   int64_t c_entry, int64_t c_time) except -1:
        # ``add`` with the arguments converted and checked.
        cdef int code
        self.take()
        try:
            code = self.add_locked(ledger, entry, deliver_at, c_ledger, c_entry, c_time)
        finally:
            self.give()
        self.after_call()
        return code != ADD_DELIVER_

    cdef int add_locked(self, object ledger, object entry, object deliver_at, int64_t c_ledger,
                        int64_t c_entry, int64_t c_time) except -1:
        # The add under the lock (the caller holds it; SharedFront calls this too): the
        # core's answer code, after the seal, restore and timer hooks.
        cdef int64_t now = self.now()
        cdef int64_t target
        cdef int code = self.core_add(ledger, entry, deliver_at, c_ledger, c_entry, c_time, now)
        if code == ADD_NEED_OVERRIDES_ and self.restore is not None:
            self.restore(c_ledger)
            code = self.core_add(ledger, entry, deliver_at, c_ledger, c_entry, c_time, now)
        if code == ADD_SEAL_FIRST_ and self.seal is not None:
            self.seal()
            code = self.core_add(ledger, entry, deliver_at, c_ledger, c_entry, c_time, now)
        if code == ADD_TRACKED_ and self.arming is not None:
            target = self.arming.target
            if target < 0 or c_time < target:
                self.arming.update(self._core.next_time(), now, self._core.tick_ms)
        return code

    cdef int after_call(self) except -1:
        # Once the lock is released: submit the queued jobs, if any.
        if self.queued is not None and len(self.queued) and self.submit is not None:
            self.submit()
        return 0

    def contains(self, ledger, entry) -> bool:
        """``core.contains`` under the lock (``diagnose`` may name a bad argument)."""
        cdef int64_t c_ledger, c_entry
        cdef bint found
        convert_position(ledger, entry, self.diagnose, &c_ledger, &c_entry)
        self.take()
        try:
            found = self.contains_locked(ledger, entry, c_ledger, c_entry)
        finally:
            self.give()
        return found

    cdef bint contains_locked(self, object ledger, object entry, int64_t c_ledger,
                              int64_t c_entry) except -1:
        # The core's answer (the caller holds the lock; SharedFront calls this too).
        if self.closed:
            return False
        if self.bcore is not None:
            return self.bcore.index.ccontains(c_ledger, c_entry)
        if self.tcore is not None:
            return self.tcore.ccontains(c_ledger, c_entry)
        return self._core.contains(ledger, entry)

    def cancel(self, ledger, entry) -> bool:
        """``core.cancel`` under the lock: True if the position was tracked."""
        cdef int64_t c_ledger = as_i64(ledger)
        cdef int64_t c_entry = as_i64(entry)
        cdef bint done
        check_ids(c_ledger, c_entry)
        self.take()
        try:
            if self.bcore is not None:
                done = self.bcore.ccancel(c_ledger, c_entry)
            elif self.tcore is not None:
                done = self.tcore.ccancel(c_ledger, c_entry)
            else:
                done = self._core.cancel(ledger, entry)
        finally:
            self.give()
        return done

    def poll(self, int64_t max_messages) -> list:
        """``core.poll`` at the clock's now, under the lock, loading due segments through
        ``load`` as long as more is wanted; positions sorted by position."""
        cdef int64_t now
        cdef list out
        cdef object core
        if max_messages <= 0:
            max_messages = 0
        self.take()
        try:
            if self.check_open is not None:
                self.check_open()
            now = self.now()
            core = self._core
            out = core.poll(max_messages, now)
            if self.load is not None:
                # Each load makes progress (reads, quarantines, or moves a failing bucket's
                # placeholder past the cutoff), so the loop ends.
                while core.load_needed >= 0 and len(out) < max_messages:
                    self.load(core.load_needed, now)
                    out = core.poll(max_messages - len(out), now, out)
            if self.after_poll is not None:
                self.after_poll(now)
            elif self.arming is not None:
                self.arming.update(core.next_time(), now, core.tick_ms)
        finally:
            self.give()
        self.after_call()
        return out

    def tracked_entries(self, ledger, first, last):
        """``core.index_bitmap(ledger, first, last)`` under the lock: a new BitMap (empty when
        nothing is tracked there, the range is empty or the tracker is closed)."""
        cdef int64_t c_ledger = as_i64(ledger)
        cdef int64_t c_first = as_i64(first)
        cdef int64_t c_last = as_i64(last)
        check_ids(c_ledger, c_first)
        check_ids(c_ledger, c_last)
        if c_last < c_first:
            return BitMap()
        self.take()
        try:
            bm = None if self.closed else self._core.index_bitmap(c_ledger, c_first, c_last)
        finally:
            self.give()
        return BitMap() if bm is None else bm

    def _check(self) -> None:
        """Raise AssertionError if the typed views disagree with ``core``."""
        if (self.tcore is not None) != (type(self._core) is TrackerCore):
            raise AssertionError("tcore does not match core")
        if (self.bcore is not None) != (type(self._core) is BucketCore):
            raise AssertionError("bcore does not match core")
