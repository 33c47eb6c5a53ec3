"""The metadata store interface: its records, and its methods cut into slices by the data they keep.

Every method is one atomic transaction in every backend. `MetadataStore` is every slice; a backend implements
it, a consumer depends on the slices it uses (TopicCatalog, IntakeIndex, ArchiveLedger, ConsumerOffsets,
TransactionLog, ProducerSnapshots, RegistryStore in meta/registry.py, SecurityStore in meta/security.py,
StoreConnection).
"""

from __future__ import annotations

import uuid
from abc import abstractmethod
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from icelog.meta.registry import RegistryStore
from icelog.meta.security import SecurityStore
from icelog.table.field_ids import TableColumn


@dataclass(frozen=True)
class TopicRecord:
    """A topic as stored: its stable id, partition count and explicitly set configs."""

    name: str
    topic_id: uuid.UUID
    partitions: int
    configs: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class PartitionRecord:
    """Where a partition stands: the first offset kept and the next offset to be written."""

    topic_id: uuid.UUID
    partition: int
    log_start_offset: int
    high_watermark: int
    intake_chunks: int = 0  # chunks indexed now (kept by the store as chunks are indexed and trimmed)
    intake_bytes: int = 0  # and their bytes
    # Archived topics read back from the table: the log start consumers see, moved by Kafka retention
    # (retention.ms / retention.bytes) over the table's files; never moves back. 0: not moved.
    retention_start_offset: int = 0


@dataclass(frozen=True)
class IntakeChunk:
    """A run of one partition's record batches, stored contiguously in one intake file."""

    topic_id: uuid.UUID
    partition: int
    base_offset: int
    end_offset: int  # exclusive: the offset after the last record
    file_id: int
    position: int  # of the batches (after the intake frame header)
    length: int
    max_timestamp: int
    # Wall-clock ms when the chunk was indexed (durable): the records' ingest time. -1 when unknown.
    ingest_timestamp: int = field(default=-1, compare=False)

    @property
    def record_count(self) -> int:
        return self.end_offset - self.base_offset


@dataclass(frozen=True)
class IntakeRangeSummary:
    """Aggregates of one partition's chunks from an offset on (computed by the store, no rows loaded)."""

    chunks: int = 0
    bytes: int = 0
    oldest_ingest_ms: int = -1  # ingest time of the oldest of them (max timestamp if unknown); -1 if none


@dataclass(frozen=True)
class ArchiveState:
    """How far one partition is archived into Iceberg, as last recorded by the archiver.

    The Iceberg table's snapshot summary is the truth; this copy drives retention and `icelog status`.
    """

    topic_id: uuid.UUID
    partition: int
    archived_offset: int = 0  # the next offset the table does not yet contain
    last_commit_ms: int = -1
    last_error: str = ""
    last_error_ms: int = -1
    dead_letters: int = 0  # batches of this partition in the table's dead-letter table (`<table>__dlq`)


@dataclass(frozen=True)
class BrokerLease:
    """One broker process of a cluster: its node id and the incarnation it registered with (a restart is a new
    one), which every lease it holds names."""

    node_id: int
    incarnation: str


@dataclass(frozen=True)
class BrokerRecord:
    """A registered broker as the store sees it: alive while its heartbeats are younger than the session
    timeout (measured by the store's clock, so brokers' clocks need not agree)."""

    node_id: int
    incarnation: str
    endpoints: dict[str, tuple[str, int]]  # listener name -> the advertised (host, port)
    rack: str | None
    alive: bool
    heartbeat_age_ms: int


@dataclass(frozen=True)
class Leadership:
    """Who leads a partition (or a coordinator shard): the holder's lease, None once released; the epoch moves
    with every new holder (the leader epoch clients see)."""

    holder: BrokerLease | None
    epoch: int


@dataclass(frozen=True)
class IntakeTail:
    """The end of the last intake frame the index covers; recovery rescans files from here."""

    file_id: int
    position: int


