"""Opening the metadata store a URL names: the one place that knows every backend."""

from __future__ import annotations

from icelog.errors import ConfigError
from icelog.meta.store import MetadataStore


def open_store(url: str) -> MetadataStore:
    """Open the metadata store a URL names (sqlite:///path)."""
    if url.startswith("sqlite:///"):
        from icelog.meta.sqlite import SqliteStore

        return SqliteStore(url.removeprefix("sqlite:///"))
    raise ConfigError(f"unsupported metadata store URL {url!r}; use sqlite:///PATH")

