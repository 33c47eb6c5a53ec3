"""JSON decode micro-benchmark: RecordSideDecoder.decode_many (what each Spark task of a JSON archive runs) on the
archive benchmark's Order documents (bench/archive_formats_bench.py: JSON_SCHEMA, `orders()`, `_iso`, framed by
confluent-kafka's JSONSerializer), with the compiled decoder (schema/codec/json_columns.py) and without it (json.loads'
C scanner and json_codec's converters), in one process, alternated, the cyclic garbage collector paused as the
archive pauses it (archive/decode_schema.gc_paused).

Run: PYTHONPATH=src .venv/bin/python bench/json_decode_bench.py [--records 65000] [--rounds 3]
"""

from __future__ import annotations

import argparse
import base64
import json
import sys
from pathlib import Path

from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.json_schema import JSONSerializer
from confluent_kafka.serialization import MessageField, SerializationContext

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench.archive_formats_bench
from bench._decode_ab import compiled_ab  # noqa: E402
from bench.archive_formats_bench import JSON_SCHEMA, _iso, orders  # noqa: E402
from icelog.schema.codec import json_columns  # noqa: E402
from icelog.schema.codec.record_decode import RecordSideDecoder, split_envelope  # noqa: E402
from icelog.schema.codec.sides import SideDecoding  # noqa: E402
from icelog.schema.compiled import JSON  # noqa: E402
from icelog.schema.json_schema import compile_json  # noqa: E402
from icelog.table.field_ids import evolve  # noqa: E402
from icelog.table.iceberg_types import arrow_schema, column_tree, table_columns  # noqa: E402
from icelog.table.json_types import json_columns as table_fields  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--records", type=int, default=65_000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    text = json.dumps(JSON_SCHEMA)
    registry = SchemaRegistryClient.new_client({"url": "mock://json-decode-bench"})
    serialize = JSONSerializer(text, registry, conf={"auto.register.schemas": True})
    ctx = SerializationContext("bench-json", MessageField.VALUE)
    distinct = [serialize({**order, "placed_at": _iso(order["placed_at"]),
                           "checksum": base64.b64encode(order["checksum"]).decode()}, ctx) for order in orders()]
    envelope = split_envelope(distinct[0])
    assert envelope is not None
    schema_id = envelope[0]
    payloads: list[bytes | None] = [distinct[i % len(distinct)] for i in range(args.records)]
    schema = compile_json(text, {})
    records = evolve(table_columns(None, table_fields(schema.document, {}, "value")), [])
    decoding = SideDecoding("value", column_tree(records, "value"), schema_id, {schema_id: schema}, schema_type=JSON)
    struct_type = arrow_schema(records).field("value").type
    decoder = RecordSideDecoder(decoding)
    n = len(payloads)
    print(f"{n} payloads, {sum(len(p) for p in distinct) / len(distinct):.0f} bytes each on average; compiled "
          f"decoder built: {json_columns.COMPILED}")

    compiled_ab(json_columns, lambda: decoder.decode_many(payloads, struct_type), n, args.rounds, "python",
                "json.loads + converters (no compiled decoder)")


if __name__ == "__main__":
    main()
