"""A realistic Avro schema (nested records, arrays, maps, enums, unions, optional fields, logical types) and bodies
as confluent-kafka's AvroSerializer writes them (fastavro's schemaless_writer: the serializer's body after its
5-byte envelope)."""

from __future__ import annotations

import datetime
import decimal
import io
import json
import uuid
from typing import Any

import fastavro

ADDRESS = {
    "type": "record",
    "name": "Address",
    "namespace": "com.acme",
    "fields": [
        {"name": "street", "type": "string"},
        {"name": "city", "type": "string"},
        {"name": "zip", "type": ["null", "string"], "default": None},
    ],
}

ORDER_FIELDS: list[dict[str, Any]] = [
    {"name": "id", "type": "long"},
    {"name": "customer", "type": "string"},
    {"name": "status", "type": {"type": "enum", "name": "Status", "symbols": ["NEW", "PAID", "SHIPPED"]}},
    {"name": "amount", "type": {"type": "bytes", "logicalType": "decimal", "precision": 12, "scale": 2}},
    {"name": "created", "type": {"type": "long", "logicalType": "timestamp-millis"}},
    {"name": "day", "type": {"type": "int", "logicalType": "date"}},
    {"name": "ship_to", "type": "com.acme.Address"},
    {"name": "bill_to", "type": ["null", "com.acme.Address"], "default": None},
    {
        "name": "lines",
        "type": {
            "type": "array",
            "items": {
                "type": "record",
                "name": "Line",
                "fields": [
                    {"name": "sku", "type": "string"},
                    {"name": "qty", "type": "int"},
                    {"name": "price", "type": "double"},
                ],
            },
        },
    },
    {"name": "attrs", "type": {"type": "map", "values": "string"}},
    {"name": "note", "type": ["null", "string"], "default": None},
    {"name": "ref", "type": {"type": "string", "logicalType": "uuid"}},
    {"name": "choice", "type": ["null", "long", "string", "com.acme.Address"], "default": None},
]
ORDER = {"type": "record", "name": "Order", "namespace": "com.acme", "fields": ORDER_FIELDS}
ORDER_TEXT = json.dumps(ORDER)
ADDRESS_TEXT = json.dumps(ADDRESS)
REFERENCES = {"com.acme.Address": ADDRESS_TEXT}
CREATED = datetime.datetime(2026, 11, 25, 19, 0, tzinfo=datetime.UTC)


def order(i: int) -> dict[str, Any]:
    """One order as a producer hands it to AvroSerializer (datetime, date, Decimal, UUID)."""
    return {
        "id": 1_000_000 + i,
        "customer": f"customer-{i % 977}",
        "status": ("NEW", "PAID", "SHIPPED")[i % 3],
        "amount": decimal.Decimal(i * 37 % 100_000) / 100 - (500 if i % 7 == 0 else 0),
        "created": CREATED + datetime.timedelta(milliseconds=i * 1013),
        "day": datetime.date(2026, 1, 1) + datetime.timedelta(days=i % 365),
        "ship_to": {"street": f"{i} Main St", "city": "Springfield", "zip": None if i % 2 else "12345"},
        "bill_to": None if i % 3 else {"street": "1 Bill Rd", "city": "Shelbyville", "zip": "54321"},
        "lines": [{"sku": f"SKU-{i % 50}-{n}", "qty": n + 1, "price": 9.99 * (n + 1)} for n in range(i % 3 + 1)],
        "attrs": {"channel": "web", "coupon": f"C{i % 10}"} if i % 4 else {},
        "note": None if i % 5 else "leave at the door",
        "ref": str(uuid.UUID(int=i * 7919)),
        "choice": (None, i, f"s{i}", ("com.acme.Address", {"street": "x", "city": "y", "zip": None}))[i % 4],
    }


def body(schema: dict[str, Any], datum: Any, named: dict[str, Any] | None = None) -> bytes:
    """The body AvroSerializer writes for `datum` (its output after the 5-byte envelope)."""
    parsed = fastavro.parse_schema(schema, named_schemas=dict(named or {}))
    stream = io.BytesIO()
    fastavro.schemaless_writer(stream, parsed, datum)
    return stream.getvalue()


def order_named() -> dict[str, Any]:
    named: dict[str, Any] = {}
    fastavro.parse_schema(ADDRESS, named_schemas=named)
    return named
