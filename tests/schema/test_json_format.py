"""JSON Schema in the registry and the archive: compile, references, canonical form, Confluent's compatibility
rules, decoding JSONSerializer's documents into typed rows, and produce-time payload checks.

No broker, no Spark: confluent-kafka's JSONSerializer runs against its in-process mock registry (`mock://`).
"""

from __future__ import annotations

import json
import pickle
import re
from datetime import UTC, date, datetime
from typing import Any

import pytest
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.json_schema import JSONSerializer
from confluent_kafka.serialization import MessageField, SerializationContext

from icelog.schema.codec.json_codec import JSONRows, parse, payload_problem
from icelog.schema.json_schema import JSONSchema, canonical, compile_json, incompatibilities
from icelog.schema.protobuf_schema import InvalidSchemaError
from icelog.table.field_ids import Column
from icelog.table.json_types import EXTRA, json_columns

ENVELOPE = 5  # magic byte + 4-byte schema id


def schema_of(document: object, references: dict[str, object] | None = None) -> JSONSchema:
    return compile_json(json.dumps(document), {k: json.dumps(v) for k, v in (references or {}).items()})


def obj(properties: dict[str, Any], **more: Any) -> dict[str, Any]:
    return {"type": "object", "properties": properties, **more}


# --- compile ---------------------------------------------------------------------------------------------------


def test_a_schema_that_is_not_json_gives_the_parsers_message() -> None:
    with pytest.raises(InvalidSchemaError, match=r"not JSON: Expecting property name enclosed in double quotes"):
        compile_json('{"type": "object",}', {})


def test_a_schema_the_metaschema_refuses_gives_jsonschemas_message() -> None:
    with pytest.raises(InvalidSchemaError, match=r"'strin' is not valid under any of the given schemas"):
        compile_json('{"type": "strin"}', {})
    with pytest.raises(InvalidSchemaError, match=r"-1 is less than the minimum of 0 at properties/a/minLength"):
        compile_json('{"properties": {"a": {"type": "string", "minLength": -1}}}', {})


def test_the_draft_named_by_schema_is_used_and_draft_7_otherwise() -> None:
    # draft 2020-12's prefixItems is only checked (and must be an array) under 2020-12
    tuple_2020 = {"$schema": "https://json-schema.org/draft/2020-12/schema", "prefixItems": {"type": "string"}}
    with pytest.raises(InvalidSchemaError, match="is not of type 'array'"):
        schema_of(tuple_2020)
    schema_of({"prefixItems": {"type": "string"}})  # draft-07 ignores an unknown keyword, as Confluent
    draft4 = schema_of(
        {
            "$schema": "http://json-schema.org/draft-04/schema#",
            "type": "integer",
            "maximum": 3,
            "exclusiveMaximum": True,
        }
    )
    assert payload_problem(draft4, b"3") is not None and payload_problem(draft4, b"2") is None


def test_refs_to_another_registered_schema_and_to_local_definitions_resolve() -> None:
    address = obj(
        {"street": {"type": "string"}, "zip": {"$ref": "#/definitions/zip"}},
        definitions={"zip": {"type": "string", "pattern": "^[0-9]{5}$"}},
    )
    person = obj(
        {"home": {"$ref": "address.json"}, "age": {"$ref": "#/definitions/age"}},
        definitions={"age": {"type": "integer", "minimum": 0}},
    )
    schema = schema_of(person, {"address.json": address})
    assert payload_problem(schema, b'{"home": {"street": "Main", "zip": "12345"}, "age": 3}') is None
    assert "'1234' does not match" in (payload_problem(schema, b'{"home": {"zip": "1234"}}') or "")
    assert "-1 is less than the minimum of 0" in (payload_problem(schema, b'{"age": -1}') or "")


