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
    bitmap = BitMap([0, 1, 2, 7, 65_536, (1 << 32) - 1])
    meta = snapshot_pb2.SnapshotMetadata(
        format_version=1,
        start_ledger=10,
        end_ledger=(1 << 63) - 1,
        num_messages=7,
        min_deliver_at_deltas=[1_700_000_000_000, -5, 1 << 40],
        deliver_at_spans=[0, 300_000, 9],
        counts=[1, 5, 1],
        ledger_counts=[2, 1, 1],
        ledger_deltas=[1, 1 << 62, 0, 3],
        bitmaps=[bitmap.serialize(), BitMap([3]).serialize(), b"", b"x"],
    )
    parsed = snapshot_pb2.SnapshotMetadata.FromString(meta.SerializeToString())
    assert parsed == meta
    assert list(parsed.min_deliver_at_deltas) == [1_700_000_000_000, -5, 1 << 40]
    assert BitMap.deserialize(parsed.bitmaps[0]) == bitmap
    assert list(parsed.ledger_deltas) == [1, 1 << 62, 0, 3]


def test_metadata_columns_are_packed_zigzag() -> None:
    meta = snapshot_pb2.SnapshotMetadata(min_deliver_at_deltas=[-1, 1, -1])
    # field 5, wire type 2 (packed), length 3, zigzag varints 1, 2, 1
    assert meta.SerializeToString() == bytes([(5 << 3) | 2, 3, 1, 2, 1])
