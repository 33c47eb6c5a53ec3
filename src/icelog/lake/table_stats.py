"""Archive table sizes from Iceberg metadata with pyiceberg: no Spark, no data file read (`icelog status --tables`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from icelog.config import Settings
from icelog.errors import ConfigError
from icelog.lake.catalog import pyiceberg_catalog_opener
from icelog.table.layout import PRIMARY_KEY_PROPERTY

if TYPE_CHECKING:
    from pyiceberg.catalog import Catalog


@dataclass(frozen=True)
class TableStats:
    """A table's current snapshot in numbers."""

    data_files: int
    delete_files: int
    data_bytes: int
    records: int  # live rows (deleted positions not counted)
    snapshots: int
    table_uuid: str = ""
    snapshot_id: int | None = None  # the current snapshot
    primary_key: str = ""  # an upsert table's key columns (icelog.primary-key), "" for an append table

    @property
    def average_file_bytes(self) -> int:
        return self.data_bytes // self.data_files if self.data_files else 0


def open_catalog(settings: Settings) -> Catalog | None:
    """A pyiceberg catalog on the archiver's catalog (JDBC on SQLite or PostgreSQL, or REST); None before the
    embedded one exists."""
    opener = pyiceberg_catalog_opener(settings)
    if opener is None:
        raise ConfigError(
            f"table statistics read the catalog with pyiceberg, which supports JDBC (SQLite, PostgreSQL) and REST "
            f"catalogs, not {settings.archive.catalog_type}; use `icelog sql` on the table's metadata tables"
        )
    return opener()


def table_stats(catalog: Catalog | None, namespace: str, table: str) -> TableStats | None:
    """The table's numbers (None if it, or the catalog, does not exist yet)."""
    from pyiceberg.exceptions import NoSuchTableError

    if catalog is None:
        return None
    try:
        loaded = catalog.load_table((namespace, table))
    except NoSuchTableError:
        return None
    snapshot = loaded.metadata.current_snapshot()
    summary = {} if snapshot is None or snapshot.summary is None else dict(snapshot.summary.additional_properties)
    data_bytes = int(summary.get("total-files-size", 0))
    return TableStats(
        data_files=int(summary.get("total-data-files", 0)),
        delete_files=int(summary.get("total-delete-files", 0)),
        data_bytes=data_bytes,
        # Live rows: the rows of the data files less those their deletion vectors (or position deletes) delete.
        records=int(summary.get("total-records", 0)) - int(summary.get("total-position-deletes", 0)),
        snapshots=len(loaded.metadata.snapshots),
        table_uuid=str(loaded.metadata.table_uuid),
        snapshot_id=None if snapshot is None else int(snapshot.snapshot_id),
        primary_key=loaded.properties.get(PRIMARY_KEY_PROPERTY, ""),
    )
