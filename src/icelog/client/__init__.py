"""A Kafka protocol client of icelog's own: the archive tasks read stored record batches over it, unchanged, and
the sink's driver reads an external cluster's topics, offsets and group commits (cluster.SourceCluster)."""
