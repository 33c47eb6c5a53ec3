"""Read-back: serving Kafka Fetch and ListOffsets from the archived Iceberg tables (pyiceberg + pyarrow)."""
