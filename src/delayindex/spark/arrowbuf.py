"""Arrow arrays to and from numpy through their buffers, for the Spark rebuild's tasks.

pyarrow imports pandas, when it is installed, the first time it converts between Arrow and
numpy or Python values (``to_numpy``, ``pa.array``, scalars): half a second of CPU in the driver
and in every Python worker, for nothing here. These helpers go through the buffers instead.
pyarrow itself is imported when first used (it is part of the ``spark`` extra).
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

Int64Array = npt.NDArray[np.int64]


def arrow() -> Any:
    """The pyarrow module (it has no type hints; imported when a job runs)."""
    return importlib.import_module("pyarrow")


def int64s(column: Any) -> Int64Array:
    """The values of an int64 Arrow array or chunked array without nulls, as a read-only numpy
    view of its buffer (a copy only to join several chunks)."""
    if hasattr(column, "num_chunks"):
        if column.num_chunks == 1:
            column = column.chunk(0)
        else:
            column = arrow().concat_arrays(column.chunks) if column.num_chunks else None
    if column is None or len(column) == 0:
        return np.empty(0, dtype=np.int64)
    if column.null_count:
        raise ValueError("int64s: the column has nulls")
    values: Int64Array = np.frombuffer(
        column.buffers()[1], dtype=np.int64, count=len(column), offset=column.offset * 8
    )
    return values


def int64s_or(column: Any, default: int) -> Int64Array:
    """The values of an int64 Arrow (chunked) array as numpy, ``default`` where null."""
    if column.null_count == 0:
        return int64s(column)
    chunks = column.chunks if hasattr(column, "chunks") else [column]
    parts = []
    for chunk in chunks:
        if len(chunk) == 0:
            continue
        values = np.frombuffer(
            chunk.buffers()[1], dtype=np.int64, count=len(chunk), offset=chunk.offset * 8
        )
        bitmap = chunk.buffers()[0]
        if chunk.null_count == 0 or bitmap is None:
            parts.append(values)
            continue
        valid = np.unpackbits(np.frombuffer(bitmap, dtype=np.uint8), bitorder="little")
        valid = valid[chunk.offset : chunk.offset + len(chunk)].astype(bool)
        parts.append(np.where(valid, values, np.int64(default)))
    return np.concatenate(parts) if parts else np.empty(0, dtype=np.int64)


def int64_array(values: Any) -> Any:
    """An Arrow int64 array over a numpy array's memory (no copy when it is int64)."""
    data = np.ascontiguousarray(values, dtype=np.int64)
    pa = arrow()
    return pa.Array.from_buffers(pa.int64(), len(data), [None, pa.py_buffer(data)])


def string_array(texts: Sequence[str]) -> Any:
    """An Arrow string array of ``texts`` (no nulls)."""
    pa = arrow()
    encoded = [t.encode() for t in texts]
    offsets = np.zeros(len(encoded) + 1, dtype=np.int32)
    np.cumsum([len(e) for e in encoded], out=offsets[1:])
    data = pa.py_buffer(b"".join(encoded))
    return pa.Array.from_buffers(pa.string(), len(encoded), [None, pa.py_buffer(offsets), data])


def bool_array(mask: npt.NDArray[np.bool_]) -> Any:
    """An Arrow boolean array of a numpy bool mask (no nulls)."""
    pa = arrow()
    bits = np.packbits(mask, bitorder="little")
    return pa.Array.from_buffers(pa.bool_(), len(mask), [None, pa.py_buffer(bits)])
