"""Write the golden snapshot files that ``tests/test_golden.py`` checks the codec against.

Builds a small, fully deterministic snapshot and writes, for the current object version ``N``
(``delayindex.snapshot.codec.OBJECT_VERSION``) and metadata format version ``F``
(``delayindex.snapshot.format.FORMAT_VERSION``)::

    tests/golden/snapshot-vN-fF.dixs  the encoded object, byte for byte
    tests/golden/snapshot-vN-fF.json  what it holds: ledger range, per segment min/max/count/
                                      ledgers and every (deliver_at, ledger, entry) triple in
                                      segment order

(``snapshot-v1`` is object version 1 with format 1, named before formats were numbered.) The
same object with folded cancels is ``snapshot-vN-fF-folded`` (formats 4 and later carry them or
not); before format 4 it was a format of its own, ``snapshot-v1-f3``.

The snapshot: the delayed messages of ``generate(600, seed=42, entries_per_ledger=100)`` (the
realistic mix, about 300 indexes over 6 ledgers) plus one extra ledger whose 100 consecutive
entries are all due at the same time (run containers), cut with ``max_time_step_ms=300_000``
and ``max_indexes_per_segment=64``, in the explicit ledger range ``[1, extra ledger + 3]``.

Golden files are never rewritten: if the format changes deliberately, bump the version and add
new files next to the old ones. The script therefore refuses to replace an existing file with
different content (``--force`` overrides, for a file that was never released).

Usage (from any working directory; uses this checkout's ``src/``)::

    python scripts/make_golden.py [--force]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import sys
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent.parent
GOLDEN_DIR = REPO_ROOT / "tests" / "golden"
if __name__ == "__main__":  # run as a script: this checkout's code (tests import the module)
    sys.path.insert(0, str(REPO_ROOT / "src"))

import numpy as np  # noqa: E402

from delayindex._cancelset import pack_cancelled  # noqa: E402
from delayindex.snapshot.codec import OBJECT_VERSION, encode_snapshot  # noqa: E402
from delayindex.snapshot.format import (  # noqa: E402
    FORMAT_VERSION,
    build_snapshot,
)
from delayindex.workload import generate  # noqa: E402

SEED = 42
N_MESSAGES = 600
ENTRIES_PER_LEDGER = 100
MAX_TIME_STEP_MS = 300_000
MAX_INDEXES_PER_SEGMENT = 64
RUN_LENGTH = 100
RUN_DELAY_MS = 90_000  # the run ledger's entries are due 90 s after the workload starts


#: The current files' name, without suffix (see the module docstring).
STEM = f"snapshot-v{OBJECT_VERSION}" + ("" if FORMAT_VERSION == 1 else f"-f{FORMAT_VERSION}")
#: The same object with folded cancels (what a merge writes when its range had cancels).
FOLDED_STEM = f"{STEM}-folded"


def build(folded: bool = False) -> tuple[bytes, dict[str, Any]]:
    """The golden object and its JSON description (deterministic); with ``folded``, the
    object carries folded cancels."""
    w = generate(N_MESSAGES, seed=SEED, entries_per_ledger=ENTRIES_PER_LEDGER)
    mask = w.delayed_mask
    run_ledger = int(w.ledger_ids[-1]) + 1
    times = np.concatenate(
        [w.deliver_at[mask], np.full(RUN_LENGTH, int(w.publish_ms[0]) + RUN_DELAY_MS)]
    )
    ledgers = np.concatenate([w.ledger_ids[mask], np.full(RUN_LENGTH, run_ledger)])
    entries = np.concatenate([w.entry_ids[mask], np.arange(RUN_LENGTH)])
    start_ledger, end_ledger = int(w.ledger_ids[0]), run_ledger + 3
    metadata, segments = build_snapshot(
        times,
        ledgers,
        entries,
        max_time_step_ms=MAX_TIME_STEP_MS,
        max_indexes_per_segment=MAX_INDEXES_PER_SEGMENT,
        start_ledger=start_ledger,
        end_ledger=end_ledger,
    )
    cancels: list[list[int]] = []
    if folded:
        # A few positions of two ledgers, one past the tracked ones, and a large entry id.
        cancels = [[start_ledger, 7], [start_ledger, 2**31 + 5]]
        cancels += [[run_ledger + 1, entry] for entry in range(0, 40, 3)]
        column = np.array(cancels, dtype=np.int64)
        metadata = metadata.with_folded(pack_cancelled(column[:, 0], column[:, 1]))
    data = encode_snapshot(metadata, segments)
    description: dict[str, Any] = {
        "object_version": OBJECT_VERSION,
        "format_version": metadata.format_version,
        "generator": "scripts/make_golden.py",
        "params": {
            "seed": SEED,
            "n_messages": N_MESSAGES,
            "entries_per_ledger": ENTRIES_PER_LEDGER,
            "max_time_step_ms": MAX_TIME_STEP_MS,
            "max_indexes_per_segment": MAX_INDEXES_PER_SEGMENT,
            "run_ledger": run_ledger,
            "run_length": RUN_LENGTH,
        },
        "sha256": hashlib.sha256(data).hexdigest(),
        "size": len(data),
        "start_ledger": metadata.start_ledger,
        "end_ledger": metadata.end_ledger,
        "num_messages": metadata.num_messages,
        "segments": [
            {
                "number": number,
                "min_deliver_at": meta.min_deliver_at,
                "max_deliver_at": meta.max_deliver_at,
                "count": meta.count,
                "ledgers": list(meta.ledgers),
                "triples": [list(t) for t in segment.triples()],
            }
            for number, (meta, segment) in enumerate(
                zip(metadata.segments, segments, strict=True), 1
            )
        ],
    }
    if folded:
        description["folded_cancels"] = cancels
    return data, description


def to_json(description: dict[str, Any]) -> str:
    """Indented JSON with every list of numbers on one line (one triple per line)."""
    text = json.dumps(description, indent=2)

    def collapse(match: re.Match[str]) -> str:
        return "[" + re.sub(r",\s+", ", ", match.group(1)) + "]"

    return re.sub(r"\[\s+(-?\d+(?:,\s+-?\d+)*)\s+\]", collapse, text) + "\n"


def _write(path: Path, content: bytes, force: bool) -> bool:
    if path.exists():
        if path.read_bytes() == content:
            print(f"unchanged {path.relative_to(REPO_ROOT)}")
            return True
        if not force:
            print(
                f"make_golden: {path.relative_to(REPO_ROOT)} exists with different content; "
                "golden files are never rewritten (bump the version and add a new file, or "
                "pass --force for a file that was never released)",
                file=sys.stderr,
            )
            return False
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(content)
    print(f"wrote {path.relative_to(REPO_ROOT)} ({len(content)} bytes)")
    return True


def main(argv: list[str] | None = None) -> int:
    """Build and write the golden files; return the exit code."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--force", action="store_true", help="replace differing files")
    args = parser.parse_args(argv)
    ok = True
    for name, folded in ((STEM, False), (FOLDED_STEM, True)):
        data, description = build(folded)
        stem = GOLDEN_DIR / name
        ok = _write(stem.with_suffix(".dixs"), data, args.force) and ok
        ok = _write(stem.with_suffix(".json"), to_json(description).encode(), args.force) and ok
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
