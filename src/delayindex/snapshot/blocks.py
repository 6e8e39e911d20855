"""Bitmap blocks: a bucket's many small roaring bitmaps as one ``bytes``.

A snapshot metadata holds one portable roaring bitmap per (segment, ledger): thousands per
bucket, 18 to 40 bytes each. :class:`BitmapBlock` keeps them back to back in one ``bytes`` with
an offsets array, so they cost no Python object each. :class:`DeferredBlock` is a block not yet
decoded: format 4 stores the bitmaps in a compressed part of their own, decoded on first use.
:class:`LazyPositions` is the part of formats 5 and 6, which also holds the ledger columns the
bitmaps belong to (``columns()``; format 6 rebuilds the bitmaps from entry gaps). All three
answer ``count``, ``loaded``, ``nbytes``, ``get()`` and ``head(n)``, so a metadata holds any of
them without asking which. ``head(n)`` is what reading a bucket's first segments needs: a
deferred block decodes only the bitmaps up to ``n`` (the part's leading bytes) the first time,
and the whole block after that, so no bucket pays for more than one partial decode.
Invariant: a block's offsets start at 0, never decrease and end at the blob's length.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence

import numpy as np
import numpy.typing as npt

Int64Array = npt.NDArray[np.int64]


def frozen_int64(values: object) -> Int64Array:
    """A read-only int64 copy of ``values`` (the snapshot types are immutable by convention)."""
    out = np.array(values, dtype=np.int64)
    out.flags.writeable = False
    return out


class BitmapBlock:
    """Many portable roaring bitmaps back to back in one ``bytes``: bitmap ``i`` is
    ``blob[offsets[i]:offsets[i + 1]]``.

    One object for a bucket's thousands of small per-(segment, ledger) bitmaps: no Python object
    per bitmap, so decoding and sealing leave no bursts of small allocations behind (which
    pinned pymalloc arenas: resident memory 2-3x the live size). ``offsets`` is a read-only
    int64 array, starting at 0, non-decreasing, ending at ``len(blob)``.
    """

    __slots__ = ("blob", "offsets")

    def __init__(self, blob: bytes, offsets: Int64Array) -> None:
        bounds = frozen_int64(np.asarray(offsets, dtype=np.int64))
        if bounds.ndim != 1 or len(bounds) < 1:
            raise ValueError("bitmap offsets must be a 1-d array of at least one element")
        if int(bounds[0]) != 0 or int(bounds[-1]) != len(blob):
            raise ValueError("bitmap offsets do not span the bitmap block")
        if len(bounds) > 1 and bool((np.diff(bounds) < 0).any()):
            raise ValueError("bitmap offsets decrease")
        self.blob = bytes(blob)
        self.offsets = bounds

    @classmethod
    def join(cls, bitmaps: Sequence[bytes]) -> BitmapBlock:
        """A block of ``bitmaps`` (each the portable serialization of one bitmap)."""
        offsets = np.zeros(len(bitmaps) + 1, dtype=np.int64)
        np.cumsum([len(b) for b in bitmaps], out=offsets[1:])
        return cls(b"".join(bytes(b) for b in bitmaps), offsets)

    @classmethod
    def from_sizes(cls, sizes: Int64Array, blob: bytes) -> BitmapBlock:
        """The block of ``blob`` cut by ``sizes`` (``ValueError`` unless they add up to it)."""
        offsets = np.zeros(len(sizes) + 1, dtype=np.int64)
        np.cumsum(sizes, out=offsets[1:])  # sizes < 2**63 each; their sum is checked next
        if int(offsets[-1]) != len(blob):
            raise ValueError("the bitmap sizes do not add up to the bitmap block")
        return cls(blob, offsets)  # which rejects a negative size (offsets that decrease)

    def __len__(self) -> int:
        return len(self.offsets) - 1

    @property
    def count(self) -> int:
        """How many bitmaps the block holds (``len``; the name :class:`DeferredBlock` has)."""
        return len(self)

    @property
    def loaded(self) -> bool:
        """Always True: a block is decoded (see :class:`DeferredBlock`)."""
        return True

    @property
    def nbytes(self) -> int:
        """Bytes the blob and the offsets hold."""
        return len(self.blob) + int(self.offsets.nbytes)

    def get(self) -> BitmapBlock:
        """The block itself (see :class:`DeferredBlock`)."""
        return self

    def head(self, n: int) -> BitmapBlock:
        """A block whose first ``n`` bitmaps are this block's: the block itself."""
        return self

    def slice(self, start: int, stop: int) -> tuple[bytes, ...]:
        """Bitmaps ``start..stop - 1`` as separate ``bytes`` (for per-segment views)."""
        cuts = self.offsets[start : stop + 1].tolist()
        return tuple(self.blob[a:b] for a, b in itertools.pairwise(cuts))


