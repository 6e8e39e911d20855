"""One rebuilt bucket and the two commits around it: build, write, publish, abort.

How it works: :func:`build_bucket` sorts and cuts one bucket's indexes exactly as the online
tracker's ``_build`` does (``build_snapshot`` with the config's
:meth:`~delayindex.config.TrackerConfig.builder_settings`); :func:`write_bucket` writes it under
its reserved key and returns the record to publish (it runs wherever the storage is reachable,
a Spark executor included). :func:`publish_rebuild` is phase 2 of the catalog's bulk create and
:func:`abort_rebuild` its rollback; :mod:`delayindex.rebuild.run` sequences them.

Invariants: an object is only ever written under a key the catalog reserved, so it is referenced
by the manifest (an intent, then a live record) from before it exists until it is deleted.
"""

from __future__ import annotations

from collections.abc import Sequence

from delayindex.config import TrackerConfig
from delayindex.errors import ManifestConflictError, SnapshotCorruptError, StorageError
from delayindex.rebuild.tracked import Int64Array, _config, _mark
from delayindex.snapshot.format import PreparedSegments, SnapshotMetadata, build_snapshot
from delayindex.storage.base import SnapshotStorage
from delayindex.storage.catalog import Catalog
from delayindex.storage.manifest import BucketRecord, SubscriptionRecord


def build_bucket(
    times: Int64Array,
    ledgers: Int64Array,
    entries: Int64Array,
    start: int,
    end: int,
    config: TrackerConfig,
    *,
    validate: bool = True,
) -> tuple[SnapshotMetadata, PreparedSegments]:
    """Sort, cut and describe one bucket's indexes exactly as the online tracker does.

    ``validate`` checks that no position appears twice (the online tracker skips it: its
    positions come from a dedup index); pass False only for rows already known distinct.

    Raises:
        ValueError: empty input, a ledger outside ``[start, end]``, a position twice, ids out of
            range. TypeError: bad config.
    """
    config = _config(config)
    return build_snapshot(
        times,
        ledgers,
        entries,
        **config.builder_settings(),
        start_ledger=start,
        end_ledger=end,
        validate=validate,
    )


def write_bucket(
    storage: SnapshotStorage,
    key: str,
    metadata: SnapshotMetadata,
    segments: PreparedSegments,
    *,
    origin: tuple[str, int] | None = None,
) -> BucketRecord:
    """Write one reserved bucket's object under ``key``; return the record to publish.

    Runs anywhere the storage is reachable (a Spark executor); the record goes back to whoever
    holds the catalog, for :func:`publish_rebuild`. ``origin`` is ``(name, generation)``: the
    index and the manifest version of the reservation's commit, stamped into the object so that
    it describes itself (``SnapshotMetadata.with_origin``).

    Raises:
        StorageError, SnapshotExistsError: the write failed; ValueError: bad key or segments.
    """
    if origin is not None:
        metadata = metadata.with_origin(*origin)
    storage.create(metadata, segments, key)
    size = storage.length(key)
    return BucketRecord(
        metadata.start_ledger,
        metadata.end_ledger,
        key,
        metadata.num_messages,
        metadata.num_segments,
        size,
    )


# -- 4. the two-phase commit --------------------------------------------------------------------


def publish_rebuild(
    catalog: Catalog,
    records: Sequence[BucketRecord],
    mark_delete: tuple[int, int] | None,
    subscriptions: Sequence[SubscriptionRecord] = (),
) -> list[str]:
    """Phase 2 of a rebuild: make ``records`` the name's only live buckets, with ``mark_delete``.

    One commit publishes the reserved buckets, turns every other live bucket into a delete
    intent and records the mark-delete position and a shared index's ``subscriptions`` (sorted
    by name; None and empty clear old ones: the rebuilt buckets hold exactly what the dump says
    is unacknowledged); the replaced objects are then deleted (failures stay as pending
    intents). Returns the replaced snapshot ids.

    Raises:
        ValueError: a record does not match its reservation (see ``Catalog.publish_creates``),
            or the subscriptions are not sorted by name.
        StorageError, ManifestConflictError: the commit failed; call :func:`abort_rebuild`.
    """
    catalog.note_mark_delete(_mark(mark_delete))  # carried by the publish commit
    catalog.note_subscriptions(tuple(subscriptions))
    replaced = catalog.publish_creates(records, replace_live=True)
    catalog.persist_mark_delete()  # a no-op unless the publish left it pending
    return replaced


def abort_rebuild(
    catalog: Catalog,
    previous_mark: tuple[int, int] | None,
    previous_subscriptions: Sequence[SubscriptionRecord] = (),
) -> list[str]:
    """Undo a rebuild that reserved but did not publish: roll back its create intents now.

    ``previous_mark`` and ``previous_subscriptions`` are the manifest's mark-delete position
    and subscription records before the rebuild (restored, so a rollback never persists the new
    ones). Failures are not raised: what is left stays as intents for the next
    :meth:`Catalog.open` to roll back. Returns notes on what was left.
    """
    notes: list[str] = []
    try:
        catalog.note_mark_delete(previous_mark)
        catalog.note_subscriptions(tuple(previous_subscriptions))
        report = catalog.retry_pending_deletes(force=True)
    except (StorageError, ManifestConflictError, SnapshotCorruptError, ValueError) as exc:
        return [f"rollback failed ({exc}); the next open rolls the reservations back"]
    notes.extend(f"delete of {i!r} still pending" for i in (*report.failed, *report.dead_lettered))
    notes.extend(catalog.problems())
    return notes
