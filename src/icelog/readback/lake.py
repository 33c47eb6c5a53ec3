"""The archive tables as pyiceberg sees them: the catalog the archiver writes, each table's plan (readback/plan.py)
checked for a new commit at most every second.

A check is cheap when nothing changed: on the embedded SQLite catalog one query reads every table's current metadata
file (a table whose file is the planned one is not even loaded); on REST the table is loaded and its metadata file
compared. A changed table is planned once for all its partitions, incrementally after appends.

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
from typing import TYPE_CHECKING

from icelog.config import Settings
from icelog.lake.catalog import pyiceberg_catalog_opener, sqlite_catalog_path, sqlite_metadata_locations
from icelog.readback.plan import NO_TABLE, TablePlan, plan_table

if TYPE_CHECKING:
    from pyiceberg.catalog import Catalog
    from pyiceberg.table import Table

log = logging.getLogger(__name__)

REFRESH_S = 1.0  # a table's snapshot is looked up again at most this often (unless a read needs newer data)
FRESH_S = 0.05  # ... and at most this often when a read asks past the plan

Identifier = tuple[str, str]
Locations = Callable[[], dict[Identifier, str]]


def catalog_opener(settings: Settings) -> Callable[[], Catalog | None] | None:
    """A function opening a pyiceberg catalog onto the archiver's (None until it exists), or None: read-back off."""
    opener = pyiceberg_catalog_opener(settings)
    if opener is None:
        log.warning(
            "read-back is off: the %s catalog cannot be read by the broker (JDBC on SQLite or PostgreSQL and REST "
            "can); consumers read the intake only and archived intake is kept", settings.archive.catalog_type,
        )
    return opener


def catalog_locations(settings: Settings) -> Locations | None:
    """A function reading every table's current metadata file in one query (the embedded SQLite catalog), or None."""
    path = sqlite_catalog_path(settings)
    if path is None:
        return None
    name = settings.archive.catalog_name
    return lambda: sqlite_metadata_locations(path, name)


@dataclass
class _Loaded:
    table: Table | None
    at: float


@dataclass(frozen=True)
class _Planned:
    plan: TablePlan
    at: float  # when the catalog was last asked whether the table changed (monotonic)


class _Unknown:
    """The table's metadata file is not known without loading the table (a REST catalog)."""


UNKNOWN = _Unknown()


class LakeTables:
    """Tables of one catalog by (namespace, name) and their plans; thread-safe; checked at most every REFRESH_S."""

    def __init__(self, opener: Callable[[], Catalog | None], locations: Locations | None = None) -> None:
        self._opener = opener
        self._locations = locations
        self.catalog: Catalog | None = None
        self._tables: dict[Identifier, _Loaded] = {}
        self._plans: dict[Identifier, _Planned] = {}
        self._planning: dict[Identifier, threading.Lock] = {}
        self._lock = threading.Lock()

    def plan(self, identifier: Identifier, fresh: bool = False) -> TablePlan:
        """The table's current plan; the catalog is asked again once the last answer is REFRESH_S old (`fresh`:
        FRESH_S, a read asking past the plan: the archiver may just have committed it)."""
        max_age = FRESH_S if fresh else REFRESH_S
        planned = self._plans.get(identifier)
        if planned is not None and time.monotonic() - planned.at < max_age:
            return planned.plan
        with self._planning_lock(identifier):
            planned = self._plans.get(identifier)
            if planned is not None and time.monotonic() - planned.at < max_age:
                return planned.plan  # another thread just asked
            return self._update(identifier, UNKNOWN if self._locations is None else self._locations().get(identifier))

    @property
    def planned_files(self) -> int:
        """Data files the current plans hold, over all tables (what they cost grows with the tables' files)."""
        return sum(len(planned.plan.files) for planned in list(self._plans.values()))

    def forget(self, kept: set[Identifier]) -> None:
        """Drop the plans and loaded versions of tables other than `kept` (their topics were deleted)."""
        with self._lock:
            for table in [i for i in self._plans if i not in kept]:
                del self._plans[table]
            for table in [i for i in self._tables if i not in kept]:
                del self._tables[table]

    def refresh(self, identifiers: set[Identifier]) -> None:
        """Ask once whether any of the tables changed (one query on SQLite) and re-plan those that did."""
        try:
            locations = None if self._locations is None else self._locations()
        except Exception:
            log.exception("read-back: reading the catalog's tables failed; will retry")
            return
        for identifier in identifiers:
            try:
                with self._planning_lock(identifier):
                    self._update(identifier, UNKNOWN if locations is None else locations.get(identifier))
            except Exception:
                log.exception("read-back: planning table %s failed; will retry", ".".join(identifier))

    def _planning_lock(self, identifier: Identifier) -> threading.Lock:
        with self._lock:
            return self._planning.setdefault(identifier, threading.Lock())

    def _update(self, identifier: Identifier, location: str | None | _Unknown) -> TablePlan:
        """The plan for the table's metadata file `location` (None: no table), re-planned only if it changed."""
        from pyiceberg.exceptions import NoSuchTableError

        now = time.monotonic()
        planned = self._plans.get(identifier)
        before = NO_TABLE if planned is None else planned.plan
        if planned is not None and location == before.location:
            self._plans[identifier] = _Planned(before, now)
            return before
        try:
            if self.catalog is None:
                self.catalog = self._opener()
            try:
                table = None if self.catalog is None else self.catalog.load_table(identifier)
            except NoSuchTableError:
                table = None
            loaded = None if table is None else table.metadata_location
            if planned is not None and loaded == before.location:
                plan = before
            else:
                started = time.perf_counter()
                plan = plan_table(table, loaded, before)
                log.debug("read-back: planned %s at snapshot %s (%s) in %.3fs", ".".join(identifier),
                          plan.snapshot_id, "full" if plan.appended is None else f"{plan.appended} files appended",
                          time.perf_counter() - started)
        except Exception:
            if planned is None:
                raise
            log.exception("read-back: planning table %s failed; serving the plan made before", ".".join(identifier))
            plan = before
        self._plans[identifier] = _Planned(plan, now)
        return plan

    def table(self, identifier: tuple[str, str], fresh: bool = False) -> Table | None:
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
