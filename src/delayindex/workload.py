"""Synthetic workloads of delayed (scheduled) messages.

The generator models a single topic partition of a message broker, the way Apache Pulsar's
delayed-delivery tracker sees it:

* **Positions.** Message ``i`` (``0 <= i < n_messages``) is stored at the position
  ``(ledger_id, entry_id)`` with ``ledger_id = first_ledger + i // entries_per_ledger`` and
  ``entry_id = i % entries_per_ledger``. Positions are therefore unique and strictly increasing in
  ``(ledger_id, entry_id)`` order.
* **Publish times.** Messages are published in position order at a constant rate of
  ``publish_rate`` messages per second, starting at ``start_ms`` (Unix epoch milliseconds):
  ``publish_ms[i] = start_ms + floor(i * 1000 / publish_rate)``. Publish times are non-decreasing.
* **Delays.** Each message is independently delayed with probability ``delayed_fraction``
  (a Bernoulli draw per message). A delayed message has ``deliver_at = publish_ms + delay``;
  every other message has ``deliver_at = -1``. The delay distribution is selected by
  ``delay_mix`` (all bounds are inclusive integer milliseconds):

  ``"fixed"``
      Every delay is exactly ``fixed_delay_ms``.
  ``"uniform"``
      Uniform in ``[1_000, 3_600_000]`` (1 s to 1 h).
  ``"realistic"`` (default, the "realistic mix" of the performance targets)
      70 % uniform in ``[1_000, 60_000]`` (1-60 s), 25 % uniform in ``[60_000, 3_600_000]``
      (1-60 min) and 5 % uniform in ``[86_400_000, 864_000_000]`` (1-10 days).
  ``"midnight-burst"``
      ``deliver_at`` is the first UTC midnight strictly after ``publish_ms`` plus a uniform
      jitter in ``[0, 1000)`` ms, which produces a large number of near-ties.

Everything is vectorised with numpy (no per-message Python code) and fully determined by
``seed`` through :func:`numpy.random.default_rng`: the same arguments always produce the same
arrays. Ten million messages take about a second or less with 320 MB of final arrays (four
``int64`` columns); transient buffers add only a few tens of MB to the peak.

Example:
    >>> w = generate(5, seed=1, entries_per_ledger=2, delayed_fraction=1.0, delay_mix="fixed")
    >>> w.ledger_ids.tolist(), w.entry_ids.tolist()
    ([1, 1, 2, 2, 3], [0, 1, 0, 1, 0])
    >>> (w.deliver_at - w.publish_ms).tolist()
    [60000, 60000, 60000, 60000, 60000]
"""

from __future__ import annotations

import numbers
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from delayindex._ints import INT64_MAX, as_int, int64_array

__all__ = [
    "DAY_MS",
    "DEFAULT_START_MS",
    "DELAY_MIXES",
    "REALISTIC_COMPONENTS",
    "UNIFORM_RANGE",
    "GeneratorArgs",
    "check_generator_args",
    "NOT_DELAYED",
    "Workload",
    "generate",
]

#: Names accepted by :func:`generate` for ``delay_mix``.
DELAY_MIXES: tuple[str, ...] = ("fixed", "uniform", "realistic", "midnight-burst")

#: ``deliver_at`` value of a message that is not delayed.
NOT_DELAYED: int = -1

#: Milliseconds in one (UTC) day.
DAY_MS: int = 86_400_000

#: Default ``start_ms``: 2026-01-01T00:00:00Z.
DEFAULT_START_MS: int = 1_767_225_600_000

_INT64_MAX = INT64_MAX
_MAX_ENTRIES_PER_LEDGER = 2**32

# "uniform" mix bounds (inclusive, ms).
_UNIFORM_LO = 1_000
_UNIFORM_HI = 3_600_000
UNIFORM_RANGE = (_UNIFORM_LO, _UNIFORM_HI)

