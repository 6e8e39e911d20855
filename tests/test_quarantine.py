"""Quarantine, release and repair: one damaged object never stops an index, never empties it.

Each test damages one bucket's snapshot (a segment read while running, or found at open) and
checks that only that bucket stops, that it is reported once, that its positions stay tracked,
and that an operator can release it or repair it from a dump of the topic.
"""

from __future__ import annotations

import contextlib
import json
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypedDict, Unpack

import numpy as np
import pytest
import zstandard

from delayindex import (
    DelayIndex,
    ManualClock,
    MemoryStorage,
    Position,
    StorageError,
    TrackerConfig,
)
from delayindex.executors import InlineExecutor
from delayindex.snapshot import codec
from delayindex.snapshot.codec import header_bytes_needed, read_header
from delayindex.timers import Timer

T0 = 1_000_000
NAME = "q"
TICK = 10
Schedule = dict[Position, int]


def config(**overrides: object) -> TrackerConfig:
    settings: dict[str, object] = {
        "min_index_count_per_bucket": 6,
        "max_indexes_per_segment": 2,
        "max_time_step_per_segment_ms": 100,
        "max_num_buckets": 0,
        "tick_ms": TICK,
    }
    settings.update(overrides)
    return TrackerConfig(**settings)  # type: ignore[arg-type]


class OpenOptions(TypedDict, total=False):
    """The keyword arguments of ``DelayIndex.open`` that ``open_index`` passes on."""

    timer: Timer | None
    on_ready: Callable[[], object] | None


def open_index(storage: MemoryStorage, clock: ManualClock, cfg: TrackerConfig | None = None,
               **kwargs: Unpack[OpenOptions]) -> DelayIndex:  # fmt: skip
    return DelayIndex.open(
        storage, NAME, cfg or config(), clock=clock, executor=InlineExecutor(), **kwargs
    )


@dataclass
class Dump:
    """The topic as a dump: columns with int64 arrays."""

    ledger_ids: np.ndarray
    entry_ids: np.ndarray
    deliver_at: np.ndarray


def build(index: DelayIndex, ledgers: int = 3, per_ledger: int = 6) -> Schedule:
    """One sealed bucket per ledger (segments of 2), plus one message in the mutable bucket."""
    schedule: Schedule = {}
    for ledger in range(1, ledgers + 1):
        for entry in range(per_ledger):
            at = T0 + 1000 + ledger * 7 + entry * 40  # interleaved across buckets
            assert index.add(ledger, entry, at)
            schedule[Position(ledger, entry)] = at
    closing = Position(ledgers + 1, 0)
    schedule[closing] = T0 + 50_000
    assert index.add(*closing, schedule[closing])
    index.flush()
    return schedule


def as_dump(schedule: Schedule) -> Dump:
    items = sorted(schedule.items())
    return Dump(
        np.array([p.ledger_id for p, _ in items], dtype=np.int64),
        np.array([p.entry_id for p, _ in items], dtype=np.int64),
        np.array([t for _, t in items], dtype=np.int64),
    )


def flip_segment(storage: MemoryStorage, snapshot_id: str, segment: int) -> bytes:
    """Flip one bit in the middle of entry ``segment`` (0 = metadata); return the old bytes."""
    original = storage.raw_object(snapshot_id)
    header = read_header(original[: header_bytes_needed(original, "x")], "x")
    at = header.entry_offset(segment) + header.entry_lengths[segment] // 2
    damaged = bytearray(original)
    damaged[at] ^= 0x10
    storage.put_raw_object(snapshot_id, bytes(damaged))
    return original


def drain(index: DelayIndex, clock: ManualClock, schedule: Schedule) -> Counter[Position]:
    """Walk the clock through every scheduled time; nothing early, nothing unscheduled."""
    delivered: Counter[Position] = Counter()
    times = sorted(set(schedule.values()))
    for at in [*times, times[-1] + 10_000_000] if times else []:
        clock.set(max(at, clock()))
        while got := index.poll(1000):
            for p in got:
                assert p in schedule, f"{p} was never scheduled"
                assert schedule[p] <= clock() + TICK, f"{p} delivered early"
            delivered.update(got)
            index._check()
    return delivered


