"""The archiver keeps Spark's Python workers alive between bursts (lake/warm_workers.py).

Spark stops a Python worker idle for 60 s, and its replacement makes the next pass ~0.4 s slower (measured in
bench/upsert_bench.py). Here the archiver's clock is moved instead of waiting: after real passes of an append
and a compacted topic (both write their data files in RDD jobs), an idle pass 45 s later hands the workers of
that pool a task, and they are the same processes each time (reused, not replaced); once the archiver has been
idle for 10 minutes it runs no job.
"""

from __future__ import annotations

import os
from typing import Any

from confluent_kafka import Producer

from icelog.archive.archiver import Archiver
from icelog.config import Settings
from icelog.lake.warm_workers import KEEP_FOR_S, PING_EVERY_S, RDD
from icelog.meta.store import MetadataStore
from tests.support.archive import create_topic
from tests.support.broker import BrokerProcess


def test_idle_passes_keep_the_python_workers_alive_then_let_them_go(
    lake_broker: BrokerProcess, lake_settings: Settings, lake_spark: Any, lake_store: MetadataStore,
) -> None:
    now = [1000.0]
    archiver = Archiver(lake_settings, lake_spark, lake_store)
    archiver.python_workers.clock = lambda: now[0]
    topics = {"warm-append": {}, "warm-compacted": {"cleanup.policy": "compact"}}
    producer = Producer({"bootstrap.servers": lake_broker.bootstrap})
    for topic, configs in topics.items():
        create_topic(lake_broker, topic, 1, configs)
        for i in range(20):
            producer.produce(topic, key=f"k{i}".encode(), value=b"v")
    assert producer.flush(30) == 0
    results = archiver.run_pass(force=True, topics=set(topics))
    assert [r.records for r in results] == [20, 20], results

    now[0] += PING_EVERY_S - 1
    archiver.run_pass(topics=set())  # the service's poll, with nothing due
    assert archiver.python_workers.pids == {}  # not idle long enough

    now[0] += 2
    archiver.run_pass(topics=set())
    pinged = archiver.python_workers.pids
    assert set(pinged) == {RDD}, pinged  # appends and upserts alike write their files in RDD jobs
    for pids in pinged.values():
        assert len(pids) == archiver.task_slots
        for pid in pids:
            os.kill(pid, 0)  # a live worker process

    now[0] += PING_EVERY_S
    archiver.run_pass(topics=set())
    assert {kind: sorted(pids) for kind, pids in archiver.python_workers.pids.items()} == {
        kind: sorted(pids) for kind, pids in pinged.items()
    }  # the same workers: reused, not replaced

    now[0] += KEEP_FOR_S
    assert archiver.python_workers.poll() == {}  # idle for 10 minutes: the workers may go
