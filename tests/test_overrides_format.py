"""The packed form of cancel overrides and the manifest formats that carry them.

Round trips (hypothesis) through ``pack_cancelled``/``unpack_cancelled``, ``Overrides`` and a
whole manifest; the invariants refused on construction; every byte of a packed form damaged
(inside a manifest the checksum finds it; bare, the unpacker refuses it or yields positions
that still meet every invariant); format-1 manifests with per-ledger roaring bitmaps still read
the same; each format only with its own form of the overrides.
"""

from __future__ import annotations

import base64
import json
import struct

import mmh3
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from pyroaring import BitMap

from delayindex import DelayIndex, ManualClock, MemoryStorage
from delayindex._cancelset import pack_cancelled, unpack_cancelled
from delayindex.errors import SnapshotCorruptError
from delayindex.storage._overrides import Overrides
from delayindex.storage.manifest import Manifest, decode_manifest, encode_manifest

WHERE = "test-manifest"

positions = st.lists(
    st.tuples(st.integers(0, 2**63 - 1), st.integers(0, 2**32 - 1)), max_size=200
).map(lambda ps: sorted(set(ps)))
clustered = st.lists(st.tuples(st.integers(0, 5), st.integers(0, 3000)), max_size=400).map(
    lambda ps: sorted(set(ps))
)
moves = st.lists(
    st.tuples(st.integers(0, 9), st.integers(0, 99), st.integers(-(2**63), 2**63 - 1)),
    max_size=5,
    unique_by=lambda m: (m[0], m[1]),
).map(lambda ms: tuple(sorted(ms)))


def _arrays(ps: list[tuple[int, int]]) -> tuple[np.ndarray, np.ndarray]:
    return (
        np.array([p[0] for p in ps], dtype=np.int64),
        np.array([p[1] for p in ps], dtype=np.int64),
    )


def _frame(document: object, fmt: int) -> bytes:
    payload = json.dumps(document, sort_keys=True).encode()
    head = struct.pack("<4sHI", b"DIXM", fmt, len(payload))
    return head + struct.pack("<I", mmh3.hash(head + payload, 0x4449584D, signed=False)) + payload


@given(st.one_of(positions, clustered))
def test_pack_round_trips(ps: list[tuple[int, int]]) -> None:
    ledgers, entries = _arrays(ps)
    packed = pack_cancelled(ledgers, entries)
    assert (packed == b"") == (not ps)
    got_ledgers, got_entries = unpack_cancelled(packed)
    assert got_ledgers.tolist() == ledgers.tolist()
    assert got_entries.tolist() == entries.tolist()


@given(clustered, moves)
def test_manifest_round_trips_with_overrides(
    ps: list[tuple[int, int]], moved: tuple[tuple[int, int, int], ...]
) -> None:
    overrides = Overrides.from_arrays(*_arrays(ps), moved)
    manifest = Manifest(name="m", version=3, overrides=overrides)
    data = encode_manifest(manifest)
    assert struct.unpack_from("<H", data, 4)[0] == (2 if overrides else 1)
    again = decode_manifest(data, WHERE)
    assert again == manifest
    columns = [c.tolist() for c in again.overrides.to_arrays()]
    assert list(zip(columns[0], columns[1], strict=True)) == ps
    assert list(zip(*columns[2:], strict=True)) == list(moved)


def test_from_record_matches_from_arrays() -> None:
    record = ((3, BitMap([1, 5, 9]).serialize()), (7, BitMap([0]).serialize()))
    overrides = Overrides.from_record(record, ((8, 1, 10),))
    assert overrides == Overrides.from_arrays(
        np.array([3, 3, 3, 7]), np.array([1, 5, 9, 0]), ((8, 1, 10),)
    )
    assert not Overrides.from_record((), ())
    with pytest.raises(ValueError, match="empty bitmap"):
        Overrides.from_record(((3, BitMap().serialize()),), ())
    with pytest.raises(ValueError, match="bad bitmap"):
        Overrides.from_record(((3, b"\x00junk"),), ())
    with pytest.raises(ValueError, match="ascend"):
        Overrides.from_record(((7, BitMap([1]).serialize()), (3, BitMap([1]).serialize())), ())