def test_refs_resolve_against_the_schemas_id() -> None:
    person = obj({"home": {"$ref": "address.json"}}, **{"$id": "https://example.com/schemas/person.json"})
    schema = schema_of(person, {"address.json": obj({"street": {"type": "string"}})})
    assert "is not of type 'string'" in (payload_problem(schema, b'{"home": {"street": 1}}') or "")


def test_a_ref_to_a_missing_reference_or_definition_is_refused() -> None:
    with pytest.raises(InvalidSchemaError, match=r"\$ref 'address.json' names no reference"):
        schema_of(obj({"home": {"$ref": "address.json"}}))
    with pytest.raises(InvalidSchemaError, match=r"\$ref '#/definitions/nope' does not resolve"):
        schema_of(obj({"a": {"$ref": "#/definitions/nope"}}))
    with pytest.raises(InvalidSchemaError, match=r"reference 'address.json' is not JSON"):
        compile_json(json.dumps(obj({"home": {"$ref": "address.json"}})), {"address.json": "{"})


def test_a_compiled_schema_pickles_and_hashes_by_value() -> None:
    schema = schema_of(obj({"home": {"$ref": "a.json"}}), {"a.json": {"type": "object"}})
    again = pickle.loads(pickle.dumps(schema))
    assert again == schema and hash(again) == hash(schema)
    assert again.validator.is_valid({"home": {}}) and not again.validator.is_valid({"home": 1})


def test_canonical_form_ignores_spelling() -> None:
    a = compile_json('{"type": "object",\n  "properties": {"b": {"type": "string"}, "a": {"type": "integer"}}}', {})
    b = compile_json('{"properties":{"a":{"type":"integer"},"b":{"type":"string"}},"type":"object"}', {})
    assert (
        canonical(a) == canonical(b) == b'{"properties":{"a":{"type":"integer"},"b":{"type":"string"}},"type":"object"}'
    )
    assert canonical(a) != canonical(compile_json('{"type": "object"}', {}))


# --- compatibility: Confluent's rules ---------------------------------------------------------------------------


def backward(old: object, new: object, references: dict[str, object] | None = None) -> list[str]:
    """Can a reader of `new` read data written with `old` (Confluent's BACKWARD check of `new` against `old`)?"""
    return incompatibilities(schema_of(old, references), schema_of(new, references))


def kinds(messages: list[str]) -> list[str]:
    return [m.split(" ", 1)[0] for m in messages]


OPEN = obj({"a": {"type": "string"}})
CLOSED = obj({"a": {"type": "string"}}, additionalProperties=False)


def test_open_content_model_adding_a_property_is_incompatible_removing_it_is_not() -> None:
    added = obj({"a": {"type": "string"}, "b": {"type": "integer"}})
    messages = backward(OPEN, added)
    assert kinds(messages) == ["PROPERTY_ADDED_TO_OPEN_CONTENT_MODEL"]
    assert messages[0].startswith("PROPERTY_ADDED_TO_OPEN_CONTENT_MODEL at #/properties/b")
    assert backward(added, OPEN) == []  # PROPERTY_REMOVED_FROM_OPEN_CONTENT_MODEL is compatible
    assert backward(OPEN, obj({"a": {"type": "string"}, "b": {}})) == []  # ..._WITH_EMPTY_SCHEMA_ADDED_...


