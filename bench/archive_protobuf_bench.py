"""Protobuf archive benchmark: archiving a 10-field Protobuf message against the same records archived raw.

Run: .venv/bin/python bench/archive_protobuf_bench.py [--records 1000000]

One broker (with its embedded schema registry), one Spark session (local[*]), in one run:
  1. the same serialized records (Confluent envelope + a 10-field message, ~60 bytes) are produced to two
     topics: `bench-pb` (icelog.schema.value=topic-name: decoded into columns) and `bench-raw`
     (icelog.schema.value=none: the raw layout, value.__raw__);
  2. one archive pass (`Archiver.run_pass(force=True)`) per topic: records/s and the ratio pb / raw;
  3. single-process decode rates (records/s) of the raw decoder and the Protobuf decoder on the same archive,
     which is what each Spark task runs.
Warm-up passes on small topics come first so JIT, Python workers and the catalog are warm for both.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import confluent_kafka as ck
from confluent_kafka.admin import AdminClient, NewTopic
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.protobuf import ProtobufSerializer
from confluent_kafka.serialization import MessageField, SerializationContext
from google.protobuf import message_factory

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests.support
from icelog.archive.archiver import Archiver  # noqa: E402
from icelog.archive.decode import decode_archive  # noqa: E402
from icelog.archive.decode_schema import decode_archive_schema  # noqa: E402
from icelog.archive.plan import ChunkRef, PlannedArchive  # noqa: E402
from icelog.config import load_settings  # noqa: E402
from icelog.meta.backends import open_store  # noqa: E402
from icelog.schema.protobuf_schema import build_pool, compile_schema  # noqa: E402
from tests.support.broker import BrokerProcess  # noqa: E402

PARTITIONS = 2
SCHEMA = """syntax = "proto3";
package bench;
import "google/protobuf/timestamp.proto";
enum Kind { KIND_UNSPECIFIED = 0; BUY = 1; SELL = 2; }
message Order {
  string order_id = 1;
  int64 customer_id = 2;
  int32 quantity = 3;
  double price = 4;
  bool priority = 5;
  Kind kind = 6;
  string sku = 7;
  google.protobuf.Timestamp placed_at = 8;
  repeated string tags = 9;
  bytes checksum = 10;
}
"""


def create_topic(bootstrap: str, topic: str, configs: dict[str, str]) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, PARTITIONS, 1, config=configs)])[topic].result(30)


def payloads(registry_url: str, topic: str, count: int) -> list[bytes]:
    """`count` serialized Order messages (ProtobufSerializer: envelope + message), 1000 distinct ones."""
    cls = message_factory.GetMessageClass(build_pool(compile_schema(SCHEMA, {})).FindMessageTypeByName("bench.Order"))
    serialize = ProtobufSerializer(cls, SchemaRegistryClient({"url": registry_url}), {"use.deprecated.format": False})
    ctx = SerializationContext(topic, MessageField.VALUE)
    distinct = []
    for i in range(1000):
        message = cls(
            order_id=f"order-{i:08d}", customer_id=10**9 + i, quantity=i % 50, price=i * 0.25, priority=i % 7 == 0,
            kind=i % 3, sku=f"SKU-{i % 97:04d}", tags=["a", "b"][: i % 3], checksum=os.urandom(8),
        )
        message.placed_at.FromMicroseconds(1_700_000_000_000_000 + i)
        distinct.append(serialize(message, ctx))
    return [distinct[i % 1000] for i in range(count)]


def produce(bootstrap: str, topic: str, values: list[bytes]) -> None:
    prod = ck.Producer({"bootstrap.servers": bootstrap, "compression.type": "lz4", "linger.ms": 5,
                        "batch.size": 1_000_000, "queue.buffering.max.messages": 2_000_000})
    for i, value in enumerate(values):
        while True:
            try:
                prod.produce(topic, value=value, partition=i % PARTITIONS)
                break
            except BufferError:
                prod.poll(0.01)
    assert prod.flush(300) == 0


def archive_rate(archiver: Archiver, topic: str, records: int) -> float:
    started = time.perf_counter()
    [result] = archiver.run_pass(force=True, topics=[topic])
    elapsed = time.perf_counter() - started
    assert not result.error and result.records == records, result
    return records / elapsed


def decode_rates(archiver: Archiver, store: Any, pb_topic: str, intake: Path) -> dict[str, float]:
    """Single-process records/s of the raw and the Protobuf decoder over partition 0 of `pb_topic`."""
    topic = store.get_topic(pb_topic)
    chunks = [c for c in store.intake_chunks(topic.topic_id) if c.partition == 0]
    refs = tuple(ChunkRef(c.file_id, c.position, c.length, c.base_offset, c.end_offset, c.ingest_timestamp)
                 for c in chunks)
    archive = PlannedArchive(topic.topic_id, 0, chunks[0].base_offset, chunks[-1].end_offset, refs, "bench")
    config = archiver.topic_config(topic)
    schema = archiver.schemas.resolve(topic, config, archiver.table_name(config))
    assert schema is not None
    out = {}
    started = time.perf_counter()
    rows = sum(b.num_rows for b in decode_archive(intake, archive))
    out["raw_decode_records_per_s"] = rows / (time.perf_counter() - started)
    started = time.perf_counter()
    rows = sum(b.num_rows for b in decode_archive_schema(intake, archive, schema.key, schema.value,
                                                           schema.arrow_schema()))
    out["protobuf_decode_records_per_s"] = rows / (time.perf_counter() - started)
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--records", type=int, default=1_000_000)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="icelog-pb-bench-"))
    broker = BrokerProcess(work / "data", env={"ICELOG_ARCHIVE__DEFAULT_KIND": "iceberg",
                                               "ICELOG_ARCHIVE__ENABLED": "false"}).start()
    try:
        settings = load_settings(data_dir=str(broker.data_dir), registry_listen=f"127.0.0.1:{broker.registry_port}")
        from icelog.lake.spark import create_session

        spark = create_session(settings, "icelog-pb-bench")
        store = open_store(settings.metadata_url)
        archiver = Archiver(settings, spark, store)
        pb_config = {"icelog.schema.value": "topic-name"}
        raw_config = {"icelog.schema.value": "none"}
        for suffix, count in (("warm-up", 20_000), ("", args.records)):
            pb, raw = f"bench-pb{'-' + suffix if suffix else ''}", f"bench-raw{'-' + suffix if suffix else ''}"
            create_topic(broker.bootstrap, pb, pb_config)
            create_topic(broker.bootstrap, raw, raw_config)
            values = payloads(broker.registry_url, pb, count)
            produce(broker.bootstrap, pb, values)
            produce(broker.bootstrap, raw, values)
            raw_rate = archive_rate(archiver, raw, count)
            pb_rate = archive_rate(archiver, pb, count)
        decode = decode_rates(archiver, store, "bench-pb", Path(settings.data_dir).resolve() / "intake")
        result = {
            "records": args.records,
            "value_bytes": len(values[0]),
            "archive_raw_records_per_s": round(raw_rate),
            "archive_protobuf_records_per_s": round(pb_rate),
            "ratio_protobuf_to_raw": round(pb_rate / raw_rate, 3),
            **{k: round(v) for k, v in decode.items()},
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
        }
        print(json.dumps(result, indent=2))
        out = Path(__file__).parent / "results" / "archive_protobuf.json"
        out.parent.mkdir(exist_ok=True)
        out.write_text(json.dumps(result, indent=2) + "\n")
        spark.stop()
        store.close()
    finally:
        broker.stop()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
