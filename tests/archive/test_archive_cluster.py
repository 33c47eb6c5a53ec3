"""The archiver on a Spark standalone cluster whose worker cannot see the broker's data dir, with the metadata
store and the Iceberg catalog in PostgreSQL.

The worker (tests/support/spark_cluster.py) runs with an empty read-only tmpfs over the broker's data dir, so
the only way its tasks get records is a Fetch to the broker (archive.read_via auto: kafka with a spark:// master).
The broker, `icelog archive --once` (the driver, a process of its own, as on another machine) and `icelog maintain`
share a metadata store (ICELOG_META_URL) and a JDBC catalog in PostgreSQL, two databases of one server as the
deployment guide sets them up (docs/deployment.md: `icelog` for metadata, `lake` for the catalog). The warehouse is
a path every process of this machine reaches (object storage is not tested here). Rows are checked exactly in three
engines through that catalog: pyiceberg (its SQL catalog), Spark SQL (the test process's session, the catalog
registered on it) and DuckDB (the metadata file the catalog names).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
from confluent_kafka import Producer
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroSerializer
from confluent_kafka.serialization import MessageField, SerializationContext

from icelog.config import Settings, load_settings
from icelog.lake.catalog import catalog_spark_conf, postgres_catalog_url
from tests.archive import test_archive_timestamps as timestamps
from tests.archive.test_pk_tables import latest, send
from tests.support.archive import ARCHIVE_ENV, create_topic, produce
from tests.support.broker import BrokerProcess
from tests.support.jvm import JIT_OPTION
from tests.support.postgres import PASSWORD, ROLE, PostgresCluster
from tests.support.spark_cluster import SparkCluster

pytestmark = [pytest.mark.spark, pytest.mark.slow]
SRC = Path(__file__).resolve().parents[2] / "src"
# Not the default `lake`: the test process's shared session (lake_spark) has a `lake` catalog on SQLite already, and
# Iceberg's JDBC catalog keys its rows by the catalog's name, so every process names this one the same.
CATALOG = "pglake"

Row = tuple[Any, ...]
Column = Callable[[dict[str, Any]], Any]

# (Spark SQL, DuckDB, pyiceberg) for each compared column; every engine's rows end up as plain tuples.
RECORD_COLUMNS: list[tuple[str, str, Column]] = [
    ("kafka.partition", "kafka.partition", lambda r: r["kafka"]["partition"]),
    ("kafka.offset", "kafka.offset", lambda r: r["kafka"]["offset"]),
    ("key.__raw__", "key.__raw__", lambda r: r["key"] and r["key"]["__raw__"]),
    ("value.__raw__", "value.__raw__", lambda r: r["value"] and r["value"]["__raw__"]),
    ("headers", "headers", lambda r: r["headers"]),
    ("unix_micros(kafka.event_timestamp)", "epoch_us(kafka.event_timestamp)",
     lambda r: int(r["kafka"]["event_timestamp"].timestamp() * 1_000_000)),
]
TABLE_COLUMNS: list[tuple[str, str, Column]] = [
    (c, c, lambda r, c=c: r[c]) for c in ("__bucket", "__offset", "__key", "id", "customer", "cents", "note")
]
PAYMENT = {
    "type": "record", "name": "Payment", "namespace": "shop",
    "fields": [
        {"name": "id", "type": "long"},
        {"name": "customer", "type": "string"},
        {"name": "cents", "type": "long"},
        {"name": "note", "type": ["null", "string"], "default": None},
    ],
}


def plain(value: Any) -> Any:
    """An engine's cell as a comparable Python value: bytes for binary, tuples for lists and structs."""
    if isinstance(value, bytearray | memoryview):
        return bytes(value)
    if isinstance(value, list):
        return tuple(plain(v) for v in value)
    if isinstance(value, dict):
        return tuple(plain(v) for v in value.values())
    if hasattr(value, "asDict"):  # a Spark Row (a header: key, value)
        return tuple(plain(v) for v in value.asDict().values())
    return value


