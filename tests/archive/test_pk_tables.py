"""Primary-key (upsert) tables: compacted topics archived as the latest row per key, with deletion vectors.

Real broker, confluent-kafka producers over TCP, the real Spark archiver; the table is read back by Spark SQL,
pyiceberg and DuckDB, and its delete files are checked to be v3 deletion vectors (Puffin), one per data file.
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer

from icelog.archive.archiver import Archiver
from icelog.archive.pk_index import IndexEntry, PrimaryKeyIndex, encode_key
from icelog.archive.reconcile import decode_offsets
from icelog.config import Settings
from tests.support.archive import create_topic, run_archive_cli
from tests.support.broker import BrokerProcess

pytestmark = pytest.mark.slow

Record = tuple[int, int, bytes, bytes | None]  # partition, offset, key, value
Latest = dict[bytes, tuple[bytes, int, int]]  # key → (value, partition, offset)

COLUMNS = {  # layout → Spark SQL / DuckDB expressions of (key, value, partition, offset)
    "table": ("__key", "__value", "__bucket", "__offset"),
    "record": ("key.__raw__", "value.__raw__", "kafka.partition", "kafka.offset"),
}


def send(
    broker: BrokerProcess, topic: str, records: list[tuple[bytes, bytes | None]], partitions: int = 3
) -> list[Record]:
    """Produce (key, value) records, each key always to the same partition; what was delivered, in order."""
    delivered: list[Record] = []

    def on_delivery(err: Any, msg: Any) -> None:
        assert err is None, err
        delivered.append((msg.partition(), msg.offset(), msg.key(), msg.value()))

    producer = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 5, "enable.idempotence": True})
    for key, value in records:
        producer.produce(topic, key=key, value=value, partition=sum(key) % partitions, on_delivery=on_delivery)
    assert producer.flush(30) == 0
    return delivered


def latest(records: list[Record]) -> Latest:
    """Kafka's log-compaction outcome: the highest offset per key; a null value deletes the key."""
    out: dict[bytes, tuple[bytes | None, int, int]] = {}
    for partition, offset, key, value in sorted(records, key=lambda r: r[1]):
        out[key] = (value, partition, offset)
    return {k: (v, p, o) for k, (v, p, o) in out.items() if v is not None}


def spark_latest(spark: Any, topic: str, layout: str) -> Latest:
    k, v, p, o = COLUMNS[layout]
    rows = spark.sql(f"SELECT {k} AS k, {v} AS v, {p} AS p, {o} AS o FROM icelog.`{topic}`").collect()
    got = {bytes(r.k): (bytes(r.v), r.p, r.o) for r in rows}
    assert len(got) == len(rows), "a key appears more than once"
    return got


def catalog_table(settings: Settings, topic: str) -> Any:
    from pyiceberg.catalog.sql import SqlCatalog

    catalog = SqlCatalog("lake", uri=f"sqlite:///{settings.data_dir / 'catalog.db'}", warehouse=settings.warehouse)
    return catalog.load_table(("icelog", topic))


def pyiceberg_latest(settings: Settings, topic: str, layout: str) -> Latest:
    rows = catalog_table(settings, topic).scan().to_arrow().to_pylist()

    def get(row: dict[str, Any], path: str) -> Any:
        for part in path.split("."):
            row = row[part]
        return row

    k, v, p, o = COLUMNS[layout]
    got = {get(r, k): (get(r, v), get(r, p), get(r, o)) for r in rows}
    assert len(got) == len(rows), "a key appears more than once"
    return got


def duckdb_latest(settings: Settings, topic: str, layout: str) -> Latest:
    import duckdb
    import duckdb_extension_avro
    import duckdb_extension_iceberg

    con = duckdb.connect(config={"autoinstall_known_extensions": False})
    for module, name in ((duckdb_extension_avro, "avro"), (duckdb_extension_iceberg, "iceberg")):
        [path] = Path(module.__file__).parent.glob(f"extensions/*/{name}.duckdb_extension")
        con.execute(f"LOAD '{path}'")
    location = catalog_table(settings, topic).metadata_location
    k, v, p, o = COLUMNS[layout]
    rows = con.execute(f"SELECT {k}, {v}, {p}, {o} FROM iceberg_scan('{location}')").fetchall()
    got = {bytes(r[0]): (bytes(r[1]), int(r[2]), int(r[3])) for r in rows}
    assert len(got) == len(rows), "a key appears more than once"
    return got


def check_table(spark: Any, settings: Settings, topic: str, layout: str, expected: Latest) -> None:
    """Every engine returns exactly the latest row per live key; deletes are DVs only, one per data file."""
    assert spark_latest(spark, topic, layout) == expected
    assert pyiceberg_latest(settings, topic, layout) == expected
    assert duckdb_latest(settings, topic, layout) == expected
    deletes = spark.sql(
        f"SELECT content, file_format, referenced_data_file FROM lake.icelog.`{topic}`.delete_files"
    ).collect()
    assert all(d.content == 1 and d.file_format == "PUFFIN" for d in deletes), deletes  # no equality deletes
    referenced = [d.referenced_data_file for d in deletes]
    assert len(referenced) == len(set(referenced)), "a data file has more than one deletion vector"


