"""Manifest model and bytes: invariants, round trip, and that every damage is detected."""

from __future__ import annotations

import json
import struct
from dataclasses import replace
from typing import Any

import mmh3
import pytest

from delayindex.errors import SnapshotCorruptError
from delayindex.storage.manifest import (
    BucketRecord,
    Intent,
    Manifest,
    SubscriptionRecord,
    decode_manifest,
    encode_manifest,
    validate_key,
)

WHERE = "test:manifests/orders"


def _record(start: int, end: int, sid: str, messages: int = 10) -> BucketRecord:
    return BucketRecord(start, end, sid, messages, 2, 100 + messages)


def _rich() -> Manifest:
    """A manifest using every field: live buckets, a pending merge, a failing delete, a DLQ."""
    m = Manifest("orders", version=7)
    m = m.with_bucket(_record(10, 19, "orders-10-19-aa"))
    m = m.with_bucket(_record(0, 9, "orders-0-9-bb", 3))
    m = m.with_bucket(_record(20, 2**63 - 1, "orders-20-max-cc"))
    m = m.with_intent(
        Intent("create", "orders-0-19-dd", 0, 19, replaces=("orders-0-9-bb", "orders-10-19-aa"))
    )
    m = m.with_intent(Intent("delete", "orders-5-5-ee", 5, 5, attempts=2, next_attempt_ms=99))
    m = m.with_intent(Intent("delete", "orders-6-6-ff", 6, 6))
    return m.with_dead_letter(
        Intent("delete", "orders-6-6-ff", 6, 6, attempts=10, last_error="OSError: \u00e9 gone")
    )


def _frame(document: Any, *, fmt: int = 1) -> bytes:
    """Frame arbitrary JSON the way the format spec says (independent of the encoder)."""
    payload = json.dumps(document, sort_keys=True).encode()
    head = struct.pack("<4sHI", b"DIXM", fmt, len(payload))
    return head + struct.pack("<I", mmh3.hash(head + payload, 0x4449584D, signed=False)) + payload


def _document(**changes: Any) -> dict[str, Any]:
    document: dict[str, Any] = json.loads(encode_manifest(_rich())[14:])
    document.update(changes)
    return document


# -- model ---------------------------------------------------------------------------------------


def test_buckets_are_kept_sorted_and_queries_work() -> None:
    m = _rich()
    assert [b.start_ledger for b in m.buckets] == [0, 10, 20]
    assert m.bucket("orders-0-9-bb") == _record(0, 9, "orders-0-9-bb", 3)
    assert m.bucket("nope") is None
    assert m.intent("orders-5-5-ee") is not None and m.intent("orders-0-9-bb") is None
    assert m.live_ids() == {"orders-10-19-aa", "orders-0-9-bb", "orders-20-max-cc"}
    assert m.referenced_ids() == m.live_ids() | {"orders-0-19-dd", "orders-5-5-ee", "orders-6-6-ff"}
    assert [b.snapshot_id for b in m.overlapping(9, 10)] == ["orders-0-9-bb", "orders-10-19-aa"]
    assert m.overlapping(2**63 - 1, 2**63 - 1) == (m.buckets[2],)


