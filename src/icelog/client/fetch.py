"""What a Fetch answers for one partition, and which of its batches belong to the committed log.

Fetches go to the partition's leader through cluster.SourceCluster. icelog answers with the stored batches,
unchanged (wire/handlers/fetch.py), control batches and aborted transactions' batches included, as Kafka does; the
reader decides what to keep. With read_committed, the answer stops at the last stable offset and names the aborted
transactions it overlaps (producer id, first offset), which is what a consumer needs to drop their batches
(`CommittedFilter`, as Kafka's Java consumer does).
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import dataclass

FETCH_MAX_BYTES = 16 * 1024 * 1024  # per request; a batch larger than this still comes whole (Kafka's rule)
READ_UNCOMMITTED = 0
READ_COMMITTED = 1


@dataclass(frozen=True)
class Fetched:
    """What one Fetch answered for one partition."""

    records: bytes  # whole stored batches
    aborted: tuple[tuple[int, int], ...]  # read_committed: (producer id, first offset) of aborted transactions


class CommittedFilter:
    """Drops the batches of aborted transactions from a read_committed Fetch's answer, as Kafka's Java consumer
    does (CompletedFetch): an aborted transaction named by the answer (producer id, first offset) covers that
    producer's transactional batches from its first offset up to the producer's abort marker. One filter per
    Fetch answer: the next answer names again the transactions still open at its fetch offset."""

    def __init__(self, aborted: Sequence[tuple[int, int]]) -> None:
        self._upcoming = [(first, pid) for pid, first in aborted]
        heapq.heapify(self._upcoming)
        self._aborting: set[int] = set()

    def keeps(self, producer_id: int, last_offset: int, transactional: bool, control: bool) -> bool:
        """Whether a batch (in offset order) belongs to the committed log; control batches pass (markers)."""
        if producer_id < 0:
            return True
        while self._upcoming and self._upcoming[0][0] <= last_offset:
            self._aborting.add(heapq.heappop(self._upcoming)[1])
        if control:
            self._aborting.discard(producer_id)  # its marker ends the producer's transaction (commit or abort)
            return True
        return not (transactional and producer_id in self._aborting)

