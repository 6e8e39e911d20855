"""Segment read-ahead: ``ReadAhead`` on its own (a fake read, threads synchronised by events),
then FileStorage's ``prefetch_segments`` and a DelayIndex whose loads it serves.

What must hold: bytes read ahead are used once, only for the same object, fingerprint and range;
damage is still found by the read that decodes them; hints never block, never fail and stay
bounded; and an index delivers exactly what it delivers without read-ahead.
"""

from __future__ import annotations

import dataclasses
import os
import re
import signal
import threading
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from delayindex import DelayIndex, FileStorage, ManualClock, MemoryStorage, Position, TrackerConfig
from delayindex.errors import SnapshotCorruptError
from delayindex.snapshot.format import build_snapshot
from delayindex.storage._base_raw import ObjectSource
from delayindex.storage._readahead import ReadAhead
from delayindex.tracker import _loading

WAIT_S = 30.0  # a generous bound for the thread's reads; never reached when things work


class _Reads:
    """A read function that records its calls; ``gate`` (if set) holds each read until set."""

    def __init__(self, fingerprint: object = "fp", gate: threading.Event | None = None) -> None:
        self.calls: list[tuple[str, int, int]] = []
        self.threads: set[str] = set()
        self.fingerprint = fingerprint
        self.gate = gate
        self.started = threading.Event()
        self.fail = False

    def __call__(self, key: str, first: int, last: int) -> tuple[object, list[bytes]] | None:
        self.calls.append((key, first, last))
        self.threads.add(threading.current_thread().name)
        self.started.set()
        if self.gate is not None:
            assert self.gate.wait(WAIT_S)
        if self.fail:
            raise OSError("injected")
        if key == "missing":
            return None
        return self.fingerprint, [f"{key}:{n}".encode() for n in range(first, last + 1)]


def _ahead(reads: _Reads, max_bytes: int = 1 << 20, max_pending: int = 8) -> ReadAhead:
    return ReadAhead(reads, max_bytes, max_pending)


def test_a_range_read_ahead_is_handed_out_once_from_the_thread() -> None:
    reads = _Reads()
    ahead = _ahead(reads)
    assert ahead.request("a", 2, 3) is True
    assert ahead.wait_idle(WAIT_S)
    assert reads.threads == {"delayindex-readahead"}
    assert ahead.take("a", "fp", 2, 3) == [b"a:2", b"a:3"]
    assert ahead.take("a", "fp", 2, 3) is None  # once
    stats = ahead.stats()
    assert (stats["requested"], stats["read"], stats["hits"], stats["held_bytes"]) == (1, 1, 1, 0)
    ahead.close()


def test_only_the_same_range_and_fingerprint_match() -> None:
    reads = _Reads()
    ahead = _ahead(reads)
    ahead.request("a", 1, 2)
    assert ahead.wait_idle(WAIT_S)
    assert ahead.take("a", "fp", 1, 1) is None  # another range
    assert ahead.take("b", "fp", 1, 2) is None  # another object
    assert ahead.take("a", "other", 1, 2) is None  # the object changed: stale, dropped
    assert ahead.take("a", "fp", 1, 2) is None
    assert ahead.stats()["stale"] == 1
    ahead.close()


def _holding(max_pending: int = 8) -> tuple[threading.Event, _Reads, ReadAhead]:
    """A read-ahead whose thread is inside the read of ``("a", 1, 1)`` until the event is set."""
    gate = threading.Event()
    reads = _Reads(gate=gate)
    ahead = _ahead(reads, max_pending=max_pending)
    assert ahead.request("a", 1, 1)
    assert reads.started.wait(WAIT_S)
    return gate, reads, ahead


def test_a_duplicate_hint_is_ignored_and_the_queue_is_bounded() -> None:
    gate, reads, ahead = _holding(max_pending=2)
    assert ahead.request("a", 1, 1) is False  # being read
    assert ahead.request("b", 1, 1) and ahead.request("c", 1, 1)
    assert ahead.request("b", 1, 1) is False  # waiting already
    assert ahead.request("d", 1, 1) is False  # the queue is full
    assert ahead.stats()["dropped"] == 1
    gate.set()
    assert ahead.wait_idle(WAIT_S)
    assert ahead.request("a", 1, 1) is False  # held
    assert [c[0] for c in reads.calls] == ["a", "b", "c"]
    ahead.close()


def test_taking_a_waiting_range_withdraws_it() -> None:
    gate, reads, ahead = _holding()
    ahead.request("b", 5, 6)
    assert ahead.take("b", "fp", 5, 6) is None  # the caller reads it itself
    gate.set()
    assert ahead.wait_idle(WAIT_S)
    assert ("b", 5, 6) not in reads.calls  # never read twice
    assert ahead.stats()["misses"] == 1
    ahead.close()


