"""The native Lock against its pure twin (``threading.Lock``): one contract for both.

The trackers' fronts take the native Lock from C; Python code (``with``, ``threading.Condition``,
the scheduler's explicit ``acquire``/``release``) must not see a difference.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from delayindex import _impl

native_module = _impl.native_module_or_none()
LOCKS = [threading.Lock] + ([native_module.Lock] if native_module is not None else [])


@pytest.fixture(params=LOCKS, ids=lambda t: f"{t.__module__}.{t.__name__}")
def lock(request: pytest.FixtureRequest) -> Any:
    return request.param()


def test_acquire_release_and_locked(lock: Any) -> None:
    assert not lock.locked()
    assert lock.acquire() is True
    assert lock.locked()
    assert lock.acquire(False) is False  # not reentrant
    assert lock.acquire(timeout=0.01) is False
    lock.release()
    assert not lock.locked()
    with pytest.raises(RuntimeError):
        lock.release()
    with lock:
        assert lock.locked()
    assert not lock.locked()


def test_bad_arguments(lock: Any) -> None:
    with pytest.raises(ValueError):
        lock.acquire(False, 1.0)  # no timeout for a non-blocking call
    with pytest.raises(ValueError):
        lock.acquire(True, -2)
    assert not lock.locked()


def test_a_waiting_thread_gets_it_once_released(lock: Any) -> None:
    lock.acquire()
    got: list[float] = []

    def wait() -> None:
        with lock:
            got.append(time.monotonic())

    thread = threading.Thread(target=wait)
    thread.start()
    time.sleep(0.05)
    assert not got  # still waiting, without holding the GIL
    released = time.monotonic()
    lock.release()
    thread.join(5)
    assert got and got[0] >= released


def test_a_timed_wait_gives_up(lock: Any) -> None:
    lock.acquire()
    outcome: list[bool] = []
    thread = threading.Thread(target=lambda: outcome.append(lock.acquire(timeout=0.05)))
    start = time.monotonic()
    thread.start()
    thread.join(5)
    assert outcome == [False] and time.monotonic() - start >= 0.04
    lock.release()


def test_mutual_exclusion_under_contention(lock: Any) -> None:
    counter = [0]

    def bump() -> None:
        for _ in range(20_000):
            with lock:
                value = counter[0]
                counter[0] = value + 1

    threads = [threading.Thread(target=bump) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert counter[0] == 80_000 and not lock.locked()


def test_works_under_a_condition(lock: Any) -> None:
    condition = threading.Condition(lock)
    ready: list[int] = []

    def produce() -> None:
        time.sleep(0.02)
        with condition:
            ready.append(1)
            condition.notify()

    thread = threading.Thread(target=produce)
    with condition:
        thread.start()
        assert condition.wait_for(lambda: ready, timeout=5)
        assert lock.locked()  # wait gives the lock back to its caller
    thread.join()
    assert not lock.locked()
