"""The SecurityStore slice on SQLite: users' SCRAM credentials, ACLs and the generation that moves with them."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable

from icelog.meta.security import AclEntry, ScramCredential, SecurityStore
from icelog.meta.sqlite.database import SqliteDatabase

_ACL_COLUMNS = "resource_type, resource_name, pattern_type, principal, host, operation, permission"


class SqliteSecurity(SecurityStore):
    """SecurityStore over the store's SqliteDatabase; every write is durable and moves the generation."""

    _db: SqliteDatabase

    @staticmethod
    def _bump(conn: sqlite3.Connection) -> None:
        conn.execute("UPDATE security_generation SET generation = generation + 1 WHERE id = 0")

    def scram_credentials(self, user: str | None = None) -> list[ScramCredential]:
        query = "SELECT user_name, mechanism, salt, stored_key, server_key, iterations FROM scram_credentials"
        args: tuple[str, ...] = ()
        if user is not None:
            query, args = query + " WHERE user_name = ?", (user,)
        rows = self._db.rows(query + " ORDER BY user_name, mechanism", args)
        return [ScramCredential(r[0], r[1], bytes(r[2]), bytes(r[3]), bytes(r[4]), int(r[5])) for r in rows]

    def save_scram_credential(self, credential: ScramCredential) -> None:
        with self._db.tx(durable=True) as conn:
            conn.execute(
                "INSERT OR REPLACE INTO scram_credentials VALUES (?, ?, ?, ?, ?, ?)",
                (credential.user, credential.mechanism, credential.salt, credential.stored_key,
                 credential.server_key, credential.iterations),
            )
            self._bump(conn)

    def delete_scram_credentials(self, user: str, mechanism: str | None = None) -> int:
        with self._db.tx(durable=True) as conn:
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
        rows = self._db.rows(f"SELECT {_ACL_COLUMNS} FROM acls ORDER BY {_ACL_COLUMNS}")
        return [AclEntry(int(r[0]), r[1], int(r[2]), r[3], r[4], int(r[5]), int(r[6])) for r in rows]

    def add_acls(self, entries: Iterable[AclEntry]) -> None:
        rows = [_acl_row(e) for e in entries]
        with self._db.tx(durable=True) as conn:
            conn.executemany(f"INSERT OR IGNORE INTO acls ({_ACL_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?)", rows)
            self._bump(conn)

    def delete_acls(self, entries: Iterable[AclEntry]) -> None:
        rows = [_acl_row(e) for e in entries]
        with self._db.tx(durable=True) as conn:
            conn.executemany(
                "DELETE FROM acls WHERE resource_type = ? AND resource_name = ? AND pattern_type = ? "
                "AND principal = ? AND host = ? AND operation = ? AND permission = ?",
                rows,
            )
            self._bump(conn)

    def security_generation(self) -> int:
        rows = self._db.rows("SELECT generation FROM security_generation WHERE id = 0")
        return int(rows[0][0]) if rows else 0


def _acl_row(e: AclEntry) -> tuple[int, str, int, str, str, int, int]:
    return (e.resource_type, e.resource_name, e.pattern_type, e.principal, e.host, e.operation, e.permission)
