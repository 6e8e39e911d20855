# Front: the hot calls of a tracker (pure twin: delayindex/_pure/front.py).
#
# How it works. A tracker's public ``add``, ``contains`` and ``cancel`` each take its lock, read
# its clock and call its core. Done in Python that is about two thirds of a call; here it is one
# native call: the arguments are converted once, the lock's bound ``acquire``/``release`` are
# called directly, the default wall clock is read with clock_gettime (any other clock is
# called), and a native core (TrackerCore or BucketCore) is reached through its C methods. Any
# other core (the closed stand-in) is called through Python, so the tracker swaps ``core`` on
# close and the front follows.
#
# What a tracker adds around the core call stays the tracker's, as hooks the front calls only
# when they apply: ``seal`` when a BucketCore answers "seal first" (then the add is retried),
# ``arming.update`` when an add tracks a message due before the armed timer, and ``submit``
# after the lock is released when ``queued`` (a list) is not empty.
#
# Invariants (_check): ``tcore``/``bcore`` is ``core`` when ``core`` is of that type, else None.

cdef int ADD_DELIVER_ = 0
cdef int ADD_TRACKED_ = 1
cdef int ADD_SEAL_FIRST_ = 3


@cython.final
cdef class Front:
    """One native call per hot tracker call: lock, clock, core, hooks.

    ``Front(lock, clock, core)``: ``lock`` has ``acquire()``/``release()`` (a
    ``threading.Lock``), ``clock()`` returns epoch ms, ``core`` is the tracker's core.
    """

    cdef object _lock, _acquire, _release, _clock, _core
    cdef bint _wall
    cdef TrackerCore tcore
    cdef BucketCore bcore
    cdef public object arming   # ArmingRule or None
    cdef public object seal     # called (lock held) when the core answers "seal first"
    cdef public object queued   # a list or None: when not empty after an add, submit() is called
    cdef public object submit

    def __cinit__(self, object lock, object clock, object core):
        if not callable(clock):
            raise TypeError("clock must be callable")
        self._lock = lock
        self._acquire = lock.acquire
        self._release = lock.release
        self._clock = clock
        self._wall = clock is wall_clock_ms
        self.arming = self.seal = self.queued = self.submit = None
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
        now. Bad arguments raise before anything happens."""
        cdef int64_t c_ledger = as_i64(ledger)
        cdef int64_t c_entry = as_i64(entry)
        cdef int64_t c_time = as_i64(deliver_at)
        cdef int64_t now, target
        cdef int code
        check_ids(c_ledger, c_entry)
        self._acquire()
        try:
            now = self.now()
            code = self.core_add(ledger, entry, deliver_at, c_ledger, c_entry, c_time, now)
            if code == ADD_SEAL_FIRST_ and self.seal is not None:
                self.seal()
                code = self.core_add(ledger, entry, deliver_at, c_ledger, c_entry, c_time, now)
            if code == ADD_TRACKED_ and self.arming is not None:
                target = self.arming.target
                if target < 0 or c_time < target:
                    self.arming.update(self._core.next_time(), now, self._core.tick_ms)
        finally:
            self._release()
        if self.queued is not None and len(self.queued):
            self.submit()
        return code != ADD_DELIVER_

    def contains(self, ledger, entry) -> bool:
        """``core.contains`` under the lock."""
        cdef int64_t c_ledger = as_i64(ledger)
        cdef int64_t c_entry = as_i64(entry)
        cdef bint found
        check_ids(c_ledger, c_entry)
        self._acquire()
        try:
            if self.bcore is not None:
                found = self.bcore.index.ccontains(c_ledger, c_entry)
            elif self.tcore is not None:
                found = self.tcore.ccontains(c_ledger, c_entry)
            else:
                found = self._core.contains(ledger, entry)
        finally:
            self._release()
        return found

    def cancel(self, ledger, entry) -> bool:
        """``core.cancel`` under the lock: True if the position was tracked."""
        cdef int64_t c_ledger = as_i64(ledger)
        cdef int64_t c_entry = as_i64(entry)
        cdef bint done
        check_ids(c_ledger, c_entry)
        self._acquire()
        try:
            if self.bcore is not None:
                done = self.bcore.ccancel(c_ledger, c_entry)
            elif self.tcore is not None:
                done = self.tcore.ccancel(c_ledger, c_entry)
            else:
                done = self._core.cancel(ledger, entry)
        finally:
            self._release()
        return done

    def _check(self) -> None:
        """Raise AssertionError if the typed views disagree with ``core``."""
        if (self.tcore is not None) != (type(self._core) is TrackerCore):
            raise AssertionError("tcore does not match core")
        if (self.bcore is not None) != (type(self._core) is BucketCore):
            raise AssertionError("bcore does not match core")
