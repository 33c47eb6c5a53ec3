"""An unreachable Spark master: one line naming it, no Java stack trace, retried with backoff, shown by `icelog status`.

No JVM starts in the master's test: the master is checked with a TCP connection before Spark is (lake/spark.py
check_master). An unreachable broker, and a JVM that exits as it starts, are one line too.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from tests.support.archive import ARCHIVE_ENV, create_topic, produce
from tests.support.broker import BrokerProcess, free_port


def test_an_unreachable_master_is_one_line_retried_and_shown_by_status(broker: BrokerProcess, topic_name: str) -> None:
    create_topic(broker, topic_name, partitions=1)
    produce(broker, topic_name, 10, partitions=1)
    master = f"spark://127.0.0.1:{free_port()}"
    env = {**os.environ, **ARCHIVE_ENV, "ICELOG_ARCHIVE__SPARK_MASTER": master,
           "ICELOG_ARCHIVE__RETRY_BACKOFF_MAX_MS": "1000"}
    archive = [sys.executable, "-m", "icelog", "archive", "--data-dir", str(broker.data_dir)]

    once = subprocess.run([*archive, "--once", "--topic", topic_name], env=env, capture_output=True, text=True,
                          timeout=120)
    assert once.returncode == 2
    expected = f"cannot reach the Spark master at {master}: Connection refused"
    assert once.stderr.strip().splitlines()[-1] == f"icelog: {expected}"
    assert "Traceback" not in once.stderr and "at org.apache" not in once.stderr

    status = subprocess.run([sys.executable, "-m", "icelog", "status", "--data-dir", str(broker.data_dir)],
                            env=env, capture_output=True, text=True, timeout=60)
    line = next(x for x in status.stdout.splitlines() if x.startswith(topic_name))
    assert "SparkMasterUnreachableError: cannot reach the Spark master" in line, status.stdout

    service = subprocess.Popen(archive, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert service.stdout is not None
    lines: list[str] = []
    deadline = time.monotonic() + 90
    while sum("archive pass failed (retry in" in x for x in lines) < 3 and time.monotonic() < deadline:
        line = service.stdout.readline()
        if not line:
            break
        lines.append(line.rstrip("\n"))
    service.send_signal(signal.SIGTERM)
    out = "\n".join(lines) + service.communicate(timeout=60)[0]
    failures = [x for x in out.splitlines() if "archive pass failed (retry in" in x]
    assert len(failures) >= 3, out  # retried, with backoff (1 s, then the 1 s cap here)
    assert all(x.endswith(expected) for x in failures), out
    assert "Traceback" not in out and "at org.apache" not in out, out


@pytest.mark.spark
def test_an_unreachable_broker_is_one_line_without_a_java_stack_trace(broker: BrokerProcess, topic_name: str) -> None:
    """Archive tasks that would read over Kafka from a broker nobody answers at: the driver's check names it."""
    create_topic(broker, topic_name, partitions=1)
    produce(broker, topic_name, 10, partitions=1)
    address = f"127.0.0.1:{free_port()}"
    env = {**os.environ, **ARCHIVE_ENV, "ICELOG_ARCHIVE__READ_VIA": "kafka",
           "ICELOG_ARCHIVE__BOOTSTRAP_SERVERS": address}
    once = subprocess.run([sys.executable, "-m", "icelog", "archive", "--once", "--topic", topic_name, "--data-dir",
                           str(broker.data_dir)], env=env, capture_output=True, text=True, timeout=300)
    assert once.returncode == 1, once.stdout + once.stderr
    assert f"{topic_name}: failed: BrokerUnreachableError: cannot reach the broker at {address}: Connection refused" \
        in once.stdout, once.stdout + once.stderr[-3000:]
    assert "Traceback" not in once.stderr and "at org.apache" not in once.stderr, once.stderr[-3000:]


@pytest.mark.spark
def test_a_jvm_that_does_not_start_is_one_line(broker: BrokerProcess, topic_name: str) -> None:
    """A JVM option Java refuses in archive.spark_conf (Spark ignores unknown -XX names, not bad values): Java's own
    message, then icelog's line; no Python traceback."""
    create_topic(broker, topic_name, partitions=1)
    produce(broker, topic_name, 3, partitions=1)
    env = {**os.environ, **ARCHIVE_ENV,
           "ICELOG_ARCHIVE__SPARK_CONF": '{"spark.driver.extraJavaOptions": "-XX:ThreadStackSize=lots"}'}
    once = subprocess.run([sys.executable, "-m", "icelog", "archive", "--data-dir", str(broker.data_dir), "--once",
                           "--topic", topic_name], env=env, capture_output=True, text=True, timeout=120)
    assert once.returncode == 2, once.stderr
    assert "Improperly specified VM option 'ThreadStackSize=lots'" in once.stderr  # Java's own
    assert once.stderr.strip().splitlines()[-1].startswith("icelog: Spark's JVM (")
    assert "check JAVA_HOME and the JVM options in archive.spark_conf" in once.stderr
    assert "Traceback" not in once.stderr
