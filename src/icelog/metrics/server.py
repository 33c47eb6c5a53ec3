"""The metrics listener (aiohttp, in the broker's event loop): /metrics, /healthz and /readyz.

/metrics is Prometheus's text format (or OpenMetrics when the scraper asks for it), rendered by prometheus-client
on a worker thread: the scrape-time collector reads the metadata store. No endpoint authenticates: it tells how
far topics and tables are, never a record. With TLS on a Kafka listener it serves HTTPS with the broker's
certificate (no client certificate asked), so a scraper needs only the CA file.
"""

from __future__ import annotations

import asyncio
import json
import logging
import ssl

from aiohttp import web
from prometheus_client import CollectorRegistry
from prometheus_client.exposition import choose_encoder

from icelog.metrics.health import Readiness
from icelog.security.connections import HTTP_KEEPALIVE_S, METRICS_MAX_CONNECTIONS, HttpListener
from icelog.security.log_lines import HttpErrorLog

log = logging.getLogger(__name__)


def _json(body: object, status: int = 200) -> web.Response:
    return web.Response(text=json.dumps(body), status=status, content_type="application/json")


class MetricsServer:
    """Serves one broker's registry and readiness."""

    def __init__(self, registry: CollectorRegistry, readiness: Readiness,
                 ssl_context: ssl.SSLContext | None = None, max_connections: int = METRICS_MAX_CONNECTIONS) -> None:
        self.registry = registry
        self.readiness = readiness
        self.ssl_context = ssl_context
        self.max_connections = max_connections
        self._runner: web.AppRunner | None = None
        self._listener: HttpListener | None = None
        self._http_log = HttpErrorLog(log, "metrics listener: bad HTTP requests")

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/metrics", self.metrics)
        app.router.add_get("/healthz", self.healthz)
        app.router.add_get("/readyz", self.readyz)
        return app

    async def metrics(self, request: web.Request) -> web.Response:
        encoder, content_type = choose_encoder(request.headers.get("Accept", ""))
        body = await asyncio.to_thread(encoder, self.registry)
        return web.Response(body=body, headers={"Content-Type": content_type})

    async def healthz(self, request: web.Request) -> web.Response:
        return _json({"status": "ok"})  # the process answers: its event loop runs

    async def readyz(self, request: web.Request) -> web.Response:
        checks = await self.readiness.checks()
        problems = [f"{name}: {check.detail}" for name, check in checks.items() if not check.ok]
        body = {
            "ready": not problems,
            "problems": problems,
            "checks": {name: {"ok": check.ok, "detail": check.detail} for name, check in checks.items()},
        }
        return _json(body, 200 if not problems else 503)

    async def start(self, host: str, port: int) -> None:
        """Listen on host:port, at most `max_connections` at once: descriptors of its own (security/connections.py),
        so /healthz answers however many Kafka or registry connections are open."""
        # A malformed request (a 9 KB URL or header line) is one counted log line, never a traceback.
        self._runner = web.AppRunner(self.app(), access_log=None, logger=self._http_log,
                                     keepalive_timeout=HTTP_KEEPALIVE_S)
        await self._runner.setup()
        server = self._runner.server
        assert server is not None
        self._listener = HttpListener(server, lambda: len(server.connections), self.ssl_context,
                                      self.max_connections, "metrics listener")
        await self._listener.start(host, port)

    async def stop(self) -> None:
        if self._listener is not None:
            await self._listener.close()
        if self._runner is not None:
            await self._runner.cleanup()
        self._http_log.close()
