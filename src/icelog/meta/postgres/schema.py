"""The PostgreSQL store's schema and its versions: created in a new database, upgraded in an older one, refused in
a newer one.

`schema_version` holds the version a database is at. MIGRATIONS[v] takes it from v-1 to v; each opener runs the
missing steps in one transaction under an advisory lock, so a broker, its archiver and the CLI may start at once.
"""

from __future__ import annotations

import logging
from importlib.metadata import PackageNotFoundError, version
from typing import Any

import psycopg

from icelog.errors import StoreError

log = logging.getLogger(__name__)

Connection = psycopg.Connection[tuple[Any, ...]]

# Text keys compare byte by byte (COLLATE "C"), as SQLite does, so "sorted by name" is the same order on both
# backends whatever the database's locale.
_CORE_TABLES = (
    """CREATE TABLE schema_version (
        id SMALLINT PRIMARY KEY CHECK (id = 0),
        version INTEGER NOT NULL
    )""",
    """CREATE TABLE topics (
        name TEXT COLLATE "C" PRIMARY KEY,
        topic_id UUID NOT NULL UNIQUE,
        partitions INTEGER NOT NULL
    )""",
    """CREATE TABLE topic_configs (
        topic_id UUID NOT NULL,
        key TEXT COLLATE "C" NOT NULL,
        value TEXT NOT NULL,
        PRIMARY KEY (topic_id, key)
    )""",
    """CREATE TABLE partitions (
        topic_id UUID NOT NULL,
        partition INTEGER NOT NULL,
        log_start_offset BIGINT NOT NULL DEFAULT 0,
        high_watermark BIGINT NOT NULL DEFAULT 0,
        intake_chunks BIGINT NOT NULL DEFAULT 0,
        intake_bytes BIGINT NOT NULL DEFAULT 0,
        retention_start_offset BIGINT NOT NULL DEFAULT 0,
        PRIMARY KEY (topic_id, partition)
    )""",
    """CREATE TABLE intake_chunks (
        topic_id UUID NOT NULL,
        partition INTEGER NOT NULL,
        base_offset BIGINT NOT NULL,
        end_offset BIGINT NOT NULL,
        file_id BIGINT NOT NULL,
        position BIGINT NOT NULL,
        length BIGINT NOT NULL,
        max_timestamp BIGINT NOT NULL,
        ingest_timestamp BIGINT NOT NULL DEFAULT -1,
        PRIMARY KEY (topic_id, partition, base_offset)
    )""",
    "CREATE INDEX intake_chunks_by_file ON intake_chunks (file_id)",
    """CREATE TABLE archive_state (
        topic_id UUID NOT NULL,
        partition INTEGER NOT NULL,
        archived_offset BIGINT NOT NULL DEFAULT 0,
        last_commit_ms BIGINT NOT NULL DEFAULT -1,
        last_error TEXT NOT NULL DEFAULT '',
        last_error_ms BIGINT NOT NULL DEFAULT -1,
        dead_letters BIGINT NOT NULL DEFAULT 0,
        PRIMARY KEY (topic_id, partition)
    )""",
    """CREATE TABLE intake_tail (
        id SMALLINT PRIMARY KEY CHECK (id = 0),
        file_id BIGINT NOT NULL,
        position BIGINT NOT NULL
    )""",
    """CREATE TABLE group_offsets (
        group_id TEXT COLLATE "C" NOT NULL,
        topic TEXT COLLATE "C" NOT NULL,
        partition INTEGER NOT NULL,
        committed_offset BIGINT NOT NULL,
        metadata TEXT NOT NULL,
        commit_timestamp BIGINT NOT NULL,
        PRIMARY KEY (group_id, topic, partition)
    )""",
    """CREATE TABLE producer_ids (
        id SMALLINT PRIMARY KEY CHECK (id = 0),
        next_producer_id BIGINT NOT NULL
    )""",
    "INSERT INTO producer_ids VALUES (0, 0)",
    """CREATE TABLE transactions (
        transactional_id TEXT COLLATE "C" PRIMARY KEY,
        producer_id BIGINT NOT NULL,
        producer_epoch INTEGER NOT NULL,
        timeout_ms BIGINT NOT NULL,
        state TEXT NOT NULL,
        detail JSONB NOT NULL
    )""",
    """CREATE TABLE producer_snapshots (
        topic_id UUID NOT NULL,
        partition INTEGER NOT NULL,
        snapshot_offset BIGINT NOT NULL,
        state TEXT NOT NULL,
        PRIMARY KEY (topic_id, partition)
    )""",
    """CREATE TABLE table_columns (
        table_name TEXT COLLATE "C" NOT NULL,
        path TEXT COLLATE "C" NOT NULL,
        field_id INTEGER NOT NULL,
        signature TEXT NOT NULL,
        deleted BOOLEAN NOT NULL DEFAULT FALSE,
        PRIMARY KEY (table_name, path)
    )""",
    """CREATE TABLE table_maintenance (
        table_name TEXT COLLATE "C" PRIMARY KEY,
        finished_ms BIGINT NOT NULL,
        duration_ms BIGINT NOT NULL,
        outcome TEXT NOT NULL,
        summary TEXT NOT NULL,
        data_files_after BIGINT NOT NULL,
        orphans_checked_ms BIGINT NOT NULL DEFAULT -1
    )""",
)

