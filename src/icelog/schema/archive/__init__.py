"""The archive's payload decoding: Protobuf → Iceberg columns, field ids, decoding rows and rebuilding payloads."""