class ClusterLake:
    """A broker, the cluster hiding its data dir, PostgreSQL's metadata store and catalog, the shared warehouse."""

    def __init__(self, root: Path, postgres: PostgresCluster, spark: Any) -> None:
        self.root = root
        self.meta_url = postgres.new_database("meta")
        catalog_db = urlsplit(postgres.new_database("lake")).path
        self.warehouse = (root / "lake" / "warehouse").as_uri()
        (root / "lake").mkdir(parents=True)
        self.env = {**ARCHIVE_ENV, "ICELOG_META_URL": self.meta_url,
                    "ICELOG_ARCHIVE__CATALOG_NAME": CATALOG,
                    "ICELOG_ARCHIVE__CATALOG_URI": f"jdbc:postgresql://127.0.0.1:{postgres.port}{catalog_db}",
                    "ICELOG_ARCHIVE__CATALOG_PROPERTIES": json.dumps({"jdbc.user": ROLE, "jdbc.password": PASSWORD}),
                    "ICELOG_ARCHIVE__WAREHOUSE": self.warehouse}
        self.broker = BrokerProcess(root / "data", env=self.env).start()
        self.archiver_dir = root / "archiver"  # the archiver's own: primary-key indexes, its pass figures
        self.settings = self._settings()
        self.cluster = SparkCluster(root / "spark", cores=1).start(hidden=[self.broker.data_dir])
        # The reader: the test process's Spark session, with this catalog registered beside its own (as
        # test_hadoop_catalog does); cache-enabled=false there, so it sees what the other processes commit.
        self.spark = spark
        for key, value in catalog_spark_conf(self.settings).items():
            spark.conf.set(key, value)
        from pyiceberg.catalog.sql import SqlCatalog

        url = postgres_catalog_url(self.settings)
        assert url is not None
        self.catalog = SqlCatalog(CATALOG, uri=url, warehouse=self.warehouse)

    def _settings(self) -> Settings:
        archive = {"catalog_name": CATALOG, "catalog_uri": self.env["ICELOG_ARCHIVE__CATALOG_URI"],
                   "catalog_properties": {"jdbc.user": ROLE, "jdbc.password": PASSWORD}, "warehouse": self.warehouse}
        return load_settings(data_dir=str(self.broker.data_dir), meta_url=self.meta_url, archive=archive)

    def archive_env(self, **extra: str) -> dict[str, str]:
        # The executors too live for one pass: the JIT's first tier, as the drivers (unless the user set theirs).
        conf = {"spark.executor.extraJavaOptions": JIT_OPTION,
                **json.loads(os.environ.get("ICELOG_ARCHIVE__SPARK_CONF", "{}")),  # tests/conftest.py's JVM options
                "spark.driver.host": "127.0.0.1", "spark.driver.bindAddress": "127.0.0.1",
                "spark.executorEnv.PYTHONPATH": os.environ.get("PYTHONPATH", str(SRC)), "spark.cores.max": "1"}
        return {**os.environ, **self.env, "ICELOG_ARCHIVE__SPARK_MASTER": self.cluster.master_url,
                "ICELOG_ARCHIVE__SPARK_CONF": json.dumps(conf), "ICELOG_LISTEN": self.broker.bootstrap,
                "ICELOG_REGISTRY_LISTEN": f"127.0.0.1:{self.broker.registry_port}", "SPARK_LOCAL_IP": "127.0.0.1",
                **extra}

    def archive_once(
        self, *topics: str, data_dir: Path | None = None, **extra: str
    ) -> subprocess.CompletedProcess[str]:
        """`icelog archive --once` of `topics` with a data dir of its own (as on another machine: it needs nothing of
        the broker's), or the one given."""
        named = [arg for topic in topics for arg in ("--topic", topic)]
        return subprocess.run(
            [sys.executable, "-m", "icelog", "archive", "--once", "--data-dir", str(data_dir or self.archiver_dir),
             *named], env=self.archive_env(**extra), capture_output=True, text=True, timeout=300)

    def maintain(self, topic: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "icelog", "maintain", "--topic", topic, "--data-dir", str(self.archiver_dir)],
            env=self.archive_env(), capture_output=True, text=True, timeout=300)

    def table(self, topic: str) -> Any:
        """The table as pyiceberg loads it from the PostgreSQL catalog."""
        return self.catalog.load_table(("icelog", topic))

    def rows(self, topic: str, columns: list[tuple[str, str, Column]]) -> dict[str, list[Row]]:
        """engine → the table's rows (the given columns, sorted) as Spark SQL, pyiceberg and DuckDB read them."""
        import duckdb
        import duckdb_extension_avro
        import duckdb_extension_iceberg

        spark_sql = ", ".join(c[0] for c in columns)
        spark = [tuple(plain(v) for v in r) for r in
                 self.spark.sql(f"SELECT {spark_sql} FROM {CATALOG}.icelog.`{topic}`").collect()]
        table = self.table(topic)
        pyiceberg = [tuple(plain(c[2](r)) for c in columns) for r in table.scan().to_arrow().to_pylist()]
        con = duckdb.connect(config={"autoinstall_known_extensions": False})
        for module, name in ((duckdb_extension_avro, "avro"), (duckdb_extension_iceberg, "iceberg")):
            [path] = Path(str(module.__file__)).parent.glob(f"extensions/*/{name}.duckdb_extension")
            con.execute(f"LOAD '{path}'")
        duck_sql = ", ".join(c[1] for c in columns)
        duck = [tuple(plain(v) for v in r) for r in
                con.execute(f"SELECT {duck_sql} FROM iceberg_scan('{table.metadata_location}')").fetchall()]
        con.close()
        return {"spark": sorted(spark), "pyiceberg": sorted(pyiceberg), "duckdb": sorted(duck)}

    def check_rows(self, topic: str, columns: list[tuple[str, str, Column]], expected: list[Row]) -> None:
        """Each engine reads exactly `expected` (in any order)."""
        want = sorted(expected)
        for engine, got in self.rows(topic, columns).items():
            assert got == want, f"{engine}: {len(got)} rows, {len(want)} expected"

    def stop(self) -> None:
        self.catalog.engine.dispose()
        self.cluster.stop()
        self.broker.stop()


