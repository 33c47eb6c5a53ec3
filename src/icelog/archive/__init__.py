"""The Spark jobs: archive intake into Iceberg tables (append and upsert), maintenance and reconciliation
from the tables themselves."""
