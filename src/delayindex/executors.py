"""Executors for :meth:`DelayIndex.open`: the inline one makes background work deterministic."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Executor, Future
from typing import ParamSpec, TypeVar

P = ParamSpec("P")
T = TypeVar("T")


class InlineExecutor(Executor):
    """Runs each submitted call at once, on the submitting thread.

    With a :class:`~delayindex.ManualClock` this makes a :class:`~delayindex.DelayIndex` fully
    deterministic: a seal's snapshot is durable (or has failed) by the time ``add`` returns.
    Useful for tests and simulations; production code wants a real thread.
    """

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


__all__ = ["InlineExecutor"]
