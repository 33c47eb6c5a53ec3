"""Avro schemas as the registry holds them: compile (with references), canonical form, compatibility.

fastavro parses (its parser is the one that encodes and decodes, so a schema the registry accepts is one the
archive can read); Apache `avro`'s ReaderWriterCompatibilityChecker applies Avro's schema-resolution rules, as
Confluent's AvroSchema.isBackwardCompatible does with Java Avro's SchemaCompatibility. References are named types
registered under other subjects (Confluent: the reference's name is the type's full name); the main schema uses
them by name, and `AvroSchema.document` inlines each at its first use, so the table mapping and the checker see
one self-contained schema.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import avro.errors
import avro.schema
import fastavro
from avro.compatibility import (
    ReaderWriterCompatibilityChecker,
    SchemaCompatibilityType,
    lookup_writer_field,
    schema_name_equals,
)
from fastavro.types import NamedSchemas, Schema

from icelog.schema.protobuf_schema import InvalidSchemaError

_PRIMITIVES = {"null", "boolean", "int", "long", "float", "double", "bytes", "string"}
_NAMED = {"record", "error", "enum", "fixed"}
_KEYWORDS = _NAMED | {"array", "map"}


@dataclass(frozen=True)
class AvroSchema:
    """A registered Avro schema: its text, and the texts of the schemas it references in dependency order (a
    type before the types that use it). Picklable and hashable; the parsed forms are cached per process."""

    text: str
    references: tuple[str, ...] = ()

    def parsed(self) -> Schema:
        """fastavro's parsed schema, with the referenced named types known (for its reader and writer)."""
        return _parsed(self)[0]

    def named_types(self) -> NamedSchemas:
        """Full name → fastavro's parsed definition of every named type the schema and its references define."""
        return _parsed(self)[1]

    @property
    def document(self) -> Any:
        """The main schema as JSON with referenced named types expanded inline at their first use."""
        return _document(self)


def _fastavro_message(exc: Exception) -> str:
    if isinstance(exc, fastavro.schema.UnknownType):
        return f"Unknown type: {exc.name}"
    return str(exc) or type(exc).__name__


