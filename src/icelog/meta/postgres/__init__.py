"""The metadata store in PostgreSQL (several brokers): `PostgresStore`, one module per slice of the interface."""

from icelog.meta.postgres.database import masked_url, server_of
from icelog.meta.postgres.store import PostgresStore

__all__ = ["PostgresStore", "masked_url", "server_of"]