def check_index(spark: Any, settings: Settings, topic: str, layout: str) -> None:
    """The primary-key index is at the table's current snapshot and names exactly each live row's file and position."""
    metadata = catalog_table(settings, topic).metadata
    index = PrimaryKeyIndex.for_table(settings.data_dir, str(metadata.table_uuid))
    try:
        assert index.snapshot_id() == metadata.current_snapshot_id
        indexed = dict(index.items())
    finally:
        index.close()
    k, _v, _p, o = COLUMNS[layout]
    rows = spark.sql(f"SELECT {k} AS k, _file, _pos, {o} AS o FROM icelog.`{topic}`").collect()
    assert indexed == {encode_key((r.k,)): IndexEntry(r._file, r._pos, r.o) for r in rows}


def pass_ok(archiver: Archiver, topic: str) -> None:
    [result] = archiver.run_pass(force=True, topics=[topic])
    assert result.error == "", result.error


def three_passes(lake_broker: BrokerProcess, topic: str) -> list[list[tuple[bytes, bytes | None]]]:
    """Inserts with repeats in a batch; updates and tombstones; re-inserts, deletes and repeated updates."""
    first = [(f"k{i}".encode(), f"a{i}".encode()) for i in range(20)] + [(b"k0", b"a0-again"), (b"k3", b"a3-again")]
    second = [(f"k{i}".encode(), f"b{i}".encode()) for i in range(1, 8)] + [(b"k5", None), (b"k6", None)]
    second += [(b"k9", None), (b"k9", b"b9-after-tombstone"), (b"k10", b"b10"), (b"k10", None)]
    third = [(b"k5", b"c5-reinserted"), (b"k1", None), (b"k7", b"c7"), (b"k7", b"c7-again"), (b"new", b"c-new")]
    return [first, second, third]


@pytest.mark.parametrize("layout", ["table", "record"])
def test_upserts_and_tombstones_over_several_passes(
    layout: str, lake_broker: BrokerProcess, lake_archiver: Archiver, lake_spark: Any, lake_settings: Settings
) -> None:
    topic = f"pk_upserts_{layout}"
    create_topic(lake_broker, topic, 3, {"cleanup.policy": "compact", "icelog.archive.layout": layout})
    produced: list[Record] = []
    for batch in three_passes(lake_broker, topic):
        produced += send(lake_broker, topic, batch)
        pass_ok(lake_archiver, topic)
        check_table(lake_spark, lake_settings, topic, layout, latest(produced))
        check_index(lake_spark, lake_settings, topic, layout)
    iceberg_table = catalog_table(lake_settings, topic)
    assert iceberg_table.metadata.format_version == 3
    assert iceberg_table.properties["write.delete.mode"] == "merge-on-read"
    # Updates happened in passes 2 and 3: deletion vectors exist, and each covers the rows it must.
    dvs = lake_spark.sql(f"SELECT record_count FROM lake.icelog.`{topic}`.delete_files").collect()
    assert dvs and sum(d.record_count for d in dvs) == sum(
        f.record_count for f in lake_spark.sql(f"SELECT record_count FROM lake.icelog.`{topic}`.data_files").collect()
    ) - len(latest(produced))


def test_killed_jobs_then_next_pass_is_exact(
    lake_broker: BrokerProcess, lake_archiver: Archiver, lake_spark: Any, lake_settings: Settings
) -> None:
    """`icelog archive --once` killed at each stage in turn on one table; each next job starts from the wreck.

    After every kill the table holds exactly the last committed pass; the index (a cache of the table) is
    repaired by whichever process runs next, here another job and finally the test's own archiver.
    """
    topic = "pk_faults"
    create_topic(lake_broker, topic, 3, {"cleanup.policy": "compact", "icelog.archive.layout": "table"})
    first, second, third = three_passes(lake_broker, topic)
    fourth = [(b"k2", b"d2"), (b"k11", None), (b"k5", b"d5"), (b"k12", b"d12"), (b"k12", b"d12-again")]
    fifth = [(b"k2", None), (b"k12", b"e12"), (b"k13", b"e13"), (b"k0", b"e0")]
    produced = send(lake_broker, topic, first)
    pass_ok(lake_archiver, topic)
    committed_before = list(produced)
    produced += send(lake_broker, topic, second)

    def job(fault: str | None, expected: list[Record]) -> None:
        done = run_archive_cli(lake_settings, topic, fault)
        assert done.returncode == (137 if fault else 0), done.stderr[-3000:]  # None: `icelog archive` ends well
        assert spark_latest(lake_spark, topic, "table") == latest(expected), fault

    job("after-write", committed_before)  # data files written, nothing committed
    job("after-commit-before-index", produced)  # the orphans ignored, the batch committed, index not updated
    produced += send(lake_broker, topic, third)
    job("after-commit", produced)  # a stale index repaired from the table, then killed after committing
    produced += send(lake_broker, topic, fourth)
    job(None, produced)
    produced += send(lake_broker, topic, fifth)
    pass_ok(lake_archiver, topic)  # this process's own index handle follows what the jobs committed
    check_table(lake_spark, lake_settings, topic, "table", latest(produced))
    check_index(lake_spark, lake_settings, topic, "table")


