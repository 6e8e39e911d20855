"""The offline skeleton every rebuild runs: reserve, build, publish (or abort), report.

How it works: a :class:`RebuildRun` opens the name's :class:`~delayindex.storage.Catalog`,
which takes the name's writer lock and rolls back what a killed earlier run left, and holds it
until closed. :meth:`RebuildRun.publish` takes a :class:`~delayindex.policy.BucketPlan` and a
caller-supplied *build step*: one commit reserves a create intent per planned range
(``reserve_creates(ranges, replacing_live=True)``), the build step writes every bucket's object
under its reserved key and returns the records (in this process for
:func:`~delayindex.rebuild.rebuild_local`, on Spark executors for
:func:`~delayindex.spark.job.rebuild_dump`), and one commit publishes them
(:func:`~delayindex.rebuild.build.publish_rebuild`): the new buckets become the name's only live
ones, the old ones delete intents, and the mark-delete position (and, for a shared index, the
subscription records that :func:`~delayindex.rebuild.shared.acknowledged` derived it from) is
recorded. If anything fails
once the reservation has started, :func:`~delayindex.rebuild.build.abort_rebuild` rolls the
reservations back at once, its notes are added to the exception, and the exception propagates.
:meth:`RebuildRun.report` then assembles the :class:`RebuildReport` (or a subclass).

Invariants: the lock is held from open to close, so reserve, build and publish see one manifest
history; every object the build step writes is referenced by an intent or a live record from
before it exists (never an orphan; a killed driver's intents are rolled back by the next
``Catalog.open``); until the publish commit the previously live buckets stay live.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, NamedTuple, TypeVar

from delayindex.config import TrackerConfig
from delayindex.policy import BucketPlan
from delayindex.rebuild.build import abort_rebuild, publish_rebuild
from delayindex.rebuild.shared import Acknowledged, acknowledged, subscriptions_data
from delayindex.rebuild.tracked import Tally
from delayindex.storage.base import SnapshotStorage
from delayindex.storage.catalog import Catalog, CrashHook
from delayindex.storage.manifest import BucketRecord, SubscriptionRecord


class ReservedBucket(NamedTuple):
    """One planned range, the key reserved for its object and its tracked indexes."""

    start: int
    end: int
    key: str
    tracked: int


@dataclass(frozen=True)
class Reservation:
    """What a build step is given: the reserved buckets in ledger order, and the origin
    ``(name, generation)`` every object is stamped with (the reservation commit's version)."""

    name: str
    generation: int
    buckets: tuple[ReservedBucket, ...]

    @property
    def origin(self) -> tuple[str, int]:
        """``(name, generation)``, for ``write_bucket(..., origin=...)``."""
        return self.name, self.generation


#: A build step: writes every reserved bucket's object, returns their records in ledger order.
BuildStep = Callable[[Reservation], Sequence[BucketRecord]]


@dataclass(frozen=True)
class Outcome:
    """What :meth:`RebuildRun.publish` did: the published records, the snapshots they replaced,
    the catalog's notes, and seconds per step (``reserve``, ``build``, ``publish``)."""

    records: tuple[BucketRecord, ...]
    replaced: tuple[str, ...]
    notes: tuple[str, ...]
    seconds: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class RebuildReport:
    """What a rebuild did.

    ``rows`` were read; ``tracked`` became indexes, the rest were skipped as ``not_delayed``,
    ``due`` or ``acked`` (:class:`~delayindex.rebuild.Classification`). ``planned_buckets`` is
    the count the sealing rule gave before merging; ``buckets`` are the published records in
    ledger order; ``replaced`` the previously live snapshots that were replaced. A shared
    index's ``subscriptions`` are the published records (``mark_delete`` is their lowest mark).
    """

    name: str
    now_ms: int
    cutoff_ms: int
    rows: int
    tracked: int
    not_delayed: int
    due: int
    acked: int
    planned_buckets: int
    buckets: tuple[BucketRecord, ...]
    replaced: tuple[str, ...] = ()
    mark_delete: tuple[int, int] | None = None
    seconds: float = 0.0
    notes: tuple[str, ...] = ()
    subscriptions: tuple[SubscriptionRecord, ...] = ()

    @property
    def ranges(self) -> list[tuple[int, int]]:
        """The published buckets' ledger ranges."""
        return [(b.start_ledger, b.end_ledger) for b in self.buckets]

    @property
    def snapshot_bytes(self) -> int:
        """Bytes written."""
        return sum(b.snapshot_bytes for b in self.buckets)

    def as_dict(self) -> dict[str, Any]:
        """Plain data (JSON-ready)."""
        out = asdict(self)
        out["mark_delete"] = list(self.mark_delete) if self.mark_delete else None
        out["subscriptions"] = subscriptions_data(self.subscriptions)
        out["snapshot_bytes"] = self.snapshot_bytes
        return out

    def to_json(self, indent: int | None = 2) -> str:
        """The report as JSON."""
        return json.dumps(self.as_dict(), indent=indent, sort_keys=True)


ReportT = TypeVar("ReportT", bound=RebuildReport)


class RebuildRun:
    """A rebuild of one name, holding its catalog (and so its writer lock) until closed.

    Close it in a ``finally`` (or ``with contextlib.closing(...)``); see the module docs for the
    steps and the failure handling.

    Raises (constructor):
        StoreLockedError: another writer holds ``name``.
        StorageError, ManifestConflictError: the catalog could not be opened.
    """

    def __init__(
        self,
        storage: SnapshotStorage,
        name: str,
        config: TrackerConfig,
        *,
        crash_hook: CrashHook | None = None,
    ) -> None:
        self.catalog = Catalog.open(
            storage, name, crash_hook=crash_hook, **config.catalog_settings()
        )
        self._hook = crash_hook
        self._published: tuple[BucketPlan, Acknowledged, Outcome] | None = None

    def close(self) -> None:
        """Release the catalog and the name's lock."""
        self.catalog.close()

    def hook(self, step: str) -> None:
        """Tell the crash hook (a test seam) that ``step`` is done."""
        if self._hook is not None:
            self._hook(step)

    def publish(
        self,
        plan: BucketPlan,
        mark_delete: tuple[int, int] | Acknowledged | None,
        build: BuildStep,
    ) -> Outcome:
        """Reserve the plan's ranges, run ``build``, publish its records with ``mark_delete``
        (a mark, or an :class:`~delayindex.rebuild.shared.Acknowledged`: a shared index's
        topic mark and subscription records).

        The crash hook sees ``rebuild.objects_written`` between the build and the publish.

        Raises:
            whatever the reservation, ``build`` or the publish raised, after rolling the
            reservations back (notes on what the rollback left are added to the exception).
        """
        catalog = self.catalog
        ack = mark_delete if isinstance(mark_delete, Acknowledged) else acknowledged(mark_delete)
        previous = catalog.manifest
        seconds: dict[str, float] = {}
        try:
            # Inside the try: a reservation whose commit landed before an error is ours (we
            # hold the lock), and the abort rolls it back too.
            began = time.perf_counter()
            keys = catalog.reserve_creates(plan.ranges, replacing_live=True)
            buckets = tuple(
                ReservedBucket(start, end, key, tracked)
                for (start, end), key, tracked in zip(plan.ranges, keys, plan.counts, strict=True)
            )
            reservation = Reservation(catalog.name, catalog.manifest.version, buckets)
            seconds["reserve"] = time.perf_counter() - began
            began = time.perf_counter()
            records = tuple(build(reservation))
            seconds["build"] = time.perf_counter() - began
            self.hook("rebuild.objects_written")
            began = time.perf_counter()
            replaced = publish_rebuild(catalog, records, ack.mark_delete, ack.subscriptions)
            seconds["publish"] = time.perf_counter() - began
        except Exception as exc:
            for note in abort_rebuild(catalog, previous.mark_delete, previous.subscriptions):
                exc.add_note(note)
            raise
        outcome = Outcome(records, tuple(replaced), tuple(catalog.problems()), seconds)
        self._published = (plan, ack, outcome)
        return outcome

    def report(
        self,
        cls: type[ReportT],
        *,
        now_ms: int,
        tally: Tally,
        started: float,
        **extra: Any,
    ) -> ReportT:
        """The report of a published run: ``tally``'s counts, the plan's bucket count before
        merging, the outcome, and the seconds since ``started`` (``time.perf_counter()``);
        ``extra`` fills a subclass's own fields.

        Raises:
            RuntimeError: nothing was published.
        """
        if self._published is None:
            raise RuntimeError("report() before a successful publish()")
        plan, ack, outcome = self._published
        return cls(
            name=self.catalog.name,
            now_ms=now_ms,
            **tally._asdict(),
            planned_buckets=plan.sealed,
            buckets=outcome.records,
            replaced=outcome.replaced,
            mark_delete=ack.mark_delete,
            seconds=time.perf_counter() - started,
            notes=outcome.notes,
            subscriptions=ack.subscriptions,
            **extra,
        )
