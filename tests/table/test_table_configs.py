"""Table topic configs and the table layout's pure parts (no broker, no Spark): specs, DDL, column order."""

from __future__ import annotations

import pytest
from google.protobuf import descriptor_pb2
from google.protobuf.descriptor import Descriptor

from icelog.errors import KafkaApiError
from icelog.schema.protobuf_schema import build_pool, compile_schema
from icelog.table.config import forwarded_properties, table_config
from icelog.table.field_ids import Column, evolve
from icelog.table.iceberg_types import iceberg_schema, table_layout_columns
from icelog.table.layout import archive_table_ddl, table_spec
from icelog.table.protobuf_types import fields_of
from icelog.table.rules import check_spec_columns
from icelog.topics import validate_config_change, validate_table_configs, validate_together, validate_topic_configs


def proto_table_layout_columns(key: Descriptor | None, value: Descriptor | None) -> tuple[Column, ...]:
    """The table_layout_columns of Protobuf messages."""
    return table_layout_columns(fields_of(key), fields_of(value))


V1 = 'syntax = "proto3"; package t; message M { int64 id = 1; double score = 2; repeated string tags = 3; }'
V2 = V1.replace("repeated string tags = 3;", "repeated string tags = 3; string region = 4;")


def message(text: str) -> descriptor_pb2.DescriptorProto:
    fds = compile_schema(text, {})
    return build_pool(fds).FindMessageTypeByName("t.M")


def test_table_configs_must_fit_together() -> None:
    assert table_config({}).layout == "record"
    config = table_config({"icelog.archive.layout": "table", "icelog.table.partition.by": "a, b",
                           "icelog.table.bucket.key": "id"})
    assert (config.partition_by, config.bucket_key) == (("a", "b"), "id")
    for bad, why in (
        ({"icelog.table.partition.by": "a"}, "need icelog.archive.layout=table"),
        ({"icelog.archive.layout": "table", "icelog.table.partition.by": "id", "icelog.table.bucket.key": "id"},
         "both the bucket key and a partition column"),
    ):
        with pytest.raises(KafkaApiError, match=why):
            validate_table_configs(bad, {})
    # Broker defaults count: a table layout by default accepts partition.by on the topic.
    validate_table_configs({"icelog.table.partition.by": "a"}, {"icelog.archive.layout": "table"})
    for key, value in (("icelog.table.bucket.key", "a,b"), ("icelog.archive.layout", "wide"),
                       ("iceberg.icelog.layout", "x"), ("iceberg.", "x"), ("icelog.table.partition.by", "a,a")):
        with pytest.raises(KafkaApiError) as info:
            validate_topic_configs({key: value})
        assert info.value.code.name == "INVALID_CONFIG"
    validate_topic_configs({"iceberg.write.target-file-size-bytes": "1"})
    # The layout's own columns can never shape a table: refused at creation, not by every archive pass after.
    for key, value in (("icelog.table.partition.by", "__offset"), ("icelog.table.partition.by", "region, __value"),
                       ("icelog.table.bucket.key", "__timestamp")):
        with pytest.raises(KafkaApiError, match="a column of the layout itself") as info:
            validate_topic_configs({key: value})
        assert info.value.code.name == "INVALID_CONFIG"
    validate_topic_configs({"icelog.table.partition.by": "__key", "icelog.table.bucket.key": "__key"})
    # A format version the archive cannot write would fail every pass: refused at creation too.
    for version in ("7", "v2", ""):
        with pytest.raises(KafkaApiError, match="format versions 1, 2, 3"):
            validate_topic_configs({"iceberg.format-version": version})
    validate_topic_configs({"iceberg.format-version": "2"})
    with pytest.raises(KafkaApiError, match="a primary-key table is format 3"):
        validate_table_configs({"cleanup.policy": "compact", "iceberg.format-version": "2"}, {})
    validate_table_configs({"cleanup.policy": "compact", "iceberg.format-version": "3"}, {})
    # Its deletes are deletion vectors: copy-on-write modes are refused (an analyst's DML would rewrite files).
    for kind in ("delete", "update", "merge"):
        with pytest.raises(KafkaApiError, match="a primary-key table is merge-on-read"):
            validate_table_configs({"cleanup.policy": "compact", f"iceberg.write.{kind}.mode": "copy-on-write"}, {})
        validate_table_configs({"cleanup.policy": "compact", f"iceberg.write.{kind}.mode": "merge-on-read"}, {})
        validate_table_configs({f"iceberg.write.{kind}.mode": "copy-on-write"}, {})  # an append table may


def test_layout_configs_are_fixed_once_the_topic_exists() -> None:
    current = {"icelog.archive.layout": "table"}
    validate_config_change(current, {"retention.ms": "1", "icelog.archive.layout": "table"}, [])
    for set_configs, delete in (({"icelog.archive.layout": "record"}, []), ({}, ["icelog.archive.layout"]),
                                ({"icelog.table.bucket.key": "id"}, [])):
        with pytest.raises(KafkaApiError, match="fixed when the topic is created"):
            validate_config_change(current, set_configs, delete)


def test_forwarded_properties() -> None:
    assert forwarded_properties({"iceberg.commit.retry.num-retries": "5", "retention.ms": "10",
                                 "icelog.archive.layout": "table"}) == {
        "commit.retry.num-retries": "5", "icelog.retention.ms": "10", "icelog.icelog.archive.layout": "table"}