@pytest.fixture(scope="module")
def cluster_lake(
    tmp_path_factory: pytest.TempPathFactory, postgres_cluster: PostgresCluster, lake_spark: Any
) -> Iterator[ClusterLake]:
    lake = ClusterLake(tmp_path_factory.mktemp("cluster"), postgres_cluster, lake_spark)
    yield lake
    lake.stop()


def test_the_worker_cannot_read_the_intake_by_path(cluster_lake: ClusterLake) -> None:
    """The control: with read_via=files (and a driver that does see the broker's data dir) the cluster's tasks
    fail, so the other tests prove reads over Kafka."""
    topic = "cluster-files"
    create_topic(cluster_lake.broker, topic, partitions=1)
    produce(cluster_lake.broker, topic, 50, partitions=1)
    done = cluster_lake.archive_once(topic, data_dir=cluster_lake.broker.data_dir, ICELOG_ARCHIVE__READ_VIA="files")
    assert "No such file or directory" in done.stdout + done.stderr, done.stdout + done.stderr[-3000:]


class Produced:
    """What the shared pass archives: five topics produced, then one `icelog archive --once` over all of them (each
    pass on the cluster is a driver JVM and an executor: the tests below check one topic each)."""

    RECORDS, TXN, TABLE, READBACK = "cluster-records", "cluster-txn", "cluster-table", "cluster-readback"
    PK = "cluster_pk"

    def __init__(self, lake: ClusterLake) -> None:
        self.records = self._records(lake)
        pending = self._transactions(lake)
        self.table = self._table(lake)
        self.readback = self._readback(lake)
        # The primary-key table's first round (inserts); its test sends the second.
        create_topic(lake.broker, self.PK, 3, {"cleanup.policy": "compact", "icelog.archive.layout": "record"})
        self.pk = send(lake.broker, self.PK, pk_round(0))
        # Boundary and extreme timestamps (tests/archive/test_archive_timestamps.py): none may stop the pass.
        create_topic(lake.broker, timestamps.topic_of("raw"), 1, timestamps.WIDE)
        self.times = timestamps.send_all(lake.broker, "raw", 0)
        self.pass_ = lake.archive_once(self.RECORDS, self.TXN, self.TABLE, self.READBACK, self.PK,
                                       timestamps.topic_of("raw"))
        pending.abort_transaction(30)

    def _records(self, lake: ClusterLake) -> list[Row]:
        create_topic(lake.broker, self.RECORDS)
        return [tuple(plain(v) for v in r) for r in produce(lake.broker, self.RECORDS, 2000)]

    def _transactions(self, lake: ClusterLake) -> Any:
        """40 committed and 40 aborted records over 2 partitions, then a transaction left open on partition 0 (it
        outlives the pass: 5 minutes before the broker would abort it) and one plain record per partition."""
        broker = lake.broker
        create_topic(broker, self.TXN, partitions=2)
        committer, aborter, pending = (
            Producer({"bootstrap.servers": broker.bootstrap, "transactional.id": f"ct-{n}",
                      "transaction.timeout.ms": 300_000}) for n in ("commit", "abort", "open"))
        for producer in (committer, aborter, pending):
            producer.init_transactions(30)
            producer.begin_transaction()
        for i in range(40):
            committer.produce(self.TXN, value=f"c{i}".encode(), partition=i % 2)
            aborter.produce(self.TXN, value=f"a{i}".encode(), partition=i % 2)
        assert committer.flush(30) == 0 and aborter.flush(30) == 0
        aborter.abort_transaction(30)
        committer.commit_transaction(30)
        pending.produce(self.TXN, value=b"open", partition=0)  # undecided: partition 0 waits at its first offset
        assert pending.flush(30) == 0
        after = Producer({"bootstrap.servers": broker.bootstrap})
        for p in range(2):
            after.produce(self.TXN, value=f"after-{p}".encode(), partition=p)
        assert after.flush(30) == 0
        return pending

    def _table(self, lake: ClusterLake) -> list[Row]:
        """Avro values (Confluent's serializer, the embedded registry on PostgreSQL) for the table layout."""
        broker = lake.broker
        create_topic(broker, self.TABLE, 3, {"icelog.archive.layout": "table"})
        serialize = AvroSerializer(SchemaRegistryClient({"url": broker.registry_url}), json.dumps(PAYMENT),
                                   conf={"auto.register.schemas": True})
        ctx = SerializationContext(self.TABLE, MessageField.VALUE)
        payments = {f"pay-{i}".encode(): {"id": i, "customer": f"cust {i} ü", "cents": i * 101 - 5_000,
                                          "note": None if i % 3 else f"note {i}"} for i in range(300)}
        expected: list[Row] = []

        def on_delivery(err: Any, msg: Any) -> None:
            assert err is None, err
            p = payments[msg.key()]
            expected.append((msg.partition(), msg.offset(), msg.key(), p["id"], p["customer"], p["cents"], p["note"]))

        producer = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 5, "compression.type": "zstd"})
        for i, (key, payment) in enumerate(payments.items()):
            producer.produce(self.TABLE, key=key, value=serialize(payment, ctx), partition=i % 3,
                             on_delivery=on_delivery)
        assert producer.flush(30) == 0 and len(expected) == len(payments)
        return expected

    def _readback(self, lake: ClusterLake) -> list[Any]:
        from tests.readback.test_readback import TRIM, produce_codecs
        from tests.support.clients_util import create_topic as create_topic_with

        create_topic_with(lake.broker.bootstrap, self.READBACK, partitions=2, configs=TRIM)
        return produce_codecs(lake.broker, self.READBACK, 30, 2)


