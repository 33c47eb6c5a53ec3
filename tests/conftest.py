"""Fixtures every lane shares: real icelog brokers, and the lake (one broker, one Spark session, one Iceberg catalog)
of the Spark tests. Helpers that are not fixtures live in tests/support/.

Tests that need Spark are marked `spark` here, from the fixtures they use (`lake_spark`, or one that depends on
it); a test that starts Spark in a child process only is marked by hand. Tests of Kafka's own Java client and tools
are marked `java` (from the `kafka_java` fixture): JVMs, but short ones and no Spark, so they run on the JVM-free
worker of `make test`. `make test-quick` runs `-m 'not spark and not java'` with ICELOG_TESTS_NO_JVM=1, which puts a
`java` that refuses to start first on the PATH: an unmarked Spark or Java test fails there instead of making the
quick lane slow.

`make test` runs three pytest-xdist workers (`--dist loadgroup`): the Spark tests are in three groups (`spark_lane`),
each run by one worker one after another with one Spark session, and the JVM-free tests fill the gaps (they mostly
wait on the processes they start).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from collections.abc import Generator, Iterator
from pathlib import Path
from typing import Any

import pytest

from icelog.archive.archiver import Archiver
from icelog.config import Settings, load_settings
from icelog.meta.backends import open_store
from icelog.meta.store import MetadataStore
from tests.support.archive import ARCHIVE_ENV
from tests.support.broker import BrokerProcess
from tests.support.jvm import DRIVER_OPTIONS, JIT_OPTION, class_archive, driver_conf
from tests.support.postgres import postgres_cluster  # noqa: F401 (a session fixture: the throwaway PostgreSQL)

SPARK_FIXTURES = {"lake_spark"}
JAVA_FIXTURES = {"kafka_java"}  # Kafka's own Java client and tools (tests/java/conftest.py): JVMs, but no Spark
NO_JVM_ENV = "ICELOG_TESTS_NO_JVM"
SPARK_CONF_ENV = "ICELOG_ARCHIVE__SPARK_CONF"
WORKER_LINE = "icelog_line"  # an xdist worker's line for the terminal, in its workeroutput
# The JVM options of the Spark drivers tests start in child processes (tests/support/jvm.py), unless the user set
# the variable: the first JIT tier and the class archive, put in the environment before the first Spark test
# (pytest_runtest_protocol; not here: xdist's workers would inherit the controller's value as if the user had set it).
CHILD_DRIVER_CONF: dict[str, str] = {} if SPARK_CONF_ENV in os.environ else driver_conf()
# The archivers the tests start run at the broker's CPU priority, not archive.nice's default (15 below it): on two
# cores loaded by three test workers a niced archiver gets under 1 % of the CPU, and the tests wait on its passes.
# (An in-process ArchiveService would renice the pytest worker itself.) tests/log/test_backpressure.py and
# tests/archive/test_archive_nice.py set it themselves.
os.environ.setdefault("ICELOG_ARCHIVE__NICE", "0")


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects by marker, and before xdist reads the groups
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        # fixturenames is the closure: it holds lake_spark also when the test asks for lake_archiver only.
        if SPARK_FIXTURES.intersection(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.spark)
        if JAVA_FIXTURES.intersection(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.java)
        if item.get_closest_marker("spark"):
            item.add_marker(pytest.mark.xdist_group(spark_lane(item.nodeid)))


def spark_lane(nodeid: str) -> str:
    """The Spark lane a test runs in: the archive path's own tests (archive/test_archive*.py and the catalog's), the
    tests that bring their own external systems (the sink against Apache Kafka, the tables on S3: their own Kafka
    broker or object store and Spark processes) and the live reads (a lake of their own), which run beside the other
    two lanes, or the rest (tables, maintenance, read-back, sinks). Each lane is one xdist group, so one worker runs
    its tests one after another with one Spark session; the JVM-free tests fill the workers' gaps."""
    path = nodeid.split("::", 1)[0]
    name = path.rsplit("/", 1)[-1]
    if path.startswith("tests/archive/") and name.startswith(("test_archive", "test_errors", "test_metrics_archive",
                                                               "test_postgres_catalog")):
        return "spark-archive"
    if path in ("tests/sink/test_sink_kafka.py", "tests/system/test_tables_on_s3.py",
                "tests/system/test_archiver_failover.py") or path.startswith("tests/live/"):
        return "spark-services"
    return "spark-tables"


@pytest.hookimpl(wrapper=True, tryfirst=True)  # outside pytest-timeout's timer, which starts with the test's setup
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Generator[None, object, object]:
    """Before the first Spark test a process runs (or `spark_children` test: a bench check whose children start
    Spark): the children's driver conf, with the class archive, in the environment (the archive dumped first if
    needed: ~1 min, several on a loaded machine, in no test's timeout).

    Not at collection: under xdist only the worker of the Spark group pays for the dump, and the other worker starts
    on its tests at once."""
    spark = item.get_closest_marker("spark") or item.get_closest_marker("spark_children")
    if spark and CHILD_DRIVER_CONF and not os.environ.get(NO_JVM_ENV):
        _put_class_archive_in_child_driver_conf(item.config)
    return (yield)


def _put_class_archive_in_child_driver_conf(config: pytest.Config) -> None:
    if SPARK_CONF_ENV in os.environ:  # done (the user's own value never reaches here: CHILD_DRIVER_CONF is empty)
        return
    started = time.monotonic()
    archive = class_archive()
    said = f"in {time.monotonic() - started:.0f} s: {archive}" if archive else "none could be made; JIT option only"
    _say(config, f"Spark drivers of child processes: class archive {said}")
    CHILD_DRIVER_CONF.update(driver_conf(archive))
    os.environ[SPARK_CONF_ENV] = json.dumps(CHILD_DRIVER_CONF)


