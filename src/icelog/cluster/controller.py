"""A broker's part in a cluster (issue 46): registration and heartbeats in the metadata store, the topics other
brokers change, and its share of the leaderships (partitions and coordinator shards), taken and given up so that
every key ends on the broker rendezvous hashing names (cluster/view.py).

Every heartbeat interval the controller renews the registration (a broker replaced by a newer incarnation of its
node id stops), reads the live brokers, the topics and the leaderships, gives up what belongs elsewhere now (stops
serving it first, so nothing more of it is acknowledged here, then releases it in the store), and claims what is
its own and free (unheld, released, or held by a broker whose heartbeats stopped for the session timeout). A
partition taken is loaded from the store as it stands (high watermark, chunk index tail, producer and transaction
state from the snapshot and the chunks after it) before it is served; a coordinator shard is handed to the
coordinators, which load its groups and transactions. The store fences the rest: a commit of the intake indexes
only chunks of partitions its broker leads (meta/store.IntakeIndex.commit_sequenced), so a broker that lost a
partition while it was cut off acknowledges nothing more of it.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import uuid
from collections.abc import Callable, Mapping
from typing import Protocol

from icelog.cluster.view import COORDINATOR_SHARDS, GROUP_SHARDS_ID, TXN_SHARDS_ID, ClusterView, Key
from icelog.errors import log_retry
from icelog.log.manager import LogManager
from icelog.meta.store import BrokerLease, ClusterMembership, Leadership, TopicReader

log = logging.getLogger(__name__)

SHARD_IDS = (GROUP_SHARDS_ID, TXN_SHARDS_ID)


class ClusterStore(ClusterMembership, TopicReader, Protocol):
    """What the controller reads and writes: registrations, leaderships, the topic list."""


class ShardOwner(Protocol):
    """A coordinator that serves the groups (or transactional ids) of the shards this broker leads."""

    async def take_shard(self, shard: int) -> None:
        """Load the shard's state from the store and serve it."""

    def drop_shard(self, shard: int) -> None:
        """Stop serving the shard (another broker leads it now)."""


