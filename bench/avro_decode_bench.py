"""Avro decode micro-benchmark on ~200-byte datums of a realistic schema (nested record, array, map, union,
timestamp-millis, decimal, enum): the archive's hot path, the compiled decoder straight to Arrow columns
(schema/codec/avro_columns.py) and the whole side decoder around it (RecordSideDecoder.decode_many: envelopes,
__raw__), against fastavro's path (AvroRows.decode_many, with the write-back that proves each row rebuilds its
body), doing nothing with the bodies, fastavro's bare reader, and json.loads of the same data as JSON text.

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
from icelog.schema.codec.avro_columns import ColumnDecoder  # noqa: E402
from icelog.schema.codec.record_decode import RecordSideDecoder  # noqa: E402
from icelog.schema.codec.sides import SideDecoding  # noqa: E402
from icelog.schema.compiled import AVRO  # noqa: E402
from icelog.table.avro_types import avro_columns  # noqa: E402
from icelog.table.field_ids import Column, evolve  # noqa: E402
from icelog.table.iceberg_types import arrow_schema, column_tree, table_columns  # noqa: E402
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

    fastavro = best_rate("AvroRows.decode_many, gc disabled", n, args.repeat, without_gc)
    print(f"decode_many / nothing: {rate / nothing:.4f}")

    records = evolve(table_columns(None, avro_columns(schema.document, "value")), [])
    column, struct_type = column_tree(records, "value"), arrow_schema(records).field("value").type
    columns = ColumnDecoder.for_schema(schema, column, struct_type)
    if columns is None:
        raise SystemExit("the compiled Avro decoder is not built (pip install -e .) or does not cover the schema")
    compiled = best_rate("compiled decoder to Arrow columns", n, args.repeat, lambda: columns.decode(bodies))
    side = RecordSideDecoder(SideDecoding("value", column, 1, {1: schema}, schema_type=AVRO))
    payloads: list[bytes | None] = [b"\0\0\0\0\x01" + b for b in bodies]
    whole = best_rate("RecordSideDecoder.decode_many (compiled)", n, args.repeat,
                      lambda: side.decode_many(payloads, struct_type))
    print(json.dumps({"records": n, "fastavro_records_per_s": round(fastavro),
                      "compiled_records_per_s": round(compiled), "side_decoder_records_per_s": round(whole),
                      "compiled_over_fastavro": round(compiled / fastavro, 1)}))


if __name__ == "__main__":
    main()
