"""The asyncio Kafka listener: framing, in-order responses per connection, bad-input handling."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import struct
import time
from collections import Counter, deque
from collections.abc import Coroutine
from typing import Any

from kafka.protocol.api_key import ApiKey
from kafka.protocol.api_message import ApiMessage

from icelog.config import Listener, principal_rules
from icelog.errors import ErrorCode
from icelog.instruments import ApiInstruments
from icelog.security.tls import NoMatchingRule, certificate_principal, server_context
from icelog.wire import codec, handlers  # noqa: F401  (handlers register themselves)
from icelog.wire.context import HANDLERS, BrokerState, Connection, RequestContext
from icelog.wire.handlers import sasl
from icelog.wire.versions import build_api_versions_response, is_supported

log = logging.getLogger(__name__)

_SIZE = struct.Struct(">i")
MAX_IN_FLIGHT = 256  # requests read ahead per connection before we stop reading
TLS_HANDSHAKE_TIMEOUT_S = 10.0  # a client that opens a TLS connection and says nothing holds it no longer
# What a SASL listener serves before the client has logged in (Kafka's SaslServerAuthenticator)
_BEFORE_LOGIN = frozenset({ApiKey.ApiVersions, ApiKey.SaslHandshake, ApiKey.SaslAuthenticate})
LOG_QUOTE_CHARS = 200  # at most this much of anything a client sent goes into a log line
# A request read and handed to its handler: (api key << 16 | version, correlation id, the handler's task, when it
# was read whole: time.perf_counter()); -1 as the key for a bare SASL token
_Queued = tuple[int, int, asyncio.Task[ApiMessage | None], float]


def bounded(text: str, limit: int = LOG_QUOTE_CHARS) -> str:
    """`text` for a log line: at most `limit` characters, non-printable ones escaped, so a client cannot make
    the log grow by more than a bounded amount per line nor forge lines of its own."""
    head = text[:limit].encode("unicode_escape").decode("ascii")
    return head if len(text) <= limit else f"{head}... ({len(text)} chars)"


def describe(exc: BaseException) -> str:
    """An exception as one bounded line; str(), not repr(): a UnicodeDecodeError's repr quotes all its input."""
    return bounded(f"{type(exc).__name__}: {exc}")


class ListenerError(OSError):
    """A listener could not bind: which one, and the system's reason."""

    def __init__(self, spec: Listener, cause: OSError) -> None:
        super().__init__(cause.errno, cause.strerror)
        self.where = f"{spec.host}:{spec.port}" + ("" if spec.name == "PLAINTEXT" else f" (listener {spec.name})")


class _Disconnect(Exception):
    """Close this connection (bad framing, unknown API); other connections are unaffected."""


class _InFlight(dict[asyncio.Task[ApiMessage | None], int]):
    """A connection's requests being handled (task -> API key), and when the last of them finished."""

    def __init__(self) -> None:
        super().__init__()
        self.last_done = time.monotonic()

    def add(self, task: asyncio.Task[ApiMessage | None], key: int) -> None:
        self[task] = key
        task.add_done_callback(self._done)

    def _done(self, task: asyncio.Task[ApiMessage | None]) -> None:
        self.pop(task, None)
        self.last_done = time.monotonic()


class _Reader(asyncio.StreamReader):
    """A StreamReader that also says when its peer has gone, for waits that are not reads."""

    def __init__(self, limit: int) -> None:
        super().__init__(limit)
        self.gone: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def feed_eof(self) -> None:
        super().feed_eof()
        if not self.gone.done():
            self.gone.set_result(None)

    def set_exception(self, exc: Exception) -> None:
        super().set_exception(exc)
        if not self.gone.done():
            self.gone.set_result(None)

    async def unless_gone(self, waiting: Coroutine[Any, Any, None]) -> None:
        """Await `waiting`, or raise ConnectionError as soon as the peer goes (a full queue, the byte budget)."""
        task = asyncio.ensure_future(waiting)
        try:
            await asyncio.wait((task, self.gone), return_when=asyncio.FIRST_COMPLETED)
        finally:
            if not task.done():
                task.cancel()
        if not task.done() or task.cancelled():
            raise ConnectionResetError("the client closed the connection")
        task.result()


