"""Read-back of a Protobuf topic: values stored as decoded columns (`__raw__` null) come back byte for byte.

confluent-kafka's ProtobufSerializer produces through the embedded registry; the real Spark archiver
decodes into columns; the intake is trimmed; consumers then read the bytes rebuilt from the columns, also
after the schema evolves (a field added: the table gains a column, old rows keep theirs null).
"""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import pytest
from confluent_kafka import Producer
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.protobuf import ProtobufSerializer
from confluent_kafka.serialization import MessageField, SerializationContext
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

from icelog.archive.archiver import Archiver
from icelog.meta.store import MetadataStore
from tests.readback.test_readback import archive_and_trim
from tests.support.broker import BrokerProcess
from tests.support.clients_util import CLIENTS, create_topic

pytestmark = pytest.mark.slow

V1 = """
syntax = "proto3";
package rb;
message Reading { int64 id = 1; string sensor = 2; double value = 3; repeated string tags = 4; bytes blob = 5; }
"""
V2 = V1.replace("bytes blob = 5; }", "bytes blob = 5; int32 level = 6; }")


def compile_proto(tmp: Any, name: str, text: str) -> Any:
    """The message class of `text`'s Reading, in a pool of its own (so two versions of rb.Reading coexist)."""
    out = tmp / name
    out.mkdir()
    (out / "rb.proto").write_text(text)
    subprocess.run([sys.executable, "-m", "grpc_tools.protoc", f"-I{out}", f"--descriptor_set_out={out}/rb.pb",
                    "rb.proto"], check=True)
    fds = descriptor_pb2.FileDescriptorSet.FromString((out / "rb.pb").read_bytes())
    pool = descriptor_pool.DescriptorPool()
    for file in fds.file:
        pool.Add(file)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("rb.Reading"))


def produce(broker: BrokerProcess, topic: str, messages: list[Any], registry: SchemaRegistryClient) -> None:
    serialize = ProtobufSerializer(type(messages[0]), registry, {"use.deprecated.format": False})
    ctx = SerializationContext(topic, MessageField.VALUE)
    producer = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 5, "compression.type": "snappy"})
    for i, message in enumerate(messages):
        producer.produce(topic, key=f"k{i}".encode(), value=serialize(message, ctx), partition=0,
                         headers=[("n", str(i).encode())])
    assert producer.flush(30) == 0


def test_protobuf_rows_rebuild_what_was_produced_before_and_after_evolution(
    lake_broker: BrokerProcess, lake_archiver: Archiver, lake_store: MetadataStore, lake_spark: Any,
    tmp_path: Any,
) -> None:
    topic = "rb-proto"
    v1, v2 = compile_proto(tmp_path, "rb_v1", V1), compile_proto(tmp_path, "rb_v2", V2)
    registry = SchemaRegistryClient({"url": lake_broker.registry_url})
    create_topic(lake_broker.bootstrap, topic, 1, {"icelog.intake.retention.ms": "0"})
    produce(lake_broker, topic, [v1(id=i, sensor=f"s{i} ü", value=i / 3, tags=[f"t{j}" for j in range(i % 3)],
                                            blob=bytes([i, 0, 255])) for i in range(30)], registry)
    before = CLIENTS["confluent"].consume(lake_broker.bootstrap, topic, [0], "earliest", 30)
    assert len(before) == 30
    archive_and_trim(lake_archiver, lake_store, topic, [r for r in before])
    rows = lake_spark.sql(f"SELECT value FROM lake.icelog.`{topic}` ORDER BY kafka.offset").collect()
    assert rows[1].value["sensor"] == "s1 ü" and rows[1].value["__raw__"] is None  # stored once, as columns

    for name in CLIENTS:
        assert CLIENTS[name].consume(lake_broker.bootstrap, topic, [0], "earliest", 30) == before, name

    # The schema evolves: a new field, a new column; old rows rebuild as before, new ones with the field.
    produce(lake_broker, topic, [v2(id=100 + i, sensor="new", value=1.5, level=i + 1) for i in range(10)],
            registry)
    before = CLIENTS["confluent"].consume(lake_broker.bootstrap, topic, [0], "earliest", 40)
    archive_and_trim(lake_archiver, lake_store, topic, before)
    columns = lake_spark.sql(f"SELECT * FROM lake.icelog.`{topic}`").schema["value"].dataType.names
    assert "level" in columns
    for name in ("confluent", "kafka-python"):
        assert CLIENTS[name].consume(lake_broker.bootstrap, topic, [0], "earliest", 40) == before, name
