"""One module per group of Kafka APIs; importing this package registers every handler."""

from icelog.wire.handlers import (  # noqa: F401
    acls,
    admin,
    consumer_groups,
    fetch,
    groups,
    log_dirs,
    metadata,
    produce,
    records_admin,
    sasl,
    transactions,
    txn_admin,
    users,
)
