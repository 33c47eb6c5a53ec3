"""Archive tables of topics with a schema (Avro, JSON Schema, Protobuf): resolve schemas, choose the
Protobuf message, evolve field ids.

At the start of a pass the archiver asks, per topic with due archives, for the latest schema of each
side's subject (icelog.schema.<side>, cached for the pass) from the schema source: the metadata store
for the embedded registry (no broker needed), else `registry_url` over HTTP. With none, the topic keeps
the raw layout and nothing here runs. An Avro or JSON schema has one top-level type: its fields are the
side's columns (table/avro_types.py, table/json_types.py). For a Protobuf schema the table's message is,
in this order: the topic's
`icelog.schema.<side>.message`; the one remembered in the table property `icelog.archive.<side>.message`;
the one the envelope (Confluent message indexes) of the first due payloads names, then remembered so
the table does not flip; else, when due payloads carry no envelope, the schema's first message. When no
payload says anything (nothing due, the table is left alone: MessageUndecided; only null payloads due, e.g.
tombstones, the side is archived as bytes until a payload names its message). The Iceberg schema is computed
(table/iceberg_types.py with the type's own mapping), evolved against the column state kept in the metadata store
(table/field_ids.py), and written to the catalog only when it changed:
  - no table yet: CREATE TABLE through Spark (schema id 0, the archive partition spec and sort order);
    the ids the catalog assigned are adopted into the store;
  - a table whose columns the store does not know (a raw table, or a crash before the store was
    written): its columns and ids are adopted first, so they keep their ids;
  - a changed schema: the store is written first, then a new schema with exactly those field ids is
    committed through the Iceberg Java API (lake/iceberg_java.py; the commit fails if the table changed
    meanwhile, and the next pass retries). Any catalog kind works.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from google.protobuf import descriptor_pb2

from icelog.archive.intake_source import ChunkSource, chunk_source
from icelog.archive.plan import PlannedArchive
from icelog.config import Settings
from icelog.errors import ConfigError, IcelogError
from icelog.lake import iceberg_java
from icelog.meta.registry import RegistryStore
from icelog.meta.store import ArchiveLedger, TopicRecord
from icelog.schema.codec.registry_source import (
    SchemaSource,
    SourceSpec,
    StoreSchemaSource,
)
from icelog.schema.codec.sides import SideDecoding
from icelog.schema.compiled import CompiledSchema, record_fields, schema_type_of
from icelog.schema.protobuf_schema import build_pool, main_file_of, message_name_at, parse_envelope
from icelog.schema.registry_client import (
    LatestSchema,
    RegistryClient,
    RegistryUnavailableError,
    SchemaNotFoundError,
)
from icelog.table.arrow import struct_array
from icelog.table.config import (
    BUCKET,
    BUCKET_KEY,
    KEY_ERR,
    LAYOUT_RECORD,
    LAYOUT_TABLE,
    PARTITION_BY,
    SYSTEM_COLUMNS,
    VALUE_ERR,
    ArchiveTopicConfig,
)
from icelog.table.field_ids import TableColumn, evolve
from icelog.table.iceberg_types import (
    ERR,
    PREFIX,
    RAW,
    Column,
    arrow_schema,
    column_tree,
    iceberg_schema,
    records_from_schema,
    spark_ddl,
    table_columns,
    table_layout_columns,
)
from icelog.table.layout import RECORD_SPEC, TableSpec, archive_table_ddl
from icelog.table.protobuf_types import message_columns
from icelog.table.rules import check_spec_columns
from icelog.topics import MODE_AUTO, SIDES, key_of, side_config

if TYPE_CHECKING:
    import pyarrow as pa
    from pyiceberg.schema import Schema
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)

PEEK_RECORDS = 100  # payloads looked at, per pass, to learn the produced message from its envelope
_RESERVED = (RAW, PREFIX, ERR)
_EVOLUTION_NAME = re.compile(r"__v\d+$")


def message_property(side: str) -> str:
    """The table property remembering a side's message, once an envelope named it."""
    return f"icelog.archive.{side}.message"


