"""Protobuf decode micro-benchmark: ProtoSideDecoder.decode_many (what each Spark task of a Protobuf archive runs)
on the archive benchmark's Order payloads (bench/archive_formats_bench.py: PROTO_SCHEMA, `orders()`, Confluent's
envelope), with the compiled decoder (schema/codec/proto_columns.py) and without it (upb and proto_values), in one
process, alternated, the cyclic garbage collector paused as the archive pauses it (archive/decode_schema.gc_paused).

Run: PYTHONPATH=src .venv/bin/python bench/proto_decode_bench.py [--records 65000] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from google.protobuf import message_factory

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench.archive_formats_bench
from bench.archive_formats_bench import KINDS, PROTO_SCHEMA, orders  # noqa: E402
from icelog.archive.decode_schema import gc_paused  # noqa: E402
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

    def run(compiled: bool) -> tuple[float, object]:
        saved = proto_decode.COMPILED
        proto_decode.COMPILED = compiled and saved  # type: ignore[misc]
        try:
            with gc_paused():
                start = time.perf_counter()
                out = decoder.decode_many(payloads, struct_type)
                return time.perf_counter() - start, out
        finally:
            proto_decode.COMPILED = saved  # type: ignore[misc]

    fast, slow = run(True)[1], run(False)[1]  # warm-up (message classes, the program), and the same rows
    assert fast.equals(slow), "the compiled decoder's rows differ from upb's"
    rates: dict[bool, list[float]] = {True: [], False: []}
    for _ in range(args.rounds):
        for compiled in (False, True):
            seconds, _ = run(compiled)
            rates[compiled].append(n / seconds)
    for compiled, label in ((False, "upb + proto_values (no compiled decoder)"), (True, "compiled decoder")):
        best = max(rates[compiled])
        print(f"{label:<42} " + "  ".join(f"{r:>10,.0f}" for r in rates[compiled])
              + f" records/s  (best {1e6 / best:.2f} µs/record)")
    print(f"speed-up (best / best): {max(rates[True]) / max(rates[False]):.1f}x")
    print(json.dumps({"records": n, "upb_records_per_s": round(max(rates[False])),
                      "compiled_records_per_s": round(max(rates[True])),
                      "compiled_over_upb": round(max(rates[True]) / max(rates[False]), 1)}))


if __name__ == "__main__":
    main()
