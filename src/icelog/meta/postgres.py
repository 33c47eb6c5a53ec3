"""PostgreSQL implementation of the metadata store: for metadata beyond one machine's disk.

Same semantics as the SQLite store (meta/sqlite.py), method for method; the differences are how:
* Each method is one transaction (BEGIN … COMMIT), or one statement in autocommit, which PostgreSQL runs as one.
  With `synchronous_commit` on (PostgreSQL's default: leave it on) a commit is on the server's disk when it
  returns, so what a client is answered about is stored first. Unlike SQLite's, the intake index is committed
  durably too: the database outlives the broker's machine, and a database that lost the last index rows while
  the broker kept running would leave a hole that no recovery re-reads (the broker's tail has moved on).
* Connections come from a psycopg 3 pool; any thread may call any method at once. Writes that read first lock
  what they read (`FOR UPDATE`, an advisory lock for registry ids), so concurrent callers serialise as they do
  behind SQLite's single writer.
* Per-partition intake totals are kept by the statements that insert and delete chunks (no triggers: the group
  commit stays one statement, one round trip).
* The schema is versioned (`schema_version`): a new database is created, an older one upgraded, one written by
  a newer icelog refused, under an advisory lock so a broker, its archiver and the CLI may open it at once.
* A database that cannot be reached raises StoreUnavailableError (retriable), naming host:port, never the
  password.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Mapping
from typing import Any, TypeVar
from urllib.parse import parse_qs, urlsplit

from icelog.errors import StoreError, StoreUnavailableError, TopicExistsError, UnknownTopicError
from icelog.meta.postgres_registry import PostgresRegistry
from icelog.meta.postgres_schema import Connection, prepare_schema
from icelog.meta.postgres_security import PostgresSecurity
from icelog.meta.store import (
    ArchiveState,
    CommittedOffset,
    GroupOffsets,
    IntakeChunk,
    IntakeRangeSummary,
    IntakeTail,
    MaintenanceRecord,
    MetadataStore,
    PartitionRecord,
    ProducerSnapshot,
    TopicRecord,
    TransactionRecord,
)
from icelog.table.field_ids import TableColumn

try:
    import psycopg
    import psycopg.types.json
    from psycopg import errors as pg_errors
    from psycopg_pool import ConnectionPool, PoolTimeout
except ImportError as exc:  # pragma: no cover - a dependency of icelog; missing only in a broken install
    raise StoreError(
        "meta_url=postgresql://… needs psycopg 3 and psycopg-pool: pip install 'psycopg[binary]' psycopg-pool"
    ) from exc

log = logging.getLogger(__name__)

T = TypeVar("T")

_ATTEMPTS = 3  # a method is tried this often on a broken connection or a serialisation failure
POOL_MIN, POOL_MAX = 2, 12  # the broker's loop, intake writer, fetch and retention threads, the coordinators
POOL_TIMEOUT_S = 3.0  # waiting for a pooled connection; past it (the database is down) StoreUnavailableError
# Once the database is known down, calls fail at once but for one connection attempt this often (with this
# libpq connect_timeout, its minimum): callers on the broker's event loop (the authorizer) must not stall it.
PROBE_INTERVAL_S = 0.5
PROBE_CONNECT_TIMEOUT_S = 2
CONNECT_TIMEOUT_S = 5  # libpq's connect_timeout unless the URL sets one

_CHUNK_COLUMNS = (
    "topic_id, partition, base_offset, end_offset, file_id, position, length, max_timestamp, ingest_timestamp"
)
# Chunks of partition %(t)s/%(p)s holding offsets at or past %(o)s: a primary-key range from the chunk
# holding %(o)s (chunks of a partition are contiguous and disjoint), whatever the index size.
_FROM_OFFSET = (
    "topic_id = %(t)s AND partition = %(p)s AND base_offset >= COALESCE((SELECT MAX(base_offset) "
    "FROM intake_chunks WHERE topic_id = %(t)s AND partition = %(p)s AND base_offset <= %(o)s), -1) "
    "AND end_offset > %(o)s"
)
# The group commit in one statement: index the chunks of live partitions not yet indexed (idempotent), add
# them to their partitions' totals, move high watermarks, record the tail.
_COMMIT_INTAKE = """
WITH rows AS (
    SELECT * FROM unnest(%(t)s::uuid[], %(p)s::int[], %(base)s::bigint[], %(end)s::bigint[], %(file)s::bigint[],
                         %(pos)s::bigint[], %(len)s::bigint[], %(ts)s::bigint[], %(ingest)s::bigint[])
        AS r(topic_id, partition, base_offset, end_offset, file_id, position, length, max_timestamp, ingest_timestamp)
), added AS (
    INSERT INTO intake_chunks (topic_id, partition, base_offset, end_offset, file_id, position, length,
                               max_timestamp, ingest_timestamp)
    SELECT r.* FROM rows r JOIN partitions p ON p.topic_id = r.topic_id AND p.partition = r.partition
    WHERE p.log_start_offset < r.end_offset
    ON CONFLICT (topic_id, partition, base_offset) DO NOTHING
    RETURNING topic_id, partition, length
), counted AS (
    SELECT topic_id, partition, COUNT(*) AS n, SUM(length) AS bytes FROM added GROUP BY topic_id, partition
), ends AS (
    SELECT topic_id, partition, MAX(end_offset) AS end_offset FROM rows GROUP BY topic_id, partition
), moved AS (
    UPDATE partitions p SET high_watermark = GREATEST(p.high_watermark, e.end_offset),
        intake_chunks = p.intake_chunks + COALESCE(c.n, 0), intake_bytes = p.intake_bytes + COALESCE(c.bytes, 0)
    FROM ends e LEFT JOIN counted c ON c.topic_id = e.topic_id AND c.partition = e.partition
    WHERE p.topic_id = e.topic_id AND p.partition = e.partition
)
INSERT INTO intake_tail VALUES (0, %(tail_file)s, %(tail_pos)s)
ON CONFLICT (id) DO UPDATE SET file_id = excluded.file_id, position = excluded.position
"""
_TRIM_INTAKE = """
WITH dropped AS (
    DELETE FROM intake_chunks WHERE topic_id = %(t)s AND partition = %(p)s AND end_offset <= %(o)s RETURNING length
)
UPDATE partitions SET log_start_offset = GREATEST(log_start_offset, %(o)s),
    intake_chunks = intake_chunks - (SELECT COUNT(*) FROM dropped),
    intake_bytes = intake_bytes - (SELECT COALESCE(SUM(length), 0) FROM dropped)
