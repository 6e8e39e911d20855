"""The shared rules of ``delayindex.policy`` agree with every copy of them.

The native cores keep inline C copies of the cutoff and sealing rules for speed; these tests pin
them to the one pure definition (on both builds: the native classes come from
``_impl.native_module_or_none``, whatever ``DELAYINDEX_NO_EXTENSIONS`` says).
"""

from __future__ import annotations

import ast
import itertools
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

import delayindex
from delayindex import TrackerConfig, _impl
from delayindex.policy import INT64_MAX, bucket_is_full, cutoff_ms, plan_ranges
from delayindex.rebuild import cutoff_for

INT64_MIN = -(2**63)
NOWS = [INT64_MIN, INT64_MIN + 1, -(2**62), -1, 0, 1, 1_700_000_000_000, 2**62,
        INT64_MAX - 1001, INT64_MAX - 1000, INT64_MAX - 999, INT64_MAX - 1, INT64_MAX]  # fmt: skip
TICKS = [0, 1, 999, 1000, 1001, 2**62 - 1, INT64_MAX - 1, INT64_MAX]


def _cores(module: Any) -> list[Any]:
    """A TrackerCore and a BucketCore of ``module`` for every tick and strictness."""
    cores = []
    for tick, strict in itertools.product(TICKS, (False, True)):
        cores.append(module.TrackerCore(tick, strict, 0))
        cores.append(module.BucketCore(tick, strict, 0, 1))
    return cores


def _check_cutoffs(cores: list[Any]) -> None:
    for core in cores:
        for now in NOWS:
            expected = cutoff_ms(now, core.tick_ms, bool(core.strict))
            assert core.cutoff_for(now) == expected, (type(core), core.tick_ms, core.strict, now)


def test_native_cores_cutoff_is_the_policy_cutoff() -> None:
    native = _impl.native_module_or_none()
    if native is None:
        pytest.skip("the native extension is not built (pure-only install): no C copy to check")
    _check_cutoffs(_cores(native))


def test_pure_cores_cutoff_is_the_policy_cutoff() -> None:
    pure = type("Pure", (), {"TrackerCore": _impl.PureTrackerCore,
                             "BucketCore": _impl.PureBucketCore})  # fmt: skip
    _check_cutoffs(_cores(pure))


def test_cutoff_edges() -> None:
    assert cutoff_ms(INT64_MAX, 0, False) == INT64_MAX
    assert cutoff_ms(INT64_MAX - 5, 10, False) == INT64_MAX  # saturates, never wraps
    assert cutoff_ms(INT64_MIN, INT64_MAX, False) == -1
    assert cutoff_ms(INT64_MAX - 5, 10, True) == INT64_MAX - 5


def test_rebuild_cutoff_is_the_policy_cutoff() -> None:
    for tick, strict, now in itertools.product([0, 1000, 2**62 - 1], (False, True), NOWS):
        config = TrackerConfig(tick_ms=tick, strict=strict)
        assert cutoff_for(now, config) == cutoff_ms(now, tick, strict)


def _online_sealing(ledgers: list[int], counts: list[int], minimum: int) -> list[tuple[int, int]]:
    """The online rule step by step: before a newer ledger's first tracked add, ask the
    predicate; the last bucket is sealed too."""
    ranges: list[tuple[int, int]] = []
    start, end, held = -1, -1, 0
    for ledger, count in zip(ledgers, counts, strict=True):
        if not count:
            continue
        if held and bucket_is_full(held, minimum):
            ranges.append((start, end))
            start, held = -1, 0
        if start < 0:
            start = ledger
        end, held = ledger, held + count
    if held:
        ranges.append((start, end))
    return ranges


@given(
    st.lists(st.tuples(st.integers(1, 5), st.integers(0, 9)), max_size=40),
    st.integers(1, 20),
    st.integers(0, 6),
)
def test_plan_ranges_is_the_online_predicate_in_ledger_order(
    steps: list[tuple[int, int]], minimum: int, limit: int
) -> None:
    ledgers = list(itertools.accumulate(gap for gap, _ in steps))
    counts = [count for _, count in steps]
    plan = plan_ranges(ledgers, counts, minimum, 0)
    assert plan.ranges == _online_sealing(ledgers, counts, minimum)
    assert plan.sealed == len(plan.ranges) and sum(plan.counts) == sum(counts)
    merged = plan_ranges(ledgers, counts, minimum, limit)
    assert merged.sealed == plan.sealed and sum(merged.counts) == sum(counts)
    if 0 < limit < plan.sealed:
        assert len(merged.ranges) <= limit  # a window of up to four may overshoot the bound
    else:
        assert merged == plan
    # Each merged range is a run of adjacent sealed ones, all of them covered, in order.
    k = 0
    for (start, end), count in zip(merged.ranges, merged.counts, strict=True):
        j = k
        while j < len(plan.ranges) and plan.ranges[j][1] <= end:
            j += 1
        assert j > k and plan.ranges[k][0] == start and plan.ranges[j - 1][1] == end
        assert count == sum(plan.counts[k:j])
        k = j
    assert k == len(plan.ranges)


# -- layering --------------------------------------------------------------------------------------

PACKAGE = Path(delayindex.__file__).parent


def _imports(path: Path, *, runtime_only: bool) -> set[str]:
    """Modules ``path`` imports (``from x import y`` counts as ``x``); with ``runtime_only``,
    not those under ``if TYPE_CHECKING:``."""
    tree = ast.parse(path.read_text())
    skipped: set[int] = set()
    if runtime_only:
        for node in ast.walk(tree):
            if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
                skipped.update(id(n) for stmt in node.body for n in ast.walk(stmt))
    found: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found.add(node.module)
    return found


def test_policy_imports_only_the_standard_library_at_run_time() -> None:
    modules = _imports(PACKAGE / "policy.py", runtime_only=True)
    assert {m.split(".")[0] for m in modules} <= {*sys.stdlib_module_names, "__future__"}


def test_offline_tools_and_lower_layers_never_import_the_tracker() -> None:
    files = [
        PACKAGE / n for n in ("policy.py", "config.py", "_browse.py", "storeinfo.py", "schedule.py")
    ]
    for package in ("rebuild", "spark", "dump", "snapshot"):
        files.extend((PACKAGE / package).rglob("*.py"))
    assert len(files) > 10
    for path in files:
        bad = {m for m in _imports(path, runtime_only=False) if m.startswith("delayindex.tracker")}
        assert not bad, f"{path.relative_to(PACKAGE)} imports {bad}"
