"""`icelog replay`'s steps: the table pinned, the destination topic made ready, the marker read, the records produced.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from icelog.config import Settings
from icelog.errors import IcelogError
from icelog.lake.catalog import pyiceberg_catalog_opener
from icelog.replay.producer import (
    DEFAULT_TRANSACTION_RECORDS,
    TIMEOUT_S,
    ClientErrors,
    Outcome,
    Replay,
    ReplayError,
    client_config,
    read_marker,
    replay_group,
    wait_for_topic,
)
from icelog.replay.source import TableAt, open_table, pin

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ReplayRequest:
    """What `icelog replay` was asked."""

    table: str
    topic: str
    partitions: int | None = None
    snapshot_id: int | None = None
    as_of_ms: int | None = None
    bootstrap: str = "localhost:9092"
    client_properties: Mapping[str, str] | None = None
    transaction_records: int = DEFAULT_TRANSACTION_RECORDS
    topic_configs: Mapping[str, str] | None = None  # the topic's configs if it is created

    def __post_init__(self) -> None:
        if self.snapshot_id is not None and self.as_of_ms is not None:
            raise ReplayError("--snapshot and --as-of name the same thing: pass one of them")
        if self.partitions is not None and self.partitions < 1:
            raise ReplayError(f"--partitions {self.partitions}: a topic needs at least 1 partition")


def replay(settings: Settings, request: ReplayRequest, say: Callable[[str], None] = print) -> Outcome:
    """Replay `request.table` into `request.topic`, resuming what an interrupted run of it committed."""
    from confluent_kafka import Consumer

    opener = pyiceberg_catalog_opener(settings)
    catalog = None if opener is None else opener()
    if catalog is None:
        raise IcelogError(f"no Iceberg catalog to read {request.table} from ({settings.archive.catalog_type} at "
                          f"{settings.catalog_uri}); pass the broker's --data-dir or --config")
    table = open_table(catalog, request.table)
    source = pin(request.table, table, request.snapshot_id, request.as_of_ms)
    errors = ClientErrors()
    client = client_config(request.bootstrap, request.client_properties or {}, errors)
    partitions = _destination(client, request, source, errors)
    consumer = Consumer({**client, "group.id": replay_group(request.topic), "enable.auto.commit": False})
    try:
        wait_for_topic(consumer, request.topic, partitions)
        marker = read_marker(consumer, request.topic, partitions)
        asked = request.snapshot_id is not None or request.as_of_ms is not None
        if marker is not None:
            fix = (f"replay into another topic, or delete the progress with `kafka-consumer-groups --delete "
                   f"--group {replay_group(request.topic)}` to replay into {request.topic} again")
            if marker.table != request.table:
                raise ReplayError(f"topic {request.topic} holds a replay of table {marker.table}; {fix}")
            if marker.partitions != partitions:
                raise ReplayError(f"topic {request.topic} has {partitions} partitions, the replay begun into it "
                                  f"placed its keys among {marker.partitions}; {fix}")
            if marker.snapshot_id != source.snapshot_id:
                if asked or marker.done:
                    state = "holds" if marker.done else "holds part of"
                    raise ReplayError(f"topic {request.topic} {state} a replay of {request.table} at snapshot "
                                      f"{marker.snapshot_id}, not {source.snapshot_id}; rerun with --snapshot "
                                      f"{marker.snapshot_id} to finish it, or {fix}")
                source = pin(request.table, table, marker.snapshot_id, None)  # resume the snapshot begun with
            if marker.done:
                return Outcome(sum(marker.counts.values()), 0, marker.snapshot_id, partitions, already_done=True)
            say(f"resuming the replay of {request.table} at snapshot {source.snapshot_id}: "
                f"{sum(marker.counts.values())} records already in {request.topic}")
        return Replay(source, request.topic, partitions, client, request.transaction_records, say).run(
            marker, consumer)
    finally:
        consumer.close()


def _destination(client: dict[str, Any], request: ReplayRequest, source: TableAt, errors: ClientErrors) -> int:
    """The destination topic's partition count: created with the partitions asked (default: the source's), or an
    existing one's, which must be the partitions asked."""
    from confluent_kafka import KafkaError, KafkaException
    from confluent_kafka.admin import AdminClient
    from confluent_kafka.cimpl import NewTopic

    admin = AdminClient(client)
    deadline = time.monotonic() + TIMEOUT_S
    while True:
        try:
            # (All topics: a Metadata request naming the topic would have a broker auto-create it.)
            meta = admin.list_topics(timeout=1.0).topics.get(request.topic)
            break
        except KafkaException:
            admin.poll(0)  # (error_cb is served by poll)
            if errors.login_failed():  # no use waiting: the settings are wrong
                raise ReplayError(f"cannot log in to {request.bootstrap}: {errors.last()}; check the security "
                                  "settings (--client-property, archive.client_properties)") from None
            if time.monotonic() > deadline:
                raise ReplayError(f"no broker answers at {request.bootstrap} ({errors.last()}); pass --bootstrap "
                                  "and the broker's security settings (--client-property)") from None
    if meta is not None and meta.error is None:
        existing = len(meta.partitions)
        if request.partitions is not None and request.partitions != existing:
            raise ReplayError(
                f"topic {request.topic} exists with {existing} partitions, not the {request.partitions} asked: "
                f"drop --partitions to replay into its {existing}, delete the topic first, or replay into a new "
                "topic")
        return existing
    partitions = request.partitions or source.partitions
    try:
        new = NewTopic(request.topic, partitions, config=dict(request.topic_configs or {}))
        admin.create_topics([new])[request.topic].result(TIMEOUT_S)
    except KafkaException as exc:
        error = exc.args[0]
        if not (isinstance(error, KafkaError) and error.code() == KafkaError.TOPIC_ALREADY_EXISTS):
            raise ReplayError(f"creating topic {request.topic} failed: {error}") from None
        return _destination(client, request, source, errors)  # created meanwhile: take it as it is
    log.info("created topic %s with %d partitions", request.topic, partitions)
    return partitions
