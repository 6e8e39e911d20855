"""The deterministic executors: InlineExecutor runs at submit, ManualExecutor when told."""

from __future__ import annotations

import threading
from concurrent.futures import CancelledError

import pytest

from delayindex import DelayIndex, ManualClock, MemoryStorage, Position, TrackerConfig
from delayindex.executors import InlineExecutor, ManualExecutor

T0 = 1_000_000


def test_both_are_synchronous() -> None:
    assert InlineExecutor.synchronous is True
    assert ManualExecutor().synchronous is True


def test_nothing_runs_until_run_pending_then_everything_in_order() -> None:
    executor = ManualExecutor()
    ran: list[int] = []
    futures = [executor.submit(ran.append, i) for i in range(3)]
    assert ran == [] and executor.pending == 3
    assert not any(f.done() for f in futures)
    assert executor.run_pending() == 3
    assert ran == [0, 1, 2] and executor.pending == 0
    assert [f.result() for f in futures] == [None, None, None]
    assert executor.run_pending() == 0


def test_futures_carry_results_and_exceptions() -> None:
    executor = ManualExecutor()
    ok = executor.submit(lambda a, b: a * b, 6, b=7)
    bad = executor.submit(int, "not a number")
    assert executor.run_pending() == 2
    assert ok.result() == 42
    assert isinstance(bad.exception(), ValueError)
    with pytest.raises(ValueError, match="not a number"):
        bad.result()


def test_jobs_submitted_while_running_run_in_the_same_call_after_the_queue() -> None:
    executor = ManualExecutor()
    ran: list[str] = []

    def first() -> None:
        ran.append("first")
        executor.submit(ran.append, "spawned")

    executor.submit(first)
    executor.submit(ran.append, "second")
    assert executor.run_pending() == 3
    assert ran == ["first", "second", "spawned"]


def test_waiting_on_a_future_runs_the_queue_up_to_it() -> None:
    executor = ManualExecutor()
    ran: list[int] = []
    executor.submit(ran.append, 1)

    def second() -> str:
        ran.append(2)
        return "done"

    future = executor.submit(second)
    assert future.result() == "done"  # a real executor's future would block here forever
    assert ran == [1, 2]


def test_cancelled_futures_are_skipped() -> None:
    executor = ManualExecutor()
    ran: list[int] = []
    keep = executor.submit(ran.append, 1)
    drop = executor.submit(ran.append, 2)
    assert drop.cancel()
    assert executor.run_pending() == 1
    assert ran == [1] and keep.done() and drop.cancelled()


def test_shutdown_refuses_new_work_and_runs_what_is_pending() -> None:
    executor = ManualExecutor()
    ran: list[int] = []
    executor.submit(ran.append, 1)
    executor.shutdown(wait=True)
    assert ran == [1]
    with pytest.raises(RuntimeError, match="after shutdown"):
        executor.submit(ran.append, 2)
    executor.shutdown()  # idempotent
    assert ran == [1]


def test_shutdown_without_wait_leaves_the_queue_and_can_cancel_it() -> None:
    executor = ManualExecutor()
    ran: list[int] = []
    later = executor.submit(ran.append, 1)
    executor.shutdown(wait=False)
    assert ran == [] and executor.pending == 1
    assert executor.run_pending() == 1 and later.done()

    other = ManualExecutor()
    doomed = other.submit(ran.append, 2)
    other.shutdown(wait=True, cancel_futures=True)
    assert doomed.cancelled() and ran == [1]
    with pytest.raises(CancelledError):
        doomed.result()


def test_a_delay_index_on_a_manual_executor_writes_when_told() -> None:
    clock, storage = ManualClock(T0), MemoryStorage()
    executor = ManualExecutor()
    config = TrackerConfig(min_index_count_per_bucket=1, max_num_buckets=0, strict=True)
    index = DelayIndex.open(storage, "manual", config, clock=clock, executor=executor)
    assert index.add(1, 0, T0 + 10) and index.add(2, 0, T0 + 20)  # (2, 0) seals [1, 1]
    assert [b.state for b in index.buckets()] == ["creating"]
    assert storage.list_objects() == []  # queued, not written
    assert executor.run_pending() >= 1
    [bucket] = index.buckets()
    assert bucket.state == "durable"
    assert [o.id for o in storage.list_objects()] == [bucket.snapshot_id]
    clock.set(T0 + 20)
    assert index.poll(10) == [Position(1, 0), Position(2, 0)]
    # flush() and close() wait on the queued delete's future: that runs the queue, no hang.
    done = threading.Event()

    def finish() -> None:
        index.flush()
        index.close()
        done.set()

    worker = threading.Thread(target=finish, daemon=True)
    worker.start()
    worker.join(timeout=60)  # a guard against a hang, not a timing assertion
    assert done.is_set()
    assert executor.pending == 0
    assert storage.list_objects() == []
