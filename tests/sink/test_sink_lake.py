"""`icelog sink` beyond raw topics: typed tables through the source's schema registry, a catalog taken away for a
minute while the sink runs, and `icelog serve` running the configured sinks (over SASL_SSL).

As in test_sink.py, a second icelog broker with archiving off stands in for the external cluster (one for the
module); real clients produce to it and the sink runs as a user runs it, in a process of its own.
"""

from __future__ import annotations

import datetime
import json
import re
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroSerializer
from confluent_kafka.schema_registry.protobuf import ProtobufSerializer
from confluent_kafka.serialization import MessageField, SerializationContext

from tests.archive.test_archive_avro_json import duckdb_rows
from tests.readback.test_readback_protobuf import compile_proto
from tests.support.archive import create_topic, produce, wait_for
from tests.support.broker import BrokerProcess
from tests.support.metrics import scrape_text, value
from tests.support.postgres import PASSWORD, ROLE, PostgresCluster, start_cluster
from tests.support.sink import SINK, Lake, end_offsets, group_offsets, record_rows, sink_status_lines

pytestmark = [pytest.mark.spark, pytest.mark.slow]

UTC = datetime.UTC


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    proc = BrokerProcess(tmp_path_factory.mktemp("source") / "data").start()  # archiving off: a plain Kafka
    yield proc
    proc.stop()


# -- 1. typed tables through the source's registry ---------------------------------------------------------------

ORDER = {
    "type": "record", "name": "Order", "namespace": "shop",
    "fields": [
        {"name": "id", "type": "long"},
        {"name": "customer", "type": {"type": "record", "name": "Customer", "fields": [
            {"name": "name", "type": "string"},
            {"name": "email", "type": ["null", "string"], "default": None},
        ]}},
        {"name": "items", "type": {"type": "array", "items": "string"}},
        {"name": "attrs", "type": {"type": "map", "values": "long"}},
        {"name": "status", "type": {"type": "enum", "name": "Status", "symbols": ["NEW", "PAID", "SHIPPED"]}},
        {"name": "placed_at", "type": {"type": "long", "logicalType": "timestamp-millis"}},
    ],
}

READING = """
syntax = "proto3";
package rb;
message Reading {
  enum Kind { KIND_UNSPECIFIED = 0; TEMPERATURE = 1; HUMIDITY = 2; }
  message Location { double lat = 1; double lon = 2; }
  int64 id = 1;
  string sensor = 2;
  double value = 3;
  repeated string tags = 4;
  Location location = 5;
  Kind kind = 6;
}
"""
NOT_AVRO = b"plain bytes, no Confluent envelope"


def order(i: int) -> dict[str, Any]:
    return {
        "id": 1000 + i,
        "customer": {"name": f"cust {i} ü", "email": None if i % 3 == 0 else f"c{i}@example.com"},
        "items": [f"sku-{j}" for j in range(i % 3)],
        "attrs": {f"a{j}": j * 10 for j in range(i % 4)},
        "status": ["NEW", "PAID", "SHIPPED"][i % 3],
        "placed_at": datetime.datetime(2026, 11, 25, 12, 0, i, 123000, tzinfo=UTC),
    }


def reading(i: int) -> dict[str, Any]:
    return {"id": i, "sensor": f"s{i} ü", "value": i / 4, "tags": [f"t{j}" for j in range(i % 3)],
            "location": {"lat": 52.5, "lon": 13.0 + i}, "kind": ["KIND_UNSPECIFIED", "TEMPERATURE", "HUMIDITY"][i % 3]}


def send_all(source: BrokerProcess, topic: str, values: list[bytes]) -> None:
    producer = Producer({"bootstrap.servers": source.bootstrap, "linger.ms": 5})
    for i, payload in enumerate(values):
        producer.produce(topic, key=f"k{i}".encode(), value=payload, partition=0)
    assert producer.flush(30) == 0


def typed(row_value: dict[str, Any]) -> dict[str, Any]:
    """A typed side's columns as the producer's object (pyarrow gives a map as (key, value) pairs)."""
    out = {k: v for k, v in row_value.items() if k not in ("__prefix__", "__err__", "__raw__")}
    if "attrs" in out:
        out["attrs"] = dict(out["attrs"])
    return out