@dataclass(frozen=True)
class CommittedOffset:
    """A consumer group's committed position in one partition."""

    offset: int
    metadata: str = ""
    commit_timestamp: int = -1


GroupOffsets = dict[tuple[str, int], CommittedOffset]  # (topic name, partition) -> committed offset


@dataclass(frozen=True)
class TransactionRecord:
    """A transactional id's durable state: its producer, epoch and the transaction in progress.

    `state` is one of Empty, Ongoing, PrepareCommit, PrepareAbort, CompleteCommit, CompleteAbort.
    `groups` are the consumer groups AddOffsetsToTxn added (Kafka: their __consumer_offsets partitions): their
    TxnOffsetCommit offsets wait in the store (ConsumerOffsets.stage_txn_offsets) until the transaction ends.
    """

    transactional_id: str
    producer_id: int
    producer_epoch: int
    timeout_ms: int
    state: str
    partitions: tuple[tuple[str, int], ...] = ()
    groups: tuple[str, ...] = ()

    def admits_offsets(self, group_id: str, producer_id: int, producer_epoch: int) -> bool:
        """Whether a TxnOffsetCommit of this producer and epoch for the group belongs to the open transaction
        (Kafka's verification of the group's __consumer_offsets partition, KIP-890)."""
        return (self.producer_id, self.producer_epoch, self.state) == (producer_id, producer_epoch, "Ongoing") \
            and group_id in self.groups

    def completing(self, producer_id: int, producer_epoch: int, commit: bool) -> bool:
        """Whether this is the transaction a marker of (producer, epoch, result) ends: stored as Prepare* with that
        result, so a marker that is late (its transaction completed, another begun) or stale changes nothing."""
        state = "PrepareCommit" if commit else "PrepareAbort"
        return (self.producer_id, self.producer_epoch, self.state) == (producer_id, producer_epoch, state)


@dataclass(frozen=True)
class TxnOffsetStage:
    """What ConsumerOffsets.stage_txn_offsets did: `staged` (the offsets wait for the transaction's end), else why
    not: the transactional id's state as the stage read it (None: no such id), or `coordinated` False when the
    writer's lease no longer holds the group's coordinator shard (nothing was read or written)."""

    staged: bool
    transaction: TransactionRecord | None = None
    coordinated: bool = True


@dataclass(frozen=True)
class ProducerSnapshot:
    """A partition's producer and transaction state after every batch below `offset` (log/snapshots.py).

    `state` is an opaque encoding owned by the log layer; start-up replays only batches from `offset` on.
    """

    topic_id: uuid.UUID
    partition: int
    offset: int
    state: str


@dataclass(frozen=True)
class MaintenanceRecord:
    """The last maintenance round of one archive table ("namespace.table").

    `outcome`: ok | nothing-to-do | lost-race | failed; `summary` is a one-line account for `status`;
    `data_files_after` lets the scheduler count files added since (its small-file trigger);
    `orphans_checked_ms` is when orphan files were last looked for.
    """

    table: str
    finished_ms: int
    duration_ms: int
    outcome: str
    summary: str
    data_files_after: int
    orphans_checked_ms: int = -1


# -- the slices: each consumer depends on the one (or the few) it uses ---------------------------------
# Protocols, so a consumer or a test may pass any object with these methods; a backend subclasses
# MetadataStore (all of them), and the abstract methods make a missing one fail at construction.


@runtime_checkable
class TopicReader(Protocol):
    """Reading topics and where their partitions stand (what the archiver needs: a sink's source cluster
    answers it too, sink/source_store.py)."""

    @abstractmethod
    def get_topic(self, name: str) -> TopicRecord | None:
        """The topic by name, or None."""

    @abstractmethod
    def list_topics(self) -> list[TopicRecord]:
        """All topics, sorted by name."""

    @abstractmethod
    def partitions(self, topic_id: uuid.UUID) -> list[PartitionRecord]:
        """The partitions of a topic, ordered by partition number."""


