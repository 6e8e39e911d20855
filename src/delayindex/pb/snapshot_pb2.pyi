# GENERATED from proto/delayindex/pb/snapshot.proto by scripts/gen_proto.py -- DO NOT EDIT.
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable
from typing import ClassVar as _ClassVar, Optional as _Optional

DESCRIPTOR: _descriptor.FileDescriptor

class SnapshotMetadata(_message.Message):
    __slots__ = ("format_version", "start_ledger", "end_ledger", "num_messages", "min_deliver_at_deltas", "deliver_at_spans", "counts", "ledger_counts", "ledger_deltas", "bitmaps", "index_name", "generation", "bitmap_block", "bitmap_sizes", "folded_cancels")
    FORMAT_VERSION_FIELD_NUMBER: _ClassVar[int]
    START_LEDGER_FIELD_NUMBER: _ClassVar[int]
    END_LEDGER_FIELD_NUMBER: _ClassVar[int]
    NUM_MESSAGES_FIELD_NUMBER: _ClassVar[int]
    MIN_DELIVER_AT_DELTAS_FIELD_NUMBER: _ClassVar[int]
    DELIVER_AT_SPANS_FIELD_NUMBER: _ClassVar[int]
    COUNTS_FIELD_NUMBER: _ClassVar[int]
    LEDGER_COUNTS_FIELD_NUMBER: _ClassVar[int]
    LEDGER_DELTAS_FIELD_NUMBER: _ClassVar[int]
    BITMAPS_FIELD_NUMBER: _ClassVar[int]
    INDEX_NAME_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    BITMAP_BLOCK_FIELD_NUMBER: _ClassVar[int]
    BITMAP_SIZES_FIELD_NUMBER: _ClassVar[int]
    FOLDED_CANCELS_FIELD_NUMBER: _ClassVar[int]
    format_version: int
    start_ledger: int
    end_ledger: int
    num_messages: int
    min_deliver_at_deltas: _containers.RepeatedScalarFieldContainer[int]
    deliver_at_spans: _containers.RepeatedScalarFieldContainer[int]
    counts: _containers.RepeatedScalarFieldContainer[int]
    ledger_counts: _containers.RepeatedScalarFieldContainer[int]
    ledger_deltas: _containers.RepeatedScalarFieldContainer[int]
    bitmaps: _containers.RepeatedScalarFieldContainer[bytes]
    index_name: str
    generation: int
    bitmap_block: bytes
    bitmap_sizes: bytes
    folded_cancels: bytes
    def __init__(self, format_version: _Optional[int] = ..., start_ledger: _Optional[int] = ..., end_ledger: _Optional[int] = ..., num_messages: _Optional[int] = ..., min_deliver_at_deltas: _Optional[_Iterable[int]] = ..., deliver_at_spans: _Optional[_Iterable[int]] = ..., counts: _Optional[_Iterable[int]] = ..., ledger_counts: _Optional[_Iterable[int]] = ..., ledger_deltas: _Optional[_Iterable[int]] = ..., bitmaps: _Optional[_Iterable[bytes]] = ..., index_name: _Optional[str] = ..., generation: _Optional[int] = ..., bitmap_block: _Optional[bytes] = ..., bitmap_sizes: _Optional[bytes] = ..., folded_cancels: _Optional[bytes] = ...) -> None: ...
