"""JSON decode micro-benchmark: JSONRows.decode_many against bare json.loads and against only iterating the bodies.

Run: PYTHONPATH=$PWD/src .venv/bin/python bench/json_decode_bench.py [--records 200000] [--repeat 5]

One process, no broker, no Spark: what one archive task spends turning JSON bodies (~200 bytes: a nested object,
an array, a map via additionalProperties, a date-time string, optional fields) into column values. The archive
target (issue 28) is JSON archive throughput >= 0.4 of the raw-bytes path; the raw decoder runs at ~370-450 k
records/s (bench/archive_formats_bench.py), so decode_many must stay well above that.
"""

from __future__ import annotations

import argparse
import gc
import json
import random
import time
from collections.abc import Callable

from icelog.schema.codec.json_codec import JSONRows, parse
from icelog.schema.json_schema import compile_json
from icelog.table.field_ids import Column
from icelog.table.json_types import json_columns

SCHEMA = {
    "$schema": "http://json-schema.org/draft-07/schema#",
    "type": "object",
    "properties": {
        "order_id": {"type": "integer"},
        "customer": {
            "type": "object",
            "properties": {"id": {"type": "string"}, "tier": {"type": ["string", "null"]}},
            "required": ["id"],
        },
        "amount": {"type": "number"},
        "placed_at": {"type": "string", "format": "date-time"},
        "items": {"type": "array", "items": {"type": "string"}},
        "attributes": {"type": "object", "additionalProperties": {"type": "string"}},
        "note": {"type": ["string", "null"]},
        "paid": {"type": "boolean"},
    },
    "required": ["order_id", "amount", "placed_at"],
}


def documents(n: int) -> list[bytes]:
    rng = random.Random(7)
    bodies = []
    for i in range(n):
        doc: dict[str, object] = {
            "order_id": i,
            "customer": {"id": f"c-{rng.randrange(10**6):06d}", "tier": rng.choice(["gold", "silver", None])},
            "amount": round(rng.uniform(1, 500), 2),
            "placed_at": f"2026-11-{1 + i % 28:02d}T{i % 24:02d}:{i % 60:02d}:{(i * 7) % 60:02d}.{i % 1000:03d}Z",
            "items": [f"sku-{rng.randrange(1000)}" for _ in range(rng.randrange(1, 4))],
            "attributes": {"channel": rng.choice(["web", "app"]), "region": rng.choice(["eu", "us"])},
            "paid": rng.random() < 0.5,
        }
        if rng.random() < 0.3:
            doc["note"] = "leave at the door"
        bodies.append(json.dumps(doc).encode())  # as confluent-kafka's JSONSerializer writes it (envelope stripped)
    return bodies


def rate(label: str, n: int, run: Callable[[], object], repeat: int) -> float:
    best = min(_timed(run) for _ in range(repeat))
    print(f"{label:<40} {n / best / 1000:8.0f} k records/s  ({best * 1000:.0f} ms for {n})")
    return n / best


def _timed(run: Callable[[], object]) -> float:
    start = time.perf_counter()
    run()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    bodies = documents(args.records)
    print(f"{args.records} bodies, mean {sum(map(len, bodies)) / len(bodies):.0f} bytes")
    schema = compile_json(json.dumps(SCHEMA), {})
    rows = JSONRows(schema, Column("value", "struct", json_columns(schema.document, {}, "value")))
    loads = json.loads

    def iterate() -> None:
        for _ in bodies:
            pass

    rate("iterate the bodies", len(bodies), iterate, args.repeat)
    loads_rate = rate("json.loads each body", len(bodies), lambda: [loads(b) for b in bodies], args.repeat)

    def loads_without_gc() -> None:
        gc.disable()
        try:
            [loads(b) for b in bodies]
        finally:
            gc.enable()

    bare = rate("json.loads each body, cyclic GC off", len(bodies), loads_without_gc, args.repeat)

    def parse_without_gc() -> None:
        gc.disable()
        try:
            [parse(b) for b in bodies]
        finally:
            gc.enable()

    rate("json_codec.parse each body, GC off", len(bodies), parse_without_gc, args.repeat)
    many = rate("JSONRows.decode_many", len(bodies), lambda: rows.decode_many(bodies), args.repeat)
    one = rate("JSONRows.decode per body", len(bodies), lambda: [rows.decode(b) for b in bodies], args.repeat)
    print(
        f"decode_many / json.loads = {many / loads_rate:.2f} (GC off: {many / bare:.2f}); "
        f"decode_many / decode per body = {many / one:.2f}"
    )


if __name__ == "__main__":
    main()
