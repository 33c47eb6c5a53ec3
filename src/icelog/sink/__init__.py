"""Sinks: topics of external Kafka clusters archived into icelog's Iceberg tables (`icelog sink`)."""
