"""delayindex: a compact, crash-safe index of delayed (scheduled) messages for dispatchers.

The public API is re-exported here; everything else is internal.
"""

from delayindex._impl import NATIVE, wall_clock_ms
from delayindex._memory import tune_allocator
from delayindex._version import __version__
from delayindex.clock import ManualClock
from delayindex.config import TrackerConfig
from delayindex.errors import (
    DelayIndexError,
    RecoveryError,
    SnapshotCorruptError,
    StorageError,
    TrackerClosedError,
)
from delayindex.model import Position
from delayindex.storage import FileStorage, MemoryStorage
from delayindex.timers import AsyncioTimer, ManualTimer, ThreadingTimer, Timer, TimerHandle
from delayindex.tracker import InMemoryTracker
from delayindex.tracker._damage import QuarantineInfo, RepairResult
from delayindex.tracker.delay_index import BucketInfo, DelayIndex
from delayindex.tracker.shared import SharedDelayIndex
from delayindex.tracker.subscription import Subscription

__all__ = [
    "NATIVE",
    "AsyncioTimer",
    "BucketInfo",
    "DelayIndex",
    "DelayIndexError",
    "FileStorage",
    "InMemoryTracker",
    "ManualClock",
    "ManualTimer",
    "MemoryStorage",
    "Position",
    "QuarantineInfo",
    "RecoveryError",
    "RepairResult",
    "SharedDelayIndex",
    "SnapshotCorruptError",
    "StorageError",
    "Subscription",
    "ThreadingTimer",
    "Timer",
    "TimerHandle",
    "TrackerClosedError",
    "TrackerConfig",
    "__version__",
    "tune_allocator",
    "wall_clock_ms",
]
