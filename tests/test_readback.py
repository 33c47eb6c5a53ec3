"""Consumers read the whole history from the Iceberg table (issue 9): the intake is trimmed, the table serves.

A real broker (`lake_broker`), the real Spark archiver writing the JDBC-on-SQLite catalog, then every
client (confluent-kafka, kafka-python, aiokafka, kcat) consuming from offset 0 over TCP once the topic's
intake holds nothing of what they read: offsets, keys, values, headers and timestamps must be those
produced, byte for byte, for every codec.
"""

from __future__ import annotations

import uuid
from dataclasses import replace
from typing import Any

import pytest
from archive_fixtures import wait_for
from clients_util import CLIENTS, CODECS, ConfluentClient, Rec, comparable, create_topic, sample_records
from conftest import BrokerProcess

from icelog.meta.store import MetadataStore
from icelog.pipeline.archiver import Archiver

pytestmark = pytest.mark.slow

TRIM = {"icelog.intake.retention.ms": "0"}  # archived intake goes at once (once the broker sees the table)


def produce_codecs(broker: BrokerProcess, topic: str, per_codec: int, partitions: int) -> list[Rec]:
    """Records through confluent-kafka with every codec; returned with their offsets."""
    out: list[Rec] = []
    for i, codec in enumerate(CODECS):
        records = sample_records(per_codec, partitions, seed=100 + i)
        offsets = ConfluentClient().produce(broker.bootstrap, topic, records, codec=codec)
        out.extend(replace(r, offset=o) for r, o in zip(records, offsets, strict=True))
    return sorted(out, key=lambda r: (r.partition, r.offset))


def topic_id(store: MetadataStore, topic: str) -> uuid.UUID:
    record = store.get_topic(topic)
    assert record is not None
    return record.topic_id


def wait_trimmed(store: MetadataStore, topic: str, through: dict[int, int]) -> None:
    """Until the broker's retention moved each partition's intake start to at least `through[p]`."""
    tid = topic_id(store, topic)

    def starts() -> dict[int, int]:
        return {p.partition: p.log_start_offset for p in store.partitions(tid)}

    wait_for(lambda: all(starts()[p] >= n for p, n in through.items()), 60, starts)


def archive_and_trim(archiver: Archiver, store: MetadataStore, topic: str, expected: list[Rec]) -> None:
    results = archiver.run_pass(force=True, topics={topic})
    assert [r.error for r in results] == [""], results
    ends: dict[int, int] = {}
    for rec in expected:
        ends[rec.partition] = max(ends.get(rec.partition, 0), rec.offset + 1)
    wait_trimmed(store, topic, ends)


def read_back(client_name: str, broker: BrokerProcess, topic: str, partitions: list[int], count: int) -> list[Rec]:
    got = CLIENTS[client_name].consume(broker.bootstrap, topic, partitions, "earliest", count)
    return [replace(r, log_append_time=False) for r in got]


def test_every_client_reads_a_trimmed_topic_from_the_table(
    lake_broker: BrokerProcess, lake_archiver: Archiver, lake_store: MetadataStore
) -> None:
    topic = "rb-clients"
    create_topic(lake_broker.bootstrap, topic, partitions=2, configs=TRIM)
    expected = produce_codecs(lake_broker, topic, 30, 2)
    archive_and_trim(lake_archiver, lake_store, topic, expected)
    for name in CLIENTS:
        got = read_back(name, lake_broker, topic, [0, 1], len(expected))
        assert comparable(got) == comparable(expected), name
