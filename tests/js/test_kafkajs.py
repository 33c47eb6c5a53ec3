"""KafkaJS (2.2.4, Node.js) against icelog: an idempotent gzip producer, a committed and an aborted transaction, and
consumer groups (KafkaJS reads read_committed). `make setup` installs it into tests/js/node_modules (`npm ci`);
nothing is fetched here.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.support.broker import BrokerProcess
from tests.support.clients_util import create_topic

SOURCES = Path(__file__).resolve().parent


def test_kafkajs_produce_transactions_and_groups(broker: BrokerProcess, topic_name: str) -> None:
    node = shutil.which("node")
    if node is None or not (SOURCES / "node_modules" / "kafkajs").is_dir():
        pytest.fail("KafkaJS needs Node.js and `make setup` (npm ci in tests/js)", pytrace=False)
    create_topic(broker.bootstrap, f"{topic_name}-js", partitions=3)
    create_topic(broker.bootstrap, f"{topic_name}-js-txn", partitions=1)
    done = subprocess.run([node, str(SOURCES / "checks.js"), broker.bootstrap, topic_name], capture_output=True,
                          text=True, timeout=300, cwd=SOURCES)
    answer = json.loads(done.stdout.strip().splitlines()[-1])
    assert "error" not in answer, f"{answer['error']}\n{done.stderr[-3000:]}"
    assert answer["acked_batches"] >= 1
    assert answer["group"] == sorted(f"v{i}" for i in range(40))
    assert answer["txn_read_committed"] == ["commit0", "commit1", "commit2"]
