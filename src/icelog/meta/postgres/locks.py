"""ProcessLocks of the PostgreSQL store: session-level advisory locks, which every process using the database sees."""

from __future__ import annotations

import contextlib

import psycopg

from icelog.meta.postgres.database import Connection, PostgresDatabase

LOCK_PREFIX = "icelog:"  # advisory lock keys are hashes of "icelog:<name>", apart from other users' keys


class AdvisoryLock:
    """A held advisory lock: its connection, closed to let go."""

    def __init__(self, conn: Connection) -> None:
        self._conn: Connection | None = conn

    def release(self) -> None:
        if self._conn is not None:
            with contextlib.suppress(psycopg.Error):
                self._conn.close()
            self._conn = None


def try_advisory_lock(db: PostgresDatabase, name: str, shared: bool = False) -> AdvisoryLock | None:
    """The lock `name` on a connection of its own, held until released: PostgreSQL lets go when that connection
    ends (the holder died, or the network between them did). None if another holds it."""
    conn = db.connect(f"icelog lock {name}")
    try:
        taking = "pg_try_advisory_lock_shared" if shared else "pg_try_advisory_lock"
        row = conn.execute(f"SELECT {taking}(hashtextextended(%s, 0))", (LOCK_PREFIX + name,)).fetchone()
    except psycopg.Error as exc:
        conn.close()
        raise db.unavailable(exc) from None
    if not row or not row[0]:
        conn.close()
        return None
    return AdvisoryLock(conn)
