"""The PostgreSQL store's database: its connection pool, how a statement runs and is retried, and outages.

Every slice of the store (topics.py, intake.py, …) runs its statements through one `PostgresDatabase`:
* Each call is one transaction (BEGIN … COMMIT), or one statement in autocommit, which PostgreSQL runs as one.
  With `synchronous_commit` on (PostgreSQL's default: leave it on) a commit is on the server's disk when it
  returns, so what a client is answered about is stored first.
* Connections come from a psycopg 3 pool; any thread may call at once.
* A database that cannot be reached raises StoreUnavailableError (retriable), naming host:port, never the
  password.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any, TypeVar
from urllib.parse import parse_qs, urlsplit

from icelog.errors import StoreError, StoreUnavailableError
from icelog.meta.postgres.schema import Connection as Connection  # the slices take it from here
from icelog.meta.postgres.schema import prepare_schema

try:
    import psycopg
    from psycopg import errors as pg_errors
    from psycopg_pool import ConnectionPool, PoolTimeout
except ImportError as exc:  # pragma: no cover - a dependency of icelog; missing only in a broken install
    raise StoreError(
        "meta_url=postgresql://… needs psycopg 3 and psycopg-pool: pip install 'psycopg[binary]' psycopg-pool"
    ) from exc

log = logging.getLogger(__name__)

T = TypeVar("T")
Args = Mapping[str, Any] | tuple[Any, ...]
Row = tuple[Any, ...]

_ATTEMPTS = 3  # a call is tried this often on a broken connection or a serialisation failure
POOL_MIN, POOL_MAX = 2, 12  # the broker's loop, intake writer, fetch and retention threads, the coordinators
POOL_TIMEOUT_S = 3.0  # waiting for a pooled connection; past it (the database is down) StoreUnavailableError
# Once the database is known down, calls fail at once but for one connection attempt this often (with this
# libpq connect_timeout, its minimum): callers on the broker's event loop (the authorizer) must not stall it.
PROBE_INTERVAL_S = 0.5
PROBE_CONNECT_TIMEOUT_S = 2
CONNECT_TIMEOUT_S = 5  # libpq's connect_timeout unless the URL sets one


def masked_url(url: str) -> str:
    """The URL with its password replaced by ***: the only form of a metadata URL in messages and logs."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.rpartition("@")
    user = netloc[0].partition(":")[0]
    return parts._replace(netloc=f"{user}:***@{netloc[2]}").geturl()


def server_of(url: str) -> str:
    """host:port/database of a postgresql:// URL (for messages)."""
    parts = urlsplit(url)
    host = parts.hostname or "localhost"
    try:
        port = parts.port or 5432
    except ValueError:
        port = 5432
    return f"{host}:{port}{parts.path or '/'}"


def _first_line(exc: BaseException) -> str:
    lines = [line.strip() for line in str(exc).strip().splitlines() if line.strip()]
    return lines[0][:300] if lines else type(exc).__name__


