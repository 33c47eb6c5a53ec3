"""One module per group of Kafka APIs; importing this package registers every handler."""

from icelog.wire.handlers import acls, admin, fetch, groups, metadata, produce, transactions, users  # noqa: F401