def test_a_sink_with_the_sources_registry_writes_typed_tables_and_an_undecodable_record_does_not_stall(
    tmp_path: Path, source: BrokerProcess,
) -> None:
    from pyiceberg import types as t

    avro_topic, proto_topic = "typed-orders", "typed-readings"
    create_topic(source, avro_topic, 1)
    create_topic(source, proto_topic, 1)
    registry = SchemaRegistryClient({"url": source.registry_url})
    to_avro = AvroSerializer(registry, json.dumps(ORDER))
    avro_ctx = SerializationContext(avro_topic, MessageField.VALUE)
    # Offset 6 holds bytes with no envelope: they decode with no schema; the records after it must still arrive.
    avro_values = [to_avro(order(i), avro_ctx) for i in range(6)] + [NOT_AVRO]
    avro_values += [to_avro(order(i), avro_ctx) for i in range(6, 12)]
    send_all(source, avro_topic, avro_values)
    reading_class = compile_proto(tmp_path, "reading", READING)
    to_proto = ProtobufSerializer(reading_class, registry, {"use.deprecated.format": False})
    proto_ctx = SerializationContext(proto_topic, MessageField.VALUE)
    messages = [reading_class(id=r["id"], sensor=r["sensor"], value=r["value"], tags=r["tags"],
                              location=r["location"], kind=r["kind"]) for r in map(reading, range(10))]
    send_all(source, proto_topic, [to_proto(m, proto_ctx) for m in messages])

    lake = Lake(tmp_path, source)
    lake.topics = [avro_topic, proto_topic]
    lake.write_config(registry_url=source.registry_url)
    done = lake.sink_once()
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    assert "Traceback" not in done.stdout + done.stderr

    # pyiceberg: typed columns, the values produced; the undecodable record is a row of its own (__err__, __raw__).
    avro_table = lake.table(avro_topic)
    avro_value = avro_table.schema().find_field("value").field_type
    assert isinstance(avro_value, t.StructType)
    assert isinstance(avro_value.field_by_name("customer").field_type, t.StructType)
    assert isinstance(avro_value.field_by_name("items").field_type, t.ListType)
    assert isinstance(avro_value.field_by_name("attrs").field_type, t.MapType)
    assert isinstance(avro_value.field_by_name("status").field_type, t.StringType)
    assert isinstance(avro_value.field_by_name("placed_at").field_type, t.TimestamptzType)
    rows = sorted(avro_table.scan().to_arrow().to_pylist(), key=lambda r: r["kafka"]["offset"])
    assert [r["kafka"]["offset"] for r in rows] == list(range(13))
    bad = rows.pop(6)
    assert bad["value"]["__err__"] and bad["value"]["__raw__"] == NOT_AVRO, bad["value"]
    assert [typed(r["value"]) for r in rows] == [order(i) for i in range(12)]
    assert all(r["value"]["__err__"] is None for r in rows)
    assert group_offsets(source, avro_topic, 1) == {0: 13}  # past the bad record: the partition went on

    proto_table = lake.table(proto_topic)
    proto_value = proto_table.schema().find_field("value").field_type
    assert isinstance(proto_value, t.StructType)
    assert isinstance(proto_value.field_by_name("location").field_type, t.StructType)
    assert isinstance(proto_value.field_by_name("kind").field_type, t.StringType)
    proto_rows = sorted(proto_table.scan().to_arrow().to_pylist(), key=lambda r: r["kafka"]["offset"])
    assert [typed(r["value"]) for r in proto_rows] == [reading(i) for i in range(10)]

    # DuckDB, from the metadata file the catalog points at.
    [(count, errors, paid)] = duckdb_rows(avro_table.metadata_location, "SELECT count(*), count(value.__err__), "
                                          "count(*) FILTER (value.status = 'PAID') FROM $T")
    assert (count, errors, paid) == (13, 1, 4)
    [(name, placed, kind)] = duckdb_rows(avro_table.metadata_location, "SELECT value.customer.name, "
                                         "epoch_ms(value.placed_at), typeof(value.placed_at) FROM $T "
                                         "WHERE value.id = 1004")
    assert (name, kind) == ("cust 4 ü", "TIMESTAMP WITH TIME ZONE")
    assert placed == order(4)["placed_at"].timestamp() * 1000
    [(lons,)] = duckdb_rows(proto_table.metadata_location, "SELECT list(value.location.lon ORDER BY value.id) FROM $T "
                            "WHERE value.kind = 'HUMIDITY'")
    assert lons == [13.0 + i for i in range(10) if i % 3 == 2]

    # Spark SQL, as a user runs it: `icelog sql` (one JVM for both tables).
    got = lake.sql(
        f"SELECT 'avro' AS t, kafka.offset AS o, to_json(named_struct('id', value.id, 'name', value.customer.name, "
        "'email', value.customer.email, 'items', value.items, 'attrs', value.attrs, 'status', value.status, "
        "'placed_ms', unix_millis(value.placed_at), 'err', value.__err__ IS NOT NULL)) AS v "
        f"FROM {SINK}.`{avro_topic}` UNION ALL "
        "SELECT 'proto', kafka.offset, to_json(named_struct('id', value.id, 'sensor', value.sensor, 'value', "
        "value.value, 'tags', value.tags, 'location', value.location, 'kind', value.kind)) "
        f"FROM {SINK}.`{proto_topic}` ORDER BY t, o")
    spark_avro = [json.loads(r["v"]) for r in got if r["t"] == "avro"]
    assert spark_avro.pop(6)["err"] is True
    assert spark_avro == [
        {"id": o["id"], "name": o["customer"]["name"], **({"email": o["customer"]["email"]}
                                                           if o["customer"]["email"] else {}),
         "items": o["items"], "attrs": o["attrs"], "status": o["status"],
         "placed_ms": int(o["placed_at"].timestamp() * 1000), "err": False}
        for o in map(order, range(12))
    ]
    assert [json.loads(r["v"]) for r in got if r["t"] == "proto"] == [reading(i) for i in range(10)]


