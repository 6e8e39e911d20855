# GENERATED from proto/delayindex/pb/snapshot.proto by scripts/gen_proto.py -- DO NOT EDIT.
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class SegmentMetadata(_message.Message):
    __slots__ = ("min_deliver_at", "max_deliver_at", "count", "ledger_bitmaps")
    class LedgerBitmapsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: int
        value: bytes
        def __init__(self, key: _Optional[int] = ..., value: _Optional[bytes] = ...) -> None: ...
    MIN_DELIVER_AT_FIELD_NUMBER: _ClassVar[int]
    MAX_DELIVER_AT_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    LEDGER_BITMAPS_FIELD_NUMBER: _ClassVar[int]
    min_deliver_at: int
    max_deliver_at: int
    count: int
    ledger_bitmaps: _containers.ScalarMap[int, bytes]
    def __init__(self, min_deliver_at: _Optional[int] = ..., max_deliver_at: _Optional[int] = ..., count: _Optional[int] = ..., ledger_bitmaps: _Optional[_Mapping[int, bytes]] = ...) -> None: ...

class SnapshotMetadata(_message.Message):
    __slots__ = ("format_version", "start_ledger", "end_ledger", "num_messages", "segments")
    FORMAT_VERSION_FIELD_NUMBER: _ClassVar[int]
    START_LEDGER_FIELD_NUMBER: _ClassVar[int]
    END_LEDGER_FIELD_NUMBER: _ClassVar[int]
    NUM_MESSAGES_FIELD_NUMBER: _ClassVar[int]
    SEGMENTS_FIELD_NUMBER: _ClassVar[int]
    format_version: int
    start_ledger: int
    end_ledger: int
    num_messages: int
    segments: _containers.RepeatedCompositeFieldContainer[SegmentMetadata]
    def __init__(self, format_version: _Optional[int] = ..., start_ledger: _Optional[int] = ..., end_ledger: _Optional[int] = ..., num_messages: _Optional[int] = ..., segments: _Optional[_Iterable[_Union[SegmentMetadata, _Mapping]]] = ...) -> None: ...

class SnapshotSegment(_message.Message):
    __slots__ = ("format_version", "count", "deliver_at_deltas", "ledger_deltas", "entry_ids")
    FORMAT_VERSION_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    DELIVER_AT_DELTAS_FIELD_NUMBER: _ClassVar[int]
    LEDGER_DELTAS_FIELD_NUMBER: _ClassVar[int]
    ENTRY_IDS_FIELD_NUMBER: _ClassVar[int]
    format_version: int
    count: int
    deliver_at_deltas: _containers.RepeatedScalarFieldContainer[int]
    ledger_deltas: _containers.RepeatedScalarFieldContainer[int]
    entry_ids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, format_version: _Optional[int] = ..., count: _Optional[int] = ..., deliver_at_deltas: _Optional[_Iterable[int]] = ..., ledger_deltas: _Optional[_Iterable[int]] = ..., entry_ids: _Optional[_Iterable[int]] = ...) -> None: ...