class MessageUndecided(IcelogError):
    """A side has a schema but nothing due names its message (no configured or remembered one, no payload yet):
    the archiver leaves the topic's table alone until records arrive."""


class ReservedFieldNameError(IcelogError):
    """A message field's name collides with a column the archive adds or an evolution rename."""


class TableSpecError(IcelogError):
    """A table layout's partition.by or bucket.key does not fit the topic's schema."""


@dataclass(frozen=True)
class ArchiveSchema:
    """The columns of a topic's archive table and how to decode each side (None: raw bytes).

    In the table layout a side's `column` is a struct of the side's top-level columns plus __prefix__,
    __err__ and __raw__ (what the SideDecoder fills); archive/decode_table.py spreads it over the table.
    """

    columns: tuple[TableColumn, ...]
    key: SideDecoding | None
    value: SideDecoding | None
    layout: str = LAYOUT_RECORD

    @property
    def spark_ddl(self) -> str:
        return spark_ddl(self.columns)

    def arrow_schema(self) -> pa.Schema:
        return arrow_schema(self.columns)


def source_spec(settings: Settings) -> SourceSpec | None:
    """Where the archive reads schemas: `registry_url`, else the embedded registry's store, else nowhere."""
    if settings.registry_url:
        return SourceSpec("http", settings.registry_url)
    if settings.registry_listen == "off":
        return None
    url = settings.meta_url or f"sqlite:///{Path(settings.data_dir).resolve() / 'meta.db'}"
    return SourceSpec("store", url)


def check_field_names(what: str, side: str, columns: Sequence[Column], top: bool = True) -> None:
    """Refuse schemas whose field names the archive cannot hold next to its own columns (`what`: the schema)."""
    for column in columns:
        if (top and column.name in _RESERVED) or _EVOLUTION_NAME.search(column.name):
            raise ReservedFieldNameError(
                f"{what} has a field named {column.name!r}, which the archive table reserves "
                f"({', '.join(_RESERVED)} and <name>__v<N> for evolved fields); rename the field in a new schema "
                f"version, or set {key_of(side)}=none to archive the {side} as raw bytes"
            )
        check_field_names(what, side, column.children, top=False)


def check_table_names(fields: dict[str, tuple[str, tuple[Column, ...]] | None]) -> None:
    """Refuse key and value schemas whose top-level fields the table layout cannot hold side by side.

    `fields`: per side, (what the schema is, its field columns), or None without a schema.
    """
    seen: dict[str, str] = {}
    for side, found in fields.items():
        if found is None:
            continue
        what, columns = found
        check_field_names(what, side, columns)
        for column in columns:
            if column.name in SYSTEM_COLUMNS:
                raise ReservedFieldNameError(
                    f"{what} has a field named {column.name!r}, a column of the table layout itself "
                    f"({', '.join(SYSTEM_COLUMNS)}); rename the field in a new schema version"
                )
            if column.name in seen:
                raise ReservedFieldNameError(
                    f"the key and value schemas both have a field named {column.name!r}, and the table layout makes "
                    f"both top-level columns; rename one, or set {key_of('key')}=none to keep the key as bytes"
                )
            seen[column.name] = side


def side_struct(records: Sequence[TableColumn], side: str, fields: Sequence[Column]) -> Column:
    """A table-layout side as the SideDecoder fills it: its schema's columns, then __prefix__, __err__, __raw__."""
    current = {c.path for c in records if not c.deleted}
    children = [column_tree(records, f.name) for f in fields if f.name in current]
    extra = (Column(PREFIX, "binary"), Column(ERR, "string"), Column(RAW, "binary"))
    return Column(side, "struct", (*children, *extra))


@dataclass(frozen=True)
class Peek:
    """What the due payloads of a side say about their message."""

    envelopes: list[tuple[int, list[int]]]  # (schema id, message indexes) of the first payload with an envelope
    payloads: int  # non-null payloads looked at (0: every due record's side is null, e.g. only tombstones)