class DeferredBlock:
    """A :class:`BitmapBlock` decoded on first use, then kept.

    A format 4 metadata keeps its bitmaps in a compressed frame of their own; its columns
    (times, counts, ledgers) decode without them, and the block is decompressed and checked
    only when something reads it. ``load`` returns the block or raises (the codec's
    :class:`~delayindex.errors.SnapshotCorruptError`, naming the object); ``count`` is the
    number of bitmaps the columns promise, checked against the loaded block. Two threads that
    read it at once may both decode it: the result is the same, and either is kept (so too
    for the head).
    """

    __slots__ = ("_block", "_head", "_load", "_load_head", "count", "packed_bytes")

    def __init__(
        self,
        load: Callable[[], BitmapBlock],
        count: int,
        packed_bytes: int,
        load_head: Callable[[int], BitmapBlock] | None = None,
    ) -> None:
        self._load: Callable[[], BitmapBlock] | None = load
        self._block: BitmapBlock | None = None
        #: Decodes only the first ``n`` bitmaps (None: ``head`` decodes the whole block).
        self._load_head = load_head
        self._head: BitmapBlock | None = None  # the one partial decode, until the whole one
        self.count = int(count)
        #: Bytes the compressed frame holds (what the block costs until it is read).
        self.packed_bytes = int(packed_bytes)

    @property
    def loaded(self) -> bool:
        """Whether the block has been decoded."""
        return self._block is not None

    @property
    def nbytes(self) -> int:
        """Bytes held: the compressed part until decoded, then the block's."""
        block, head = self._block, self._head
        if block is not None:
            return block.nbytes
        return self.packed_bytes + (0 if head is None else head.nbytes)

    def get(self) -> BitmapBlock:
        """The block, decoded on the first call."""
        block = self._block
        if block is None:
            load = self._load
            if load is None:  # another thread decoded it meanwhile (it sets _block first)
                block = self._block
                assert block is not None
                return block
            block = load()
            if len(block) != self.count:
                raise ValueError(f"{len(block)} bitmaps where the ledger columns need {self.count}")
            self._block, self._load = block, None  # in this order: see above
            self._head = self._load_head = None  # frees the part they hold
        return block

    def head(self, n: int) -> BitmapBlock:
        """A block holding (at least) the first ``n`` bitmaps, the others perhaps left out.

        The first call with ``n`` under half the bitmaps decodes only those ``n``; any later
        call that needs more, like any call once the block is loaded, gets the whole block.
        """
        load_head = self._load_head  # read once: a whole decode in another thread clears it
        if self._block is not None or load_head is None or 2 * n >= self.count:
            return self.get()
        head = self._head
        if head is None:
            head = load_head(n)
            if len(head) != n:
                raise ValueError(f"{len(head)} bitmaps decoded where {n} were asked for")
            if self._block is None:  # else the whole block is there, and the head not needed
                self._head = head
        return head if len(head) >= n else self.get()


#: A block as a positions part decodes it: format 6's whole, format 5's deferred.
BlockLike = BitmapBlock | DeferredBlock


class LazyPositions:
    """Format 5's or 6's positions part, decoded on first use: a bucket's ledger columns and
    then its bitmaps, both kept out of the columns an open reads.

    ``load`` decodes the ledger columns (from the part's leading bytes) and returns them with
    the bitmaps: format 5's as a :class:`DeferredBlock` (``get`` whole, ``head(n)`` the first
    ``n``), format 6's as a :class:`BitmapBlock` rebuilt from its entry gaps. It runs once,
    and then only the block holds the part. It raises the codec's
    :class:`~delayindex.errors.SnapshotCorruptError` on damage. Two threads may both decode
    the columns: the result is the same, and the first kept is kept.
    """

    __slots__ = ("_block", "_columns", "_load", "packed_bytes")

    def __init__(
        self,
        load: Callable[[], tuple[Int64Array, Int64Array, BlockLike]],
        packed_bytes: int,
    ) -> None:
        self._load: Callable[[], tuple[Int64Array, Int64Array, BlockLike]] | None = load
        self._columns: tuple[Int64Array, Int64Array] | None = None
        self._block: BlockLike | None = None
        #: Bytes the compressed part holds (what the positions cost until they are read).
        self.packed_bytes = int(packed_bytes)

    def columns(self) -> tuple[Int64Array, Int64Array]:
        """``(ledger_offsets, ledgers)``: read-only, decoded on the first call."""
        self._bitmaps()
        assert self._columns is not None
        return self._columns

    def _bitmaps(self) -> BlockLike:
        block = self._block
        if block is None:
            load = self._load  # read once: a decode in another thread clears it
            if load is not None:
                offsets, ledgers, decoded = load()
                if self._block is None:  # else another thread's decode is kept
                    self._columns = (frozen_int64(offsets), frozen_int64(ledgers))
                    self._block = decoded  # after the columns: a reader that sees it finds them
                    self._load = None  # the part is now held only by the block's loaders
            block = self._block
            assert block is not None
        return block

    @property
    def count(self) -> int:
        """How many bitmaps the part holds (one per ledger of the columns)."""
        return len(self.columns()[1])

    @property
    def loaded(self) -> bool:
        """Whether the bitmaps have been decoded whole."""
        return self._block is not None and self._block.loaded

    @property
    def nbytes(self) -> int:
        """Bytes held: the compressed part, the decoded columns and bitmaps."""
        columns = self._columns
        held = 0 if columns is None else sum(int(c.nbytes) for c in columns)
        block = self._block
        return held + (self.packed_bytes if block is None else block.nbytes)

    def get(self) -> BitmapBlock:
        """The bitmaps, decoded whole on the first call."""
        return self._bitmaps().get()

    def head(self, n: int) -> BitmapBlock:
        """A block holding (at least) the first ``n`` bitmaps (:meth:`DeferredBlock.head`)."""
        return self._bitmaps().head(n)
