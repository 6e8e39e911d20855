"""Tests for :mod:`delayindex.clock`: ManualClock and the native/pure ``wall_clock_ms`` twins."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest

import delayindex
from delayindex import ManualClock, _impl
from delayindex.clock import ManualClock as ClockFromModule


def _native_wall_clock() -> Callable[[], int]:
    module = _impl.native_module_or_none()
    assert module is not None, "the native extension delayindex._native is not built"
    fn: Callable[[], int] = module.wall_clock_ms
    return fn


# --- ManualClock -------------------------------------------------------------------------------


def test_public_name() -> None:
    assert ManualClock is ClockFromModule
    assert delayindex.ManualClock is ManualClock


def test_default_start_is_zero() -> None:
    clock = ManualClock()
    assert clock() == 0
    assert type(clock()) is int


@pytest.mark.parametrize("start", [0, 1, 1_700_000_000_000, -5, 2**63 - 1])
def test_start_ms(start: int) -> None:
    assert ManualClock(start)() == start
    assert ManualClock(start_ms=start)() == start


def test_calling_does_not_move_time() -> None:
    clock = ManualClock(42)
    assert [clock() for _ in range(5)] == [42] * 5


@pytest.mark.parametrize("bad", [1.0, 1.5, "0", None, True, False])
def test_start_rejects_non_ints(bad: object) -> None:
    with pytest.raises(TypeError):
        ManualClock(bad)  # type: ignore[arg-type]


def test_set_jumps_and_may_go_backwards() -> None:
    clock = ManualClock(1_000)
    assert clock.set(5_000) == 5_000
    assert clock() == 5_000
    assert clock.set(10) == 10  # backwards: allowed
    assert clock() == 10
    assert clock.set(-3) == -3
    assert clock() == -3
    assert clock.set(10) == 10
    assert clock() == 10


@pytest.mark.parametrize("bad", [1.0, "5", None, True])
def test_set_rejects_non_ints_and_keeps_time(bad: object) -> None:
    clock = ManualClock(77)
    with pytest.raises(TypeError):
        clock.set(bad)  # type: ignore[arg-type]
    assert clock() == 77


def test_advance_moves_forward_and_returns_new_time() -> None:
    clock = ManualClock(1_000)
    assert clock.advance(500) == 1_500
    assert clock() == 1_500
    assert clock.advance(0) == 1_500
    assert clock() == 1_500
    assert clock.advance(1) == 1_501
    assert clock.advance(10**12) == 10**12 + 1_501
    assert clock() == 10**12 + 1_501


def test_advance_after_set_backwards() -> None:
    clock = ManualClock(100)
    clock.set(10)
    assert clock.advance(5) == 15


@pytest.mark.parametrize("bad", [-1, -1000])
def test_advance_negative_raises_value_error_and_keeps_time(bad: int) -> None:
    clock = ManualClock(500)
    with pytest.raises(ValueError):
        clock.advance(bad)
    assert clock() == 500


@pytest.mark.parametrize("bad", [1.0, 0.5, "1", None, b"1"])
def test_advance_non_int_raises_type_error_and_keeps_time(bad: object) -> None:
    clock = ManualClock(500)
    with pytest.raises(TypeError):
        clock.advance(bad)  # type: ignore[arg-type]
    assert clock() == 500


@pytest.mark.parametrize("bad", [True, False])
def test_advance_bool_raises_type_error(bad: bool) -> None:
    clock = ManualClock(500)
    with pytest.raises(TypeError):
        clock.advance(bad)
    assert clock() == 500


def test_repr_shows_time() -> None:
    assert "1234" in repr(ManualClock(1234))


# --- wall clocks -------------------------------------------------------------------------------


def test_public_wall_clock_is_the_selected_one() -> None:
    assert delayindex.wall_clock_ms is _impl.wall_clock_ms
    assert type(delayindex.wall_clock_ms()) is int


@pytest.mark.parametrize("which", ["native", "pure"])
def test_wall_clock_returns_epoch_ms_int(which: str) -> None:
    fn = _native_wall_clock() if which == "native" else _impl.pure_wall_clock_ms
    before = time.time_ns() // 1_000_000
    value = fn()
    after = time.time_ns() // 1_000_000
    assert type(value) is int
    # Milliseconds since the epoch (not seconds, not nanoseconds).
    assert before - 1000 <= value <= after + 1000


def test_native_and_pure_wall_clocks_agree() -> None:
    native = _native_wall_clock()
    pure = _impl.pure_wall_clock_ms
    a = native()
    b = pure()
    c = native()
    assert type(a) is int
    assert type(b) is int
    assert abs(a - b) <= 1000
    assert abs(c - b) <= 1000
