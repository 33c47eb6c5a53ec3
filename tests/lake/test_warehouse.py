"""How each engine is pointed at the warehouse: the Spark conf and pyiceberg properties for a bucket come from the
AWS_* variables, carry no credential, and a warehouse no engine here reaches is refused with the fix."""

from __future__ import annotations

from pathlib import Path

import pytest

from icelog.config import load_settings
from icelog.errors import ConfigError
from icelog.lake.catalog import catalog_jars, pyiceberg_catalog_opener
from icelog.lake.spark import spark_conf
from icelog.lake.warehouse import io_properties

SECRET = "do-not-show-me"


@pytest.fixture
def aws(monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in {"AWS_ENDPOINT_URL": "http://127.0.0.1:8333", "AWS_ACCESS_KEY_ID": "AKIDEXAMPLE",
                        "AWS_SECRET_ACCESS_KEY": SECRET, "AWS_REGION": "eu-west-3"}.items():
        monkeypatch.setenv(name, value)


def test_a_bucket_warehouse_gives_spark_s3a_and_pyiceberg_the_endpoint_but_no_secret(tmp_path: Path, aws: None) -> None:
    settings = load_settings(data_dir=str(tmp_path), archive={"warehouse": "s3://lake/warehouse"})
    conf = spark_conf(settings)
    assert conf["spark.hadoop.fs.s3.impl"] == conf["spark.hadoop.fs.s3a.impl"] == \
        "org.apache.hadoop.fs.s3a.S3AFileSystem"
    assert conf["spark.hadoop.fs.s3a.endpoint"] == "http://127.0.0.1:8333"
    assert conf["spark.hadoop.fs.s3a.path.style.access"] == "true"
    assert conf["spark.hadoop.fs.s3a.connection.ssl.enabled"] == "false"
    assert conf["spark.hadoop.fs.s3a.endpoint.region"] == "eu-west-3"
    jars = [Path(j).name for j in conf["spark.jars"].split(",")]
    assert any(j.startswith("hadoop-aws-3.3.4") for j in jars)
    assert any(j.startswith("aws-java-sdk-bundle") for j in jars)
    props = io_properties(settings)
    assert props["s3.endpoint"] == "http://127.0.0.1:8333" and props["s3.region"] == "eu-west-3"
    assert SECRET not in str(conf) and SECRET not in str(props) and "AKIDEXAMPLE" not in str(conf) + str(props)


def test_user_settings_win_over_the_environment(tmp_path: Path, aws: None) -> None:
    settings = load_settings(data_dir=str(tmp_path), archive={
        "warehouse": "s3a://lake/wh", "spark_conf": {"spark.hadoop.fs.s3a.path.style.access": "false"},
        "catalog_properties": {"s3.endpoint": "https://s3.example.com"}})
    assert spark_conf(settings)["spark.hadoop.fs.s3a.path.style.access"] == "false"
    assert io_properties(settings)["s3.endpoint"] == "https://s3.example.com"


def test_a_directory_warehouse_needs_no_s3(tmp_path: Path, aws: None) -> None:
    settings = load_settings(data_dir=str(tmp_path))
    assert not any(k.startswith("spark.hadoop.fs.s3") for k in spark_conf(settings))
    assert [j.name for j in catalog_jars(settings)][0].startswith("iceberg-spark-runtime")
    assert len(catalog_jars(settings)) == 1 + 1  # the runtime and SQLite's JDBC driver
    assert io_properties(settings) == {}
    assert pyiceberg_catalog_opener(settings) is not None


@pytest.mark.parametrize(("warehouse", "says"), [
    ("gs://bucket/wh", "a gs:// warehouse is not supported; use a directory (file:///PATH) or an S3-compatible bucket"),
    ("s3:///wh", "names no bucket: use s3://BUCKET/PATH"),
])
def test_a_warehouse_no_engine_reaches_is_refused_with_the_fix(tmp_path: Path, warehouse: str, says: str) -> None:
    settings = load_settings(data_dir=str(tmp_path), archive={"warehouse": warehouse})
    with pytest.raises(ConfigError, match=says.replace("(", r"\(").replace(")", r"\)")):
        catalog_jars(settings)
