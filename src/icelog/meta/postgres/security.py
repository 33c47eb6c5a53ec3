"""The SecurityStore slice on PostgreSQL: users' SCRAM credentials, ACLs and the generation that moves with them."""

from __future__ import annotations

from collections.abc import Iterable

from icelog.meta.postgres.database import Connection, PostgresDatabase
from icelog.meta.security import AclEntry, ScramCredential, SecurityStore

_ACL_COLUMNS = "resource_type, resource_name, pattern_type, principal, host, operation, permission"
_BUMP = "UPDATE security_generation SET generation = generation + 1 WHERE id = 0"


class PostgresSecurity(SecurityStore):
    """SecurityStore over the store's PostgresDatabase; every write moves the generation."""

    _db: PostgresDatabase

    def scram_credentials(self, user: str | None = None) -> list[ScramCredential]:
        query = "SELECT user_name, mechanism, salt, stored_key, server_key, iterations FROM scram_credentials"
        if user is None:
            rows = self._db.rows(query + " ORDER BY user_name, mechanism")
        else:
            rows = self._db.rows(query + " WHERE user_name = %s ORDER BY mechanism", (user,))
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

        self._db.run(work, idempotent=True)

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

        return self._db.run(work)

    def acls(self) -> list[AclEntry]:
        rows = self._db.rows(f"SELECT {_ACL_COLUMNS} FROM acls ORDER BY {_ACL_COLUMNS}")
        return [AclEntry(int(r[0]), r[1], int(r[2]), r[3], r[4], int(r[5]), int(r[6])) for r in rows]

    def add_acls(self, entries: Iterable[AclEntry]) -> None:
        rows = [_acl_row(e) for e in entries]

        def work(conn: Connection) -> None:
            with conn.cursor() as cur:
                cur.executemany(f"INSERT INTO acls ({_ACL_COLUMNS}) VALUES (%s, %s, %s, %s, %s, %s, %s) "
                                "ON CONFLICT DO NOTHING", rows)
            conn.execute(_BUMP)

        self._db.run(work, idempotent=True)

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

        self._db.run(work, idempotent=True)

    def security_generation(self) -> int:
        rows = self._db.rows("SELECT generation FROM security_generation WHERE id = 0")
        return int(rows[0][0]) if rows else 0


def _acl_row(e: AclEntry) -> tuple[int, str, int, str, str, int, int]:
    return (e.resource_type, e.resource_name, e.pattern_type, e.principal, e.host, e.operation, e.permission)