def test_index_deleted_or_table_compacted_between_passes(
    lake_broker: BrokerProcess, lake_archiver: Archiver, lake_spark: Any, lake_settings: Settings,
    caplog: pytest.LogCaptureFixture,
) -> None:
    topic = "pk_index_rebuild"
    create_topic(lake_broker, topic, 3, {"cleanup.policy": "compact", "icelog.archive.layout": "table"})
    first, second, third = three_passes(lake_broker, topic)
    produced = send(lake_broker, topic, first)
    pass_ok(lake_archiver, topic)
    index_root = Path(lake_settings.data_dir) / "pk-index"
    table_uuid = str(catalog_table(lake_settings, topic).metadata.table_uuid)
    assert (index_root / table_uuid).is_dir()

    shutil.rmtree(index_root / table_uuid)  # deleted by hand: rebuilt from the table
    produced += send(lake_broker, topic, second)
    with caplog.at_level(logging.INFO, logger="icelog.archive.upsert"):
        pass_ok(lake_archiver, topic)
    assert "primary-key index rebuilt" in caplog.text
    check_table(lake_spark, lake_settings, topic, "table", latest(produced))
    check_index(lake_spark, lake_settings, topic, "table")
    caplog.clear()

    # External compaction moves every row to new files (and drops the DVs it applied): a REPLACE snapshot.
    lake_spark.sql(
        f"CALL lake.system.rewrite_data_files(table => 'icelog.{topic}', options => map('rewrite-all', 'true'))"
    ).collect()
    operation = lake_spark.sql(
        f"SELECT operation FROM lake.icelog.`{topic}`.snapshots ORDER BY committed_at DESC LIMIT 1"
    ).collect()[0].operation
    assert operation == "replace"
    assert not lake_spark.sql(f"SELECT * FROM lake.icelog.`{topic}`.delete_files").collect()  # DVs applied
    produced += send(lake_broker, topic, third)
    with caplog.at_level(logging.INFO, logger="icelog.archive.upsert"):
        pass_ok(lake_archiver, topic)
    # The index followed the REPLACE snapshot (the moved rows only), no rebuild.
    assert "follows REPLACE snapshot" in caplog.text and "rebuilt" not in caplog.text
    check_table(lake_spark, lake_settings, topic, "table", latest(produced))
    check_index(lake_spark, lake_settings, topic, "table")

    # A user's DELETE and UPDATE (merge-on-read: a DV on a file our next pass also marks; the updated row in a
    # new file and a DV on its old one): the index follows both snapshots, no rebuild; the user's DV is merged
    # into ours, the deleted key stays deleted until it is produced again, the updated row stays as updated.
    lake_spark.sql(f"DELETE FROM icelog.`{topic}` WHERE __key IN (X'6b32', X'6b38')").collect()  # k2, k8
    lake_spark.sql(f"UPDATE icelog.`{topic}` SET __value = X'7570' WHERE __key = X'6b35'").collect()  # k5: b"up"
    expected = {k: v for k, v in latest(produced).items() if k not in (b"k2", b"k8")}
    expected[b"k5"] = (b"up", *expected[b"k5"][1:])
    fourth = send(lake_broker, topic, [(b"k8", b"d8"), (b"k4", b"d4"), (b"k11", b"d11"), (b"k17", None)])
    expected.update({k: (v, p, o) for p, o, k, v in fourth if v is not None})
    expected.pop(b"k17")
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="icelog.archive.upsert"):
        pass_ok(lake_archiver, topic)
    assert "follows DELETE snapshot" in caplog.text and "follows OVERWRITE snapshot" in caplog.text
    assert "rebuilt" not in caplog.text
    check_table(lake_spark, lake_settings, topic, "table", expected)
    check_index(lake_spark, lake_settings, topic, "table")

    # Compaction, then every older snapshot expired: no snapshot left records offsets, so they come from the
    # data (max(__offset) + 1 per __bucket), and the index (its snapshot gone) is rebuilt.
    lake_spark.sql(
        f"CALL lake.system.rewrite_data_files(table => 'icelog.{topic}', options => map('rewrite-all', 'true'))"
    ).collect()
    lake_spark.sql(f"CALL lake.system.expire_snapshots(table => 'icelog.{topic}', "
                   "older_than => TIMESTAMP '2999-01-01 00:00:00', retain_last => 1)").collect()
    fifth = send(lake_broker, topic, [(b"k4", b"e4"), (b"k12", None), (b"k13", b"e13")])
    expected.update({k: (v, p, o) for p, o, k, v in fifth if v is not None})
    expected.pop(b"k12")
    pass_ok(lake_archiver, topic)
    check_table(lake_spark, lake_settings, topic, "table", expected)
    check_index(lake_spark, lake_settings, topic, "table")