# -- 2. the catalog taken away for half a minute ----------------------------------------------------------------------

OUTAGE_S = 30  # long enough for several retries at the 2 s backoff cap below
FETCH_ALLOWANCE = 2  # Fetch requests the sink may still send once it has failed (one in flight, say)
FAILURE = re.compile(r"archiving lake-away failed \(intake kept; retry in \d+ ms\): (.*)$")


@pytest.fixture
def own_cluster() -> Iterator[PostgresCluster]:
    """A PostgreSQL server of the test's own: it is stopped and started."""
    cluster = start_cluster()
    yield cluster
    cluster.destroy()


def fetches(source: BrokerProcess) -> float:
    return value(scrape_text(source.metrics_url), "icelog_requests_total", api="Fetch")


def test_a_sink_waits_out_a_catalog_outage_without_fetching_then_catches_up_exactly_once(
    tmp_path: Path, source: BrokerProcess, own_cluster: PostgresCluster,
) -> None:
    """The catalog (Iceberg's JDBC catalog on PostgreSQL) is stopped for 30 s under a running `icelog sink`.

    The metadata store stays SQLite in the sink's data dir: what goes away is the lake alone, the case the sink
    must ride out per topic (backoff, no reading of the source); the store's own outage is another path (the
    whole pass fails) that tests/system/test_postgres_meta.py covers for the broker."""
    topic = "lake-away"
    create_topic(source, topic, 2)
    catalog_db = urlsplit(own_cluster.new_database("catalog")).path
    lake = Lake(tmp_path, source, env={
        "ICELOG_ARCHIVE__CATALOG_URI": f"jdbc:postgresql://127.0.0.1:{own_cluster.port}{catalog_db}",
        "ICELOG_ARCHIVE__CATALOG_PROPERTIES": json.dumps({"jdbc.user": ROLE, "jdbc.password": PASSWORD}),
        "ICELOG_ARCHIVE__RETRY_BACKOFF_MAX_MS": "2000",  # retries every other second: many chances to fetch
    })
    lake.topics = [topic]
    lake.write_config()
    log_path = tmp_path / "sink.log"
    with open(log_path, "wb") as log:
        sink = subprocess.Popen(lake.command("sink"), env=lake.environ(), stdout=log, stderr=subprocess.STDOUT)
    produced: list[Any] = []

    def table_count() -> int:
        try:
            return len(lake.rows(topic))
        except Exception:  # not created yet
            return -1

    try:
        produced += produce(source, topic, 200, partitions=2, tag="before-")
        wait_for(lambda: table_count() == len(produced), timeout=240, what=lambda: log_path.read_text()[-3000:])
        fetched_before = fetches(source)
        assert fetched_before > 0, "the sink's fetches show in the source's metrics"

        lines_before = len(log_path.read_text().splitlines())
        own_cluster.stop("fast")
        stopped = time.monotonic()
        produced += produce(source, topic, 50, partitions=2, tag="down0-")

        def failures() -> list[str]:
            return [line for line in log_path.read_text().splitlines()[lines_before:] if FAILURE.search(line)]

        wait_for(lambda: bool(failures()), timeout=OUTAGE_S, what=lambda: log_path.read_text()[-3000:])
        fetched_at_failure, failed_at = fetches(source), time.monotonic()
        n = 1
        while time.monotonic() - stopped < OUTAGE_S:
            produced += produce(source, topic, 20, partitions=2, tag=f"down{n}-")
            n += 1
            time.sleep(3)
        fetched_at_end = fetches(source)
        print(f"Fetch requests: {fetched_before:.0f} before the outage, {fetched_at_failure:.0f} at the first failure, "
              f"{fetched_at_end:.0f} after {time.monotonic() - stopped:.0f} s of outage")
        outage_lines = log_path.read_text().splitlines()[lines_before:]
        own_cluster.start()
        assert sink.poll() is None, "the sink runs on through the outage:\n" + "\n".join(outage_lines[-40:])

        # (a) One line per retry, naming the lake; no traceback (Python's or the JVM's).
        retries = failures()
        window_s = time.monotonic() - failed_at
        assert len(retries) >= 5, "\n".join(outage_lines[-40:])
        assert "Traceback" not in "\n".join(outage_lines) and not any(
            line.lstrip().startswith("at ") for line in outage_lines), "\n".join(outage_lines[-60:])
        # Every warning says why (the JVM's exception), not only which py4j call failed ("… calling o76.tableExists").
        warnings = [line for line in outage_lines if " WARNING " in line]
        assert warnings and not [line for line in warnings if "An error occurred while calling" in line], warnings
        # (b) No Fetch to the source once the lake is known to be away.
        assert fetched_at_end - fetched_at_failure <= FETCH_ALLOWANCE, (
            f"the sink sent {fetched_at_end - fetched_at_failure:.0f} Fetch requests in the {window_s:.0f} s after "
            f"its first failure with the catalog down ({len(retries)} retries)")

        # (c) The catalog back: every record once, and the group at the source's end offsets.
        wait_for(lambda: table_count() == len(produced), timeout=180, what=lambda: log_path.read_text()[-3000:])
        assert record_rows(lake.rows(topic)) == sorted(produced)
        wait_for(lambda: group_offsets(source, topic, 2) == end_offsets(source, topic, 2), timeout=30)
        assert fetches(source) > fetched_at_end
        assert sink.poll() is None
    finally:
        sink.terminate()
        try:
            sink.wait(30)
        except subprocess.TimeoutExpired:
            sink.kill()
            sink.wait()


