"""icelog: Kafka-compatible streaming storage whose long-term history is Apache Iceberg."""

__version__ = "0.1.0"
