"""Checks for the protobuf code-generation pipeline (proto/ -> src/delayindex/pb/).

* freshness: the committed ``*_pb2.py`` modules were generated from the current
  ``proto/`` sources (compared by descriptor, so it does not depend on the
  protoc version that produced them);
* floor: the ``protobuf`` floor in pyproject.toml is not older than the gencode
  version (protobuf runtime 7 refuses gencode newer than itself);
* header: the generated files carry the DO-NOT-EDIT header of scripts/gen_proto.py;
* round trips through the snapshot messages.
"""

from __future__ import annotations

import importlib
import re
import tomllib
from collections.abc import Iterable
from pathlib import Path
from types import ModuleType

import pytest
from google.protobuf import descriptor_pb2
from pyroaring import BitMap

from delayindex.pb import snapshot_pb2

REPO_ROOT = Path(__file__).resolve().parents[1]
PROTO_DIR = REPO_ROOT / "proto"
SRC_DIR = REPO_ROOT / "src"
PROTO_RELS = sorted(p.relative_to(PROTO_DIR).as_posix() for p in PROTO_DIR.rglob("*.proto"))
STALE_MSG = "snapshot_pb2 is stale: run python scripts/gen_proto.py"
VERSION_RE = re.compile(r"^# Protobuf Python Version: (\d+)\.(\d+)\.(\d+)\s*$", re.MULTILINE)
# "protobuf>=7.35.1,<8" -> specifier part after the (exact) distribution name.
PROTOBUF_REQ_RE = re.compile(r"^protobuf(?![\w.-])\s*(?:\[[^\]]*\])?\s*(?P<spec>[^;]*)")
FLOOR_RE = re.compile(r">=\s*(\d+(?:\.\d+)*)")


def _module_name(rel: str) -> str:
    """``delayindex/pb/snapshot.proto`` -> ``delayindex.pb.snapshot_pb2``."""
    return rel[: -len(".proto")].replace("/", ".") + "_pb2"


def _generated_paths(rel: str) -> list[Path]:
    stem = rel[: -len(".proto")]
    return [SRC_DIR / f"{stem}_pb2.py", SRC_DIR / f"{stem}_pb2.pyi"]


def _clear_json_names(messages: Iterable[descriptor_pb2.DescriptorProto]) -> None:
    """Clear ``json_name`` on every field of ``messages``, recursively."""
    for msg in messages:
        for field in msg.field:
            field.ClearField("json_name")
        for ext in msg.extension:
            ext.ClearField("json_name")
        _clear_json_names(msg.nested_type)


def _normalize(fdp: descriptor_pb2.FileDescriptorProto) -> descriptor_pb2.FileDescriptorProto:
    # protoc's --descriptor_set_out fills json_name; the descriptor embedded in
    # the generated module does not. Nothing else differs.
    _clear_json_names(fdp.message_type)
    for ext in fdp.extension:
        ext.ClearField("json_name")
    return fdp


def _version_tuple(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in text.split("."))


def test_proto_sources_exist() -> None:
    assert "delayindex/pb/snapshot.proto" in PROTO_RELS


def test_generated_modules_are_fresh(tmp_path: Path) -> None:
    from grpc_tools import protoc  # hard dependency: the test command installs '.[dev]'

    out = tmp_path / "descriptors.pb"
    wkt_include = Path(protoc.__file__).resolve().parent / "_proto"
    rc = protoc.main(
        [
            "grpc_tools.protoc",
            f"-I{PROTO_DIR}",
            f"-I{wkt_include}",
            f"--descriptor_set_out={out}",
            *(str(PROTO_DIR / rel) for rel in PROTO_RELS),
        ]
    )
    assert rc == 0, f"protoc failed on proto/ (exit code {rc})"
    fds = descriptor_pb2.FileDescriptorSet.FromString(out.read_bytes())
    assert sorted(f.name for f in fds.file) == PROTO_RELS

    for compiled in fds.file:
        module: ModuleType = importlib.import_module(_module_name(compiled.name))
        committed = descriptor_pb2.FileDescriptorProto.FromString(module.DESCRIPTOR.serialized_pb)
        expected = _normalize(compiled)
        actual = _normalize(committed)
        if expected != actual:
            pytest.fail(f"{STALE_MSG} ({compiled.name} differs from {module.__name__})")