def test_taking_the_range_being_read_waits_for_that_read() -> None:
    gate, reads, ahead = _holding()
    got: list[object] = []
    taker = threading.Thread(target=lambda: got.append(ahead.take("a", "fp", 1, 1)))
    taker.start()
    taker.join(0.05)
    assert got == []  # still waiting for the read in flight
    gate.set()
    taker.join(WAIT_S)
    assert got == [[b"a:1"]] and len(reads.calls) == 1
    ahead.close()


def test_a_failed_or_empty_read_is_dropped_and_counted() -> None:
    reads = _Reads()
    reads.fail = True
    ahead = _ahead(reads)
    ahead.request("a", 1, 1)
    ahead.request("missing", 1, 1)
    assert ahead.wait_idle(WAIT_S)
    assert ahead.take("a", "fp", 1, 1) is None
    assert ahead.take("missing", "fp", 1, 1) is None
    assert ahead.stats()["failed"] == 2  # "missing" raised too: fail is set for every read
    reads.fail = False
    ahead.request("missing", 1, 1)
    assert ahead.wait_idle(WAIT_S)
    assert ahead.take("missing", "fp", 1, 1) is None
    assert ahead.stats()["read"] == 0
    ahead.close()


def test_held_bytes_stay_under_the_bound_oldest_first() -> None:
    reads = _Reads()
    ahead = _ahead(reads, max_bytes=10)  # each range below holds 3 + 3 bytes
    ahead.request("a", 1, 2)
    ahead.request("b", 1, 2)
    assert ahead.wait_idle(WAIT_S)
    assert ahead.stats()["held_bytes"] == 6
    assert ahead.take("a", "fp", 1, 2) is None  # dropped for b
    assert ahead.take("b", "fp", 1, 2) == [b"b:1", b"b:2"]
    ahead.close()


def test_forget_and_close() -> None:
    reads = _Reads()
    ahead = _ahead(reads)
    ahead.request("a", 1, 1)
    ahead.request("b", 1, 1)
    assert ahead.wait_idle(WAIT_S)
    ahead.forget("a")
    assert ahead.take("a", "fp", 1, 1) is None
    assert ahead.stats()["held_bytes"] == 3
    ahead.close()
    assert ahead.request("c", 1, 1) is False
    assert ahead.take("b", "fp", 1, 1) is None
    assert ahead.stats()["held_bytes"] == 0


def test_a_forked_child_starts_over_instead_of_waiting_for_the_parents_thread() -> None:
    gate, _, ahead = _holding()  # the parent's thread is inside the read of ("a", 1, 1)
    pid = os.fork()
    if pid == 0:  # the child: no thread; a take of that range must not wait for it
        code = 1
        try:
            signal.alarm(10)  # a child that waits forever dies instead: the test fails
            fresh = ahead.take("a", "fp", 1, 1) is None
            gate.set()  # the child's copy: lets its new thread's reads through
            ahead.request("b", 1, 1)
            got = ahead.wait_idle(WAIT_S) and ahead.take("b", "fp", 1, 1) == [b"b:1"]
            code = 0 if fresh and got else 1
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    gate.set()
    ahead.close()
    assert os.waitstatus_to_exitcode(status) == 0


def test_bounds_must_be_positive() -> None:
    with pytest.raises(ValueError, match="must be > 0"):
        ReadAhead(_Reads(), 0, 1)
    with pytest.raises(ValueError, match="must be > 0"):
        ReadAhead(_Reads(), 1, 0)


# -- FileStorage ---------------------------------------------------------------------------


