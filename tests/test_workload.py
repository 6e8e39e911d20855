"""Tests for :mod:`delayindex.workload`."""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt
import pytest

from delayindex.workload import DAY_MS, DELAY_MIXES, Workload, generate

N_STAT = 200_000


@pytest.fixture(scope="module")
def realistic() -> Workload:
    return generate(N_STAT, seed=123)


def _columns(w: Workload) -> tuple[np.ndarray, ...]:
    return (w.ledger_ids, w.entry_ids, w.publish_ms, w.deliver_at)


def _zeros(shape: int | tuple[int, ...]) -> npt.NDArray[np.int64]:
    return np.zeros(shape, dtype=np.int64)


def _assert_same(a: Workload, b: Workload) -> None:
    for x, y in zip(_columns(a), _columns(b), strict=True):
        np.testing.assert_array_equal(x, y)


# --- determinism -------------------------------------------------------------------------------


@pytest.mark.parametrize("mix", DELAY_MIXES)
def test_deterministic_per_seed(mix: str) -> None:
    _assert_same(generate(5_000, seed=42, delay_mix=mix), generate(5_000, seed=42, delay_mix=mix))


@pytest.mark.parametrize("mix", DELAY_MIXES)
def test_different_seeds_differ(mix: str) -> None:
    a = generate(5_000, seed=1, delay_mix=mix)
    b = generate(5_000, seed=2, delay_mix=mix)
    # Positions and publish times are not random; the delayed set and delays are.
    np.testing.assert_array_equal(a.publish_ms, b.publish_ms)
    assert not np.array_equal(a.delayed_mask, b.delayed_mask)
    assert not np.array_equal(a.deliver_at, b.deliver_at)


def test_default_seed_is_zero() -> None:
    _assert_same(generate(1_000), generate(1_000, seed=0))


# --- shapes and dtypes -------------------------------------------------------------------------


@pytest.mark.parametrize("n", [0, 1, 7, 1_001])
@pytest.mark.parametrize("mix", DELAY_MIXES)
def test_shapes_and_dtypes(n: int, mix: str) -> None:
    w = generate(n, delay_mix=mix)
    assert len(w) == n
    for col in _columns(w):
        assert col.dtype == np.int64
        assert col.shape == (n,)
        assert col.flags.c_contiguous
    assert w.delayed_mask.dtype == np.bool_
    assert w.delayed_mask.shape == (n,)


def test_empty_workload() -> None:
    w = generate(0)
    assert len(w) == 0
    assert list(w.chunks_by_publish_time(1_000)) == []
    assert len(w.window(0, 0)) == 0


# --- positions ---------------------------------------------------------------------------------


