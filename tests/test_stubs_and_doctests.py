"""The native stub lists every name the extension exports, and docstring examples run."""

from __future__ import annotations

import ast
import doctest
import importlib
import pkgutil
from pathlib import Path

import pytest

import delayindex

STUB = Path(delayindex.__file__).with_name("_native.pyi")


def _stub_names() -> set[str]:
    names: set[str] = set()
    for node in ast.parse(STUB.read_text()).body:
        if isinstance(node, ast.FunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
    return names


def test_native_stub_names_every_export() -> None:
    native = pytest.importorskip("delayindex._native")  # absent only in a pure-only install
    imported = {"BitMap", "Position", "SortedDict", "np", "sys"}  # the extension's own imports
    exported = {n for n in dir(native) if not n.startswith("_")} - imported
    assert exported - _stub_names() == set(), "names the stub misses"
    assert {n for n in _stub_names() if not n.startswith("_")} - exported == set()


def _modules() -> list[str]:
    skip = ("delayindex.spark", "delayindex.pb", "delayindex.__main__", "delayindex._native")
    return sorted(
        m.name
        for m in pkgutil.walk_packages(delayindex.__path__, "delayindex.")
        if not m.name.startswith(skip)
    )


@pytest.mark.parametrize("name", _modules())
def test_docstring_examples_run(name: str) -> None:
    module = importlib.import_module(name)
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    assert result.failed == 0, f"{result.failed} docstring example(s) failed in {name}"


def test_both_cores_return_the_named_add_results() -> None:
    """The drivers compare ``add`` results with delayindex.model's names; both twins agree."""
    from delayindex import _impl
    from delayindex._pure.bucket import BucketCore as PureBucketCore
    from delayindex.model import (
        ADD_ACKED,
        ADD_DELIVER,
        ADD_DUPLICATE,
        ADD_SEAL_FIRST,
        ADD_TRACKED,
    )

    for cls in {_impl.BucketCore, PureBucketCore}:
        core = cls(0, True, 0, 1)
        assert core.add(1, 0, 100, 0) == ADD_TRACKED
        assert core.add(1, 0, 100, 0) == ADD_DUPLICATE
        assert core.add(1, 1, -1, 0) == ADD_DELIVER
        assert core.add(2, 0, 100, 0) == ADD_SEAL_FIRST  # the mutable bucket is full
        core.untrack_upto(1, 5)
        assert core.add(1, 2, 100, 0) == ADD_ACKED
