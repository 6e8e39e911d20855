"""Damage campaign: every byte of every file kind of a FileStorage store, damaged in turn.

A template store holds one index of three sealed buckets (several segments each); a second
holds a merged bucket whose snapshot carries folded cancels (metadata format 3), where an
undamaged outcome must also still refuse the replay of the cancelled positions. For each
damage (a single-bit flip at every byte of the manifest and of one snapshot object, which
covers its header, metadata entry, first and later segments; truncations; zero-fill; deletion)
a fresh copy is damaged, opened on a clock before anything is due, and drained on a far clock.

Allowed outcomes only:

(a) exact delivery of every durable position;
(b) the damaged bucket quarantined and reported, every other position delivered exactly once
    and never early, nothing twice, the quarantined positions still counted or their range
    reported;
(c) ``RecoveryError`` naming the file, only where no consistent state can be proven.

Never a stall of undamaged buckets, never a silently empty or shrunken index, never an
exception that is not a ``DelayIndexError``, never a deleted damaged file.
"""

from __future__ import annotations

import dataclasses
import shutil
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from delayindex import (
    DelayIndex,
    DelayIndexError,
    FileStorage,
    ManualClock,
    Position,
    RecoveryError,
    TrackerConfig,
)
from delayindex.executors import InlineExecutor
from delayindex.snapshot.codec import header_bytes_needed, read_header

T0 = 1_000_000
NAME = "campaign"
TICK = 10
FAR = T0 + 10**9
CONFIG = TrackerConfig(
    min_index_count_per_bucket=8,
    max_indexes_per_segment=3,
    max_time_step_per_segment_ms=1000,
    max_num_buckets=0,
    tick_ms=TICK,
)


#: The folded store: a merge of ledgers 1..4 folded three cancels into its snapshot (format 3).
FOLD_CONFIG = dataclasses.replace(CONFIG, max_num_buckets=2)
CANCELLED = (Position(1, 1), Position(1, 6), Position(2, 3))


@dataclass(frozen=True)
class Template:
    root: Path
    schedule: dict[Position, int]  # the durable positions (the mutable bucket's is lost)
    manifest: Path
    victim: Path  # the snapshot object of the middle bucket, or of the folded one
    victim_range: tuple[int, int]
    entry_spans: tuple[tuple[int, int], ...]  # byte range of each entry of the victim
    config: TrackerConfig
    cancelled: tuple[Position, ...]  # folded into the victim: a replay must stay refused


def _at(ledger: int, entry: int) -> int:
    return T0 + 5_000 + ledger * 11 + entry * 700


