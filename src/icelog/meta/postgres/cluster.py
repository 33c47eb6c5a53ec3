"""The ClusterMembership slice on PostgreSQL: brokers' registrations and heartbeats, and the leaderships of
partitions and coordinator shards (issue 46). Ages are measured by the database's clock, so the brokers' clocks
need not agree; a claim and a release are each one transaction that locks the rows it reads."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterable, Mapping

from icelog.meta.postgres.database import Connection, PostgresDatabase
from icelog.meta.store import BrokerLease, BrokerRecord, ClusterMembership, Leadership

_AGE_MS = "(EXTRACT(EPOCH FROM (clock_timestamp() - heartbeat_at)) * 1000)::bigint"


class PostgresCluster(ClusterMembership):
    """ClusterMembership over the store's PostgresDatabase."""

    _db: PostgresDatabase

    def register_broker(self, lease: BrokerLease, endpoints: Mapping[str, tuple[str, int]], rack: str | None) -> None:
        text = json.dumps({name: [host, port] for name, (host, port) in endpoints.items()})
        self._db.statement(
            "INSERT INTO brokers VALUES (%s, %s, %s, %s, clock_timestamp()) ON CONFLICT (node_id) DO UPDATE SET "
            "incarnation = excluded.incarnation, endpoints = excluded.endpoints, rack = excluded.rack, "
            "heartbeat_at = excluded.heartbeat_at",
            (lease.node_id, lease.incarnation, text, rack),
        )

    def heartbeat_broker(self, lease: BrokerLease) -> bool:
        return self._db.statement(
            "UPDATE brokers SET heartbeat_at = clock_timestamp() WHERE node_id = %s AND incarnation = %s",
            (lease.node_id, lease.incarnation),
        ) > 0

    def deregister_broker(self, lease: BrokerLease) -> None:
        def work(conn: Connection) -> None:
            conn.execute("UPDATE leaderships SET node_id = NULL, incarnation = NULL "
                         "WHERE node_id = %s AND incarnation = %s", (lease.node_id, lease.incarnation))
            conn.execute("DELETE FROM brokers WHERE node_id = %s AND incarnation = %s",
                         (lease.node_id, lease.incarnation))

        self._db.run(work, idempotent=True)

    def brokers(self, session_timeout_ms: int) -> list[BrokerRecord]:
        rows = self._db.rows(f"SELECT node_id, incarnation, endpoints, rack, {_AGE_MS} FROM brokers ORDER BY node_id")
        return [BrokerRecord(node, inc, {k: (h, int(p)) for k, (h, p) in json.loads(endpoints).items()}, rack,
                             age < session_timeout_ms, int(age)) for node, inc, endpoints, rack, age in rows]

    def leaderships(self) -> dict[tuple[uuid.UUID, int], Leadership]:
        rows = self._db.rows("SELECT topic_id, partition, node_id, incarnation, epoch FROM leaderships")
        return {(t, p): Leadership(BrokerLease(n, i) if n is not None else None, e) for t, p, n, i, e in rows}

    def claim_leaderships(
        self, lease: BrokerLease, keys: Iterable[tuple[uuid.UUID, int]], session_timeout_ms: int
    ) -> dict[tuple[uuid.UUID, int], int]:
        keys = list(keys)
        if not keys:
            return {}

        def work(conn: Connection) -> dict[tuple[uuid.UUID, int], int]:
            # The claimant must itself be registered and alive: a broker whose own heartbeats lapsed takes nothing.
            alive = conn.execute(f"SELECT {_AGE_MS} < %s FROM brokers WHERE node_id = %s AND incarnation = %s",
                                 (session_timeout_ms, lease.node_id, lease.incarnation)).fetchone()
            if not alive or not alive[0]:
                return {}
            conn.execute(
                "INSERT INTO leaderships (topic_id, partition, node_id, incarnation, epoch) "
                "SELECT t, p, NULL, NULL, 0 FROM unnest(%s::uuid[], %s::int[]) AS k(t, p) ON CONFLICT DO NOTHING",
                ([k[0] for k in keys], [k[1] for k in keys]))
            rows = conn.execute(
                f"UPDATE leaderships l SET node_id = %(n)s, incarnation = %(i)s, "
                "epoch = CASE WHEN l.incarnation IS NOT DISTINCT FROM %(i)s THEN l.epoch ELSE l.epoch + 1 END "
                "FROM unnest(%(t)s::uuid[], %(p)s::int[]) AS k(t, p) "
                "WHERE l.topic_id = k.t AND l.partition = k.p AND (l.node_id IS NULL OR l.incarnation = %(i)s "
                f"OR NOT EXISTS (SELECT 1 FROM brokers b WHERE b.node_id = l.node_id AND b.incarnation = "
                f"l.incarnation AND {_AGE_MS.replace('heartbeat_at', 'b.heartbeat_at')} < %(timeout)s)) "
                "RETURNING l.topic_id, l.partition, l.epoch",
                {"n": lease.node_id, "i": lease.incarnation, "t": [k[0] for k in keys], "p": [k[1] for k in keys],
                 "timeout": session_timeout_ms}).fetchall()
            return {(t, p): e for t, p, e in rows}

        return self._db.run(work, idempotent=False)

    def release_leaderships(self, lease: BrokerLease, keys: Iterable[tuple[uuid.UUID, int]]) -> None:
        keys = list(keys)
        if keys:
            self._db.statement(
                "UPDATE leaderships l SET node_id = NULL, incarnation = NULL FROM unnest(%s::uuid[], %s::int[]) "
                "AS k(t, p) WHERE l.topic_id = k.t AND l.partition = k.p AND l.node_id = %s AND l.incarnation = %s",
                ([k[0] for k in keys], [k[1] for k in keys], lease.node_id, lease.incarnation))
