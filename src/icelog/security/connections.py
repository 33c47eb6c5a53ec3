"""Connections before anyone has logged in: listening sockets with an accept loop of icelog's own, descriptor
budgets per server, and log lines that count what clients can cause at will instead of repeating it.

Why an accept loop of our own: asyncio's server creates a TLS connection's stream only once its handshake is
done, so a server counting its connections there misses every socket still in the handshake; 20,000 silent TCP
connections to a TLS port took every descriptor of the process while the broker counted none (issue 42). Here a
connection counts from accept to close, a connection over its server's budget is closed as soon as accepted,
and the budgets add up to less than the process's descriptor limit, with room kept for the broker's own files
and for /healthz.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import resource
import socket
import ssl
from collections.abc import Callable
from dataclasses import dataclass

from icelog.security.log_lines import ThrottledLog

log = logging.getLogger(__name__)

# Descriptors kept for the broker's own files (intake segments, the metadata store, the archiver's pipes): at
# least this many, or a tenth of the limit.
OWN_FILES_MIN = 256
METRICS_MAX_CONNECTIONS = 64  # scrapers and health probes; the metrics listener's own budget
REGISTRY_MAX_CONNECTIONS = 1024  # at most; a tenth of the descriptor limit when that is less
HTTP_KEEPALIVE_S = 75.0  # an HTTP connection with no request in progress is closed after this long
TLS_HANDSHAKE_TIMEOUT_S = 10.0  # the HTTP listeners' (the Kafka listeners take connections_setup_timeout_ms)
# Connections the kernel queues before accept(): asyncio's default (Kafka's socket.listen.backlog.size is 50). A
# longer queue lets a burst of 1,000 connections in at once, and their work then holds the event loop in one go
# (the innocent producer's p50 went from 1 ms to 900 ms in bench/hostile_bench.py's polls phase); a short one makes
# the burst's clients wait for their SYN to be retried, as with any server.
LISTEN_BACKLOG = 100
_ACCEPTS_PER_TURN = 64  # connections accepted in a row before other tasks get the loop
_ACCEPT_RETRY_S = 0.1  # after accept() found no descriptor free (the budgets above make that rare)
_OUT_OF_RESOURCES = (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM)


def raise_descriptor_limit() -> int:
    """Raise the soft RLIMIT_NOFILE to the hard limit where the system allows; the soft limit in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and soft != hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
        except (ValueError, OSError) as exc:
            log.info("could not raise the descriptor limit from %d to %d: %s", soft, hard, exc)
    return soft


@dataclass(frozen=True)
class ConnectionBudgets:
    """How many connections each server of the process may hold, out of `descriptors` (RLIMIT_NOFILE)."""

    descriptors: int
    kafka: int
    registry: int
    metrics: int

    @property
    def own_files(self) -> int:
        """Descriptors left for everything that is not a client connection."""
        return self.descriptors - self.kafka - self.registry - self.metrics