PROTO = """
syntax = "proto3";
package pk;
message Account { string region = 1; int64 account = 2; int64 balance = 3; }
"""


def test_primary_key_on_value_columns_with_a_protobuf_schema(
    lake_broker: BrokerProcess, lake_archiver: Archiver, lake_spark: Any, lake_settings: Settings, tmp_path: Path
) -> None:
    """icelog.table.primary.key=region,account: the latest balance per (region, account), whatever the record key."""
    import importlib
    import subprocess
    import sys

    from confluent_kafka.schema_registry import SchemaRegistryClient
    from confluent_kafka.schema_registry.protobuf import ProtobufSerializer
    from confluent_kafka.serialization import MessageField, SerializationContext

    (tmp_path / "pk_account.proto").write_text(PROTO)
    subprocess.run([sys.executable, "-m", "grpc_tools.protoc", f"-I{tmp_path}", f"--python_out={tmp_path}",
                    "pk_account.proto"], check=True)
    sys.path.insert(0, str(tmp_path))
    try:
        pb = importlib.import_module("pk_account_pb2")
    finally:
        sys.path.remove(str(tmp_path))
    topic = "pk_accounts"
    create_topic(lake_broker, topic, 2,
                 {"icelog.archive.layout": "table", "icelog.table.primary.key": "region,account"})
    serialize = ProtobufSerializer(pb.Account, SchemaRegistryClient({"url": lake_broker.registry_url}),
                                   {"use.deprecated.format": False})
    ctx = SerializationContext(topic, MessageField.VALUE)
    expected: dict[tuple[str, int], int] = {}
    for step in range(3):
        records = []
        for i in range(12):
            region, account = ("eu", "us")[i % 2], i // 2 + step * 3  # passes overlap: updates and new accounts
            balance = 100 * step + i
            records.append((f"r{i}".encode(), serialize(pb.Account(region=region, account=account, balance=balance),
                                                        ctx)))
            expected[(region, account)] = balance
        send(lake_broker, topic, records, partitions=1)
        pass_ok(lake_archiver, topic)
        rows = lake_spark.sql(f"SELECT region, account, balance FROM icelog.`{topic}`").collect()
        assert sorted((r.region, r.account, r.balance) for r in rows) == sorted(
            (region, account, balance) for (region, account), balance in expected.items())
        arrow = catalog_table(lake_settings, topic).scan(selected_fields=("region", "account", "balance")).to_arrow()
        assert sorted(tuple(r.values()) for r in arrow.to_pylist()) == sorted(
            (region, account, balance) for (region, account), balance in expected.items())
    deletes = lake_spark.sql(f"SELECT content, file_format FROM lake.icelog.`{topic}`.delete_files").collect()
    assert deletes and all(d.content == 1 and d.file_format == "PUFFIN" for d in deletes)


def test_compacted_record_layout_with_a_key_schema_is_refused_with_the_fix(
    lake_broker: BrokerProcess, lake_archiver: Archiver, lake_spark: Any
) -> None:
    """The record layout keeps no key bytes for decodable keys: the pass fails naming the fix; nothing is lost; the
    fix it names (icelog.schema.key=none) works on the table the failed pass created (with the key's columns)."""
    from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource
    from confluent_kafka.schema_registry import Schema, SchemaRegistryClient

    topic = "pk_record_key_schema"
    create_topic(lake_broker, topic, 1, {"cleanup.policy": "compact"})
    SchemaRegistryClient({"url": lake_broker.registry_url}).register_schema(f"{topic}-key", Schema(PROTO, "PROTOBUF"))
    send(lake_broker, topic, [(b"k1", b"v1")], partitions=1)
    [result] = lake_archiver.run_pass(force=True, topics=[topic])
    assert "needs icelog.archive.layout=table" in result.error and result.records == 0
    assert "or set icelog.schema.key=none" in result.error

    resource = ConfigResource(ConfigResource.Type.TOPIC, topic, incremental_configs=[
        ConfigEntry("icelog.schema.key", "none", incremental_operation=AlterConfigOpType.SET)])
    admin = AdminClient({"bootstrap.servers": lake_broker.bootstrap})
    admin.incremental_alter_configs([resource])[resource].result(30)
    send(lake_broker, topic, [(b"k1", b"v2"), (b"k2", b"v3")], partitions=1)
    [result] = lake_archiver.run_pass(force=True, topics=[topic])
    assert not result.error and result.records == 3, result
    rows = lake_spark.sql(f"SELECT key.__raw__ AS k, value.__raw__ AS v FROM icelog.`{topic}`").collect()
    assert sorted((bytes(r.k), bytes(r.v)) for r in rows) == [(b"k1", b"v2"), (b"k2", b"v3")]


