"""Iceberg table layouts, catalog configuration and the Spark session factory.

Nothing here imports pyspark at module import time. Archive topic configs live in `icelog.topic_configs.archive`
(the broker's retention reads them too, and the log must not import the lake).
"""