@pytest.mark.parametrize(("per_ledger", "first"), [(1, 0), (3, 5), (1000, 1), (2**32, 9)])
def test_positions_unique_in_order_and_in_range(per_ledger: int, first: int) -> None:
    n = 10_007
    w = generate(n, entries_per_ledger=per_ledger, first_ledger=first)
    i = np.arange(n)
    np.testing.assert_array_equal(w.ledger_ids, first + i // per_ledger)
    np.testing.assert_array_equal(w.entry_ids, i % per_ledger)
    assert w.entry_ids.min() >= 0
    assert w.entry_ids.max() < per_ledger
    assert w.ledger_ids[0] == first
    # Strictly increasing in (ledger_id, entry_id) order, hence unique.
    dl = np.diff(w.ledger_ids)
    de = np.diff(w.entry_ids)
    assert np.all((dl > 0) | ((dl == 0) & (de > 0)))
    assert np.all((dl == 0) | (dl == 1))
    assert np.all(w.entry_ids[1:][dl == 1] == 0)


# --- publish times -----------------------------------------------------------------------------


@pytest.mark.parametrize("rate", [1, 3, 7, 1_000, 10_000, 1_000_000])
def test_publish_times_follow_rate(rate: int) -> None:
    n = 20_000
    start = 1_700_000_000_123
    w = generate(n, publish_rate=rate, start_ms=start)
    i = np.arange(n, dtype=np.int64)
    np.testing.assert_array_equal(w.publish_ms, start + (i * 1000) // rate)
    assert np.all(np.diff(w.publish_ms) >= 0)
    assert w.publish_ms[0] == start


def test_publish_formula_exact_for_python_ints() -> None:
    w = generate(1_000, publish_rate=3, start_ms=17)
    assert w.publish_ms.tolist() == [17 + i * 1000 // 3 for i in range(1_000)]


# --- delayed fraction --------------------------------------------------------------------------


@pytest.mark.parametrize("fraction", [0.01, 0.25, 0.5, 0.9])
def test_delayed_fraction_statistical(fraction: float) -> None:
    w = generate(N_STAT, seed=9, delayed_fraction=fraction, delay_mix="fixed")
    observed = float(w.delayed_mask.mean())
    sigma = (fraction * (1 - fraction) / N_STAT) ** 0.5
    assert abs(observed - fraction) < 6 * sigma


@pytest.mark.parametrize("mix", DELAY_MIXES)
def test_delayed_fraction_extremes(mix: str) -> None:
    none = generate(2_000, delayed_fraction=0.0, delay_mix=mix)
    assert not none.delayed_mask.any()
    assert np.all(none.deliver_at == -1)
    every = generate(2_000, delayed_fraction=1.0, delay_mix=mix)
    assert every.delayed_mask.all()
    assert np.all(every.deliver_at >= every.publish_ms)


@pytest.mark.parametrize("mix", DELAY_MIXES)
def test_not_delayed_is_minus_one_and_delayed_after_publish(mix: str) -> None:
    w = generate(20_000, seed=3, delay_mix=mix)
    mask = w.delayed_mask
    np.testing.assert_array_equal(mask, w.deliver_at != -1)
    assert np.all(w.deliver_at[~mask] == -1)
    assert np.all(w.deliver_at[mask] >= w.publish_ms[mask])


def test_delayed_set_does_not_depend_on_mix() -> None:
    masks = [generate(10_000, seed=5, delay_mix=m).delayed_mask for m in DELAY_MIXES]
    for m in masks[1:]:
        np.testing.assert_array_equal(masks[0], m)


# --- delay mixes -------------------------------------------------------------------------------


def test_realistic_mix_proportions_and_ranges(realistic: Workload) -> None:
    mask = realistic.delayed_mask
    delays = realistic.deliver_at[mask] - realistic.publish_ms[mask]
    k = delays.size
    assert abs(k / N_STAT - 0.5) < 0.01
    seconds = (delays >= 1_000) & (delays <= 60_000)
    minutes = (delays > 60_000) & (delays <= 3_600_000)
    days = (delays >= DAY_MS) & (delays <= 10 * DAY_MS)
    # Every delay falls in exactly one of the three ranges (60_000 itself is counted as seconds).
    assert np.all(seconds | minutes | days)
    for frac, expected in ((seconds.mean(), 0.70), (minutes.mean(), 0.25), (days.mean(), 0.05)):
        assert abs(frac - expected) < 6 * (expected * (1 - expected) / k) ** 0.5
    # Uniform within each component: the means sit near the midpoints.
    assert abs(delays[seconds].mean() - 30_500) < 500
    assert abs(delays[minutes].mean() - 1_830_000) < 30_000
    assert abs(delays[days].mean() - 5.5 * DAY_MS) < 0.2 * DAY_MS
    # Bounds are reached closely from both sides.
    assert delays[seconds].min() < 1_100
    assert delays[seconds].max() > 59_900
    assert delays[days].min() < DAY_MS + 0.05 * DAY_MS
    assert delays[days].max() > 10 * DAY_MS - 0.05 * DAY_MS


def test_realistic_is_default(realistic: Workload) -> None:
    _assert_same(realistic, generate(N_STAT, seed=123, delay_mix="realistic"))


@pytest.mark.parametrize("fixed", [0, 1, 60_000, 7 * DAY_MS])
def test_fixed_mix_exact_delay(fixed: int) -> None:
    w = generate(10_000, seed=4, delay_mix="fixed", fixed_delay_ms=fixed)
    mask = w.delayed_mask
    assert mask.any()
    np.testing.assert_array_equal(w.deliver_at[mask], w.publish_ms[mask] + fixed)


def test_fixed_mix_default_delay() -> None:
    w = generate(1_000, delay_mix="fixed")
    mask = w.delayed_mask
    assert np.all(w.deliver_at[mask] - w.publish_ms[mask] == 60_000)


def test_uniform_mix_range() -> None:
    w = generate(50_000, seed=6, delay_mix="uniform")
    mask = w.delayed_mask
    delays = w.deliver_at[mask] - w.publish_ms[mask]
    assert delays.min() >= 1_000
    assert delays.max() <= 3_600_000
    assert delays.min() < 1_000 + 1_000
    assert delays.max() > 3_600_000 - 1_000
    assert abs(delays.mean() - 1_800_500) < 30_000


def test_midnight_burst_targets_next_midnight() -> None:
    # Start 10 s before a midnight at 1 msg/ms so publish times straddle it (and hit it exactly).
    start = 1_767_225_600_000 - 10_000
    w = generate(
        50_000,
        seed=8,
        delay_mix="midnight-burst",
        publish_rate=1_000,
        start_ms=start,
        delayed_fraction=1.0,
    )
    mask = w.delayed_mask
    pub = w.publish_ms[mask]
    dl = w.deliver_at[mask]
    next_midnight = (pub // DAY_MS + 1) * DAY_MS
    jitter = dl - next_midnight
    assert np.all((jitter >= 0) & (jitter < 1_000))
    assert np.all(dl > pub)
    assert np.all(dl % DAY_MS < 1_000)
    # A message published exactly at midnight goes to the *next* midnight.
    at_midnight = pub % DAY_MS == 0
    assert at_midnight.any()
    assert np.all(dl[at_midnight] >= pub[at_midnight] + DAY_MS)
    # Both midnights are targeted, and the jitter spreads over the whole second (near-ties).
    assert set((dl // DAY_MS).tolist()) == {start // DAY_MS + 1, start // DAY_MS + 2}
    assert jitter.min() < 10
    assert jitter.max() > 990


# --- window / chunks ---------------------------------------------------------------------------


def test_window_is_a_view() -> None:
    w = generate(1_000, seed=1)
    sub = w.window(100, 250)
    assert len(sub) == 150
    for full, part in zip(_columns(w), _columns(sub), strict=True):
        assert np.shares_memory(full, part)
        np.testing.assert_array_equal(part, full[100:250])
        assert part.flags.c_contiguous


@pytest.mark.parametrize(("start", "stop"), [(-1, 5), (5, 4), (0, 1_001)])
def test_window_bounds(start: int, stop: int) -> None:
    with pytest.raises(ValueError, match="window"):
        generate(1_000).window(start, stop)


def test_window_type_errors() -> None:
    w = generate(10)
    with pytest.raises(TypeError):
        w.window(0.5, 3)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        w.window(False, 3)


@pytest.mark.parametrize(("rate", "window_ms"), [(10_000, 1), (10_000, 7), (3, 1_000), (7, 250)])
def test_chunks_cover_everything_in_order(rate: int, window_ms: int) -> None:
    w = generate(3_001, seed=2, publish_rate=rate, start_ms=1_000_003)
    ends = []
    pieces = []
    for end, chunk in w.chunks_by_publish_time(window_ms):
        assert len(chunk) > 0
        assert np.all(chunk.publish_ms >= end - window_ms)
        assert np.all(chunk.publish_ms < end)
        assert (end - w.publish_ms[0]) % window_ms == 0
        ends.append(end)
        pieces.append(chunk)
    assert ends == sorted(set(ends))
    for i, col in enumerate(_columns(w)):
        np.testing.assert_array_equal(np.concatenate([_columns(p)[i] for p in pieces]), col)
    # A message is never split from its window: the next chunk starts at or after `end`.
    for end, nxt in zip(ends, pieces[1:], strict=False):
        assert nxt.publish_ms[0] >= end


def test_chunks_skip_empty_windows() -> None:
    # 1 msg/s with 100 ms windows: 9 of every 10 windows are empty and are skipped.
    w = generate(50, publish_rate=1, start_ms=0)
    chunks = list(w.chunks_by_publish_time(100))
    assert [end for end, _ in chunks] == [1_000 * i + 100 for i in range(50)]
    assert all(len(c) == 1 for _, c in chunks)


def test_chunks_single_window() -> None:
    w = generate(100)
    chunks = list(w.chunks_by_publish_time(10**12))
    assert len(chunks) == 1
    assert chunks[0][0] == w.publish_ms[0] + 10**12
    assert len(chunks[0][1]) == 100


def test_chunks_validation() -> None:
    w = generate(10)
    with pytest.raises(ValueError, match="window_ms"):
        list(w.chunks_by_publish_time(0))
    with pytest.raises(TypeError, match="window_ms"):
        list(w.chunks_by_publish_time(1.5))  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="window_ms"):
        list(w.chunks_by_publish_time(True))


# --- Workload constructor ----------------------------------------------------------------------


def test_workload_constructor_coerces_and_checks() -> None:
    w = Workload([1, 2], [0, 1], [5, 6], [-1, 10])  # type: ignore[arg-type]
    assert all(c.dtype == np.int64 for c in _columns(w))
    assert w.delayed_mask.tolist() == [False, True]
    with pytest.raises(ValueError, match="equal lengths"):
        Workload(_zeros(2), _zeros(2), _zeros(3), _zeros(2))
    with pytest.raises(ValueError, match="one-dimensional"):
        Workload(_zeros((2, 2)), _zeros(2), _zeros(2), _zeros(2))


def test_workload_is_frozen() -> None:
    w = generate(3)
    with pytest.raises(AttributeError):
        w.publish_ms = np.zeros(3, dtype=np.int64)  # type: ignore[misc]


# --- validation --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"n_messages": -1}, "n_messages"),
        ({"entries_per_ledger": 0}, "entries_per_ledger"),
        ({"entries_per_ledger": 2**32 + 1}, "entries_per_ledger"),
        ({"delayed_fraction": -0.01}, "delayed_fraction"),
        ({"delayed_fraction": 1.01}, "delayed_fraction"),
        ({"delayed_fraction": float("nan")}, "delayed_fraction"),
        ({"delay_mix": "exponential"}, "fixed.*uniform.*realistic.*midnight-burst"),
        ({"delay_mix": "Realistic"}, "delay_mix"),
        ({"publish_rate": 0}, "publish_rate"),
        ({"first_ledger": -1}, "first_ledger"),
        ({"fixed_delay_ms": -1}, "fixed_delay_ms"),
        ({"start_ms": -1}, "start_ms"),
        ({"seed": -1}, "seed"),
        ({"first_ledger": 2**63 - 1, "n_messages": 2_000, "entries_per_ledger": 1}, "overflow"),
        ({"start_ms": 2**63 - 1_000}, "overflow"),
        ({"delay_mix": "fixed", "fixed_delay_ms": 2**63 - 1}, "overflow"),
    ],
)
def test_value_errors(kwargs: dict[str, Any], match: str) -> None:
    args: dict[str, Any] = {"n_messages": 10, **kwargs}
    with pytest.raises(ValueError, match=match):
        generate(**args)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"n_messages": 10.0},
        {"n_messages": True},
        {"n_messages": "10"},
        {"seed": 1.5},
        {"seed": False},
        {"entries_per_ledger": 1000.0},
        {"entries_per_ledger": True},
        {"publish_rate": 10.5},
        {"publish_rate": True},
        {"first_ledger": 1.0},
        {"first_ledger": np.bool_(True)},
        {"start_ms": 1.0},
        {"fixed_delay_ms": 60_000.0},
        {"delayed_fraction": True},
        {"delayed_fraction": "0.5"},
    ],
)
def test_type_errors(kwargs: dict[str, Any]) -> None:
    args: dict[str, Any] = {"n_messages": 10, **kwargs}
    with pytest.raises(TypeError):
        generate(**args)


def test_numpy_integers_accepted() -> None:
    _assert_same(
        generate(
            np.int64(100),  # type: ignore[arg-type]
            seed=np.int32(3),  # type: ignore[arg-type]
            entries_per_ledger=np.uint16(7),  # type: ignore[arg-type]
        ),
        generate(100, seed=3, entries_per_ledger=7),
    )


def test_integer_fraction_accepted() -> None:
    assert generate(100, delayed_fraction=1).delayed_mask.all()
    assert not generate(100, delayed_fraction=0).delayed_mask.any()
