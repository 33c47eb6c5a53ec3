"""SQLite tables and methods of the schema registry, mixed into SqliteStore."""

from __future__ import annotations

import json
import sqlite3
import threading
from collections.abc import Iterable, Iterator
from contextlib import AbstractContextManager

from icelog.faults import fault_point
from icelog.meta.registry import RegistryConflictError, RegistrySchema, SchemaReference, SubjectVersion

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
_GLOBAL = ""  # registry_config key of the global level


def _schema_row(row: tuple[int, str, str, str, str] | None) -> RegistrySchema | None:
    if row is None:
        return None
    refs = tuple(SchemaReference(r["name"], r["subject"], int(r["version"])) for r in json.loads(row[3]))
    return RegistrySchema(int(row[0]), row[1], row[2], refs, row[4])


class SqliteRegistry:
    """Registry methods over SqliteStore's connection, lock and transactions (see RegistryStore)."""

    _conn: sqlite3.Connection
    _lock: threading.RLock

    def _tx(self, durable: bool = False) -> AbstractContextManager[sqlite3.Connection]:
        raise NotImplementedError  # provided by SqliteStore

    def _create_registry_tables(self) -> None:
        for statement in REGISTRY_SCHEMA.split(";"):
            if statement.strip():
                self._conn.execute(statement)

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
        with self._tx(durable=True) as conn:
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
        with self._lock:
            row = self._conn.execute("SELECT * FROM registry_schemas WHERE schema_id = ?", (schema_id,)).fetchone()
        return _schema_row(row)

    def registry_schema_by_fingerprint(self, fingerprint: str) -> RegistrySchema | None:
        with self._lock:
            row = self._conn.execute(
                "SELECT * FROM registry_schemas WHERE fingerprint = ?", (fingerprint,)
            ).fetchone()
        return _schema_row(row)

    def registry_versions(self, subject: str | None = None) -> list[SubjectVersion]:
        query = "SELECT subject, version, schema_id, deleted FROM registry_versions"
        args: tuple[str, ...] = ()
        if subject is not None:
            query += " WHERE subject = ?"
            args = (subject,)
        with self._lock:
            rows = self._conn.execute(query + " ORDER BY subject, version", args).fetchall()
        return list(_versions(rows))

    def registry_versions_of_schema(self, schema_id: int) -> list[SubjectVersion]:
        with self._lock:
            rows = self._conn.execute(
                "SELECT subject, version, schema_id, deleted FROM registry_versions WHERE schema_id = ? "
                "ORDER BY subject, version",
                (schema_id,),
            ).fetchall()
        return list(_versions(rows))

    def registry_delete_versions(self, subject: str, versions: Iterable[int], permanent: bool) -> None:
        args = [(subject, v) for v in versions]
        with self._tx(durable=True) as conn:
            if permanent:
                conn.executemany("DELETE FROM registry_versions WHERE subject = ? AND version = ?", args)
            else:
                conn.executemany("UPDATE registry_versions SET deleted = 1 WHERE subject = ? AND version = ?", args)

    def registry_compatibility(self, subject: str | None) -> str | None:
        with self._lock:
            key = _GLOBAL if subject is None else subject
            row = self._conn.execute("SELECT compatibility FROM registry_config WHERE subject = ?", (key,)).fetchone()
        return None if row is None else str(row[0])

    def registry_set_compatibility(self, subject: str | None, level: str | None) -> None:
        key = _GLOBAL if subject is None else subject
        with self._tx(durable=True) as conn:
            if level is None:
                conn.execute("DELETE FROM registry_config WHERE subject = ?", (key,))
            else:
                conn.execute("INSERT OR REPLACE INTO registry_config VALUES (?, ?)", (key, level))


def _versions(rows: Iterable[tuple[str, int, int, int]]) -> Iterator[SubjectVersion]:
    for subject, version, schema_id, deleted in rows:
        yield SubjectVersion(subject, int(version), int(schema_id), bool(deleted))