def test_specs_follow_fluss_rules() -> None:
    def ddl(configs: dict[str, str]) -> str:
        spec = table_spec(table_config({"icelog.archive.layout": "table", **configs}), 4)
        return " | ".join(archive_table_ddl("lake", "ns", "t", "`a` INT", spec, {"x.y": "it's"}).statements[1:])

    assert "PARTITIONED BY (`__bucket`)" in ddl({})
    assert "WRITE ORDERED BY `__offset`" in ddl({})
    assert "PARTITIONED BY (`day`, `region`, `__bucket`)" in ddl({"icelog.table.partition.by": "day,region"})
    assert "PARTITIONED BY (`day`, bucket(4, `id`))" in ddl(
        {"icelog.table.partition.by": "day", "icelog.table.bucket.key": "id"})
    assert "'icelog.layout'='table-v1'" in ddl({}) and "'x.y'='it\\'s'" in ddl({})
    record = archive_table_ddl("lake", "ns", "t").statements
    assert "PARTITIONED BY (`kafka`.`partition`, days(`kafka`.`ingest_timestamp`))" in record[1]
    assert "'icelog.layout'='archive-v1'" in record[1] and record[2].endswith("`kafka`.`offset`")


def test_system_columns_stay_last_after_evolution() -> None:
    v1 = evolve(proto_table_layout_columns(None, message(V1)), [])
    v2 = evolve(proto_table_layout_columns(None, message(V2)), v1)
    names = [f.name for f in iceberg_schema(v2).fields]
    assert names == ["id", "score", "tags", "region", "__key", "__value", "__value_prefix", "__value_err",
                     "__headers", "__batch_start", "__bucket", "__offset", "__timestamp"]
    ids = {r.path: r.field_id for r in v1}
    assert all(ids[r.path] == r.field_id for r in v2 if r.path in ids)
    assert max(r.field_id for r in v2 if r.path == "region") > max(ids.values())


def test_partition_and_bucket_columns_are_checked() -> None:
    columns = proto_table_layout_columns(None, message(V1))
    check_spec_columns(columns, ["id"], "__key")
    for partition_by, bucket, why in (
        (["nope"], None, "not a top-level column"),
        ([], "score", "cannot bucket"),
        (["tags"], None, "only a scalar"),
        (["__offset"], None, "layout itself"),
    ):
        with pytest.raises(ValueError, match=why):
            check_spec_columns(columns, partition_by, bucket)


def test_primary_key_configs() -> None:
    """cleanup.policy=compact keys the table by the record key; primary.key names value columns (table layout)."""
    assert table_config({"cleanup.policy": "compact"}).primary_key == ("key.__raw__",)
    assert table_config({"cleanup.policy": "compact", "icelog.archive.layout": "table"}).primary_key == ("__key",)
    assert table_config({"icelog.archive.layout": "table", "icelog.table.primary.key": "shop, user"}).primary_key == (
        "shop", "user")
    assert table_config({}).primary_key == () and table_config({"cleanup.policy": "delete"}).primary_key == ()
    validate_topic_configs({"cleanup.policy": "compact"})
    for policy in ("compact,delete", "delete, compact"):  # Kafka's list: compacted, and retention applies
        validate_topic_configs({"cleanup.policy": policy})
        assert table_config({"cleanup.policy": policy}).primary_key == ("key.__raw__",)
    for key, value in (("cleanup.policy", "compact,forever"), ("cleanup.policy", ","),
                       ("icelog.table.primary.key", "a,a"), ("icelog.table.primary.key", " ")):
        with pytest.raises(KafkaApiError) as info:
            validate_topic_configs({key: value})
        assert info.value.code.name == "INVALID_CONFIG"
    with pytest.raises(KafkaApiError, match="need icelog.archive.layout=table"):
        validate_table_configs({"icelog.table.primary.key": "id"}, {})
    with pytest.raises(KafkaApiError, match="fixed when the topic is created"):
        validate_config_change({}, {"icelog.table.primary.key": "id"}, [])
    # cleanup.policy may gain or lose delete (retention on or off), never compact (the table's kind).
    compact = {"cleanup.policy": "compact"}
    validate_config_change(compact, {"cleanup.policy": "compact,delete"}, [])
    validate_config_change({"cleanup.policy": "compact,delete"}, compact, [])
    refused = [(compact, {"cleanup.policy": "delete"}, []), (compact, {}, ["cleanup.policy"]),
               ({}, {"cleanup.policy": "delete,compact"}, []), (compact, {"cleanup.policy": ""}, [])]
    for current, change, deleted in refused:
        with pytest.raises(KafkaApiError, match="may gain or lose delete .retention., not compact") as info:
            validate_config_change(current, change, deleted)
        assert info.value.code.name == "INVALID_CONFIG"
    # Kafka's own cross-check: the compaction lags must be in order.
    validate_together({"min.compaction.lag.ms": "1000", "max.compaction.lag.ms": "1000"}, {})
    with pytest.raises(KafkaApiError, match=r"min.compaction.lag.ms \(100000\) is greater than max.compaction.lag.ms"):
        validate_together({"min.compaction.lag.ms": "100000", "max.compaction.lag.ms": "1000"}, {})
    upsert = table_spec(table_config({"cleanup.policy": "compact", "icelog.archive.layout": "table"}), 3)
    statement = archive_table_ddl("lake", "ns", "t", "`a` INT", upsert).statements[1]
    for prop in ("'format-version'='3'", "'write.delete.mode'='merge-on-read'", "'write.merge.mode'='merge-on-read'",
                 "'write.update.mode'='merge-on-read'", "'icelog.primary-key'='__key'"):
        assert prop in statement
    plain = archive_table_ddl("lake", "ns", "t", "`a` INT", table_spec(table_config({}), 3)).statements[1]
    assert "'format-version'='2'" in plain and "primary-key" not in plain