# -- 3. `icelog serve` runs the configured sinks ------------------------------------------------------------------

SINK_USER, SINK_PASSWORD = "sinker", "s3cret-sink-pw-4711"  # noqa: S105 (a throwaway broker's user)


def test_serve_runs_the_configured_sinks_over_sasl_ssl_and_never_shows_the_password(tmp_path: Path) -> None:
    from tests.support.security import start_secure_broker

    secure = start_secure_broker(tmp_path / "secure-source", ("SASL_SSL",), users={SINK_USER: SINK_PASSWORD},
                                 env={"ICELOG_SUPER_USERS": f"User:{SINK_USER}"})
    lake_broker: BrokerProcess | None = None
    try:
        client = {"security.protocol": "SASL_SSL", "sasl.mechanism": "SCRAM-SHA-512", "sasl.username": SINK_USER,
                  "sasl.password": SINK_PASSWORD, "ssl.ca.location": str(secure.pki.ca_pem)}
        conf = {"bootstrap.servers": secure.bootstrap("SASL_SSL"), **client}
        topic = "served"

        admin = AdminClient(conf)  # held: a collected client fails its futures
        admin.create_topics([NewTopic(topic, 2, 1)])[topic].result(30)
        producer = Producer({**conf, "linger.ms": 5})
        for i in range(300):
            producer.produce(topic, key=f"k{i}".encode(), value=f"v{i}".encode(), partition=i % 2)
        assert producer.flush(30) == 0

        config = tmp_path / "icelog.yaml"
        config.write_text(yaml.safe_dump({"sinks": {SINK: {"bootstrap_servers": secure.bootstrap("SASL_SSL"),
                                                          "topics": [topic], "client": client}}}))
        lake_broker = BrokerProcess(tmp_path / "lake", config=config).start()
        lake = Lake(tmp_path, secure.broker)  # (only its table, status and sql readers are used here)
        lake.data_dir = lake_broker.data_dir
        lake.config = config

        def archived() -> int:
            try:
                return len(lake.rows(topic))
            except Exception:  # no table yet
                return -1

        wait_for(lambda: archived() == 300, timeout=240, what=lambda: lake_broker.log()[-3000:] if lake_broker else "")
        assert sorted(r["value"]["__raw__"] for r in lake.rows(topic)) == sorted(f"v{i}".encode() for i in range(300))

        status: subprocess.CompletedProcess[str] | None = None

        def caught_up() -> bool:
            nonlocal status
            status = lake.run("status")
            lines = sink_status_lines(status.stdout)
            return status.returncode == 0 and len(lines) == 2 and all(cells[6] == "0" for cells in lines)

        wait_for(caught_up, timeout=60, what=lambda: status.stdout + status.stderr if status else "")
        assert status is not None
        assert {(cells[1], cells[2], cells[4], cells[5]) for cells in sink_status_lines(status.stdout)} == {
            (topic, "0", "150", "150"), (topic, "1", "150", "150")}  # TOPIC PARTITION SOURCE-END TABLE-OFFSET
        assert f"sink {SINK}: source {secure.bootstrap('SASL_SSL')}" in status.stdout
        assert SINK_PASSWORD not in status.stdout + status.stderr
        assert SINK_PASSWORD not in lake_broker.log()
        assert "Traceback" not in lake_broker.log()
    finally:
        if lake_broker is not None:
            lake_broker.stop()
        secure.broker.stop()