# "realistic" mix: (cumulative probability upper edge, low, high) per component, bounds inclusive.
_REALISTIC_COMPONENTS: tuple[tuple[float, int, int], ...] = (
    (0.70, 1_000, 60_000),  # 70 %: 1-60 s
    (0.95, 60_000, 3_600_000),  # 25 %: 1-60 min
    (1.00, DAY_MS, 10 * DAY_MS),  # 5 %: 1-10 days
)
REALISTIC_COMPONENTS = _REALISTIC_COMPONENTS

# "midnight-burst" jitter: uniform in [0, _MIDNIGHT_JITTER_MS).
_MIDNIGHT_JITTER_MS = 1_000

Int64Array = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]


def _as_int(name: str, value: object) -> int:
    """``value`` as a Python ``int`` (``TypeError`` for ``bool`` and non-integers)."""
    return as_int(name, value)


def _as_fraction(name: str, value: object) -> float:
    """``value`` as a ``float`` in ``[0, 1]``: ``TypeError`` for a ``bool`` or a non-real,
    ``ValueError`` for NaN or outside ``[0, 1]``."""
    if isinstance(value, bool | np.bool_) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a real number, got {type(value).__name__}: {value!r}")
    fraction = float(value)
    if not 0.0 <= fraction <= 1.0:  # also rejects NaN
        raise ValueError(f"{name} must be in [0, 1], got {value!r}")
    return fraction


def _column(name: str, value: Any) -> Int64Array:
    """Coerce one column to a 1-D, C-contiguous ``int64`` array (no copy if it already is).

    Args:
        name: Field name used in the error message.
        value: Array-like column.

    Returns:
        The column as a C-contiguous ``int64`` array.

    Raises:
        ValueError: If the column is not one-dimensional or has a value beyond int64.
        TypeError: If a value is not an integer (floats are refused, never truncated).
    """
    return int64_array(value, name)