def damaged_at_open(
    segment: int, bucket: int = 0, damage: Callable[[MemoryStorage, str], None] | None = None
) -> tuple[MemoryStorage, ManualClock, DelayIndex, str, Schedule]:
    """A built index, closed, one bucket's entry ``segment`` damaged (or its object damaged by
    ``damage(storage, snapshot_id)``), reopened."""
    storage, clock = MemoryStorage(), ManualClock(T0)
    index = open_index(storage, clock)
    schedule = build(index)
    sid = index.buckets()[bucket].snapshot_id
    assert sid is not None
    index.close()
    if damage is None:
        flip_segment(storage, sid, segment)
    else:
        damage(storage, sid)
    return storage, clock, open_index(storage, clock), sid, schedule


def test_a_damaged_later_segment_quarantines_only_its_bucket() -> None:
    storage, clock = MemoryStorage(), ManualClock(T0)
    index = open_index(storage, clock)
    schedule = build(index)
    first = index.buckets()[0]
    assert first.num_segments == 3 and first.snapshot_id is not None
    flip_segment(storage, first.snapshot_id, 2)
    delivered = drain(index, clock, schedule)
    # Bucket 1's segment 1 was delivered; its segments 2 and 3 wait in quarantine.
    lost = {Position(1, e) for e in range(2, 6)}
    assert set(delivered) == set(schedule) - lost
    assert all(n == 1 for n in delivered.values())
    [info] = index.quarantined()
    assert (info.snapshot_id, info.start_ledger, info.end_ledger) == (first.snapshot_id, 1, 1)
    assert (info.num_messages, info.positions_known, info.first_segment) == (4, True, 2)
    assert "damaged" in info.reason and "repair" in info.reason
    assert len(index) == 4 and all(index.contains(*p) for p in lost)
    assert not index.has_message_available()  # nothing stuck at the head
    assert [b.state for b in index.buckets()] == ["quarantined"]
    stats = index.stats()
    assert stats["quarantined_buckets"] == 1 and stats["health"] == "degraded"
    quarantine_warnings = [w for w in stats["warnings"] if "quarantined" in w]
    assert len(quarantine_warnings) == 1  # once, however often it is polled
    manifest = storage.read_manifest(NAME)
    record = manifest.quarantine(first.snapshot_id)
    assert record is not None and record.active and record.first_segment == 2
    assert first.snapshot_id not in manifest.live_ids()
    # Release: the lost times are given up, the positions are due now, the object stays.
    assert index.release_quarantined() == 4
    assert sorted(index.poll(100)) == sorted(lost)
    assert len(index) == 0 and index.quarantined() == []
    assert storage.raw_object(first.snapshot_id)
    record = storage.read_manifest(NAME).quarantine(first.snapshot_id)
    assert record is not None and record.state == "released"
    assert index.stats()["health"] == "ok"
    index.close()


