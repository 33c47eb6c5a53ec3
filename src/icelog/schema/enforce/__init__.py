"""Produce-time enforcement of topic schemas (coerce, reject on parse error)."""