def test_closed_content_model_adding_an_optional_property_is_compatible_removing_one_is_not() -> None:
    added = obj({"a": {"type": "string"}, "b": {"type": "integer"}}, additionalProperties=False)
    assert backward(CLOSED, added) == []  # OPTIONAL_PROPERTY_ADDED_TO_UNOPEN_CONTENT_MODEL
    assert kinds(backward(added, CLOSED)) == ["PROPERTY_REMOVED_FROM_CLOSED_CONTENT_MODEL"]
    required = obj({"a": {"type": "string"}, "b": {"type": "integer"}}, required=["b"], additionalProperties=False)
    assert kinds(backward(CLOSED, required)) == ["REQUIRED_PROPERTY_ADDED_TO_UNOPEN_CONTENT_MODEL"]
    with_default = obj(
        {"a": {"type": "string"}, "b": {"type": "integer", "default": 0}}, required=["b"], additionalProperties=False
    )
    assert backward(CLOSED, with_default) == []  # REQUIRED_PROPERTY_WITH_DEFAULT_ADDED_TO_UNOPEN_CONTENT_MODEL
    false_property = obj({"a": {"type": "string"}, "b": False}, additionalProperties=False)
    assert backward(false_property, CLOSED) == []  # PROPERTY_WITH_FALSE_REMOVED_FROM_CLOSED_CONTENT_MODEL


def test_partially_open_content_model_covers_what_its_schema_accepts() -> None:
    strings = obj({"a": {"type": "string"}}, additionalProperties={"type": "string"})
    assert (
        backward(
            strings, obj({"a": {"type": "string"}, "b": {"type": "string"}}, additionalProperties={"type": "string"})
        )
        == []
    )
    messages = backward(
        strings, obj({"a": {"type": "string"}, "b": {"type": "integer"}}, additionalProperties={"type": "string"})
    )
    assert "PROPERTY_ADDED_NOT_COVERED_BY_PARTIALLY_OPEN_CONTENT_MODEL" in kinds(messages)
    patterned = obj(
        {"a": {"type": "string"}}, patternProperties={"^n_": {"type": "number"}}, additionalProperties=False
    )
    assert (
        backward(patterned, obj({"a": {"type": "string"}, "n_x": {"type": "number"}}, additionalProperties=False)) == []
    )
    removed_ok = backward(
        obj({"a": {"type": "string"}, "n_x": {"type": "integer"}}, additionalProperties=False), patterned
    )
    assert removed_ok == []  # PROPERTY_REMOVED_IS_COVERED_BY_PARTIALLY_OPEN_CONTENT_MODEL (integer ⊂ number)


def test_additional_properties_may_open_not_close() -> None:
    assert backward(CLOSED, OPEN) == []  # ADDITIONAL_PROPERTIES_ADDED
    assert kinds(backward(OPEN, CLOSED)) == ["ADDITIONAL_PROPERTIES_REMOVED"]
    assert kinds(backward(OPEN, obj({"a": {"type": "string"}}, additionalProperties={"type": "string"}))) == [
        "ADDITIONAL_PROPERTIES_NARROWED"
    ]


def test_types_may_widen_not_narrow_or_change() -> None:
    assert backward({"type": "integer"}, {"type": "number"}) == []  # TYPE_EXTENDED
    assert kinds(backward({"type": "number"}, {"type": "integer"})) == ["TYPE_NARROWED"]
    messages = backward(obj({"a": {"type": "string"}}), obj({"a": {"type": "integer"}}))
    assert messages == ["TYPE_CHANGED at #/properties/a: the type changed"]
    assert backward(obj({"a": {"type": "string"}}), obj({"a": {}})) == []  # anything accepts a string


def test_a_field_may_become_nullable_not_the_reverse() -> None:
    assert backward({"type": "string"}, {"type": ["string", "null"]}) == []  # SUM_TYPE_EXTENDED
    assert backward({"type": "string"}, {"oneOf": [{"type": "null"}, {"type": "string"}]}) == []
    assert kinds(backward({"type": ["string", "null"]}, {"type": "string"})) == ["TYPE_CHANGED"]


def test_required_may_shrink_not_grow_without_a_default() -> None:
    two = {"a": {"type": "string"}, "b": {"type": "string"}}
    assert kinds(backward(obj(two), obj(two, required=["b"]))) == ["REQUIRED_ATTRIBUTE_ADDED"]
    assert backward(obj(two, required=["b"]), obj(two)) == []  # REQUIRED_ATTRIBUTE_REMOVED
    defaulted = {"a": {"type": "string"}, "b": {"type": "string", "default": "x"}}
    assert backward(obj(defaulted), obj(defaulted, required=["b"])) == []  # REQUIRED_ATTRIBUTE_WITH_DEFAULT_ADDED


