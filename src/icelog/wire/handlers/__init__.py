"""One module per group of Kafka APIs; importing this package registers every handler."""

from icelog.wire.handlers import admin, fetch, metadata, produce  # noqa: F401
