"""A shared index's subscriptions in an offline build: the one translation into marks.

How it works: a :class:`~delayindex.SharedDelayIndex` keeps one topic index, a
:class:`~delayindex.DelayIndex` whose mark-delete position is the *lowest* of its subscriptions'
marks (what every subscription has acknowledged), and records each subscription's own mark in
the manifest (:class:`~delayindex.storage.manifest.SubscriptionRecord`, sorted by name). An
offline build of a shared index therefore tracks the dump's delayed rows after that lowest mark
(the mark-delete semantics every rebuild already has) and publishes the records with the same
commit. :func:`acknowledged` is that translation, written once: the local rebuild, the Spark
rebuild and both verifies call it, so "subscriptions -> topic mark + records" cannot drift.
A subscription with no mark (None: nothing acknowledged) makes the topic's mark None.

Verify checks a shared index per subscription: of the rows expected after the topic's mark (and
of the positions the store holds), those after a subscription's own mark
(:func:`~delayindex.rebuild.tracked.after_mark`) are what that subscription still has to
receive.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from delayindex.rebuild.tracked import _mark
from delayindex.storage.manifest import SubscriptionRecord

#: Subscriptions as a rebuild takes them: name -> its mark-delete position (None: nothing
#: acknowledged yet).
Subscriptions = Mapping[str, tuple[int, int] | None]


@dataclass(frozen=True)
class Acknowledged:
    """What a build records as acknowledged: the topic index's ``mark_delete`` and, for a
    shared index, the subscription records (sorted by name; empty for a per-subscription
    index)."""

    mark_delete: tuple[int, int] | None
    subscriptions: tuple[SubscriptionRecord, ...] = ()

    @property
    def shared(self) -> bool:
        """Whether this builds a shared index (it has subscriptions)."""
        return bool(self.subscriptions)


def acknowledged(
    mark_delete: object = None, subscriptions: Subscriptions | None = None
) -> Acknowledged:
    """The topic mark and subscription records a build publishes: the one translation.

    Without ``subscriptions`` the build is a per-subscription index with ``mark_delete``. With
    them it is a shared index: the topic's mark is the lowest subscription mark (None when any
    subscription has none) and the records, sorted by name, carry each subscription's mark.

    Raises:
        ValueError: both ``mark_delete`` and ``subscriptions`` given (the topic's mark is the
            subscriptions' lowest), no subscription in the mapping, an id out of range.
        TypeError: a name that is not a non-empty str, a mark that is not a pair of ints,
            ``subscriptions`` not a mapping.
    """
    if subscriptions is None:
        return Acknowledged(_mark(mark_delete))
    if mark_delete is not None:
        raise ValueError(
            "give mark_delete or subscriptions, not both: a shared index's mark-delete "
            "position is the lowest of its subscriptions' marks"
        )
    if not isinstance(subscriptions, Mapping):
        raise TypeError(
            f"subscriptions must map names to marks, got {type(subscriptions).__name__}"
        )
    if not subscriptions:
        raise ValueError("a shared index needs at least one subscription")
    records = tuple(
        SubscriptionRecord(name, _mark(subscriptions[name]))
        for name in sorted(subscriptions, key=_sort_key)
    )
    marks = [r.mark_delete for r in records]
    lowest = None if None in marks else min(m for m in marks if m is not None)
    return Acknowledged(lowest, records)


def subscriptions_data(records: Sequence[SubscriptionRecord]) -> list[dict[str, Any]]:
    """Subscription records as plain data (JSON-ready): ``name`` and ``mark_delete`` (a
    ``[ledger, entry]`` list, or None)."""
    return [
        {"name": r.name, "mark_delete": list(r.mark_delete) if r.mark_delete else None}
        for r in records
    ]


def _sort_key(name: object) -> str:
    if not isinstance(name, str):
        raise TypeError(f"a subscription name must be a str, got {type(name).__name__}")
    return name


__all__ = ["Acknowledged", "Subscriptions", "acknowledged", "subscriptions_data"]
