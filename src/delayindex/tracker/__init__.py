"""Trackers: the in-memory reference tracker (and, later, the bucket-based DelayIndex)."""

from delayindex.tracker.in_memory import InMemoryTracker

__all__ = ["InMemoryTracker"]
