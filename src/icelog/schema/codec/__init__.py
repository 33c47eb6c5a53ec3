"""Payloads ↔ table rows: decoding a side (key or value) with its schema in Spark's workers, and rebuilding the
bytes a consumer read from a row (archive and read-back share it); where the schemas come from."""