def test_enums_may_grow_not_shrink() -> None:
    assert backward({"enum": ["a", "b"]}, {"enum": ["a", "b", "c"]}) == []
    assert kinds(backward({"enum": ["a", "b"]}, {"enum": ["a"]})) == ["ENUM_ARRAY_NARROWED"]
    assert kinds(backward({"enum": ["a", "b"]}, {"enum": ["a", "c"]})) == ["ENUM_ARRAY_CHANGED"]


def test_bounds_may_loosen_not_tighten() -> None:
    assert backward({"type": "string", "maxLength": 5}, {"type": "string", "maxLength": 9}) == []
    assert backward({"type": "string", "maxLength": 5}, {"type": "string"}) == []
    assert backward({"type": "string", "maxLength": 9}, {"type": "string", "maxLength": 5}) == [
        "MAX_LENGTH_DECREASED at #/maxLength"
    ]
    assert kinds(backward({"type": "string"}, {"type": "string", "pattern": "^a"})) == ["PATTERN_ADDED"]
    assert kinds(backward({"type": "number", "minimum": 0}, {"type": "number", "minimum": 1})) == ["MINIMUM_INCREASED"]
    assert kinds(backward({"type": "number"}, {"type": "number", "maximum": 1})) == ["MAXIMUM_ADDED"]
    assert backward({"type": "number", "multipleOf": 4}, {"type": "number", "multipleOf": 2}) == []
    assert kinds(backward({"type": "array", "maxItems": 3}, {"type": "array", "maxItems": 2})) == [
        "MAX_ITEMS_DECREASED"
    ]
    assert kinds(backward({"type": "array"}, {"type": "array", "uniqueItems": True})) == ["UNIQUE_ITEMS_ADDED"]
    assert kinds(backward(obj({}, minProperties=1), obj({}, minProperties=2))) == ["MIN_PROPERTIES_INCREASED"]


def test_array_items_are_compared() -> None:
    strings = {"type": "array", "items": {"type": "string"}}
    assert backward(strings, {"type": "array", "items": {"type": "integer"}}) == [
        "TYPE_CHANGED at #/items: the type changed"
    ]
    tuple_open = {"type": "array", "items": [{"type": "string"}]}
    tuple_closed = {"type": "array", "items": [{"type": "string"}], "additionalItems": False}
    two = [{"type": "string"}, {"type": "integer"}]
    assert kinds(backward(tuple_open, {"type": "array", "items": two})) == ["ITEM_ADDED_TO_OPEN_CONTENT_MODEL"]
    assert backward(tuple_closed, {"type": "array", "items": two, "additionalItems": False}) == []
    assert kinds(backward({"type": "array", "items": two, "additionalItems": False}, tuple_closed)) == [
        "ITEM_REMOVED_FROM_CLOSED_CONTENT_MODEL"
    ]


def test_one_of_branches_may_be_added_not_removed() -> None:
    two = {"oneOf": [{"type": "string"}, {"type": "integer"}]}
    three = {"oneOf": [{"type": "string"}, {"type": "integer"}, {"type": "boolean"}]}
    assert backward(two, three) == []  # SUM_TYPE_EXTENDED
    assert kinds(backward(three, two)) == ["SUM_TYPE_NARROWED"]
    assert "COMBINED_TYPE_SUBSCHEMAS_CHANGED" in kinds(
        backward(two, {"oneOf": [{"type": "string"}, {"type": "boolean"}]})
    )
    assert backward(two, {"anyOf": two["oneOf"]}) == []  # COMBINED_TYPE_EXTENDED
    assert kinds(backward({"anyOf": two["oneOf"]}, two)) == ["COMBINED_TYPE_CHANGED"]


