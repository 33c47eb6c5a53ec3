"""The table spec: what an icelog Iceberg table is, with no engine behind it.

The record and table layouts (`layout.py`: columns, partition spec, sort order, properties, snapshot-summary
keys), the table configs and system columns (`config.py`), schema → Iceberg type mapping (`iceberg_types.py`),
field-ID allocation and evolution (`field_ids.py`), and the partition and bucket rules (`rules.py`). Nothing
here imports Spark, py4j or a catalog; pyiceberg and pyarrow are used for their types and transforms only.
Every layer may import this package; it imports none of icelog's but `errors`.
"""