@runtime_checkable
class TopicCatalog(TopicReader, Protocol):
    """Topics, their partitions (offsets and intake totals) and explicitly set configs."""

    @abstractmethod
    def create_topic(self, name: str, partitions: int, configs: Mapping[str, str]) -> TopicRecord:
        """Create a topic with empty partitions; TopicExistsError if the name is taken."""

    @abstractmethod
    def delete_topic(self, name: str) -> TopicRecord:
        """Remove a topic, its configs, partitions and intake index, and every group's committed and pending
        transactional offsets of it (Kafka deletes them with the topic); UnknownTopicError if absent."""

    @abstractmethod
    def add_partitions(self, name: str, total: int) -> TopicRecord:
        """Grow a topic to `total` partitions (must be more than it has)."""

    @abstractmethod
    def alter_topic_configs(
        self, name: str, set_configs: Mapping[str, str], delete_keys: Iterable[str] = ()
    ) -> TopicRecord:
        """Set and remove explicit topic configs in one step."""



class IntakeReader(Protocol):
    """Where the records of a partition past an offset lie (what the archiver plans from)."""

    @abstractmethod
    def intake_chunks_after(
        self, topic_id: uuid.UUID, partition: int, offset: int, limit: int
    ) -> list[IntakeChunk]:
        """At most `limit` chunks of one partition holding offsets at or past `offset`, in offset order.

        Its cost depends on `limit`, not on how many chunks are indexed (the archiver's poll uses it).
        """


@runtime_checkable
class IntakeIndex(IntakeReader, Protocol):
    """Where each partition's record batches lie in the intake files, the tail recovery rescans from, and
    the log starts that trims and Kafka retention move."""

    @abstractmethod
    def commit_intake(self, chunks: Iterable[IntakeChunk], tail: IntakeTail) -> None:
        """Index chunks that are durable on disk, advance high watermarks and record the tail.

        Idempotent: re-committing a chunk already indexed (same topic, partition, base offset) is a no-op,
        so recovery may replay frames the index already covers.
        """

    @abstractmethod
    def commit_sequenced(
        self, chunks: Iterable[IntakeChunk], tail: IntakeTail, leader: BrokerLease | None = None
    ) -> list[IntakeChunk]:
        """The sequencer: index one stored object's chunks, assigning offsets, and record the tail, in one
        transaction.

        Each chunk comes with offsets relative to itself (base 0, end = its record count), at most one per
        partition; it is given its partition's committed end (high watermark) as base offset, and the high
        watermark moves past it, so offsets are handed out once whatever crashes, and writers of one partition
        are put in one order. Returns the chunks as indexed (chunks of deleted partitions are left out).

        Idempotent per object: when the tail already names `tail.file_id` or a later object (a retry of a commit
        whose answer was lost), nothing changes and the object's indexed chunks are returned.

        With `leader` (a broker of a cluster), the tail is that node's own, and only chunks of partitions the
        lease leads are indexed: a broker that lost a partition to another cannot append to it (fencing).
        """

    @abstractmethod
    def intake_tail(self, node: int | None = None) -> IntakeTail | None:
        """The tail recorded by the last commit_intake, or None on a new store; `node`: that cluster node's own
        (commit_sequenced with a lease)."""

    @abstractmethod
    def intake_chunks(self, topic_id: uuid.UUID | None = None) -> list[IntakeChunk]:
        """Indexed chunks (of one topic, or all), ordered by topic, partition and offset."""


    @abstractmethod
    def intake_last_chunks(self, topic_id: uuid.UUID, partition: int, limit: int) -> list[IntakeChunk]:
        """The last `limit` chunks of one partition, in offset order; cost depends on `limit` only."""

    @abstractmethod
    def intake_chunks_by_time(
        self, topic_id: uuid.UUID, partition: int, offset: int, timestamp_ms: int, limit: int
    ) -> list[IntakeChunk]:
        """At most `limit` chunks holding offsets at or past `offset` with max_timestamp >= timestamp_ms,
        in offset order (ListOffsets by time)."""

    @abstractmethod
    def intake_max_timestamp_chunk(self, topic_id: uuid.UUID, partition: int) -> IntakeChunk | None:
        """Of one partition's chunks, the first (in offset order) with the largest max_timestamp, or None."""

    @abstractmethod
    def intake_range_summary(self, topic_id: uuid.UUID, partition: int, offset: int) -> IntakeRangeSummary:
        """Count, bytes and oldest ingest time of one partition's chunks holding offsets at or past `offset`.

        Its cost depends on how many chunks that is, not on how many are indexed below `offset`.
        """

    @abstractmethod
    def intake_bytes_below(self, topic_id: uuid.UUID, partition: int, offset: int) -> int:
        """Bytes of one partition's chunks wholly below `offset`; cost depends on how many chunks that is."""

    @abstractmethod
    def intake_files_in_use(self, file_ids: Iterable[int]) -> set[int]:
        """Which of these intake files some indexed chunk still references (an indexed look-up each)."""

    @abstractmethod
    def trim_intake(self, topic_id: uuid.UUID, partition: int, log_start_offset: int) -> None:
        """Move a partition's log start forward and drop chunks wholly below it; durable when it returns.

        Callers delete intake files only after this returns (a file must never be gone while indexed).
        """

    @abstractmethod
    def move_retention_start(self, topic_id: uuid.UUID, partition: int, offset: int) -> None:
        """Move the consumer-visible log start of an archived partition forward (never back); durable."""


