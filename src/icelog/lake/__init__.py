"""The Spark, JVM and catalog boundary: catalog configuration, the Spark session factory and its Python
workers, the typed facade over Iceberg's Java API (py4j), table sizes and data files written with pyiceberg.

Nothing here imports pyspark at module import time. What a table *is* (layouts, types, field ids) lives in the
engine-free `icelog.table`; the Spark jobs that write tables live in `icelog.archive`.
"""
