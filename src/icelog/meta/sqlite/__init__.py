"""The metadata store in SQLite (the embedded default): `SqliteStore`, one module per slice of the interface."""

from icelog.meta.sqlite.store import SqliteStore

__all__ = ["SqliteStore"]
