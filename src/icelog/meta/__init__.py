"""The metadata store: topics, partitions, configs and the intake index, behind one interface."""

from icelog.meta.backends import open_store
from icelog.meta.store import IntakeChunk, IntakeTail, MetadataStore, PartitionRecord, TopicRecord

__all__ = ["IntakeChunk", "IntakeTail", "MetadataStore", "PartitionRecord", "TopicRecord", "open_store"]