@pytest.fixture(scope="module")
def produced(cluster_lake: ClusterLake) -> Produced:
    return Produced(cluster_lake)


def test_one_pass_archives_every_topic_without_a_local_store(cluster_lake: ClusterLake, produced: Produced) -> None:
    done = produced.pass_
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    assert not (cluster_lake.broker.data_dir / "meta.db").exists(), "no SQLite store beside PostgreSQL"
    assert not (cluster_lake.broker.data_dir / "catalog.db").exists(), "no SQLite catalog beside PostgreSQL"


def test_record_layout_archived_on_the_cluster(cluster_lake: ClusterLake, produced: Produced) -> None:
    assert produced.pass_.returncode == 0
    cluster_lake.check_rows(Produced.RECORDS, RECORD_COLUMNS, produced.records)


def test_only_committed_records_are_archived_on_the_cluster(cluster_lake: ClusterLake, produced: Produced) -> None:
    """No intake file anywhere near the archiver: the last stable offset comes from the broker (ListOffsets,
    read_committed) and the tasks drop what their read_committed Fetches name aborted."""
    assert produced.pass_.returncode == 0
    got = sorted(r["value"]["__raw__"] for r in cluster_lake.table(Produced.TXN).scan().to_arrow().to_pylist())
    assert got == sorted([f"c{i}".encode() for i in range(40)] + [b"after-1"])


