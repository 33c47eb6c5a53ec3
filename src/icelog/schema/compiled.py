"""A registered schema, compiled, whatever its type: one place that knows the three types and dispatches.

Confluent's registry holds AVRO (the type when a request names none), JSON and PROTOBUF schemas. Compiled,
they are a Protobuf FileDescriptorSet (protobuf_schema.py: protoc), an `AvroSchema` (avro_schema.py:
fastavro) or a `JSONSchema` (json_schema.py: jsonschema). All three are picklable, so the archive ships them
to Spark's workers as they are. Everything that must treat the types differently asks this module:
compiling a text with its references, the canonical form behind a schema's identity, and the
compatibility rules of the type.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import TypeAlias

from google.protobuf import descriptor_pb2

from icelog.schema import avro_schema, json_schema, protobuf_compat
from icelog.schema.avro_schema import AvroSchema
from icelog.schema.json_schema import JSONSchema
from icelog.schema.protobuf_schema import InvalidSchemaError, compile_schema, main_file_of
from icelog.table.avro_types import avro_columns
from icelog.table.field_ids import Column
from icelog.table.json_types import json_columns

AVRO, JSON, PROTOBUF = "AVRO", "JSON", "PROTOBUF"
SCHEMA_TYPES = (AVRO, JSON, PROTOBUF)  # GET /schemas/types, in Confluent's order

CompiledSchema: TypeAlias = descriptor_pb2.FileDescriptorSet | AvroSchema | JSONSchema


def schema_type_of(compiled: CompiledSchema) -> str:
    """AVRO, JSON or PROTOBUF."""
    if isinstance(compiled, AvroSchema):
        return AVRO
    if isinstance(compiled, JSONSchema):
        return JSON
    return PROTOBUF


def compile_any(schema_type: str, text: str, references: Mapping[str, str]) -> CompiledSchema:
    """Compile a schema of a type with its references (name → text); InvalidSchemaError with the parser's words."""
    if schema_type == AVRO:
        return avro_schema.compile_avro(text, references)
    if schema_type == JSON:
        return json_schema.compile_json(text, references)
    if schema_type == PROTOBUF:
        return compile_schema(text, references)
    raise InvalidSchemaError(f"schemaType {schema_type} is not one of {', '.join(SCHEMA_TYPES)}")


def canonical(compiled: CompiledSchema) -> bytes:
    """The schema's canonical form: spelling variants of one schema share it."""
    if isinstance(compiled, AvroSchema):
        return avro_schema.canonical(compiled)
    if isinstance(compiled, JSONSchema):
        return json_schema.canonical(compiled)
    main = descriptor_pb2.FileDescriptorProto()
    main.CopyFrom(main_file_of(compiled))
    main.ClearField("name")
    main.ClearField("source_code_info")
    stack = list(main.message_type)
    while stack:  # protoc fills json_name, serialized descriptors often do not: not part of the schema
        message = stack.pop()
        for field in message.field:
            field.ClearField("json_name")
        stack.extend(message.nested_type)
    out: bytes = main.SerializeToString(deterministic=True)
    return out


def incompatibilities(writer: CompiledSchema, reader: CompiledSchema) -> list[str]:
    """Why data written with `writer` cannot be read with `reader` (empty: it can), by the type's own rules."""
    if schema_type_of(writer) != schema_type_of(reader):
        return [f"schema type changed from {schema_type_of(writer)} to {schema_type_of(reader)}"]
    if isinstance(writer, AvroSchema) and isinstance(reader, AvroSchema):
        return avro_schema.incompatibilities(writer, reader)
    if isinstance(writer, JSONSchema) and isinstance(reader, JSONSchema):
        return json_schema.incompatibilities(writer, reader)
    assert isinstance(writer, descriptor_pb2.FileDescriptorSet) and isinstance(reader, descriptor_pb2.FileDescriptorSet)
    return protobuf_compat.incompatibilities(writer, reader)


def record_fields(compiled: CompiledSchema, root: str) -> tuple[Column, ...]:
    """The columns of an Avro or JSON schema's top-level type (a record's or object's fields, else one `root`)."""
    if isinstance(compiled, AvroSchema):
        return avro_columns(compiled.document, root)
    if not isinstance(compiled, JSONSchema):
        raise TypeError("a Protobuf schema's columns depend on its message (table/protobuf_types.py)")
    references = {name: json.loads(text) for name, text in compiled.references}
    return json_columns(compiled.document, references, root)