def connection_budgets(descriptors: int, max_connections: int | None) -> ConnectionBudgets:
    """The budgets for a descriptor limit: the metrics listener 64, the registry a tenth of the limit (at most
    1,024), the broker's own files a tenth (at least 256), the Kafka listeners the rest unless max_connections
    says otherwise (Kafka's max.connections)."""
    registry = max(16, min(REGISTRY_MAX_CONNECTIONS, descriptors // 10))
    kafka = max(16, descriptors - max(OWN_FILES_MIN, descriptors // 10) - METRICS_MAX_CONNECTIONS - registry)
    return ConnectionBudgets(descriptors, kafka if max_connections is None else max_connections, registry,
                             METRICS_MAX_CONNECTIONS)


def bind(host: str, port: int, backlog: int = LISTEN_BACKLOG) -> list[socket.socket]:
    """Listening sockets for host:port: each address the host resolves to (both families for an empty host), as
    asyncio's create_server binds them; non-blocking. Raises OSError if an address cannot be bound."""
    infos = socket.getaddrinfo(host or None, port, family=socket.AF_UNSPEC, type=socket.SOCK_STREAM,
                               flags=socket.AI_PASSIVE)
    sockets: list[socket.socket] = []
    try:
        for family, kind, proto, _, address in dict.fromkeys(infos):
            sock = socket.socket(family, kind, proto)
            sockets.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            try:
                sock.bind(address)
            except OSError as exc:
                if exc.errno == errno.EADDRNOTAVAIL:  # the family is not enabled here (asyncio skips it too)
                    sockets.pop().close()
                    continue
                raise
            sock.listen(backlog)
            sock.setblocking(False)
    except BaseException:
        for sock in sockets:
            sock.close()
        raise
    if not sockets:
        raise OSError(errno.EADDRNOTAVAIL, f"no address of {host!r} can be bound")
    return sockets


class Acceptor:
    """Accepts connections on listening sockets and hands each to `on_accept` (which closes it or serves it).

    As asyncio's own server does: when a listening socket is readable, up to _ACCEPTS_PER_TURN connections are
    accepted in one go, then the loop serves others (loop.sock_accept would cost a reader registration and a loop
    turn per connection: a burst of 1,000 held the innocent producer's p50 at 13 ms). accept() finding no
    descriptor free is logged (counted) and retried a little later, never a traceback."""

    def __init__(self, sockets: list[socket.socket], on_accept: Callable[[socket.socket, str], None],
                 what: str) -> None:
        self.sockets = sockets
        self._on_accept = on_accept
        self._exhausted = ThrottledLog(log, f"{what}: no descriptor free to accept a connection")
        self._serving = False
        self._retries: dict[int, asyncio.TimerHandle] = {}  # listening fd -> when accepting resumes

    @property
    def port(self) -> int:
        return int(self.sockets[0].getsockname()[1])

    def start(self) -> None:
        loop = asyncio.get_running_loop()
        for sock in self.sockets:
            loop.add_reader(sock.fileno(), self._accept_ready, sock)
        self._serving = True

    def serving(self) -> bool:
        return self._serving

    async def close(self) -> None:
        if self._serving:
            loop = asyncio.get_running_loop()
            for sock in self.sockets:
                loop.remove_reader(sock.fileno())
        self._serving = False
        for retry in self._retries.values():
            retry.cancel()
        for sock in self.sockets:
            sock.close()
        self._exhausted.close()

    def _accept_ready(self, listening: socket.socket) -> None:
        for _ in range(_ACCEPTS_PER_TURN):
            try:
                conn, address = listening.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                if exc.errno in _OUT_OF_RESOURCES:
                    self._exhausted.event(exc.strerror or str(exc))
                    self._pause(listening)
                    return
                continue  # the peer left before accept() (ECONNABORTED and the like)
            conn.setblocking(False)
            try:
                self._on_accept(conn, str(address[0]) if isinstance(address, tuple) else "?")
            except Exception:  # a bug here must not end accepting: close this one, say why
                conn.close()
                log.exception("could not take a connection")

    def _pause(self, listening: socket.socket) -> None:
        """Stop accepting on `listening` for _ACCEPT_RETRY_S (the pending connections wait in the backlog)."""
        loop = asyncio.get_running_loop()
        loop.remove_reader(listening.fileno())

        def resume() -> None:
            if self._serving:
                loop.add_reader(listening.fileno(), self._accept_ready, listening)

        self._retries[listening.fileno()] = loop.call_later(_ACCEPT_RETRY_S, resume)


class HttpListener:
    """An aiohttp server (`AppRunner.server`, the protocol factory) served through an Acceptor: at most
    `max_connections` connections, TLS handshakes under way included; the rest are closed when accepted."""

    def __init__(self, server: Callable[[], asyncio.BaseProtocol], connections: Callable[[], int],
                 ssl_context: ssl.SSLContext | None, max_connections: int, what: str) -> None:
        self._server = server
        self._connections = connections  # connections the server holds (aiohttp's web.Server.connections)
        self._ssl = ssl_context
        self.max_connections = max_connections
        self._what = what
        self._handshakes: set[asyncio.Task[None]] = set()
        self._refused = ThrottledLog(log, f"{what}: refused connections ({max_connections} open at most)")
        self._acceptor: Acceptor | None = None

    async def start(self, host: str, port: int) -> None:
        """Listen on host:port (raises OSError if the address is taken)."""
        self._acceptor = Acceptor(bind(host, port), self._on_accept, self._what)
        self._acceptor.start()

    @property
    def port(self) -> int:
        assert self._acceptor is not None
        return self._acceptor.port

    async def close(self) -> None:
        if self._acceptor is not None:
            await self._acceptor.close()
        for task in list(self._handshakes):
            task.cancel()
        if self._handshakes:
            await asyncio.wait(self._handshakes)
        self._refused.close()

    def _on_accept(self, conn: socket.socket, ip: str) -> None:
        if self._connections() + len(self._handshakes) >= self.max_connections:
            self._refused.event(f"from {ip}")
            conn.close()
            return
        task = asyncio.create_task(self._connect(conn))
        self._handshakes.add(task)
        task.add_done_callback(self._handshakes.discard)

    async def _connect(self, conn: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        try:
            await loop.connect_accepted_socket(
                self._server, conn, ssl=self._ssl,
                ssl_handshake_timeout=TLS_HANDSHAKE_TIMEOUT_S if self._ssl is not None else None,
            )
        except OSError:  # a failed or timed-out TLS handshake, a client gone: nothing to log
            conn.close()
        except asyncio.CancelledError:
            conn.close()
            raise
