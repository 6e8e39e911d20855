"""Regenerate the protobuf Python modules from ``proto/``.

Every ``*.proto`` under ``proto/`` is compiled with the protoc bundled in
``grpcio-tools`` into ``src/`` (``--python_out`` and ``--pyi_out``). The
directory layout under ``proto/`` mirrors the Python package, so
``proto/delayindex/pb/snapshot.proto`` becomes
``src/delayindex/pb/snapshot_pb2.py`` (and ``.pyi``).

Each generated file then gets one header line prepended::

    # GENERATED from proto/<relpath> by scripts/gen_proto.py -- DO NOT EDIT.

protoc's own header lines (including ``# Protobuf Python Version: X.Y.Z``)
follow it unchanged.

The generated files are committed. ``tests/test_proto.py`` fails when they no
longer match ``proto/``, and checks that the ``protobuf`` floor in
``pyproject.toml`` is not lower than the gencode version.

Usage (from any working directory)::

    python scripts/gen_proto.py
"""

from __future__ import annotations

import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
PROTO_DIR = REPO_ROOT / "proto"
OUT_DIR = REPO_ROOT / "src"
HEADER_TEMPLATE = "# GENERATED from proto/{rel} by scripts/gen_proto.py -- DO NOT EDIT.\n"


def _proto_files() -> list[Path]:
    """Return every ``.proto`` file under ``proto/``, sorted."""
    return sorted(PROTO_DIR.rglob("*.proto"))


def _add_header(path: Path, rel: str) -> None:
    """Prepend the DO-NOT-EDIT header to ``path`` (idempotent)."""
    header = HEADER_TEMPLATE.format(rel=rel)
    text = path.read_text(encoding="utf-8")
    if not text.startswith(header):
        path.write_text(header + text, encoding="utf-8")


def main() -> int:
    """Compile all protos and stamp the generated files; return the exit code."""
    try:
        from grpc_tools import protoc
    except ImportError:
        print(
            "gen_proto: grpc_tools is not installed; run: pip install -e '.[dev]'",
            file=sys.stderr,
        )
        return 2

    protos = _proto_files()
    if not protos:
        print(f"gen_proto: no .proto files under {PROTO_DIR}", file=sys.stderr)
        return 1

    # protoc.main() does not add the well-known-types include path by itself.
    wkt_include = Path(protoc.__file__).resolve().parent / "_proto"
    rels = [p.relative_to(PROTO_DIR).as_posix() for p in protos]
    args = [
        "grpc_tools.protoc",  # argv[0], ignored by protoc
        f"-I{PROTO_DIR}",
        f"-I{wkt_include}",
        f"--python_out={OUT_DIR}",
        f"--pyi_out={OUT_DIR}",
        *(str(p) for p in protos),
    ]
    rc = int(protoc.main(args))
    if rc != 0:
        print(f"gen_proto: protoc failed with exit code {rc}", file=sys.stderr)
        return rc

    for rel in rels:
        stem = OUT_DIR / rel[: -len(".proto")]
        for suffix in ("_pb2.py", "_pb2.pyi"):
            out = stem.with_name(stem.name + suffix)
            if not out.is_file():
                print(f"gen_proto: expected output missing: {out}", file=sys.stderr)
                return 1
            _add_header(out, rel)
            print(f"gen_proto: wrote {out.relative_to(REPO_ROOT).as_posix()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
