"""Golden snapshot files: committed objects must keep decoding, and encoding must not drift.

``tests/golden/snapshot-vN.dixs`` is an encoded snapshot written by ``scripts/make_golden.py``;
``snapshot-vN.json`` next to it says what it holds (ledger range, per segment min/max/count and
ledgers, every triple in segment order). These tests decode each committed object with the
current codec and compare it with its JSON exactly, and check that re-encoding the decoded
snapshot reproduces the committed bytes exactly, so that any change of the format is noticed.

If the format changes deliberately, bump the version and ADD a new golden file (run
``python scripts/make_golden.py``); never rewrite an old one. An old golden file that the codec
no longer reads is a compatibility decision to make explicitly, not a file to regenerate.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import zstandard
from pyroaring import BitMap

from delayindex.snapshot import codec
from delayindex.snapshot.codec import OBJECT_VERSION, decode_snapshot, encode_snapshot
from delayindex.snapshot.format import FORMAT_VERSION

REPO_ROOT = Path(__file__).resolve().parents[1]
GOLDEN_DIR = REPO_ROOT / "tests" / "golden"
SCRIPT = REPO_ROOT / "scripts" / "make_golden.py"
CASES = sorted(GOLDEN_DIR.glob("snapshot-v*.dixs"))


def _load(path: Path) -> tuple[bytes, dict[str, Any]]:
    return path.read_bytes(), json.loads(path.with_suffix(".json").read_text(encoding="utf-8"))


def _script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("make_golden", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


CURRENT = GOLDEN_DIR / f"{_script().STEM}.dixs"


def test_current_version_has_a_golden_file() -> None:
    assert CURRENT in CASES, (
        f"no golden file for object version {OBJECT_VERSION}, format {FORMAT_VERSION}: {CASES}"
    )
    for path in CASES:
        assert path.with_suffix(".json").is_file(), f"{path.name} has no JSON description"


@pytest.mark.parametrize("path", CASES, ids=lambda p: p.name)
def test_golden_decodes_to_its_description(path: Path) -> None:
    data, want = _load(path)
    assert hashlib.sha256(data).hexdigest() == want["sha256"], "the .dixs and .json differ"
    assert len(data) == want["size"]
    metadata, segments = decode_snapshot(data, path.name)
    assert metadata.format_version == want["format_version"]
    assert (metadata.start_ledger, metadata.end_ledger) == (
        want["start_ledger"],
        want["end_ledger"],
    )
    assert metadata.num_messages == want["num_messages"]
    assert metadata.num_segments == len(segments) == len(want["segments"])
    for number, (meta, segment, seg_want) in enumerate(
        zip(metadata.segments, segments, want["segments"], strict=True), 1
    ):
        assert seg_want["number"] == number
        got = {
            "min_deliver_at": meta.min_deliver_at,
            "max_deliver_at": meta.max_deliver_at,
            "count": meta.count,
            "ledgers": list(meta.ledgers),
        }
        assert got == {key: seg_want[key] for key in got}, f"segment {number}"
        assert [list(t) for t in segment.triples()] == seg_want["triples"], f"segment {number}"
        assert {lg: sorted(bm) for lg, bm in meta.items()} == {
            lg: sorted(e for _, led, e in seg_want["triples"] if led == lg) for lg in meta.ledgers
        }, f"segment {number} bitmaps"
    ledgers, entries = metadata.folded_positions()
    assert [[a, b] for a, b in zip(ledgers.tolist(), entries.tolist(), strict=True)] == want.get(
        "folded_cancels", []
    )


def _current_version(path: Path) -> bool:
    _, want = _load(path)
    return bool(
        want["object_version"] == OBJECT_VERSION and want["format_version"] == FORMAT_VERSION
    )


# Files of the current version re-encode to themselves; so do format-1 files of object version 1
# (the encoder writes each metadata in its own format's form, so an old object keeps its bytes).
CURRENT_VERSION_CASES = [path for path in CASES if _current_version(path)]
REENCODED_CASES = [path for path in CASES if _load(path)[1]["object_version"] == OBJECT_VERSION]


def test_some_golden_file_is_current() -> None:
    assert CURRENT_VERSION_CASES, (
        "no golden file of the current format version: add one (make_golden.py)"
    )


def test_an_old_format_is_still_golden() -> None:
    formats = {_load(path)[1]["format_version"] for path in CASES}
    assert {1, FORMAT_VERSION} <= formats, formats


@pytest.mark.parametrize("path", REENCODED_CASES, ids=lambda p: p.name)
def test_golden_reencodes_byte_for_byte(path: Path) -> None:
    data, _ = _load(path)
    metadata, segments = decode_snapshot(data, path.name)
    again = encode_snapshot(metadata, segments)
    if again == data:
        return
    # Say where it drifted before failing.
    _, old = codec.split_object(data, "committed")
    _, new = codec.split_object(again, "re-encoded")
    assert len(old) == len(new), "the number of entries changed"
    assert old[1:] == new[1:], "segment entries changed: the segment format drifted"
    payloads = []
    for entry in (old[0], new[0]):
        flags, payload = entry[0], entry[1:-4]
        if flags & codec.FLAG_ZSTD:
            payload = zstandard.ZstdDecompressor().decompress(payload)
        payloads.append(payload)
    assert payloads[0] == payloads[1], "the metadata protobuf changed: the format drifted"
    pytest.fail(
        "only the zstd-compressed metadata bytes differ (a zstd library change?); the object "
        f"must still be reproduced exactly (zstandard {zstandard.__version__})"
    )


def test_golden_has_the_intended_shape() -> None:
    data, want = _load(CURRENT)
    metadata, _ = decode_snapshot(data, CURRENT.name)
    assert 250 <= metadata.num_messages <= 500
    assert metadata.num_segments >= 10
    assert any(len(meta.ledgers) > 1 for meta in metadata.segments)
    assert (
        max(meta.count for meta in metadata.segments) == want["params"]["max_indexes_per_segment"]
    )
    runs = sum(BitMap.deserialize(b).get_statistics()["n_run_containers"] for b in metadata.bitmaps)
    assert runs >= 1, "the run ledger should give run containers"
    assert metadata.end_ledger > max(metadata.ledgers.tolist())  # explicit, wider range


@pytest.mark.parametrize("folded", [False, True])
def test_script_reproduces_the_committed_files(folded: bool) -> None:
    """The generator is deterministic (and the workload generator has not drifted)."""
    script = _script()
    path = GOLDEN_DIR / f"{script.FOLDED_STEM if folded else script.STEM}.dixs"
    data, description = script.build(folded)
    assert data == path.read_bytes()
    assert script.to_json(description) == path.with_suffix(".json").read_text(encoding="utf-8")


def test_folded_cancels_need_format_3() -> None:
    """Format 3 exists so that an older reader refuses folded cancels instead of dropping
    them: a format 2 metadata carrying them, or a format 3 one without, is corrupt. (Format 4
    carries them or not: a reader older than format 4 refuses the whole metadata, by its
    unknown two-part flag.)"""
    data = (GOLDEN_DIR / "snapshot-v1-f3.dixs").read_bytes()
    metadata, segments = decode_snapshot(data, "folded")
    assert metadata.format_version == 3 and metadata.folded_cancels
    plain = metadata.with_folded(b"")
    assert plain.format_version == 2 and not plain.folded_cancels
    assert decode_snapshot(encode_snapshot(plain, segments), "plain")[0] == plain
    for message in (
        codec._metadata_message(metadata, format_version=2),
        codec._metadata_message(plain, format_version=3),
    ):
        with pytest.raises(ValueError, match="folded cancels"):
            codec._metadata_from_message(message)


def test_the_current_format_is_refused_by_a_reader_of_one_part() -> None:
    """A reader from before format 4 knows only the zstd flag: the two-part flag of every
    current metadata makes it refuse the object rather than misread it."""
    for stem in (_script().STEM, _script().FOLDED_STEM):
        _, entries = codec.split_object((GOLDEN_DIR / f"{stem}.dixs").read_bytes(), stem)
        assert entries[0][0] & ~codec.FLAG_ZSTD == codec.FLAG_SPLIT
