"""Pure rules shared by the online driver, the catalog and the offline tools.

Each rule is written once here and called from everywhere it applies, so that the online
tracker, a local rebuild and the Spark job cannot drift apart.
"""

from __future__ import annotations

#: Largest multiplier a retry backoff reaches (the delay doubles per failure up to this).
MAX_BACKOFF_FACTOR = 64


def backoff_delay_ms(base_ms: int, attempts: int) -> int:
    """Delay before the next retry after ``attempts`` failures (``attempts >= 1``).

    ``base_ms`` after the first failure, doubling per further failure, at most
    ``base_ms * MAX_BACKOFF_FACTOR``: a failing operation is retried ever less often, but never
    abandoned silently.

    >>> [backoff_delay_ms(1000, n) for n in (1, 2, 3, 10)]
    [1000, 2000, 4000, 64000]
    """
    return int(base_ms * min(2 ** max(attempts - 1, 0), MAX_BACKOFF_FACTOR))