def test_repair_from_the_dump_delivers_what_an_undamaged_index_would() -> None:
    schedules = []
    results = []
    for damaged in (False, True):
        storage, clock = MemoryStorage(), ManualClock(T0)
        index = open_index(storage, clock)
        schedule = build(index)
        schedules.append(schedule)
        sid = index.buckets()[1].snapshot_id
        assert sid is not None
        if damaged:
            flip_segment(storage, sid, 1)
        index.close()
        index = open_index(storage, clock)  # reads no segment: the damage waits
        assert index.quarantined() == []
        order = []
        for at in [*sorted(set(schedule.values())), T0 + 10**8]:
            clock.set(at)
            while got := index.poll(1):
                order.extend(got)
            if index.quarantined():  # found when its first segment came due and was read
                assert damaged
                [info] = index.quarantined()
                assert info.positions_known and info.num_messages == 6
                [result] = index.repair_quarantined(as_dump(schedule))
                assert (result.damaged_snapshot_id, result.num_messages) == (sid, 6)
                assert index.quarantined() == []
                record = storage.read_manifest(NAME).quarantine(sid)
                assert record is not None and record.state == "repaired"
                assert storage.raw_object(sid)  # the damaged object is kept
                stamped = storage.get_metadata(result.snapshot_id)
                assert (stamped.index_name, stamped.has_origin) == (NAME, True)  # stamped
                assert index.stats()["health"] == "ok"
                while got := index.poll(1):  # the repaired messages due now, in order
                    order.extend(got)
        if damaged:
            assert storage.read_manifest(NAME).quarantine(sid) is not None  # it was found
        results.append(order)
        index.close()
    # The mutable bucket's message is lost at close in both (the replay's job).
    assert results[0] == results[1]
    assert len(results[1]) == len(schedules[1]) - 1


def test_repair_after_the_metadata_is_lost_uses_what_add_would_track() -> None:
    _, clock, index, _, schedule = damaged_at_open(0)  # the metadata: positions are lost
    [info] = index.quarantined()
    assert (info.positions_known, info.num_messages) == (False, 6)
    assert not any(index.contains(1, e) for e in range(6))
    index.repair_quarantined(as_dump(schedule))
    assert all(index.contains(1, e) for e in range(6))
    expected = {p: t for p, t in schedule.items() if p.ledger_id <= 3}
    delivered = drain(index, clock, schedule)
    assert set(delivered) == set(expected) and all(n == 1 for n in delivered.values())
    index.close()


def test_repair_refuses_a_dump_that_lacks_positions_and_changes_nothing() -> None:
    storage, clock, index, _, schedule = damaged_at_open(1)
    assert index.quarantined() == []  # segment damage: found when the segment is read
    clock.set(schedule[Position(1, 0)])
    assert Position(1, 0) not in index.poll(100) and len(index.quarantined()) == 1
    partial = {p: t for p, t in schedule.items() if p != Position(1, 3)}
    manifest_before = storage.raw_manifest(NAME)
    with pytest.raises(ValueError, match="5 of the 6"):
        index.repair_quarantined(as_dump(partial))
    assert storage.raw_manifest(NAME) == manifest_before
    assert len(index.quarantined()) == 1
    with pytest.raises(ValueError, match="not a quarantined bucket"):
        index.release_quarantined("nope")
    with pytest.raises(TypeError):
        index.repair_quarantined(object())
    index.close()


def test_quarantine_survives_a_reopen_with_positions_tracked() -> None:
    storage, clock = MemoryStorage(), ManualClock(T0)
    index = open_index(storage, clock)
    schedule = build(index)
    sid = index.buckets()[2].snapshot_id
    assert sid is not None
    flip_segment(storage, sid, 3)
    drain(index, clock, schedule)
    assert [q.snapshot_id for q in index.quarantined()] == [sid]
    index.close()
    index = open_index(storage, ManualClock(clock()))
    [info] = index.quarantined()
    assert info.snapshot_id == sid and info.positions_known
    assert len(index) == 2 and index.contains(3, 4) and index.contains(3, 5)
    assert index.poll(100) == []
    assert index.release_quarantined(sid) == 2
    assert index.poll(100) == [Position(3, 4), Position(3, 5)]
    index.close()


def test_a_mark_past_a_quarantined_bucket_resolves_it_and_keeps_the_object() -> None:
    storage, _, index, sid, _ = damaged_at_open(0)
    assert len(index.quarantined()) == 1
    index.set_mark_delete(2, 0)  # buckets wholly below ledger 2 are acknowledged
    index.flush()
    assert index.quarantined() == []
    record = storage.read_manifest(NAME).quarantine(sid)
    assert record is not None and record.state == "acknowledged"
    assert storage.raw_object(sid)
    index.clear()
    assert storage.raw_object(sid)  # clear keeps damaged objects too
    index.close()


