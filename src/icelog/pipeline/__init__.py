"""The Spark jobs: archive intake into Iceberg tables, with reconciliation from the tables themselves."""
