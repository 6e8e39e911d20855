"""Smoke-test an installed delayindex: ``python smoke_install.py native|pure``.

Run from outside the source tree (so the installed package is the one imported). Checks that
the package imports without a warning; that the build is the expected one, in
``delayindex.NATIVE``, ``stats()["build"]`` and ``delayindex --version``; that the installed
version is the package's; and that the three trackers work end to end: adds, a cancel, a poll
of what is due, a durable DelayIndex closed and reopened from a FileStorage, and a
SharedDelayIndex with two subscriptions. Exits non-zero with the failing check on any mismatch.
"""

from __future__ import annotations

import importlib.metadata
import shutil
import subprocess
import sys
import tempfile
import warnings
from pathlib import Path


def main(expected: str) -> None:
    """Run every check; ``expected`` is ``native`` or ``pure``."""
    warnings.simplefilter("error")  # an install without the extension must import silently
    import delayindex
    from delayindex import (
        DelayIndex,
        FileStorage,
        InMemoryTracker,
        ManualClock,
        Position,
        SharedDelayIndex,
        TrackerConfig,
    )

    source = Path(delayindex.__file__).resolve()
    assert "site-packages" in source.parts, f"imported from the source tree: {source}"
    assert delayindex.NATIVE is (expected == "native"), f"NATIVE={delayindex.NATIVE}"
    assert importlib.metadata.version("delayindex") == delayindex.__version__

    clock = ManualClock(1_000)
    tracker = InMemoryTracker(clock=clock)
    for entry, due in enumerate([50_000, 20_000, 30_000, 40_000]):
        assert tracker.add(1, entry, due)
    assert tracker.cancel(1, 3)
    clock.set(100_000)
    assert sorted(tracker.poll(10)) == [Position(1, 0), Position(1, 1), Position(1, 2)]
    build = tracker.stats()["build"]
    assert build == delayindex._impl.BUILD and build.startswith(expected), build
    if expected == "pure":
        assert "not built" in build, build  # not forced, not a broken extension

    root = Path(tempfile.mkdtemp(prefix="delayindex-smoke-"))
    try:
        config = TrackerConfig(min_index_count_per_bucket=500)  # each ledger seals a bucket
        index = DelayIndex.open(FileStorage(root), "smoke", config, clock=ManualClock(0))
        for ledger in range(3):
            index.add_many([ledger] * 1000, list(range(1000)), [60_000 + e for e in range(1000)])
        index.flush()
        index.close()
        clock2 = ManualClock(0)
        index = DelayIndex.open(FileStorage(root), "smoke", config, clock=clock2)
        assert index.stats()["durable_buckets"] >= 2, index.stats()["durable_buckets"]
        assert len(index) >= 2000 and index.contains(1, 999), len(index)
        assert index.stats()["build"] == build
        clock2.set(70_000)
        drained = []
        while batch := index.poll(1000):
            drained.extend(batch)
        assert len(drained) == len(set(drained)) >= 2000, len(drained)
        index.close()

        shared_clock = ManualClock(0)
        shared = SharedDelayIndex.open(FileStorage(root / "shared"), "topic", clock=shared_clock)
        subs = [shared.subscribe(name) for name in ("a", "b")]
        shared.add(7, 0, 60_000)
        shared_clock.set(60_000)
        assert all(sub.poll(10) == [Position(7, 0)] for sub in subs)
        shared.close()
    finally:
        shutil.rmtree(root, ignore_errors=True)

    cli = Path(sys.executable).parent / "delayindex"  # the venv's script, PATH or not
    assert cli.exists(), f"the delayindex console script is not installed: {cli}"
    version = subprocess.run([cli, "--version"], capture_output=True, text=True, check=True)
    assert expected in version.stdout and delayindex.__version__ in version.stdout, version.stdout
    print(f"smoke test passed: {version.stdout.strip()}")


if __name__ == "__main__":
    if len(sys.argv) != 2 or sys.argv[1] not in ("native", "pure"):
        sys.exit("usage: smoke_install.py native|pure")
    main(sys.argv[1])