# The schema registry's tables (registry.py)
REGISTRY_TABLES = (
    """CREATE TABLE registry_schemas (
        schema_id INTEGER PRIMARY KEY,
        schema_type TEXT NOT NULL,
        schema TEXT NOT NULL,
        refs TEXT NOT NULL,
        fingerprint TEXT NOT NULL UNIQUE
    )""",
    """CREATE TABLE registry_versions (
        subject TEXT COLLATE "C" NOT NULL,
        version INTEGER NOT NULL,
        schema_id INTEGER NOT NULL,
        deleted BOOLEAN NOT NULL DEFAULT FALSE,
        PRIMARY KEY (subject, version)
    )""",
    "CREATE INDEX registry_versions_by_schema ON registry_versions (schema_id)",
    """CREATE TABLE registry_config (
        subject TEXT COLLATE "C" PRIMARY KEY,
        compatibility TEXT NOT NULL
    )""",
)

# Users' SCRAM credentials and ACLs (security.py); the generation moves with every change of either
SECURITY_TABLES = (
    """CREATE TABLE scram_credentials (
        user_name TEXT COLLATE "C" NOT NULL,
        mechanism TEXT COLLATE "C" NOT NULL,
        salt BYTEA NOT NULL,
        stored_key BYTEA NOT NULL,
        server_key BYTEA NOT NULL,
        iterations INTEGER NOT NULL,
        PRIMARY KEY (user_name, mechanism)
    )""",
    """CREATE TABLE acls (
        resource_type INTEGER NOT NULL,
        resource_name TEXT COLLATE "C" NOT NULL,
        pattern_type INTEGER NOT NULL,
        principal TEXT COLLATE "C" NOT NULL,
        host TEXT COLLATE "C" NOT NULL,
        operation INTEGER NOT NULL,
        permission INTEGER NOT NULL,
        PRIMARY KEY (resource_type, resource_name, pattern_type, principal, host, operation, permission)
    )""",
    """CREATE TABLE security_generation (
        id SMALLINT PRIMARY KEY CHECK (id = 0),
        generation BIGINT NOT NULL
    )""",
    "INSERT INTO security_generation VALUES (0, 0)",
)

# Several brokers over one store (issue 46): registrations, leaderships of partitions and coordinator shards (keyed
# like partitions: coordinator shards under a reserved id), and each node's own intake tail (objects it PUT).
CLUSTER_TABLES = (
    """CREATE TABLE brokers (
        node_id INTEGER PRIMARY KEY,
        incarnation TEXT NOT NULL,
        endpoints TEXT NOT NULL,
        rack TEXT,
        heartbeat_at TIMESTAMPTZ NOT NULL
    )""",
    """CREATE TABLE leaderships (
        topic_id UUID NOT NULL,
        partition INTEGER NOT NULL,
        node_id INTEGER,
        incarnation TEXT,
        epoch INTEGER NOT NULL,
        PRIMARY KEY (topic_id, partition)
    )""",
    """CREATE TABLE intake_node_tails (
        node_id INTEGER PRIMARY KEY,
        file_id BIGINT NOT NULL,
        position BIGINT NOT NULL
    )""",
)