def test_clear_resolves_an_active_quarantine_as_cleared() -> None:
    storage, clock, index, sid, _ = damaged_at_open(0)
    index.clear()
    record = storage.read_manifest(NAME).quarantine(sid)
    assert record is not None and record.state == "cleared"
    assert {o.id for o in storage.list_objects()} == {sid}
    index.close()
    assert open_index(storage, clock).quarantined() == []


def test_damage_found_by_a_merge_quarantines_the_source() -> None:
    storage, clock = MemoryStorage(), ManualClock(T0)
    index = open_index(storage, clock, config(max_num_buckets=2))
    storage_sid: list[str] = []

    # Damage every object as it is written for ledger 1, before the merge reads it.
    original_create = storage.create

    def create(metadata, segments, key):  # type: ignore[no-untyped-def]
        out = original_create(metadata, segments, key)
        if metadata.start_ledger == 1 and metadata.end_ledger == 1:
            storage_sid.append(key)
            flip_segment(storage, key, 3)
        return out

    storage.create = create  # type: ignore[method-assign]
    schedule = build(index, ledgers=4)
    assert storage_sid and [q.snapshot_id for q in index.quarantined()] == storage_sid
    assert index.stats()["ops"]["merge"]["failed"] >= 1
    delivered = drain(index, clock, schedule)
    lost = {p for p in schedule if p.ledger_id == 1}
    assert set(delivered) == set(schedule) - lost
    assert all(index.contains(*p) for p in lost)
    index.close()


def test_close_that_cannot_persist_the_mark_raises_after_closing_everything() -> None:
    storage, clock = MemoryStorage(), ManualClock(T0)
    index = open_index(storage, clock)
    build(index)
    index.set_mark_delete(1, 2)
    storage.inject_failure("manifest", times=40)
    with pytest.raises(StorageError, match="mark-delete position"):
        index.close()
    assert index.closed
    assert index.stats()["closed"] is True  # stats still answer on a closed index
    while storage.pending_failures("manifest"):
        with contextlib.suppress(StorageError):
            storage.read_manifest(NAME)
    reopened = open_index(storage, clock)  # the lock was released
    assert reopened.mark_delete is None  # not persisted: the caller was told
    reopened.close()


def test_a_failing_read_backs_off_per_bucket_and_never_holds_others_back() -> None:
    storage, clock = MemoryStorage(), ManualClock(T0)
    index = open_index(storage, clock, config(load_retry_delay_ms=500))
    schedule = build(index)
    storage.inject_failure("get_segments", times=4 * 3)  # three failed reads in a row
    delivered: Counter[Position] = Counter()
    clock.set(T0 + 1100)
    calls_before = storage.stats()["get_segments"]["calls"]
    for _ in range(50):  # polling hard does not hammer the storage
        delivered.update(index.poll(1000))
    # One failed read per due bucket (three are due), not one per poll.
    assert storage.stats()["get_segments"]["calls"] - calls_before == 3
    assert len(index.stats()["retrying_loads"]) == 3
    delivered.update(drain(index, clock, schedule))
    assert set(delivered) == set(schedule) and all(n == 1 for n in delivered.values())
    assert index.stats()["retrying_loads"] == {}
    index.close()