def test_dependencies_may_loosen_not_tighten() -> None:
    props = {"a": {"type": "string"}, "b": {"type": "string"}, "c": {"type": "string"}}
    assert kinds(backward(obj(props, dependencies={"a": ["b"]}), obj(props, dependencies={"a": ["b", "c"]}))) == [
        "DEPENDENCY_ARRAY_EXTENDED"
    ]
    assert backward(obj(props, dependencies={"a": ["b", "c"]}), obj(props, dependencies={"a": ["b"]})) == []
    assert kinds(backward(obj(props), obj(props, dependencies={"a": {"required": ["c"]}}))) == [
        "DEPENDENCY_SCHEMA_ADDED"
    ]


def test_not_may_forbid_less_not_more() -> None:
    one, two = {"not": {"type": "string"}}, {"not": {"type": ["string", "integer"]}}
    assert backward(two, one) == []  # NOT_TYPE_NARROWED
    assert backward(one, two) == ["NOT_TYPE_EXTENDED at #/not"]


def test_titles_descriptions_and_defaults_are_free() -> None:
    before = obj({"a": {"type": "string", "description": "x", "default": "d"}}, title="T")
    after = obj({"a": {"type": "string", "description": "y", "default": "e"}}, title="U")
    assert backward(before, after) == []


def test_changes_inside_references_are_found_and_recursion_terminates() -> None:
    person = obj({"home": {"$ref": "address.json"}})
    old_address = obj({"zip": {"type": "string"}})
    new_address = obj({"zip": {"type": "integer"}})
    old, new = schema_of(person, {"address.json": old_address}), schema_of(person, {"address.json": new_address})
    assert incompatibilities(old, new) == ["TYPE_CHANGED at #/properties/home/properties/zip: the type changed"]
    tree = {
        "$ref": "#/definitions/n",
        "definitions": {
            "n": obj({"v": {"type": "integer"}, "kids": {"type": "array", "items": {"$ref": "#/definitions/n"}}})
        },
    }
    wider = json.loads(json.dumps(tree).replace('"integer"', '"number"'))
    assert backward(tree, tree) == [] and backward(tree, wider) == []
    assert kinds(backward(wider, tree)) == ["TYPE_NARROWED"]


# --- decoding JSONSerializer's documents ------------------------------------------------------------------------

ORDER = {
    "$schema": "http://json-schema.org/draft-07/schema#",
    "type": "object",
    "properties": {
        "id": {"type": "integer"},
        "amount": {"type": "number"},
        "paid": {"type": "boolean"},
        "placed_at": {"type": "string", "format": "date-time"},
        "ship_on": {"type": ["string", "null"], "format": "date"},
        "customer": {"$ref": "customer.json"},
        "tags": {"type": "array", "items": {"type": "string"}},
        "attributes": {"type": "object", "additionalProperties": {"type": "integer"}},
        "payload": {},
        "note": {"type": ["string", "null"]},
    },
    "required": ["id"],
}
CUSTOMER = {"type": "object", "properties": {"name": {"type": "string"}}}


def serialized(document: dict[str, Any], schema: dict[str, Any] = ORDER) -> bytes:
    """A document as confluent-kafka's JSONSerializer writes it, without the 5-byte envelope (the decoder's input)."""
    client = SchemaRegistryClient.new_client({"url": "mock://json-format"})
    serializer = JSONSerializer(json.dumps(schema), client, conf={"auto.register.schemas": True, "validate": False})
    framed = serializer(document, SerializationContext("orders", MessageField.VALUE))
    assert framed is not None and framed[0] == 0
    return framed[ENVELOPE:]


@pytest.fixture(scope="module")
def order_schema() -> JSONSchema:
    return schema_of(ORDER, {"customer.json": CUSTOMER})


