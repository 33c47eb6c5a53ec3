"""The ArchiveLedger slice on SQLite: archive progress and errors per partition, dead-letter counts, the archive
tables' column records and their last maintenance rounds."""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Mapping

from icelog.meta.sqlite.database import SqliteDatabase
from icelog.meta.store import ArchiveLedger, ArchiveState, MaintenanceRecord
from icelog.table.field_ids import TableColumn


class SqliteArchive(ArchiveLedger):
    """ArchiveLedger over the store's SqliteDatabase. Archive progress commits with synchronous=NORMAL: the
    table's snapshot summary is its truth."""

    _db: SqliteDatabase

    def archive_states(self, topic_id: uuid.UUID | None = None) -> list[ArchiveState]:
        query = (
            "SELECT topic_id, partition, archived_offset, last_commit_ms, last_error, last_error_ms, dead_letters "
            "FROM archive_state"
        )
        args: tuple[str, ...] = ()
        if topic_id is not None:
            query += " WHERE topic_id = ?"
            args = (str(topic_id),)
        rows = self._db.rows(query + " ORDER BY topic_id, partition", args)
        return [ArchiveState(uuid.UUID(r[0]), *r[1:]) for r in rows]

    def record_archive(
        self, topic_id: uuid.UUID, archived_offsets: Mapping[int, int], commit_ms: int
    ) -> None:
        tid = str(topic_id)
        with self._db.tx() as conn:
            conn.executemany(
                "INSERT INTO archive_state (topic_id, partition, archived_offset, last_commit_ms) "
                "SELECT ?1, ?2, ?3, ?4 WHERE EXISTS (SELECT 1 FROM topics WHERE topic_id = ?1) "
                "ON CONFLICT (topic_id, partition) DO UPDATE SET "
                "archived_offset = MAX(archived_offset, excluded.archived_offset), "
                "last_commit_ms = MAX(last_commit_ms, excluded.last_commit_ms), "
                "last_error = '', last_error_ms = -1",
                [(tid, p, offset, commit_ms) for p, offset in archived_offsets.items()],
            )

    def record_dead_letters(self, topic_id: uuid.UUID, counts: Mapping[int, int]) -> None:
        tid = str(topic_id)
        with self._db.tx() as conn:
            conn.executemany(
                "INSERT INTO archive_state (topic_id, partition, dead_letters) "
                "SELECT ?1, ?2, ?3 WHERE EXISTS (SELECT 1 FROM topics WHERE topic_id = ?1) "
                "ON CONFLICT (topic_id, partition) DO UPDATE SET dead_letters = excluded.dead_letters",
                [(tid, p, n) for p, n in counts.items()],
            )

    def record_archive_error(
        self, topic_id: uuid.UUID, partitions: Iterable[int], error: str, at_ms: int
    ) -> None:
        tid = str(topic_id)
        with self._db.tx() as conn:
            conn.executemany(
                "INSERT INTO archive_state (topic_id, partition, last_error, last_error_ms) "
                "SELECT ?1, ?2, ?3, ?4 WHERE EXISTS (SELECT 1 FROM topics WHERE topic_id = ?1) "
                "ON CONFLICT (topic_id, partition) DO UPDATE SET "
                "last_error = excluded.last_error, last_error_ms = excluded.last_error_ms",
                [(tid, p, error[:2000], at_ms) for p in partitions],
            )

    # -- archive table columns -------------------------------------------------------------------
    def table_columns(self, table: str) -> list[TableColumn]:
        rows = self._db.rows(
            "SELECT path, field_id, signature, deleted FROM table_columns WHERE table_name = ? ORDER BY field_id",
            (table,),
        )
        return [TableColumn(path, field_id, signature, bool(deleted)) for path, field_id, signature, deleted in rows]

    def save_table_columns(self, table: str, columns: Iterable[TableColumn]) -> None:
        with self._db.tx(durable=True) as conn:
            conn.execute("DELETE FROM table_columns WHERE table_name = ?", (table,))
            conn.executemany(
                "INSERT INTO table_columns (table_name, path, field_id, signature, deleted) VALUES (?, ?, ?, ?, ?)",
                [(table, c.path, c.field_id, c.signature, int(c.deleted)) for c in columns],
            )

    # -- table maintenance ---------------------------------------------------------------------------
    def record_maintenance(self, record: MaintenanceRecord) -> None:
        with self._db.tx() as conn:
            conn.execute(
                "INSERT OR REPLACE INTO table_maintenance (table_name, finished_ms, duration_ms, outcome, summary, "
                "data_files_after, orphans_checked_ms) VALUES (?, ?, ?, ?, ?, ?, ?)",
                (record.table, record.finished_ms, record.duration_ms, record.outcome, record.summary,
                 record.data_files_after, record.orphans_checked_ms),
            )

    def maintenance_records(self) -> dict[str, MaintenanceRecord]:
        rows = self._db.rows(
            "SELECT table_name, finished_ms, duration_ms, outcome, summary, data_files_after, orphans_checked_ms "
            "FROM table_maintenance"
        )
        return {row[0]: MaintenanceRecord(*row) for row in rows}
