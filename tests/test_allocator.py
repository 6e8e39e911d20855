"""``delayindex.tune_allocator``: glibc's mmap threshold pinned on request, never by the library.

What it buys (resident memory after a 10 M fill) is measured in ``benchmarks/bench_memory.py``
(the ``-tuned`` row); here: its argument checks, that it reaches glibc, and who calls it.
"""

from __future__ import annotations

import ctypes.util
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import delayindex
from delayindex import _memory
from delayindex import cli as cli_module

GLIBC = sys.platform.startswith("linux") and "libc.so.6" in (ctypes.util.find_library("c") or "")


@pytest.mark.parametrize("bad", ["4096", 4096.0, None, True])
def test_rejects_a_non_int(bad: Any) -> None:
    with pytest.raises(TypeError, match="mmap_threshold must be an int"):
        delayindex.tune_allocator(bad)


@pytest.mark.parametrize("bad", [-1, 32 * 1024 * 1024 + 1, 2**63])
def test_rejects_an_out_of_range_threshold(bad: int, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[int, ...]] = []

    def mallopt(*args: int) -> int:
        calls.append(args)
        return 1

    monkeypatch.setattr(_memory, "_mallopt", mallopt)
    with pytest.raises(ValueError, match=r"mmap_threshold must be in \[0, 33554432\]"):
        delayindex.tune_allocator(bad)
    assert calls == []  # nothing reached glibc


def test_passes_the_threshold_to_mallopt(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[int, ...]] = []

    def mallopt(*args: int) -> int:
        calls.append(args)
        return 1

    monkeypatch.setattr(_memory, "_mallopt", mallopt)
    assert delayindex.tune_allocator() is True
    assert delayindex.tune_allocator(0) is True
    assert calls == [(-3, _memory.DEFAULT_MMAP_THRESHOLD), (-3, 0)]  # -3: M_MMAP_THRESHOLD


def test_unsupported_platform_says_false(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_memory, "_mallopt", None)
    assert delayindex.tune_allocator() is False


@pytest.mark.skipif(not GLIBC, reason="mallopt is glibc's")
def test_glibc_accepts_it() -> None:
    assert delayindex.tune_allocator() is True


def test_the_library_does_not_call_it_on_its_own() -> None:
    # A fresh interpreter that imports the package and runs an index: mallopt is never called.
    code = (
        "import delayindex._memory as m\n"
        "calls = []\n"
        "m._mallopt = lambda *a: calls.append(a) or 1\n"
        "import delayindex\n"
        "t = delayindex.InMemoryTracker(clock=delayindex.ManualClock(0))\n"
        "t.add(1, 1, 10)\n"
        "s = delayindex.MemoryStorage()\n"
        "d = delayindex.DelayIndex.open(s, 'x', clock=delayindex.ManualClock(0))\n"
        "d.add(1, 1, 10); d.flush(); d.close()\n"
        "assert calls == [], calls\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def test_the_command_line_calls_it(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    calls: list[int] = []

    def tune_allocator() -> bool:
        calls.append(1)
        return True

    monkeypatch.setattr(cli_module, "tune_allocator", tune_allocator)
    cli_module.main(["inspect", "--store", str(tmp_path), "--json"])
    assert calls == [1]
