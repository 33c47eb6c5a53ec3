"""JSON Schema → Iceberg columns (table/json_types.py): every case of the mapping, open content kept in __extra__."""

from __future__ import annotations

from icelog.table.field_ids import Column
from icelog.table.json_types import EXTRA, json_columns, json_layout

EXTRA_COLUMN = Column(EXTRA, "string")


def closed(properties: dict[str, object], **more: object) -> dict[str, object]:
    return {"type": "object", "properties": properties, "additionalProperties": False, **more}


def columns_of(schema: object, references: dict[str, object] | None = None) -> tuple[Column, ...]:
    return json_columns(schema, references or {}, "value")


def test_scalars_and_formats() -> None:
    schema = closed(
        {
            "id": {"type": "integer"},
            "price": {"type": "number"},
            "either_number": {"type": ["integer", "number"]},
            "ok": {"type": "boolean"},
            "name": {"type": "string"},
            "at": {"type": "string", "format": "date-time"},
            "day": {"type": "string", "format": "date"},
            "clock": {"type": "string", "format": "time"},
            "mail": {"type": "string", "format": "email"},
        }
    )
    assert columns_of(schema) == (
        Column("id", "long"),
        Column("price", "double"),
        Column("either_number", "double"),
        Column("ok", "boolean"),
        Column("name", "string"),
        Column("at", "timestamptz"),
        Column("day", "date"),
        Column("clock", "string"),
        Column("mail", "string"),
    )


def test_nullable_types_are_the_type_itself() -> None:
    schema = closed(
        {
            "a": {"type": ["string", "null"]},
            "b": {"type": ["null", "integer"]},
            "c": {"oneOf": [{"type": "null"}, {"type": "string", "format": "date-time"}]},
            "d": {"anyOf": [{"type": "number"}, {"type": "null"}]},
            "e": {"oneOf": [{"type": "null"}, {"$ref": "#/definitions/point"}]},
        },
        definitions={"point": closed({"x": {"type": "number"}})},
    )
    assert columns_of(schema) == (
        Column("a", "string"),
        Column("b", "long"),
        Column("c", "timestamptz"),
        Column("d", "double"),
        Column("e", "struct", (Column("x", "double"),)),
    )


def test_open_objects_keep_undeclared_properties_in_extra() -> None:
    schema = {
        "type": "object",
        "properties": {
            "open": {"type": "object", "properties": {"x": {"type": "integer"}}},
            "open_true": {"type": "object", "properties": {"x": {"type": "integer"}}, "additionalProperties": True},
            "typed_extra": {
                "type": "object",
                "properties": {"x": {"type": "integer"}},
                "additionalProperties": {"type": "string"},
            },
            "closed": closed({"x": {"type": "integer"}}),
        },
    }
    x = Column("x", "long")
    assert columns_of(schema) == (
        Column("open", "struct", (x, EXTRA_COLUMN)),
        Column("open_true", "struct", (x, EXTRA_COLUMN)),
        Column("typed_extra", "struct", (x, EXTRA_COLUMN)),
        Column("closed", "struct", (x,)),
        EXTRA_COLUMN,  # the top-level object is open too
    )
    assert json_layout(schema, {}, "value").json_text >= {(EXTRA,), ("open", EXTRA)}


def test_additional_properties_schema_without_properties_is_a_map() -> None:
    schema = closed(
        {
            "counts": {"type": "object", "additionalProperties": {"type": "integer"}},
            "nested": {"type": "object", "additionalProperties": closed({"v": {"type": "string"}})},
        }
    )
    assert columns_of(schema) == (
        Column("counts", "map", (Column("key", "string"), Column("value", "long"))),
        Column("nested", "map", (Column("key", "string"), Column("value", "struct", (Column("v", "string"),)))),
    )


