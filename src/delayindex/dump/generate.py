"""The dump generator: a realistic, deterministic topic dump of any size, block by block.

It follows :mod:`delayindex.workload`'s model (positions, publish rate, delay mixes) and shares
its argument checks (:func:`~delayindex.workload.check_generator_args`), but draws per block of
:data:`~delayindex.dump.schema.GEN_BLOCK_ROWS` rows from streams seeded by ``(seed, block, k)``.
Invariant: row ``i`` depends only on the arguments (``n`` aside) and its block, so a shorter dump
is a prefix of a longer one and ``gen-dump`` can write any size in bounded memory. It needs
numpy only, not pyarrow.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import numpy.typing as npt

from delayindex.dump.schema import GEN_BLOCK_ROWS, NOT_DELAYED, DumpColumns, Int64Array
from delayindex.workload import (
    DAY_MS,
    DEFAULT_START_MS,
    REALISTIC_COMPONENTS,
    UNIFORM_RANGE,
    GeneratorArgs,
    check_generator_args,
)

#: Share of the delayed messages of the ``midnight-burst`` mix due exactly at the next midnight.
MIDNIGHT_BURST_SHARE = 0.5
_MAX_REALISTIC_DELAY = max(high for _, _, high in REALISTIC_COMPONENTS)


def _uniform_ms(draw: npt.NDArray[np.float64], low: Any, high: Any) -> Int64Array:
    """Integers uniform in ``[low, high]`` (inclusive) from uniform doubles in ``[0, 1)``."""
    span = np.asarray(high) - np.asarray(low) + 1
    picked: Int64Array = np.minimum(np.floor(draw * span).astype(np.int64), span - 1)
    picked += low
    return picked


def _generate_block(spec: GeneratorArgs, block: int) -> DumpColumns:
    """Rows ``[block * GEN_BLOCK_ROWS, ...)``: a pure function of the spec and the block.

    Each random quantity has its own stream and every row takes one draw from it, delayed or
    not, so row ``j`` of a block gets the ``j``-th draw whatever the block's length: a shorter
    dump is a prefix of a longer one.
    """
    lo = block * GEN_BLOCK_ROWS
    hi = min(lo + GEN_BLOCK_ROWS, spec.n)
    size = hi - lo
    streams = [np.random.default_rng([spec.seed, block, k]) for k in range(4)]
    index = np.arange(lo, hi, dtype=np.int64)
    publish = index * 1000
    publish //= spec.publish_rate
    publish += spec.start_ms
    delayed = streams[0].random(size) < spec.fraction
    if spec.mix == "fixed":
        delay = np.full(size, spec.fixed_delay_ms, np.int64)
    elif spec.mix == "uniform":
        delay = _uniform_ms(streams[2].random(size), *UNIFORM_RANGE)
    else:  # the realistic mix of delayindex.workload: pick a component, then a delay in it
        edges = np.array([edge for edge, _, _ in REALISTIC_COMPONENTS[:-1]])
        component = np.searchsorted(edges, streams[1].random(size), side="right")
        low = np.array([c[1] for c in REALISTIC_COMPONENTS], np.int64)[component]
        high = np.array([c[2] for c in REALISTIC_COMPONENTS], np.int64)[component]
        delay = _uniform_ms(streams[2].random(size), low, high)
    deliver = publish + delay
    if spec.mix == "midnight-burst":
        burst = streams[3].random(size) < MIDNIGHT_BURST_SHARE
        deliver[burst] = (publish[burst] // DAY_MS + 1) * DAY_MS  # exact ties, as cron does
    deliver[~delayed] = NOT_DELAYED
    ledgers = index // spec.per_ledger
    ledgers += spec.first_ledger
    entries = index % spec.per_ledger
    return DumpColumns(ledgers, entries, deliver, publish)


def iter_generated(
    n: int,
    *,
    entries_per_ledger: int = 1000,
    delayed_fraction: float = 0.5,
    delay_mix: str = "realistic",
    seed: int = 7,
    start_ms: int = DEFAULT_START_MS,
    first_ledger: int = 1,
    publish_rate: int = 10_000,
    fixed_delay_ms: int = 60_000,
) -> Iterator[DumpColumns]:
    """:func:`generate_dump`'s rows in chunks of :data:`GEN_BLOCK_ROWS` (arguments checked now).

    Concatenated, the chunks equal ``generate_dump(n, ...)``; ``gen-dump`` writes them one by
    one so memory stays bounded for any ``n``.
    """
    spec = check_generator_args(
        n,
        seed=seed,
        entries_per_ledger=entries_per_ledger,
        delayed_fraction=delayed_fraction,
        delay_mix=delay_mix,
        publish_rate=publish_rate,
        start_ms=start_ms,
        first_ledger=first_ledger,
        fixed_delay_ms=fixed_delay_ms,
        n_name="n",
        burst_max_delay_ms=_MAX_REALISTIC_DELAY,  # the rest of the burst mix is realistic
    )
    blocks = -(-spec.n // GEN_BLOCK_ROWS)
    return (_generate_block(spec, block) for block in range(blocks))


def generate_dump(
    n: int,
    *,
    entries_per_ledger: int = 1000,
    delayed_fraction: float = 0.5,
    delay_mix: str = "realistic",
    seed: int = 7,
    start_ms: int = DEFAULT_START_MS,
    first_ledger: int = 1,
    publish_rate: int = 10_000,
    fixed_delay_ms: int = 60_000,
) -> DumpColumns:
    """A realistic, deterministic dump of ``n`` messages in topic order (vectorized numpy).

    Message ``i`` is at ``(first_ledger + i // entries_per_ledger, i % entries_per_ledger)``,
    published at ``start_ms + i * 1000 // publish_rate``, and delayed with probability
    ``delayed_fraction``. Delays by ``delay_mix``:

    * ``fixed``: ``fixed_delay_ms`` (60 s);
    * ``uniform``: 1 s to 1 h;
    * ``realistic``: :mod:`delayindex.workload`'s mix: 70 % 1-60 s, 25 % 1-60 min,
      5 % 1-10 days;
    * ``midnight-burst``: :data:`MIDNIGHT_BURST_SHARE` of the delayed messages are due exactly
      at the next UTC midnight after their publish time, the rest realistic.

    Row ``i`` depends only on the arguments (``n`` aside) and its block of
    :data:`GEN_BLOCK_ROWS` rows, so a smaller ``n`` gives a prefix of a larger one. Ten million
    rows take about a second.

    Raises:
        TypeError: an integer argument is not an int (``bool`` is refused).
        ValueError: an argument is out of range, an unknown mix, or int64 overflow.
    """
    chunks = iter_generated(
        n,
        entries_per_ledger=entries_per_ledger,
        delayed_fraction=delayed_fraction,
        delay_mix=delay_mix,
        seed=seed,
        start_ms=start_ms,
        first_ledger=first_ledger,
        publish_rate=publish_rate,
        fixed_delay_ms=fixed_delay_ms,
    )
    # Fill preallocated columns block by block: no second full-size copy for a concat.
    result = DumpColumns(*(np.zeros(n, np.int64) for _ in range(4)))
    lo = 0
    for chunk in chunks:
        hi = lo + len(chunk)
        for name in ("ledger_ids", "entry_ids", "deliver_at", "publish_time"):
            getattr(result, name)[lo:hi] = getattr(chunk, name)
        lo = hi
    return result
