"""Opening the metadata store a URL names: the one place that knows every backend."""

from __future__ import annotations

from icelog.errors import ConfigError
from icelog.meta.store import MetadataStore


def open_store(url: str) -> MetadataStore:
    """Open the metadata store a URL names (sqlite:///path, postgresql://user:password@host:port/database)."""
    if url.startswith("sqlite:///"):
        from icelog.meta.sqlite import SqliteStore

        return SqliteStore(url.removeprefix("sqlite:///"))
    if url.startswith(("postgresql://", "postgres://")):
        from icelog.meta.postgres import PostgresStore

        return PostgresStore(url)
    shown = url.split("://", 1)[0] + "://…" if "://" in url else url  # the rest may hold a password
    raise ConfigError(
        f"unsupported metadata store URL {shown!r}; use sqlite:///PATH or postgresql://USER:PASSWORD@HOST:PORT/DATABASE"
    )

