"""Avro decode micro-benchmark: AvroRows.decode_many (the archive's hot path) on ~200-byte datums of a realistic
schema (nested record, array, map, union, timestamp-millis, decimal, enum), against doing nothing with the bodies,
fastavro's bare reader, and json.loads of the same data as JSON text.

Run: PYTHONPATH=src .venv/bin/python bench/avro_decode_bench.py [--records 50000] [--repeat 5]
"""

from __future__ import annotations

import argparse
import gc
import io
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path

from fastavro import schemaless_reader

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests.schema.avro_fixtures
from icelog.schema.avro_schema import compile_avro  # noqa: E402
from icelog.schema.codec.avro_codec import AvroRows  # noqa: E402
from icelog.table.avro_types import avro_columns  # noqa: E402
from icelog.table.field_ids import Column  # noqa: E402
from tests.schema.avro_fixtures import ORDER, ORDER_TEXT, REFERENCES, body, order, order_named  # noqa: E402


def best_rate(label: str, n: int, repeat: int, run: Callable[[], object]) -> float:
    best = min(_timed(run) for _ in range(repeat))
    rate = n / best
    print(f"{label:<44} {rate:>12,.0f} records/s  ({best * 1e6 / n:.2f} µs/record)")
    return rate


def _timed(run: Callable[[], object]) -> float:
    start = time.perf_counter()
    run()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--records", type=int, default=50_000)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    n = args.records
    schema = compile_avro(ORDER_TEXT, REFERENCES)
    rows = AvroRows(schema, Column("value", "struct", avro_columns(schema.document, "value")))
    named = order_named()
    bodies = [body(ORDER, order(i), named) for i in range(n)]
    texts = [json.dumps(rows.decode(b), default=str).encode() for b in bodies]
    print(f"{n} records, Avro body {sum(map(len, bodies)) / n:.0f} bytes, JSON {sum(map(len, texts)) / n:.0f} bytes")
    raw = rows._raw
    nothing = best_rate("nothing (iterate the bodies)", n, args.repeat, lambda: [len(b) for b in bodies])
    best_rate("json.loads of the same data", n, args.repeat, lambda: [json.loads(t) for t in texts])
    best_rate(
        "fastavro schemaless_reader (no conversion)", n, args.repeat,
        lambda: [schemaless_reader(io.BytesIO(b), raw, None) for b in bodies],
    )
    best_rate("AvroRows.decode per body", n, args.repeat, lambda: [rows.decode(b) for b in bodies])
    rate = best_rate("AvroRows.decode_many", n, args.repeat, lambda: rows.decode_many(bodies))

    def without_gc() -> object:  # what a Spark worker could do around a batch: no cyclic garbage is made
        gc.disable()
        try:
            return rows.decode_many(bodies)
        finally:
            gc.enable()

    best_rate("AvroRows.decode_many, gc disabled", n, args.repeat, without_gc)
    print(f"decode_many / nothing: {rate / nothing:.4f}")


if __name__ == "__main__":
    main()
