"""Kafka partitions equal Iceberg buckets: the bucket-key column's value in a produced record, and its bucket.

A topic with `icelog.table.bucket.key=<col>` is archived with the spec bucket(<col>, <partitions>), and the
broker keeps each record in the partition Iceberg would put it in (Fluss's IcebergBucketingFunction), so a
partition's files are its bucket's. The column is `__key` (the key's bytes, no schema needed) or a field of the
key or value message (decoded with the registry's schema, as the archive decodes it: proto_values converts
the field, so the value bucketed here is the value the table holds). The enforcer (enforcement.py) asks
`BucketLocator` per record; topics without a bucket key never get here.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import cast

from google.protobuf import descriptor_pb2, message_factory

from icelog.schema.codec.proto_values import struct_parts
from icelog.schema.codec.record_decode import rows_codec
from icelog.schema.compiled import CompiledSchema, record_fields
from icelog.schema.protobuf_schema import message_descriptor
from icelog.table.iceberg_types import Column
from icelog.table.protobuf_types import field_signature
from icelog.table.rules import BUCKETABLE, BucketFunction, bucket_function

_CACHE_SIZE = 4096


@dataclass(frozen=True)
class ColumnReader:
    """Reads one top-level column's value from a message body of one schema (None: unset)."""

    signature: str
    read: Callable[[bytes], object]  # a column value as the archive writes it (None: unset)


class BucketLocator:
    """Column readers per (schema id, message, column) and Iceberg bucket functions per (type, buckets)."""

    def __init__(self) -> None:
        self._readers: dict[tuple[int, tuple[int, ...] | str, str], ColumnReader | None] = {}
        self._functions: dict[tuple[str, int], BucketFunction] = {}

    def reader(
        self, compiled: CompiledSchema, schema_id: int, which: tuple[int, ...] | str, column: str
    ) -> ColumnReader | None:
        """How to read `column` from bodies of this schema's message (None: the message has no such field).

        `which`: the envelope's message indexes, or the configured message name ("" or (): the first message);
        an Avro or JSON schema has one top-level type and ignores it.
        """
        key = (schema_id, which, column)
        if key in self._readers:
            return self._readers[key]
        if not isinstance(compiled, descriptor_pb2.FileDescriptorSet):
            self._readers[key] = _record_reader(compiled, column)
            return self._readers[key]
        fds = compiled
        if isinstance(which, str):
            descriptor = message_descriptor(fds, None, message_name=which or None)
        else:
            descriptor = message_descriptor(fds, None, message_indexes=list(which) or [0])
        field = descriptor.fields_by_name.get(column)
        reader = None
        if field is not None:
            target = field_signature(field, (descriptor.full_name,))
            parts = struct_parts(descriptor, Column("row", "struct", (target,)))
            message_class = message_factory.GetMessageClass(descriptor)
            [(name, presence, convert)] = parts

            def read(body: bytes) -> object:
                message = message_class.FromString(body)
                if presence and not message.HasField(name):
                    return None
                return convert(getattr(message, name))

            reader = ColumnReader(target.signature, read)
        if len(self._readers) >= _CACHE_SIZE:
            self._readers.clear()
        self._readers[key] = reader
        return reader

    def bucket(self, signature: str, value: object, buckets: int) -> int:
        """Iceberg's bucket of a non-null column value; ValueError for a type Iceberg cannot bucket."""
        if signature not in BUCKETABLE:
            raise ValueError(f"a {signature} column cannot be bucketed (Iceberg buckets {', '.join(BUCKETABLE)})")
        function = self._functions.get((signature, buckets))
        if function is None:
            function = self._functions[(signature, buckets)] = bucket_function(signature, buckets)
        return int(cast(int, function(value)))  # a non-null value has a bucket


def _record_reader(compiled: CompiledSchema, column: str) -> ColumnReader | None:
    """Reads a top-level column of an Avro or JSON body (decoded as the archive decodes it)."""
    target = next((c for c in record_fields(compiled, "value") if c.name == column), None)
    if target is None:
        return None
    codec = rows_codec(compiled, Column("row", "struct", (target,)))

    def read(body: bytes) -> object:
        return codec.decode(body).get(column)

    return ColumnReader(target.signature, read)