class _Idle(Exception):
    """connections.max.idle.ms passed with nothing in flight: close quietly, as Kafka does."""


class _ByteBudget:
    """queued.max.request.bytes: bytes of requests read or being handled, over all connections.

    A reader that would pass the bound waits (and so stops reading its socket: back-pressure) until enough
    is released; waiters are served in order, so a large request is not starved by small ones.
    """

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.used = 0
        self._waiters: deque[tuple[int, asyncio.Future[None]]] = deque()

    async def acquire(self, size: int) -> None:
        if not self._waiters and self.used + size <= self.limit:
            self.used += size
            return
        granted: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append((size, granted))
        try:
            await granted
        except asyncio.CancelledError:
            if granted.done() and not granted.cancelled():
                self.release(size)  # granted just as we were cancelled: give it back
            else:  # still queued, unless a release already dropped it as cancelled
                with contextlib.suppress(ValueError):
                    self._waiters.remove((size, granted))
                self._wake()
            raise

    def release(self, size: int) -> None:
        self.used -= size
        self._wake()

    def _wake(self) -> None:
        while self._waiters and self.used + self._waiters[0][0] <= self.limit:
            size, granted = self._waiters.popleft()
            if granted.cancelled():  # its waiter was cancelled and has not yet removed it
                continue
            self.used += size
            granted.set_result(None)


