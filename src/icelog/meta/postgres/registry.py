"""The RegistryStore slice on PostgreSQL: registered schemas by global id, subject versions, compatibility levels."""

from __future__ import annotations

import json
from collections.abc import Iterable

from icelog.faults import fault_point
from icelog.meta.postgres.database import Connection, PostgresDatabase, Row
from icelog.meta.registry import (
    RegistryConflictError,
    RegistrySchema,
    RegistryStore,
    SchemaReference,
    SubjectVersion,
)

_GLOBAL = ""  # registry_config key of the global level
REGISTRY_LOCK = 0x1CE1_0602  # pg_advisory_xact_lock key: one registration at a time allocates ids and versions
_SCHEMA_COLUMNS = "schema_id, schema_type, schema, refs, fingerprint"


def _schema_row(row: Row | None) -> RegistrySchema | None:
    if row is None:
        return None
    refs = tuple(SchemaReference(r["name"], r["subject"], int(r["version"])) for r in json.loads(row[3]))
    return RegistrySchema(int(row[0]), row[1], row[2], refs, row[4])


class PostgresRegistry(RegistryStore):
    """RegistryStore over the store's PostgresDatabase; every write is durable when it returns."""

    _db: PostgresDatabase

    def registry_add_version(
        self, subject: str, schema_type: str, schema: str, references: Iterable[SchemaReference],
        fingerprint: str, expected_latest: int | None,
    ) -> SubjectVersion:
        refs = json.dumps([{"name": r.name, "subject": r.subject, "version": r.version} for r in references])

        def work(conn: Connection) -> SubjectVersion:
            # Ids are max+1 and versions one past the subject's highest: one registration at a time.
            conn.execute("SELECT pg_advisory_xact_lock(%s)", (REGISTRY_LOCK,))
            row = conn.execute(
                "SELECT schema_id FROM registry_schemas WHERE fingerprint = %s", (fingerprint,)
            ).fetchone()
            if row is None:
                next_id = conn.execute("SELECT COALESCE(MAX(schema_id), 0) + 1 FROM registry_schemas").fetchone()
                assert next_id is not None
                schema_id = int(next_id[0])
                conn.execute("INSERT INTO registry_schemas VALUES (%s, %s, %s, %s, %s)",
                             (schema_id, schema_type, schema, refs, fingerprint))
            else:
                schema_id = int(row[0])
            existing = conn.execute(
                "SELECT version FROM registry_versions WHERE subject = %s AND schema_id = %s AND NOT deleted "
                "ORDER BY version LIMIT 1",
                (subject, schema_id),
            ).fetchone()
            if existing is not None:
                return SubjectVersion(subject, int(existing[0]), schema_id)
            versions = conn.execute(
                "SELECT MAX(version) FILTER (WHERE NOT deleted), COALESCE(MAX(version), 0) FROM registry_versions "
                "WHERE subject = %s",
                (subject,),
            ).fetchone()
            assert versions is not None
            if versions[0] != expected_latest:
                raise RegistryConflictError(f"subject {subject!r} changed while registering; retry")
            version = int(versions[1]) + 1
            conn.execute("INSERT INTO registry_versions VALUES (%s, %s, %s, FALSE)", (subject, version, schema_id))
            return SubjectVersion(subject, version, schema_id)

        # Durable on return: a registered schema id may be in records on disk right after.
        added = self._db.run(work)
        fault_point("schema-stored")
        return added

    def registry_schema(self, schema_id: int) -> RegistrySchema | None:
        rows = self._db.rows(f"SELECT {_SCHEMA_COLUMNS} FROM registry_schemas WHERE schema_id = %s", (schema_id,))
        return _schema_row(rows[0] if rows else None)

    def registry_schema_by_fingerprint(self, fingerprint: str) -> RegistrySchema | None:
        rows = self._db.rows(f"SELECT {_SCHEMA_COLUMNS} FROM registry_schemas WHERE fingerprint = %s", (fingerprint,))
        return _schema_row(rows[0] if rows else None)

    def registry_versions(self, subject: str | None = None) -> list[SubjectVersion]:
        query = "SELECT subject, version, schema_id, deleted FROM registry_versions"
        if subject is None:
            rows = self._db.rows(query + " ORDER BY subject, version")
        else:
            rows = self._db.rows(query + " WHERE subject = %s ORDER BY version", (subject,))
        return [SubjectVersion(s, int(v), int(i), bool(d)) for s, v, i, d in rows]

    def registry_versions_of_schema(self, schema_id: int) -> list[SubjectVersion]:
        rows = self._db.rows(
            "SELECT subject, version, schema_id, deleted FROM registry_versions WHERE schema_id = %s "
            "ORDER BY subject, version",
            (schema_id,),
        )
        return [SubjectVersion(s, int(v), int(i), bool(d)) for s, v, i, d in rows]

    def registry_delete_versions(self, subject: str, versions: Iterable[int], permanent: bool) -> None:
        query = ("DELETE FROM registry_versions WHERE subject = %s AND version = ANY(%s)" if permanent
                 else "UPDATE registry_versions SET deleted = TRUE WHERE subject = %s AND version = ANY(%s)")
        self._db.statement(query, (subject, list(versions)))

    def registry_compatibility(self, subject: str | None) -> str | None:
        key = _GLOBAL if subject is None else subject
        rows = self._db.rows("SELECT compatibility FROM registry_config WHERE subject = %s", (key,))
        return str(rows[0][0]) if rows else None

    def registry_set_compatibility(self, subject: str | None, level: str | None) -> None:
        key = _GLOBAL if subject is None else subject
        if level is None:
            self._db.statement("DELETE FROM registry_config WHERE subject = %s", (key,))
        else:
            self._db.statement(
                "INSERT INTO registry_config VALUES (%s, %s) ON CONFLICT (subject) "
                "DO UPDATE SET compatibility = excluded.compatibility",
                (key, level),
            )
