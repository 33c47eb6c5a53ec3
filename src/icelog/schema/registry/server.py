"""Confluent-compatible Schema Registry REST API (aiohttp), served from the broker's event loop.

Handlers that only read the store run inline (one SQLite read); those that compile a schema (register,
look up, compatibility, `format=serialized` on a cold cache) run in a worker thread so protoc never
blocks the Kafka listener.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import ssl
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, TypeVar

from aiohttp import web

from icelog.config import Settings
from icelog.meta.registry import RegistrySchema
from icelog.meta.security import SecurityStore
from icelog.schema.compiled import SCHEMA_TYPES
from icelog.schema.registry.access import RegistryAccess, asks_credentials
from icelog.schema.registry.service import (
    RegistryError,
    RegistryService,
    SchemaInput,
    parse_schema_id,
    schema_json,
)
from icelog.security.connections import HTTP_KEEPALIVE_S, REGISTRY_MAX_CONNECTIONS, HttpListener
from icelog.security.log_lines import HttpErrorLog, bounded, describe
from icelog.security.logins import FailedLoginLimit, LoginChecks
from icelog.security.tls import server_context

if TYPE_CHECKING:
    from icelog.security.authorizer import Authorizer

log = logging.getLogger(__name__)
CONTENT_TYPE = "application/vnd.schemaregistry.v1+json"
T = TypeVar("T")
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def _reply(body: object, status: int = 200) -> web.Response:
    return web.Response(text=json.dumps(body), status=status, content_type="application/json")


def _flag(request: web.Request, name: str) -> bool:
    return request.query.get(name, "false").lower() == "true"


@web.middleware
async def _errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    # Every failure leaves in Confluent's shape, which its clients turn into SchemaRegistryError.
    try:
        return await handler(request)
    except RegistryError as exc:
        return _reply({"error_code": exc.error_code, "message": exc.message}, exc.status)
    except web.HTTPException as exc:
        return _reply({"error_code": exc.status, "message": exc.reason}, exc.status)
    except Exception as exc:
        # One bounded line (a request that reaches this is a bug to fix, but a client must not be able to fill the
        # log by repeating it); the traceback at debug level. The exception's text may name server paths or quote
        # the request: it stays in the log.
        log.warning("schema registry request %s %s failed: %s", request.method, bounded(request.path),
                    describe(exc))
        log.debug("registry handler traceback", exc_info=True)
        return _reply({"error_code": 50001, "message": f"Error in the backend data store: {type(exc).__name__}"}, 500)


class RegistryServer:
    """The REST routes over one RegistryService; with `access`, callers authenticate and subjects follow topic
    ACLs (access.py); with `ssl_context`, it serves HTTPS."""

    def __init__(self, service: RegistryService, access: RegistryAccess | None = None,
                 ssl_context: ssl.SSLContext | None = None, max_connections: int = REGISTRY_MAX_CONNECTIONS) -> None:
        self.service = service
        self.access = access
        self.ssl_context = ssl_context
        self.max_connections = max_connections
        self._runner: web.AppRunner | None = None
        self._listener: HttpListener | None = None
        self._http_log = HttpErrorLog(log, "schema registry: bad HTTP requests")

    def _readable(self, request: web.Request, subjects: list[str]) -> list[str]:
        return subjects if self.access is None else self.access.readable(request, subjects)

    async def _in_thread(self, func: Callable[..., T], *args: Any) -> T:
        return await asyncio.get_running_loop().run_in_executor(None, functools.partial(func, *args))

    async def _body(self, request: web.Request) -> SchemaInput:
        try:
            body = json.loads(await request.read() or b"null")
        except (ValueError, RecursionError):  # RecursionError: nested deeper than json's parser goes
            raise RegistryError(422, 42201, "Invalid schema: the body is not JSON") from None
        return SchemaInput.from_json(body)

    async def _schema_text(self, record: RegistrySchema, fmt: str | None) -> str:
        if fmt == "serialized" and not self.service.is_compiled(record.schema_id):
            return await self._in_thread(self.service.schema_text, record, fmt)  # a cold cache runs protoc
        return self.service.schema_text(record, fmt)

    def app(self) -> web.Application:
        """The aiohttp application with every route."""
        middlewares = [_errors] if self.access is None else [_errors, self.access.middleware]
        app = web.Application(middlewares=middlewares)
        r = app.router
        r.add_get("/", self.root)
        r.add_get("/schemas/types", self.schema_types)
        r.add_get("/schemas/ids/{id}", self.schema_by_id)
        r.add_get("/schemas/ids/{id}/schema", self.raw_schema_by_id)
        r.add_get("/schemas/ids/{id}/versions", self.versions_of_schema)
        r.add_get("/schemas/ids/{id}/subjects", self.subjects_of_schema)
        r.add_get("/subjects", self.subjects)
        r.add_post("/subjects/{subject}", self.lookup)
        r.add_delete("/subjects/{subject}", self.delete_subject)
        r.add_get("/subjects/{subject}/versions", self.versions)
        r.add_post("/subjects/{subject}/versions", self.register)
        r.add_get("/subjects/{subject}/versions/{version}", self.version)
        r.add_delete("/subjects/{subject}/versions/{version}", self.delete_version)
        r.add_get("/subjects/{subject}/versions/{version}/schema", self.raw_schema_of_version)
        r.add_post("/compatibility/subjects/{subject}/versions/{version}", self.compatibility)
        r.add_post("/compatibility/subjects/{subject}/versions", self.compatibility)
        for path in ("/config", "/config/{subject}"):
            r.add_get(path, self.get_config)
            r.add_put(path, self.put_config)
            r.add_delete(path, self.delete_config)
        return app

    async def start(self, host: str, port: int) -> None:
        """Listen on host:port (raises OSError if the address is taken), at most `max_connections` at once."""
        # A malformed request (a 9 KB URL or header line) is one counted log line, never a traceback.
        self._runner = web.AppRunner(self.app(), access_log=None, logger=self._http_log,
                                     keepalive_timeout=HTTP_KEEPALIVE_S)
        await self._runner.setup()
        server = self._runner.server
        assert server is not None
        self._listener = HttpListener(server, lambda: len(server.connections), self.ssl_context,
                                      self.max_connections, "schema registry")
        await self._listener.start(host, port)

    async def stop(self) -> None:
        if self._listener is not None:
            await self._listener.close()
        if self._runner is not None:
            await self._runner.cleanup()
        self._http_log.close()
        if self.access is not None:
            self.access.close()

    # -- schemas -------------------------------------------------------------------------------
    async def root(self, request: web.Request) -> web.Response:
        return _reply({})

    async def schema_types(self, request: web.Request) -> web.Response:
        return _reply(list(SCHEMA_TYPES))

    def _schema_id(self, request: web.Request) -> int:
        return parse_schema_id(request.match_info["id"])

    async def schema_by_id(self, request: web.Request) -> web.Response:
        record = self.service.schema(self._schema_id(request))
        text = await self._schema_text(record, request.query.get("format"))
        return _reply(schema_json(record, text))

    async def raw_schema_by_id(self, request: web.Request) -> web.Response:
        return web.Response(text=self.service.schema(self._schema_id(request)).schema)

    async def versions_of_schema(self, request: web.Request) -> web.Response:
        schema_id = self._schema_id(request)
        self.service.schema(schema_id)
        deleted = _flag(request, "deleted")
        found = [v for v in self.service.store.registry_versions_of_schema(schema_id) if deleted or not v.deleted]
        readable = set(self._readable(request, sorted({v.subject for v in found})))
        return _reply([{"subject": v.subject, "version": v.version} for v in found if v.subject in readable])

    async def subjects_of_schema(self, request: web.Request) -> web.Response:
        schema_id = self._schema_id(request)
        self.service.schema(schema_id)
        deleted = _flag(request, "deleted")
        found = self.service.store.registry_versions_of_schema(schema_id)
        return _reply(self._readable(request, sorted({v.subject for v in found if deleted or not v.deleted})))

    # -- subjects ------------------------------------------------------------------------------
    async def subjects(self, request: web.Request) -> web.Response:
        deleted = _flag(request, "deleted") or _flag(request, "deleted_only")
        names = self.service.subjects(deleted, request.query.get("subjectPrefix", ""))
        if _flag(request, "deleted_only"):
            names = [n for n in names if n not in set(self.service.subjects(False))]
        return _reply(self._readable(request, names))

    async def versions(self, request: web.Request) -> web.Response:
        subject = request.match_info["subject"]
        found = self.service.versions(subject, _flag(request, "deleted") or _flag(request, "deleted_only"))
        if _flag(request, "deleted_only"):
            found = [v for v in found if v.deleted]
        return _reply([v.version for v in found])

    async def register(self, request: web.Request) -> web.Response:
        subject = request.match_info["subject"]
        given = await self._body(request)
        version = await self._in_thread(self.service.register, subject, given)
        return _reply({"id": version.schema_id, "version": version.version, "subject": subject})

    async def version(self, request: web.Request) -> web.Response:
        subject = request.match_info["subject"]
        found = self.service.version(subject, request.match_info["version"], _flag(request, "deleted"))
        record = self.service.schema(found.schema_id)
        text = await self._schema_text(record, request.query.get("format"))
        extra = {"subject": subject, "version": found.version, "id": found.schema_id}
        return _reply(schema_json(record, text, extra))

    async def raw_schema_of_version(self, request: web.Request) -> web.Response:
        subject = request.match_info["subject"]
        found = self.service.version(subject, request.match_info["version"], _flag(request, "deleted"))
        return web.Response(text=self.service.schema(found.schema_id).schema)

    async def lookup(self, request: web.Request) -> web.Response:
        subject = request.match_info["subject"]
        given = await self._body(request)
        found, record = await self._in_thread(self.service.lookup, subject, given, _flag(request, "deleted"))
        text = await self._schema_text(record, request.query.get("format"))
        return _reply(schema_json(record, text, {"subject": subject, "version": found.version, "id": found.schema_id}))

    async def delete_subject(self, request: web.Request) -> web.Response:
        subject = request.match_info["subject"]
        return _reply(self.service.delete_subject(subject, _flag(request, "permanent")))

    async def delete_version(self, request: web.Request) -> web.Response:
        subject = request.match_info["subject"]
        return _reply(self.service.delete_version(subject, request.match_info["version"], _flag(request, "permanent")))

    async def compatibility(self, request: web.Request) -> web.Response:
        subject = request.match_info["subject"]
        version = request.match_info.get("version", "latest")
        given = await self._body(request)
        problems = await self._in_thread(self.service.test_compatibility, subject, version, given)
        body: dict[str, object] = {"is_compatible": not problems}
        if _flag(request, "verbose"):
            body["messages"] = problems
        return _reply(body)

    # -- config --------------------------------------------------------------------------------
    async def get_config(self, request: web.Request) -> web.Response:
        subject = request.match_info.get("subject")
        if subject is None:
            return _reply({"compatibilityLevel": self.service.compatibility(None)})
        level = self.service.subject_compatibility(subject)
        if level is None:
            if not _flag(request, "defaultToGlobal"):
                raise RegistryError(
                    404, 40408, f"Subject '{subject}' does not have subject-level compatibility configured"
                )
            level = self.service.compatibility(None)
        return _reply({"compatibilityLevel": level})

    async def put_config(self, request: web.Request) -> web.Response:
        subject = request.match_info.get("subject")
        try:
            body = json.loads(await request.read() or b"null")
        except (ValueError, RecursionError):
            body = None
        level = body.get("compatibility") if isinstance(body, dict) else None
        return _reply({"compatibility": self.service.set_compatibility(subject, level)})

    async def delete_config(self, request: web.Request) -> web.Response:
        subject = request.match_info.get("subject")
        if subject is not None and not self.service.store.registry_versions(subject):
            raise RegistryError(404, 40401, f"Subject '{subject}' not found.")
        return _reply({"compatibilityLevel": self.service.delete_compatibility(subject)})


def registry_server(settings: Settings, service: RegistryService, users: SecurityStore,
                    authorizer: Authorizer | None, logins: LoginChecks, max_connections: int) -> RegistryServer:
    """The broker's registry: HTTPS with the broker's certificate when a Kafka listener uses TLS, and callers
    authenticated (and held to topic ACLs) when a Kafka listener authenticates its clients, their passwords
    checked by the broker's `logins`. Client certificates are not asked for: callers identify with HTTP basic
    auth. Raises ConfigError for an unusable key file."""
    access = None
    if asks_credentials(settings):
        def subjects_of_schema(schema_id: int) -> list[str]:
            return sorted({v.subject for v in service.store.registry_versions_of_schema(schema_id)})

        failures = FailedLoginLimit(settings.registry_failed_logins_burst, settings.registry_failed_logins_per_second)
        access = RegistryAccess(users, settings.super_user_set, authorizer, subjects_of_schema, logins,
                                settings.connection_failed_authentication_delay_ms, failures)
    return RegistryServer(service, access, server_context(settings, client_auth="none"), max_connections)
