"""The archive tables as pyiceberg sees them: the catalog the archiver writes, tables refreshed at most every second.

Only catalogs pyiceberg can open exactly as Spark does are read back: the embedded JDBC catalog on SQLite
(pyiceberg's SqlCatalog reads the same `iceberg_tables` rows) and REST. For any other catalog (a JDBC
PostgreSQL one, Hadoop) read-back is off: consumers read the intake only, and the intake is not trimmed.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from icelog.config import Settings
from icelog.lake.catalog import pyiceberg_catalog_opener

log = logging.getLogger(__name__)

REFRESH_S = 1.0  # a table's snapshot is looked up again at most this often (unless a read needs newer data)


def catalog_opener(settings: Settings) -> Callable[[], Any | None] | None:
    """A function opening a pyiceberg catalog onto the archiver's (None until it exists), or None: read-back off."""
    opener = pyiceberg_catalog_opener(settings)
    if opener is None:
        log.warning(
            "read-back is off: the %s catalog %s cannot be read by the broker (only the embedded SQLite JDBC "
            "catalog and REST are); consumers read the intake only and archived intake is kept",
            settings.archive.catalog_type, settings.catalog_uri,
        )
    return opener


@dataclass
class _Loaded:
    table: Any | None
    at: float


class LakeTables:
    """Tables of one catalog by (namespace, name); thread-safe; a table is reloaded at most every REFRESH_S."""

    def __init__(self, opener: Callable[[], Any | None]) -> None:
        self._opener = opener
        self.catalog: Any | None = None
        self._tables: dict[tuple[str, str], _Loaded] = {}
        self._lock = threading.Lock()

    def table(self, identifier: tuple[str, str], fresh: bool = False) -> Any | None:
        """The table's current version (None while it does not exist); `fresh` reloads unless just reloaded."""
        from pyiceberg.exceptions import NoSuchTableError

        now = time.monotonic()
        with self._lock:
            loaded = self._tables.get(identifier)
        max_age = 0.05 if fresh else REFRESH_S
        if loaded is not None and now - loaded.at < max_age:
            return loaded.table
        try:
            if self.catalog is None:
                self.catalog = self._opener()
            table = None if self.catalog is None else self.catalog.load_table(identifier)
        except NoSuchTableError:
            table = None
        except Exception:
            if loaded is None:
                raise
            log.exception("reloading table %s failed; serving the version loaded before", ".".join(identifier))
            table = loaded.table
        with self._lock:
            self._tables[identifier] = _Loaded(table, now)
        return table