@runtime_checkable
class ArchiveLedger(Protocol):
    """What the archiver records beside the Iceberg tables: progress and errors per partition, dead-letter
    counts, the tables' column records (field ids) and their last maintenance rounds."""

    @abstractmethod
    def archive_states(self, topic_id: uuid.UUID | None = None) -> list[ArchiveState]:
        """Recorded archive progress (of one topic, or all), ordered by topic and partition."""

    @abstractmethod
    def record_archive(
        self, topic_id: uuid.UUID, archived_offsets: Mapping[int, int], commit_ms: int
    ) -> None:
        """Record that the table holds each partition's offsets below archived_offsets[p]; clear errors.

        Offsets only move forward (a stale reconciliation never moves them back).
        """

    @abstractmethod
    def record_dead_letters(self, topic_id: uuid.UUID, counts: Mapping[int, int]) -> None:
        """Record how many batches of each partition the dead-letter table holds (absolute counts)."""

    @abstractmethod
    def record_archive_error(
        self, topic_id: uuid.UUID, partitions: Iterable[int], error: str, at_ms: int
    ) -> None:
        """Record why the last archive attempt of these partitions failed."""

    # -- archive table columns (field ids of tables with a Protobuf schema) ----------------------
    @abstractmethod
    def table_columns(self, table: str) -> list[TableColumn]:
        """The column records of an archive table ("namespace.table"), ordered by field id (empty if none)."""

    @abstractmethod
    def save_table_columns(self, table: str, columns: Iterable[TableColumn]) -> None:
        """Replace the column records of an archive table."""

    # -- table maintenance ---------------------------------------------------------------------------
    @abstractmethod
    def record_maintenance(self, record: MaintenanceRecord) -> None:
        """Keep the last maintenance round of a table (replaces the previous one)."""

    @abstractmethod
    def maintenance_records(self) -> dict[str, MaintenanceRecord]:
        """The last maintenance round of every table that had one, by table name."""


ShardFence = tuple[BrokerLease, tuple[uuid.UUID, int]]  # (the writer's lease, the coordinator shard it must hold)


