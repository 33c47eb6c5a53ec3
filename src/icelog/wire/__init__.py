"""The Kafka wire layer: framing, request dispatch and API handlers. Knows nothing of Iceberg or Spark."""