def test_arrays() -> None:
    schema = closed(
        {
            "tags": {"type": "array", "items": {"type": "string"}},
            "matrix": {"type": "array", "items": {"type": "array", "items": {"type": "number"}}},
            "anything": {"type": "array"},
            "pair": {"type": "array", "items": [{"type": "string"}, {"type": "integer"}]},
        }
    )
    layout = json_layout(schema, {}, "value")
    assert layout.columns == (
        Column("tags", "list", (Column("element", "string"),)),
        Column("matrix", "list", (Column("element", "list", (Column("element", "double"),)),)),
        Column("anything", "list", (Column("element", "string"),)),
        Column("pair", "string"),
    )
    assert {("anything", "element"), ("pair",)} <= layout.json_text
    assert ("tags", "element") not in layout.json_text


def test_enums_take_the_type_of_their_values() -> None:
    schema = closed(
        {
            "colour": {"enum": ["red", "green"]},
            "level": {"enum": [1, 2, 3]},
            "ratio": {"enum": [0.5, 1]},
            "flag": {"const": True},
            "mixed": {"enum": ["a", 1]},
        }
    )
    assert columns_of(schema) == (
        Column("colour", "string"),
        Column("level", "long"),
        Column("ratio", "double"),
        Column("flag", "boolean"),
        Column("mixed", "string"),
    )
    assert ("mixed",) in json_layout(schema, {}, "value").json_text


def test_unions_and_untyped_values_are_json_text() -> None:
    schema = closed(
        {
            "any": {},
            "also_any": True,
            "union": {"type": ["string", "integer"]},
            "one_of": {"oneOf": [{"type": "string"}, {"type": "integer"}]},
            "all_of": {"allOf": [closed({"a": {"type": "string"}}), closed({"b": {"type": "string"}})]},
            "only_null": {"type": "null"},
        }
    )
    layout = json_layout(schema, {}, "value")
    assert layout.columns == tuple(
        Column(name, "string") for name in ("any", "also_any", "union", "one_of", "all_of", "only_null")
    )
    assert {(c.name,) for c in layout.columns} <= layout.json_text


def test_references_to_other_schemas_and_local_definitions() -> None:
    address = closed(
        {"street": {"type": "string"}, "zip": {"$ref": "#/definitions/zip"}}, definitions={"zip": {"type": "string"}}
    )
    schema = closed(
        {
            "home": {"$ref": "address.json"},
            "work": {"$ref": "address.json"},
            "kind": {"$ref": "#/$defs/kind"},
            "street_only": {"$ref": "address.json#/properties/street"},
        },
        **{"$defs": {"kind": {"enum": ["a", "b"]}}},
    )
    address_columns = (Column("street", "string"), Column("zip", "string"))
    assert columns_of(schema, {"address.json": address}) == (
        Column("home", "struct", address_columns),
        Column("work", "struct", address_columns),
        Column("kind", "string"),
        Column("street_only", "string"),
    )


def test_recursion_becomes_json_text_at_the_point_of_recursion() -> None:
    schema = {
        "$ref": "#/definitions/node",
        "definitions": {
            "node": closed(
                {"value": {"type": "integer"}, "children": {"type": "array", "items": {"$ref": "#/definitions/node"}}}
            )
        },
    }
    layout = json_layout(schema, {}, "value")
    assert layout.is_record
    assert layout.columns == (Column("value", "long"), Column("children", "list", (Column("element", "string"),)))
    assert ("children", "element") in layout.json_text


def test_top_level_non_objects_are_one_column_named_root() -> None:
    assert json_columns({"type": "array", "items": {"type": "integer"}}, {}, "key") == (
        Column("key", "list", (Column("element", "long"),)),
    )
    assert json_columns({"type": "string"}, {}, "key") == (Column("key", "string"),)
    assert json_columns({"type": "object", "additionalProperties": {"type": "number"}}, {}, "value") == (
        Column("value", "map", (Column("key", "string"), Column("value", "double"))),
    )
    layout = json_layout(True, {}, "value")
    assert (layout.columns, layout.is_record, layout.json_text) == ((Column("value", "string"),), False, {("value",)})


def test_a_nullable_top_level_object_is_a_record() -> None:
    schema = {"type": ["object", "null"], "properties": {"a": {"type": "string"}}, "additionalProperties": False}
    assert json_layout(schema, {}, "value").columns == (Column("a", "string"),)
