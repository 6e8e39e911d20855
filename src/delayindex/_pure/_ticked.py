"""The time state both pure cores share (twin of ``_core.pxi`` and ``_bucket_state.pxi``):
the tick, the cutoff (the rule itself is :func:`delayindex.policy.cutoff_ms`), and Pulsar's
fixed-delay detection (§1.6 of the notes)."""

from __future__ import annotations

from abc import abstractmethod

from delayindex._pure._ints import as_i64
from delayindex.policy import cutoff_ms


class TickedCore:
    """Mixin: ``tick_ms``, ``cutoff_for``, fixed-delay state and ``should_pause``.

    The host sets ``_tick``, ``strict``, ``fixed_delay_lookahead``, ``_fixed_delay`` and
    ``_highest`` and defines ``__len__`` and ``has_due``.
    """

    _tick: int
    strict: bool
    fixed_delay_lookahead: int
    _fixed_delay: bool
    _highest: int

    @property
    def tick_ms(self) -> int:
        """The tick used for the non-strict cutoff and fixed-delay detection."""
        return self._tick

    @tick_ms.setter
    def tick_ms(self, value: int) -> None:
        value = as_i64(value)
        if value < 0:
            raise ValueError(f"tick_ms must be >= 0, got {value}")
        self._tick = value

    def cutoff_for(self, now: int) -> int:
        """The cutoff for ``now``: a message is due when deliver_at <= cutoff."""
        return cutoff_ms(as_i64(now), self._tick, self.strict)

    def _note_deliver_at(self, deliver_at: int) -> None:
        # Out of order by more than a tick means delays are not fixed (Pulsar #16609).
        if deliver_at < self._highest - self._tick:
            self._fixed_delay = False
        self._highest = max(self._highest, deliver_at)

    @abstractmethod
    def __len__(self) -> int:
        """Tracked positions (the host's)."""

    @abstractmethod
    def has_due(self, now: int) -> bool:
        """Whether some tracked position is due (the host's)."""

    def should_pause(self, now: int) -> bool:
        """Pulsar's fixed-delay detection: pause reads while delays look fixed and none is due."""
        return (
            self.fixed_delay_lookahead > 0
            and self._fixed_delay
            and len(self) >= self.fixed_delay_lookahead
            and not self.has_due(now)
        )
