"""PostgreSQL tables and methods of users' SCRAM credentials and ACLs, mixed into PostgresStore."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any, TypeVar

import psycopg

from icelog.meta.security import AclEntry, ScramCredential

T = TypeVar("T")
Connection = psycopg.Connection[tuple[Any, ...]]

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
_ACL_COLUMNS = "resource_type, resource_name, pattern_type, principal, host, operation, permission"
_BUMP = "UPDATE security_generation SET generation = generation + 1 WHERE id = 0"


class PostgresSecurity:
    """SecurityStore methods over PostgresStore's pool and transactions."""

    def _run(self, work: Callable[[Connection], T], *, transaction: bool = True, idempotent: bool = False) -> T:
        raise NotImplementedError  # provided by PostgresStore

    def _rows(self, query: str, args: Mapping[str, Any] | tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        raise NotImplementedError  # provided by PostgresStore

    def scram_credentials(self, user: str | None = None) -> list[ScramCredential]:
        query = "SELECT user_name, mechanism, salt, stored_key, server_key, iterations FROM scram_credentials"
        if user is None:
            rows = self._rows(query + " ORDER BY user_name, mechanism")
        else:
            rows = self._rows(query + " WHERE user_name = %s ORDER BY mechanism", (user,))
        return [ScramCredential(r[0], r[1], bytes(r[2]), bytes(r[3]), bytes(r[4]), int(r[5])) for r in rows]

    def save_scram_credential(self, credential: ScramCredential) -> None:
        def work(conn: Connection) -> None:
            conn.execute(
                "INSERT INTO scram_credentials VALUES (%s, %s, %s, %s, %s, %s) ON CONFLICT (user_name, mechanism) "
                "DO UPDATE SET salt = excluded.salt, stored_key = excluded.stored_key, "
                "server_key = excluded.server_key, iterations = excluded.iterations",
                (credential.user, credential.mechanism, credential.salt, credential.stored_key,
                 credential.server_key, credential.iterations),
            )
            conn.execute(_BUMP)

        self._run(work, idempotent=True)

    def delete_scram_credentials(self, user: str, mechanism: str | None = None) -> int:
        def work(conn: Connection) -> int:
            if mechanism is None:
                count = conn.execute("DELETE FROM scram_credentials WHERE user_name = %s", (user,)).rowcount
            else:
                count = conn.execute(
                    "DELETE FROM scram_credentials WHERE user_name = %s AND mechanism = %s", (user, mechanism)
                ).rowcount
            if count:
                conn.execute(_BUMP)
            return int(count)

        return self._run(work)

    def acls(self) -> list[AclEntry]:
        rows = self._rows(f"SELECT {_ACL_COLUMNS} FROM acls ORDER BY {_ACL_COLUMNS}")
        return [AclEntry(int(r[0]), r[1], int(r[2]), r[3], r[4], int(r[5]), int(r[6])) for r in rows]

    def add_acls(self, entries: Iterable[AclEntry]) -> None:
        rows = [_acl_row(e) for e in entries]

        def work(conn: Connection) -> None:
            with conn.cursor() as cur:
                cur.executemany(f"INSERT INTO acls ({_ACL_COLUMNS}) VALUES (%s, %s, %s, %s, %s, %s, %s) "
                                "ON CONFLICT DO NOTHING", rows)
            conn.execute(_BUMP)

        self._run(work, idempotent=True)

    def delete_acls(self, entries: Iterable[AclEntry]) -> None:
        rows = [_acl_row(e) for e in entries]

        def work(conn: Connection) -> None:
            with conn.cursor() as cur:
                cur.executemany(
                    "DELETE FROM acls WHERE resource_type = %s AND resource_name = %s AND pattern_type = %s "
                    "AND principal = %s AND host = %s AND operation = %s AND permission = %s",
                    rows,
                )
            conn.execute(_BUMP)

        self._run(work, idempotent=True)

    def security_generation(self) -> int:
        rows = self._rows("SELECT generation FROM security_generation WHERE id = 0")
        return int(rows[0][0]) if rows else 0


def _acl_row(e: AclEntry) -> tuple[int, str, int, str, str, int, int]:
    return (e.resource_type, e.resource_name, e.pattern_type, e.principal, e.host, e.operation, e.permission)