def _load(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        # Avro allows a bare primitive name ("string") as a schema; Confluent stores it quoted or not
        stripped = text.strip()
        if stripped in _PRIMITIVES:
            return stripped
        raise


def _parse(text: str, named: NamedSchemas) -> Schema:
    try:
        return fastavro.parse_schema(_load(text), named_schemas=named)
    except json.JSONDecodeError as exc:
        raise InvalidSchemaError(f"Invalid schema JSON: {exc}") from exc
    except Exception as exc:  # fastavro raises SchemaParseException, UnknownType, ValueError, TypeError, ...
        raise InvalidSchemaError(_fastavro_message(exc)) from exc


@lru_cache(maxsize=256)
def _parsed(schema: AvroSchema) -> tuple[Schema, NamedSchemas]:
    named: NamedSchemas = {}
    for reference in schema.references:
        _parse(reference, named)
    main = _parse(schema.text, named)
    return main, named


def _strip(schema: Any) -> Any:
    """fastavro's parsed schema without its private keys ("__fastavro_parsed", "__named_schemas")."""
    if isinstance(schema, dict):
        return {k: _strip(v) for k, v in schema.items() if not k.startswith("__")}
    if isinstance(schema, list):
        return [_strip(v) for v in schema]
    return schema


def _expand(schema: Any, named: Mapping[str, Any], defined: set[str]) -> Any:
    if isinstance(schema, str):
        if schema in _PRIMITIVES or schema in defined or schema not in named:
            return schema
        return _expand(named[schema], named, defined)
    if isinstance(schema, list):
        return [_expand(branch, named, defined) for branch in schema]
    if not isinstance(schema, dict):
        return schema
    kind = schema.get("type")
    if isinstance(kind, str) and kind in _NAMED and isinstance(schema.get("name"), str):
        defined.add(schema["name"])  # parsed names are full names
    expanded = dict(schema)
    for key in ("type", "items", "values"):
        if key in expanded and not (key == "type" and isinstance(kind, str) and kind in _KEYWORDS):
            expanded[key] = _expand(expanded[key], named, defined)
    if isinstance(expanded.get("fields"), list):
        expanded["fields"] = [_expand(field, named, defined) for field in expanded["fields"]]
    return expanded


@lru_cache(maxsize=256)
def _document(schema: AvroSchema) -> Any:
    main, named = _parsed(schema)
    return _expand(_strip(main), _strip(named), set())


def compile_avro(text: str, references: Mapping[str, str]) -> AvroSchema:
    """Parse a schema and its references (reference name → text, any order). Raises InvalidSchemaError with
    fastavro's (or the JSON parser's) message, also for a reference that does not parse or a type not defined."""
    ordered: list[str] = []
    pending = dict(references)
    named: NamedSchemas = {}
    while pending:  # a reference may use another: parse those whose types are all known, until none is left
        progress = False
        failures: dict[str, str] = {}
        for name, text_of in list(pending.items()):
            attempt = dict(named)
            try:
                _parse(text_of, attempt)
            except InvalidSchemaError as exc:
                failures[name] = str(exc)
                continue
            named = attempt
            ordered.append(text_of)
            del pending[name]
            progress = True
        if not progress:
            name, message = sorted(failures.items())[0]
            raise InvalidSchemaError(f"reference {name!r}: {message}")
    schema = AvroSchema(text, tuple(ordered))
    _parse(text, dict(named))
    try:
        _checker_schema(schema)
    except (avro.errors.AvroException, TypeError, ValueError) as exc:
        raise InvalidSchemaError(str(exc)) from exc
    return schema


def canonical(schema: AvroSchema) -> bytes:
    """The schema's identity: its parsed JSON (full names, references inlined) with sorted keys and no whitespace.

    Not Avro's Parsing Canonical Form: that drops defaults, aliases and logical types, which change what a schema
    reads and with whom it is compatible (Confluent's identity, the Java schema's toString, keeps them).
    """
    return json.dumps(_normalized(schema.document), sort_keys=True, separators=(",", ":")).encode()


def _normalized(schema: Any) -> Any:
    """`{"type": "int"}` written as `"int"` (the same type), everywhere in a schema's JSON."""
    if isinstance(schema, list):
        return [_normalized(v) for v in schema]
    if not isinstance(schema, dict):
        return schema
    if set(schema) == {"type"} and schema["type"] in _PRIMITIVES:
        return schema["type"]
    return {k: _normalized(v) if k in ("type", "items", "values", "fields") else v for k, v in schema.items()}


def without_logical_types(schema: Any) -> Any:
    """A schema's JSON with every logicalType removed (the underlying types are what resolution compares)."""
    if isinstance(schema, dict):
        return {k: without_logical_types(v) for k, v in schema.items() if k != "logicalType"}
    if isinstance(schema, list):
        return [without_logical_types(v) for v in schema]
    return schema


@lru_cache(maxsize=256)
def _checker_schema(schema: AvroSchema) -> avro.schema.Schema:
    # Avro's resolution rules compare the underlying types, as Java's SchemaCompatibility does; Apache avro would
    # only warn about the logical types it does not know (local-timestamp-*), and warnings are not for a registry
    return avro.schema.parse(json.dumps(without_logical_types(schema.document)))


def incompatibilities(writer: AvroSchema, reader: AvroSchema) -> list[str]:
    """Why data written with `writer` cannot be read with `reader` by Avro's resolution rules (empty: it can).
    The registry checks BACKWARD as incompatibilities(old, new), FORWARD as incompatibilities(new, old)."""
    problems: list[str] = []
    _check(_checker_schema(reader), _checker_schema(writer), "", "", set(), problems)
    return problems


def _check(
    reader: avro.schema.Schema, writer: avro.schema.Schema, pointer: str, field: str,
    seen: set[tuple[str, str]], problems: list[str],
) -> None:
    """Records field by field, so each message names its field; Apache avro's checker for everything else."""
    if (
        isinstance(reader, avro.schema.RecordSchema) and isinstance(writer, avro.schema.RecordSchema)
        and schema_name_equals(reader, writer)
    ):
        pair = (reader.fullname, writer.fullname)
        if pair in seen:
            return
        seen.add(pair)
        for index, reader_field in enumerate(reader.fields):
            path = f"{field}.{reader_field.name}" if field else reader_field.name
            at = f"{pointer}/fields/{index}"
            writer_field = lookup_writer_field(writer, reader_field)
            if writer_field is not None:
                _check(reader_field.type, writer_field.type, f"{at}/type", path, seen, problems)
            elif not reader_field.has_default:
                problems.append(
                    f"READER_FIELD_MISSING_DEFAULT_VALUE: the reader's field '{path}' (at {at}) has no default "
                    "value and is missing in the writer's schema"
                )
        return
    checker = ReaderWriterCompatibilityChecker()  # type: ignore[no-untyped-call]  # avro types all but __init__
    result = checker.get_compatibility(reader, writer)
    if result.compatibility is SchemaCompatibilityType.compatible:
        return
    kinds = sorted({kind.value.upper() for kind in result.incompatibilities})
    where = f"field '{field}'" if field else "the schema"
    locations = ", ".join(sorted(f"{pointer}{loc}".replace("//", "/") for loc in result.locations if loc != "/"))
    types = "" if kinds == ["TYPE_MISMATCH"] else f" (reader: {_type_text(reader)}, writer: {_type_text(writer)})"
    messages = "; ".join(sorted(result.messages))
    problems.append(f"{'/'.join(kinds)}: {where} (at {locations or pointer or '/'}): {messages}{types}")


def _type_text(schema: avro.schema.Schema) -> str:
    if isinstance(schema, avro.schema.NamedSchema):
        return f"{schema.type} {schema.fullname}"
    if isinstance(schema, avro.schema.UnionSchema):
        return "[" + ", ".join(_type_text(branch) for branch in schema.schemas) + "]"
    return str(schema.type)