def test_deletion_vector_blobs_read_back_by_iceberg(lake_spark: Any) -> None:
    """dv_blob's bytes, deserialized by Iceberg's PositionDeleteIndex: sparse and dense (bitmap) containers,
    several 64 K chunks, a position past 2^32."""
    from icelog.lake.iceberg_java import position_index

    spec = lake_spark.sparkContext._jvm.org.apache.iceberg.PartitionSpec.unpartitioned()
    dense = list(range(70_000, 80_000))  # > 4096 in one 64 K chunk: a bitmap container
    sparse = [0, 1, 7, 65_535, 65_536, 1_000_003, (1 << 32) + 5]
    positions = dense + sparse
    index = position_index(lake_spark, "file:/nowhere.parquet", positions, spec, None)
    assert index.cardinality() == len(set(positions))
    probes = [*sparse, 69_999, 70_000, 79_999, 80_000, 2, 65_534, 1 << 32, (1 << 32) + 4, (1 << 32) + 5]
    assert [bool(index.isDeleted(p)) for p in probes] == [p in set(positions) for p in probes]


@pytest.mark.parametrize("concurrent", ["rewrite-referenced", "user-delete", "rewrite-elsewhere",
                                        "user-delete-elsewhere"])
def test_a_concurrent_commit_during_an_upsert_pass_never_corrupts_the_table_or_the_index(
    concurrent: str, lake_broker: BrokerProcess, lake_archiver: Archiver, lake_spark: Any, lake_settings: Settings,
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
) -> None:
    """Another writer commits between the pass's plan (index look-ups, DVs written) and its RowDelta commit.

    rewrite-referenced: Spark's rewrite_data_files moves the rows the pass replaces; user-delete: a user's DELETE
    adds a DV to a data file the pass also marks. Both make the RowDelta validation fail: the pass fails cleanly
    (nothing of it is visible), and the next pass redoes it exactly. rewrite-elsewhere: a compaction of files the
    pass does not touch, and user-delete-elsewhere: a user's DELETE of a row in a file the pass does not touch,
    which validation allows: the pass commits (an analyst's steady DELETEs must not stall archiving), and the
    index, which did not see that commit, stays at the pass's base: the next pass follows that commit and then
    the pass's own (no rebuild from the whole table).
    """
    from icelog.archive import archiver as archiver_module

    topic = f"pk_race_{concurrent.replace('-', '_')}"
    create_topic(lake_broker, topic, 3, {"cleanup.policy": "compact", "icelog.archive.layout": "table"})
    first = [(f"k{i}".encode(), f"a{i}".encode()) for i in range(24)]
    produced = send(lake_broker, topic, first)
    pass_ok(lake_archiver, topic)
    # Updates of keys in partitions 0 and 1 only (send() routes by sum(key) % 3), a tombstone, a new key.
    touched = [k for k, _v in first if sum(k) % 3 != 2][:6]
    victim = next(k for k, _v in first if sum(k) % 3 == 2)  # partition 2: deleted by the user, never re-produced
    second = [(k, b"b-" + k) for k in touched] + [(touched[-1], None), (b"new0", b"b-new")]
    produced += send(lake_broker, topic, second)
    spark_table = f"icelog.`{topic}`"
    statements = {
        "rewrite-referenced": f"CALL lake.system.rewrite_data_files(table => 'icelog.{topic}', "
                              "options => map('rewrite-all', 'true'))",
        "user-delete": f"DELETE FROM {spark_table} WHERE __key IN (X'{touched[0].hex()}', X'{victim.hex()}')",
        "rewrite-elsewhere": f"CALL lake.system.rewrite_data_files(table => 'icelog.{topic}', "
                             "where => '__bucket = 2', options => map('rewrite-all', 'true'))",
        "user-delete-elsewhere": f"DELETE FROM {spark_table} WHERE __key = X'{victim.hex()}'",
    }
    ran: list[str] = []

    def concurrent_commit(stage: str) -> None:
        if stage == "after-write" and not ran:
            ran.append(stage)
            lake_spark.sql(statements[concurrent]).collect()

    before = spark_latest(lake_spark, topic, "table")
    base = catalog_table(lake_settings, topic).metadata.current_snapshot_id
    monkeypatch.setattr(archiver_module, "fault_point", concurrent_commit)
    [result] = lake_archiver.run_pass(force=True, topics=[topic])
    monkeypatch.undo()
    assert ran
    expected = latest(produced)
    if concurrent == "user-delete":  # the user deleted touched[0] (re-produced since: it comes back) and victim
        before = {k: v for k, v in before.items() if k not in (touched[0], victim)}
    if concurrent.startswith("user-delete"):
        expected.pop(victim)
    if concurrent.endswith("elsewhere"):
        assert result.error == ""
        check_table(lake_spark, lake_settings, topic, "table", expected)
        metadata = catalog_table(lake_settings, topic).metadata
        index = PrimaryKeyIndex.for_table(lake_settings.data_dir, str(metadata.table_uuid))
        try:
            assert index.snapshot_id() == base  # the next pass follows the concurrent commit, then the pass's
        finally:
            index.close()
    else:
        assert result.error, "the RowDelta validation must refuse the commit"
        assert spark_latest(lake_spark, topic, "table") == before  # nothing of the failed pass is visible
        # A race lost is no outage: the next poll retries the topic, without the failures' backoff.
        [again] = lake_archiver.run_pass(topics=[topic])
        assert not again.skipped, again
    produced += send(lake_broker, topic, [(touched[1], b"c-" + touched[1]), (b"new1", b"c-new")])
    expected = latest(produced)
    if concurrent.startswith("user-delete"):
        expected.pop(victim)
    with caplog.at_level(logging.INFO, logger="icelog.archive.upsert"):
        pass_ok(lake_archiver, topic)  # redoes the failed pass's records too
    if concurrent.endswith("elsewhere"):
        followed = "follows REPLACE snapshot" if concurrent.startswith("rewrite") else "follows DELETE snapshot"
        assert followed in caplog.text and "follows OVERWRITE snapshot" in caplog.text, caplog.text
        assert "rebuilt" not in caplog.text
    check_table(lake_spark, lake_settings, topic, "table", expected)
    check_index(lake_spark, lake_settings, topic, "table")


