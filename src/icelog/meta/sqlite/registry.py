"""The RegistryStore slice on SQLite: registered schemas by global id, subject versions, compatibility levels."""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator

from icelog.faults import fault_point
from icelog.meta.registry import (
    RegistryConflictError,
    RegistrySchema,
    RegistryStore,
    SchemaReference,
    SubjectVersion,
)
from icelog.meta.sqlite.database import Row, SqliteDatabase

_GLOBAL = ""  # registry_config key of the global level


def _schema_row(rows: list[Row]) -> RegistrySchema | None:
    if not rows:
        return None
    row = rows[0]
    refs = tuple(SchemaReference(r["name"], r["subject"], int(r["version"])) for r in json.loads(row[3]))
    return RegistrySchema(int(row[0]), row[1], row[2], refs, row[4])


class SqliteRegistry(RegistryStore):
    """RegistryStore over the store's SqliteDatabase; every write is durable (a registered schema id may be in
    records on disk right after)."""

    _db: SqliteDatabase

    def registry_add_version(
        self, subject: str, schema_type: str, schema: str, references: Iterable[SchemaReference],
        fingerprint: str, expected_latest: int | None,
    ) -> SubjectVersion:
        refs = json.dumps([{"name": r.name, "subject": r.subject, "version": r.version} for r in references])
        # durable: a registered schema id may be in records on disk right after this returns.
        added = self._add_version(subject, schema_type, schema, refs, fingerprint, expected_latest)
        fault_point("schema-stored")
        return added

    def _add_version(
        self, subject: str, schema_type: str, schema: str, refs: str, fingerprint: str, expected_latest: int | None
    ) -> SubjectVersion:
        with self._db.tx(durable=True) as conn:
            row = conn.execute(
                "SELECT schema_id FROM registry_schemas WHERE fingerprint = ?", (fingerprint,)
            ).fetchone()
            if row is None:
                next_id = conn.execute("SELECT COALESCE(MAX(schema_id), 0) + 1 FROM registry_schemas").fetchone()[0]
                conn.execute(
                    "INSERT INTO registry_schemas VALUES (?, ?, ?, ?, ?)",
                    (next_id, schema_type, schema, refs, fingerprint),
                )
                schema_id = int(next_id)
            else:
                schema_id = int(row[0])
            existing = conn.execute(
                "SELECT version FROM registry_versions WHERE subject = ? AND schema_id = ? AND deleted = 0 "
                "ORDER BY version LIMIT 1",
                (subject, schema_id),
            ).fetchone()
            if existing is not None:
                return SubjectVersion(subject, int(existing[0]), schema_id)
            latest = conn.execute(
                "SELECT MAX(version) FROM registry_versions WHERE subject = ? AND deleted = 0", (subject,)
            ).fetchone()[0]
            if latest != expected_latest:
                raise RegistryConflictError(f"subject {subject!r} changed while registering; retry")
            top = conn.execute("SELECT COALESCE(MAX(version), 0) FROM registry_versions WHERE subject = ?",
                               (subject,)).fetchone()[0]
            version = int(top) + 1
            conn.execute("INSERT INTO registry_versions VALUES (?, ?, ?, 0)", (subject, version, schema_id))
            return SubjectVersion(subject, version, schema_id)

    def registry_schema(self, schema_id: int) -> RegistrySchema | None:
        return _schema_row(self._db.rows("SELECT * FROM registry_schemas WHERE schema_id = ?", (schema_id,)))

    def registry_schema_by_fingerprint(self, fingerprint: str) -> RegistrySchema | None:
        return _schema_row(self._db.rows("SELECT * FROM registry_schemas WHERE fingerprint = ?", (fingerprint,)))

    def registry_versions(self, subject: str | None = None) -> list[SubjectVersion]:
        query = "SELECT subject, version, schema_id, deleted FROM registry_versions"
        args: tuple[str, ...] = ()
        if subject is not None:
            query += " WHERE subject = ?"
            args = (subject,)
        return list(_versions(self._db.rows(query + " ORDER BY subject, version", args)))

    def registry_versions_of_schema(self, schema_id: int) -> list[SubjectVersion]:
        rows = self._db.rows(
            "SELECT subject, version, schema_id, deleted FROM registry_versions WHERE schema_id = ? "
            "ORDER BY subject, version",
            (schema_id,),
        )
        return list(_versions(rows))

    def registry_delete_versions(self, subject: str, versions: Iterable[int], permanent: bool) -> None:
        args = [(subject, v) for v in versions]
        with self._db.tx(durable=True) as conn:
            if permanent:
                conn.executemany("DELETE FROM registry_versions WHERE subject = ? AND version = ?", args)
            else:
                conn.executemany("UPDATE registry_versions SET deleted = 1 WHERE subject = ? AND version = ?", args)

    def registry_compatibility(self, subject: str | None) -> str | None:
        key = _GLOBAL if subject is None else subject
        rows = self._db.rows("SELECT compatibility FROM registry_config WHERE subject = ?", (key,))
        return str(rows[0][0]) if rows else None

    def registry_set_compatibility(self, subject: str | None, level: str | None) -> None:
        key = _GLOBAL if subject is None else subject
        with self._db.tx(durable=True) as conn:
            if level is None:
                conn.execute("DELETE FROM registry_config WHERE subject = ?", (key,))
            else:
                conn.execute("INSERT OR REPLACE INTO registry_config VALUES (?, ?)", (key, level))


def _versions(rows: Iterable[tuple[str, int, int, int]]) -> Iterator[SubjectVersion]:
    for subject, version, schema_id, deleted in rows:
        yield SubjectVersion(subject, int(version), int(schema_id), bool(deleted))