def peek_envelopes(intake_dir: str | ChunkSource, archives: Sequence[PlannedArchive], side: str) -> Peek:
    """The first envelope among the due payloads of a side, looking at up to PEEK_RECORDS non-null payloads.

    Null payloads (tombstones, records without a key) say nothing and cost little: they are skipped for as
    long as the due records last, so a pass that starts with deletions still finds the message produced
    after them. A batch that does not decode ends the look at its archive (the pass sends it to the
    dead-letter table).
    """
    from icelog.archive.decode import UndecodableBatchError, decode_archive

    column = 0 if side == "key" else 1
    looked = 0
    for archive in archives:
        try:
            for batch in decode_archive(intake_dir, archive):
                for payload in struct_array(batch.column(column)).field(RAW).to_pylist():
                    if payload is None:
                        continue
                    looked += 1
                    envelope = parse_envelope(payload)
                    if envelope is not None:
                        return Peek([(envelope[0], envelope[1])], looked)
                    if looked >= PEEK_RECORDS:
                        return Peek([], looked)
        except UndecodableBatchError:
            continue
    return Peek([], looked)


def side_was_decoded(known: Sequence[TableColumn], side: str, is_table: bool) -> bool:
    """Whether the table already holds the side's message columns (its error column is live)."""
    err = (KEY_ERR if side == "key" else VALUE_ERR) if is_table else f"{side}.{ERR}"
    return any(c.path == err and not c.deleted for c in known)


