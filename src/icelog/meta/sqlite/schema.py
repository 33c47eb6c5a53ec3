"""The SQLite store's tables: created in a new database, columns added to one of an older icelog.

Every opener (the broker, its archiver, the CLI) runs this; each step is idempotent, and one that another
process did first is skipped.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from contextlib import AbstractContextManager, suppress

CORE_SCHEMA = """
CREATE TABLE IF NOT EXISTS topics (
    name TEXT PRIMARY KEY,
    topic_id TEXT NOT NULL UNIQUE,
    partitions INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS topic_configs (
    topic_id TEXT NOT NULL,
    key TEXT NOT NULL,
    value TEXT NOT NULL,
    PRIMARY KEY (topic_id, key)
);
CREATE TABLE IF NOT EXISTS partitions (
    topic_id TEXT NOT NULL,
    partition INTEGER NOT NULL,
    log_start_offset INTEGER NOT NULL DEFAULT 0,
    high_watermark INTEGER NOT NULL DEFAULT 0,
    intake_chunks INTEGER NOT NULL DEFAULT 0,
    intake_bytes INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (topic_id, partition)
);
CREATE TABLE IF NOT EXISTS intake_chunks (
    topic_id TEXT NOT NULL,
    partition INTEGER NOT NULL,
    base_offset INTEGER NOT NULL,
    end_offset INTEGER NOT NULL,
    file_id INTEGER NOT NULL,
    position INTEGER NOT NULL,
    length INTEGER NOT NULL,
    max_timestamp INTEGER NOT NULL,
    PRIMARY KEY (topic_id, partition, base_offset)
);
CREATE INDEX IF NOT EXISTS intake_chunks_by_file ON intake_chunks (file_id);
CREATE TABLE IF NOT EXISTS archive_state (
    topic_id TEXT NOT NULL,
    partition INTEGER NOT NULL,
    archived_offset INTEGER NOT NULL DEFAULT 0,
    last_commit_ms INTEGER NOT NULL DEFAULT -1,
    last_error TEXT NOT NULL DEFAULT '',
    last_error_ms INTEGER NOT NULL DEFAULT -1,
    dead_letters INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (topic_id, partition)
);
CREATE TABLE IF NOT EXISTS intake_tail (
    id INTEGER PRIMARY KEY CHECK (id = 0),
    file_id INTEGER NOT NULL,
    position INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS group_offsets (
    group_id TEXT NOT NULL,
    topic TEXT NOT NULL,
    partition INTEGER NOT NULL,
    committed_offset INTEGER NOT NULL,
    metadata TEXT NOT NULL,
    commit_timestamp INTEGER NOT NULL,
    PRIMARY KEY (group_id, topic, partition)
);
CREATE TABLE IF NOT EXISTS txn_offsets (
    group_id TEXT NOT NULL,
    producer_id INTEGER NOT NULL,
    topic TEXT NOT NULL,
    partition INTEGER NOT NULL,
    producer_epoch INTEGER NOT NULL,
    transactional_id TEXT NOT NULL,
    committed_offset INTEGER NOT NULL,
    metadata TEXT NOT NULL,
    commit_timestamp INTEGER NOT NULL,
    PRIMARY KEY (group_id, producer_id, topic, partition)
);
CREATE INDEX IF NOT EXISTS txn_offsets_by_producer ON txn_offsets (producer_id);
CREATE TABLE IF NOT EXISTS consumer_group_states (
    group_id TEXT PRIMARY KEY,
    shard INTEGER NOT NULL,
    state TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS consumer_group_states_by_shard ON consumer_group_states (shard);
CREATE TABLE IF NOT EXISTS producer_ids (
    id INTEGER PRIMARY KEY CHECK (id = 0),
    next_producer_id INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS transactions (
    transactional_id TEXT PRIMARY KEY,
    producer_id INTEGER NOT NULL,
    producer_epoch INTEGER NOT NULL,
    timeout_ms INTEGER NOT NULL,
    state TEXT NOT NULL,
    detail TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS producer_snapshots (
    topic_id TEXT NOT NULL,
    partition INTEGER NOT NULL,
    snapshot_offset INTEGER NOT NULL,
    state TEXT NOT NULL,
    PRIMARY KEY (topic_id, partition)
);
CREATE TABLE IF NOT EXISTS table_columns (
    table_name TEXT NOT NULL,
    path TEXT NOT NULL,
    field_id INTEGER NOT NULL,
    signature TEXT NOT NULL,
    deleted INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (table_name, path)
);
CREATE TABLE IF NOT EXISTS table_maintenance (
    table_name TEXT PRIMARY KEY,
    finished_ms INTEGER NOT NULL,
    duration_ms INTEGER NOT NULL,
    outcome TEXT NOT NULL,
    summary TEXT NOT NULL,
    data_files_after INTEGER NOT NULL,
    orphans_checked_ms INTEGER NOT NULL DEFAULT -1
);
"""


# partitions.intake_chunks / intake_bytes follow the index row by row, so start-up and `icelog status`
# read a partition's totals without touching its chunk rows (trigger bodies hold ';': executed one by one).
_INTAKE_TOTALS_TRIGGERS = (
    "CREATE TRIGGER IF NOT EXISTS intake_chunks_counted AFTER INSERT ON intake_chunks BEGIN "
    "UPDATE partitions SET intake_chunks = intake_chunks + 1, intake_bytes = intake_bytes + NEW.length "
    "WHERE topic_id = NEW.topic_id AND partition = NEW.partition; END",
    "CREATE TRIGGER IF NOT EXISTS intake_chunks_uncounted AFTER DELETE ON intake_chunks BEGIN "
    "UPDATE partitions SET intake_chunks = intake_chunks - 1, intake_bytes = intake_bytes - OLD.length "
    "WHERE topic_id = OLD.topic_id AND partition = OLD.partition; END",
)

# The schema registry's tables (registry.py)
REGISTRY_SCHEMA = """
CREATE TABLE IF NOT EXISTS registry_schemas (
    schema_id INTEGER PRIMARY KEY,
    schema_type TEXT NOT NULL,
    schema TEXT NOT NULL,
    refs TEXT NOT NULL,
    fingerprint TEXT NOT NULL UNIQUE
);
CREATE TABLE IF NOT EXISTS registry_versions (
    subject TEXT NOT NULL,
    version INTEGER NOT NULL,
    schema_id INTEGER NOT NULL,
    deleted INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (subject, version)
);
CREATE INDEX IF NOT EXISTS registry_versions_by_schema ON registry_versions (schema_id);
CREATE TABLE IF NOT EXISTS registry_config (
    subject TEXT PRIMARY KEY,
    compatibility TEXT NOT NULL
);
"""

# Users' SCRAM credentials and ACLs (security.py); the generation moves with every change of either
SECURITY_SCHEMA = """
CREATE TABLE IF NOT EXISTS scram_credentials (
    user_name TEXT NOT NULL,
    mechanism TEXT NOT NULL,
    salt BLOB NOT NULL,
    stored_key BLOB NOT NULL,
    server_key BLOB NOT NULL,
    iterations INTEGER NOT NULL,
    PRIMARY KEY (user_name, mechanism)
);
CREATE TABLE IF NOT EXISTS acls (
    resource_type INTEGER NOT NULL,
    resource_name TEXT NOT NULL,
    pattern_type INTEGER NOT NULL,
    principal TEXT NOT NULL,
    host TEXT NOT NULL,
    operation INTEGER NOT NULL,
    permission INTEGER NOT NULL,
    PRIMARY KEY (resource_type, resource_name, pattern_type, principal, host, operation, permission)
);
CREATE TABLE IF NOT EXISTS security_generation (
    id INTEGER PRIMARY KEY CHECK (id = 0),
    generation INTEGER NOT NULL
);
INSERT OR IGNORE INTO security_generation (id, generation) VALUES (0, 0);
"""

Transaction = Callable[[], AbstractContextManager[sqlite3.Connection]]


def _statements(script: str) -> list[str]:
    return [statement for statement in script.split(";") if statement.strip()]


def prepare_schema(conn: sqlite3.Connection, tx: Transaction) -> None:
    """Create the tables this icelog uses, or add what an older one's database lacks (`tx`: a write transaction)."""
    for statement in _statements(CORE_SCHEMA) + _statements(REGISTRY_SCHEMA):
        conn.execute(statement)
    archive_columns = {row[1] for row in conn.execute("PRAGMA table_info(archive_state)")}
    if "dead_letters" not in archive_columns:  # stores created before the dead-letter table
        with suppress(sqlite3.OperationalError):
            conn.execute("ALTER TABLE archive_state ADD COLUMN dead_letters INTEGER NOT NULL DEFAULT 0")
    if "retention_start_offset" not in {row[1] for row in conn.execute("PRAGMA table_info(partitions)")}:
        with suppress(sqlite3.OperationalError):  # stores created before read-back
            conn.execute("ALTER TABLE partitions ADD COLUMN retention_start_offset INTEGER NOT NULL DEFAULT 0")
    columns = {row[1] for row in conn.execute("PRAGMA table_info(intake_chunks)")}
    if "ingest_timestamp" not in columns:  # stores created before the archiver
        # (suppress: another process, the archiver or the broker, may have added it just now)
        with suppress(sqlite3.OperationalError):
            conn.execute("ALTER TABLE intake_chunks ADD COLUMN ingest_timestamp INTEGER NOT NULL DEFAULT -1")
    _migrate_intake_totals(tx)
    with tx() as write:
        for statement in _statements(SECURITY_SCHEMA):
            write.execute(statement)


def _migrate_intake_totals(tx: Transaction) -> None:
    """Stores created before per-partition intake totals: add and backfill them, with the triggers that
    keep them, in one transaction (the broker and the archiver may open the store at once)."""
    with tx() as conn:
        columns = {row[1] for row in conn.execute("PRAGMA table_info(partitions)")}
        if "intake_bytes" not in columns:
            conn.execute("ALTER TABLE partitions ADD COLUMN intake_chunks INTEGER NOT NULL DEFAULT 0")
            conn.execute("ALTER TABLE partitions ADD COLUMN intake_bytes INTEGER NOT NULL DEFAULT 0")
            conn.execute(
                "UPDATE partitions SET (intake_chunks, intake_bytes) = (SELECT COUNT(*), COALESCE(SUM(length), 0) "
                "FROM intake_chunks c WHERE c.topic_id = partitions.topic_id "
                "AND c.partition = partitions.partition)"
            )
        for trigger in _INTAKE_TOTALS_TRIGGERS:
            conn.execute(trigger)
