"""The dump writer: columns to one Parquet, CSV or JSON Lines file, atomically.

Rows go to a temporary file next to the target, renamed over it on :meth:`DumpWriter.close`;
an exception removes it, so a dump file is either whole or absent. The writer only writes valid
dumps (ids checked); rows not delayed, and unknown publish times, are written as null. Chunks
are cut to ``GEN_BLOCK_ROWS`` rows so text buffers stay bounded.
"""

from __future__ import annotations

import bz2
import contextlib
import gzip
import os
from pathlib import Path
from types import TracebackType
from typing import Any, Self

import numpy as np

from delayindex.dump.formats import normalize_format, split_suffix
from delayindex.dump.schema import (
    ENTRY_ID_LIMIT,
    GEN_BLOCK_ROWS,
    REQUIRED_COLUMNS,
    DumpColumns,
    DumpError,
    arrow,
    arrow_mod,
)


class DumpWriter:
    """Writes a dump file chunk by chunk; the file appears (atomically) only on success.

    Rows go to a temporary file next to ``path``, renamed over ``path`` by :meth:`close`;
    :meth:`abort` (or leaving the ``with`` block on an exception) removes it. ``deliver_at``
    of a message that is not delayed is written as null, so is an unknown ``publish_time``.
    Parquet goes through one ``ParquetWriter`` (a row group per chunk), CSV through pyarrow's
    ``CSVWriter``, JSON Lines as text built with vectorized string kernels.

    Args:
        path: the file to write (a compression suffix ``.gz``/``.bz2``/``.zst`` compresses
            the text formats).
        fmt: ``parquet``, ``jsonl`` or ``csv``; default: from the extension, else Parquet.

    Raises:
        DumpError: an unknown format, or a compression suffix on a Parquet file.
    """

    def __init__(self, path: str | os.PathLike[str], fmt: str | None = None) -> None:
        """Choose the format; nothing is written before the first :meth:`write`."""
        self.path = Path(path)
        by_name, compression = split_suffix(self.path)
        self.fmt = normalize_format(fmt) or by_name or "parquet"
        if self.fmt == "parquet" and compression is not None:
            raise DumpError(f"{self.path}: Parquet files are compressed inside; drop the suffix")
        self._compression = compression
        self._tmp = self.path.with_name(f".{self.path.name}.tmp-{os.getpid()}")
        self._sink: Any = None
        self._writer: Any = None
        self._schema: Any = None
        self.rows = 0

    def __enter__(self) -> Self:
        """Use as a context manager: closes on success, aborts on an exception."""
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        """Close (publish the file) or abort (remove the temporary file)."""
        if exc_type is None:
            self.close()
        else:
            self.abort()

    def _open(self, with_publish: bool) -> None:
        pa = arrow()
        fields = [(c, pa.int64()) for c in REQUIRED_COLUMNS]
        if with_publish:
            fields.append(("publish_time", pa.int64()))
        self._schema = pa.schema(fields)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if self.fmt == "parquet":
            self._writer = arrow_mod("parquet").ParquetWriter(str(self._tmp), self._schema)
            return
        if self._compression == "gzip":  # pyarrow's gzip runs at level 9: ten times slower
            self._sink = gzip.open(self._tmp, "wb", compresslevel=6)  # noqa: SIM115
        elif self._compression == "bz2":
            self._sink = bz2.open(self._tmp, "wb")  # noqa: SIM115
        else:
            self._sink = pa.output_stream(str(self._tmp), compression=self._compression)
        if self.fmt == "csv":
            pcsv = arrow_mod("csv")
            try:  # a plain header (pyarrow >= 18); older ones quote the column names
                options = pcsv.WriteOptions(batch_size=1 << 16, quoting_header="none")
            except TypeError:  # pragma: no cover - depends on the pyarrow version
                options = pcsv.WriteOptions(batch_size=1 << 16)
            self._writer = pcsv.CSVWriter(self._sink, self._schema, write_options=options)

    def write(self, columns: DumpColumns) -> None:
        """Append rows.

        Raises:
            ValueError: negative ids or an entry id >= 2**32 (a dump writer writes valid
                dumps; seed bad rows with pyarrow directly), or ``publish_time`` present in
                some chunks only.
        """
        if len(columns) and (columns.ledger_ids.min() < 0 or columns.entry_ids.min() < 0):
            raise ValueError("ledger and entry ids must be >= 0")
        if len(columns) and columns.entry_ids.max() >= ENTRY_ID_LIMIT:
            raise ValueError("entry ids must be < 2**32")
        with_publish = columns.publish_time is not None
        if self._schema is None:
            self._open(with_publish)
        elif with_publish != ("publish_time" in self._schema.names):
            raise ValueError("publish_time must be present in every chunk or in none")
        for lo in range(0, len(columns), GEN_BLOCK_ROWS):  # bounded text buffers
            table = self._table(columns.take(slice(lo, lo + GEN_BLOCK_ROWS)))
            if self.fmt == "jsonl":
                self._sink.write(self._json_lines(table))
            else:
                self._writer.write_table(table)
        self.rows += len(columns)

    def _table(self, columns: DumpColumns) -> Any:
        pa = arrow()
        arrays = [
            pa.array(columns.ledger_ids),
            pa.array(columns.entry_ids),
            pa.array(columns.deliver_at, mask=columns.deliver_at < 0),
        ]
        if columns.publish_time is not None:
            arrays.append(pa.array(columns.publish_time, mask=columns.publish_time < 0))
        return pa.Table.from_arrays(arrays, schema=self._schema)

    @staticmethod
    def _json_lines(table: Any) -> bytes:
        pa, pc = arrow(), arrow_mod("compute")
        if table.num_rows == 0:
            return b""
        pieces: list[Any] = []
        for i, name in enumerate(table.schema.names):
            text = pc.fill_null(pc.cast(table.column(name), pa.string()), "null")
            pieces += [("{" if i == 0 else ",") + f'"{name}":', text]
        lines = pc.binary_join_element_wise(*pieces, "}\n", "").combine_chunks()
        # The text of all lines is one contiguous buffer: slice it instead of joining strings.
        offsets = np.frombuffer(lines.buffers()[1], np.int32, count=lines.offset + len(lines) + 1)
        data = lines.buffers()[2]
        first, last = int(offsets[lines.offset]), int(offsets[-1])
        return bytes(memoryview(data)[first:last])

    def close(self) -> Path:
        """Finish the file and move it to ``path`` (an empty dump if nothing was written)."""
        if self._schema is None:
            self._open(False)
        if self._writer is not None:
            self._writer.close()
        if self._sink is not None:
            self._sink.close()
        self._writer = self._sink = None
        os.replace(self._tmp, self.path)
        return self.path

    def abort(self) -> None:
        """Drop the temporary file; ``path`` is left as it was."""
        for closer in (self._writer, self._sink):
            if closer is not None:
                with contextlib.suppress(Exception):  # best effort: the file is deleted next
                    closer.close()
        self._writer = self._sink = None
        self._tmp.unlink(missing_ok=True)


def write_dump(path: str | os.PathLike[str], columns: DumpColumns, fmt: str | None = None) -> Path:
    """Write ``columns`` as one dump file (atomically; see :class:`DumpWriter`).

    Returns:
        The path written.

    Raises:
        DumpError: an unknown format.
        ValueError: invalid ids (see :meth:`DumpWriter.write`).
    """
    writer = DumpWriter(path, fmt)
    with writer:
        writer.write(columns)
    return writer.path
