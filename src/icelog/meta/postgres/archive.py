"""The ArchiveLedger slice on PostgreSQL: archive progress and errors per partition, dead-letter counts, the archive
tables' column records and their last maintenance rounds."""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Mapping

from icelog.meta.postgres.database import Connection, PostgresDatabase
from icelog.meta.store import ArchiveLedger, ArchiveState, MaintenanceRecord
from icelog.table.field_ids import TableColumn


class PostgresArchive(ArchiveLedger):
    """ArchiveLedger over the store's PostgresDatabase."""

    _db: PostgresDatabase

    def archive_states(self, topic_id: uuid.UUID | None = None) -> list[ArchiveState]:
        query = (
            "SELECT topic_id, partition, archived_offset, last_commit_ms, last_error, last_error_ms, dead_letters "
            "FROM archive_state"
        )
        if topic_id is None:
            rows = self._db.rows(query + " ORDER BY topic_id, partition")
        else:
            rows = self._db.rows(query + " WHERE topic_id = %s ORDER BY partition", (topic_id,))
        return [ArchiveState(*row) for row in rows]

    def record_archive(
        self, topic_id: uuid.UUID, archived_offsets: Mapping[int, int], commit_ms: int
    ) -> None:
        self._db.many(
            "INSERT INTO archive_state (topic_id, partition, archived_offset, last_commit_ms) "
            "SELECT %(t)s, %(p)s, %(o)s, %(ms)s WHERE EXISTS (SELECT 1 FROM topics WHERE topic_id = %(t)s) "
            "ON CONFLICT (topic_id, partition) DO UPDATE SET "
            "archived_offset = GREATEST(archive_state.archived_offset, excluded.archived_offset), "
            "last_commit_ms = GREATEST(archive_state.last_commit_ms, excluded.last_commit_ms), "
            "last_error = '', last_error_ms = -1",
            [{"t": topic_id, "p": p, "o": o, "ms": commit_ms} for p, o in archived_offsets.items()],
        )

    def record_dead_letters(self, topic_id: uuid.UUID, counts: Mapping[int, int]) -> None:
        self._db.many(
            "INSERT INTO archive_state (topic_id, partition, dead_letters) "
            "SELECT %(t)s, %(p)s, %(n)s WHERE EXISTS (SELECT 1 FROM topics WHERE topic_id = %(t)s) "
            "ON CONFLICT (topic_id, partition) DO UPDATE SET dead_letters = excluded.dead_letters",
            [{"t": topic_id, "p": p, "n": n} for p, n in counts.items()],
        )

    def record_archive_error(
        self, topic_id: uuid.UUID, partitions: Iterable[int], error: str, at_ms: int
    ) -> None:
        self._db.many(
            "INSERT INTO archive_state (topic_id, partition, last_error, last_error_ms) "
            "SELECT %(t)s, %(p)s, %(e)s, %(ms)s WHERE EXISTS (SELECT 1 FROM topics WHERE topic_id = %(t)s) "
            "ON CONFLICT (topic_id, partition) DO UPDATE SET "
            "last_error = excluded.last_error, last_error_ms = excluded.last_error_ms",
            [{"t": topic_id, "p": p, "e": error[:2000], "ms": at_ms} for p in partitions],
        )

    # -- archive table columns -------------------------------------------------------------------
    def table_columns(self, table: str) -> list[TableColumn]:
        rows = self._db.rows(
            "SELECT path, field_id, signature, deleted FROM table_columns WHERE table_name = %s ORDER BY field_id",
            (table,),
        )
        return [TableColumn(path, field_id, signature, bool(deleted)) for path, field_id, signature, deleted in rows]

    def save_table_columns(self, table: str, columns: Iterable[TableColumn]) -> None:
        rows = [(table, c.path, c.field_id, c.signature, c.deleted) for c in columns]

        def work(conn: Connection) -> None:
            conn.execute("DELETE FROM table_columns WHERE table_name = %s", (table,))
            with conn.cursor() as cur:
                cur.executemany("INSERT INTO table_columns VALUES (%s, %s, %s, %s, %s)", rows)

        self._db.run(work, idempotent=True)

    # -- table maintenance ---------------------------------------------------------------------------
    def record_maintenance(self, record: MaintenanceRecord) -> None:
        self._db.statement(
            "INSERT INTO table_maintenance VALUES (%s, %s, %s, %s, %s, %s, %s) ON CONFLICT (table_name) DO UPDATE SET "
            "finished_ms = excluded.finished_ms, duration_ms = excluded.duration_ms, outcome = excluded.outcome, "
            "summary = excluded.summary, data_files_after = excluded.data_files_after, "
            "orphans_checked_ms = excluded.orphans_checked_ms",
            (record.table, record.finished_ms, record.duration_ms, record.outcome, record.summary,
             record.data_files_after, record.orphans_checked_ms),
        )

    def maintenance_records(self) -> dict[str, MaintenanceRecord]:
        rows = self._db.rows(
            "SELECT table_name, finished_ms, duration_ms, outcome, summary, data_files_after, orphans_checked_ms "
            "FROM table_maintenance"
        )
        return {row[0]: MaintenanceRecord(*row) for row in rows}