WHERE topic_id = %(t)s AND partition = %(p)s
"""
_TOPIC_QUERY = (
    "SELECT t.name, t.topic_id, t.partitions, "
    "COALESCE(json_object_agg(c.key, c.value) FILTER (WHERE c.key IS NOT NULL), '{}'::json) "
    "FROM topics t LEFT JOIN topic_configs c ON c.topic_id = t.topic_id"
)


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


class PostgresStore(PostgresRegistry, PostgresSecurity, MetadataStore):
    """The metadata in one PostgreSQL database (or the first schema of the URL's search_path)."""

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
            raise self._unavailable(exc) from None
        except psycopg.Error as exc:
            raise StoreError(f"metadata store at {self._where}: {_first_line(exc)}") from None
        self._url, self._kwargs = url, kwargs
        self._pool = self._new_pool()
        try:
            self._pool.open(wait=True, timeout=POOL_TIMEOUT_S + CONNECT_TIMEOUT_S)
        except PoolTimeout as exc:
            self._pool.close()
            raise self._unavailable(exc) from None
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
                self._down = str(self._unavailable(exc))
                raise StoreUnavailableError(self._down) from None
            old, self._pool = self._pool, self._new_pool()
            self._pool.open(wait=False)
            self._down = None
            log.warning("metadata store at %s answers again", self._where)
        old.close(timeout=1.0)  # callers still holding its connections are answered by the new one on retry

    def _unavailable(self, exc: BaseException) -> StoreUnavailableError:
        return StoreUnavailableError(f"metadata store at {self._where} unavailable: {_first_line(exc)}")

    # -- running statements ----------------------------------------------------------------------
    def _run(self, work: Callable[[Connection], T], *, transaction: bool = True, idempotent: bool = False) -> T:
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
                with self._pool.connection() as conn:
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
                        self._down = str(self._unavailable(exc))
                        self._next_probe = time.monotonic() + PROBE_INTERVAL_S
                    raise StoreUnavailableError(self._down) from None
            except (psycopg.OperationalError, psycopg.InterfaceError) as exc:
                failure = exc
                if committing and not idempotent:
                    raise self._unavailable(exc) from None
                self._check_pool()
            except psycopg.Error as exc:
                raise StoreError(f"metadata store at {self._where}: {_first_line(exc)}") from None
        assert failure is not None
        if isinstance(failure, psycopg.OperationalError | psycopg.InterfaceError):
            raise self._unavailable(failure) from None
        raise StoreError(f"metadata store at {self._where}: {_first_line(failure)}")

    def _check_pool(self) -> None:
        """Drop pooled connections that are broken (after a database restart every idle one is)."""
        with contextlib.suppress(psycopg.Error):
            self._pool.check()

    def _rows(self, query: str, args: Mapping[str, Any] | tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        """The rows of one read (autocommit: it sees everything committed before it)."""
        return self._run(lambda conn: conn.execute(query, args).fetchall(), transaction=False, idempotent=True)

    def _row(self, query: str, args: Mapping[str, Any] | tuple[Any, ...] = ()) -> tuple[Any, ...] | None:
        rows = self._rows(query, args)
        return rows[0] if rows else None

    def _statement(self, query: str, args: Mapping[str, Any] | tuple[Any, ...] = (), idempotent: bool = True) -> int:
        """One write statement, its own transaction; the rows it changed."""
        return self._run(lambda conn: conn.execute(query, args).rowcount, transaction=False, idempotent=idempotent)

    # -- topics --------------------------------------------------------------------------------
    @staticmethod
    def _topic(conn: Connection, name: str, lock: bool = False) -> TopicRecord | None:
        # lock: the topic row, so concurrent changes of one topic run one after the other
        if lock and conn.execute("SELECT 1 FROM topics WHERE name = %s FOR UPDATE", (name,)).fetchone() is None:
            return None
        row = conn.execute(f"{_TOPIC_QUERY} WHERE t.name = %s GROUP BY t.name, t.topic_id", (name,)).fetchone()
        return None if row is None else TopicRecord(row[0], row[1], row[2], dict(row[3]))

    def _require(self, conn: Connection, name: str, lock: bool = False) -> TopicRecord:
        topic = self._topic(conn, name, lock)
        if topic is None:
            raise UnknownTopicError(f"topic {name!r} does not exist")
        return topic

    def create_topic(self, name: str, partitions: int, configs: Mapping[str, str]) -> TopicRecord:
        if partitions < 1:
            raise StoreError("a topic needs at least one partition")
        topic_id = uuid.uuid4()

        def work(conn: Connection) -> TopicRecord:
            inserted = conn.execute(
                "INSERT INTO topics VALUES (%s, %s, %s) ON CONFLICT (name) DO NOTHING", (name, topic_id, partitions)
            ).rowcount
            if not inserted:
                raise TopicExistsError(f"topic {name!r} already exists")
            with conn.cursor() as cur:
                cur.executemany("INSERT INTO topic_configs VALUES (%s, %s, %s)",
                                [(topic_id, k, v) for k, v in configs.items()])
                cur.executemany("INSERT INTO partitions (topic_id, partition) VALUES (%s, %s)",
                                [(topic_id, p) for p in range(partitions)])
            return TopicRecord(name, topic_id, partitions, dict(configs))

        return self._run(work)

    def delete_topic(self, name: str) -> TopicRecord:
        def work(conn: Connection) -> TopicRecord:
            topic = self._require(conn, name, lock=True)
            conn.execute("DELETE FROM topics WHERE topic_id = %s", (topic.topic_id,))
            for table in ("topic_configs", "partitions", "intake_chunks", "archive_state", "producer_snapshots"):
                conn.execute(f"DELETE FROM {table} WHERE topic_id = %s", (topic.topic_id,))
            return topic

        return self._run(work)

    def add_partitions(self, name: str, total: int) -> TopicRecord:
        def work(conn: Connection) -> TopicRecord:
            topic = self._require(conn, name, lock=True)
            if total <= topic.partitions:
                raise StoreError(f"topic {name!r} has {topic.partitions} partitions; {total} is not more")
            conn.execute("UPDATE topics SET partitions = %s WHERE name = %s", (total, name))
            with conn.cursor() as cur:
                cur.executemany("INSERT INTO partitions (topic_id, partition) VALUES (%s, %s)",
                                [(topic.topic_id, p) for p in range(topic.partitions, total)])
            return self._require(conn, name)

        return self._run(work)

    def alter_topic_configs(
        self, name: str, set_configs: Mapping[str, str], delete_keys: Iterable[str] = ()
    ) -> TopicRecord:
        delete_keys = list(delete_keys)

        def work(conn: Connection) -> TopicRecord:
            topic = self._require(conn, name, lock=True)
            with conn.cursor() as cur:
                cur.executemany("DELETE FROM topic_configs WHERE topic_id = %s AND key = %s",
                                [(topic.topic_id, k) for k in delete_keys])
                cur.executemany(
                    "INSERT INTO topic_configs VALUES (%s, %s, %s) ON CONFLICT (topic_id, key) "
                    "DO UPDATE SET value = excluded.value",
                    [(topic.topic_id, k, v) for k, v in set_configs.items()],
                )
            return self._require(conn, name)

        return self._run(work)

    def get_topic(self, name: str) -> TopicRecord | None:
        return self._run(lambda conn: self._topic(conn, name), transaction=False, idempotent=True)

    def list_topics(self) -> list[TopicRecord]:
        rows = self._rows(f"{_TOPIC_QUERY} GROUP BY t.name, t.topic_id ORDER BY t.name")
        return [TopicRecord(r[0], r[1], r[2], dict(r[3])) for r in rows]

    # -- partitions ----------------------------------------------------------------------------
    def partitions(self, topic_id: uuid.UUID) -> list[PartitionRecord]:
        rows = self._rows(
            "SELECT partition, log_start_offset, high_watermark, intake_chunks, intake_bytes, retention_start_offset "
            "FROM partitions WHERE topic_id = %s ORDER BY partition",
            (topic_id,),
        )
        return [PartitionRecord(topic_id, *row) for row in rows]

    def move_retention_start(self, topic_id: uuid.UUID, partition: int, offset: int) -> None:
        self._statement(
            "UPDATE partitions SET retention_start_offset = GREATEST(retention_start_offset, %s) "
            "WHERE topic_id = %s AND partition = %s",
            (offset, topic_id, partition),
        )

    # -- intake index --------------------------------------------------------------------------
    def commit_intake(self, chunks: Iterable[IntakeChunk], tail: IntakeTail) -> None:
        now_ms = int(time.time() * 1000)  # the ingest time of the records: they are durable now
        chunks = list(chunks)
        args = {
            "t": [c.topic_id for c in chunks], "p": [c.partition for c in chunks],
            "base": [c.base_offset for c in chunks], "end": [c.end_offset for c in chunks],
            "file": [c.file_id for c in chunks], "pos": [c.position for c in chunks],
            "len": [c.length for c in chunks], "ts": [c.max_timestamp for c in chunks],
            "ingest": [c.ingest_timestamp if c.ingest_timestamp >= 0 else now_ms for c in chunks],
            "tail_file": tail.file_id, "tail_pos": tail.position,
        }
        # One statement (one round trip, one commit); idempotent, so retried even when its commit went unanswered.
        self._statement(_COMMIT_INTAKE, args)

    def intake_tail(self) -> IntakeTail | None:
        row = self._row("SELECT file_id, position FROM intake_tail WHERE id = 0")
        return IntakeTail(*row) if row else None

    def intake_chunks(self, topic_id: uuid.UUID | None = None) -> list[IntakeChunk]:
        if topic_id is None:
            return self._chunks(f"SELECT {_CHUNK_COLUMNS} FROM intake_chunks ORDER BY topic_id, partition, base_offset")
        return self._chunks(
            f"SELECT {_CHUNK_COLUMNS} FROM intake_chunks WHERE topic_id = %(t)s ORDER BY partition, base_offset",
            {"t": topic_id},
        )

    def intake_chunks_after(
        self, topic_id: uuid.UUID, partition: int, offset: int, limit: int
    ) -> list[IntakeChunk]:
        return self._chunks(
            f"SELECT {_CHUNK_COLUMNS} FROM intake_chunks WHERE {_FROM_OFFSET} ORDER BY base_offset LIMIT %(n)s",
            {"t": topic_id, "p": partition, "o": offset, "n": limit},
        )

    def intake_last_chunks(self, topic_id: uuid.UUID, partition: int, limit: int) -> list[IntakeChunk]:
        rows = self._chunks(
            f"SELECT {_CHUNK_COLUMNS} FROM intake_chunks WHERE topic_id = %(t)s AND partition = %(p)s "
            "ORDER BY base_offset DESC LIMIT %(n)s",
            {"t": topic_id, "p": partition, "n": limit},
        )
        rows.reverse()
        return rows

    def intake_chunks_by_time(
        self, topic_id: uuid.UUID, partition: int, offset: int, timestamp_ms: int, limit: int
    ) -> list[IntakeChunk]:
        return self._chunks(
            f"SELECT {_CHUNK_COLUMNS} FROM intake_chunks WHERE {_FROM_OFFSET} AND max_timestamp >= %(ts)s "
            "ORDER BY base_offset LIMIT %(n)s",
            {"t": topic_id, "p": partition, "o": offset, "n": limit, "ts": timestamp_ms},
        )

    def intake_max_timestamp_chunk(self, topic_id: uuid.UUID, partition: int) -> IntakeChunk | None:
        rows = self._chunks(
            f"SELECT {_CHUNK_COLUMNS} FROM intake_chunks WHERE topic_id = %(t)s AND partition = %(p)s "
            "ORDER BY max_timestamp DESC, base_offset LIMIT 1",
            {"t": topic_id, "p": partition},
        )
        return rows[0] if rows else None

    def intake_range_summary(self, topic_id: uuid.UUID, partition: int, offset: int) -> IntakeRangeSummary:
        row = self._row(
            "SELECT COUNT(*), COALESCE(SUM(length), 0), "
            "MIN(CASE WHEN ingest_timestamp >= 0 THEN ingest_timestamp ELSE max_timestamp END) "
            f"FROM intake_chunks WHERE {_FROM_OFFSET}",
            {"t": topic_id, "p": partition, "o": offset},
        )
        assert row is not None
        return IntakeRangeSummary(int(row[0]), int(row[1]), -1 if row[2] is None else int(row[2]))

    def intake_bytes_below(self, topic_id: uuid.UUID, partition: int, offset: int) -> int:
        row = self._row(
            "SELECT COALESCE(SUM(length), 0) FROM intake_chunks WHERE topic_id = %(t)s AND partition = %(p)s "
            "AND base_offset < %(o)s AND end_offset <= %(o)s",
            {"t": topic_id, "p": partition, "o": offset},
        )
        return int(row[0]) if row else 0

    def intake_files_in_use(self, file_ids: Iterable[int]) -> set[int]:
        # One look-up of the file_id index per file: there are few files, many chunks.
        rows = self._rows(
            "SELECT f FROM unnest(%s::bigint[]) AS f "
            "WHERE EXISTS (SELECT 1 FROM intake_chunks WHERE file_id = f)",
            (list(file_ids),),
        )
        return {int(r[0]) for r in rows}

    def _chunks(self, query: str, args: Mapping[str, Any] | tuple[Any, ...] = ()) -> list[IntakeChunk]:
        return [IntakeChunk(*row) for row in self._rows(query, args)]

    def trim_intake(self, topic_id: uuid.UUID, partition: int, log_start_offset: int) -> None:
        # Durable when it returns: intake files are deleted right after a trim, and must never be gone while indexed.
        self._statement(_TRIM_INTAKE, {"t": topic_id, "p": partition, "o": log_start_offset})

    # -- archive state -------------------------------------------------------------------------
    def archive_states(self, topic_id: uuid.UUID | None = None) -> list[ArchiveState]:
        query = (
            "SELECT topic_id, partition, archived_offset, last_commit_ms, last_error, last_error_ms, dead_letters "
            "FROM archive_state"
        )
        if topic_id is None:
            rows = self._rows(query + " ORDER BY topic_id, partition")
        else:
            rows = self._rows(query + " WHERE topic_id = %s ORDER BY partition", (topic_id,))
        return [ArchiveState(*row) for row in rows]

    def _upsert_many(self, query: str, rows: list[Any]) -> None:
        """One statement for many rows, all in one transaction."""
        def work(conn: Connection) -> None:
            with conn.cursor() as cur:
                cur.executemany(query, rows)

        if rows:
            self._run(work, idempotent=True)

    def record_archive(
        self, topic_id: uuid.UUID, archived_offsets: Mapping[int, int], commit_ms: int
    ) -> None:
        self._upsert_many(
            "INSERT INTO archive_state (topic_id, partition, archived_offset, last_commit_ms) "
            "SELECT %(t)s, %(p)s, %(o)s, %(ms)s WHERE EXISTS (SELECT 1 FROM topics WHERE topic_id = %(t)s) "
            "ON CONFLICT (topic_id, partition) DO UPDATE SET "
            "archived_offset = GREATEST(archive_state.archived_offset, excluded.archived_offset), "
            "last_commit_ms = GREATEST(archive_state.last_commit_ms, excluded.last_commit_ms), "
            "last_error = '', last_error_ms = -1",
            [{"t": topic_id, "p": p, "o": o, "ms": commit_ms} for p, o in archived_offsets.items()],
        )

    def record_dead_letters(self, topic_id: uuid.UUID, counts: Mapping[int, int]) -> None:
        self._upsert_many(
            "INSERT INTO archive_state (topic_id, partition, dead_letters) "
            "SELECT %(t)s, %(p)s, %(n)s WHERE EXISTS (SELECT 1 FROM topics WHERE topic_id = %(t)s) "
            "ON CONFLICT (topic_id, partition) DO UPDATE SET dead_letters = excluded.dead_letters",
            [{"t": topic_id, "p": p, "n": n} for p, n in counts.items()],
        )

    def record_archive_error(
        self, topic_id: uuid.UUID, partitions: Iterable[int], error: str, at_ms: int
    ) -> None:
        self._upsert_many(
            "INSERT INTO archive_state (topic_id, partition, last_error, last_error_ms) "
            "SELECT %(t)s, %(p)s, %(e)s, %(ms)s WHERE EXISTS (SELECT 1 FROM topics WHERE topic_id = %(t)s) "
            "ON CONFLICT (topic_id, partition) DO UPDATE SET "
            "last_error = excluded.last_error, last_error_ms = excluded.last_error_ms",
            [{"t": topic_id, "p": p, "e": error[:2000], "ms": at_ms} for p in partitions],
        )

    # -- consumer groups ---------------------------------------------------------------------------
    def commit_offsets(self, group_id: str, offsets: GroupOffsets) -> None:
        self._upsert_many(
            "INSERT INTO group_offsets VALUES (%s, %s, %s, %s, %s, %s) ON CONFLICT (group_id, topic, partition) "
            "DO UPDATE SET committed_offset = excluded.committed_offset, metadata = excluded.metadata, "
            "commit_timestamp = excluded.commit_timestamp",
            [(group_id, t, p, o.offset, o.metadata, o.commit_timestamp) for (t, p), o in offsets.items()],
        )

    def committed_offsets(self, group_id: str) -> GroupOffsets:
        rows = self._rows(
            "SELECT topic, partition, committed_offset, metadata, commit_timestamp FROM group_offsets "
            "WHERE group_id = %s ORDER BY topic, partition",
            (group_id,),
        )
        return {(t, p): CommittedOffset(o, m, ts) for t, p, o, m, ts in rows}

    def offset_groups(self) -> list[str]:
        return [r[0] for r in self._rows("SELECT DISTINCT group_id FROM group_offsets ORDER BY 1")]

    def delete_offsets(self, group_id: str, partitions: Iterable[tuple[str, int]] | None = None) -> None:
        if partitions is None:
            self._statement("DELETE FROM group_offsets WHERE group_id = %s", (group_id,))
            return
        self._upsert_many(
            "DELETE FROM group_offsets WHERE group_id = %s AND topic = %s AND partition = %s",
            [(group_id, t, p) for t, p in partitions],
        )

    # -- archive table columns -------------------------------------------------------------------
    def table_columns(self, table: str) -> list[TableColumn]:
        rows = self._rows(
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

        self._run(work, idempotent=True)

    # -- table maintenance ---------------------------------------------------------------------------
    def record_maintenance(self, record: MaintenanceRecord) -> None:
        self._statement(
            "INSERT INTO table_maintenance VALUES (%s, %s, %s, %s, %s, %s, %s) ON CONFLICT (table_name) DO UPDATE SET "
            "finished_ms = excluded.finished_ms, duration_ms = excluded.duration_ms, outcome = excluded.outcome, "
            "summary = excluded.summary, data_files_after = excluded.data_files_after, "
            "orphans_checked_ms = excluded.orphans_checked_ms",
            (record.table, record.finished_ms, record.duration_ms, record.outcome, record.summary,
             record.data_files_after, record.orphans_checked_ms),
        )

    def maintenance_records(self) -> dict[str, MaintenanceRecord]:
        rows = self._rows(
            "SELECT table_name, finished_ms, duration_ms, outcome, summary, data_files_after, orphans_checked_ms "
            "FROM table_maintenance"
        )
        return {row[0]: MaintenanceRecord(*row) for row in rows}

    # -- producers and transactions ----------------------------------------------------------------
    def allocate_producer_ids(self, count: int) -> int:
        if count < 1:
            raise StoreError("allocate at least one producer id")
        # One statement: the row lock serialises allocators. A retry after an unanswered commit skips a block,
        # which is harmless (ids are never reused either way).
        row = self._run(
            lambda conn: conn.execute(
                "UPDATE producer_ids SET next_producer_id = next_producer_id + %(n)s WHERE id = 0 "
                "RETURNING next_producer_id - %(n)s", {"n": count},
            ).fetchone(),
            transaction=False, idempotent=True,
        )
        assert row is not None, "producer_ids is seeded by the schema"
        return int(row[0])

    def save_transaction(self, record: TransactionRecord) -> None:
        detail = {
            "partitions": [list(tp) for tp in record.partitions],
            "pending_offsets": {
                group: [[t, p, o.offset, o.metadata, o.commit_timestamp] for (t, p), o in offsets.items()]
                for group, offsets in record.pending_offsets.items()
            },
        }
        self._statement(
            "INSERT INTO transactions VALUES (%s, %s, %s, %s, %s, %s) ON CONFLICT (transactional_id) DO UPDATE SET "
            "producer_id = excluded.producer_id, producer_epoch = excluded.producer_epoch, "
            "timeout_ms = excluded.timeout_ms, state = excluded.state, detail = excluded.detail",
            (record.transactional_id, record.producer_id, record.producer_epoch, record.timeout_ms, record.state,
             psycopg.types.json.Jsonb(detail)),
        )

    def transactions(self) -> list[TransactionRecord]:
        rows = self._rows(
            "SELECT transactional_id, producer_id, producer_epoch, timeout_ms, state, detail FROM transactions "
            "ORDER BY transactional_id"
        )
        out = []
        for txn_id, pid, epoch, timeout_ms, state, data in rows:
            pending = {
                group: {(t, p): CommittedOffset(o, m, ts) for t, p, o, m, ts in entries}
                for group, entries in data["pending_offsets"].items()
            }
            partitions = tuple((t, p) for t, p in data["partitions"])
            out.append(TransactionRecord(txn_id, pid, epoch, timeout_ms, state, partitions, pending))
        return out

    # -- producer-state snapshots ------------------------------------------------------------------
    def save_producer_snapshots(self, snapshots: Iterable[ProducerSnapshot]) -> None:
        self._upsert_many(
            "INSERT INTO producer_snapshots SELECT %(t)s, %(p)s, %(o)s, %(s)s "
            "WHERE EXISTS (SELECT 1 FROM partitions WHERE topic_id = %(t)s AND partition = %(p)s) "
            "ON CONFLICT (topic_id, partition) DO UPDATE SET snapshot_offset = excluded.snapshot_offset, "
            "state = excluded.state WHERE excluded.snapshot_offset >= producer_snapshots.snapshot_offset",
            [{"t": s.topic_id, "p": s.partition, "o": s.offset, "s": s.state} for s in snapshots],
        )

    def producer_snapshots(self) -> list[ProducerSnapshot]:
        rows = self._rows(
            "SELECT topic_id, partition, snapshot_offset, state FROM producer_snapshots ORDER BY topic_id, partition"
        )
        return [ProducerSnapshot(*row) for row in rows]

    # -- locks among processes -----------------------------------------------------------------------
    def try_lock(self, name: str, shared: bool = False) -> AdvisoryLock | None:
        """A session-level advisory lock on a connection of its own, held until released: PostgreSQL lets go
        when that connection ends (the holder died, or the network between them did)."""
        try:
            conn = psycopg.connect(self._url, **{**self._kwargs, "application_name": f"icelog lock {name}"[:63]})
        except psycopg.Error as exc:
            raise self._unavailable(exc) from None
        try:
            taking = "pg_try_advisory_lock_shared" if shared else "pg_try_advisory_lock"
            row = conn.execute(f"SELECT {taking}(hashtextextended(%s, 0))", (LOCK_PREFIX + name,)).fetchone()
        except psycopg.Error as exc:
            conn.close()
            raise self._unavailable(exc) from None
        if not row or not row[0]:
            conn.close()
            return None
        return AdvisoryLock(conn)

    def close(self) -> None:
        if not getattr(self, "_closed", True):
            self._closed = True
            self._pool.close()
