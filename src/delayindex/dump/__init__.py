"""Topic dumps: the input of an offline rebuild or verify (format: ``docs/dump-format.md``).

A *topic dump* lists the messages of one topic partition, one row per message, with the columns
``ledger_id`` (long), ``entry_id`` (long), ``deliver_at`` (long epoch ms; null or negative means
"not delayed") and optionally ``publish_time`` (long epoch ms). It is stored as Parquet (the
default), JSON Lines (``.jsonl``/``.json``/``.ndjson``) or CSV (``.csv``), optionally gzip/bz2/
zstd-compressed for the text formats (``.csv.gz``), chosen by extension or by ``fmt``. A dump is
one file or a directory of part files (what Spark writes; ``_SUCCESS``, hidden files and
``_temporary`` are ignored, part files are read in name order).

Reading checks every row and never drops one silently. Per row, in this order, the first
failing check names the reason it is rejected:

* ``null_id``: ``ledger_id`` or ``entry_id`` is null (or missing from a JSON object);
* ``wrong_type``: a value is not an integer: a string that is not a base-10 integer, a
  fraction, a float beyond 2**53 (not exact), NaN/infinity, a boolean, a nested value, or a
  value outside the int64 range. Integral floats (``5.0``) and integer strings (``"5"``,
  ``" 5 "``, ``"5.0"``) are accepted: CSV and JSON exporters write longs that way;
* ``negative_id``: ``ledger_id`` or ``entry_id`` is negative;
* ``entry_id_too_large``: ``entry_id >= 2**32`` (a position packs the entry id in 32 bits).

Then positions are compared across the whole dump: if one ``(ledger_id, entry_id)`` appears in
several rows with different (normalized) deliver times, *every* row of that position is
rejected as ``conflicting_duplicate`` (there is no telling which is right); rows repeating a
position with the same deliver time are ``duplicate``: the first (by row number) is kept, the
others are counted but are not errors (``publish_time`` is not compared).

Normalization: ``deliver_at`` null or negative becomes ``-1`` (:data:`NOT_DELAYED`);
``publish_time`` null or negative becomes ``-1`` (unknown). The result of :func:`read_dump`
and :func:`validate_batch` is in position order with unique positions (a topic dump already is:
sorting is skipped then).

Row numbers (``row`` in examples) count from 0 over the whole dump, part files in name order;
``file`` and ``file_row`` locate the row inside its part (CSV line = ``file_row + 2``, JSON
Lines line = ``file_row + 1``).

Spark reuses the same checks: :func:`check_rows` on each partition, or :func:`read_part_file`
on each part file it reads itself (per-row checks only), then
:func:`resolve_duplicates` per ledger group (a position's rows are all in its ledger's group),
then :meth:`RejectReport.merge` on the driver. :func:`validate_batch` does both on one batch.

pyarrow is imported lazily (only reading and writing files needs it; :func:`generate_dump`
does not); without it a clear :class:`ImportError` names the ``spark`` extra.

The package, in reading order: :mod:`~delayindex.dump.schema` (columns, constants,
:class:`DumpColumns`, :class:`DumpError`), :mod:`~delayindex.dump.checks` (the per-row checks),
:mod:`~delayindex.dump.rejects` (:class:`RejectReport`, conflicts and duplicates),
:mod:`~delayindex.dump.formats` (format names, part files), :mod:`~delayindex.dump.readers`,
:mod:`~delayindex.dump.writer` and :mod:`~delayindex.dump.generate`. Every public name is
re-exported here: ``from delayindex.dump import X`` is the API.
"""

from __future__ import annotations

from delayindex.dump.checks import check_rows, validate_batch
from delayindex.dump.formats import detect_format, normalize_format, part_files
from delayindex.dump.generate import MIDNIGHT_BURST_SHARE, generate_dump, iter_generated
from delayindex.dump.readers import read_dump, read_part_file
from delayindex.dump.rejects import (
    RejectReport,
    find_conflicts,
    find_duplicates,
    resolve_duplicates,
)
from delayindex.dump.schema import (
    COLUMNS,
    DUMP_FORMATS,
    ENTRY_ID_LIMIT,
    GEN_BLOCK_ROWS,
    MAX_EXAMPLES,
    NOT_DELAYED,
    OPTIONAL_COLUMNS,
    REASONS,
    REJECT_REASONS,
    REQUIRED_COLUMNS,
    DumpColumns,
    DumpError,
    is_position_sorted,
)
from delayindex.dump.writer import DumpWriter, write_dump

__all__ = [
    "COLUMNS",
    "DUMP_FORMATS",
    "ENTRY_ID_LIMIT",
    "GEN_BLOCK_ROWS",
    "MAX_EXAMPLES",
    "MIDNIGHT_BURST_SHARE",
    "NOT_DELAYED",
    "OPTIONAL_COLUMNS",
    "REASONS",
    "REJECT_REASONS",
    "REQUIRED_COLUMNS",
    "DumpColumns",
    "DumpError",
    "DumpWriter",
    "RejectReport",
    "check_rows",
    "detect_format",
    "find_conflicts",
    "find_duplicates",
    "generate_dump",
    "is_position_sorted",
    "iter_generated",
    "normalize_format",
    "part_files",
    "read_dump",
    "read_part_file",
    "resolve_duplicates",
    "validate_batch",
    "write_dump",
]
