"""Tracker configuration: one frozen, validated dataclass instead of positional knobs.

A :class:`TrackerConfig` is also the one place that translates its fields into the keyword
arguments of what it configures: :meth:`~TrackerConfig.core_settings` and
:meth:`~TrackerConfig.bucket_core_settings` (the cores), :meth:`~TrackerConfig.catalog_settings`
(``Catalog.open``) and :meth:`~TrackerConfig.builder_settings` (``build_snapshot``). The online
drivers, the local rebuild and the Spark job all pass these, so a renamed or added setting is
wired in here once. Each returns a TypedDict, so ``**`` use is type-checked against the callee.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TypedDict


class CoreSettings(TypedDict):
    """Keyword arguments of a ``TrackerCore`` (InMemoryTracker's core)."""

    tick_ms: int
    strict: bool
    fixed_delay_lookahead: int


class BucketCoreSettings(CoreSettings):
    """Keyword arguments of a ``BucketCore`` (DelayIndex's core)."""

    min_index_count_per_bucket: int


class CatalogSettings(TypedDict):
    """Keyword arguments of ``Catalog.open`` that come from the config."""

    max_delete_attempts: int
    delete_retry_delay_ms: int


class BuilderSettings(TypedDict):
    """Keyword arguments of ``build_snapshot`` that come from the config (segment limits)."""

    max_time_step_ms: int
    max_indexes_per_segment: int


@dataclass(frozen=True, slots=True)
class TrackerConfig:
    """Settings shared by :class:`InMemoryTracker` and :class:`DelayIndex`.

    Every field is checked in ``__post_init__``; a bad value raises ``ValueError`` (or
    ``TypeError`` for a wrong type) naming the field. Defaults follow Pulsar's, except
    ``max_num_buckets``, which is on (50) because merging is what keeps the bucket count bounded.
    """

    #: Tick: non-strict cutoff slack and the minimum interval between timer fires.
    tick_ms: int = 1000
    #: Never deliver before ``deliver_at`` (cutoff = now instead of now + tick).
    strict: bool = False
    #: Seal the mutable bucket once it holds this many indexes and a newer ledger arrives.
    min_index_count_per_bucket: int = 50_000
    #: Maximum time span of one snapshot segment.
    max_time_step_per_segment_ms: int = 300_000
    #: Maximum indexes per segment; -1 means unlimited.
    max_indexes_per_segment: int = 5_000
    #: More sealed buckets than this triggers trim and merge; <= 0 disables both.
    max_num_buckets: int = 50
    #: Fixed-delay detection threshold (Pulsar's lookahead); 0 disables it.
    fixed_delay_lookahead: int = 50_000
    #: Pause deliveries while more than ``max_unpersisted_indexes`` live only in memory.
    pause_on_unpersisted: bool = False
    #: The bound used by ``pause_on_unpersisted``.
    max_unpersisted_indexes: int = 1_000_000
    #: A snapshot delete failing this many times moves to the dead-letter list.
    max_delete_attempts: int = 10
    #: First retry delay of a failed delete (or snapshot write); later retries back off from it.
    delete_retry_delay_ms: int = 60_000
    #: Group commit: most snapshot creates and deletes made durable by one pair of manifest
    #: writes (PIP-160's ``maxRecords``); 1 turns group commit off.
    group_commit_max_ops: int = 512
    #: Group commit: a batch stops taking sealed buckets once their snapshots hold this many
    #: bytes (PIP-160's ``maxSize``): the batch's snapshots are in memory until written.
    group_commit_max_bytes: int = 4 * 1024 * 1024
    #: Group commit: how long the writer waits for more changes before writing a batch that is
    #: not full (PIP-160's ``maxDelayInMillis``); 0 writes whatever has accumulated at once.
    group_commit_max_delay_ms: int = 1
    #: First retry delay of a segment read that failed with a storage error (not damage); later
    #: retries of that bucket back off from it, while every other bucket keeps delivering.
    load_retry_delay_ms: int = 1000
    #: Shared index: due keys kept in memory for the subscriptions that have yet to read them;
    #: older ones (held for a slow or stopped subscription) spill to temporary files.
    due_log_memory_keys: int = 16_384

    def __post_init__(self) -> None:
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if field.type == "bool":
                if not isinstance(value, bool):
                    raise TypeError(f"TrackerConfig.{field.name} must be a bool, got {value!r}")
            elif isinstance(value, bool) or not isinstance(value, int):
                raise TypeError(f"TrackerConfig.{field.name} must be an int, got {value!r}")
            elif value >= _SETTING_LIMIT:  # keeps every setting far inside the native int64 range
                raise ValueError(f"TrackerConfig.{field.name} must be < 2**62, got {value}")
        _at_least("tick_ms", self.tick_ms, 0)
        _at_least("min_index_count_per_bucket", self.min_index_count_per_bucket, 1)
        _at_least("max_time_step_per_segment_ms", self.max_time_step_per_segment_ms, 1)
        if self.max_indexes_per_segment != -1:
            _at_least("max_indexes_per_segment", self.max_indexes_per_segment, 1, "or -1")
        _at_least("fixed_delay_lookahead", self.fixed_delay_lookahead, 0)
        _at_least("max_unpersisted_indexes", self.max_unpersisted_indexes, 0)
        _at_least("max_delete_attempts", self.max_delete_attempts, 1)
        _at_least("delete_retry_delay_ms", self.delete_retry_delay_ms, 0)
        _at_least("load_retry_delay_ms", self.load_retry_delay_ms, 0)
        _at_least("group_commit_max_ops", self.group_commit_max_ops, 1)
        _at_least("group_commit_max_bytes", self.group_commit_max_bytes, 1)
        _at_least("group_commit_max_delay_ms", self.group_commit_max_delay_ms, 0)
        _at_least("due_log_memory_keys", self.due_log_memory_keys, 1)

    def core_settings(self) -> CoreSettings:
        """The ``TrackerCore`` arguments: cutoff slack, strictness, fixed-delay lookahead."""
        return CoreSettings(
            tick_ms=self.tick_ms,
            strict=self.strict,
            fixed_delay_lookahead=self.fixed_delay_lookahead,
        )

    def bucket_core_settings(self) -> BucketCoreSettings:
        """The ``BucketCore`` arguments: :meth:`core_settings` and the sealing minimum."""
        return BucketCoreSettings(
            **self.core_settings(), min_index_count_per_bucket=self.min_index_count_per_bucket
        )

    def catalog_settings(self) -> CatalogSettings:
        """The ``Catalog.open`` arguments: how failed deletes are retried and dead-lettered."""
        return CatalogSettings(
            max_delete_attempts=self.max_delete_attempts,
            delete_retry_delay_ms=self.delete_retry_delay_ms,
        )

    def builder_settings(self) -> BuilderSettings:
        """The ``build_snapshot`` arguments: how a bucket is cut into segments."""
        return BuilderSettings(
            max_time_step_ms=self.max_time_step_per_segment_ms,
            max_indexes_per_segment=self.max_indexes_per_segment,
        )

    def replace(self, **changes: object) -> TrackerConfig:
        """Return a copy with ``changes`` applied (and validated)."""
        return dataclasses.replace(self, **changes)  # type: ignore[arg-type]


_SETTING_LIMIT = 2**62


def _at_least(name: str, value: int, minimum: int, alternative: str = "") -> None:
    if value < minimum:
        extra = f" {alternative}" if alternative else ""
        raise ValueError(f"TrackerConfig.{name} must be >= {minimum}{extra}, got {value}")
