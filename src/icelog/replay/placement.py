"""Where a replayed record goes: Kafka's default partitioner, as the Java client places a key.

A key goes to `toPositive(murmur2(key)) % partitions` (`org.apache.kafka.clients.producer.internals.
BuiltInPartitioner.partitionForKey`, librdkafka's `murmur2_random`); records without a key go round-robin, counted
in replay order, so that a replay run again places every record where the first run did (what resuming counts on).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from kafka.partitioner.default import murmur2

if TYPE_CHECKING:
    import pyarrow as pa


def key_partition(key: bytes, partitions: int) -> int:
    """The partition the Java client's default partitioner gives `key` among `partitions`."""
    return (int(murmur2(key)) & 0x7FFFFFFF) % partitions


class Placement:
    """The destination partition of each record, in replay order (deterministic: the same order, the same places)."""

    def __init__(self, partitions: int) -> None:
        self.partitions = partitions
        self._unkeyed = 0

    def place(self, key: bytes | None) -> int:
        """The partition of the next record, whose key is `key`."""
        if key is not None:
            return key_partition(key, self.partitions)
        partition = self._unkeyed % self.partitions
        self._unkeyed += 1
        return partition

    def place_all(self, keys: pa.Array[Any]) -> list[int]:
        """The partitions of the next records, whose keys are `keys` (binary, null: no key): murmur2 once per
        distinct key."""
        import numpy as np
        import pyarrow.compute as pc

        encoded = pc.dictionary_encode(keys)
        distinct = np.array([key_partition(k, self.partitions) for k in encoded.dictionary.to_pylist()] or [0])
        unkeyed = pc.is_null(encoded.indices).to_numpy(zero_copy_only=False)
        out = distinct[pc.fill_null(encoded.indices, 0).to_numpy(zero_copy_only=False)]
        count = int(unkeyed.sum())
        out[unkeyed] = (self._unkeyed + np.arange(count)) % self.partitions
        self._unkeyed += count
        return [int(p) for p in out.tolist()]
