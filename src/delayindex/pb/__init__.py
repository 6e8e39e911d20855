"""Generated protobuf modules (``*_pb2.py``) for the snapshot format.

Do not edit the modules in this package: they are produced from ``proto/`` by
``scripts/gen_proto.py``. They are imported only by ``delayindex.snapshot.codec``;
no other module may import protobuf.
"""
