"""Live reads of topics whose tables hold payloads as columns: Avro values through the embedded registry (Confluent's
serializer), in the record and the table layout. The tail is decoded into the snapshot's columns with every version
of the subject, as a pass decodes it: its rows equal the rows the next pass writes; a payload of a newer version
whose field the table does not have yet keeps its bytes."""

from __future__ import annotations

from typing import Any

import pytest
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.serialization import MessageField, SerializationContext

from icelog import live
from icelog.archive.archiver import Archiver
from icelog.config import Settings
from tests.archive.test_archive_avro_json import ORDER_V1, ORDER_V2, avro_serializer, order
from tests.archive.test_archive_protobuf import produce_all
from tests.support.broker import BrokerProcess
from tests.support.clients_util import create_topic

pytestmark = pytest.mark.slow


def offset_of(row: dict[str, Any], layout: str) -> int:
    return int(row["__offset"] if layout == "table" else row["kafka"]["offset"])


@pytest.mark.parametrize("layout", ["record", "table"])
def test_avro_topic_tail_decoded_into_the_tables_columns(
    lake_broker: BrokerProcess, lake_settings: Settings, lake_archiver: Archiver, lake_spark: Any, layout: str
) -> None:
    topic = f"live-avro-{layout}"
    create_topic(lake_broker.bootstrap, topic, 1, {"icelog.archive.layout": layout})
    registry = SchemaRegistryClient({"url": lake_broker.registry_url})
    ctx = SerializationContext(topic, MessageField.VALUE)
    v1, v2 = avro_serializer(registry, ORDER_V1), avro_serializer(registry, ORDER_V2)
    produce_all(lake_broker, topic, [(f"k{i}".encode(), v1(order(i), ctx)) for i in range(20)])
    [result] = lake_archiver.run_pass(force=True, topics=[topic])
    assert result.records == 20 and not result.error, result
    produce_all(lake_broker, topic, [(f"k{i}".encode(), v1(order(i), ctx)) for i in range(20, 32)])

    def rows() -> list[dict[str, Any]]:
        found = live.scan(topic, data_dir=str(lake_settings.data_dir)).read_all().to_pylist()
        return sorted(found, key=lambda r: offset_of(r, layout))

    live_rows = rows()
    assert [offset_of(r, layout) for r in live_rows] == list(range(32))
    ids = [r["id"] if layout == "table" else r["value"]["id"] for r in live_rows]
    assert ids == [1000 + i for i in range(32)]
    # The Spark DataFrame of the same cut: the tail decoded in Spark's workers into Spark's types of the columns.
    frame = live.dataframe(lake_spark, topic, data_dir=str(lake_settings.data_dir))
    id_column, attrs = ("id", "attrs") if layout == "table" else ("value.id", "value.attrs")
    got = sorted((r[0], r[1]) for r in frame.select(id_column, attrs).collect())
    assert got == sorted((r["id"] if layout == "table" else r["value"]["id"],
                          dict(r["attrs"] if layout == "table" else r["value"]["attrs"])) for r in live_rows)
    [result] = lake_archiver.run_pass(force=True, topics=[topic])
    assert result.records == 12 and not result.error, result
    assert rows() == live_rows  # the tail's rows were the pass's, every column

    # A newer version adds a field the table does not have yet: the tail keeps those payloads' bytes.
    payloads = [v2(order(i, version=2), ctx) for i in range(32, 36)]
    produce_all(lake_broker, topic, [(f"k{i}".encode(), p) for i, p in zip(range(32, 36), payloads, strict=True)])
    newer = rows()[32:]
    assert [r["id"] if layout == "table" else r["value"]["id"] for r in newer] == [1032, 1033, 1034, 1035]
    kept = [r["__value"] if layout == "table" else r["value"]["__raw__"] for r in newer]
    assert kept == payloads