def rows_for(schema: JSONSchema) -> JSONRows:
    columns = json_columns(schema.document, schema.reference_documents, "value")
    side = Column(
        "value",
        "struct",
        (*columns, Column("__prefix__", "binary"), Column("__err__", "string"), Column("__raw__", "binary")),
    )
    return JSONRows(schema, side)


def test_documents_decode_into_rows_typed_as_the_interface_says(order_schema: JSONSchema) -> None:
    body = serialized(
        {
            "id": 7,
            "amount": 12,
            "paid": True,
            "placed_at": "2026-11-25T10:30:00.123456+01:00",
            "ship_on": "2026-12-01",
            "customer": {"name": "Ada", "vip": True},
            "tags": ["a", "b"],
            "attributes": {"x": 1, "y": 2},
            "payload": {"any": [1, "two"]},
            "coupon": "XMAS",
        }
    )
    row = rows_for(order_schema).decode(body)
    placed = datetime(2026, 11, 25, 9, 30, 0, 123456, tzinfo=UTC)
    assert row == {
        "id": 7,
        "amount": 12.0,
        "paid": True,
        "placed_at": (placed - datetime(1970, 1, 1, tzinfo=UTC)).days * 86_400_000_000
        + (placed - datetime(1970, 1, 1, tzinfo=UTC)).seconds * 1_000_000
        + 123456,
        "ship_on": (date(2026, 12, 1) - date(1970, 1, 1)).days,
        "customer": {"name": "Ada", EXTRA: '{"vip":true}'},
        "tags": ["a", "b"],
        "attributes": [("x", 1), ("y", 2)],
        "payload": '{"any":[1,"two"]}',
        "note": None,
        EXTRA: '{"coupon":"XMAS"}',
    }
    assert isinstance(row["amount"], float)


def test_a_value_of_the_wrong_type_is_none_and_the_rest_is_kept(order_schema: JSONSchema) -> None:
    body = json.dumps(
        {
            "id": "seven",
            "amount": "12",
            "paid": 1,
            "placed_at": "2026-11-25T10:30:00",  # no offset: not an instant
            "ship_on": "soon",
            "customer": "Ada",
            "tags": ["a", 2],
            "attributes": {"x": "1"},
            "note": "kept",
        }
    ).encode()
    row = rows_for(order_schema).decode(body)
    assert row == {
        "id": None,
        "amount": None,
        "paid": None,
        "placed_at": None,
        "ship_on": None,
        "customer": None,
        "tags": ["a", None],
        "attributes": [("x", None)],
        "payload": None,
        "note": "kept",
        EXTRA: None,
    }


def test_date_times_follow_rfc_3339(order_schema: JSONSchema) -> None:
    rows = rows_for(order_schema)
    at = [
        rows.decode(json.dumps({"placed_at": text}).encode())["placed_at"]
        for text in (
            "1970-01-01T00:00:00Z",
            "1970-01-01t01:00:00.5+01:00",
            "1969-12-31T23:59:59.999999z",
            "2026-13-01T00:00:00Z",
        )
    ]
    assert at == [0, 500_000, -1, None]
    assert rows.decode(b'{"id": 1.0}')["id"] == 1 and rows.decode(b'{"id": 1.5}')["id"] is None


def test_decode_many_equals_decode_per_body(order_schema: JSONSchema) -> None:
    rows = rows_for(order_schema)
    bodies = [
        serialized({"id": i, "placed_at": f"2026-01-0{i + 1}T00:00:00Z", "tags": ["t"] * i, "extra": i})
        for i in range(3)
    ]
    bodies += [b"[1, 2]", b"null"]  # JSON, but not an object: every column None
    columns = rows.decode_many(bodies)
    per_body = [rows.decode(b) for b in bodies]
    assert set(columns) == set(per_body[0])
    for name, values in columns.items():
        assert values == [row[name] for row in per_body], name
    assert columns["id"] == [0, 1, 2, None, None]
    assert columns[EXTRA] == ['{"extra":0}', '{"extra":1}', '{"extra":2}', None, None]


