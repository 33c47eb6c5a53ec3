"""Iceberg table layouts, catalog configuration and the Spark session factory.

Nothing here imports pyspark at module import time: the broker uses `lake.topic_config` for retention.
"""