def _say(config: pytest.Config, line: str) -> None:
    """A line on the terminal; an xdist worker prints nothing, so it hands the line to the controller."""
    if hasattr(config, "workeroutput"):
        config.workeroutput[WORKER_LINE] = line
    elif (reporter := config.pluginmanager.get_plugin("terminalreporter")) is not None:
        reporter.write_line(line)


def pytest_testnodedown(node: Any, error: object) -> None:
    """(xdist's controller, as a worker ends) The line the worker had to say."""
    if line := getattr(node, "workeroutput", {}).get(WORKER_LINE):
        _say(node.config, line)


@pytest.fixture(autouse=True)
def _spark_tests_grouped(request: pytest.FixtureRequest) -> None:
    """Under --dist loadgroup xdist puts a test's group in its node id; a pytest whose node ids it cannot extend
    (9.2) would silently spread the Spark tests over both workers."""
    grouping = getattr(request.config.option, "loadgroup", False)
    if grouping and request.node.get_closest_marker("spark") and "@" not in request.node.nodeid:
        pytest.fail("--dist loadgroup did not group the Spark tests: a pytest this pytest-xdist does not support "
                    "(pyproject.toml pins pytest below 9.2)", pytrace=False)


def pytest_configure(config: pytest.Config) -> None:
    if not os.environ.get(NO_JVM_ENV):
        return
    # Spark's launcher runs $JAVA_HOME/bin/java, else the first `java` on the PATH (of this process and its children).
    bin_dir = Path(tempfile.mkdtemp(prefix="icelog-no-jvm-"))
    config.add_cleanup(lambda: shutil.rmtree(bin_dir, ignore_errors=True))
    java = bin_dir / "java"
    java.write_text(f"#!/bin/sh\necho '{NO_JVM_ENV} is set: this lane starts no JVM (mark the test spark, or java "
                    "for the Kafka Java client and tools)' >&2\nexit 1\n")
    java.chmod(0o755)
    os.environ.pop("JAVA_HOME", None)
    os.environ["PATH"] = f"{bin_dir}{os.pathsep}{os.environ['PATH']}"


@pytest.fixture(scope="session")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    """One broker shared by the tests that only need a working broker (use unique topic names)."""
    proc = BrokerProcess(tmp_path_factory.mktemp("shared") / "data").start()
    yield proc
    proc.stop()


@pytest.fixture
def fresh_broker(tmp_path: Path) -> Iterator[BrokerProcess]:
    """A broker of the test's own, for tests that kill it or change broker settings."""
    proc = BrokerProcess(tmp_path / "data")
    yield proc
    proc.stop()


@pytest.fixture
def topic_name(request: pytest.FixtureRequest) -> str:
    """A topic name unique to the test."""
    name = request.node.name.replace("[", "-").replace("]", "").replace("/", "-")
    return f"t-{name}"[:200]


# -- the lake: one broker and one Spark session serve every Spark test (Spark start-up is ~5 s); each test uses its
# own topics, so its own tables.
@pytest.fixture(scope="session")
def lake_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    proc = BrokerProcess(tmp_path_factory.mktemp("archive") / "data", env=ARCHIVE_ENV).start()
    yield proc
    proc.stop()


@pytest.fixture(scope="session")
def lake_settings(lake_broker: BrokerProcess) -> Settings:
    """The lake's settings, with the broker's address: ICELOG_ARCHIVE__READ_VIA=kafka runs the archive tests with
    tasks that fetch from it over the Kafka protocol (its first listener, archive.bootstrap_servers' default).
    Read once the children's driver conf is in the environment (pytest_runtest_protocol), so that lake_spark can
    tell the children's JVM options from a user's."""
    # The archiver reads the embedded registry's schemas from this data dir's metadata store (no HTTP).
    return load_settings(data_dir=str(lake_broker.data_dir), listen=lake_broker.bootstrap,
                         registry_listen=f"127.0.0.1:{lake_broker.registry_port}")


@pytest.fixture(scope="session")
def lake_spark(lake_settings: Settings) -> Iterator[Any]:
    from icelog.lake.catalog import JDBC_DRIVER_JARS, catalog_jars
    from icelog.lake.spark import create_session

    # PostgreSQL's JDBC driver on the session's classpath too, beside SQLite's: java.sql.DriverManager only finds
    # drivers of the jars a session starts with, and test_archive_cluster.py registers a catalog on PostgreSQL here.
    jars = [*catalog_jars(lake_settings), JDBC_DRIVER_JARS["jdbc:postgresql:"]]
    settings = lake_settings.model_copy(deep=True)
    # (ours only: a user's own extraJavaOptions stay)
    conf = {k: v for k, v in settings.archive.spark_conf.items() if CHILD_DRIVER_CONF.get(k) != v}
    if CHILD_DRIVER_CONF:  # (not the class archive: this classpath has PostgreSQL's driver too)
        conf.setdefault(DRIVER_OPTIONS, JIT_OPTION)
    settings.archive.spark_conf = {"spark.jars": ",".join(str(jar) for jar in jars), **conf}
    session = create_session(settings, "icelog-tests")
    yield session
    session.stop()


@pytest.fixture(scope="session")
def lake_store(lake_settings: Settings) -> Iterator[MetadataStore]:
    meta = open_store(lake_settings.metadata_url)
    yield meta
    meta.close()


@pytest.fixture(scope="session")
def lake_archiver(lake_settings: Settings, lake_spark: Any, lake_store: MetadataStore) -> Archiver:
    return Archiver(lake_settings, lake_spark, lake_store)