class TableSchemas:
    """Per pass: the registry's latest schemas; per topic: the archive table's schema, kept current."""

    def __init__(
        self, settings: Settings, spark: SparkSession, store: ArchiveLedger, registry: RegistryStore | None
    ) -> None:
        self.settings = settings
        self.spark = spark
        self.store = store  # the tables' column records (field ids)
        self.registry = registry  # the embedded registry's schemas, when the settings name no other
        self.spec = source_spec(settings)
        self._source: SchemaSource | None = None
        self._compiled: dict[int, CompiledSchema] = {}  # schema id → compiled, across passes
        self._version_ids: dict[tuple[str, int], int] = {}  # (subject, version) → schema id, across passes
        self._latest: dict[str, LatestSchema | None] = {}

    def begin_pass(self) -> None:
        """Forget the previous pass's schemas: each pass reads the latest once."""
        self._source = None
        self._latest = {}

    def source(self) -> SchemaSource:
        if self._source is None:
            assert self.spec is not None
            if self.spec.kind == "http":
                self._source = RegistryClient(self.spec.location, self._compiled, self._version_ids)
            else:  # the embedded registry: the archiver's own store holds its state
                if self.registry is None:
                    raise ConfigError("the archive reads schemas from the embedded registry, but its store has none")
                self._source = StoreSchemaSource(self.registry, self._compiled)
        return self._source

    def _subject_latest(self, subject: str) -> LatestSchema | None:
        if subject not in self._latest:
            self._latest[subject] = self.source().latest(subject)
        return self._latest[subject]

    def latest(self, topic: TopicRecord, side: str, had_schema: bool) -> LatestSchema | None:
        """The side's latest schema, or None for raw bytes."""
        config = side_config(topic.name, side, topic.configs)
        if config.subject is None or self.spec is None:
            return None
        try:
            found = self._subject_latest(config.subject)
        except RegistryUnavailableError:
            if topic.configs.get(key_of(side), MODE_AUTO) == MODE_AUTO and not had_schema:
                # An `auto` side of a table that never had a schema: archive raw bytes rather than stall
                # (lossless: __raw__); the table gains columns once the registry answers and has the subject.
                log.warning("%s: registry unreachable; archiving the %s of %s as raw bytes", topic.name, side,
                            topic.name)
                return None
            raise
        if found is None and config.required:
            raise LookupError(f"subject {config.subject!r} ({side} of {topic.name}) is not in the registry")
        return found

    def resolve(
        self,
        topic: TopicRecord,
        config: ArchiveTopicConfig,
        table_name: str,
        due: Sequence[PlannedArchive] = (),
        spec: TableSpec = RECORD_SPEC,
        properties: dict[str, str] | None = None,
    ) -> ArchiveSchema | None:
        """The topic's archive schema with its table created or evolved in the catalog; None: raw record layout.

        `spec`: the table's layout, spec and sort order (a table layout table always comes back with columns,
        with or without a schema); `properties`: forwarded topic configs, set when the table is created.
        """
        ident = f"{config.namespace}.{config.table}"
        known = self.store.table_columns(ident)
        is_table = spec.layout == LAYOUT_TABLE
        had_schema = bool(known) and (not is_table or any(c.path in (KEY_ERR, VALUE_ERR) for c in known))
        latest = {side: self.latest(topic, side, had_schema) for side in SIDES}
        if not any(latest.values()) and not had_schema and not is_table:
            return None  # never had a schema: the raw layout, untouched
        # (A table that had a schema and lost it keeps its columns, now deleted, and gets __raw__ again.)
        exists = self.spark.catalog.tableExists(table_name)
        remembered = iceberg_java.table_properties(iceberg_java.load_table(self.spark, table_name)) if exists else {}
        fields: dict[str, tuple[str, tuple[Column, ...]] | None] = {}  # per side: (what, its field columns)
        messages: dict[str, str | None] = {}  # per side: the Protobuf message's full name
        learned: dict[str, str] = {}
        for side, found in latest.items():
            messages[side] = None
            if found is None:
                fields[side] = None
                continue
            if not isinstance(found.schema, descriptor_pb2.FileDescriptorSet):
                what = f"{side} schema {found.subject} version {found.version}"
                fields[side] = (what, record_fields(found.schema, side))
                continue
            fds = found.schema
            name, source = self._message(topic, side, found, fds, remembered, due)
            if source == "undecided":
                # No due payload names the message: a guess would create (or evolve) the table with the file's
                # first message, often a helper of the one produced.
                if not due:  # nothing to archive: wait for payloads
                    raise MessageUndecided(
                        f"{topic.name}: no payload has named the {side} message of {found.subject} yet; the table "
                        f"is made with the first archived records (or set {key_of(side, 'message')})"
                    )
                if not side_was_decoded(known, side, is_table):
                    # Every due payload of the side is null (tombstones): archive it as bytes (nothing to lose);
                    # the side gains its message's columns with the first payload that names it.
                    fields[side] = None
                    continue
                name = message_name_at(main_file_of(fds), [0])  # the table's columns stay as they were
            if source == "envelope" and remembered.get(message_property(side)) != name:
                learned[message_property(side)] = name
            try:
                descriptor = build_pool(fds).FindMessageTypeByName(name)
            except KeyError:
                raise ConfigError(
                    f"message {name!r} ({side} of {topic.name}) is not in {found.subject} version {found.version}; "
                    f"set {key_of(side, 'message')} to a message of the schema"
                ) from None
            fields[side] = (f"{side} message {descriptor.full_name}", message_columns(descriptor))
            messages[side] = descriptor.full_name
        for side, found_fields in fields.items():
            if found_fields is not None:
                check_field_names(found_fields[0], side, found_fields[1])
        key_fields = None if fields["key"] is None else fields["key"][1]
        value_fields = None if fields["value"] is None else fields["value"][1]
        if is_table:
            check_table_names(fields)
            computed = table_layout_columns(key_fields, value_fields)
            # (identity(__bucket) is the layout's own, not a configured partition column)
            partition_by = [f.column for f in spec.partition_fields if f.transform == "identity" and f.column != BUCKET]
            try:
                check_spec_columns(computed, partition_by, spec.bucket_key)
            except ValueError as exc:
                raise TableSpecError(
                    f"{topic.name}: {exc}; the archive waits (intake kept) until the schema has the column, "
                    f"or recreate the topic with another {PARTITION_BY} / {BUCKET_KEY}"
                ) from None
        else:
            computed = table_columns(key_fields, value_fields)
        columns = self._evolve_table(config, table_name, computed, spec, properties)
        if learned:
            iceberg_java.set_table_properties(iceberg_java.load_table(self.spark, table_name), learned)
        sides: dict[str, SideDecoding | None] = {}
        for side, found in latest.items():
            side_fields = fields[side]
            if found is None or side_fields is None:
                sides[side] = None
                continue
            sides[side] = SideDecoding(
                side=side,
                column=side_struct(columns, side, side_fields[1]) if is_table else column_tree(columns, side),
                latest_id=found.schema_id,
                schemas=self._shipped(found),
                message_name=messages[side],
                source=self.spec,
                schema_type=schema_type_of(found.schema),
            )
        return ArchiveSchema(tuple(columns), sides["key"], sides["value"], spec.layout)

    def _message(
        self,
        topic: TopicRecord,
        side: str,
        found: LatestSchema,
        fds: descriptor_pb2.FileDescriptorSet,
        remembered: dict[str, str],
        due: Sequence[PlannedArchive],
    ) -> tuple[str, str]:
        """(the side's message full name, where it came from: configured, remembered, envelope or first).

        "undecided" (no name): no due payload of the side is non-null, so nothing says which message it is.
        """
        configured = side_config(topic.name, side, topic.configs).message
        if configured:
            return configured.lstrip("."), "configured"
        if message_property(side) in remembered:
            return remembered[message_property(side)], "remembered"
        peek = peek_envelopes(chunk_source(self.settings, topic.name), due, side)
        for schema_id, indexes in peek.envelopes:
            try:
                named = fds if schema_id == found.schema_id else self.source().by_id(schema_id)
                if isinstance(named, descriptor_pb2.FileDescriptorSet):
                    return message_name_at(main_file_of(named), indexes), "envelope"
            except SchemaNotFoundError:
                continue  # not a registry envelope after all: its row will say so
        if not peek.payloads:
            return "", "undecided"
        return message_name_at(main_file_of(fds), [0]), "first"

    def _shipped(self, found: LatestSchema) -> dict[int, CompiledSchema]:
        """Every version of the subject, compiled here once, so workers rarely need the registry."""
        shipped = {found.schema_id: found.schema}
        for schema_id in self.source().versions(found.subject):
            if schema_id in shipped:
                continue
            try:
                shipped[schema_id] = self.source().by_id(schema_id)
            except SchemaNotFoundError:
                continue
            except IcelogError as exc:  # an old version that does not compile: its payloads become __err__ rows
                log.warning("schema id %d of %s does not compile: %s", schema_id, found.subject, exc)
        return shipped

    def _evolve_table(
        self,
        config: ArchiveTopicConfig,
        table_name: str,
        computed: Sequence[Column],
        spec: TableSpec = RECORD_SPEC,
        properties: dict[str, str] | None = None,
    ) -> list[TableColumn]:
        ident = f"{config.namespace}.{config.table}"
        known = self.store.table_columns(ident)
        if not self.spark.catalog.tableExists(table_name):
            fresh = evolve(computed, [])
            for statement in archive_table_ddl(
                self.settings.archive.catalog_name, config.namespace, config.table, spark_ddl(fresh), spec, properties
            ).statements:
                self.spark.sql(statement)
            known = []  # a table dropped and made again starts over; the catalog's fresh ids are adopted
        table = iceberg_java.load_table(self.spark, table_name)
        text, last_column_id = iceberg_java.schema_json(self.spark, table)
        current = records_from_schema(_schema_from_json(text))
        known_paths = {c.path for c in known}
        known_ids = {c.field_id for c in known}
        adopted = list(known) + [c for c in current if c.path not in known_paths and c.field_id not in known_ids]
        columns = evolve(computed, adopted, floor_id=last_column_id)
        if columns != known:
            self.store.save_table_columns(ident, columns)
        if _signature_set(columns) != _signature_set(current):
            # Through the Iceberg Java API of Spark's own catalog (not pyiceberg): the session then sees the
            # new schema at once, and the schema carries exactly the field ids allocated above.
            iceberg_java.commit_schema(self.spark, table, iceberg_schema(columns).model_dump_json())
            log.info("archive table %s: schema evolved (%d columns)", table_name, len(columns))
        return columns


def _schema_from_json(text: str) -> Schema:
    from pyiceberg.schema import Schema

    return Schema.model_validate_json(text)


def _signature_set(columns: list[TableColumn]) -> set[tuple[str, int, str]]:
    return {(c.path, c.field_id, c.signature) for c in columns}
