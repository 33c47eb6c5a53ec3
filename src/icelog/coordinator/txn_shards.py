"""The coordinator shards of transactional ids a broker of a cluster serves (issue 46): an id belongs to shard
abs(hashCode(id)) % 50, as in Kafka's __transaction_state, and the broker leading a shard (cluster/controller.py)
coordinates its ids. Taking a shard loads their state from the store and finishes in the background what the
previous coordinator left in Prepare*; dropping it forgets them (the new coordinator has them in the store)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from icelog.cluster.view import ClusterView, coordinator_shard
from icelog.coordinator.transactions import RemoteMarkers, TransactionCoordinator, TxnState, meta_of
from icelog.meta.store import BrokerLease

log = logging.getLogger(__name__)


class TxnShards:
    """(cluster.controller.ShardOwner) Makes `coordinator` serve only the shards handed to it: markers to partitions
    other brokers lead go by `remote`, the leaders found in `view`; with `lease`, every state it writes is fenced
    by the lease holding the id's shard (store.save_transaction)."""

    def __init__(self, coordinator: TransactionCoordinator, view: Callable[[], ClusterView | None],
                 remote: RemoteMarkers, lease: BrokerLease | None = None) -> None:
        self.coordinator = coordinator
        coordinator.shards = set()
        coordinator.cluster_view, coordinator.remote_markers, coordinator.shard_lease = view, remote, lease

    async def take_shard(self, shard: int) -> None:
        """Serve the transactional ids of a shard: their state from the store, and what their previous coordinator
        left in Prepare* finished in the background (its EndTxn retries wait on the lock, then see it done)."""
        txns = self.coordinator
        assert txns.shards is not None
        records = await asyncio.to_thread(txns.store.transactions)
        now = time.monotonic()
        taken = []
        for rec in records:
            if coordinator_shard(rec.transactional_id) == shard:
                self._forget(rec.transactional_id)
                meta = meta_of(rec, now)
                txns.txns[rec.transactional_id] = txns.by_pid[rec.producer_id] = meta
                taken.append(meta)
        txns.shards.add(shard)
        for meta in taken:
            if meta.state in (TxnState.PREPARE_COMMIT, TxnState.PREPARE_ABORT):
                await meta.lock.acquire()  # (free: the meta is new)
                txns.spawn(txns.finish(meta))
        if taken:
            log.info("coordinating %d transactional id(s) of shard %d", len(taken), shard)

    def drop_shard(self, shard: int) -> None:
        """Another broker coordinates the shard now: its ids are forgotten (a completion in flight stops at its
        next step, and the new coordinator finishes it from the store)."""
        txns = self.coordinator
        if txns.shards is None:
            return
        txns.shards.discard(shard)
        for transactional_id in [t for t in txns.txns if coordinator_shard(t) == shard]:
            self._forget(transactional_id)

    def _forget(self, transactional_id: str) -> None:
        txns = self.coordinator
        meta = txns.txns.pop(transactional_id, None)
        if meta is not None:
            for pid in [p for p, m in txns.by_pid.items() if m is meta]:
                del txns.by_pid[pid]
