"""The ``delayindex`` command line.

* ``delayindex demo``: the main job (``delayindex.demo``): gen-dump, Spark rebuild, open,
  dispatch on a manual clock, verify the store against the dump, drain; every check must hold.
* ``delayindex simulate``: a dispatcher simulation over InMemoryTracker that verifies every
  delivery (``delayindex.simulate``).
* ``delayindex inspect --store PATH [--name N]... [--json]``: per name, the live buckets (ledger
  range, segments, messages, bytes, the segment recovery would load and the next delivery time),
  pending intents, dead letters, the persisted mark-delete position, the writer's last reported
  unpersisted counts and whether a writer holds the name (``delayindex.storeinfo``). Read-only.
  ``--schedule [--bins N] [--from T] [--to T] [--plot FILE.png]`` adds each name's pending
  schedule as a histogram with bars (``--plot``: also as a PNG, one name, needs matplotlib),
  read offline like the rest (``delayindex.schedule``; ``schedule``).
* ``delayindex pending STORE NAME [--from T] [--to T] [--limit N] [--json] [--now-ms]``: the
  pending positions of a time range in delivery order, read offline (``schedule``).
* ``delayindex gc --store PATH [--grace 10m] [--delete] [--retry-dead-letters] [--now-ms]``:
  objects no manifest references, unfinished intents and dead letters
  (``delayindex.garbage``). A dry run unless ``--delete``; never touches an object younger
  than the grace period (ages are measured at ``--now-ms``, default now) or one any manifest
  references.
* ``delayindex fsck --store PATH [--name N]... [--json] [--no-progress]``: read every object
  in full (header, metadata with its bitmaps checked, every segment decoded) and every manifest
  and manifest history generation, and report each damaged one by file and what is wrong
  (``delayindex.fsck``). Read-only. Exit 1 on any damage, 0 when clean.
* ``delayindex gen-dump OUT --messages N [--entries-per-ledger] [--delayed-fraction]
  [--delay-mix] [--seed] [--format] [--start-ms]``: write a synthetic topic dump
  (``delayindex.dump``, ``docs/dump-format.md``) in chunks, with a progress bar. Needs pyarrow
  (the ``spark`` extra). OUT must not exist unless ``--force``; it appears only when complete.
* ``delayindex rebuild DUMP --store PATH --name N [--now-ms] [--mark-delete L:E] [--master]
  [--fail-on-rejected] [--format] [--json]``: rebuild an index from a topic dump with Spark
  (``delayindex.spark``; the store is created if missing). Config flags
  ``--min-index-count-per-bucket``, ``--max-num-buckets``, ``--tick-ms``, ``--strict-delivery``.
* ``delayindex verify DUMP --store PATH --name N [--now-ms] [--mark-delete L:E] [--report
  FILE.json] [--json] [--no-spark]``: check a store against a topic dump (every expected
  position in exactly one bucket with its deliver time, no extra position, checksums, manifest,
  orphans); writes the JSON report to ``--report`` and a readable summary. Rejected dump rows
  are reported, but only store findings fail the check.
* ``delayindex repair --store PATH --name N (--dump DUMP | --release)``: rebuild quarantined
  buckets from a topic dump, or release them (``repair``).
* ``delayindex clear STORE NAME [--subscription S] [--json]``: clear an index (a shared one's
  subscriptions stay, their marks reset), or drop one subscription of a shared index
  (``shared``).
* ``delayindex migrate STORE --to TOPIC --from SUB=INDEX... [--dump DUMP] [--keep-old]``: build
  one shared index from per-subscription indexes, verify it per subscription, then clear the old
  ones (``shared``; ``delayindex.rebuild.migrate``).

``rebuild`` and ``verify`` take ``--subscription NAME[=L:E]`` (repeatable) to build or check a
shared index; ``inspect`` lists a shared index's subscriptions with their backlogs.
* ``delayindex bench [--quick | --full] [--json-out FILE] [--benchmarks-dir DIR] [-k EXPR]``:
  run the repository's benchmark suite (``benchmarks/``, pytest-benchmark; only a checkout
  has it) in-process, write pytest-benchmark's JSON and print each benchmark's ratio to the
  heapq baseline of its group (``benchmarks/gate.py`` computes the ratios).

``--store`` is a FileStorage directory; it must exist (it is never created). ``--json`` prints
one JSON document on stdout (keys documented in the README; tables and progress bars are for
humans and go to stdout and stderr respectively).

Grace periods (``--grace``): ``0``, or a whole number with a unit: ``ms``, ``s``, ``m``, ``h``,
``d`` (``500ms``, ``30s``, ``10m``, ``2h``, ``1d``). A bare number other than 0 is refused, so
that ``--grace 600`` cannot silently mean 600 ms. Default ``10m``.

Exit codes:

====  =======================================================================================
0     success; for ``inspect``/``gc``: nothing wrong, nothing left to collect
1     a check found problems: ``demo``/``simulate`` found a lost, duplicated or early
      delivery (or ``demo``'s verify a mismatch); ``gc`` (dry run) found garbage or unfinished
      intents, or could not delete something; dead letters remain; ``inspect`` found a missing
      or unreadable snapshot; ``verify`` found a store mismatch; ``rebuild --fail-on-rejected``
      (old spelling ``--strict``) found rejected dump rows; a ``bench`` benchmark failed its
      own checks; ``fsck`` found a damaged object, manifest or manifest history generation;
      ``clear`` found no such name or subscription; ``migrate`` was refused, or its build or
      verify failed (no old index touched); ``inspect --schedule``/``pending`` found a
      missing or damaged snapshot (its positions are not counted)
2     bad usage: bad arguments, a store directory that does not exist, an unknown ``--name``
      (or ``pending`` NAME), ``--from`` not before ``--to``, matplotlib missing (``--plot``);
      an unreadable dump or one missing a column; pyspark or Java missing (``rebuild``);
      no benchmarks directory or pytest-benchmark missing (``bench``)
3     store error: a damaged manifest (``gc`` then deletes nothing), an I/O failure, a name
      whose writer lock is held (``rebuild``, ``clear``, ``migrate``), deletes left pending
      (``clear``)
====  =======================================================================================

Layout of this package: ``_common`` (exit codes, argparse types, the shared options with their
defaults from ``TrackerConfig``, store checks, formatting, error and JSON printing, progress
bars, the error-mapping :func:`~delayindex.cli._common.handler`), then one module per command
family, each with a ``register(sub)`` that adds its subcommands and binds their handlers with
``set_defaults(func=...)``: ``demo`` (demo, simulate), ``store`` (inspect, gc, fsck),
``schedule`` (pending, and inspect's ``--schedule`` rendering and ``--plot``), ``gendump``
(gen-dump), ``rebuild`` (rebuild, verify), ``bench``, ``repair`` and ``shared`` (clear,
migrate). :func:`main` parses and calls ``args.func``.

Two spellings were renamed to say what they mean; the old one still works: ``rebuild``/``verify
--strict`` is ``--fail-on-rejected`` (fail on rejected dump rows) and ``simulate --strict`` is
``--strict-delivery`` (TrackerConfig.strict, as in ``rebuild``/``verify``).
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import os
import sys
import threading
from collections.abc import Sequence
from typing import NoReturn

from rich.console import Console

from delayindex import __version__, _impl
from delayindex._memory import tune_allocator
from delayindex.cli import bench, demo, gendump, rebuild, repair, schedule, shared, store
from delayindex.cli._common import (
    EXIT_CHECK_FAILED,
    EXIT_CODES_HELP,
    EXIT_OK,
    EXIT_STORE_ERROR,
    EXIT_USAGE,
    GRACE_UNITS,
    MAX_ROWS,
    _mark_delete,
    _UsageError,
    parse_grace,
)
from delayindex.cli.bench import find_benchmarks_dir

__all__ = [
    "EXIT_CHECK_FAILED",
    "EXIT_CODES_HELP",
    "EXIT_OK",
    "EXIT_STORE_ERROR",
    "EXIT_USAGE",
    "GRACE_UNITS",
    "MAX_ROWS",
    "_UsageError",
    "_mark_delete",
    "build_parser",
    "find_benchmarks_dir",
    "main",
    "parse_grace",
]


def build_parser() -> argparse.ArgumentParser:
    """The argument parser for every subcommand; each binds its handler as ``func``."""
    parser = argparse.ArgumentParser(
        prog="delayindex",
        description=f"Delayed-message index tools. {EXIT_CODES_HELP}",
    )
    parser.add_argument(
        "--version", action="version", version=f"delayindex {__version__}, {_impl.BUILD}"
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for family in (demo, store, schedule, gendump, rebuild, bench, repair, shared):
        family.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run one ``delayindex`` command (``argv``, default ``sys.argv[1:]``); return its exit
    code. The process's own entry point is :func:`entry`."""
    args = build_parser().parse_args(argv)
    # The command is its own process: rebuilds, demos and benches seal and merge big indexes,
    # so pin glibc's mmap threshold (see delayindex._memory) before they allocate.
    tune_allocator()
    return int(args.func(args, Console()))


def entry() -> NoReturn:
    """The ``delayindex`` executable: :func:`main`, then the process's exit.

    After a command that ran Spark, the exit skips the interpreter's teardown of pyspark's and
    py4j's modules (0.3-0.4 s of a 10 s rebuild, doing nothing useful): once the output is
    flushed and the ``atexit`` handlers have run (they remove the session's scratch
    directories), the process ends with :func:`os._exit`. Only when no other non-daemon thread
    is alive, since those would not be waited for; otherwise the exit is the usual one.
    """
    code = main()
    if "pyspark" in sys.modules:
        exit_now(code)
    sys.exit(code)


def exit_now(code: int) -> NoReturn:
    """End the process with ``code`` without the interpreter's teardown (see :func:`entry`),
    or with :func:`sys.exit` when another non-daemon thread is alive."""
    others = [t for t in threading.enumerate() if t is not threading.main_thread()]
    run_exit_handlers = getattr(atexit, "_run_exitfuncs", None)
    if any(not t.daemon for t in others) or run_exit_handlers is None:
        sys.exit(code)
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):  # a closed pipe: nothing more to write
            stream.flush()
    run_exit_handlers()
    os._exit(code)


if __name__ == "__main__":  # pragma: no cover
    entry()
