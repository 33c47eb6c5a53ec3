"""Every error says by its type whether to retry: what the archiver and a user see when something fails.

The JVM cases go through a real Spark session (the archive tests' session fixtures): a concurrent Iceberg commit
refused by the Java API, a task failing in Spark's Python workers, a topic pointed at another topic's table.
"""

from __future__ import annotations

import json
import socket
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import pytest

from icelog.archive.archiver import Archiver, ForeignTableError
from icelog.archive.locks import ArchiverLock, LockHeldError
from icelog.archive.upsert import StaleIndexError
from icelog.config import Settings
from icelog.errors import (
    CommitConflictError,
    ConfigError,
    ErrorCode,
    IcelogError,
    KafkaApiError,
    TableChangedError,
    TableMismatchError,
    first_line,
)
from icelog.lake.jvm_errors import JvmError, WorkerError, in_worker, jvm_errors
from icelog.schema.registry_client import RegistryClient, RegistryUnavailableError, SchemaNotFoundError
from icelog.table.layout import quote_identifier
from tests.support.archive import create_topic, produce
from tests.support.broker import BrokerProcess


def test_the_type_says_whether_to_retry() -> None:
    retriable = {
        RegistryUnavailableError: True,  # the registry down: ask again later
        CommitConflictError: True,  # another writer's commit won: redo from the new snapshot
        StaleIndexError: True,  # the primary-key index behind the table: rebuilt, redone at once
        LockHeldError: True,  # another process holds the lock: until it lets go
        JvmError: True,  # the catalog or warehouse unreachable, an executor lost, ...
        ForeignTableError: False,  # the table holds another topic's archive: a config or the table must change
        TableMismatchError: False,
        ConfigError: False,
        SchemaNotFoundError: False,  # the registry answered: a fact about the data
        IcelogError: False,
    }
    assert {error: error.retriable for error in retriable} == retriable
    assert issubclass(CommitConflictError, TableChangedError) and issubclass(StaleIndexError, TableChangedError)
    assert issubclass(ForeignTableError, TableMismatchError)
    # KafkaApiError's comes from its code (kafka-python's classification), on the same attribute
    assert KafkaApiError(ErrorCode.NOT_ENOUGH_REPLICAS).retriable
    assert not KafkaApiError(ErrorCode.CORRUPT_MESSAGE).retriable


def test_a_registry_that_does_not_answer_is_retriable() -> None:
    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    with pytest.raises(RegistryUnavailableError) as info:
        RegistryClient(f"http://127.0.0.1:{port}").latest("orders-value")
    assert info.value.retriable


def test_a_held_lock_is_retriable(tmp_path: Path) -> None:
    from icelog.meta.sqlite.locks import FileLocks

    held = ArchiverLock(FileLocks(tmp_path))
    held.acquire()
    try:
        with pytest.raises(LockHeldError) as info:
            ArchiverLock(FileLocks(tmp_path)).acquire(wait_s=0)
        assert info.value.retriable
    finally:
        held.release()


# -- through the JVM ---------------------------------------------------------------------------------------------
@pytest.mark.slow
def test_a_concurrent_iceberg_commit_is_a_retriable_commit_conflict(lake_settings: Settings, lake_spark: Any) -> None:
    """Two writers load the table; the one that commits second is refused by Iceberg (Java's
    CommitFailedException), converted once at the boundary."""
    from icelog.lake import iceberg_java

    name = quote_identifier(lake_settings.archive.catalog_name, "icelog", "errors_conflict")
    lake_spark.sql(f"CREATE TABLE IF NOT EXISTS {name} (id BIGINT) USING iceberg")
    mine = iceberg_java.load_table(lake_spark, name)
    theirs = iceberg_java.load_table(lake_spark, name)
    iceberg_java.set_table_properties(theirs, {"owner": "them"})  # the other writer's commit lands first
    schema = json.loads(iceberg_java.schema_json(lake_spark, mine)[0])
    schema["fields"].append({"id": 2, "name": "note", "required": False, "type": "string"})
    with pytest.raises(CommitConflictError) as info:  # mine is checked against the metadata it was loaded with
        iceberg_java.commit_schema(lake_spark, mine, json.dumps(schema))
    assert info.value.retriable and isinstance(info.value, TableChangedError)
    assert first_line(info.value).startswith("org.apache.iceberg.exceptions.CommitFailedException")
    lake_spark.sql(f"DROP TABLE {name}")


@pytest.mark.slow
def test_a_java_failure_without_a_type_of_its_own_is_retried(lake_spark: Any) -> None:
    with pytest.raises(JvmError) as info, jvm_errors():
        lake_spark._jvm.java.util.ArrayList().get(3)
    assert info.value.retriable and info.value.java_class == "java.lang.IndexOutOfBoundsException"
    assert first_line(info.value).startswith("java.lang.IndexOutOfBoundsException: Index 3 out of bounds")


@pytest.mark.slow
def test_a_task_failing_in_a_python_worker_is_a_worker_error_typed_by_what_it_raised(lake_spark: Any) -> None:
    """An RDD job (the upsert pass's) and a SQL job (mapInArrow, the append pass's): the driver sees the worker's
    error type and whether it is retriable, not a traceback."""
    import pyarrow as pa

    def registry_down(numbers: Iterable[int]) -> Iterator[int]:
        for _ in numbers:
            raise RegistryUnavailableError("schema registry http://registry:8081 unreachable")
        yield 0

    with pytest.raises(WorkerError) as info, jvm_errors():
        lake_spark.sparkContext.parallelize([1], 1).mapPartitions(in_worker(registry_down)).collect()
    assert (info.value.error_type, info.value.retriable) == ("RegistryUnavailableError", True)
    assert str(info.value) == "RegistryUnavailableError: schema registry http://registry:8081 unreachable"

    def undecodable(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for _ in batches:
            raise ValueError("a record runs past the end of its batch")
        yield pa.record_batch([pa.array([0], pa.int64())], names=["id"])

    with pytest.raises(WorkerError) as info, jvm_errors():
        lake_spark.range(0, 1, 1, 1).mapInArrow(in_worker(undecodable), "id long").collect()
    assert (info.value.error_type, info.value.retriable) == ("ValueError", False)  # the dead-letter case
    assert str(info.value) == "ValueError: a record runs past the end of its batch"


@pytest.mark.slow
def test_a_topic_pointed_at_another_topics_table_fails_as_permanent(
    lake_broker: BrokerProcess, lake_archiver: Archiver, caplog: pytest.LogCaptureFixture
) -> None:
    owner, borrower = "errors-owner", "errors-borrower"
    create_topic(lake_broker, owner, partitions=1)
    produce(lake_broker, owner, 3, partitions=1)
    [result] = lake_archiver.run_pass(force=True, topics=[owner])
    assert not result.error, result.error
    create_topic(lake_broker, borrower, partitions=1, configs={"icelog.archive.iceberg.table": f"icelog.{owner}"})
    produce(lake_broker, borrower, 2, partitions=1)
    with caplog.at_level("ERROR", logger="icelog.archive.archiver"):
        [result] = lake_archiver.run_pass(force=True, topics=[borrower])
    assert result.error.startswith("ForeignTableError: table ") and result.records == 0, result.error
    assert "needs a fix" in caplog.text  # logged as needing a fix, not as a blip (it is retried all the same)
