"""Snapshots of sealed buckets: domain types and builder (``format``) and bytes (``codec``)."""

from delayindex.snapshot.format import (
    FORMAT_VERSION,
    Segment,
    SegmentMeta,
    SnapshotMetadata,
    build_snapshot,
    cut_segments,
)

__all__ = [
    "FORMAT_VERSION",
    "Segment",
    "SegmentMeta",
    "SnapshotMetadata",
    "build_snapshot",
    "cut_segments",
]
