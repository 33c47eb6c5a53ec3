"""SQLite tables and methods of users' SCRAM credentials and ACLs, mixed into SqliteStore."""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Iterable
from contextlib import AbstractContextManager

from icelog.meta.security import AclEntry, ScramCredential

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
_ACL_COLUMNS = "resource_type, resource_name, pattern_type, principal, host, operation, permission"


class SqliteSecurity:
    """SecurityStore methods over SqliteStore's connection, lock and transactions."""

    _conn: sqlite3.Connection
    _lock: threading.RLock

    def _tx(self, durable: bool = False) -> AbstractContextManager[sqlite3.Connection]:
        raise NotImplementedError  # provided by SqliteStore

    def _create_security_tables(self) -> None:
        with self._tx() as conn:
            for statement in SECURITY_SCHEMA.split(";"):
                if statement.strip():
                    conn.execute(statement)

    @staticmethod
    def _bump(conn: sqlite3.Connection) -> None:
        conn.execute("UPDATE security_generation SET generation = generation + 1 WHERE id = 0")

    def scram_credentials(self, user: str | None = None) -> list[ScramCredential]:
        query = "SELECT user_name, mechanism, salt, stored_key, server_key, iterations FROM scram_credentials"
        args: tuple[str, ...] = ()
        if user is not None:
            query, args = query + " WHERE user_name = ?", (user,)
        with self._lock:
            rows = self._conn.execute(query + " ORDER BY user_name, mechanism", args).fetchall()
        return [ScramCredential(r[0], r[1], bytes(r[2]), bytes(r[3]), bytes(r[4]), int(r[5])) for r in rows]

    def save_scram_credential(self, credential: ScramCredential) -> None:
        with self._tx(durable=True) as conn:
            conn.execute(
                "INSERT OR REPLACE INTO scram_credentials VALUES (?, ?, ?, ?, ?, ?)",
                (credential.user, credential.mechanism, credential.salt, credential.stored_key,
                 credential.server_key, credential.iterations),
            )
            self._bump(conn)

    def delete_scram_credentials(self, user: str, mechanism: str | None = None) -> int:
        with self._tx(durable=True) as conn:
            if mechanism is None:
                count = conn.execute("DELETE FROM scram_credentials WHERE user_name = ?", (user,)).rowcount
            else:
                count = conn.execute(
                    "DELETE FROM scram_credentials WHERE user_name = ? AND mechanism = ?", (user, mechanism)
                ).rowcount
            if count:
                self._bump(conn)
        return int(count)

    def acls(self) -> list[AclEntry]:
        with self._lock:
            rows = self._conn.execute(f"SELECT {_ACL_COLUMNS} FROM acls ORDER BY {_ACL_COLUMNS}").fetchall()
        return [AclEntry(int(r[0]), r[1], int(r[2]), r[3], r[4], int(r[5]), int(r[6])) for r in rows]

    def add_acls(self, entries: Iterable[AclEntry]) -> None:
        rows = [_acl_row(e) for e in entries]
        with self._tx(durable=True) as conn:
            conn.executemany(f"INSERT OR IGNORE INTO acls ({_ACL_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?)", rows)
            self._bump(conn)

    def delete_acls(self, entries: Iterable[AclEntry]) -> None:
        rows = [_acl_row(e) for e in entries]
        with self._tx(durable=True) as conn:
            conn.executemany(
                "DELETE FROM acls WHERE resource_type = ? AND resource_name = ? AND pattern_type = ? "
                "AND principal = ? AND host = ? AND operation = ? AND permission = ?",
                rows,
            )
            self._bump(conn)

    def security_generation(self) -> int:
        with self._lock:
            row = self._conn.execute("SELECT generation FROM security_generation WHERE id = 0").fetchone()
        return int(row[0]) if row else 0


def _acl_row(e: AclEntry) -> tuple[int, str, int, str, str, int, int]:
    return (e.resource_type, e.resource_name, e.pattern_type, e.principal, e.host, e.operation, e.permission)
