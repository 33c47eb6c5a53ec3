"""JSON Schema schemas as the registry holds them: compile (with references), validate, canonical form, compatibility.

A registered JSON schema is the schema's JSON text plus its references: reference name (the `$ref` URL or path
the schema uses, e.g. "address.json") → the referenced schema's text. `compile_json` checks the text against
its draft's metaschema (jsonschema: the draft named by `$schema`, draft-07 when absent, as Confluent) and that
every `$ref` resolves (the `referencing` library, which jsonschema itself resolves with). The compiled
`JSONSchema` is only the texts, so it pickles and hashes cheaply; its parsed documents and validator are built
once per process (cached by value).

Compatibility follows Confluent's JSON Schema rules (schema/json_compat.py).
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from functools import lru_cache
from urllib.parse import urljoin

import referencing.exceptions
from jsonschema import Draft7Validator, validators
from jsonschema.exceptions import SchemaError
from jsonschema.protocols import Validator
from referencing import Registry, Resource, Specification
from referencing.jsonschema import DRAFT7, specification_with

from icelog.schema.json_compat import SchemaNode, compare
from icelog.schema.protobuf_schema import InvalidSchemaError

JSONDocument = object  # a parsed schema: a dict, or a boolean (true / false schemas)


@dataclass(frozen=True)
class JSONSchema:
    """A registered JSON schema: its text and its references (name → text, sorted by name)."""

    text: str
    references: tuple[tuple[str, str], ...] = ()

    @property
    def document(self) -> JSONDocument:
        """The parsed main schema (dict or bool)."""
        return _compiled(self).document

    @property
    def reference_documents(self) -> dict[str, JSONDocument]:
        """Reference name → parsed referenced schema (what table.json_types follows `$ref`s into)."""
        return dict(_compiled(self).references)

    @property
    def validator(self) -> Validator:
        """A jsonschema validator of the schema's draft, with the references resolvable by their names."""
        return _compiled(self).validator


@dataclass(frozen=True)
class _Compiled:
    document: JSONDocument
    references: tuple[tuple[str, JSONDocument], ...]
    validator: Validator
    registry: Registry[JSONDocument]
    base_uri: str


def compile_json(text: str, references: Mapping[str, str]) -> JSONSchema:
    """A JSONSchema from the registry's text and references; InvalidSchemaError with the parser's message."""
    schema = JSONSchema(text, tuple(sorted(references.items())))
    _check_references(_compiled(schema))  # a failed compile raises, and lru_cache keeps no failures
    return schema


