"""Archive tables of topics with a Protobuf schema: resolve schemas, evolve field ids, update the catalog.

At the start of a pass the archiver asks, per topic with due archives, for the latest schema of each
side's subject (icelog.schema.<side>, cached for the pass). With none, the topic keeps the raw layout and
nothing here runs. With one, the Iceberg schema is computed (schema/iceberg_types.py), evolved against
the column state kept in the metadata store (schema/field_ids.py), and written to the catalog only when
it changed:
  - no table yet: CREATE TABLE through Spark (schema id 0, the archive partition spec and sort order);
    the ids the catalog assigned are adopted into the store;
  - a table whose columns the store does not know (a raw table, or a crash before the store was
    written): its columns and ids are adopted first, so they keep their ids;
  - a changed schema: the store is written first, then a new schema with exactly those field ids is
    committed through the Iceberg Java API (TableMetadata.updateSchema; the commit fails if the table
    changed meanwhile, and the next pass retries). Any catalog kind works.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from icelog.config import Settings
from icelog.lake.layout import archive_table_ddl
from icelog.lake.topic_config import ArchiveTopicConfig
from icelog.meta.store import MetadataStore, TableColumn, TopicRecord
from icelog.schema.archive.field_ids import evolve
from icelog.schema.archive.iceberg_types import (
    arrow_schema,
    column_tree,
    iceberg_schema,
    records_from_schema,
    spark_ddl,
    table_columns,
)
from icelog.schema.archive.proto_decode import SideDecoding
from icelog.schema.archive.registry_source import LatestSchema, RegistrySchemas
from icelog.schema.protobuf_schema import message_descriptor
from icelog.schema.topic_config import SIDES, side_config

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ArchiveSchema:
    """The columns of a topic's archive table and how to decode each side (None: raw bytes)."""

    columns: tuple[TableColumn, ...]
    key: SideDecoding | None
    value: SideDecoding | None

    @property
    def spark_ddl(self) -> str:
        return spark_ddl(self.columns)

    def arrow_schema(self) -> Any:
        return arrow_schema(self.columns)


def registry_url(settings: Settings) -> str | None:
    """The schema registry the archiver reads: `registry_url`, else the embedded one, else none."""
    if settings.registry_url:
        return settings.registry_url
    listen = settings.registry_listen
    if listen and listen != "off":
        host, _, port = str(listen).rpartition(":")
        host = "127.0.0.1" if host in ("", "0.0.0.0", "::", "[::]") else host
        return f"http://{host}:{port}"
    return None


class TableSchemas:
    """Per pass: the registry's latest schemas; per topic: the archive table's schema, kept current."""

    def __init__(self, settings: Settings, spark: Any, store: MetadataStore) -> None:
        self.settings = settings
        self.spark = spark
        self.store = store
        self.url = registry_url(settings)
        self._registry: RegistrySchemas | None = None
        self._compiled: dict[int, Any] = {}  # schema id → FileDescriptorSet, across passes

    def begin_pass(self) -> None:
        """Forget the previous pass's schemas: each pass fetches the latest once."""
        self._registry = None

    def registry(self) -> RegistrySchemas:
        if self._registry is None:
            assert self.url is not None
            self._registry = RegistrySchemas(self.url, self._compiled)
        return self._registry

    def latest(self, topic: TopicRecord, side: str) -> tuple[LatestSchema, str | None] | None:
        """The side's latest schema and configured message, or None for raw bytes."""
        config = side_config(topic.name, side, topic.configs)
        if config.subject is None or self.url is None:
            return None
        found = self.registry().latest(config.subject)
        if found is None and config.required:
            raise LookupError(f"subject {config.subject!r} ({side} of {topic.name}) is not in the registry")
        return None if found is None else (found, config.message)

    def resolve(self, topic: TopicRecord, config: ArchiveTopicConfig, table_name: str) -> ArchiveSchema | None:
        """The topic's archive schema with its table created or evolved in the catalog; None: raw layout."""
        latest = {side: self.latest(topic, side) for side in SIDES}
        if not any(latest.values()) and not self.store.table_columns(f"{config.namespace}.{config.table}"):
            return None  # never had a schema: the raw layout, untouched
        # (A table that had a schema and lost it keeps its columns, now deleted, and gets __raw__ again.)
        descriptors = {
            side: None if found is None else message_descriptor(found[0].fds, None, found[1])
            for side, found in latest.items()
        }
        columns = self._evolve_table(config, table_name, table_columns(descriptors["key"], descriptors["value"]))
        sides: dict[str, SideDecoding | None] = {}
        for side, found in latest.items():
            if found is None:
                sides[side] = None
                continue
            schema, message = found
            descriptor = descriptors[side]
            assert descriptor is not None
            sides[side] = SideDecoding(
                side=side,
                column=column_tree(columns, side),
                latest_id=schema.schema_id,
                schemas={schema.schema_id: schema.fds.SerializeToString()},
                message_name=message or descriptor.full_name,
                registry_url=self.url,
            )
        return ArchiveSchema(tuple(columns), sides["key"], sides["value"])

    def _evolve_table(self, config: ArchiveTopicConfig, table_name: str, computed: Any) -> list[TableColumn]:
        ident = f"{config.namespace}.{config.table}"
        known = self.store.table_columns(ident)
        if not self.spark.catalog.tableExists(table_name):
            fresh = evolve(computed, [])
            for statement in archive_table_ddl(
                self.settings.archive.catalog_name, config.namespace, config.table, spark_ddl(fresh)
            ).statements:
                self.spark.sql(statement)
            known = []  # a table dropped and made again starts over; the catalog's fresh ids are adopted
        jvm = self.spark._jvm
        table = jvm.org.apache.iceberg.spark.Spark3Util.loadIcebergTable(self.spark._jsparkSession, table_name)
        base = table.operations().current()
        current = records_from_schema(_schema_from_json(jvm.org.apache.iceberg.SchemaParser.toJson(base.schema())))
        known_paths = {c.path for c in known}
        known_ids = {c.field_id for c in known}
        adopted = list(known) + [c for c in current if c.path not in known_paths and c.field_id not in known_ids]
        columns = evolve(computed, adopted, floor_id=base.lastColumnId())
        if columns != known:
            self.store.save_table_columns(ident, columns)
        if _signature_set(columns) != _signature_set(current):
            # Through the Iceberg Java API of Spark's own catalog (not pyiceberg): the session then sees the
            # new schema at once, and the schema carries exactly the field ids allocated above.
            schema = jvm.org.apache.iceberg.SchemaParser.fromJson(iceberg_schema(columns).model_dump_json())
            table.operations().commit(base, base.updateSchema(schema))
            log.info("archive table %s: schema evolved (%d columns)", table_name, len(columns))
        return columns


def _schema_from_json(text: str) -> Any:
    from pyiceberg.schema import Schema

    return Schema.model_validate_json(text)


def _signature_set(columns: list[TableColumn]) -> set[tuple[str, int, str]]:
    return {(c.path, c.field_id, c.signature) for c in columns}