@runtime_checkable
class ConsumerOffsets(Protocol):
    """Consumer groups' committed offsets (Kafka's `__consumer_offsets`)."""

    @abstractmethod
    def commit_offsets(self, group_id: str, offsets: GroupOffsets, fence: ShardFence | None = None) -> bool:
        """Store committed offsets of a group (replacing earlier commits of the same partitions). With `fence` (a
        cluster's group coordinator: its lease and the group's coordinator shard), only while that lease holds the
        shard: False, and nothing stored, once another broker may have taken the group over."""

    @abstractmethod
    def committed_offsets(self, group_id: str) -> GroupOffsets:
        """Every committed offset of a group (empty if none)."""

    @abstractmethod
    def offset_groups(self) -> list[str]:
        """Ids of the groups that have committed offsets, sorted."""

    @abstractmethod
    def delete_offsets(self, group_id: str, partitions: Iterable[tuple[str, int]] | None = None) -> None:
        """Drop committed offsets of some partitions of a group, or all of them (None)."""

    # -- transactional offsets (TxnOffsetCommit): pending until their transaction ends -------------------------
    @abstractmethod
    def stage_txn_offsets(
        self, transactional_id: str, group_id: str, producer_id: int, producer_epoch: int, offsets: GroupOffsets,
        fence: ShardFence | None = None,
    ) -> TxnOffsetStage:
        """Keep a TxnOffsetCommit's offsets pending for (group, producer id), in the same transaction as the check
        that the transactional id's stored transaction admits them (`TransactionRecord.admits_offsets`; read
        locked, so the coordinator's Prepare* waits for this write, which its markers then find). With `fence` (a
        cluster's group coordinator: its lease and the group's shard) only while that lease holds the shard."""

    @abstractmethod
    def pending_txn_offsets(self) -> dict[str, dict[tuple[str, int], int]]:
        """Every group's partitions with transactional offsets pending, each with the producer id they wait on."""

    @abstractmethod
    def complete_txn_offsets(
        self, producer_id: int, producer_epoch: int, commit: bool, groups: Callable[[str], bool],
        fence: ShardFence | None = None,
    ) -> dict[str, GroupOffsets] | None:
        """A transaction marker reached the groups `groups` picks (a coordinator shard's): the producer's pending
        offsets there whose transaction the store has in Prepare* for this epoch and result
        (`TransactionRecord.completing`) become committed offsets (commit) or are dropped (abort), in one
        transaction. Returns them by group (nothing: none pending, or a marker done before); None, nothing done,
        when `fence` (the group shard's lease) no longer holds the shard."""

    # -- KIP-848 consumer groups' state (Kafka's ConsumerGroup records of __consumer_offsets) ---------------------
    @abstractmethod
    def save_consumer_group_state(self, group_id: str, shard: int, state: str | None,
                                  fence: ShardFence | None = None) -> bool:
        """Keep a KIP-848 group's members, epochs and assignments (`state`, coordinator/consumer_state.py's JSON;
        None drops it), under its coordinator shard. With `fence` only while that lease holds the shard: False, and
        nothing stored, once another broker may have taken the group over."""

    @abstractmethod
    def consumer_group_states(self, shard: int | None = None) -> dict[str, str]:
        """The stored state of every KIP-848 group of a coordinator shard (None: of every shard), by group id."""


@runtime_checkable
class TransactionLog(Protocol):
    """The transaction coordinator's state: producer-id blocks and each transactional id's transaction."""

    @abstractmethod
    def allocate_producer_ids(self, count: int) -> int:
        """Reserve `count` never-used producer ids; return the first."""

    @abstractmethod
    def save_transaction(self, record: TransactionRecord, fence: ShardFence | None = None) -> bool:
        """Create or replace the state of one transactional id. With `fence` (a cluster's coordinator: its lease and
        the id's coordinator shard) only while that lease holds the shard, in the same transaction as the write:
        False, nothing written, once another broker took it (PostgreSQL only)."""

    @abstractmethod
    def transactions(self) -> list[TransactionRecord]:
        """The state of every transactional id, sorted by id."""

    @abstractmethod
    def transaction(self, transactional_id: str) -> TransactionRecord | None:
        """The state of one transactional id (None: never initialised)."""


