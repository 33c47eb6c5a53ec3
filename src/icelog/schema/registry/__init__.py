"""The embedded Confluent-compatible schema registry: REST server, service logic, compatibility rules."""
