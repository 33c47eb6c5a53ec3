"""Read-back forgets what describes a deleted topic: its partitions' table sources and the plans of tables no
source reads any more (the broker hands `refresh_all` the topics it serves, about every second)."""

from __future__ import annotations

import uuid
from pathlib import Path

from icelog.config import Settings
from icelog.meta.sqlite import SqliteStore
from icelog.readback.service import ReadBack
from icelog.schema.codec.registry_source import StoreSchemaSource


def test_sources_of_deleted_topics_are_forgotten(tmp_path: Path) -> None:
    settings = Settings(data_dir=tmp_path)
    store = SqliteStore(tmp_path / "meta.db")
    try:
        readback = ReadBack(settings, StoreSchemaSource(store))
        kept, deleted = uuid.uuid4(), uuid.uuid4()
        source = readback.source(kept, "kept", {}, 0, False)
        gone = readback.source(deleted, "gone", {}, 0, False)
        assert source is not None and gone is not None
        readback.refresh_all({kept, deleted})
        assert readback.source(deleted, "gone", {}, 0, False) is gone, "a served topic keeps its source"
        readback.refresh_all({kept})
        assert readback.source(kept, "kept", {}, 0, False) is source
        assert readback.source(deleted, "gone", {}, 0, False) is not gone, "the deleted topic's source was dropped"
    finally:
        store.close()
