"""Protobuf decode micro-benchmark: ProtoSideDecoder.decode_many (what each Spark task of a Protobuf archive runs)
on the archive benchmark's Order payloads (bench/archive_formats_bench.py: PROTO_SCHEMA, `orders()`, Confluent's
envelope), with the compiled decoder (schema/codec/proto_columns.py) and without it (upb and proto_values), in one
process, alternated, the cyclic garbage collector paused as the archive pauses it (archive/decode_schema.gc_paused).

Run: PYTHONPATH=src .venv/bin/python bench/proto_decode_bench.py [--records 65000] [--rounds 3]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from google.protobuf import message_factory

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench.archive_formats_bench
from bench._decode_ab import compiled_ab  # noqa: E402
from bench.archive_formats_bench import KINDS, PROTO_SCHEMA, orders  # noqa: E402
from icelog.schema.codec import proto_decode  # noqa: E402
from icelog.schema.codec.proto_decode import ProtoSideDecoder  # noqa: E402
from icelog.schema.codec.sides import SideDecoding  # noqa: E402
from icelog.schema.protobuf_schema import build_pool, compile_schema, encode_envelope  # noqa: E402
from icelog.table.field_ids import evolve  # noqa: E402
from icelog.table.iceberg_types import arrow_schema, column_tree, table_columns  # noqa: E402
from icelog.table.protobuf_types import message_columns  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--records", type=int, default=65_000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    fds = compile_schema(PROTO_SCHEMA, {})
    descriptor = build_pool(fds).FindMessageTypeByName("bench.Order")
    cls = message_factory.GetMessageClass(descriptor)
    distinct = []
    for order in orders():
        message = cls(**{k: v for k, v in order.items() if k not in ("placed_at", "kind")},
                      kind=KINDS.index(order["kind"]))
        message.placed_at.FromMicroseconds(order["placed_at"])
        distinct.append(encode_envelope(1, [0]) + message.SerializeToString())  # as ProtobufSerializer frames it
    payloads: list[bytes | None] = [distinct[i % len(distinct)] for i in range(args.records)]
    records = evolve(table_columns(None, message_columns(descriptor)), [])
    decoding = SideDecoding("value", column_tree(records, "value"), 1, {1: fds}, "bench.Order")
    struct_type = arrow_schema(records).field("value").type
    decoder = ProtoSideDecoder(decoding)
    n = len(payloads)
    print(f"{n} payloads, {sum(map(len, distinct)) / len(distinct):.0f} bytes each on average; compiled decoder "
          f"built: {proto_decode.COMPILED}")

    compiled_ab(proto_decode, lambda: decoder.decode_many(payloads, struct_type), n, args.rounds, "upb",
                "upb + proto_values (no compiled decoder)")


if __name__ == "__main__":
    main()
