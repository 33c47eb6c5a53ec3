"""One module per group of Kafka APIs; importing this package registers every handler."""

from icelog.wire.handlers import admin, fetch, groups, metadata, produce, sasl, transactions  # noqa: F401
