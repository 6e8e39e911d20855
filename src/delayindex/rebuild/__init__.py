"""Offline rebuild of an index from a topic dump, and verification of a store against a dump.

A *dump* is the topic's messages as columns (``ledger_ids``, ``entry_ids``, ``deliver_at``;
:class:`delayindex.dump.DumpColumns`, or anything with those int64 attributes, such as a
:class:`delayindex.workload.Workload`). Not delayed is ``deliver_at < 0``.

How a rebuild works (no Spark here; the Spark job calls the same functions per partition and
runs the same skeleton), one module per step:

1. ``tracked.py``: :func:`tracked_mask` keeps what :meth:`DelayIndex.add` at ``now_ms`` would
   track: delayed, not due (``deliver_at > cutoff``, :func:`delayindex.policy.cutoff_ms`:
   ``now_ms + tick_ms``, or ``now_ms`` when ``config.strict``) and, when a mark-delete position
   is given, after it (a dispatcher reads the topic from its cursor's mark-delete position on).
2. ``plan.py``: :func:`plan_buckets` turns per-ledger tracked counts into bucket ranges with the
   online tracker's sealing rule, :func:`delayindex.policy.plan_ranges`: in ledger order, the
   first tracked add of a strictly newer ledger seals the mutable bucket once it holds
   ``min_index_count_per_bucket`` indexes. Adds that are not tracked (not delayed, due,
   acknowledged) neither count nor seal, and a ledger with no tracked message belongs to no
   bucket. A rebuild persists everything, so the last bucket is sealed too. If
   ``max_num_buckets > 0`` and there are more buckets, adjacent ones are merged with the online
   selection (:func:`~delayindex.policy.select_merge_window`) until the count fits.
3. ``build.py``: :func:`build_bucket` sorts and cuts one bucket's indexes exactly as the online
   tracker's ``_build`` does (``build_snapshot`` with the config's segment limits);
   :func:`write_bucket`, :func:`publish_rebuild` and :func:`abort_rebuild` are the write and the
   catalog's two commits around it.
4. ``run.py``: the offline skeleton both rebuilds share, :class:`RebuildRun`: the catalog's
   two-phase bulk create: one commit reserves a create intent per range, each object is written
   under its reserved key by a caller-supplied build step, and one commit makes them all live,
   turns every previously live bucket of the name into a delete intent and records the
   mark-delete position. A crash before the publish leaves create intents that the next
   :meth:`Catalog.open` rolls back (no orphan, old buckets untouched); a failure is rolled back
   at once. It assembles the :class:`RebuildReport`.
5. ``local.py``: :func:`rebuild_local`, steps 1-4 in this process. A re-run yields the same
   ranges and snapshot contents (only the random keys differ).

A *shared* index (:class:`~delayindex.SharedDelayIndex`) is built the same way from its
subscriptions and their marks: ``shared.py``'s :func:`acknowledged` turns them into the topic
index's mark (the lowest; step 1 keeps the rows after it) and the subscription records the
publish commit carries. It is the one translation the local and the Spark paths share.

So, for a dump in position order, a rebuild equals online ingestion at ``now_ms`` with merging
off, followed by one add in a newer ledger that seals the last bucket.

``verify.py``: :func:`verify_store` checks a store against a dump: every expected position in
exactly one live bucket with the same deliver time, no extra position, every snapshot fully
decoded, the manifest consistent with its objects and free of pending intents, and the store's
orphans listed. Each finding has a kind from :data:`FINDING_KINDS`. It reads only (no lock).
A shared index is checked per subscription (the rows after its own mark).

Invariants: the functions here never change the dump's arrays; a rebuild changes the store only
through the catalog, so at every instant each object it wrote is referenced by the manifest;
bad input raises ``ValueError``/``TypeError`` before the store is touched. Nothing here imports
``delayindex.tracker``.
"""

from delayindex.rebuild.build import abort_rebuild, build_bucket, publish_rebuild, write_bucket
from delayindex.rebuild.local import Progress, rebuild_local
from delayindex.rebuild.plan import plan_buckets, plan_for
from delayindex.rebuild.run import (
    BuildStep,
    Outcome,
    RebuildReport,
    RebuildRun,
    Reservation,
    ReservedBucket,
)
from delayindex.rebuild.shared import Acknowledged, Subscriptions, acknowledged
from delayindex.rebuild.tracked import (
    Classification,
    PositionColumns,
    Tally,
    after_mark,
    check_arguments,
    classify,
    cutoff_for,
    tracked_mask,
)
from delayindex.rebuild.tracked import _array as _array  # tests import it from here
from delayindex.rebuild.verify import (
    DEFAULT_ORPHAN_GRACE_MS,
    FINDING_KINDS,
    Finding,
    SubscriptionCheck,
    VerifyReport,
    verify_store,
)

__all__ = [
    "DEFAULT_ORPHAN_GRACE_MS",
    "Acknowledged",
    "FINDING_KINDS",
    "BuildStep",
    "Classification",
    "Finding",
    "Outcome",
    "PositionColumns",
    "Progress",
    "RebuildReport",
    "RebuildRun",
    "Reservation",
    "ReservedBucket",
    "SubscriptionCheck",
    "Subscriptions",
    "Tally",
    "VerifyReport",
    "abort_rebuild",
    "acknowledged",
    "after_mark",
    "build_bucket",
    "check_arguments",
    "classify",
    "cutoff_for",
    "plan_buckets",
    "plan_for",
    "publish_rebuild",
    "rebuild_local",
    "tracked_mask",
    "verify_store",
    "write_bucket",
]
