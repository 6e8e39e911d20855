"""Packaging and implementation-selection checks.

* the package (and its native extension) is imported from where it is installed, not from the
  tests tree;
* ``delayindex._impl`` selects the native twins unless ``DELAYINDEX_NO_EXTENSIONS`` forces pure;
* typing markers (``py.typed``, ``_native.pyi``) ship next to the package;
* the public surface resolves, and the native and pure twins expose the same names.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import delayindex
from delayindex import _impl

PACKAGE_DIR = Path(delayindex.__file__).resolve().parent
TESTS_DIR = Path(__file__).resolve().parent
ENV_SWITCH = "DELAYINDEX_NO_EXTENSIONS"


def _native() -> Any:
    module = _impl.native_module_or_none()
    assert module is not None, "the native extension delayindex._native is not built"
    return module


def _forced_pure(value: str | None) -> bool:
    return value not in (None, "", "0")


def _public(obj: Any) -> set[str]:
    names = {name for name in dir(obj) if not name.startswith("_")}
    if "_check" in dir(obj):
        names.add("_check")
    return names


# --- where the package comes from --------------------------------------------------------------


def test_package_imports_from_its_installed_location() -> None:
    assert delayindex.__spec__ is not None
    assert delayindex.__spec__.origin is not None
    assert Path(delayindex.__spec__.origin).resolve() == PACKAGE_DIR / "__init__.py"
    assert PACKAGE_DIR.name == "delayindex"
    # Found through sys.path (site-packages, an editable install or PYTHONPATH), not through
    # the tests directory.
    search_roots = {Path(p or os.getcwd()).resolve() for p in sys.path}
    if PACKAGE_DIR.parent not in search_roots:
        # An editable install mapped by an import hook: it must then be a real distribution.
        dist = importlib.metadata.distribution("delayindex")
        assert dist.version == delayindex.__version__
    assert TESTS_DIR not in PACKAGE_DIR.parents
    assert PACKAGE_DIR != TESTS_DIR


def test_submodules_and_extension_come_from_the_same_package() -> None:
    native = _native()
    assert native.__name__ == "delayindex._native"
    assert native.__file__ is not None
    native_path = Path(native.__file__).resolve()
    assert native_path.parent == PACKAGE_DIR
    assert native_path.suffix in {".so", ".pyd"}
    for name in ("delayindex._impl", "delayindex.config", "delayindex.clock", "delayindex._pure"):
        module = importlib.import_module(name)
        assert module.__file__ is not None
        path = Path(module.__file__).resolve()
        assert PACKAGE_DIR in path.parents, (name, path)


# --- implementation selection ------------------------------------------------------------------


def test_native_selected_unless_switched_off() -> None:
    forced = _forced_pure(os.environ.get(ENV_SWITCH))
    assert delayindex.NATIVE is _impl.NATIVE
    assert delayindex.wall_clock_ms is _impl.wall_clock_ms
    if forced:
        assert _impl.NATIVE is False
        assert _impl.TripleHeap is _impl.PureTripleHeap
        assert _impl.TrackerCore is _impl.PureTrackerCore
        assert _impl.wall_clock_ms is _impl.pure_wall_clock_ms
    else:
        native = _native()
        assert _impl.NATIVE is True
        assert _impl.TripleHeap is native.TripleHeap
        assert _impl.TrackerCore is native.TrackerCore
        assert _impl.wall_clock_ms is native.wall_clock_ms
        assert _impl.TripleHeap is not _impl.PureTripleHeap


_PROBE = """
import json
from delayindex import _impl
import delayindex
print(json.dumps({
    "NATIVE": _impl.NATIVE,
    "public_NATIVE": delayindex.NATIVE,
    "heap": _impl.TripleHeap.__module__,
    "core": _impl.TrackerCore.__module__,
    "heap_is_pure": _impl.TripleHeap is _impl.PureTripleHeap,
    "core_is_pure": _impl.TrackerCore is _impl.PureTrackerCore,
    "clock_is_pure": _impl.wall_clock_ms is _impl.pure_wall_clock_ms,
    "native_built": _impl.native_module_or_none() is not None,
}))
"""


@pytest.mark.parametrize(
    ("value", "forced"),
    [(None, False), ("", False), ("0", False), ("1", True), ("yes", True), ("false", True)],
)
def test_env_switch_in_a_fresh_interpreter(value: str | None, forced: bool) -> None:
    assert _forced_pure(value) is forced
    env = dict(os.environ)
    env.pop(ENV_SWITCH, None)
    if value is not None:
        env[ENV_SWITCH] = value
    env["PYTHONPATH"] = os.pathsep.join(
        [str(PACKAGE_DIR.parent), *filter(None, [os.environ.get("PYTHONPATH")])]
    )
    result = subprocess.run(
        [sys.executable, "-W", "error", "-c", _PROBE],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    probe = json.loads(result.stdout)
    # The native extension is built whatever the switch says.
    assert probe["native_built"] is True
    assert probe["NATIVE"] is (not forced)
    assert probe["public_NATIVE"] is (not forced)
    assert probe["heap_is_pure"] is forced
    assert probe["core_is_pure"] is forced
    assert probe["clock_is_pure"] is forced
    if forced:
        assert probe["heap"] == "delayindex._pure.heap"
        assert probe["core"] == "delayindex._pure.core"
    else:
        assert probe["heap"] == probe["core"] == "delayindex._native"


def test_native_types_live_in_the_extension_module() -> None:
    native = _native()
    assert type(native.TripleHeap()).__module__ == "delayindex._native"
    assert type(native.TrackerCore(1000, False, 0)).__module__ == "delayindex._native"
    assert native.TripleHeap.__module__ == "delayindex._native"
    assert type(_impl.PureTripleHeap()).__module__ != "delayindex._native"


# --- shipped files -----------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["py.typed", "_native.pyi"])
def test_typing_files_sit_next_to_the_package(name: str) -> None:
    path = PACKAGE_DIR / name
    assert path.is_file(), f"{path} is missing"
    assert path.parent == Path(delayindex.__file__).resolve().parent


def test_native_stub_names_the_public_classes() -> None:
    stub = PACKAGE_DIR / "_native.pyi"
    assert stub.is_file(), f"{stub} is missing"
    text = stub.read_text(encoding="utf-8")
    for name in ("TripleHeap", "TrackerCore", "wall_clock_ms"):
        assert name in text, f"{name} not declared in {stub}"


# --- public surface ----------------------------------------------------------------------------


def test_all_names_resolve() -> None:
    assert delayindex.__all__
    assert len(set(delayindex.__all__)) == len(delayindex.__all__)
    for name in delayindex.__all__:
        assert hasattr(delayindex, name), name
        assert getattr(delayindex, name) is not None, name
    assert isinstance(delayindex.__version__, str)
    for name in _impl.__all__:
        assert hasattr(_impl, name), name


def test_native_public_names_exist_in_the_pure_world() -> None:
    native = _native()
    pairs = {
        "TripleHeap": "PureTripleHeap",
        "TrackerCore": "PureTrackerCore",
        "BucketCore": "PureBucketCore",
        "LedgerIndex": "PureLedgerIndex",
        "Front": "PureFront",
        "SharedFront": "PureSharedFront",
        "SubFront": "PureSubFront",
        "Lock": "PureLock",
        "BinIndex": "PureBinIndex",
        "wall_clock_ms": "pure_wall_clock_ms",
        "sorted_positions": "pure_sorted_positions",
    }
    for native_name, pure_name in pairs.items():
        assert callable(getattr(native, native_name))
        assert callable(getattr(_impl, pure_name))
    # Every class or function the extension defines itself has a pure twin.
    defined_here = {
        name
        for name in dir(native)
        if not name.startswith("_")
        and getattr(getattr(native, name), "__module__", None) == "delayindex._native"
    }
    from delayindex._pure import codec as pure_codec

    for kernel in _impl.CODEC_KERNELS:
        assert callable(getattr(native, kernel)), kernel
        assert callable(getattr(pure_codec, kernel)), kernel
    assert defined_here == set(pairs) | set(_impl.CODEC_KERNELS)


def test_triple_heap_twins_have_the_same_methods() -> None:
    native = _native()
    native_cls, pure_cls = native.TripleHeap, _impl.PureTripleHeap
    assert _public(native_cls) == _public(pure_cls)
    assert _public(native_cls()) == _public(pure_cls())
    assert {"push", "push_many", "peek", "pop", "pop_due", "remove", "clear", "nbytes"} <= (
        _public(native_cls)
    )
    assert "_check" in _public(native_cls)


def test_tracker_core_twins_have_the_same_methods() -> None:
    native = _native()
    native_cls, pure_cls = native.TrackerCore, _impl.PureTrackerCore
    native_obj, pure_obj = native_cls(1000, False, 0), pure_cls(1000, False, 0)
    # Methods and properties defined on the class...
    native_methods = {n for n in _public(native_cls) if callable(getattr(native_cls, n))}
    pure_methods = {n for n in _public(pure_cls) if callable(getattr(pure_cls, n))}
    assert native_methods == pure_methods
    assert "_check" in native_methods
    # ...and everything reachable on an instance (attributes included).
    assert _public(native_obj) == _public(pure_obj)


def test_bucket_core_twins_have_the_same_methods() -> None:
    native = _native()
    native_cls, pure_cls = native.BucketCore, _impl.PureBucketCore
    native_methods = {n for n in _public(native_cls) if callable(getattr(native_cls, n))}
    pure_methods = {n for n in _public(pure_cls) if callable(getattr(pure_cls, n))}
    assert native_methods == pure_methods
    assert {"add", "add_many", "seal", "set_source", "poll", "_check"} <= native_methods
    assert _public(native_cls(1000, False, 0, 5)) == _public(pure_cls(1000, False, 0, 5))


def test_ledger_index_twins_have_the_same_methods() -> None:
    native = _native()
    native_cls, pure_cls = native.LedgerIndex, _impl.PureLedgerIndex
    assert _public(native_cls) == _public(pure_cls)
    assert _public(native_cls()) == _public(pure_cls())
    assert {"add", "discard", "contains", "restore", "remove_upto", "_check"} <= _public(native_cls)
