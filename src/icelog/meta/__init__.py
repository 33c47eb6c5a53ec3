"""The metadata store: topics, partitions, configs, the intake index and the rest, behind one interface
(`MetadataStore`) cut into slices, one per kind of data, that consumers depend on."""

from icelog.meta.backends import open_store
from icelog.meta.registry import RegistryStore
from icelog.meta.store import (
    ArchiveLedger,
    ConsumerOffsets,
    IntakeChunk,
    IntakeIndex,
    IntakeTail,
    MetadataStore,
    PartitionRecord,
    ProducerSnapshots,
    StoreConnection,
    TopicCatalog,
    TopicRecord,
    TransactionLog,
)

__all__ = [
    "ArchiveLedger",
    "ConsumerOffsets",
    "IntakeChunk",
    "IntakeIndex",
    "IntakeTail",
    "MetadataStore",
    "PartitionRecord",
    "ProducerSnapshots",
    "RegistryStore",
    "StoreConnection",
    "TopicCatalog",
    "TopicRecord",
    "TransactionLog",
    "open_store",
]
