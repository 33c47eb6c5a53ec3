"""Runs a broker: metadata store, intake recovery, the Kafka listener and background upkeep."""

from __future__ import annotations

import asyncio
import logging
import signal
import socket

from icelog.config import Settings
from icelog.log.manager import LogManager
from icelog.meta.store import open_store
from icelog.wire.context import BrokerState
from icelog.wire.server import KafkaServer

log = logging.getLogger(__name__)


class Broker:
    """One icelog broker process."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        settings.data_dir.mkdir(parents=True, exist_ok=True)
        self.logs = LogManager(settings, open_store(settings.metadata_url))
        host = settings.advertised_host or _advertisable(settings.host)
        self.state = BrokerState(settings, self.logs, host, settings.port)
        self.server = KafkaServer(self.state)
        self._stopping = asyncio.Event()

    async def run(self) -> None:
        """Recover, serve until SIGINT/SIGTERM, then shut down cleanly."""
        self.logs.open()
        self.logs.start()
        await self.server.start()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, self._stopping.set)
        upkeep = asyncio.create_task(self._upkeep())
        print(
            f"icelog serving Kafka on {self.state.advertised_host}:{self.state.advertised_port} "
            f"(data in {self.settings.data_dir})",
            flush=True,
        )
        writer_task = self.logs.writer._task
        assert writer_task is not None
        stop_wait = asyncio.create_task(self._stopping.wait())
        await asyncio.wait({stop_wait, writer_task}, return_when=asyncio.FIRST_COMPLETED)
        upkeep.cancel()
        await self.server.stop()
        failed = self.logs.writer.failed
        await self.logs.close()
        if failed is not None:
            raise SystemExit(f"icelog: stopped because the intake could not be written: {failed}")
        log.info("icelog stopped")

    async def _upkeep(self) -> None:
        interval = self.settings.retention_check_interval_ms / 1000
        while True:
            await asyncio.sleep(interval)
            try:
                self.logs.enforce_retention()
            except Exception:
                log.exception("retention pass failed; will retry")


def _advertisable(host: str) -> str:
    if host in ("", "0.0.0.0", "::"):
        return socket.gethostname()
    return host
