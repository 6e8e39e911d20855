"""Dump formats: telling the format from a name, and listing a dump's part files.

A dump is one file or a directory of part files (what Spark writes). The format comes from an
explicit ``fmt`` first, else from the extension, before an optional compression suffix
(``.csv.gz``). Invariants: part files are returned in name order (row numbers depend on it);
``_SUCCESS``, ``_temporary`` and hidden files are skipped; a directory never mixes formats.
"""

from __future__ import annotations

import os
from pathlib import Path

from delayindex.dump.schema import DumpError

_EXTENSIONS: dict[str, str] = {
    ".parquet": "parquet",
    ".pq": "parquet",
    ".jsonl": "jsonl",
    ".json": "jsonl",
    ".ndjson": "jsonl",
    ".csv": "csv",
}
_COMPRESSIONS: dict[str, str] = {".gz": "gzip", ".bz2": "bz2", ".zst": "zstd"}
_FORMAT_ALIASES: dict[str, str] = {
    "parquet": "parquet",
    "jsonl": "jsonl",
    "json": "jsonl",
    "csv": "csv",
}


def split_suffix(path: Path) -> tuple[str | None, str | None]:
    """``(format, compression)`` from a file name's extensions (each None if unknown/absent)."""
    suffixes = [s.lower() for s in path.suffixes]
    compression = None
    if suffixes and suffixes[-1] in _COMPRESSIONS:
        compression = _COMPRESSIONS[suffixes.pop()]
    fmt = _EXTENSIONS.get(suffixes[-1]) if suffixes else None
    return fmt, compression


def detect_format(path: str | os.PathLike[str]) -> str | None:
    """The dump format a file name implies (``parquet``, ``jsonl``, ``csv``), or None.

    A compression suffix (``.gz``, ``.bz2``, ``.zst``) after the format's is allowed.
    """
    return split_suffix(Path(path))[0]


def normalize_format(fmt: str | None) -> str | None:
    """The canonical name (:data:`DUMP_FORMATS`) of a format name or alias; None stays None.

    Raises:
        DumpError: an unknown format.
    """
    if fmt is None:
        return None
    canonical = _FORMAT_ALIASES.get(str(fmt).lower())
    if canonical is None:
        raise DumpError(f"unknown dump format {fmt!r}; formats: parquet, jsonl (json), csv")
    return canonical


def part_files(path: Path, fmt: str | None) -> tuple[list[Path], str]:
    """The data files of a dump (one file or a directory of parts, in name order) and their
    format (``fmt``, canonical or None, wins over the names).

    Raises:
        FileNotFoundError: nothing at ``path``.
        DumpError: the format cannot be told, a directory without part files, with
            sub-directories or with part files of several formats.
    """
    if not path.exists():
        raise FileNotFoundError(f"no dump at {path}")
    if path.is_file():
        found = fmt or detect_format(path)
        if found is None:
            raise DumpError(
                f"{path}: cannot tell the dump format from the name; pass fmt "
                "(parquet, jsonl, csv) or use .parquet, .jsonl, .json or .csv"
            )
        return [path], found
    entries = sorted(p for p in path.iterdir() if not p.name.startswith(("_", ".")))
    subdirs = [p.name for p in entries if p.is_dir()]
    if subdirs:
        raise DumpError(
            f"{path}: sub-directories {', '.join(subdirs[:5])} are not supported "
            "(a dump directory holds part files only; partitioned output is not read)"
        )
    if not entries:
        raise DumpError(f"{path}: no part files in the dump directory")
    if fmt is not None:
        return entries, fmt
    formats = {p: detect_format(p) for p in entries}
    unknown = [p.name for p, f in formats.items() if f is None]
    if unknown:
        raise DumpError(
            f"{path}: cannot tell the format of {', '.join(unknown[:5])}; pass fmt explicitly"
        )
    kinds = sorted({f for f in formats.values() if f is not None})
    if len(kinds) > 1:
        raise DumpError(f"{path}: part files of several formats ({', '.join(kinds)})")
    return entries, kinds[0]
