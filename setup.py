"""Build the native extension ``delayindex._native`` from ``cython/``.

All metadata lives in ``pyproject.toml``; this file only declares the extension. Switches:

* ``DELAYINDEX_DEBUG=1``: ``-O0 -g``, Cython line tracing and bounds checks, annotated HTML.
* ``DELAYINDEX_SANITIZE=1``: build with AddressSanitizer and UBSan (run with ``LD_PRELOAD``).
"""

from __future__ import annotations

import os

from Cython.Build import cythonize
from setuptools import Extension, setup

DEBUG = os.environ.get("DELAYINDEX_DEBUG") == "1"
SANITIZE = os.environ.get("DELAYINDEX_SANITIZE") == "1"

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

extensions = [
    Extension(
        "delayindex._native",
        ["cython/delayindex/_native.pyx"],
        extra_compile_args=compile_args,
        extra_link_args=link_args,
        define_macros=[("CYTHON_TRACE_NOGIL", "1")] if DEBUG else [],
    )
]

setup(
    ext_modules=cythonize(
        extensions,
        include_path=["cython"],
        build_dir="build/cython",
        compiler_directives=directives,
        annotate=DEBUG,
    )
)