@pytest.fixture(scope="module", params=["plain", "folded"])
def template(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Template:
    folded = request.param == "folded"
    config = FOLD_CONFIG if folded else CONFIG
    root = tmp_path_factory.mktemp("campaign") / "store"
    schedule: dict[Position, int] = {}
    with FileStorage(root) as storage:
        index = DelayIndex.open(
            storage, NAME, config, clock=ManualClock(T0), executor=InlineExecutor()
        )
        for ledger in (1, 2, 3, 4, 5) if folded else (1, 2, 3):
            for entry in range(8):
                assert index.add(ledger, entry, _at(ledger, entry))
                schedule[Position(ledger, entry)] = _at(ledger, entry)
            if folded and ledger == 3:  # ledgers 1 and 2 sealed: cancel some, durably
                assert all(index.cancel(*p) for p in CANCELLED)
                index.flush()
        for p in CANCELLED if folded else ():
            del schedule[p]
        assert index.add(6 if folded else 4, 0, T0 + 90_000)  # seals; lost at close (replayed)
        index.flush()
        buckets = index.buckets()
        assert all(b.state == "durable" for b in buckets)
        if folded:
            assert [(b.start_ledger, b.end_ledger) for b in buckets] == [(1, 4), (5, 5)]
            assert index.stats()["cancel_overrides_folded"] == len(CANCELLED)
            assert not storage.read_manifest(NAME).overrides  # the merged snapshot holds them
            victim_id, victim_range = buckets[0].snapshot_id, (1, 4)
        else:
            assert len(buckets) == 3 and all(b.num_segments >= 3 for b in buckets)
            victim_id, victim_range = buckets[1].snapshot_id, (2, 2)
        assert victim_id is not None
        index.close()
        victim = storage.object_path(victim_id)
        manifest = storage.manifest_path(NAME)
    data = victim.read_bytes()
    header = read_header(data[: header_bytes_needed(data, "x")], "x")
    spans = tuple(
        (header.entry_offset(i), header.entry_offset(i) + length)
        for i, length in enumerate(header.entry_lengths)
    )
    return Template(
        root, schedule, manifest, victim, victim_range, spans, config,
        CANCELLED if folded else (),
    )  # fmt: skip


@dataclass(frozen=True)
class Damage:
    label: str
    target: str  # "manifest" or "object"
    apply: Callable[[Path], None]


def flip(at: int) -> Callable[[Path], None]:
    def run(path: Path) -> None:
        data = bytearray(path.read_bytes())
        data[at] ^= 1 << (at % 8)
        path.write_bytes(bytes(data))

    return run


def truncate(size: int) -> Callable[[Path], None]:
    def run(path: Path) -> None:
        path.write_bytes(path.read_bytes()[:size])

    return run


def zero(start: int, stop: int | None) -> Callable[[Path], None]:
    def run(path: Path) -> None:
        data = bytearray(path.read_bytes())
        end = len(data) if stop is None else min(stop, len(data))
        data[start:end] = bytes(end - start)
        path.write_bytes(bytes(data))

    return run


def delete(path: Path) -> None:
    path.unlink()


def damages(t: Template) -> Iterator[Damage]:
    for target, path in (("object", t.victim), ("manifest", t.manifest)):
        size = path.stat().st_size
        for at in range(size):
            yield Damage(f"{target} flip @{at}", target, flip(at))
        for cut in sorted({0, 1, 4, 9, size // 3, size // 2, size - 1}):
            yield Damage(f"{target} truncated to {cut}", target, truncate(cut))
        yield Damage(f"{target} zero-filled", target, zero(0, None))
        yield Damage(f"{target} zeroed middle", target, zero(size // 3, 2 * size // 3))
        yield Damage(f"{target} deleted", target, delete)
    for n, (start, stop) in enumerate(t.entry_spans):
        kind = "metadata" if n == 0 else "first segment" if n == 1 else f"segment {n}"
        yield Damage(f"object {kind} zeroed", "object", zero(start, stop))


def drain(
    index: DelayIndex, clock: ManualClock, schedule: dict[Position, int]
) -> Counter[Position]:
    delivered: Counter[Position] = Counter()
    for at in [*sorted(set(schedule.values())), FAR]:
        clock.set(max(at, clock()))
        for _ in range(10_000):
            got = index.poll(1000)
            if not got:
                break
            for p in got:
                assert p in schedule, f"{p} was never added"
                assert schedule[p] <= clock() + TICK, f"{p} delivered early"
            delivered.update(got)
        else:
            raise AssertionError("poll never ran dry")
    return delivered


def run_case(t: Template, damage: Damage, work: Path) -> str:
    """Apply one damage to a fresh copy, open, drain; return the outcome (a), (b) or (c)."""
    root = work / "store"
    shutil.rmtree(root, ignore_errors=True)
    shutil.copytree(t.root, root)
    target = root / (t.victim if damage.target == "object" else t.manifest).relative_to(t.root)
    damage.apply(target)
    existed = target.exists()
    damaged_bytes = target.read_bytes() if existed else None
    clock = ManualClock(T0)
    with FileStorage(root) as storage:
        try:
            index = DelayIndex.open(storage, NAME, t.config, clock=clock, executor=InlineExecutor())
        except RecoveryError as exc:
            assert target.name in str(exc) or NAME in str(exc), f"{damage.label}: {exc}"
            outcome = "c"
        except DelayIndexError:
            raise
        else:
            try:
                outcome = check_drain(t, damage, index, clock)
            finally:
                index.close()
    if damage.target == "object":  # a damaged object is never deleted, never rewritten
        assert existed == target.exists(), f"{damage.label}: damaged object deleted"
        if existed:
            assert target.read_bytes() == damaged_bytes, f"{damage.label}: object changed"
    elif outcome != "c":  # a recovered manifest replaces the damaged one, readable again
        with FileStorage(root) as storage:
            assert storage.read_manifest(NAME).version > 0
    return outcome


def check_drain(t: Template, damage: Damage, index: DelayIndex, clock: ManualClock) -> str:
    expected = set(t.schedule)
    delivered = drain(index, clock, t.schedule)
    twice = [p for p, n in delivered.items() if n > 1]
    assert not twice, f"{damage.label}: delivered twice {twice}"
    missing = expected - set(delivered)
    if not missing:
        assert not index.quarantined() or damage.target == "object"
        if not index.quarantined():  # the folded cancels hold against the replay
            for p in t.cancelled:
                assert index.add(*p, FAR) and not index.contains(*p), f"{damage.label}: {p}"
        return "a"
    # (b): only the damaged bucket's positions may be missing, and they must be reported.
    quarantined = index.quarantined()
    assert quarantined, f"{damage.label}: {len(missing)} positions silently missing"
    assert index.stats()["health"] == "degraded"
    covered = {(q.start_ledger, q.end_ledger) for q in quarantined}
    assert covered == {t.victim_range}, f"{damage.label}: quarantined {covered}"
    low, high = t.victim_range
    assert all(low <= p.ledger_id <= high for p in missing), (
        f"{damage.label}: undamaged buckets stalled: {sorted(missing)[:5]}"
    )
    [info] = quarantined
    for p in t.cancelled:  # a folded cancel it can no longer read: refused, or an error
        try:
            assert index.add(*p, FAR), f"{damage.label}: {p}"
        except DelayIndexError:
            continue
        assert not index.contains(*p), f"{damage.label}: cancelled {p} is back"
    if info.positions_known:
        assert all(index.contains(*p) for p in missing), f"{damage.label}: positions dropped"
        assert len(index) == len(missing)
    else:
        assert info.num_messages >= len(missing)
    return "b"


def test_damage_campaign_over_every_file_kind(template: Template, tmp_path: Path) -> None:
    outcomes: Counter[tuple[str, str]] = Counter()
    cases = list(damages(template))
    assert len(cases) > 500
    for damage in cases:
        outcome = run_case(template, damage, tmp_path)
        outcomes[damage.target, outcome] += 1
        if damage.target == "object":
            assert outcome in ("a", "b"), f"{damage.label}: the whole index failed to open"
        else:  # the history holds an intact copy: the state is provable, never an error
            assert outcome == "a", f"{damage.label}: not recovered from the history"
    # Object damage is always caught (checksums everywhere) and kept local.
    assert outcomes["object", "b"] > 0
    print(dict(outcomes))