@runtime_checkable
class ProducerSnapshots(Protocol):
    """Each partition's producer and transaction-index state at an offset, so start-up replays less."""

    @abstractmethod
    def save_producer_snapshots(self, snapshots: Iterable[ProducerSnapshot]) -> None:
        """Store partitions' producer-state snapshots (a snapshot never replaces a newer one)."""

    @abstractmethod
    def producer_snapshots(self) -> list[ProducerSnapshot]:
        """The latest snapshot of every partition that has one."""

    @abstractmethod
    def producer_snapshot(self, topic_id: uuid.UUID, partition: int) -> ProducerSnapshot | None:
        """One partition's latest snapshot, or None (a look-up by key: a broker taking a partition over)."""


@runtime_checkable
class ClusterMembership(Protocol):
    """Brokers sharing this store (issue 46): registration with heartbeats, and who leads each partition and each
    coordinator shard. Leases are taken only from a holder that released them or whose heartbeats stopped."""

    @abstractmethod
    def register_broker(self, lease: BrokerLease, endpoints: Mapping[str, tuple[str, int]], rack: str | None) -> None:
        """Register (or re-register: a restart replaces the node's earlier incarnation, whose leases lapse)."""

    @abstractmethod
    def heartbeat_broker(self, lease: BrokerLease) -> bool:
        """Keep the registration alive; False when another incarnation replaced it (this one must stop)."""

    @abstractmethod
    def deregister_broker(self, lease: BrokerLease) -> None:
        """Leave the cluster: the registration and every leadership it held are released."""

    @abstractmethod
    def brokers(self, session_timeout_ms: int) -> list[BrokerRecord]:
        """Every registered broker, by node id, alive or not by the store's clock."""

    @abstractmethod
    def leaderships(self) -> dict[tuple[uuid.UUID, int], Leadership]:
        """Who leads each partition (and coordinator shard) that was ever claimed."""

    @abstractmethod
    def claim_leaderships(
        self, lease: BrokerLease, keys: Iterable[tuple[uuid.UUID, int]], session_timeout_ms: int
    ) -> dict[tuple[uuid.UUID, int], int]:
        """Take the leadership of each key that is unheld, released, already this lease's, or held by a broker
        whose heartbeats stopped; the keys taken with their epochs (a new holder moves the epoch)."""

    @abstractmethod
    def release_leaderships(self, lease: BrokerLease, keys: Iterable[tuple[uuid.UUID, int]]) -> None:
        """Give up leaderships this lease holds (others may take them at once)."""


class HeldLock(Protocol):
    """A lock taken with ProcessLocks.try_lock, held until released (or its holder dies)."""

    @abstractmethod
    def release(self) -> None:
        """Let go (idempotent)."""


@runtime_checkable
class ProcessLocks(Protocol):
    """Locks among every process that uses this store, on any machine: one archiver, one maintenance round,
    an upsert table's writer and its compaction taking turns (archive/locks.py). A holder that dies lets go."""

    @abstractmethod
    def try_lock(self, name: str, shared: bool = False) -> HeldLock | None:
        """Take the lock `name` (exclusive, or shared with other shared holders) now; None if it is held."""


@runtime_checkable
class StoreConnection(Protocol):
    """An open store: whoever opened it, or was handed it to own, closes it."""

    @abstractmethod
    def close(self) -> None:
        """Release connections."""


@runtime_checkable
class MetadataStore(
    TopicCatalog, IntakeIndex, ArchiveLedger, ConsumerOffsets, TransactionLog, ProducerSnapshots, RegistryStore,
    SecurityStore, ProcessLocks, ClusterMembership, StoreConnection, Protocol,
):
    """Durable metadata shared by every layer: every slice above. Each method commits atomically or raises
    StoreError. A backend subclasses this class; a consumer takes the slice it uses.

    Writes a client is answered about (topics, producer-id blocks, committed offsets, transactions,
    registry writes, intake trims) are durable against power loss when the method returns.

    The schema registry's methods (`registry_*`) are declared in meta/registry.py, users' and ACLs' in
    meta/security.py. Declare no method here:
    a new one goes into the slice of the data it keeps (tests/meta/test_meta_slices.py checks).
    """
