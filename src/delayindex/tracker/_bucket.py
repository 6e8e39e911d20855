"""DelayIndex's record of a sealed bucket: ``_Bucket`` (driver side), the public
``BucketInfo`` that :meth:`DelayIndex.buckets` reports, and ``_PendingCreate`` (a sealed bucket
waiting for its snapshot write)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from delayindex.storage.manifest import QuarantineRecord

_EMPTY = np.empty(0, dtype=np.int64)
Int64Array = npt.NDArray[np.int64]


@dataclass(frozen=True)
class BucketInfo:
    """One sealed bucket, as :meth:`DelayIndex.buckets` reports it.

    ``state`` is ``"creating"`` (snapshot being written), ``"durable"`` (snapshot live in the
    manifest), ``"memory"`` (create failed; held in memory), ``"merging"`` (durable, being
    merged), ``"quarantined"`` (snapshot damaged or missing: positions held, not delivered until
    repaired or released; see :meth:`DelayIndex.quarantined`) or ``"released"`` (a quarantined
    bucket whose positions were released: due now). ``loaded_segment`` is the 1-based number
    of the last segment read into memory (0: none yet, or the whole bucket is in memory);
    ``num_messages`` counts the indexes written to the snapshot.
    """

    start_ledger: int
    end_ledger: int
    num_segments: int
    loaded_segment: int
    num_messages: int
    snapshot_id: str | None
    snapshot_bytes: int
    state: str


class _Bucket:
    """Driver-side record of a sealed bucket (the core knows it only as a source id)."""

    __slots__ = (
        "bounds", "current", "damage", "end", "exhausted", "folded", "load_failures", "maxs",
        "merging",
        "mins", "num_messages", "positions_known", "sid", "snapshot_bytes", "snapshot_id",
        "start", "state",
    )  # fmt: skip

    def __init__(self, sid: int, start: int, end: int, num_messages: int) -> None:
        self.sid = sid
        self.start = start
        self.end = end
        self.state = "creating"
        self.snapshot_id: str | None = None
        self.snapshot_bytes = 0
        self.num_messages = num_messages
        self.current = 0  # 1-based segment in memory; 0: all of it is in memory
        self.mins: Int64Array = np.empty(0, dtype=np.int64)
        self.bounds: Int64Array = np.empty(0, dtype=np.int64)  # cumulative counts per segment
        self.maxs: Int64Array = np.empty(0, dtype=np.int64)  # per segment: its largest time
        self.merging = False
        self.exhausted = False
        self.load_failures = 0  # consecutive failed segment reads (transient storage errors)
        self.damage: QuarantineRecord | None = None  # set while quarantined or released
        self.positions_known = False  # quarantined: its positions are still tracked
        self.folded = 0  # cancels a merge folded into its snapshot (held there, not in memory)

    @property
    def num_segments(self) -> int:
        return len(self.mins)

    def has_unloaded(self) -> bool:
        """Durable, with a segment not read into memory yet."""
        return self.state == "durable" and self.current < self.num_segments

    def mergeable(self) -> bool:
        """Whether a merge may take this bucket: durable and idle. Loaded segments do not
        matter: a merge reads every segment back from the snapshot and keeps what is tracked,
        so the bucket's in-memory run can go when the merged bucket replaces it."""
        return (
            self.state == "durable"
            and self.snapshot_id is not None
            and not self.merging
            and not self.exhausted
        )

    def indexes_before(self, segment: int) -> int:
        """Indexes in the segments before 1-based ``segment`` (where its rows start when
        segments are read together)."""
        return int(self.bounds[segment - 2]) if segment > 1 else 0

    def next_time(self, segment: int) -> int:
        """Min deliver time of 1-based ``segment + 1`` (-1 when there is none)."""
        return int(self.mins[segment]) if segment < self.num_segments else -1

    def info(self) -> BucketInfo:
        state = "merging" if self.merging else self.state
        return BucketInfo(
            self.start, self.end, self.num_segments, self.current, self.num_messages,
            self.snapshot_id, self.snapshot_bytes, state,
        )  # fmt: skip


@dataclass
class _PendingCreate:
    """A sealed bucket waiting for its snapshot write (its unsorted copy of the indexes)."""

    bucket: _Bucket
    times: Int64Array
    ledgers: Int64Array
    entries: Int64Array
    epoch: int
    enqueued: float = field(default_factory=time.monotonic)
    attempts: int = 0


__all__ = ["BucketInfo", "Int64Array"]
