"""A Kafka protocol client of icelog's own: the archive tasks read stored record batches over it, unchanged."""
