"""Read-back for the broker: a TableSource per archived partition, the tables' plans kept current in the background."""

from __future__ import annotations

import logging
import threading
import uuid
from pathlib import Path

from icelog.config import Settings
from icelog.readback.file_copies import FileCopies
from icelog.readback.lake import LakeTables, catalog_locations, catalog_opener
from icelog.readback.source import BatchCache, TableSource
from icelog.schema.codec.rebuild import Schemas
from icelog.table.config import archive_config

log = logging.getLogger(__name__)


class ReadBack:
    """Hands the log an offset range source for each partition of an archived topic (None: not read back)."""

    def __init__(self, settings: Settings, schemas: Schemas, cache_bytes: int | None = None) -> None:
        self.settings = settings
        self.schemas = schemas
        opener = catalog_opener(settings)
        self.tables = LakeTables(opener, catalog_locations(settings)) if opener is not None else None
        self.cache = BatchCache(cache_bytes or settings.archive.readback_cache_bytes)
        # Data files of tables on object storage, copied to the broker's disk on first read (file_copies.py).
        self.copies = FileCopies(Path(settings.data_dir) / "cache" / "readback-files",
                                 settings.archive.readback_file_cache_bytes)
        self._sources: dict[tuple[uuid.UUID, int], TableSource] = {}
        self._lock = threading.Lock()

    @property
    def enabled(self) -> bool:
        return self.tables is not None

    def source(
        self, topic_id: uuid.UUID, topic: str, configs: dict[str, str], partition: int, log_append_time: bool
    ) -> TableSource | None:
        """The partition's table source when the topic is archived and the catalog can be read, else None."""
        if self.tables is None:
            return None
        archive = archive_config(topic, configs, self.settings.topic_defaults, self.settings.archive)
        if not archive.enabled:
            return None
        key = (topic_id, partition)
        with self._lock:
            current = self._sources.get(key)
            if (current is not None and current.identifier == archive.identifier
                    and current.log_append_time == log_append_time):
                return current
            source = TableSource(self.tables, archive.identifier, partition, self.schemas, self.cache,
                                 log_append_time, str(topic_id), self.copies)
            self._sources[key] = source
        return source

    @property
    def planned_files(self) -> int:
        """Data files in the tables' plans (0 with read-back off)."""
        return 0 if self.tables is None else self.tables.planned_files

    def refresh_all(self, topic_ids: set[uuid.UUID] | None = None) -> None:
        """Re-plan every table with a new commit, once for all its partitions, and hand each source its files
        (a worker thread, about every second; one catalog query when nothing changed). `topic_ids`: the topics
        the broker serves; the sources of any other (deleted) topic are forgotten, and the plans of tables no
        source reads any more."""
        with self._lock:
            if topic_ids is not None:
                for key in [key for key in self._sources if key[0] not in topic_ids]:
                    del self._sources[key]
            sources = list(self._sources.values())
        if self.tables is None:
            return
        self.tables.forget({source.identifier for source in sources})
        if not sources:
            return
        self.tables.refresh({source.identifier for source in sources})
        for source in sources:
            try:
                source.refresh()
            except Exception:
                log.exception("read-back: planning %s partition %d failed; will retry",
                              ".".join(source.identifier), source.partition)