def canonical(schema: JSONSchema) -> bytes:
    """The main schema as canonical JSON: sorted keys, no whitespace (spelling-only differences vanish)."""
    return json.dumps(schema.document, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def incompatibilities(writer: JSONSchema, reader: JSONSchema) -> list[str]:
    """Why data valid under `writer` may not be accepted by `reader`, by Confluent's rules (empty: compatible).

    BACKWARD = incompatibilities(old, new), FORWARD = incompatibilities(new, old), as Confluent's
    `SchemaDiff.compare(original, update)` with original = the schema the data was written with.
    """
    old, new = _compiled(writer), _compiled(reader)
    return compare(
        SchemaNode(old.document, old.registry.resolver(old.base_uri)),
        SchemaNode(new.document, new.registry.resolver(new.base_uri)),
    )


def _parse(text: str, what: str) -> JSONDocument:
    try:
        document: JSONDocument = json.loads(text)
    except ValueError as exc:
        raise InvalidSchemaError(f"{what} is not JSON: {exc}") from None
    if not isinstance(document, dict | bool):
        raise InvalidSchemaError(f"{what} is not a JSON Schema: a schema is an object or a boolean")
    return document


def _validator_class(document: JSONDocument) -> type[Validator]:
    cls: type[Validator] = validators.validator_for(document, default=Draft7Validator)
    return cls


def _specification(document: JSONDocument) -> Specification[JSONDocument]:
    """The referencing specification of a document's `$schema` (draft-07 when absent or unknown)."""
    dialect = document.get("$schema") if isinstance(document, dict) else None
    if not isinstance(dialect, str):
        return DRAFT7
    try:
        spec: Specification[JSONDocument] = specification_with(dialect, default=DRAFT7)
    except referencing.exceptions.CannotDetermineSpecification:
        return DRAFT7
    return spec


def _check(document: JSONDocument, what: str) -> None:
    try:
        _validator_class(document).check_schema(document)
    except SchemaError as exc:
        where = "/".join(str(p) for p in exc.path)
        raise InvalidSchemaError(
            f"{what} is not a valid JSON Schema: {exc.message}" + (f" at {where}" if where else "")
        ) from None


def _compile(schema: JSONSchema) -> _Compiled:
    document = _parse(schema.text, "the schema")
    _check(document, "the schema")
    base_uri = _id_of(document)
    resources: list[tuple[str, Resource[JSONDocument]]] = []
    parsed: list[tuple[str, JSONDocument]] = []
    for name, text in schema.references:
        ref_document = _parse(text, f"reference {name!r}")
        _check(ref_document, f"reference {name!r}")
        parsed.append((name, ref_document))
        resource = Resource.from_contents(ref_document, default_specification=_specification(ref_document))
        uris = {name, urljoin(base_uri, name)}
        if ref_id := _id_of(ref_document):
            uris.add(ref_id)
        resources.extend((uri, resource) for uri in uris if uri)
    main = Resource.from_contents(document, default_specification=_specification(document))
    registry: Registry[JSONDocument] = Registry().with_resources(resources)
    registry = registry.with_resource(base_uri, main)  # "" when the schema has no $id: local refs resolve there
    validator = _validator_class(document)(document, registry=registry)
    return _Compiled(document, tuple(parsed), validator, registry, base_uri)


@lru_cache(maxsize=256)
def _compiled(schema: JSONSchema) -> _Compiled:
    return _compile(schema)


def _id_of(document: JSONDocument) -> str:
    if isinstance(document, dict):
        for key in ("$id", "id"):
            value = document.get(key)
            if isinstance(value, str) and not value.startswith("#"):
                return value.split("#", 1)[0]
    return ""


def _check_references(compiled: _Compiled) -> None:
    """Every `$ref` of the schema and of its references resolves (InvalidSchemaError naming the one that does not)."""
    documents = [("the schema", compiled.document, compiled.base_uri)]
    documents += [(f"reference {name!r}", doc, _id_of(doc) or name) for name, doc in compiled.references]
    for what, document, base in documents:
        for ref, ref_base in _refs(document, base):
            try:
                compiled.registry.resolver(ref_base).lookup(ref)
            except referencing.exceptions.Unresolvable as exc:
                if isinstance(
                    exc.__context__, referencing.exceptions.NoSuchResource | referencing.exceptions.Unretrievable
                ):
                    names = ", ".join(repr(name) for name, _ in compiled.references) or "none"
                    raise InvalidSchemaError(f"{what}: $ref {ref!r} names no reference (references: {names})") from None
                raise InvalidSchemaError(f"{what}: $ref {ref!r} does not resolve: {exc}") from None


_DATA = frozenset({"enum", "const", "examples", "default", "required"})  # keywords whose values are data, not schemas
_SCHEMA_MAPS = frozenset(
    {"properties", "patternProperties", "definitions", "$defs", "dependencies", "dependentSchemas"}
)


def _refs(node: object, base: str) -> Iterator[tuple[str, str]]:
    """Every `$ref` in a schema document with the base URI it is relative to (following nested `$id`s)."""
    if isinstance(node, dict):
        node_id = node.get("$id")
        if isinstance(node_id, str) and not node_id.startswith("#"):
            base = urljoin(base, node_id)
        ref = node.get("$ref")
        if isinstance(ref, str):
            yield ref, base
        for key, value in node.items():
            if key in _SCHEMA_MAPS and isinstance(value, dict):
                for subschema in value.values():
                    yield from _refs(subschema, base)
            elif key not in _DATA:
                yield from _refs(value, base)
    elif isinstance(node, list):
        for value in node:
            yield from _refs(value, base)
