"""How a live read decodes the payloads of a topic whose table holds them as columns (Avro, JSON Schema, Protobuf).

A pass decodes a side with the registry's versions of the side's subject into the table's columns
(archive/table_schema.py resolves them, evolving the table first when a new version adds columns). A live read
evolves nothing: it decodes the tail into the columns the pinned snapshot has, from the same registry (the
embedded one's state in the metadata store, or `registry_url` over HTTP), shipping every version of the subject
as a pass does, so a payload written with any of them lands in the same columns. A field the table does not have
yet (a version registered after the last pass) has no column here; the decoder then keeps the payload's bytes in
`__raw__`, as a pass does whenever the columns cannot rebuild a payload, so nothing is lost.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from google.protobuf import descriptor_pb2

from icelog.archive.table_schema import message_property, side_struct, side_was_decoded, source_spec
from icelog.config import Settings
from icelog.errors import IcelogError
from icelog.schema.codec.registry_source import SchemaSource, StoreSchemaSource
from icelog.schema.codec.sides import SideDecoding
from icelog.schema.compiled import CompiledSchema, record_fields, schema_type_of
from icelog.schema.protobuf_schema import build_pool, main_file_of, message_name_at
from icelog.schema.registry_client import RegistryClient, SchemaNotFoundError
from icelog.table.config import LAYOUT_TABLE
from icelog.table.field_ids import TableColumn
from icelog.table.iceberg_types import Column, arrow_schema, column_tree, records_from_schema
from icelog.table.protobuf_types import message_columns
from icelog.topics import SIDES, side_config

if TYPE_CHECKING:
    import pyarrow as pa
    from pyiceberg.table import Table

    from icelog.meta.store import MetadataStore


class SchemaUnavailableError(IcelogError):
    """The table decodes a side with a registry schema, and the live read has no registry to ask."""


@dataclass(frozen=True)
class Decodings:
    """The sides a live read decodes with a schema (None: bytes), and the Arrow schema the decoders fill."""

    key: SideDecoding | None
    value: SideDecoding | None
    arrow: pa.Schema | None  # the archiver's Arrow schema of the table's columns (None: no side decoded)


NO_DECODING = Decodings(None, None, None)


def _open_source(settings: Settings, table: str) -> tuple[SchemaSource, MetadataStore | None]:
    """The registry a pass of these settings reads (and the store to close after, if one was opened)."""
    spec = source_spec(settings)
    if spec is None or (spec.kind == "store" and settings.archive_reads_via_kafka):
        raise SchemaUnavailableError(
            f"table {table} decodes payloads with registry schemas: a live read over the Kafka protocol needs the "
            "registry's address (registry_url: http://HOST:PORT, the broker's registry listener)")
    if spec.kind == "http":
        return RegistryClient(spec.location, {}, {}), None
    from icelog.meta.backends import open_store
    from icelog.meta.registry import RegistryStore

    store = open_store(spec.location)
    if not isinstance(store, RegistryStore):
        store.close()
        raise SchemaUnavailableError(f"the metadata store {spec.location} holds no schema registry")
    return StoreSchemaSource(store, {}), store


def _shipped(source: SchemaSource, subject: str, latest_id: int, latest: CompiledSchema) -> dict[int, CompiledSchema]:
    shipped = {latest_id: latest}
    for schema_id in source.versions(subject):
        if schema_id not in shipped:
            try:
                shipped[schema_id] = source.by_id(schema_id)
            except SchemaNotFoundError:
                continue
            except IcelogError:  # a version that does not compile: its payloads become __err__ rows, as in a pass
                continue
    return shipped


def decodings(
    settings: Settings, table: Table, topic: str, configs: Mapping[str, str], layout: str, snapshot_id: int | None
) -> Decodings:
    """The decodings of the sides the table (at the snapshot) holds as columns; NO_DECODING when it holds bytes."""
    snapshot = None if snapshot_id is None else table.snapshot_by_id(snapshot_id)
    schema = table.schemas().get(snapshot.schema_id) if snapshot is not None and snapshot.schema_id is not None \
        else None
    records: Sequence[TableColumn] = records_from_schema(schema or table.schema())
    is_table = layout == LAYOUT_TABLE
    decoded = [side for side in SIDES if side_was_decoded(records, side, is_table)]
    if not decoded:
        return NO_DECODING
    name = ".".join(table.name())
    source, store = _open_source(settings, name)
    spec = source_spec(settings)
    properties = table.properties
    try:
        sides: dict[str, SideDecoding | None] = {"key": None, "value": None}
        for side in decoded:
            subject = side_config(topic, side, configs).subject
            found = None if subject is None else source.latest(subject)
            if found is None:
                raise SchemaUnavailableError(
                    f"table {name} holds the {side} of {topic!r} as columns, but the registry has no schema for it "
                    f"now (subject {subject!r}); read the table alone (without --live)")
            message: str | None = None
            fields: Sequence[Column]
            if isinstance(found.schema, descriptor_pb2.FileDescriptorSet):
                message = (side_config(topic, side, configs).message or properties.get(message_property(side))
                           or message_name_at(main_file_of(found.schema), [0])).lstrip(".")
                fields = message_columns(build_pool(found.schema).FindMessageTypeByName(message))
            else:
                fields = record_fields(found.schema, side)
            column = side_struct(records, side, fields) if is_table else column_tree(records, side)
            sides[side] = SideDecoding(side, column, found.schema_id,
                                       _shipped(source, found.subject, found.schema_id, found.schema),
                                       message, spec, schema_type_of(found.schema))
    finally:
        if store is not None:
            store.close()
    return Decodings(sides["key"], sides["value"], arrow_schema(records))