def test_maintenance_compacts_an_upsert_table_and_the_index_follows(
    lake_broker: BrokerProcess, lake_archiver: Archiver, lake_spark: Any, lake_settings: Settings,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """`icelog maintain` rewrites the data files whose DVs cover much of them (DVs applied, dropped); the next
    upserts find the moved rows through the index (it follows the REPLACE snapshots, no rebuild), and every
    engine still returns exactly the latest row per live key. `icelog status --tables` shows the key and the
    index state: stale after the compaction, at the current snapshot after the next pass."""
    from tests.archive.test_maintenance import run_icelog

    topic = "pk_maintained"
    create_topic(lake_broker, topic, 2, {"cleanup.policy": "compact", "icelog.archive.layout": "table"})
    produced = send(lake_broker, topic, [(f"k{i}".encode(), f"a{i}".encode()) for i in range(40)], partitions=2)
    pass_ok(lake_archiver, topic)
    produced += send(lake_broker, topic, [(f"k{i}".encode(), f"b{i}".encode()) for i in range(30)]
                     + [(b"k31", None)], partitions=2)
    pass_ok(lake_archiver, topic)
    produced += send(lake_broker, topic, [(b"k35", b"c35"), (b"k36", b"c36")], partitions=2)
    pass_ok(lake_archiver, topic)
    expected = latest(produced)
    assert lake_spark.sql(f"SELECT * FROM lake.icelog.`{topic}`.delete_files").collect()  # the first files' DVs

    done = run_icelog(lake_settings, "maintain", "--topic", topic)
    assert done.returncode == 0, done.stderr
    assert "rewritten into" in done.stdout, done.stdout
    operation = lake_spark.sql(
        f"SELECT operation FROM lake.icelog.`{topic}`.snapshots ORDER BY committed_at DESC LIMIT 1"
    ).collect()[0].operation
    assert operation == "replace"
    assert not lake_spark.sql(f"SELECT * FROM lake.icelog.`{topic}`.delete_files").collect()  # DVs applied
    data_rows = sum(f.record_count for f in lake_spark.sql(
        f"SELECT record_count FROM lake.icelog.`{topic}`.data_files").collect())
    assert data_rows == len(expected)  # replaced rows are gone from the files, not just masked
    check_table(lake_spark, lake_settings, topic, "table", expected)
    status = run_icelog(lake_settings, "status", "--tables")
    assert status.returncode == 0, status.stderr
    [line] = [x for x in status.stdout.splitlines() if x.startswith(f"icelog.{topic} ")]
    assert " __key " in line and "stale (at " in line, line

    more = [(f"k{i}".encode(), f"d{i}".encode()) for i in range(0, 40, 3)] + [(b"k1", None), (b"k99", b"d99")]
    produced += send(lake_broker, topic, more, partitions=2)
    with caplog.at_level(logging.INFO, logger="icelog.archive.upsert"):
        pass_ok(lake_archiver, topic)
    assert "follows REPLACE snapshot" in caplog.text and "rebuilt" not in caplog.text
    check_table(lake_spark, lake_settings, topic, "table", latest(produced))
    check_index(lake_spark, lake_settings, topic, "table")
    status = run_icelog(lake_settings, "status", "--tables")
    [line] = [x for x in status.stdout.splitlines() if x.startswith(f"icelog.{topic} ")]
    current = catalog_table(lake_settings, topic).metadata.current_snapshot_id
    assert f"at snapshot {current}" in line, line
    header = status.stdout.splitlines()[0].split()
    assert int(line.split()[header.index("RECORDS")]) == len(latest(produced))  # live rows, not DV-deleted ones


def test_each_pass_is_one_snapshot_whose_files_are_described_as_icebergs_writers_do(
    lake_broker: BrokerProcess, lake_archiver: Archiver, lake_spark: Any, lake_settings: Settings
) -> None:
    """A pass's workers write its data files and the driver commits them with their DVs: one snapshot per pass,
    nothing staged. Each file is described as Iceberg's own writers describe theirs: its partition (the bucket
    its rows are in), its record count and its column bounds (what status and read-back plan from) match what
    the file holds. Each commit's summary has the commit user and the next offset per bucket (as Fluss's)."""
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    topic = "pk_one_snapshot"
    create_topic(lake_broker, topic, 2, {"cleanup.policy": "compact", "icelog.archive.layout": "table"})
    produced: list[Record] = []
    for n in range(4):
        produced += send(lake_broker, topic, [(f"k{i}".encode(), f"v{n}-{i}".encode()) for i in range(n, n + 3)],
                         partitions=2)
        pass_ok(lake_archiver, topic)
        assert len(catalog_table(lake_settings, topic).metadata.snapshots) == n + 1
    check_table(lake_spark, lake_settings, topic, "table", latest(produced))
    table = catalog_table(lake_settings, topic)
    files = table.inspect.files().filter(pc.equal(pc.field("content"), 0)).to_pylist()
    assert len(files) >= 4
    for described in files:
        held = pq.read_table(described["file_path"].removeprefix("file:"), columns=["__bucket", "__offset"])
        assert described["record_count"] == held.num_rows
        assert set(held.column("__bucket").to_pylist()) == {described["partition"]["__bucket"]}
        offsets = described["readable_metrics"]["__offset"]
        assert (offsets["lower_bound"], offsets["upper_bound"]) == (pc.min(held.column("__offset")).as_py(),
                                                                    pc.max(held.column("__offset")).as_py())
    summary = table.metadata.current_snapshot().summary.additional_properties
    assert summary["commit-user"] == "icelog-archiver"
    next_offsets = {p: max(o for q, o, _k, _v in produced if q == p) + 1 for p in (0, 1)}
    assert decode_offsets(summary["icelog.archive.offsets"]) == next_offsets


def test_an_analysts_insert_of_an_existing_key_is_followed_and_the_older_row_marked_deleted(
    lake_broker: BrokerProcess, lake_archiver: Archiver, lake_spark: Any, lake_settings: Settings,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A Spark SQL `INSERT INTO` (a foreign APPEND snapshot: no icelog commit-user) adds a second row for an
    existing key and a row for a new key. The next pass's index follows that snapshot from its added files (no
    rebuild): the analyst's row, the later commit, is the key's row, and the older one is marked deleted by the
    pass's commit; a later record of the key replaces the analyst's row. Same outcome when the index is lost
    and rebuilt from a table that holds a key twice."""
    topic = "pk_foreign_insert"
    table = f"icelog.`{topic}`"
    create_topic(lake_broker, topic, 3, {"cleanup.policy": "compact", "icelog.archive.layout": "table"})
    produced = send(lake_broker, topic, [(f"k{i}".encode(), f"a{i}".encode()) for i in range(12)])
    pass_ok(lake_archiver, topic)
    columns = [f.name for f in lake_spark.table(table).schema.fields]

    def insert(copies: dict[bytes, tuple[bytes, bytes]]) -> dict[bytes, tuple[bytes, int, int]]:
        """INSERT INTO copies of rows (source key → new key, new value); the rows the table then holds for them."""
        before = spark_rows(lake_spark, topic)
        selects = []
        for source, (key, value) in copies.items():
            exprs = {"__key": f"X'{key.hex()}' AS __key", "__value": f"X'{value.hex()}' AS __value"}
            selects.append(f"SELECT {', '.join(exprs.get(c, f'`{c}`') for c in columns)} FROM {table} "
                           f"WHERE __key = X'{source.hex()}'")
        lake_spark.sql(f"INSERT INTO {table} {' UNION ALL '.join(selects)}").collect()
        return {key: (value, before[source][1], before[source][2])
                for source, (key, value) in copies.items()}

    analyst = insert({b"k3": (b"k3", b"analyst-3"), b"k5": (b"ext", b"analyst-new")})
    snapshot = catalog_table(lake_settings, topic).metadata.current_snapshot()
    assert snapshot.summary.operation.value == "append"
    assert "commit-user" not in snapshot.summary.additional_properties  # a foreign commit
    assert sorted(r[0] for r in spark_rows_all(lake_spark, topic)).count(b"k3") == 2  # until the next pass

    produced += send(lake_broker, topic, [(b"k1", b"b1"), (b"k20", b"b20")])
    with caplog.at_level(logging.INFO, logger="icelog.archive.upsert"):
        pass_ok(lake_archiver, topic)
    expected = {**latest(produced), **analyst}
    check_table(lake_spark, lake_settings, topic, "table", expected)  # k3 once: the analyst's row
    check_index(lake_spark, lake_settings, topic, "table")
    assert "follows APPEND snapshot" in caplog.text and "rebuilt" not in caplog.text  # from the added files only

    produced += send(lake_broker, topic, [(b"k3", b"c3"), (b"ext", b"c-ext")])  # Kafka's records win again
    pass_ok(lake_archiver, topic)
    check_table(lake_spark, lake_settings, topic, "table", latest(produced))
    check_index(lake_spark, lake_settings, topic, "table")

    # Another analyst's INSERT of an existing key, then the index lost: the rebuild finds the key twice.
    analyst = insert({b"k4": (b"k4", b"analyst-4")})
    table_uuid = str(catalog_table(lake_settings, topic).metadata.table_uuid)
    shutil.rmtree(Path(lake_settings.data_dir) / "pk-index" / table_uuid)
    produced += send(lake_broker, topic, [(b"k6", b"d6")])
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="icelog.archive.upsert"):
        pass_ok(lake_archiver, topic)
    assert "1 stale rows" in caplog.text
    check_table(lake_spark, lake_settings, topic, "table", {**latest(produced), **analyst})
    check_index(lake_spark, lake_settings, topic, "table")


def spark_rows_all(spark: Any, topic: str) -> list[tuple[bytes, bytes, int, int]]:
    """Every live row of a table-layout table: (key, value, partition, offset), duplicates kept."""
    rows = spark.sql(f"SELECT __key AS k, __value AS v, __bucket AS p, __offset AS o FROM icelog.`{topic}`").collect()
    return [(bytes(r.k), bytes(r.v), r.p, r.o) for r in rows]


def spark_rows(spark: Any, topic: str) -> Latest:
    """Each key's row with the highest offset (a key held twice keeps either of them)."""
    return {k: (v, p, o) for k, v, p, o in sorted(spark_rows_all(spark, topic), key=lambda r: r[3])}


@pytest.mark.parametrize("schema_type", ["AVRO", "JSON"])
def test_primary_key_on_avro_and_json_key_fields(
    lake_broker: BrokerProcess, lake_archiver: Archiver, lake_spark: Any, schema_type: str,
) -> None:
    """A compacted topic whose KEY has an Avro (or JSON) schema of several field types (string, date, decimal /
    integer): `icelog.table.primary.key` names the key's fields; the latest value per key, tombstones delete."""
    import datetime
    import decimal
    import json

    from confluent_kafka.schema_registry import SchemaRegistryClient
    from confluent_kafka.schema_registry.avro import AvroSerializer
    from confluent_kafka.schema_registry.json_schema import JSONSerializer
    from confluent_kafka.serialization import MessageField, SerializationContext

    topic = f"pk_{schema_type.lower()}_keys"
    create_topic(lake_broker, topic, 1, {"cleanup.policy": "compact", "icelog.archive.layout": "table",
                                         "icelog.table.primary.key": "shop,day,till"})
    registry = SchemaRegistryClient({"url": lake_broker.registry_url})
    key_ctx, value_ctx = SerializationContext(topic, MessageField.KEY), SerializationContext(topic, MessageField.VALUE)
    if schema_type == "AVRO":
        keys = AvroSerializer(registry, json.dumps({"type": "record", "name": "K", "fields": [
            {"name": "shop", "type": "string"}, {"name": "day", "type": {"type": "int", "logicalType": "date"}},
            {"name": "till", "type": {"type": "bytes", "logicalType": "decimal", "precision": 6, "scale": 1}}]}))
        values = AvroSerializer(registry, json.dumps({"type": "record", "name": "V", "fields": [
            {"name": "total", "type": "long"}]}))

        def key(i: int) -> bytes:
            return keys({"shop": f"s{i % 3}", "day": datetime.date(2026, 1, 1 + i % 2),  # type: ignore[no-any-return]
                         "till": decimal.Decimal(f"{i % 2}.5")}, key_ctx)
    else:
        keys = JSONSerializer(json.dumps({"type": "object", "properties": {
            "shop": {"type": "string"}, "day": {"type": "string", "format": "date"}, "till": {"type": "integer"}},
            "additionalProperties": False}), registry)
        values = JSONSerializer(json.dumps({"type": "object", "properties": {"total": {"type": "integer"}},
                                            "additionalProperties": False}), registry)

        def key(i: int) -> bytes:
            return keys({"shop": f"s{i % 3}", "day": f"2026-01-0{1 + i % 2}", "till": i % 2},  # type: ignore[no-any-return]
                        key_ctx)

    expected: dict[bytes, int] = {}
    records: list[tuple[bytes, bytes | None]] = []
    for i in range(12):  # 6 distinct keys, each written twice
        records.append((key(i), values({"total": i}, value_ctx)))
        expected[key(i)] = i
    records.append((key(0), None))  # a tombstone deletes the key's row
    del expected[key(0)]
    send(lake_broker, topic, records, partitions=1)
    pass_ok(lake_archiver, topic)
    rows = lake_spark.sql(f"SELECT shop, day, till, total, __key FROM icelog.`{topic}`").collect()
    assert sorted((bytes(r["__key"]), r.total) for r in rows) == sorted(expected.items())
    first = [r for r in rows if r.total == 11][0]
    assert first.shop == "s2" and first.day == datetime.date(2026, 1, 2)
    assert first.till == (decimal.Decimal("1.5") if schema_type == "AVRO" else 1)