@dataclass(frozen=True, eq=False)
class Workload:
    """A batch of messages in position (= publish) order, stored column-wise.

    All columns are one-dimensional, C-contiguous ``int64`` arrays of the same length; element
    ``i`` of each column describes message ``i``. The constructor coerces array-likes to that
    form (without copying arrays that already have it). The dataclass is frozen but the arrays
    themselves are ordinary (writable) numpy arrays and may be views shared with other
    workloads (see :meth:`window`). Equality is identity (``eq=False``) because element-wise
    array comparison has no single truth value; compare columns with :func:`numpy.array_equal`.

    Attributes:
        ledger_ids: Ledger id of each message's position.
        entry_ids: Entry id of each message's position within its ledger.
        publish_ms: Publish time (epoch ms), non-decreasing.
        deliver_at: Delivery time (epoch ms) of delayed messages, ``-1`` for the others.

    Raises:
        ValueError: If a column is not one-dimensional or the columns differ in length.
    """

    ledger_ids: Int64Array
    entry_ids: Int64Array
    publish_ms: Int64Array
    deliver_at: Int64Array

    def __post_init__(self) -> None:
        """Normalise the columns and check that they have equal lengths.

        Raises:
            ValueError: If a column is not one-dimensional or the lengths differ.
        """
        lengths = set()
        for name in ("ledger_ids", "entry_ids", "publish_ms", "deliver_at"):
            arr = _column(name, getattr(self, name))
            object.__setattr__(self, name, arr)
            lengths.add(arr.shape[0])
        if len(lengths) > 1:
            raise ValueError(
                "Workload columns must have equal lengths, got "
                f"ledger_ids={self.ledger_ids.shape[0]}, entry_ids={self.entry_ids.shape[0]}, "
                f"publish_ms={self.publish_ms.shape[0]}, deliver_at={self.deliver_at.shape[0]}"
            )

    def __len__(self) -> int:
        """Return the number of messages.

        Returns:
            The common length of the columns.
        """
        return int(self.publish_ms.shape[0])

    @property
    def delayed_mask(self) -> BoolArray:
        """Which messages are delayed.

        Returns:
            A new boolean array, ``True`` where ``deliver_at != -1``.
        """
        mask: BoolArray = self.deliver_at != NOT_DELAYED
        return mask

    def window(self, start: int, stop: int) -> Workload:
        """Return messages ``start`` (inclusive) to ``stop`` (exclusive) by message index.

        The columns of the result are views into this workload's arrays (no copy).

        Args:
            start: First message index, ``0 <= start <= stop``.
            stop: One past the last message index, ``stop <= len(self)``.

        Returns:
            A workload with ``stop - start`` messages sharing memory with this one.

        Raises:
            TypeError: If ``start`` or ``stop`` is not an int (``bool`` is rejected).
            ValueError: If not ``0 <= start <= stop <= len(self)``.
        """
        lo = _as_int("start", start)
        hi = _as_int("stop", stop)
        n = len(self)
        if not 0 <= lo <= hi <= n:
            raise ValueError(f"window must satisfy 0 <= start <= stop <= {n}, got [{lo}, {hi})")
        return Workload(
            self.ledger_ids[lo:hi],
            self.entry_ids[lo:hi],
            self.publish_ms[lo:hi],
            self.deliver_at[lo:hi],
        )

    def chunks_by_publish_time(self, window_ms: int) -> Iterator[tuple[int, Workload]]:
        """Split the workload into consecutive publish-time windows.

        Windows are ``[t, t + window_ms)`` with ``t = publish_ms[0] + k * window_ms`` for
        ``k = 0, 1, 2, ...``. Each non-empty window is yielded once, in order, as
        ``(t + window_ms, chunk)`` where ``chunk`` holds exactly the messages whose publish time
        lies in the window (a :meth:`window` view). Empty windows are skipped, so the chunks
        concatenate to the whole workload and every message appears exactly once. Boundaries
        are found with :func:`numpy.searchsorted`, so the cost is ``O(log n)`` per chunk.

        Args:
            window_ms: Window length in milliseconds, at least 1.

        Yields:
            ``(window_end_ms, chunk)`` pairs; ``window_end_ms`` is exclusive and strictly
            increasing from one pair to the next.

        Raises:
            TypeError: If ``window_ms`` is not an int (``bool`` is rejected).
            ValueError: If ``window_ms < 1``.
        """
        width = _as_int("window_ms", window_ms)
        if width < 1:
            raise ValueError(f"window_ms must be >= 1, got {width}")
        publish = self.publish_ms
        n = len(self)
        if n == 0:
            return
        origin = int(publish[0])
        pos = 0
        while pos < n:
            first = int(publish[pos])
            end = origin + ((first - origin) // width + 1) * width
            stop = int(np.searchsorted(publish, end, side="left"))
            yield end, self.window(pos, stop)
            pos = stop


def _max_delay_ms(delay_mix: str, fixed_delay_ms: int) -> int:
    """Return an upper bound of ``deliver_at - publish_ms`` for a mix (for overflow checks).

    Args:
        delay_mix: One of :data:`DELAY_MIXES`.
        fixed_delay_ms: The delay of the ``"fixed"`` mix.

    Returns:
        The largest possible delay in milliseconds.
    """
    if delay_mix == "fixed":
        return fixed_delay_ms
    if delay_mix == "uniform":
        return _UNIFORM_HI
    if delay_mix == "realistic":
        return max(hi for _, _, hi in _REALISTIC_COMPONENTS)
    return DAY_MS + _MIDNIGHT_JITTER_MS  # midnight-burst


def _realistic_delays(rng: np.random.Generator, k: int) -> Int64Array:
    """Draw ``k`` delays from the "realistic" mixture.

    Args:
        rng: Random generator to draw from.
        k: Number of delays.

    Returns:
        ``int64`` delays in milliseconds.
    """
    u = rng.random(k)
    # Component index 0, 1, 2 from the cumulative edges 0.70 and 0.95.
    component = (u >= _REALISTIC_COMPONENTS[0][0]).view(np.int8).copy()
    component += u >= _REALISTIC_COMPONENTS[1][0]
    del u
    delays: Int64Array = np.empty(k, dtype=np.int64)
    for j, (_, lo, hi) in enumerate(_REALISTIC_COMPONENTS):
        selected = component == j
        count = int(np.count_nonzero(selected))
        np.place(delays, selected, rng.integers(lo, hi, size=count, dtype=np.int64, endpoint=True))
    return delays


@dataclass(frozen=True)
class GeneratorArgs:
    """Checked generator arguments (:func:`generate`, :func:`delayindex.dump.generate_dump`)."""

    n: int
    seed: int
    per_ledger: int
    fraction: float
    mix: str
    publish_rate: int
    start_ms: int
    first_ledger: int
    fixed_delay_ms: int


def check_generator_args(
    n: object,
    *,
    seed: object,
    entries_per_ledger: object,
    delayed_fraction: object,
    delay_mix: object,
    publish_rate: object,
    start_ms: object,
    first_ledger: object,
    fixed_delay_ms: object,
    n_name: str = "n_messages",
    burst_max_delay_ms: int = DAY_MS + _MIDNIGHT_JITTER_MS,
) -> GeneratorArgs:
    """Check a generator's arguments (both generators share the model and its limits).

    Args:
        n_name: what errors call the message count (``generate_dump`` names it ``n``).
        burst_max_delay_ms: the longest delay of the ``midnight-burst`` mix (``generate_dump``
            mixes realistic delays into it), for the overflow check.

    Raises:
        TypeError: an integer argument is not an int (``bool`` is refused), or
            ``delayed_fraction`` is not a real number.
        ValueError: an argument out of range, an unknown ``delay_mix``, or int64 overflow.
    """
    n_ = as_int(n_name, n, 0, _INT64_MAX)
    seed_ = as_int("seed", seed, 0, _INT64_MAX)
    per_ledger = as_int("entries_per_ledger", entries_per_ledger, 1, _MAX_ENTRIES_PER_LEDGER)
    rate = as_int("publish_rate", publish_rate, 1, _INT64_MAX)
    start = as_int("start_ms", start_ms, 0, _INT64_MAX)
    ledger0 = as_int("first_ledger", first_ledger, 0, _INT64_MAX)
    fixed_delay = as_int("fixed_delay_ms", fixed_delay_ms, 0, _INT64_MAX)
    fraction = _as_fraction("delayed_fraction", delayed_fraction)
    if not isinstance(delay_mix, str) or delay_mix not in DELAY_MIXES:
        valid = ", ".join(repr(m) for m in DELAY_MIXES)
        raise ValueError(f"unknown delay_mix {delay_mix!r}; valid mixes are: {valid}")

    # Overflow guards, computed with Python ints.
    last = max(n_ - 1, 0)
    if last * 1000 > _INT64_MAX:
        raise ValueError(f"{n_name}={n_} is too large (publish offsets overflow int64)")
    if ledger0 + last // per_ledger > _INT64_MAX:
        raise ValueError(f"ledger ids would overflow int64; lower first_ledger or {n_name}")
    max_delay = (
        burst_max_delay_ms
        if delay_mix == "midnight-burst"
        else _max_delay_ms(delay_mix, fixed_delay)
    )
    if start + last * 1000 // rate + max_delay > _INT64_MAX:
        raise ValueError("timestamps would overflow int64; lower start_ms or the delays")
    return GeneratorArgs(
        n_, seed_, per_ledger, fraction, delay_mix, rate, start, ledger0, fixed_delay
    )


def generate(
    n_messages: int,
    *,
    seed: int = 0,
    entries_per_ledger: int = 1000,
    delayed_fraction: float = 0.5,
    delay_mix: str = "realistic",
    publish_rate: int = 10_000,
    start_ms: int = DEFAULT_START_MS,
    first_ledger: int = 1,
    fixed_delay_ms: int = 60_000,
) -> Workload:
    """Generate a deterministic synthetic workload (see the module docstring for the model).

    Args:
        n_messages: Number of messages, at least 0 (0 gives empty arrays).
        seed: Seed for :func:`numpy.random.default_rng`, at least 0.
        entries_per_ledger: Entries per ledger, in ``[1, 2**32]``.
        delayed_fraction: Probability that a message is delayed, in ``[0, 1]``.
        delay_mix: Delay distribution, one of :data:`DELAY_MIXES`.
        publish_rate: Publish rate in messages per second, at least 1.
        start_ms: Publish time of the first message (epoch ms), at least 0.
        first_ledger: Ledger id of the first message, at least 0.
        fixed_delay_ms: Delay of every delayed message for ``delay_mix="fixed"``, at least 0.

    Returns:
        The generated :class:`Workload`; all columns are C-contiguous ``int64`` arrays of
        length ``n_messages``.

    Raises:
        TypeError: If an integer parameter is not an int (``bool`` is rejected), or
            ``delayed_fraction`` is not a real number.
        ValueError: If a parameter is out of range, ``delay_mix`` is unknown, or the
            resulting ledger ids or timestamps would overflow ``int64``.
    """
    args = check_generator_args(
        n_messages,
        seed=seed,
        entries_per_ledger=entries_per_ledger,
        delayed_fraction=delayed_fraction,
        delay_mix=delay_mix,
        publish_rate=publish_rate,
        start_ms=start_ms,
        first_ledger=first_ledger,
        fixed_delay_ms=fixed_delay_ms,
    )
    n, seed_, per_ledger, fraction = args.n, args.seed, args.per_ledger, args.fraction
    rate, start, ledger0, fixed_delay = (
        args.publish_rate,
        args.start_ms,
        args.first_ledger,
        args.fixed_delay_ms,
    )

    rng = np.random.default_rng(seed_)

    # 1. Which messages are delayed (Bernoulli draws), done first to keep peak memory low.
    delayed: BoolArray = rng.random(n) < fraction
    k = int(np.count_nonzero(delayed))

    # 2. Publish times: start + floor(i * 1000 / rate), computed in place.
    publish: Int64Array = np.arange(n, dtype=np.int64)
    publish *= 1000
    publish //= rate
    publish += start

    # 3. Delivery times of the delayed messages.
    if delay_mix == "fixed":
        targets: Int64Array = publish[delayed]
        targets += fixed_delay
    elif delay_mix == "uniform":
        targets = rng.integers(_UNIFORM_LO, _UNIFORM_HI, size=k, dtype=np.int64, endpoint=True)
        targets += publish[delayed]
    elif delay_mix == "realistic":
        targets = _realistic_delays(rng, k)
        targets += publish[delayed]
    else:  # midnight-burst: next UTC midnight strictly after publish, plus jitter
        targets = publish[delayed]
        targets //= DAY_MS
        targets += 1
        targets *= DAY_MS
        targets += rng.integers(0, _MIDNIGHT_JITTER_MS, size=k, dtype=np.int64)
    deliver: Int64Array = np.full(n, NOT_DELAYED, dtype=np.int64)
    np.place(deliver, delayed, targets)
    del targets, delayed

    # 4. Positions: ledger = first + i // per_ledger, entry = i % per_ledger.
    entries: Int64Array = np.arange(n, dtype=np.int64)
    ledgers: Int64Array = entries // per_ledger
    ledgers += ledger0
    entries %= per_ledger

    return Workload(ledger_ids=ledgers, entry_ids=entries, publish_ms=publish, deliver_at=deliver)
