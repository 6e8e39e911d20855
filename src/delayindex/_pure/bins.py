"""Pure twin of the native ``BinIndex``: ``due_histogram``'s bin counts by binary search."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

Int64Array = npt.NDArray[np.int64]


class BinIndex:
    """Bin lookup for strictly increasing int64 ``edges`` (at least two, checked by the
    caller): bin ``i`` is ``[edges[i], edges[i + 1])``."""

    def __init__(self, edges: Int64Array) -> None:
        self._edges = np.ascontiguousarray(edges, dtype=np.int64)
        if len(self._edges) < 2:
            raise ValueError("edges needs at least two values")

    def counts(self, times: Int64Array) -> Int64Array:
        """How many of ``times`` fall in each bin (times outside the edges are not counted):
        an int64 array of ``len(edges) - 1`` counts."""
        nb = len(self._edges) - 1
        index = np.searchsorted(self._edges, np.asarray(times, dtype=np.int64), side="right") - 1
        index = index[(index >= 0) & (index < nb)]
        return np.bincount(index, minlength=nb).astype(np.int64)
