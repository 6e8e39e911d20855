"""Packaging: the single-sourced version, the build the selector reports, and its fallbacks.

The installs themselves (the sdist with the compiler hidden, the repaired wheel) need fresh
venvs and run in ``.ci/run`` through ``scripts/check_packaging.sh``. Here: the version is
written once and is what the installed metadata says; ``delayindex --version`` and every
tracker's ``stats()["build"]`` name the running build; and the selector in a copy of the
package without the extension (an sdist install without a compiler) imports silently and says
"not built", while one with an unloadable extension warns and says why.
"""

from __future__ import annotations

import importlib.machinery
import importlib.metadata
import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

import delayindex
from delayindex import DelayIndex, InMemoryTracker, MemoryStorage, SharedDelayIndex, _impl
from delayindex.cli import main

REPO = Path(__file__).resolve().parents[1]
PACKAGE = Path(delayindex.__file__).resolve().parent


def test_version_is_written_once() -> None:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())
    assert "version" not in project["project"]
    assert project["project"]["dynamic"] == ["version"]
    attr = project["tool"]["setuptools"]["dynamic"]["version"]["attr"]
    assert attr == "delayindex._version.__version__"
    assert importlib.metadata.version("delayindex") == delayindex.__version__
    hits = [p for p in (REPO / "src").rglob("*.py") if '__version__ = "' in p.read_text()]
    assert [p.name for p in hits] == ["_version.py"]


def test_version_option_names_the_build(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["--version"])
    assert exit_info.value.code == 0
    out = " ".join(capsys.readouterr().out.split())  # rich may wrap the line
    assert out == f"delayindex {delayindex.__version__}, {_impl.BUILD}"
    assert _impl.BUILD.startswith("native build" if _impl.NATIVE else "pure-Python build")


def test_every_tracker_reports_its_build() -> None:
    trackers: list[InMemoryTracker | DelayIndex | SharedDelayIndex] = [
        InMemoryTracker(),
        DelayIndex.open(MemoryStorage(), "i"),
        SharedDelayIndex.open(MemoryStorage(), "s"),
    ]
    try:
        for tracker in trackers:
            stats = tracker.stats()
            assert stats["build"] == _impl.BUILD
            assert stats["implementation"] == ("native" if _impl.NATIVE else "pure")
    finally:
        for tracker in trackers:
            tracker.close()


def _import_copy(tmp_path: Path, extension: bytes | None) -> subprocess.CompletedProcess[str]:
    """Import a copy of the package (with ``extension`` as its ``_native`` file, or none)."""
    copy = tmp_path / "delayindex"
    shutil.copytree(PACKAGE, copy, ignore=shutil.ignore_patterns("_native*.so", "__pycache__"))
    if extension is not None:
        suffix = importlib.machinery.EXTENSION_SUFFIXES[0]
        (copy / f"_native{suffix}").write_bytes(extension)
    env = {k: v for k, v in os.environ.items() if k != "DELAYINDEX_NO_EXTENSIONS"}
    env["PYTHONPATH"] = str(tmp_path)
    code = (
        "import warnings, delayindex\n"
        "print(delayindex.NATIVE, delayindex._impl.BUILD, sep='|')\n"
        f"assert delayindex.__file__.startswith({str(tmp_path)!r})\n"
    )
    return subprocess.run(
        [sys.executable, "-W", "always", "-c", code],
        capture_output=True, text=True, env=env, cwd=tmp_path, check=True,
    )  # fmt: skip


def test_an_install_without_the_extension_is_pure_and_silent(tmp_path: Path) -> None:
    result = _import_copy(tmp_path, None)
    assert result.stdout.strip() == (
        "False|pure-Python build (the native extension was not built at install)"
    )
    assert "Warning" not in result.stderr, result.stderr


def test_an_unloadable_extension_warns_and_says_why(tmp_path: Path) -> None:
    result = _import_copy(tmp_path, b"not an ELF file")
    native, build = result.stdout.strip().split("|")
    assert native == "False"
    assert build.startswith("pure-Python build (the native extension failed to import:")
    assert "RuntimeWarning: delayindex native extension unavailable" in result.stderr


def test_the_forcing_switch_is_named(tmp_path: Path) -> None:
    env = dict(os.environ, DELAYINDEX_NO_EXTENSIONS="1")
    result = subprocess.run(
        [sys.executable, "-c", "import delayindex; print(delayindex._impl.BUILD)"],
        capture_output=True, text=True, env=env, check=True,
    )  # fmt: skip
    assert result.stdout.strip() == "pure-Python build (forced by DELAYINDEX_NO_EXTENSIONS)"
