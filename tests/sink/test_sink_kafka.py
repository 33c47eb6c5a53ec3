"""`icelog sink` with Apache Kafka 4.1 itself as the source (tests/support/kafka_broker.py: one KRaft node per module).

The same guarantees as tests/sink/test_sink.py, whose source is a second icelog: plain, compacted and transactional
topics (read_committed: aborted records never reach a table), the source group committed only after the Iceberg
commit, a SASL_SSL (SCRAM-SHA-512) source, and Kafka restarted in the middle of a pass. The crash test of
test_sink.py runs here unchanged (imported: its `source` and `lake` are this module's).
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.archive.test_pk_tables import send
from tests.sink.test_sink import (  # noqa: F401 (collected here too, against Kafka)
    assert_tables_hold,
    second_pass_records,
    test_a_sink_killed_before_or_after_its_iceberg_commit_loses_and_repeats_nothing,
    transactional,
)
from tests.support.archive import create_topic, produce
from tests.support.kafka_broker import KafkaBroker
from tests.support.security import Pki, make_pki
from tests.support.sink import Lake, end_offsets, group_offsets, record_rows

pytestmark = [pytest.mark.spark, pytest.mark.java, pytest.mark.slow]

USER, PASSWORD = "sink-user", "sink-secret"


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("kafka-pki"))


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory, pki: Pki) -> Iterator[KafkaBroker]:
    kafka = KafkaBroker(tmp_path_factory.mktemp("kafka"), pki=pki, scram_users={USER: PASSWORD}).start()
    yield kafka
    kafka.stop()


@pytest.fixture
def lake(tmp_path: Path, source: KafkaBroker) -> Lake:
    return Lake(tmp_path, source)  # a Lake needs only the source's bootstrap


def test_a_sink_archives_plain_compacted_and_transactional_kafka_topics_exactly_once(
    lake: Lake, source: KafkaBroker
) -> None:
    """Two passes; the group's offsets on Kafka equal its end offsets once the tables hold the records (for the
    transactional topic the end offset is past the commit markers, which the sink steps over)."""
    create_topic(source, "orders", 3)
    create_topic(source, "users", 2, {"cleanup.policy": "compact"})
    create_topic(source, "payments", 2)
    orders = produce(source, "orders", 600)
    users = send(source, "users", [(f"u{i}".encode(), f"v0-{i}".encode()) for i in range(40)], partitions=2)
    payments = transactional(source, "payments", "one")

    for tag in ("one", "two"):
        if tag == "two":
            second_pass_records(source, orders, users, payments)
        done = lake.sink_once()
        assert done.returncode == 0, done.stdout + done.stderr[-3000:]
        assert_tables_hold(lake, orders, users, payments, tag)  # no aborted payment, nothing twice
        for topic, partitions in (("orders", 3), ("users", 2), ("payments", 2)):
            assert group_offsets(source, topic, partitions) == end_offsets(source, topic, partitions), (tag, topic)


def test_a_sink_reads_a_sasl_ssl_kafka_source(lake: Lake, source: KafkaBroker, pki: Pki) -> None:
    topic = "secured"
    lake.topics = [topic]
    lake.write_config(bootstrap_servers=source.sasl_ssl_bootstrap, client={
        "security.protocol": "SASL_SSL", "sasl.mechanism": "SCRAM-SHA-512", "sasl.username": USER,
        "sasl.password": PASSWORD, "ssl.ca.location": str(pki.ca_pem)})
    create_topic(source, topic, 2)
    produced = produce(source, topic, 200, partitions=2)
    done = lake.sink_once()
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    assert record_rows(lake.rows(topic)) == produced
    assert group_offsets(source, topic, 2) == end_offsets(source, topic, 2)

    lake.write_config(bootstrap_servers=source.sasl_ssl_bootstrap, client={
        "security.protocol": "SASL_SSL", "sasl.mechanism": "SCRAM-SHA-512", "sasl.username": USER,
        "sasl.password": "wrong", "ssl.ca.location": str(pki.ca_pem)})
    refused = lake.sink_once()
    assert refused.returncode != 0
    assert "Traceback" not in refused.stdout + refused.stderr, refused.stderr[-3000:]


def connected_to(pid: int, port: int) -> bool:
    """Whether process `pid` holds an established TCP connection to 127.0.0.1:`port` (its socket inodes in
    /proc/PID/fd matched against /proc/net/tcp)."""
    try:
        inodes = {os.readlink(f"/proc/{pid}/fd/{fd}")[8:-1] for fd in os.listdir(f"/proc/{pid}/fd")}
    except OSError:
        return False
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        cells = line.split()
        if cells[2].endswith(f":{port:04X}") and cells[3] == "01" and cells[9] in inodes:
            return True
    return False


def test_kafka_restarted_mid_pass_loses_and_repeats_nothing(lake: Lake, source: KafkaBroker) -> None:
    """Kafka is killed (SIGKILL) and started again while a pass runs: that pass may finish or fail, and the next
    one leaves each record in the table exactly once and the group at the end offsets."""
    topic = "restarted"
    lake.topics = [topic]
    lake.write_config()
    create_topic(source, topic, 3)
    produced = produce(source, topic, 3000, partitions=3)

    running = subprocess.Popen(lake.command("sink", "--once"), env=lake.environ(), stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not connected_to(running.pid, source.port):  # the pass is talking to Kafka: kill it now
        assert running.poll() is None, "the pass ended before it reached Kafka"
        assert time.monotonic() < deadline, "the pass never connected to Kafka"
        time.sleep(0.05)
    source.kill()
    time.sleep(1.0)
    source.start()
    first_out, first_err = running.communicate(timeout=300)
    print(f"the pass Kafka died under exited {running.returncode}: {first_out[-500:]} {first_err[-1500:]}")

    produced += produce(source, topic, 300, partitions=3, tag="after-")
    done = lake.sink_once()
    assert done.returncode == 0, f"first pass: {running.returncode}\n{first_err[-2000:]}\n" + done.stderr[-3000:]
    assert record_rows(lake.rows(topic)) == sorted(produced)
    assert group_offsets(source, topic, 3) == end_offsets(source, topic, 3)
