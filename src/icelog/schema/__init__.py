"""Schemas: the embedded schema registry, Protobuf descriptors, data enforcement, Protobuf → Iceberg."""