@pytest.mark.parametrize(
    ("ledgers", "entries", "message"),
    [
        ([1, 1], [5, 5], "ascend"),
        ([2, 1], [0, 0], "ascend"),
        ([1, 1], [6, 5], "ascend"),
        ([-1], [0], "out of range"),
        ([1], [2**32], "out of range"),
        ([1], [-1], "out of range"),
    ],
)
def test_pack_refuses_broken_invariants(
    ledgers: list[int], entries: list[int], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        pack_cancelled(np.array(ledgers, dtype=np.int64), np.array(entries, dtype=np.int64))


def test_every_damaged_byte_is_caught() -> None:
    ps = [(ledger, entry) for ledger in (4, 9, 2**40) for entry in range(0, 3000, 7)]
    ledgers, entries = _arrays(ps)
    packed = pack_cancelled(ledgers, entries)
    data = encode_manifest(Manifest(name="m", overrides=Overrides(packed)))
    for i in range(len(data)):
        damaged = bytearray(data)
        damaged[i] ^= 0x5A
        with pytest.raises(SnapshotCorruptError, match=WHERE):
            decode_manifest(bytes(damaged), WHERE)
    # Bare (no checksum around it): refused, or else positions meeting every invariant.
    for i in range(len(packed)):
        damaged = bytearray(packed)
        damaged[i] ^= 0x5A
        try:
            got_ledgers, got_entries = unpack_cancelled(bytes(damaged))
        except ValueError:
            continue
        assert len(got_ledgers) and (got_entries < 2**32).all() and (got_entries >= 0).all()
        keys = list(zip(got_ledgers.tolist(), got_entries.tolist(), strict=True))
        assert keys == sorted(set(keys))


def test_format_one_manifests_still_read() -> None:
    document = {
        "name": "m", "version": 4, "buckets": [], "intents": [], "dead_letters": [],
        "overrides": {
            "cancelled": [
                [3, base64.b64encode(BitMap([1, 2, 70_000]).serialize()).decode()],
                [9, base64.b64encode(BitMap([0]).serialize()).decode()],
            ],
            "moved": [[5, 5, 123]],
        },
    }  # fmt: skip
    manifest = decode_manifest(_frame(document, 1), WHERE)
    columns = [c.tolist() for c in manifest.overrides.to_arrays()]
    assert columns == [[3, 3, 3, 9], [1, 2, 70_000, 0], [5], [5], [123]]
    rewritten = encode_manifest(manifest)  # written back in format 2, same content
    assert struct.unpack_from("<H", rewritten, 4)[0] == 2
    assert decode_manifest(rewritten, WHERE) == manifest


def test_each_format_takes_only_its_own_form() -> None:
    packed = pack_cancelled(np.array([1]), np.array([2]))
    new = {"cancelled_packed": base64.b64encode(packed).decode(), "moved": []}
    old = {"cancelled": [[1, base64.b64encode(BitMap([2]).serialize()).decode()]], "moved": []}
    base = {"name": "m", "version": 1, "buckets": [], "intents": [], "dead_letters": []}
    assert decode_manifest(_frame({**base, "overrides": new}, 2), WHERE).overrides
    assert decode_manifest(_frame({**base, "overrides": old}, 1), WHERE).overrides
    for document, fmt in (({**base, "overrides": new}, 1), ({**base, "overrides": old}, 2)):
        with pytest.raises(SnapshotCorruptError, match="wrong form"):
            decode_manifest(_frame(document, fmt), WHERE)
    assert struct.unpack_from("<H", encode_manifest(Manifest(name="m")), 4)[0] == 1


def test_half_of_a_million_positions_pack_small() -> None:
    rng = np.random.default_rng(7)
    ledgers = np.repeat(np.arange(1000, dtype=np.int64), 500)
    entries = np.concatenate([np.sort(rng.choice(1000, 500, replace=False)) for _ in range(1000)])
    packed = pack_cancelled(ledgers, entries.astype(np.int64))
    portable = sum(
        len(BitMap(entries[i * 500 : (i + 1) * 500].tolist()).serialize()) for i in range(1000)
    )
    assert len(packed) < portable / 3  # the per-ledger roaring form this replaces


def test_an_index_opens_a_format_one_manifest_and_keeps_its_overrides() -> None:
    """A store written before format 2 (its cancels as per-ledger bitmaps) opens: the cancel
    and the reschedule hold against the dispatcher's replay, and the next commit writes
    format 2."""
    t0 = 1_000_000
    storage = MemoryStorage()
    clock = ManualClock(t0)
    index = DelayIndex.open(storage, "old", clock=clock)
    for entry in range(10):
        index.add(1, entry, t0 + 10_000 + entry)
    assert index.cancel(1, 3) and index.reschedule(1, 5, t0 + 50_000)
    index.flush()
    index.close()
    data = storage.raw_manifest("old")
    assert data is not None and struct.unpack_from("<H", data, 4)[0] == 2
    document = json.loads(data[14:])
    overrides = document["overrides"]
    del overrides["cancelled_packed"]
    overrides["cancelled"] = [[1, base64.b64encode(BitMap([3]).serialize()).decode()]]
    storage.put_raw_manifest("old", _frame(document, 1))

    again = DelayIndex.open(storage, "old", clock=clock)
    try:
        for entry in range(10):  # the replay, with the original times
            again.add(1, entry, t0 + 10_000 + entry)
        assert not again.contains(1, 3)
        clock.set(t0 + 20_000)
        delivered = again.poll(100)
        assert sorted(p.entry_id for p in delivered) == [0, 1, 2, 4, 6, 7, 8, 9]
        clock.set(t0 + 50_000)
        assert [p.entry_id for p in again.poll(100)] == [5]
        again.cancel(1, 9)  # already delivered: nothing changes, but the overrides are noted
        again.flush()
    finally:
        again.close()
    rewritten = storage.raw_manifest("old")
    assert rewritten is not None and struct.unpack_from("<H", rewritten, 4)[0] == 2