@pytest.mark.parametrize(
    "body",
    [b'{"a":1}', b' {"a": [1, 2.5, null]} \n', b"\xef\xbb\xbf{}", '{"a": "é"}'.encode("utf-16"), b"NaN", b'"x"'],
)
def test_parse_reads_what_json_loads_reads(body: bytes) -> None:
    assert repr(parse(body)) == repr(json.loads(body))


@pytest.mark.parametrize("body", [b"", b"{", b'{"a":1} x', b'{"a":1}{}', b"\xff", b"[1,]"])
def test_parse_refuses_what_json_loads_refuses(body: bytes) -> None:
    with pytest.raises(ValueError) as expected:
        json.loads(body)
    with pytest.raises(type(expected.value), match=re.escape(str(expected.value))):
        parse(body)


def test_a_body_that_is_not_json_raises(order_schema: JSONSchema) -> None:
    rows = rows_for(order_schema)
    for body in (b"{not json", b"\xff\xfe\x00", b""):
        with pytest.raises(ValueError):
            rows.decode(body)
        with pytest.raises(ValueError):
            rows.decode_many([b'{"id": 1}', body])


def test_the_tables_column_decides_what_is_filled(order_schema: JSONSchema) -> None:
    """A table from a later schema: fields it lacks go to __extra__, children the writer lacks are read by name."""
    table = Column("value", "struct", (Column("id", "long"), Column("region", "string"), Column(EXTRA, "string")))
    row = JSONRows(order_schema, table).decode(b'{"id": 1, "region": "eu", "note": "n"}')
    assert row == {"id": 1, "region": "eu", EXTRA: '{"note":"n"}'}


def test_a_string_column_the_writer_does_not_declare_keeps_any_value_as_json_text() -> None:
    """Old documents carry in open content what a later schema declares: the column keeps it, whatever its type."""
    writer = schema_of(obj({"id": {"type": "integer"}}))
    table = Column("value", "struct", (Column("id", "long"), Column("payload", "string"), Column(EXTRA, "string")))
    rows = JSONRows(writer, table)
    assert rows.decode(b'{"id": 1, "payload": {"a": 1}}') == {"id": 1, "payload": '{"a":1}', EXTRA: None}
    assert rows.decode(b'{"id": 1, "payload": "text"}')["payload"] == "text"


def test_a_top_level_array_is_one_column_named_root() -> None:
    schema = schema_of({"type": "array", "items": {"type": "integer"}})
    column = Column("key", "struct", (*json_columns(schema.document, {}, "key"), Column("__raw__", "binary")))
    rows = JSONRows(schema, column)
    assert rows.decode(b"[1, 2, 3]") == {"key": [1, 2, 3]}
    assert rows.decode_many([b"[1]", b'"x"']) == {"key": [[1], None]}


# --- produce-time check ----------------------------------------------------------------------------------------


def test_payload_problem_names_the_problem_and_its_path(order_schema: JSONSchema) -> None:
    assert payload_problem(order_schema, serialized({"id": 1, "customer": {"name": "Ada"}})) is None
    assert payload_problem(order_schema, b'{"id": "x"}') == "'x' is not of type 'integer' (at $.id)"
    assert (
        payload_problem(order_schema, b'{"customer": {"name": 5}, "id": 1}')
        == "5 is not of type 'string' (at $.customer.name)"
    )
    assert payload_problem(order_schema, b"{}") == "'id' is a required property (at $)"
    # `format` is an annotation, as in confluent-kafka's JSONSerializer: the column gets None, the bytes are kept
    assert payload_problem(order_schema, b'{"id": 1, "ship_on": "2026-02-30"}') is None
    problem = payload_problem(order_schema, b'{"id": 1')
    assert problem is not None and problem.startswith("not JSON: Expecting")
