"""The lake's metrics with a real archiver: lag to the table rises while the archiver waits and returns to 0 after
its pass, freshness observations appear, the table's counters move, promtool accepts the text; /readyz turns
not-ready when the catalog is taken away and ready again when it returns."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from icelog.archive.archiver import Archiver
from icelog.config import Settings
from tests.support.archive import create_topic, produce, wait_for
from tests.support.broker import BrokerProcess
from tests.support.metrics import promtool_check, scrape_text, value

pytestmark = pytest.mark.spark


def _readyz(broker: BrokerProcess) -> tuple[int, dict[str, Any]]:
    try:
        with urllib.request.urlopen(f"{broker.metrics_url}/readyz", timeout=30) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def test_lag_freshness_and_table_metrics(
    lake_broker: BrokerProcess, lake_archiver: Archiver, lake_settings: Settings
) -> None:
    topic = "metrics-lake"
    create_topic(lake_broker, topic)
    produce(lake_broker, topic, 600)
    # The archiver has not run (the lake broker's own archiver is off; this test runs the passes): lag rises.
    waiting = scrape_text(lake_broker.metrics_url)
    assert value(waiting, "icelog_archive_lag_records", topic=topic) == 600
    assert value(waiting, "icelog_archive_lag_bytes", topic=topic) > 0
    assert value(waiting, "icelog_archive_lag_seconds", topic=topic) > 0
    assert value(waiting, "icelog_archive_freshness_seconds_count", topic=topic) == 0

    [result] = lake_archiver.run_pass(force=True, topics=[topic])
    assert result.records == 600

    def caught_up() -> bool:
        text = scrape_text(lake_broker.metrics_url)
        return (value(text, "icelog_archive_lag_records", topic=topic) == 0
                and value(text, "icelog_archive_freshness_seconds_count", topic=topic) > 0)

    wait_for(caught_up, 30, lambda: scrape_text(lake_broker.metrics_url))
    text = scrape_text(lake_broker.metrics_url)
    table = f"icelog.{topic}"
    assert value(text, "icelog_archive_lag_bytes", topic=topic) == 0
    assert value(text, "icelog_archive_lag_seconds", topic=topic) == 0
    assert value(text, "icelog_archive_archived_offset", topic=topic) == 600
    # one observation per intake chunk, each the time from its group commit to the Iceberg commit
    count = value(text, "icelog_archive_freshness_seconds_count", topic=topic)
    assert 1 <= count <= 600
    assert 0 < value(text, "icelog_archive_freshness_seconds_sum", topic=topic) / count < 300
    assert value(text, "icelog_table_archive_commit_seconds_count", table=table) >= 1
    assert value(text, "icelog_table_archived_records_total", table=table) == 600
    assert value(text, "icelog_table_data_files", table=table) >= 1
    assert value(text, "icelog_table_snapshots", table=table) >= 1
    assert value(text, "icelog_table_records", table=table) == 600
    assert value(text, "icelog_archive_failing", topic=topic) == 0
    checked = promtool_check(text)
    assert checked.returncode == 0, checked.stdout + checked.stderr

    # The catalog taken away: /readyz says so, and is ready again once it is back.
    status, body = _readyz(lake_broker)
    assert status == 200, body
    catalog = Path(lake_settings.catalog_uri.removeprefix("jdbc:sqlite:"))
    away = catalog.with_name(catalog.name + ".away")
    catalog.rename(away)
    try:
        status, body = _readyz(lake_broker)
        assert status == 503, body
        assert body["ready"] is False and not body["checks"]["catalog"]["ok"], body
        assert any(p.startswith("catalog: ") for p in body["problems"]), body
    finally:
        away.rename(catalog)
    status, body = _readyz(lake_broker)
    assert status == 200, body