class ClusterController:
    """Keeps one broker's registration and its share of the leaderships current."""

    def __init__(
        self, store: ClusterStore, logs: LogManager, lease: BrokerLease, *, heartbeat_interval_ms: int,
        session_timeout_ms: int, endpoints: Callable[[], Mapping[str, tuple[str, int]]], rack: str | None,
        shard_owners: Mapping[uuid.UUID, ShardOwner], on_replaced: Callable[[str], None],
        on_topic_deleted: Callable[[str], None] = lambda name: None,
    ) -> None:
        self.store = store
        self.logs = logs
        self.lease = lease
        self.interval_s = heartbeat_interval_ms / 1000
        self.session_timeout_ms = session_timeout_ms
        self.endpoints = endpoints
        self.rack = rack
        self.shard_owners = shard_owners
        self.on_replaced = on_replaced
        self.on_topic_deleted = on_topic_deleted  # (the group coordinator forgets its offsets of the topic)
        self.view = ClusterView(lease)
        self._served_shards: set[Key] = set()
        self._stopped = False
        self._beat_thread = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="cluster-heartbeat")

    async def join(self) -> None:
        """Register and take this broker's share at once (before the listener serves)."""
        await asyncio.to_thread(self.store.register_broker, self.lease, dict(self.endpoints()), self.rack)
        log.info("joined the cluster as node %d (incarnation %s)", self.lease.node_id, self.lease.incarnation)
        await self.review()

    async def run(self) -> None:
        """Heartbeats and reviews, each on its own cadence: a review that takes long (partitions to load from the
        bucket on a busy machine) must not delay the heartbeat, or the others would take this broker for dead."""
        beats = asyncio.create_task(self._heartbeats())
        try:
            while not self._stopped:
                await asyncio.sleep(self.interval_s)
                try:
                    await self.review()
                except Exception as exc:
                    log_retry(log, "cluster review", exc)
        finally:
            beats.cancel()

    async def _heartbeats(self) -> None:
        loop = asyncio.get_running_loop()
        while not self._stopped:
            await asyncio.sleep(self.interval_s)
            try:
                # On a thread of its own: the default pool may be busy with Fetch reads and store calls.
                renewed = await loop.run_in_executor(self._beat_thread, self.store.heartbeat_broker, self.lease)
            except Exception as exc:
                log_retry(log, "cluster heartbeat", exc)
                continue
            if not renewed:
                self._replaced_now()
                return

    def _replaced_now(self) -> None:
        self._stopped = True
        for key in self._served():
            self._unserve(key)
        self.on_replaced(f"node {self.lease.node_id} was registered again by another broker process (the same "
                         "node_id twice, or this broker was cut off longer than broker_session_timeout_ms)")

    async def leave(self) -> None:
        """A clean stop: serve nothing more, then release everything at once (the others take it at their next
        heartbeat rather than after the session timeout)."""
        self._stopped = True
        for key in self._served():
            self._unserve(key)
        try:
            await asyncio.to_thread(self.store.deregister_broker, self.lease)
        except Exception as exc:
            log_retry(log, "leaving the cluster", exc)
        self._beat_thread.shutdown(wait=False)

    # -- one review ------------------------------------------------------------------------------
    async def review(self) -> None:
        """One review: look, give up what belongs elsewhere, take what is ours."""
        brokers = await asyncio.to_thread(self.store.brokers, self.session_timeout_ms)
        records = await asyncio.to_thread(self.store.list_topics)
        for name in self.logs.sync_topics(records):
            self.on_topic_deleted(name)
        leaders = await asyncio.to_thread(self.store.leaderships)
        view = ClusterView(self.lease, tuple(b for b in brokers if b.alive), leaders)
        self.view = view
        keys = self._keys()
        mine = {k for k, held in leaders.items() if held.holder == self.lease}
        served = self._served()
        for key in served - mine:  # taken by another broker while this one was cut off
            log.warning("lost the leadership of %s to node %s", _name(key), leaders[key].holder
                        if key in leaders else None)
            self._unserve(key)
        want = {k for k in keys if view.target(k) == self.lease.node_id}
        give_up = (mine & keys) - want
        for key in give_up:
            self._unserve(key)
        if give_up:
            await asyncio.to_thread(self.store.release_leaderships, self.lease, sorted(give_up, key=str))
        claim = want - self._served()
        granted = (await asyncio.to_thread(self.store.claim_leaderships, self.lease, sorted(claim, key=str),
                                           self.session_timeout_ms)) if claim else {}
        for key in sorted(granted, key=str):
            await self._serve(key, granted[key])
        if give_up or granted:
            leaders = dict(leaders)
            for key in give_up:
                leaders[key] = Leadership(None, leaders[key].epoch)
            for key, epoch in granted.items():
                leaders[key] = Leadership(self.lease, epoch)
            self.view = ClusterView(self.lease, view.brokers, leaders)
            log.info("node %d leads %d partition(s) and coordinator shard(s) now (took %d, gave up %d)",
                     self.lease.node_id, len(self._served()), len(granted), len(give_up))

    def _keys(self) -> set[Key]:
        keys = {(part.topic_id, part.partition) for part in self.logs.catalog.partitions()}
        keys.update((shard_id, shard) for shard_id in self.shard_owners for shard in range(COORDINATOR_SHARDS))
        return keys

    def _served(self) -> set[Key]:
        served = {(p.topic_id, p.partition) for p in self.logs.catalog.partitions() if p.led}
        return served | self._served_shards

    async def _serve(self, key: Key, epoch: int) -> None:
        owner = self.shard_owners.get(key[0])
        if owner is not None:
            await owner.take_shard(key[1])
            self._served_shards.add(key)
            return
        fresh = await asyncio.to_thread(self.logs.take_partition, *key)
        if fresh is not None:
            fresh.leader_epoch = epoch  # what Metadata names, and what Fetch and ListOffsets fence
            self.logs.serve(fresh)

    def _unserve(self, key: Key) -> None:
        owner = self.shard_owners.get(key[0])
        if owner is not None:
            owner.drop_shard(key[1])
            self._served_shards.discard(key)
        else:
            self.logs.unserve(*key)


def _name(key: Key) -> str:
    kind = {GROUP_SHARDS_ID: "group shard", TXN_SHARDS_ID: "transaction shard"}.get(key[0])
    return f"{kind} {key[1]}" if kind else f"partition {key[1]} of topic {key[0]}"

