"""The asyncio Kafka listener: framing, in-order responses per connection, bad-input handling."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import socket
import struct
import time
from collections import Counter
from collections.abc import Coroutine
from typing import Any, cast

from kafka.protocol.api_key import ApiKey
from kafka.protocol.api_message import ApiMessage

from icelog.config import Listener, principal_rules
from icelog.errors import ErrorCode
from icelog.instruments import ApiInstruments
from icelog.security.connections import Acceptor, bind
from icelog.security.log_lines import ThrottledLog, bounded, describe
from icelog.security.tls import NoMatchingRule, certificate_principal, server_context
from icelog.wire import codec, handlers  # noqa: F401  (handlers register themselves)
from icelog.wire.byte_budget import ByteBudget
from icelog.wire.context import HANDLERS, BrokerState, Connection, RequestContext
from icelog.wire.handlers import sasl
from icelog.wire.versions import build_api_versions_response, is_supported

log = logging.getLogger(__name__)

_SIZE = struct.Struct(">i")
MAX_IN_FLIGHT = 256  # requests read ahead per connection before we stop reading
# A request header with the longest client id (a 16-bit length) and room for tagged fields
_MAX_REQUEST_HEADER_BYTES = 64 * 1024
# A request is read in pieces of at most this much, each taking the byte budget once it has arrived: a reader
# waiting for budget holds one piece beside what its socket buffered.
_PIECE_BYTES = 256 * 1024
# What a SASL listener serves before the client has logged in (Kafka's SaslServerAuthenticator)
_BEFORE_LOGIN = frozenset({ApiKey.ApiVersions, ApiKey.SaslHandshake, ApiKey.SaslAuthenticate})
# A request read and handed to its handler: (api key << 16 | version, correlation id, the handler's task, when it
# was read whole: time.perf_counter()); -1 as the key for a bare SASL token
_Queued = tuple[int, int, asyncio.Task[ApiMessage | None], float]


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
        self._socket: asyncio.ReadTransport | None = None

    def set_transport(self, transport: asyncio.BaseTransport) -> None:
        super().set_transport(transport)
        self._socket = cast(asyncio.ReadTransport, transport)

    def stop_reading(self) -> None:
        """Read (and, on TLS, decrypt) nothing more from the socket: for bytes the connection will never use (a
        read would resume it, and none comes)."""
        if self._socket is not None and not self._socket.is_closing():
            self._socket.pause_reading()

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


class _SetupTimeout(Exception):
    """connection_setup_timeout_ms passed before the client logged in: close (counted in one log line)."""


class KafkaServer:
    """Accepts Kafka clients and dispatches each request to its handler.

    A connection counts against max.connections (and max.connections.per.ip) from accept, its TLS handshake
    included, to its close. Until a client of a SASL listener has logged in it is served one request at a time,
    each at most sasl.server.max.receive.size bytes and taking nothing of queued.max.request.bytes, and all
    within connection_setup_timeout_ms of the accept: what a client that has not logged in can hold is bounded.
    """

    def __init__(self, broker: BrokerState, max_connections: int) -> None:
        self.broker = broker
        self.max_connections = max_connections
        self._acceptors: list[Acceptor] = []
        self._advertised: dict[str, tuple[str, int]] = {}  # listener name -> what Metadata tells its clients
        self._principal_rules = principal_rules(broker.settings.ssl_principal_mapping_rules)
        self._tls = server_context(broker.settings)
        self._connections: set[asyncio.Task[None]] = set()
        self._handshaking: set[asyncio.Task[None]] = set()  # connections whose TLS handshake is under way
        self._writers: set[asyncio.StreamWriter] = set()
        # Requests whose connection is gone but which still finish (a Produce is applied as Kafka applies
        # one whose client left); held here so the loop's weak references do not drop them.
        self._detached: set[asyncio.Task[ApiMessage | None]] = set()
        self._per_ip: Counter[str] = Counter()
        self._budget = ByteBudget(broker.settings.queued_max_request_bytes)
        # What clients that have not logged in can cause at will: counted, one line per interval at most
        self._refused = ThrottledLog(log, "refused Kafka connections")
        self._oversized = ThrottledLog(log, "closed connections before login: request size over "
                                            f"sasl.server.max.receive.size={broker.settings.sasl_server_max_receive_size}"
                                            " or what the chosen SASL mechanism's tokens take")
        self._timed_out = ThrottledLog(log, "closed connections that did not log in within connection_setup_timeout_ms="
                                            f"{broker.settings.connection_setup_timeout_ms}")
        self._refused_before_login = ThrottledLog(log, "closed connections before login")

    async def start(self, accepting: bool = True) -> None:
        """Serve every listener (Kafka's `listeners`); the broker's advertised address is the first one's.
        `accepting=False` binds them (connections wait in the backlog) until `accept()`: a broker of a cluster
        first takes its partitions, knowing its ports."""
        for spec in self.broker.settings.listener_specs:
            try:
                sockets = bind(spec.host, spec.port)
            except OSError as exc:
                raise ListenerError(spec, exc) from None
            acceptor = Acceptor(sockets, functools.partial(self._on_accept, spec), f"Kafka listener {spec.name}")
            if accepting:
                acceptor.start()
            self._acceptors.append(acceptor)
            port = acceptor.port
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

    def accept(self) -> None:
        """Start accepting on listeners bound with start(accepting=False)."""
        for acceptor in self._acceptors:
            if not acceptor.serving():
                acceptor.start()

    def advertised(self) -> dict[str, tuple[str, int]]:
        """Each listener's name and the (host, port) Metadata names for it (once started)."""
        return dict(self._advertised)

    def endpoints(self) -> list[str]:
        """Each listener as a client is told to reach it: NAME://HOST:PORT (the bare address for the one default
        PLAINTEXT listener, as before listeners existed)."""
        specs = self.broker.settings.listener_specs
        if self.broker.settings.listeners is None:
            return [f"{self.broker.advertised_host}:{self.broker.advertised_port}"]
        return [f"{spec.name}://{':'.join(map(str, self._advertised[spec.name]))}" for spec in specs]

    def serving(self) -> bool:
        """Whether every Kafka listener is accepting connections (/readyz)."""
        return bool(self._acceptors) and all(acceptor.serving() for acceptor in self._acceptors)

    async def stop(self) -> None:
        for acceptor in self._acceptors:
            await acceptor.close()
        # Closing the sockets ends each connection's read loop normally; a TLS handshake under way is cancelled.
        for writer in list(self._writers):
            writer.transport.abort()
        for task in list(self._handshaking):
            task.cancel()
        if self._connections:
            await asyncio.wait(self._connections, timeout=5)
        for throttled in (self._refused, self._oversized, self._timed_out, self._refused_before_login):
            throttled.close()
        self.broker.validator.close()

    def _on_accept(self, spec: Listener, conn: socket.socket, ip: str) -> None:
        """A connection just accepted: closed at once past max.connections / max.connections.per.ip (counted in
        one log line per interval), else served."""
        settings = self.broker.settings
        if len(self._connections) >= self.max_connections:
            self._refused.event(f"max.connections={self.max_connections} reached (from {ip})")
        elif self._per_ip[ip] >= settings.max_connections_per_ip:
            self._refused.event(f"max.connections.per.ip={settings.max_connections_per_ip} reached (from {ip})")
        else:
            self._per_ip[ip] += 1
            task = asyncio.create_task(self._connection(conn, ip, spec))
            self._connections.add(task)
            task.add_done_callback(functools.partial(self._closed, ip))
            return
        conn.close()

    def _closed(self, ip: str, task: asyncio.Task[None]) -> None:
        self._connections.discard(task)
        self._per_ip[ip] -= 1
        if not self._per_ip[ip]:
            del self._per_ip[ip]
        exc = None if task.cancelled() else task.exception()  # retrieved: asyncio logs no traceback
        if exc is not None:
            log.warning("a connection from %s ended on an error: %s", ip, describe(exc))

    async def _connection(self, conn: socket.socket, ip: str, spec: Listener) -> None:
        loop = asyncio.get_running_loop()
        accepted = time.monotonic()
        reader = _Reader(1 << 20)
        protocol = asyncio.StreamReaderProtocol(reader)
        task = asyncio.current_task()
        assert task is not None
        self._handshaking.add(task)
        try:
            transport, _ = await loop.connect_accepted_socket(
                lambda: protocol, conn, ssl=self._tls if spec.tls else None,
                ssl_handshake_timeout=self.broker.settings.connection_setup_timeout_ms / 1000 if spec.tls else None,
            )
        except OSError:  # a failed or timed-out TLS handshake (a plaintext client, no certificate), a client gone
            conn.close()
            return
        except asyncio.CancelledError:
            conn.close()
            raise
        finally:
            self._handshaking.discard(task)
        writer = asyncio.StreamWriter(transport, protocol, reader, loop)
        peername = writer.get_extra_info("peername")
        peer = f"{peername[0]}:{peername[1]}" if peername else "?"
        connection = Connection(peer, ip, spec)
        connection.accepted = accepted
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
        self._writers.add(writer)
        metrics = self.broker.wire_metrics
        open_gauge = metrics.by_listener.get(spec.name) if metrics is not None else None
        if open_gauge is not None:
            open_gauge.inc()
        try:
            await self._serve(reader, writer, connection)
        finally:
            if open_gauge is not None:
                open_gauge.dec()
            self._writers.discard(writer)

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
                if not connection.authenticated:
                    # Before the login, one request at a time (as Kafka's authenticator): nothing is read ahead,
                    # and whether the next request may be served depends on how this one ends.
                    await self._before_login(reader, connection, item[2])
        except _Disconnect as exc:
            if connection.authenticated:
                log.warning("closing connection from %s: %s", peer, exc)
            else:
                self._refused_before_login.event(f"{peer}: {exc}")
        except (asyncio.IncompleteReadError, ConnectionError):
            peer_gone = True
        except _Idle:
            log.debug("closing connection from %s: idle past connections.max.idle.ms", peer)
            peer_gone = True
        except _SetupTimeout:
            self._timed_out.event(f"from {peer}")
            peer_gone = True
        finally:
            if peer_gone or sender.done():
                # Nobody will read an answer: let go of the socket and every long poll at once, instead of
                # holding a half-closed socket (CLOSE_WAIT) and its descriptor until max_wait_ms.
                self._release(inflight, connection)
                writer.transport.abort()
                sender.cancel()
            else:  # a bad request: the answers to the requests before it still go out, then we close
                self._release(inflight, connection, fetches_only=True)
                await queue.put(None)
                with contextlib.suppress(Exception):
                    await sender
            writer.close()

    async def _before_login(self, reader: _Reader, connection: Connection,
                            task: asyncio.Task[ApiMessage | None]) -> None:
        """Wait until a request sent before the login is handled, within connection_setup_timeout_ms."""
        try:
            async with asyncio.timeout_at(self._setup_deadline(connection)):
                await reader.unless_gone(_finished(task))
        except TimeoutError:
            raise _SetupTimeout() from None

    def _before_login_cap(self, connection: Connection) -> int:
        """The largest request a connection that has not logged in may send: sasl.server.max.receive.size, and
        once its mechanism is chosen, what that mechanism's longest token can take (a request header of a client
        id at most besides), so a token no login can accept is not even read."""
        cap = self.broker.settings.sasl_server_max_receive_size
        session = connection.sasl
        if session is not None and session.max_token_bytes is not None:
            cap = min(cap, session.max_token_bytes + (0 if connection.sasl_raw else _MAX_REQUEST_HEADER_BYTES))
        return cap

    def _setup_deadline(self, connection: Connection) -> float:
        """When a connection that has not logged in is closed, in the event loop's clock."""
        left = connection.accepted + self.broker.settings.connection_setup_timeout_ms / 1000 - time.monotonic()
        return asyncio.get_running_loop().time() + left

    def _release(self, inflight: _InFlight, connection: Connection, fetches_only: bool = False) -> None:
        """End a closing connection's long polls (and, before the login, its login steps: nobody is left to log
        in); its other requests run to completion unanswered."""
        for task, key in list(inflight.items()):
            if key == ApiKey.Fetch or not connection.authenticated:
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
        loop = asyncio.get_running_loop()
        deadline = loop.time() + idle_s
        while True:
            if not connection.authenticated:
                deadline = min(deadline, self._setup_deadline(connection))
            try:
                async with asyncio.timeout_at(deadline):
                    header = await reader.readexactly(4)  # consumes nothing unless it completes
                break
            except TimeoutError:
                if not connection.authenticated and loop.time() >= self._setup_deadline(connection):
                    raise _SetupTimeout() from None
                # idle: no request for idle_s and none in flight (a long poll is not idleness)
                deadline = loop.time() + (idle_s if inflight else inflight.last_done + idle_s - time.monotonic())
                if deadline <= loop.time():
                    raise _Idle() from None
            except asyncio.IncompleteReadError as exc:
                if exc.partial:
                    raise _Disconnect("truncated size prefix") from None
                return None
        (size,) = _SIZE.unpack(header)
        limit = settings.socket_request_max_bytes
        if size <= 0 or size > limit:
            raise _Disconnect(f"request size {size} is outside 1..socket.request.max.bytes={limit}")
        if not connection.authenticated and size > self._before_login_cap(connection):
            # Kafka's SaslServerAuthenticator (InvalidReceiveException): closed before a byte more is read
            self._oversized.event(f"{size} bytes from {connection.peer}")
            reader.stop_reading()  # the token's bytes are never read: neither received nor decrypted meanwhile
            if size <= settings.sasl_server_max_receive_size:
                # A token Kafka would read and refuse (SASL_AUTHENTICATION_FAILED), closing after its failed-login
                # delay: so here, unread. A client logging in again and again then pays a delay per attempt
                # besides its TLS handshake, as with any wrong password.
                await asyncio.sleep(settings.connection_failed_authentication_delay_ms / 1000)
            return None
        if size > self._budget.limit:
            raise _Disconnect(f"request size {size} is over queued.max.request.bytes={self._budget.limit}")
        # Before the login a request takes nothing of the budget: it is at most sasl.server.max.receive.size,
        # and the connection has one request at a time.
        reserve = connection.authenticated
        frame = await self._read_body(reader, connection, size, idle_s, reserve)
        reserved = size if reserve else 0
        try:
            item = self._dispatch(connection, frame, size)
        except BaseException:
            self._budget.release(reserved)
            raise
        if reserved:
            item[2].add_done_callback(lambda _: self._budget.release(reserved))
        metrics = self.broker.wire_metrics
        if metrics is not None:
            api = metrics.by_key.get(item[0] >> 16)
            if api is not None:
                api.received.inc(size + 4)
        return (*item, time.perf_counter())

    async def _read_body(self, reader: _Reader, connection: Connection, size: int, idle_s: float,
                         reserve: bool) -> bytes:
        """The `size` bytes of a request; with `reserve` each piece takes queued.max.request.bytes as it arrives
        (the reader stops reading while the budget is short). A request whose bytes stop coming for
        connections.max.idle.ms (before the login: past connection_setup_timeout_ms) closes the connection."""
        loop = asyncio.get_running_loop()
        request = object()  # identifies this request to the budget
        pieces: list[bytes] = []
        held = 0  # bytes read (and, after the login, taken from the budget)
        try:
            while held < size:
                deadline = self._setup_deadline(connection) if not reserve else loop.time() + idle_s
                try:
                    async with asyncio.timeout_at(deadline):
                        piece = await reader.read(min(size - held, _PIECE_BYTES))
                except TimeoutError:
                    if not reserve:
                        raise _SetupTimeout() from None
                    raise _Disconnect(f"no byte of a {size}-byte request for connections.max.idle.ms") from None
                if not piece:
                    raise _Disconnect(f"connection closed inside a {size}-byte request")
                if reserve and not self._budget.try_acquire(len(piece), request):
                    # until then this socket is not read: back-pressure
                    await reader.unless_gone(self._budget.acquire(len(piece), request, started=held > 0))
                held += len(piece)
                pieces.append(piece)
        except BaseException:
            if reserve:
                self._budget.release(held)
            raise
        finally:
            if reserve:
                self._budget.read_whole(request)
        return pieces[0] if len(pieces) == 1 else b"".join(pieces)

    def _dispatch(
        self, connection: Connection, frame: bytes, size: int
    ) -> tuple[int, int, asyncio.Task[ApiMessage | None]]:
        """A request read whole, handed to its handler: (api key << 16 | version, correlation id, its task)."""
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


async def _finished(task: asyncio.Task[ApiMessage | None]) -> None:
    await asyncio.wait({task})


async def _unsupported_api_versions() -> ApiMessage:
    return build_api_versions_response(0, ErrorCode.UNSUPPORTED_VERSION)


def advertisable(host: str) -> str:
    """The host Metadata names for a listener bound to `host` (a wildcard bind names this machine)."""
    if host in ("", "0.0.0.0", "::"):
        return socket.gethostname()
    return host
