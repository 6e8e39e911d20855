# Lock: a threading.Lock the fronts acquire from C (pure twin: threading.Lock itself).
#
# How it works. A front takes its tracker's lock on every call; through a threading.Lock's bound
# ``acquire``/``release`` that is two Python-level calls (the acquire parses its arguments),
# about a third of a ``contains`` here. This lock wraps the same CPython lock primitive
# (PyThread_type_lock) and offers ``cacquire``/``crelease`` to the fronts: an uncontended acquire
# is one non-blocking try; a contended one waits with the GIL released, as threading.Lock does,
# and handles signals the same way (a signal handler runs, then the wait goes on). To Python code
# it is a threading.Lock: ``acquire(blocking=True, timeout=-1)``, ``release``, ``locked``, the
# context manager, and it works under threading.Condition.
#
# Invariants: ``_locked`` is true exactly while some thread holds the lock (set after a
# successful acquire, cleared before the release).

from cpython.pythread cimport (
    NOWAIT_LOCK,
    PY_LOCK_ACQUIRED,
    PY_LOCK_INTR,
    PyLockStatus,
    PyThread_acquire_lock,
    PyThread_allocate_lock,
    PyThread_free_lock,
    PyThread_release_lock,
    PyThread_type_lock,
)
from cpython.exc cimport PyErr_CheckSignals

cdef extern from "pythread.h":
    PyLockStatus PyThread_acquire_lock_timed(PyThread_type_lock lock, long long microseconds,
                                             int intr_flag) nogil


@cython.final
cdef class Lock:
    """A ``threading.Lock`` the native fronts take without a Python call (see the module's
    header); the same API for Python code."""

    cdef PyThread_type_lock _lock
    cdef bint _locked

    def __cinit__(self):
        self._lock = PyThread_allocate_lock()
        if self._lock == NULL:
            raise MemoryError("cannot allocate a lock")
        self._locked = False

    def __dealloc__(self):
        if self._lock != NULL:
            PyThread_free_lock(self._lock)

    cdef int wait(self, long long microseconds) except -1:
        # Blocks (GIL released) up to ``microseconds`` (-1: forever); 1 if acquired, else 0.
        cdef PyLockStatus status
        while True:
            with nogil:
                status = PyThread_acquire_lock_timed(self._lock, microseconds, 1)
            if status != PY_LOCK_INTR:
                break
            PyErr_CheckSignals()  # a signal handler runs (and may raise); then wait again
        if status == PY_LOCK_ACQUIRED:
            self._locked = True
            return 1
        return 0

    cdef inline int cacquire(self) except -1:
        """Acquire, blocking: one try, then a wait with the GIL released."""
        if PyThread_acquire_lock(self._lock, NOWAIT_LOCK):
            self._locked = True
            return 0
        self.wait(-1)
        return 0

    cdef inline void crelease(self) noexcept:
        """Release (the caller holds the lock)."""
        self._locked = False
        PyThread_release_lock(self._lock)

    def acquire(self, bint blocking=True, double timeout=-1) -> bool:
        """As ``threading.Lock.acquire``: True if acquired."""
        cdef long long microseconds
        if not blocking:
            if timeout != -1:
                raise ValueError("can't specify a timeout for a non-blocking call")
            microseconds = 0
        elif timeout == -1:
            microseconds = -1
        elif timeout < 0:
            raise ValueError("timeout value must be a non-negative number")
        else:
            microseconds = <long long> (timeout * 1e6)
        if PyThread_acquire_lock(self._lock, NOWAIT_LOCK):
            self._locked = True
            return True
        if microseconds == 0:
            return False
        return self.wait(microseconds) == 1

    def release(self) -> None:
        """As ``threading.Lock.release``: RuntimeError when not locked."""
        if not self._locked:
            raise RuntimeError("release unlocked lock")
        self.crelease()

    def locked(self) -> bool:
        """Whether some thread holds the lock."""
        return self._locked

    def __enter__(self) -> bool:
        return self.acquire()

    def __exit__(self, *exc_info) -> None:
        self.release()