# Transactional offsets (issue 46): a TxnOffsetCommit's offsets, pending for (group, producer) until a marker of
# their transaction reaches the group's coordinator (Kafka's pending transactional offsets of __consumer_offsets).
TXN_OFFSET_TABLES = (
    """CREATE TABLE txn_offsets (
        group_id TEXT COLLATE "C" NOT NULL,
        producer_id BIGINT NOT NULL,
        topic TEXT COLLATE "C" NOT NULL,
        partition INTEGER NOT NULL,
        producer_epoch INTEGER NOT NULL,
        transactional_id TEXT COLLATE "C" NOT NULL,
        committed_offset BIGINT NOT NULL,
        metadata TEXT NOT NULL,
        commit_timestamp BIGINT NOT NULL,
        PRIMARY KEY (group_id, producer_id, topic, partition)
    )""",
    "CREATE INDEX txn_offsets_by_producer ON txn_offsets (producer_id)",
)

# KIP-848 consumer groups' members, epochs and assignments (issue 46), so a group's new coordinator goes on where the
# old one stopped instead of fencing every member; keyed by coordinator shard for the shard's take-over.
CONSUMER_GROUP_TABLES = (
    """CREATE TABLE consumer_group_states (
        group_id TEXT COLLATE "C" PRIMARY KEY,
        shard INTEGER NOT NULL,
        state TEXT NOT NULL
    )""",
    "CREATE INDEX consumer_group_states_by_shard ON consumer_group_states (shard)",
)

# The schema's history: MIGRATIONS[v] takes a database from version v-1 to v (0: empty). A release that changes
# the schema appends a step (never edits one), so a database of any older release is upgraded in order.
MIGRATIONS: dict[int, tuple[str, ...]] = {
    1: _CORE_TABLES + REGISTRY_TABLES + SECURITY_TABLES,
    2: CLUSTER_TABLES,
    3: TXN_OFFSET_TABLES,
    4: CONSUMER_GROUP_TABLES,
}
# Key of pg_advisory_xact_lock while creating or upgrading the schema (the registry's is in registry.py).
SCHEMA_LOCK = 0x1CE1_0601


class SchemaVersionError(StoreError):
    """The database's schema was written by a newer icelog than this one: refused, nothing changed."""


def icelog_version() -> str:
    try:
        return version("icelog")
    except PackageNotFoundError:  # running from a source tree
        return "unknown"


def schema_version(conn: Connection) -> int | None:
    """The version a database's schema is at, or None for a database icelog never opened."""
    # A scan of pg_class, not to_regclass(): name look-ups go through the catalog caches, which an advisory lock
    # does not refresh, so an opener that waited for another's creation would not see the table it created.
    row = conn.execute(
        "SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace "
        "WHERE c.relname = 'schema_version' AND n.nspname = current_schema())"
    ).fetchone()
    if not row or not row[0]:
        return None
    found = conn.execute("SELECT version FROM schema_version WHERE id = 0").fetchone()
    return int(found[0]) if found else None


def _refuse_newer(where: str, found: int, known: int) -> None:
    raise SchemaVersionError(
        f"the metadata database at {where} has schema version {found}, newer than version {known} that this "
        f"icelog ({icelog_version()}) knows: run the newer icelog here too (every broker, archiver and CLI sharing "
        "a database must be as new as the newest that opened it), or point meta_url at another database"
    )


def prepare_schema(conn: Connection, where: str) -> None:
    """Create or upgrade the schema of the database `conn` is on (autocommit) to this icelog's version; refuse a
    newer one. `where` names the database in messages (host:port/database, no password)."""
    target = max(MIGRATIONS)
    found = schema_version(conn)
    if found == target:
        return
    if found is not None and found > target:
        _refuse_newer(where, found, target)
    with conn.transaction():
        # Serialises openers: one creates or upgrades, the others wait and then find the version it wrote (DDL is
        # transactional: all of the steps or nothing).
        conn.execute("SELECT pg_advisory_xact_lock(%s)", (SCHEMA_LOCK,))
        found = schema_version(conn) or 0
        if found > target:
            _refuse_newer(where, found, target)
        for step in range(found + 1, target + 1):
            for statement in MIGRATIONS[step]:
                conn.execute(statement)
        if found < target:
            conn.execute(
                "INSERT INTO schema_version VALUES (0, %s) ON CONFLICT (id) DO UPDATE SET version = excluded.version",
                (target,),
            )
            log.info("metadata store at %s: schema at version %d (was %s)", where, target, found or "empty")
