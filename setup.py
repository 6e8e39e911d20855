"""Build the native extension ``delayindex._native`` from ``cython/``, or fall back to pure Python.

All metadata lives in ``pyproject.toml``; this file only declares the extension and how its
build may fail. Where the extension cannot be built the install goes on without it and prints
one line saying so. A missing compiler or missing Python headers are found first, by compiling
a one-line probe (so Cython is not run for nothing, and the wheel is a pure ``py3-none-any``
one); a failure compiling the extension itself is caught in ``build_ext``. Every native
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


def _cannot_build(problem: str) -> None:
    """The native extension cannot be built: an error if it is required, else nothing (the
    caller falls back to the pure build and says so)."""
    if REQUIRE:
        raise SystemExit(
            "delayindex: the native extension failed to build and "
            f"DELAYINDEX_REQUIRE_EXTENSIONS is set: {problem}"
        )


_HOW_TO_REQUIRE = "(DELAYINDEX_REQUIRE_EXTENSIONS=1 makes it fail)"


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
        _cannot_build(f"{type(exc).__name__}: {exc}")
        detail = str(exc) if len(str(exc)) <= 160 else str(exc)[:160] + "..."
        _say_pure(f"{type(exc).__name__}: {detail} {_HOW_TO_REQUIRE}")


def _compiler_problem() -> str | None:
    """Why no C compiler can build an extension here (None: one can).

    Compiles a one-line file that includes ``Python.h`` with the compiler and flags setuptools
    would use (``CC`` and friends honoured): a missing compiler or missing Python headers are
    found in milliseconds, before Cython spends ~20 s generating C that nothing can compile.
    """
    import sysconfig
    import tempfile
    from distutils.ccompiler import new_compiler  # setuptools' copy (imported above)
    from distutils.sysconfig import customize_compiler

    try:
        compiler = new_compiler()
        customize_compiler(compiler)
        with tempfile.TemporaryDirectory() as tmp:
            source = os.path.join(tmp, "probe.c")
            with open(source, "w") as handle:
                handle.write("#include <Python.h>\nint delayindex_probe(void) { return 0; }\n")
            compiler.compile(
                [source], output_dir=tmp, include_dirs=[sysconfig.get_paths()["include"]]
            )
    except Exception as exc:  # CompileError, a missing executable, a platform error...
        detail = " ".join(str(exc).split())
        return f"no working C compiler ({type(exc).__name__}: {detail[:120]})"
    return None


#: Why this build is pure-Python, if it is (announced once, by build_py).
PURE_REASON = "DELAYINDEX_NO_EXTENSIONS is set" if SKIP else None


class AnnouncingBuildPy(build_py):
    """``build_py`` that says so when the extension is left out from the start (once per
    build; a failure later, in ``build_ext``, is announced there)."""

    def run(self) -> None:
        if PURE_REASON:
            _say_pure(PURE_REASON if SKIP else f"{PURE_REASON} {_HOW_TO_REQUIRE}")
        super().run()


def _extensions() -> list[Extension]:
    global PURE_REASON
    if SKIP:
        if REQUIRE:
            raise SystemExit(
                "delayindex: DELAYINDEX_NO_EXTENSIONS and "
                "DELAYINDEX_REQUIRE_EXTENSIONS are both set"
            )
        return []
    problem = _compiler_problem()
    if problem:
        _cannot_build(problem)
        PURE_REASON = problem
        return []  # a pure wheel (py3-none-any): nothing in it needs a compiler
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