def test_protobuf_floor_covers_gencode_version() -> None:
    pyproject = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    floors = [
        spec.group(1)
        for dep in pyproject["project"]["dependencies"]
        if (req := PROTOBUF_REQ_RE.match(dep.strip())) is not None
        if (spec := FLOOR_RE.search(req.group("spec"))) is not None
    ]
    assert len(floors) == 1, "pyproject.toml must declare exactly one 'protobuf>=X.Y.Z' floor"
    floor = _version_tuple(floors[0])

    for rel in PROTO_RELS:
        py_path = _generated_paths(rel)[0]
        match = VERSION_RE.search(py_path.read_text(encoding="utf-8"))
        assert match is not None, f"no '# Protobuf Python Version' line in {py_path}"
        gencode = tuple(int(g) for g in match.groups())
        assert gencode <= floor, (
            f"{py_path.name} was generated for protobuf {'.'.join(map(str, gencode))} but "
            f"pyproject.toml allows protobuf>={floors[0]}; the protobuf runtime refuses "
            f"gencode newer than itself, so raise the floor to at least the gencode version"
        )


def test_generated_files_have_header() -> None:
    for rel in PROTO_RELS:
        header = f"# GENERATED from proto/{rel} by scripts/gen_proto.py -- DO NOT EDIT."
        for path in _generated_paths(rel):
            first_line = path.read_text(encoding="utf-8").splitlines()[0]
            assert first_line == header, f"{path} does not start with the generated header"


def test_snapshot_metadata_round_trip() -> None:
    entries = [0, 1, 2, 7, 1000, 65_535, 65_536, 1 << 20]
    bitmap = BitMap(entries)
    meta = snapshot_pb2.SnapshotMetadata(
        format_version=1,
        start_ledger=10,
        end_ledger=12,
        num_messages=len(entries),
    )
    seg = meta.segments.add(min_deliver_at=-5, max_deliver_at=1_700_000_000_000, count=8)
    seg.ledger_bitmaps[11] = bitmap.serialize()
    seg.ledger_bitmaps[(1 << 64) - 1] = BitMap().serialize()

    parsed = snapshot_pb2.SnapshotMetadata.FromString(meta.SerializeToString())

    assert parsed == meta
    assert parsed.format_version == 1
    assert (parsed.start_ledger, parsed.end_ledger, parsed.num_messages) == (10, 12, 8)
    assert len(parsed.segments) == 1
    pseg = parsed.segments[0]
    assert (pseg.min_deliver_at, pseg.max_deliver_at, pseg.count) == (-5, 1_700_000_000_000, 8)
    assert sorted(pseg.ledger_bitmaps) == [11, (1 << 64) - 1]
    restored = BitMap.deserialize(pseg.ledger_bitmaps[11])
    assert restored == bitmap
    assert list(restored) == entries
    assert len(BitMap.deserialize(pseg.ledger_bitmaps[(1 << 64) - 1])) == 0


def test_snapshot_segment_round_trip_with_negative_deltas() -> None:
    deliver_at_deltas = [1_700_000_000_000, 0, 5, -3, -(1 << 62), 1 << 62]
    ledger_deltas = [42, 0, 1, (1 << 64) - 1, 3, 0]
    entry_ids = [0, 1, 0, (1 << 32) - 1, 9, 10]
    seg = snapshot_pb2.SnapshotSegment(
        format_version=1,
        count=len(entry_ids),
        deliver_at_deltas=deliver_at_deltas,
        ledger_deltas=ledger_deltas,
        entry_ids=entry_ids,
    )

    data = seg.SerializeToString()
    parsed = snapshot_pb2.SnapshotSegment.FromString(data)

    assert parsed == seg
    assert parsed.count == len(entry_ids)
    assert list(parsed.deliver_at_deltas) == deliver_at_deltas
    assert list(parsed.ledger_deltas) == ledger_deltas
    assert list(parsed.entry_ids) == entry_ids


def test_snapshot_segment_columns_are_packed_zigzag() -> None:
    # Field 3, wire type 2 (length-delimited) = tag byte 0x1A: the whole
    # deliver_at column is one packed field. zigzag(-1) = 1 and zigzag(1) = 2.
    seg = snapshot_pb2.SnapshotSegment(deliver_at_deltas=[-1, 1, -1])
    assert seg.SerializeToString() == bytes([0x1A, 3, 1, 2, 1])