def _snapshot(store: FileStorage, key: str = "snap-1") -> str:
    rng = np.random.default_rng(3)
    n = 20_000
    ledgers = np.repeat(np.arange(1, 21, dtype=np.int64), n // 20)
    entries = np.tile(np.arange(n // 20, dtype=np.int64), 20)
    times = rng.integers(0, 10**6, n).astype(np.int64)
    metadata, segments = build_snapshot(
        times, ledgers, entries, max_time_step_ms=10**9, max_indexes_per_segment=1_000
    )
    return store.create(metadata, segments, key)


def _columns(store: FileStorage, sid: str, first: int, last: int) -> list[list[int]]:
    return [column.tolist() for column in store.get_segment_arrays(sid, first, last)]


class _CountingStorage(FileStorage):
    """A FileStorage that counts the reads made on each thread."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.reads: Counter[str] = Counter()
        super().__init__(*args, **kwargs)

    @contextmanager
    def _open(self, key: str) -> Iterator[ObjectSource]:
        with super()._open(key) as src:
            inner = src.read

            def read(offset: int, length: int) -> bytes:
                self.reads[threading.current_thread().name] += 1
                return inner(offset, length)

            yield dataclasses.replace(src, read=read)


def test_file_storage_serves_a_prefetched_range_from_memory(tmp_path: Path) -> None:
    store = _CountingStorage(tmp_path / "a")
    plain = FileStorage(tmp_path / "a", readahead_bytes=0, clean_tmp=False)
    sid = _snapshot(store)
    assert store.prefetch_segments(sid, 3, 5) is True
    assert store._readahead is not None and store._readahead.wait_idle(WAIT_S)
    assert store.readahead_stats()["read"] == 1
    assert set(store.reads) == {"delayindex-readahead"}  # header, metadata, entries
    assert _columns(store, sid, 3, 5) == _columns(plain, sid, 3, 5)
    assert set(store.reads) == {"delayindex-readahead"}  # the read itself read nothing
    assert store.readahead_stats()["hits"] == 1
    assert plain.prefetch_segments(sid, 3, 5) is False and plain.readahead_stats() == {}
    store.close()
    plain.close()


def _prefetched(tmp_path: Path, first: int, last: int) -> tuple[FileStorage, str]:
    """A FileStorage holding one snapshot whose segments ``first..last`` were read ahead."""
    store = FileStorage(tmp_path)
    sid = _snapshot(store)
    assert store.prefetch_segments(sid, first, last)
    assert store._readahead is not None and store._readahead.wait_idle(WAIT_S)
    return store, sid


def test_damage_is_still_found_by_the_read_that_decodes(tmp_path: Path) -> None:
    store, sid = _prefetched(tmp_path, 2, 2)
    assert store._readahead is not None
    path = store.object_path(sid)
    data = bytearray(path.read_bytes())
    # Damage what was read ahead, in memory: the held bytes are what the decode checks.
    held = store._readahead._held[(sid, 2, 2)]
    broken = bytearray(held[1][0])
    broken[len(broken) // 2] ^= 0xFF
    store._readahead._held[(sid, 2, 2)] = (held[0], [bytes(broken)], held[2])
    with pytest.raises(SnapshotCorruptError, match=re.escape(str(path))):
        store.get_segment_arrays(sid, 2, 2)
    assert bytes(data) == path.read_bytes()  # nothing was written
    store.close()


def test_a_replaced_object_is_read_again(tmp_path: Path) -> None:
    store, sid = _prefetched(tmp_path, 1, 1)
    path = store.object_path(sid)
    data = path.read_bytes()
    path.unlink()
    path.write_bytes(data)  # a new inode: another fingerprint
    before = _columns(FileStorage(tmp_path, readahead_bytes=0, clean_tmp=False), sid, 1, 1)
    assert _columns(store, sid, 1, 1) == before
    assert store.readahead_stats()["stale"] == 1
    store.close()


def test_delete_drops_what_was_read_ahead(tmp_path: Path) -> None:
    store, sid = _prefetched(tmp_path, 1, 4)
    assert store.readahead_stats()["held_bytes"] > 0
    store.delete(sid)
    assert store.readahead_stats()["held_bytes"] == 0
    store.close()


@pytest.mark.parametrize("bad", [-1, 1.5, True])
def test_file_storage_rejects_a_bad_readahead_size(tmp_path: Path, bad: object) -> None:
    with pytest.raises(TypeError if not isinstance(bad, int) or bad is True else ValueError):
        FileStorage(tmp_path, readahead_bytes=bad)  # type: ignore[arg-type]


def test_hints_never_raise(tmp_path: Path) -> None:
    store = FileStorage(tmp_path)
    assert store.prefetch_segments("no-such-object", 1, 1) is True  # queued; its read fails
    assert store._readahead is not None and store._readahead.wait_idle(WAIT_S)
    assert store.readahead_stats()["failed"] == 1
    assert store.prefetch_segments("x", 0, 1) is False  # not a 1-based range
    assert store.prefetch_segments("x", 3, 2) is False
    assert MemoryStorage().prefetch_segments("x", 1, 1) is False  # bytes are in memory already
    store.close()
    assert store.prefetch_segments("x", 1, 1) is False


# -- DelayIndex ------------------------------------------------------------------------------


def _fill(store: FileStorage, clock: ManualClock, ahead_ms: int = 1) -> DelayIndex:
    """30 000 messages due from ``ahead_ms`` after ``clock()`` on, over 600 s, sealed and
    durable (buckets of 5 000, segments of 500)."""
    rng = np.random.default_rng(11)
    n = 30_000
    ledgers = np.repeat(np.arange(1, 31, dtype=np.int64), n // 30)
    entries = np.tile(np.arange(n // 30, dtype=np.int64), 30)
    times = clock() + ahead_ms + rng.integers(0, 600_000, n).astype(np.int64)
    config = TrackerConfig(min_index_count_per_bucket=5_000, max_indexes_per_segment=500)
    index = DelayIndex.open(store, "ra", config, clock=clock)
    index.add_many(ledgers, entries, times)
    index.flush()
    return index


def _paced_drain(index: DelayIndex, clock: ManualClock, store: FileStorage) -> list[list[object]]:
    batches = []
    if store._readahead is not None:  # idle before the first due time: the seals' hints land
        assert store._readahead.wait_idle(WAIT_S)
    for _ in range(700):  # 1 s steps over the 600 s of deliver times, then some
        clock.advance(1_000)
        while batch := index.poll(1_000):
            batches.append([clock(), *batch])
        if store._readahead is not None:  # the dispatcher's idle time: the reads catch up
            assert store._readahead.wait_idle(WAIT_S)
    assert len(index) == 0
    return batches


def test_an_index_delivers_the_same_with_read_ahead(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_loading, "LOAD_BATCH_INDEXES", 200)  # many loads from a small index
    runs, polling_reads = [], []
    for name, size in (("plain", 0), ("ahead", 1 << 20)):
        store = _CountingStorage(tmp_path / name, readahead_bytes=size)
        clock = ManualClock(10**12)
        index = _fill(store, clock)
        store.reads.clear()
        runs.append(_paced_drain(index, clock, store))
        polling_reads.append(store.reads["MainThread"])  # what the loads waited for
        stats = store.readahead_stats()
        assert index.stats()["readahead"] == stats  # the index reports its storage's
        index.close()
        store.close()
    assert runs[0] == runs[1]  # the same positions, at the same times, in the same batches
    assert polling_reads[0] > 20 and polling_reads[1] == 0
    # Every load found its bytes read ahead (hinted at the seal, or at the load before).
    assert stats["hits"] > 20 and stats["misses"] == 0 and stats["failed"] == 0


def test_nothing_is_read_ahead_for_batches_due_beyond_the_horizon(tmp_path: Path) -> None:
    # A fill whose deliver times lie a day ahead: its seals hint nothing, so no bytes and no
    # metadata are held for buckets that are not due soon.
    store = _CountingStorage(tmp_path)
    index = _fill(store, ManualClock(10**12), ahead_ms=_loading.READAHEAD_HORIZON_MS + 1)
    assert len(index.buckets()) > 2
    assert store.readahead_stats()["requested"] == 0
    assert "delayindex-readahead" not in store.reads
    index.close()
    store.close()


def _backlog_drain(index: DelayIndex, clock: ManualClock) -> list[list[Position]]:
    """Everything is due at once (a dispatcher back after downtime): poll until empty."""
    clock.advance(10**9)
    batches = []
    while batch := index.poll(1_000):
        batches.append(batch)
    assert len(index) == 0
    return batches


def test_a_backlog_is_read_in_fewer_larger_loads_and_delivered_the_same(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Segments due already are read with the batch that comes due (up to
    ``DUE_LOAD_BATCH_INDEXES``): fewer reads, and the very same batches as one batch of
    ``LOAD_BATCH_INDEXES`` at a time."""
    monkeypatch.setattr(_loading, "LOAD_BATCH_INDEXES", 600)
    runs, loads = [], []
    for due_batch in (600, 3_000):  # 600: the due extension off
        monkeypatch.setattr(_loading, "DUE_LOAD_BATCH_INDEXES", due_batch)
        store = FileStorage(tmp_path / str(due_batch))
        clock = ManualClock(10**12)
        index = _fill(store, clock)
        runs.append(_backlog_drain(index, clock))
        loads.append(index.stats()["ops"]["load"]["succeeded"])
        index._check()
        index.close()
        store.close()
    assert runs[0] == runs[1]
    assert loads[1] * 3 < loads[0], loads


def test_the_due_extension_of_a_load_batch(monkeypatch: pytest.MonkeyPatch) -> None:
    from delayindex.tracker._bucket import _Bucket

    bucket = _Bucket(0, 1, 1, 100)
    bucket.mins = np.arange(10, 110, 10, dtype=np.int64)  # 10 segments of 10, due at 10..100
    bucket.bounds = np.arange(10, 110, 10, dtype=np.int64)
    monkeypatch.setattr(_loading, "LOAD_BATCH_INDEXES", 20)
    monkeypatch.setattr(_loading, "DUE_LOAD_BATCH_INDEXES", 50)
    assert _loading.load_batch_end(bucket, 1) == 2  # 20 indexes
    assert _loading.load_batch_end(bucket, 1, cutoff=25) == 2  # segment 3 is not due
    assert _loading.load_batch_end(bucket, 1, cutoff=30) == 3  # it is
    assert _loading.load_batch_end(bucket, 1, cutoff=10**9) == 5  # capped at 50
    assert _loading.load_batch_end(bucket, 4, cutoff=10**9) == 8
    assert _loading.load_batch_end(bucket, 9, cutoff=10**9) == 10  # the last segment
    assert _loading.load_batch_end(bucket, 10, cutoff=0) == 10  # at least one
