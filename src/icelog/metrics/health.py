"""/readyz: whether this broker can do its job now, each check with what is wrong in words."""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Callable
from dataclasses import dataclass

from pyiceberg.catalog import Catalog

from icelog.config import Settings
from icelog.errors import first_line
from icelog.lake.catalog import masked_url, pyiceberg_catalog_opener, sqlite_catalog_path
from icelog.log.manager import LogManager
from icelog.meta.store import ArchiveState, MetadataStore

CHECK_TIMEOUT_S = 5.0  # a check that takes longer (a hung store or catalog) fails


@dataclass(frozen=True)
class Check:
    ok: bool
    detail: str


class Readiness:
    """The checks behind /readyz: Kafka listener, metadata store, archiver, catalog, produce admitted."""

    def __init__(self, settings: Settings, store: MetadataStore, logs: LogManager,
                 kafka_serving: Callable[[], bool], archiver_alive: Callable[[], bool]) -> None:
        self.settings = settings
        self.store = store
        self.logs = logs
        self.kafka_serving = kafka_serving
        self.archiver_alive = archiver_alive
        self._catalog_seen = False  # once read, a missing embedded catalog is a lost one, not one not made yet
        self._opened: Catalog | None = None  # opened once (a SQL catalog holds a connection pool)

    async def checks(self) -> dict[str, Check]:
        """Every check's outcome (the store and catalog ones on worker threads, bounded by CHECK_TIMEOUT_S)."""
        out: dict[str, Check] = {}
        out["kafka_listener"] = (Check(True, "serving") if self.kafka_serving()
                                 else Check(False, "the Kafka listener is not serving"))
        states: list[ArchiveState] | None = None
        try:
            states = await asyncio.wait_for(asyncio.to_thread(self.store.archive_states), CHECK_TIMEOUT_S)
            out["metadata_store"] = Check(True, "reachable")
        except TimeoutError:
            out["metadata_store"] = Check(False, f"no answer within {CHECK_TIMEOUT_S:g} s")
        except Exception as exc:
            out["metadata_store"] = Check(False, f"{type(exc).__name__}: {first_line(exc)}")
        archiving = self.settings.archive.enabled
        if not archiving:
            out["archiver"] = Check(True, "disabled (archive.enabled=false)")
        elif self.archiver_alive():
            out["archiver"] = Check(True, "running")
        else:
            out["archiver"] = Check(False, "the archiver process is not running (the broker restarts it)")
        committed = states is not None and any(s.last_commit_ms >= 0 for s in states)
        try:
            out["catalog"] = await asyncio.wait_for(asyncio.to_thread(self._catalog, committed), CHECK_TIMEOUT_S)
        except TimeoutError:
            out["catalog"] = Check(False, f"the Iceberg catalog gave no answer within {CHECK_TIMEOUT_S:g} s")
        out["produce"] = self._produce()
        return out

    def _produce(self) -> Check:
        if self.logs.storage.unavailable is not None:
            return Check(False, f"refusing produce: {self.logs.storage.unavailable}")
        if self.logs.space_refusal is not None:
            return Check(False, f"refusing produce: {self.logs.space_refusal}")
        full = sorted(t.name for t in list(self.logs.topics.values())
                      if t.max_lag_bytes is not None and t.unarchived_bytes >= t.max_lag_bytes)
        if full:
            return Check(False, f"refusing produce to {', '.join(full)}: icelog.archive.max.lag.bytes of intake not "
                         "archived yet")
        return Check(True, "admitted")

    def _catalog(self, committed: bool) -> Check:
        """Whether the Iceberg catalog answers (one the broker cannot open itself passes)."""
        path = sqlite_catalog_path(self.settings)
        if path is not None:
            if not path.exists():
                if committed or self._catalog_seen:
                    return Check(False, f"the catalog database {path} is gone, though tables were committed to it")
                return Check(True, "not created yet (the archiver creates it with the first table)")
            try:
                db = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=CHECK_TIMEOUT_S)
                try:
                    db.execute("SELECT count(*) FROM iceberg_tables").fetchone()
                finally:
                    db.close()
            except sqlite3.Error as exc:
                return Check(False, f"the catalog database {path} cannot be read: {exc}")
            self._catalog_seen = True
            return Check(True, "reachable")
        opener = pyiceberg_catalog_opener(self.settings)
        if opener is None:  # a Hadoop catalog: the archiver's errors show as icelog_archive_failing
            return Check(True, "not checked by the broker (a Hadoop catalog)")
        try:
            if self._opened is None:
                self._opened = opener()
            if self._opened is not None:
                self._opened.list_namespaces()
        except Exception as exc:
            where = masked_url(self.settings.catalog_uri)
            return Check(False, f"the catalog {where} cannot be reached: {type(exc).__name__}: {first_line(exc)}")
        return Check(True, "reachable")