def test_no_timestamp_stops_the_pass_on_the_cluster(cluster_lake: ClusterLake, produced: Produced) -> None:
    """Every record whose timestamp a table holds is a row; the others are in the dead-letter table."""
    assert produced.pass_.returncode == 0, produced.pass_.stderr[-3000:]
    sent, unholdable = produced.times
    topic = timestamps.topic_of("raw")
    assert timestamps.pyiceberg_rows(cluster_lake.table(topic)) == timestamps.expected_rows(sent, unholdable)
    assert timestamps.dead_letter_spans(cluster_lake.table(f"{topic}__dlq")) == [(o, o) for o in sorted(unholdable)]


def test_table_layout_archived_on_the_cluster(cluster_lake: ClusterLake, produced: Produced) -> None:
    assert produced.pass_.returncode == 0
    columns = {f.name for f in cluster_lake.table(Produced.TABLE).schema().fields}
    assert {"__key", "id", "customer", "cents", "note", "__bucket", "__offset"} <= columns, columns
    cluster_lake.check_rows(Produced.TABLE, TABLE_COLUMNS, produced.table)


def test_read_back_after_the_trim_is_byte_identical(cluster_lake: ClusterLake, produced: Produced) -> None:
    """What the cluster archived is served back by the broker once its intake is gone, byte for byte."""
    from icelog.meta.backends import open_store
    from tests.readback.test_readback import read_back, wait_trimmed
    from tests.support.clients_util import comparable

    assert produced.pass_.returncode == 0
    expected = produced.readback
    ends: dict[int, int] = {}
    for rec in expected:
        ends[rec.partition] = max(ends.get(rec.partition, 0), rec.offset + 1)
    store = open_store(cluster_lake.meta_url)  # the broker's store, in PostgreSQL
    try:
        wait_trimmed(store, Produced.READBACK, ends)
    finally:
        store.close()
    for client in ("confluent", "kafka-python"):
        got = read_back(client, cluster_lake.broker, Produced.READBACK, [0, 1], len(expected))
        assert comparable(got) == comparable(expected), client
    assert PASSWORD not in cluster_lake.broker.log(), "the password is never logged"


def pk_round(round_: int) -> list[tuple[bytes, bytes | None]]:
    """60 keys: inserts in round 0; in round 1 updates, and tombstones for every fifth key."""
    return [(f"k{i}".encode(), None if i % 5 == 0 and round_ else f"v{round_}-{i}".encode()) for i in range(60)]


def test_primary_key_table_on_the_cluster(cluster_lake: ClusterLake, produced: Produced) -> None:
    topic = Produced.PK
    pk_columns = [RECORD_COLUMNS[i] for i in (2, 3, 0, 1)]  # key, value, partition, offset
    assert produced.pass_.returncode == 0
    # The second pass updates and deletes what the shared pass inserted: deletion vectors.
    all_sent = produced.pk + send(cluster_lake.broker, topic, pk_round(1))
    done = cluster_lake.archive_once(topic)
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    expected = [(k, v, p, o) for k, (v, p, o) in latest(all_sent).items()]
    cluster_lake.check_rows(topic, pk_columns, expected)
    assert cluster_lake.table(topic).metadata.format_version == 3
    deletes = cluster_lake.spark.sql(
        f"SELECT content, file_format, referenced_data_file FROM {CATALOG}.icelog.`{topic}`.delete_files").collect()
    assert deletes, "the second pass's updates and deletes are deletion vectors"
    assert all(d.content == 1 and d.file_format == "PUFFIN" for d in deletes), deletes  # no equality deletes
    assert len({d.referenced_data_file for d in deletes}) == len(deletes), "one deletion vector per data file"

    # A maintenance round on the cluster (compaction applies the deletion vectors; expiry; orphans): same rows.
    snapshot = cluster_lake.table(topic).metadata.current_snapshot_id
    maintain = cluster_lake.maintain(topic)
    assert maintain.returncode == 0, maintain.stdout + maintain.stderr[-3000:]
    assert cluster_lake.table(topic).metadata.current_snapshot_id != snapshot, "maintenance committed nothing"
    cluster_lake.check_rows(topic, pk_columns, expected)