class KafkaServer:
    """Accepts Kafka clients and dispatches each request to its handler."""

    def __init__(self, broker: BrokerState) -> None:
        self.broker = broker
        self._servers: list[asyncio.Server] = []
        self._advertised: dict[str, tuple[str, int]] = {}  # listener name -> what Metadata tells its clients
        self._principal_rules = principal_rules(broker.settings.ssl_principal_mapping_rules)
        self._connections: set[asyncio.Task[None]] = set()
        self._writers: set[asyncio.StreamWriter] = set()
        # Requests whose connection is gone but which still finish (a Produce is applied as Kafka applies
        # one whose client left); held here so the loop's weak references do not drop them.
        self._detached: set[asyncio.Task[ApiMessage | None]] = set()
        self._per_ip: Counter[str] = Counter()
        self._budget = _ByteBudget(broker.settings.queued_max_request_bytes)
        self._refused = 0  # connections refused since the last log line about it
        self._refused_logged = 0.0

    async def start(self) -> None:
        """Serve every listener (Kafka's `listeners`); the broker's advertised address is the first one's."""
        loop = asyncio.get_running_loop()
        context = server_context(self.broker.settings)
        for spec in self.broker.settings.listener_specs:
            def protocol(spec: Listener = spec) -> asyncio.StreamReaderProtocol:  # asyncio.start_server's, our reader
                return asyncio.StreamReaderProtocol(
                    _Reader(1 << 20), lambda r, w: self._on_connect(r, w, spec)
                )

            try:
                server = await loop.create_server(
                    protocol, spec.host, spec.port, reuse_address=True, ssl=context if spec.tls else None,
                    ssl_handshake_timeout=TLS_HANDSHAKE_TIMEOUT_S if spec.tls else None,
                )
            except OSError as exc:
                raise ListenerError(spec, exc) from None
            self._servers.append(server)
            sockets: Any = server.sockets or []
            port = sockets[0].getsockname()[1] if sockets else spec.port
            self._advertised[spec.name] = (spec.advertised_host or advertisable(spec.host),
                                           spec.advertised_port or port)
            log.info("Kafka listener %s on %s:%d (%s)", spec.name, spec.host, port, spec.protocol)
            if not spec.loopback and not spec.authenticates(self.broker.settings.ssl_client_auth):
                log.warning(
                    "LISTENER %s ON %s:%d AUTHENTICATES NOBODY: any client that can reach it may produce, read, delete "
                    "topics and change configs. Use SASL_SSL (or SSL with ssl_client_auth=required) on shared "
                    "networks; see docs/security.md", spec.name, spec.host, port,
                )
        first = self.broker.settings.listener_specs[0]
        self.broker.advertised_host, self.broker.advertised_port = self._advertised[first.name]

    def endpoints(self) -> list[str]:
        """Each listener as a client is told to reach it: NAME://HOST:PORT (the bare address for the one default
        PLAINTEXT listener, as before listeners existed)."""
        specs = self.broker.settings.listener_specs
        if self.broker.settings.listeners is None:
            return [f"{self.broker.advertised_host}:{self.broker.advertised_port}"]
        return [f"{spec.name}://{':'.join(map(str, self._advertised[spec.name]))}" for spec in specs]

    def serving(self) -> bool:
        """Whether every Kafka listener is accepting connections (/readyz)."""
        return bool(self._servers) and all(server.is_serving() for server in self._servers)

    async def stop(self) -> None:
        if self._servers:
            for server in self._servers:
                server.close()
            # Closing the sockets ends each connection's read loop normally; cancelling the stream
            # callbacks instead makes asyncio log a traceback per connection.
            for writer in list(self._writers):
                writer.transport.abort()
            await asyncio.wait(self._connections, timeout=5) if self._connections else None
            for server in self._servers:
                await server.wait_closed()
        self.broker.validator.close()

    async def _on_connect(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, spec: Listener) -> None:
        task = asyncio.current_task()
        assert task is not None
        peername = writer.get_extra_info("peername")
        peer = f"{peername[0]}:{peername[1]}" if peername else "?"
        ip = str(peername[0]) if peername else "?"
        assert isinstance(reader, _Reader)
        if self._refuse(ip):
            writer.transport.abort()
            return
        connection = Connection(peer, ip, spec)
        connection.advertised = self._advertised[spec.name]
        ssl_object = writer.get_extra_info("ssl_object")
        if ssl_object is not None:  # mTLS: the certificate's subject is the principal (SASL's wins if both)
            try:
                principal = certificate_principal(ssl_object.getpeercert(binary_form=True), self._principal_rules)
            except NoMatchingRule as exc:
                log.warning("closing connection from %s: %s", peer, bounded(str(exc)))
                writer.transport.abort()
                return
            if principal is not None:
                connection.principal = principal
        self._connections.add(task)
        self._writers.add(writer)
        self._per_ip[ip] += 1
        metrics = self.broker.wire_metrics
        open_gauge = metrics.by_listener.get(spec.name) if metrics is not None else None
        if open_gauge is not None:
            open_gauge.inc()
        try:
            await self._serve(reader, writer, connection)
        finally:
            if open_gauge is not None:
                open_gauge.dec()
            self._connections.discard(task)
            self._writers.discard(writer)
            self._per_ip[ip] -= 1
            if not self._per_ip[ip]:
                del self._per_ip[ip]

    def _refuse(self, ip: str) -> bool:
        """max.connections / max.connections.per.ip reached: the new connection is closed unanswered."""
        settings = self.broker.settings
        if len(self._connections) >= settings.max_connections:
            reason = f"max.connections={settings.max_connections}"
        elif self._per_ip[ip] >= settings.max_connections_per_ip:
            reason = f"max.connections.per.ip={settings.max_connections_per_ip} (from {ip})"
        else:
            return False
        self._refused += 1
        now = time.monotonic()
        if now - self._refused_logged >= 10:  # one line per ten seconds however hard the flood
            log.warning("refused %d connection(s): %s reached", self._refused, reason)
            self._refused, self._refused_logged = 0, now
        return True

    async def _serve(self, reader: _Reader, writer: asyncio.StreamWriter, connection: Connection) -> None:
        queue: asyncio.Queue[_Queued | None] = asyncio.Queue(MAX_IN_FLIGHT)
        inflight = _InFlight()
        peer = connection.peer
        sender = asyncio.create_task(self._send_in_order(queue, writer, connection))
        peer_gone = False
        try:
            while not sender.done():
                item = await self._read_request(reader, connection, inflight)
                if item is None:
                    peer_gone = True
                    break
                inflight.add(item[2], item[0] >> 16)
                if queue.full():  # MAX_IN_FLIGHT requests wait: read no more, but notice the client leaving
                    await reader.unless_gone(queue.put(item))
                else:
                    queue.put_nowait(item)
        except _Disconnect as exc:
            log.warning("closing connection from %s: %s", peer, exc)
        except (asyncio.IncompleteReadError, ConnectionError):
            peer_gone = True
        except _Idle:
            log.debug("closing connection from %s: idle past connections.max.idle.ms", peer)
            peer_gone = True
        finally:
            if peer_gone or sender.done():
                # Nobody will read an answer: let go of the socket and every long poll at once, instead of
                # holding a half-closed socket (CLOSE_WAIT) and its descriptor until max_wait_ms.
                self._release(inflight)
                writer.transport.abort()
                sender.cancel()
            else:  # a bad request: the answers to the requests before it still go out, then we close
                self._release(inflight, fetches_only=True)
                await queue.put(None)
                with contextlib.suppress(Exception):
                    await sender
            writer.close()

    def _release(self, inflight: _InFlight, fetches_only: bool = False) -> None:
        """End a closing connection's long polls; its other requests run to completion unanswered."""
        for task, key in list(inflight.items()):
            if key == ApiKey.Fetch:
                task.cancel()
            elif not fetches_only and not task.done():
                self._detached.add(task)
                task.add_done_callback(self._finished_unanswered)

    def _finished_unanswered(self, task: asyncio.Task[ApiMessage | None]) -> None:
        self._detached.discard(task)
        exc = None if task.cancelled() else task.exception()  # retrieved: asyncio logs no traceback
        if exc is not None:
            log.warning("a request from a closed connection failed: %s", type(exc).__name__)

    async def _read_request(
        self, reader: _Reader, connection: Connection, inflight: _InFlight
    ) -> _Queued | None:
        settings = self.broker.settings
        idle_s = settings.connections_max_idle_ms / 1000
        timeout = idle_s
        while True:
            try:
                async with asyncio.timeout(timeout):
                    header = await reader.readexactly(4)  # consumes nothing unless it completes
                break
            except TimeoutError:
                # idle: no request for idle_s and none in flight (a long poll is not idleness)
                timeout = idle_s if inflight else inflight.last_done + idle_s - time.monotonic()
                if timeout <= 0:
                    raise _Idle() from None
            except asyncio.IncompleteReadError as exc:
                if exc.partial:
                    raise _Disconnect("truncated size prefix") from None
                return None
        (size,) = _SIZE.unpack(header)
        limit = settings.socket_request_max_bytes
        if size <= 0 or size > limit:
            raise _Disconnect(f"request size {size} is outside 1..socket.request.max.bytes={limit}")
        if size > self._budget.limit:
            raise _Disconnect(f"request size {size} is over queued.max.request.bytes={self._budget.limit}")
        # until then this socket is not read: back-pressure
        await reader.unless_gone(self._budget.acquire(size))
        try:
            item = await self._read_frame(reader, connection, size, idle_s)
        except BaseException:
            self._budget.release(size)
            raise
        item[2].add_done_callback(lambda _: self._budget.release(size))
        metrics = self.broker.wire_metrics
        if metrics is not None:
            api = metrics.by_key.get(item[0] >> 16)
            if api is not None:
                api.received.inc(size + 4)
        return (*item, time.perf_counter())

    async def _read_frame(
        self, reader: asyncio.StreamReader, connection: Connection, size: int, idle_s: float
    ) -> tuple[int, int, asyncio.Task[ApiMessage | None]]:
        try:
            async with asyncio.timeout(idle_s):
                frame = await reader.readexactly(size)
        except asyncio.IncompleteReadError:
            raise _Disconnect(f"connection closed inside a {size}-byte request") from None
        except TimeoutError:
            raise _Disconnect(f"a {size}-byte request not complete within connections.max.idle.ms") from None
        if connection.sasl_raw:  # after a v0 SaslHandshake: a bare token, no request header
            delay_ms = self.broker.settings.connection_failed_authentication_delay_ms
            return -1, 0, asyncio.ensure_future(sasl.raw_token(delay_ms, connection, frame))
        try:
            prefix = codec.read_prefix(frame)
        except ValueError as exc:
            raise _Disconnect(str(exc)) from None
        key, version, correlation = prefix.api_key, prefix.api_version, prefix.correlation_id
        if key == ApiKey.ApiVersions and not is_supported(key, version):
            # KIP-511: answer v0 with error 35 and our ranges; the client retries with a version we know.
            return key << 16, correlation, asyncio.create_task(_unsupported_api_versions())
        if key not in HANDLERS or not is_supported(key, version):
            name = _api_name(key)
            raise _Disconnect(f"{name} v{version} is not supported (UNSUPPORTED_VERSION)")
        if not connection.authenticated and key not in _BEFORE_LOGIN:  # as Kafka's SaslServerAuthenticator
            raise _Disconnect(f"{_api_name(key)} request before SASL authentication on listener "
                              f"{connection.listener.name if connection.listener else '?'}")
        try:
            request = codec.decode_request(frame, key, version)
        except Exception as exc:
            raise _Disconnect(f"malformed {ApiKey(key).name} v{version} request: {describe(exc)}") from None
        null = codec.null_field(request, version)
        if null is not None:  # Kafka's parser refuses these and closes the connection; handlers would crash
            raise _Disconnect(f"malformed {ApiKey(key).name} v{version} request: {null} is null, "
                              "which Kafka's schema does not allow")
        client_id = request.header.client_id if request.header is not None else None
        context = RequestContext(self.broker, version, client_id, connection)
        task: asyncio.Task[ApiMessage | None] = asyncio.ensure_future(HANDLERS[key](context, request))
        return (key << 16) | version, correlation, task

    async def _send_in_order(
        self, queue: asyncio.Queue[_Queued | None], writer: asyncio.StreamWriter, connection: Connection,
    ) -> None:
        peer = connection.peer
        metrics = self.broker.wire_metrics
        try:
            while True:
                item = await queue.get()
                if item is None:
                    return
                key_version, correlation, task, started = item
                api = metrics.by_key.get(key_version >> 16) if metrics is not None else None
                try:
                    # shielded: cancelling the sender (the client left) must not cancel a Produce midway
                    response = await asyncio.shield(task)
                except ConnectionAbortedError as exc:  # a handler asks to drop the connection (test hook)
                    log.warning("dropping the connection from %s: %s", peer, exc)
                    _count_failed(api)
                    writer.close()
                    return
                except Exception as exc:
                    # One bounded line, not a traceback: a request the checks above let through can still be
                    # one a handler cannot take, and the client must not be able to fill the log with them.
                    log.warning("closing connection from %s: %s request failed: %s",
                                peer, _api_name(key_version >> 16), describe(exc))
                    log.debug("handler traceback", exc_info=True)
                    _count_failed(api)
                    writer.close()  # without this the client waits for an answer until its own timeout
                    return
                if response is None:  # acks=0 Produce: Kafka sends nothing back
                    if api is not None:
                        api.requests.inc()
                        api.seconds.observe(time.perf_counter() - started)
                    continue
                try:
                    frame = response if isinstance(response, bytes) else codec.encode_response(
                        response, key_version & 0xFFFF, correlation
                    )
                except Exception as exc:
                    log.warning("closing connection from %s: could not encode the %s response: %s",
                                peer, _api_name(key_version >> 16), describe(exc))
                    log.debug("encoder traceback", exc_info=True)
                    _count_failed(api)
                    writer.close()
                    return
                writer.write(frame)
                if api is not None:  # pre-created children: a dict lookup above and four increments here
                    api.requests.inc()
                    api.seconds.observe(time.perf_counter() - started)
                    api.sent.inc(len(frame))
                    if getattr(response, "error_code", 0):
                        api.errors.inc()
                if connection.close_after_response:  # a failed login or a SASL request out of turn
                    await writer.drain()
                    writer.close()
                    return
                if queue.empty() or writer.transport.get_write_buffer_size() > 1 << 20:
                    await writer.drain()
        except (ConnectionError, asyncio.CancelledError):
            return
        finally:
            while not queue.empty():  # unblocks the reader; _serve decides what becomes of the requests
                queue.get_nowait()


def _count_failed(api: ApiInstruments | None) -> None:
    if api is not None:
        api.requests.inc()
        api.errors.inc()


def _api_name(key: int) -> str:
    return ApiKey(key).name if key in ApiKey._value2member_map_ else f"api key {key}"


async def _unsupported_api_versions() -> ApiMessage:
    return build_api_versions_response(0, ErrorCode.UNSUPPORTED_VERSION)


def advertisable(host: str) -> str:
    """The host Metadata names for a listener bound to `host` (a wildcard bind names this machine)."""
    if host in ("", "0.0.0.0", "::"):
        return socket.gethostname()
    return host