def test_edits_return_new_manifests() -> None:
    m = _rich()
    dropped = m.without_intent("orders-5-5-ee")
    assert m.intent("orders-5-5-ee") is not None and dropped.intent("orders-5-5-ee") is None
    updated = m.with_updated_intent(Intent("delete", "orders-5-5-ee", 5, 5, attempts=3))
    assert updated.intent("orders-5-5-ee") == Intent("delete", "orders-5-5-ee", 5, 5, attempts=3)
    assert [i.snapshot_id for i in updated.intents] == [i.snapshot_id for i in m.intents]
    with pytest.raises(KeyError):
        m.without_intent("orders-0-9-bb")
    with pytest.raises(KeyError):
        m.without_bucket("orders-5-5-ee")
    with pytest.raises(KeyError):
        m.with_updated_intent(Intent("delete", "zzz", 1, 1))


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda m: m.with_bucket(_record(15, 25, "x-15-25")), "overlap"),
        (lambda m: m.with_bucket(_record(9, 9, "x-9-9")), "overlap"),
        (
            lambda m: m.without_bucket("orders-20-max-cc").with_bucket(
                _record(30, 40, "orders-5-5-ee")
            ),
            "twice",
        ),
        (lambda m: m.with_intent(Intent("delete", "orders-0-9-bb", 0, 9)), "twice"),
        (lambda m: m.without_bucket("orders-0-9-bb"), "non-live"),
        (lambda m: m.with_intent(Intent("create", "n", 0, 1, ("orders-0-9-bb",))), "same bucket"),
        (lambda m: m.with_intent(Intent("create", "n", 0, 1, ("ghost",))), "non-live"),
    ],
)
def test_invariants_are_enforced_on_every_edit(edit: Any, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        edit(_rich())


@pytest.mark.parametrize(
    "build",
    [
        lambda: BucketRecord(5, 4, "a", 1, 1, 1),
        lambda: BucketRecord(-1, 4, "a", 1, 1, 1),
        lambda: BucketRecord(0, 2**63, "a", 1, 1, 1),
        lambda: BucketRecord(0, 1, "a", 0, 1, 1),
        lambda: BucketRecord(0, 1, "../a", 1, 1, 1),
        lambda: Intent("rename", "a", 0, 1),  # type: ignore[arg-type]
        lambda: Intent("delete", "a", 0, 1, replaces=("b",)),
        lambda: Intent("create", "a", 0, 1, replaces=("a",)),
        lambda: Intent("create", "a", 0, 1, replaces=("b", "b")),
        lambda: Intent("delete", "a", 0, 1, attempts=-1),
        lambda: Manifest("bad/name"),
        lambda: Manifest("n", version=-1),
        lambda: Manifest("n", dead_letters=(Intent("create", "a", 0, 1),)),
    ],
)
def test_bad_values_are_rejected(build: Any) -> None:
    with pytest.raises(ValueError):
        build()


@pytest.mark.parametrize(
    "build",
    [
        lambda: BucketRecord(True, 4, "a", 1, 1, 1),
        lambda: BucketRecord(0, 4.0, "a", 1, 1, 1),  # type: ignore[arg-type]
        lambda: Intent("delete", "a", 0, 1, replaces=["b"]),  # type: ignore[arg-type]
        lambda: Intent("delete", "a", 0, 1, last_error=None),  # type: ignore[arg-type]
        lambda: Manifest("n", buckets=[_record(0, 1, "a")]),  # type: ignore[arg-type]
        lambda: Manifest("n", intents=(_record(0, 1, "a"),)),  # type: ignore[arg-type]
    ],
)
def test_bad_types_are_rejected(build: Any) -> None:
    with pytest.raises(TypeError):
        build()


@pytest.mark.parametrize("key", ["a", "A0", "9", "orders-12-45-0123abcd", "x.y_z~w-v", "a" * 200])
def test_good_keys(key: str) -> None:
    assert validate_key(key) == key


@pytest.mark.parametrize(
    "key", ["", ".hidden", "-x", "_x", "a/b", "../x", "a b", "a" * 201, "caf\u00e9", "a\n", "a\x00"]
)
def test_bad_keys(key: str) -> None:
    with pytest.raises(ValueError, match="bad key"):
        validate_key(key)


def test_key_must_be_a_string() -> None:
    with pytest.raises(TypeError):
        validate_key(b"abc")


# -- bytes ---------------------------------------------------------------------------------------


def test_round_trip_and_determinism() -> None:
    m = _rich()
    data = encode_manifest(m)
    assert data[:4] == b"DIXM"
    assert decode_manifest(data, WHERE) == m
    assert encode_manifest(decode_manifest(data, WHERE)) == data
    assert decode_manifest(encode_manifest(Manifest("n")), WHERE) == Manifest("n")
    assert decode_manifest(encode_manifest(replace(m, version=8)), WHERE).version == 8


def test_payload_is_json_with_sorted_keys() -> None:
    data = encode_manifest(_rich())
    (length,) = struct.unpack_from("<I", data, 6)
    assert len(data) == 14 + length
    text = data[14:].decode()
    assert json.loads(text)["name"] == "orders"
    assert text == json.dumps(json.loads(text), sort_keys=True, separators=(",", ":"))


def test_every_byte_flip_is_detected() -> None:
    data = encode_manifest(_rich())
    for position in range(len(data)):
        for mask in (0x01, 0x80, 0xFF):
            damaged = bytearray(data)
            damaged[position] ^= mask
            with pytest.raises(SnapshotCorruptError, match=WHERE):
                decode_manifest(bytes(damaged), WHERE)


def test_every_truncation_and_any_extension_is_detected() -> None:
    data = encode_manifest(_rich())
    for length in range(len(data)):
        with pytest.raises(SnapshotCorruptError, match=WHERE):
            decode_manifest(data[:length], WHERE)
    with pytest.raises(SnapshotCorruptError, match="header says"):
        decode_manifest(data + b"\x00", WHERE)


def test_independent_framing_decodes() -> None:
    assert decode_manifest(_frame(_document()), WHERE) == _rich()


@pytest.mark.parametrize(
    ("frame", "message"),
    [
        (_frame(_document(), fmt=3), "unsupported manifest format 3"),
        (b"DIXS" + _frame(_document())[4:], "bad magic"),
        (_frame(["not", "an", "object"]), "exactly the keys"),
        (_frame(_document(extra=1)), "exactly the keys"),
        (_frame({k: v for k, v in _document().items() if k != "intents"}), "exactly the keys"),
        (_frame(_document(version=True)), "version must be an int"),
        (_frame(_document(version="7")), "version must be an int"),
        (_frame(_document(buckets={})), "buckets must be a list"),
        (_frame(_document(name="../etc")), "bad manifest name"),
    ],
)
def test_well_framed_but_invalid_content_is_corrupt(frame: bytes, message: str) -> None:
    with pytest.raises(SnapshotCorruptError, match=message) as info:
        decode_manifest(frame, WHERE)
    assert str(info.value).startswith(WHERE)


def _mutated(path: str, value: Any) -> bytes:
    document = _document()
    target: Any = document
    *parents, leaf = path.split(".")
    for part in parents:
        target = target[int(part)] if part.isdigit() else target[part]
    target[leaf] = value
    return _frame(document)


@pytest.mark.parametrize(
    ("path", "value", "message"),
    [
        ("buckets.1.start_ledger", 5, "overlap"),  # [5, 19] overlaps [0, 9]
        ("buckets.0.end_ledger", 15, "overlap"),
        ("buckets.0.start_ledger", 50, "start_ledger 50 > end_ledger 9"),
        ("buckets.0.snapshot_id", "orders-10-19-aa", "twice"),
        ("buckets.0.num_segments", 0.5, "must be an int"),
        ("intents.0.kind", "rename", "unknown intent kind"),
        ("intents.0.replaces", ["ghost"], "non-live"),
        ("intents.0.replaces", "orders-0-9-bb", "replaces must be a list"),
        ("intents.1.replaces", ["orders-0-9-bb"], "cannot replace"),
        ("intents.1.attempts", None, "must be an int"),
        ("dead_letters.0.kind", "create", "not a delete intent"),
        ("dead_letters.0.last_error", 3, "last_error must be a str"),
    ],
)
def test_broken_invariants_in_stored_bytes_are_corrupt(path: str, value: Any, message: str) -> None:
    with pytest.raises(SnapshotCorruptError, match=message):
        decode_manifest(_mutated(path, value), WHERE)


def test_unsorted_buckets_are_corrupt() -> None:
    document = _document()
    document["buckets"].reverse()
    document["intents"] = []
    with pytest.raises(SnapshotCorruptError, match="out of order"):
        decode_manifest(_frame(document), WHERE)


def test_bad_utf8_and_bad_json_are_corrupt() -> None:
    for payload in (b"\xff\xfe{", b"{", b'{"name": NaN}'):
        head = struct.pack("<4sHI", b"DIXM", 1, len(payload))
        crc = struct.pack("<I", mmh3.hash(head + payload, 0x4449584D, signed=False))
        with pytest.raises(SnapshotCorruptError, match="invalid manifest"):
            decode_manifest(head + crc + payload, WHERE)


# -- mark-delete position --------------------------------------------------------------------------


def test_mark_delete_round_trips_and_is_absent_when_unset() -> None:
    plain = _rich()
    assert "mark_delete" not in json.loads(encode_manifest(plain)[14:])
    marked = replace(plain, mark_delete=(12, 2**32 - 1))
    assert decode_manifest(encode_manifest(marked), WHERE) == marked
    assert decode_manifest(encode_manifest(plain), WHERE).mark_delete is None


@pytest.mark.parametrize("mark", [[1], [1, 2, 3], "1,2", [-1, 0], [0, 2**32], [0, "x"]])
def test_bad_mark_delete_is_corrupt(mark: Any) -> None:
    with pytest.raises(SnapshotCorruptError, match=WHERE):
        decode_manifest(_frame(_document(mark_delete=mark)), WHERE)


def test_subscriptions_round_trip_and_stay_out_of_older_bytes() -> None:
    plain = Manifest("topic", version=3)
    shared = replace(
        plain, subscriptions=(SubscriptionRecord("a", (4, 2)), SubscriptionRecord("b"))
    )
    assert decode_manifest(encode_manifest(shared), "m") == shared
    assert b"subscriptions" not in encode_manifest(plain)  # older manifests byte-identical


@pytest.mark.parametrize(
    ("subs", "error"),
    [
        ((SubscriptionRecord("b"), SubscriptionRecord("a")), ValueError),  # not sorted
        ((SubscriptionRecord("a"), SubscriptionRecord("a")), ValueError),  # twice
        (("a",), TypeError),
    ],
)
def test_bad_subscriptions_are_refused(subs: Any, error: type[Exception]) -> None:
    with pytest.raises(error):
        Manifest("topic", subscriptions=subs)


@pytest.mark.parametrize("mark", [(1,), (1, -1), (True, 0), [1, 2]])
def test_bad_subscription_marks_are_refused(mark: Any) -> None:
    with pytest.raises((TypeError, ValueError)):
        SubscriptionRecord("a", mark)
    with pytest.raises(TypeError):
        SubscriptionRecord("", None)


def test_folded_cancel_counts_round_trip_and_are_absent_when_zero() -> None:
    """A bucket record and a quarantine record carry ``folded_cancels`` only when a merge
    folded some (so every older manifest encodes byte for byte as before)."""
    from delayindex.storage.manifest import QuarantineRecord

    plain = Manifest("orders").with_bucket(_record(0, 4, "a"))
    assert b"folded_cancels" not in encode_manifest(plain)
    folded = plain.with_bucket(replace(_record(5, 9, "b"), folded_cancels=7))
    damaged = QuarantineRecord("c", 10, 12, 3, 1, "damaged", 5, folded_cancels=2)
    m = replace(folded, quarantined=(damaged, QuarantineRecord("d", 13, 13, 1, 1, "x", 6)))
    data = encode_manifest(m)
    assert decode_manifest(data, WHERE) == m and data.count(b"folded_cancels") == 2
    with pytest.raises(ValueError, match="folded_cancels"):
        replace(_record(5, 9, "b"), folded_cancels=-1)
