"""Go clients against icelog: franz-go and IBM/sarama (tests/go/*.go), from the module cache the set-up filled
(`go mod download` in scripts/setup.sh); built once per session with the module proxy off, so nothing is fetched
here. One process per client (franz-go's KIP-848 group: one more) runs all of its checks and prints what it saw.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.support.broker import BrokerProcess
from tests.support.clients_util import create_topic
from tests.support.metrics import scrape_text, value

SOURCES = Path(__file__).resolve().parent


@pytest.fixture(scope="session")
def go_clients(tmp_path_factory: pytest.TempPathFactory) -> Path:
    go = shutil.which("go")
    if go is None:
        pytest.fail("no `go` on the PATH: the Go client tests need Go (see docs/dependencies.md)", pytrace=False)
    binary = tmp_path_factory.mktemp("go") / "goclients"
    env = {**os.environ, "GOPROXY": "off", "GOFLAGS": "-mod=readonly -buildvcs=false"}
    done = subprocess.run([go, "build", "-o", str(binary), "."], cwd=SOURCES, env=env, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, f"go build failed (run `make setup` for the modules):\n{done.stderr}"
    return binary


def run(binary: Path, client: str, broker: BrokerProcess, prefix: str) -> dict[str, Any]:
    done = subprocess.run([str(binary), client, broker.bootstrap, prefix], capture_output=True, text=True,
                          timeout=300)
    answer: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    assert "error" not in answer, f"{answer['error']}\n{done.stderr[-3000:]}"
    return answer


def test_franz_go_produce_group_and_transactions(go_clients: Path, broker: BrokerProcess, topic_name: str) -> None:
    """franz-go: an idempotent acks=all zstd producer; a consumer group reads all, commits, and a later member
    resumes after the commit; a committed and an aborted transaction read with both isolation levels."""
    create_topic(broker.bootstrap, f"{topic_name}-franz", partitions=3)
    create_topic(broker.bootstrap, f"{topic_name}-franz-txn", partitions=1)
    answer = run(go_clients, "franz", broker, topic_name)
    assert answer["produced"] == 60
    assert answer["group_first"] == sorted(f"v{i}" for i in range(60))
    assert answer["group_second"] == ["late1", "late2"]
    assert answer["txn_read_committed"] == ["commit0", "commit1", "commit2"]
    assert answer["txn_read_uncommitted"] == ["commit0", "commit1", "commit2", "abort0", "abort1", "abort2"]


def test_sarama_produce_and_group(go_clients: Path, broker: BrokerProcess, topic_name: str) -> None:
    """IBM/sarama: an idempotent acks=all lz4 SyncProducer, then a consumer group member reads every record."""
    create_topic(broker.bootstrap, f"{topic_name}-sarama", partitions=3)
    answer = run(go_clients, "sarama", broker, topic_name)
    assert answer["produced"] == 30
    assert answer["group"] == sorted(f"v{i}" for i in range(30))


def test_franz_go_kip848_group_members_share_partitions(go_clients: Path, broker: BrokerProcess,
                                                        topic_name: str) -> None:
    """franz-go's KIP-848 opt-in (`ServerSideBalancer` with its sticky balancer, the broker's `uniform` assignor):
    two members settle on disjoint halves of 4 partitions and read every record produced after that between them,
    over ConsumerGroupHeartbeat and never JoinGroup (franz-go falls back to classic groups if it may not)."""
    create_topic(broker.bootstrap, f"{topic_name}-franz848", partitions=4)
    before = {api: requests(broker, api) for api in ("ConsumerGroupHeartbeat", "JoinGroup")}
    answer = run(go_clients, "franz848", broker, topic_name)
    first, second = answer["assignments"]
    assert sorted(first + second) == [0, 1, 2, 3] and len(first) == len(second) == 2
    assert answer["values"] == sorted(f"v{i}" for i in range(60))
    assert [sorted(read) for read in answer["read_partitions"]] == [first, second]
    assert requests(broker, "ConsumerGroupHeartbeat") > before["ConsumerGroupHeartbeat"]
    assert requests(broker, "JoinGroup") == before["JoinGroup"]


def requests(broker: BrokerProcess, api: str) -> float:
    """Requests of one API the broker has served (a worker's tests run one at a time on its broker)."""
    return value(scrape_text(broker.metrics_url), "icelog_requests_total", api=api)
