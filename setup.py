"""Build the native extension ``delayindex._native`` from ``cython/``, or fall back to pure Python.

All metadata lives in ``pyproject.toml``; this file only declares the extension and how its
build may fail. Where the extension cannot be built (no C compiler, no Python headers, a
compiler error) the install goes on without it and prints one line saying so: every native
structure has a pure-Python twin, which ``delayindex._impl`` selects when the extension is
absent (``delayindex --version`` and ``stats()["build"]`` tell which build runs). This is the
fallback propcache, frozenlist and msgspec use. Switches (environment variables):

* ``DELAYINDEX_REQUIRE_EXTENSIONS=1``: a failed native build is an error (for those who need
  the speed and would rather the install failed than ran slowly).
* ``DELAYINDEX_NO_EXTENSIONS=1``: do not even try; install the pure build (the same switch
  forces the pure twins at run time).
* ``DELAYINDEX_DEBUG=1``: ``-O0 -g``, Cython line tracing and bounds checks, annotated HTML.
* ``DELAYINDEX_SANITIZE=1``: build with AddressSanitizer and UBSan (run with ``LD_PRELOAD``).
"""

from __future__ import annotations

import os
import sys
from typing import Any

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext
from setuptools.command.build_py import build_py


def _switch(name: str) -> bool:
    return os.environ.get(name, "") not in ("", "0")


DEBUG = _switch("DELAYINDEX_DEBUG")
SANITIZE = _switch("DELAYINDEX_SANITIZE")
REQUIRE = _switch("DELAYINDEX_REQUIRE_EXTENSIONS")
SKIP = _switch("DELAYINDEX_NO_EXTENSIONS")

compile_args = (
    ["-O0", "-g"] if DEBUG else ["-O3", "-g0", "-fno-if-conversion", "-fno-if-conversion2"]
)
link_args: list[str] = []
if SANITIZE:
    compile_args += ["-fsanitize=address,undefined", "-fno-omit-frame-pointer"]
    link_args += ["-fsanitize=address,undefined"]

directives = {
    "language_level": 3,
    "embedsignature": True,
    "boundscheck": DEBUG,
    "wraparound": False,
    "initializedcheck": DEBUG,
    "cdivision": True,
    "linetrace": DEBUG,
}


def _say_pure(reason: str) -> None:
    # One line, on stderr (pip shows it with -v, and in its log on failure).
    print(
        f"delayindex: building the pure-Python build without the native extension: {reason}",
        file=sys.stderr,
    )


class OptionalBuildExt(build_ext):
    """``build_ext`` whose failure leaves a working pure-Python install unless it is required."""

    def run(self) -> None:
        try:
            super().run()
        except Exception as exc:  # compiler missing/unusable: setuptools raises several kinds
            self._fail(exc)

    def build_extension(self, ext: Any) -> None:
        try:
            super().build_extension(ext)
        except Exception as exc:
            self._fail(exc)

    def _fail(self, exc: BaseException) -> None:
        if REQUIRE:
            raise SystemExit(
                f"delayindex: the native extension failed to build and "
                f"DELAYINDEX_REQUIRE_EXTENSIONS is set: {type(exc).__name__}: {exc}"
            ) from exc
        detail = str(exc) if len(str(exc)) <= 160 else str(exc)[:160] + "..."
        _say_pure(f"{type(exc).__name__}: {detail} (DELAYINDEX_REQUIRE_EXTENSIONS=1 makes it fail)")


class AnnouncingBuildPy(build_py):
    """``build_py`` that says so when the extension is skipped on purpose (once per build)."""

    def run(self) -> None:
        if SKIP:
            _say_pure("DELAYINDEX_NO_EXTENSIONS is set")
        super().run()


def _extensions() -> list[Extension]:
    if SKIP:
        if REQUIRE:
            raise SystemExit(
                "delayindex: DELAYINDEX_NO_EXTENSIONS and "
                "DELAYINDEX_REQUIRE_EXTENSIONS are both set"
            )
        return []
    from Cython.Build import cythonize  # a build requirement; only needed for the native build

    extension = Extension(
        "delayindex._native",
        ["cython/delayindex/_native.pyx"],
        extra_compile_args=compile_args,
        extra_link_args=link_args,
        define_macros=[("CYTHON_TRACE_NOGIL", "1")] if DEBUG else [],
    )
    return list(
        cythonize(
            [extension],
            include_path=["cython"],
            build_dir="build/cython",
            compiler_directives=directives,
            annotate=DEBUG,
        )
    )


setup(
    ext_modules=_extensions(),
    cmdclass={"build_ext": OptionalBuildExt, "build_py": AnnouncingBuildPy},
)
