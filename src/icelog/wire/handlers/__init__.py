"""One module per group of Kafka APIs; importing this package registers every handler."""

from icelog.wire.handlers import (  # noqa: F401
    acls,
    admin,
    fetch,
    groups,
    metadata,
    produce,
    sasl,
    transactions,
    users,
)