def test_cli_repair_rebuilds_from_a_dump_and_release_empties_the_quarantine(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from delayindex import FileStorage
    from delayindex.cli import main

    store = tmp_path / "store"
    with FileStorage(store) as storage:
        index = DelayIndex.open(storage, NAME, config(), clock=ManualClock(T0),
                                executor=InlineExecutor())  # fmt: skip
        schedule = build(index)
        victim = index.buckets()[1].snapshot_id
        assert victim is not None
        index.close()
        path = storage.object_path(victim)
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))
    dump = tmp_path / "topic.csv"
    dump.write_text(
        "ledger_id,entry_id,deliver_at\n"
        + "".join(f"{p.ledger_id},{p.entry_id},{t}\n" for p, t in sorted(schedule.items()))
    )
    where = ["--store", str(store), "--name", NAME]
    # inspect reports the quarantine (found at the first open) and exits 1.
    with FileStorage(store) as storage:
        DelayIndex.open(storage, NAME, config(), clock=ManualClock(T0),
                        executor=InlineExecutor()).close()  # fmt: skip
    capsys.readouterr()
    assert main(["inspect", "--store", str(store), "--json", "--now-ms", str(T0)]) == 1
    report = json.loads(capsys.readouterr().out)
    assert any("quarantined" in p and victim in p for p in report["problems"])
    [q] = report["names"][0]["quarantined"]
    assert (q["snapshot_id"], q["state"]) == (victim, "active")
    assert main(["repair", *where, "--tick-ms", str(TICK)]) == 2  # neither --dump nor --release
    capsys.readouterr()
    assert main(["repair", *where, "--dump", str(dump), "--json",
                 "--tick-ms", str(TICK), "--now-ms", str(T0)]) == 0  # fmt: skip
    out = json.loads(capsys.readouterr().out)
    assert [q["snapshot_id"] for q in out["quarantined_before"]] == [victim]
    assert main(["inspect", "--store", str(store), "--now-ms", str(T0)]) == 0
    [repaired] = out["repaired"]
    assert repaired["damaged_snapshot_id"] == victim and repaired["num_messages"] > 0
    assert path.read_bytes() == bytes(data)  # the damaged object is kept
    with FileStorage(store) as storage:
        index = DelayIndex.open(storage, NAME, config(), clock=ManualClock(T0),
                                executor=InlineExecutor())  # fmt: skip
        assert index.quarantined() == []
        expected = {p: t for p, t in schedule.items() if p.ledger_id <= 3}
        delivered = drain(index, index._clock, expected)  # type: ignore[arg-type]
        assert set(delivered) == set(expected)
        index.close()
    assert main(["repair", *where, "--release"]) == 0
    assert "nothing is quarantined" in capsys.readouterr().out


def _undecodable_positions(storage: MemoryStorage, snapshot_id: str) -> None:
    """Replace the entry gaps of a format 6 metadata (after its sound ledger columns) with
    bytes that do not decode, every checksum valid: damage that only the positions' first use
    can find."""
    original = storage.raw_object(snapshot_id)
    _, entries = codec.split_object(original, snapshot_id)
    flags, payload = entries[0][0], entries[0][1:-4]
    assert flags & codec.FLAG_SPLIT
    metadata = codec.decode_metadata(entries[0], snapshot_id)
    assert metadata.format_version == 6
    ledgers = b"".join(map(codec.pack_varints, codec._stored_ledgers(metadata)))
    length, start = codec._get_varint(payload, 0, len(payload))
    garbage = zstandard.ZstdCompressor().compress(ledgers + b"\x05\x01\x02")
    entries[0] = codec._frame(0, flags, payload[: start + length] + garbage)
    storage.put_raw_object(snapshot_id, codec.pack_object(entries))


def test_positions_that_do_not_decode_quarantine_their_bucket_at_first_use() -> None:
    _, clock, index, sid, schedule = damaged_at_open(0, bucket=1, damage=_undecodable_positions)
    assert index.quarantined() == []  # an open reads no bitmap
    assert not any(index.contains(2, e) for e in range(6))  # the first call that needs them
    [info] = index.quarantined()
    assert info.snapshot_id == sid and not info.positions_known
    assert "positions do not decode" in info.reason
    assert all(index.contains(1, e) for e in range(6))  # the other buckets recovered
    expected = {p for p in schedule if p.ledger_id in (1, 3)}  # 4: the mutable bucket's
    delivered = drain(index, clock, schedule)
    assert set(delivered) == expected and all(n == 1 for n in delivered.values())
    index.close()
