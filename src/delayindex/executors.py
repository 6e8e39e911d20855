"""Executors for :meth:`DelayIndex.open` that make background work deterministic.

:class:`InlineExecutor` runs each job as it is submitted; :class:`ManualExecutor` queues jobs
until the caller runs them with :meth:`ManualExecutor.run_pending`, which models a background
thread that lags behind the caller by exactly as much as a test chooses. Both run jobs on the
caller's thread, one at a time, in submission order, so with a
:class:`~delayindex.ManualClock` a :class:`~delayindex.DelayIndex` behaves identically on every
run. Both set ``synchronous = True``: code that would wait inside a job for more work to arrive
(group commit) reads it with ``getattr(executor, "synchronous", False)`` and does not wait,
because nothing else can submit while the job runs.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable
from concurrent.futures import Executor, Future
from typing import Any, ParamSpec, TypeVar

P = ParamSpec("P")
T = TypeVar("T")


class InlineExecutor(Executor):
    """Runs each submitted call at once, on the submitting thread.

    With a :class:`~delayindex.ManualClock` this makes a :class:`~delayindex.DelayIndex` fully
    deterministic: a seal's snapshot is durable (or has failed) by the time ``add`` returns.
    Useful for tests and simulations; production code wants a real thread.
    """

    #: Jobs run on the caller's thread, so waiting inside a job for more work to arrive is
    #: pointless.
    synchronous: bool = True

    def submit(self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> Future[T]:
        """Run ``fn(*args, **kwargs)`` now; return a completed future with its outcome."""
        future: Future[T] = Future()
        try:
            result = fn(*args, **kwargs)
        except BaseException as exc:  # the future carries it, as a thread pool's would
            future.set_exception(exc)
        else:
            future.set_result(result)
        return future

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """Nothing to stop."""


class _ManualFuture(Future[T]):
    """A future of a :class:`ManualExecutor`: waiting on it first runs the executor's queue."""

    def __init__(self, executor: ManualExecutor) -> None:
        super().__init__()
        self._executor = executor

    def result(self, timeout: float | None = None) -> T:
        """The job's result; if it has not run yet, run the pending jobs first."""
        if not self.done():
            self._executor.run_pending()
        return super().result(timeout)

    def exception(self, timeout: float | None = None) -> BaseException | None:
        """The job's exception (None if it succeeded); runs the pending jobs first if needed."""
        if not self.done():
            self._executor.run_pending()
        return super().exception(timeout)


class ManualExecutor(Executor):
    """Queues submitted calls until :meth:`run_pending` runs them, in order, on its caller.

    Like a single background thread that only runs when told: a seal's snapshot is written when
    the test calls :meth:`run_pending`, not inside ``add``, so states where writes lag behind
    adds, polls and acknowledgements are reachable deterministically. Futures carry the
    results or exceptions of their jobs.

    Waiting on one of its futures (``result()`` or ``exception()``) first runs the pending
    queue on the waiting thread, so code that blocks on futures, such as
    :meth:`DelayIndex.flush` and :meth:`DelayIndex.close`, completes instead of hanging.
    (``concurrent.futures.wait`` and ``as_completed`` do not go through those methods: call
    :meth:`run_pending` before them.) Only one thread runs jobs at a time; a job that submits
    more work has it run in the same :meth:`run_pending` call, after what was queued before.

    After :meth:`shutdown`, :meth:`submit` raises ``RuntimeError``; ``shutdown(wait=True)``
    runs what is pending, ``cancel_futures=True`` cancels it instead.
    """

    #: Jobs run on the caller's thread, so waiting inside a job for more work to arrive is
    #: pointless.
    synchronous: bool = True

    def __init__(self) -> None:
        self._queue: deque[tuple[Future[Any], Callable[[], Any]]] = deque()
        self._mutex = threading.Lock()  # guards the queue and the shutdown flag
        self._runner = threading.RLock()  # one thread runs jobs at a time (re-entrant)
        self._shutdown = False

    def submit(self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> Future[T]:
        """Queue ``fn(*args, **kwargs)``; return its (pending) future.

        Raises:
            RuntimeError: the executor was shut down.
        """
        future: _ManualFuture[T] = _ManualFuture(self)
        with self._mutex:
            if self._shutdown:
                raise RuntimeError("cannot schedule new futures after shutdown")
            self._queue.append((future, lambda: fn(*args, **kwargs)))
        return future

    @property
    def pending(self) -> int:
        """How many submitted calls have not run yet."""
        with self._mutex:
            return len(self._queue)

    def run_pending(self) -> int:
        """Run the queued calls in submission order until the queue is empty.

        Calls submitted while this runs (by the jobs or by other threads) run too. A call's
        exception goes to its future, never to the caller. Cancelled futures are skipped.
        Returns how many calls ran.
        """
        ran = 0
        with self._runner:
            while True:
                with self._mutex:
                    if not self._queue:
                        return ran
                    future, call = self._queue.popleft()
                if not future.set_running_or_notify_cancel():
                    continue  # cancelled while queued
                try:
                    result = call()
                except BaseException as exc:  # the future carries it, as a thread pool's would
                    future.set_exception(exc)
                else:
                    future.set_result(result)
                ran += 1

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """Refuse new calls; cancel the queued ones (``cancel_futures``), then with ``wait``
        run whatever is still pending. Idempotent."""
        with self._mutex:
            self._shutdown = True
            cancelled = list(self._queue) if cancel_futures else []
            if cancel_futures:
                self._queue.clear()
        for future, _ in cancelled:
            future.cancel()
        if wait:
            self.run_pending()


__all__ = ["InlineExecutor", "ManualExecutor"]
