"""Trackers: the in-memory reference tracker and the bucket-based DelayIndex."""

from delayindex.tracker.in_memory import InMemoryTracker

__all__ = ["InMemoryTracker"]