class PostgresDatabase:
    """One PostgreSQL database (or the first schema of the URL's search_path), its schema prepared on opening."""

    def __init__(self, url: str) -> None:
        self._where = server_of(url)
        query = parse_qs(urlsplit(url).query)
        kwargs: dict[str, Any] = {"autocommit": True}
        if "connect_timeout" not in query:
            kwargs["connect_timeout"] = CONNECT_TIMEOUT_S
        if "application_name" not in query:
            kwargs["application_name"] = "icelog"
        try:
            # The schema first, on a connection of its own: a database that is down or refuses us fails here
            # with libpq's reason, at once, not after a pool's wait.
            with psycopg.connect(url, **kwargs) as conn:
                prepare_schema(conn, self._where)
        except psycopg.OperationalError as exc:
            raise self.unavailable(exc) from None
        except psycopg.Error as exc:
            raise StoreError(f"metadata store at {self._where}: {_first_line(exc)}") from None
        self._url, self._kwargs = url, kwargs
        self.pool = self._new_pool()
        try:
            self.pool.open(wait=True, timeout=POOL_TIMEOUT_S + CONNECT_TIMEOUT_S)
        except PoolTimeout as exc:
            self.pool.close()
            raise self.unavailable(exc) from None
        self._closed = False
        # Set when a call found the database unreachable: calls then fail at once, but for one probe connection
        # every PROBE_INTERVAL_S, and the first that connects replaces the pool (see _revive).
        self._down: str | None = None  # why
        self._next_probe = 0.0
        self._revive_lock = threading.Lock()

    def _new_pool(self) -> ConnectionPool[Connection]:
        return ConnectionPool(
            self._url, kwargs=self._kwargs, min_size=POOL_MIN, max_size=POOL_MAX, timeout=POOL_TIMEOUT_S,
            name="icelog-meta", open=False,
        )

    def _revive(self) -> None:
        """While the database is down: fail at once, or, every PROBE_INTERVAL_S, try one connection; once one
        connects, start a new pool. (A pool's own reconnection backs off exponentially without a cap: after a
        30 s outage its next attempt could be as far away again. A new pool connects now.)"""
        with self._revive_lock:
            if self._down is None:
                return
            now = time.monotonic()
            if now < self._next_probe:
                raise StoreUnavailableError(self._down)
            self._next_probe = now + PROBE_INTERVAL_S
            try:
                psycopg.connect(self._url, **{**self._kwargs, "connect_timeout": PROBE_CONNECT_TIMEOUT_S}).close()
            except psycopg.Error as exc:
                self._down = str(self.unavailable(exc))
                raise StoreUnavailableError(self._down) from None
            old, self.pool = self.pool, self._new_pool()
            self.pool.open(wait=False)
            self._down = None
            log.warning("metadata store at %s answers again", self._where)
        old.close(timeout=1.0)  # callers still holding its connections are answered by the new one on retry

    def unavailable(self, exc: BaseException) -> StoreUnavailableError:
        """The error of a database that cannot be reached, naming it and libpq's reason."""
        return StoreUnavailableError(f"metadata store at {self._where} unavailable: {_first_line(exc)}")

    def connect(self, application_name: str) -> Connection:
        """A connection of its own, outside the pool (autocommit): the caller closes it."""
        try:
            return psycopg.connect(self._url, **{**self._kwargs, "application_name": application_name[:63]})
        except psycopg.Error as exc:
            raise self.unavailable(exc) from None

    # -- running statements ----------------------------------------------------------------------
    def run(self, work: Callable[[Connection], T], *, transaction: bool = True, idempotent: bool = False) -> T:
        """Run `work` on a pooled connection, in one transaction unless `work` is a single statement.

        Retried on a connection found broken (the database restarted since it was pooled) and on PostgreSQL's
        serialisation and deadlock failures; a failure while committing is retried only if `work` is
        idempotent (else it may have committed). Raises StoreUnavailableError when the database cannot be
        reached, StoreError for any other database error.
        """
        failure: BaseException | None = None
        for attempt in range(_ATTEMPTS):
            committing = False
            if self._down is not None:
                self._revive()
            try:
                with self.pool.connection() as conn:
                    if not transaction:
                        committing = True  # one statement: it commits as it runs
                        return work(conn)
                    with conn.transaction():
                        result = work(conn)
                        committing = True
                    return result
            except (pg_errors.SerializationFailure, pg_errors.DeadlockDetected) as exc:
                failure = exc
                time.sleep(0.005 * (attempt + 1))
            except PoolTimeout as exc:  # no connection within the pool's wait: the database is down
                with self._revive_lock:
                    if self._down is None:
                        log.warning("metadata store at %s unavailable: %s", self._where, _first_line(exc))
                        self._down = str(self.unavailable(exc))
                        self._next_probe = time.monotonic() + PROBE_INTERVAL_S
                    raise StoreUnavailableError(self._down) from None
            except (psycopg.OperationalError, psycopg.InterfaceError) as exc:
                failure = exc
                if committing and not idempotent:
                    raise self.unavailable(exc) from None
                self._check_pool()
            except psycopg.Error as exc:
                raise StoreError(f"metadata store at {self._where}: {_first_line(exc)}") from None
        assert failure is not None
        if isinstance(failure, psycopg.OperationalError | psycopg.InterfaceError):
            raise self.unavailable(failure) from None
        raise StoreError(f"metadata store at {self._where}: {_first_line(failure)}")

    def _check_pool(self) -> None:
        """Drop pooled connections that are broken (after a database restart every idle one is)."""
        with contextlib.suppress(psycopg.Error):
            self.pool.check()

    def rows(self, query: str, args: Args = ()) -> list[Row]:
        """The rows of one read (autocommit: it sees everything committed before it)."""
        return self.run(lambda conn: conn.execute(query, args).fetchall(), transaction=False, idempotent=True)

    def row(self, query: str, args: Args = ()) -> Row | None:
        """The first row of one read, or None."""
        rows = self.rows(query, args)
        return rows[0] if rows else None

    def statement(self, query: str, args: Args = (), idempotent: bool = True) -> int:
        """One write statement, its own transaction; the rows it changed."""
        return self.run(lambda conn: conn.execute(query, args).rowcount, transaction=False, idempotent=idempotent)

    def many(self, query: str, rows: list[Any]) -> None:
        """One idempotent statement for many rows, all in one transaction (none: nothing runs)."""
        def work(conn: Connection) -> None:
            with conn.cursor() as cur:
                cur.executemany(query, rows)

        if rows:
            self.run(work, idempotent=True)

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self.pool.close()
