"""What a handler sees: the request's version and client, and the broker's state."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from kafka.protocol.api_message import ApiMessage

from icelog.config import Listener, Settings
from icelog.log.manager import LogManager
from icelog.security.acl import ACLOperation, ACLResourceType
from icelog.security.logins import LoginChecks
from icelog.wire.validator import Validator

if TYPE_CHECKING:
    from icelog.cluster.controller import ClusterController
    from icelog.coordinator.groups import GroupCoordinator
    from icelog.coordinator.transactions import TransactionCoordinator
    from icelog.instruments import WireMetrics
    from icelog.meta.security import SecurityStore
    from icelog.schema.enforce.enforcement import Enforcer
    from icelog.security.authorizer import Authorizer
    from icelog.security.oauth import TokenValidator
    from icelog.security.sasl import SaslSession


@dataclass
class BrokerState:
    """Shared by every connection: configuration and the logs."""

    settings: Settings
    logs: LogManager
    advertised_host: str
    advertised_port: int
    groups: GroupCoordinator | None = None  # set by the Broker
    transactions: TransactionCoordinator | None = None
    enforcer: Enforcer | None = None  # schema data enforcement on produce (set by the Broker)
    validator: Validator = field(default_factory=Validator)  # checks big produced records off the event loop
    authorizer: Authorizer | None = None  # ACLs (None: every principal may do anything)
    security: SecurityStore | None = None  # users' credentials, for SASL logins (set by the Broker)
    tokens: TokenValidator | None = None  # OAUTHBEARER's JWT checks, when that mechanism is enabled
    wire_metrics: WireMetrics | None = None  # per-API request metrics (None: metrics_listen is off)
    logins: LoginChecks = field(default_factory=LoginChecks)  # where credential checks run (shared with the registry)
    cluster: ClusterController | None = None  # one broker of several (issue 46); None: a broker alone


ANONYMOUS = "User:ANONYMOUS"


class Connection:
    """What the requests of one client connection share."""

    def __init__(self, peer: str, host: str = "", listener: Listener | None = None) -> None:
        self.peer = peer  # host:port, for log lines
        self.host = host  # the client's address, as ACLs name hosts
        self.listener = listener
        # Kafka's principal: User:ANONYMOUS until SASL or a client certificate says otherwise
        self.principal = ANONYMOUS
        self.authenticated = listener is None or not listener.sasl  # SASL listeners serve nothing else before
        self.sasl: SaslSession | None = None  # the login under way (after SaslHandshake)
        self.sasl_raw = False  # a v0 handshake: the next frames are bare SASL tokens
        self.close_after_response = False  # a failed login: answer, then close (as Kafka)
        self.accepted = time.monotonic()  # when the connection was accepted (its login must end in time)
        self.advertised = ("", 0)  # (host, port) Metadata names for this listener
        self._produce_turn: asyncio.Future[None] | None = None

    def produce_turn(self) -> tuple[asyncio.Future[None] | None, asyncio.Future[None]]:
        """(the previous Produce's turn or None, this one's): a Produce appends once the one before it on the
        connection has (`pass_turn`), so requests that validate off the event loop keep the client's order
        (an idempotent producer pipelines up to five, and Kafka's broker handles them one by one)."""
        previous = self._produce_turn
        mine: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._produce_turn = mine
        return (None if previous is None or previous.done() else previous), mine

    def pass_turn(self, mine: asyncio.Future[None]) -> None:
        if not mine.done():
            mine.set_result(None)
        if self._produce_turn is mine:
            self._produce_turn = None


@dataclass(frozen=True, slots=True)
class RequestContext:
    broker: BrokerState
    api_version: int
    client_id: str | None
    connection: Connection

    @property
    def peer(self) -> str:
        return self.connection.peer

    def authorize(self, operation: ACLOperation, resource_type: ACLResourceType, name: str) -> bool:
        """Whether this connection's principal may do `operation` on the resource (always, without ACLs)."""
        authorizer = self.broker.authorizer
        if authorizer is None:
            return True
        return authorizer.authorize(self.connection.principal, self.connection.host, operation, resource_type, name)


Handler = Callable[[RequestContext, ApiMessage], Awaitable[ApiMessage | None]]
HANDLERS: dict[int, Handler] = {}


def handles(api_key: int) -> Callable[[Handler], Handler]:
    """Register a coroutine as the handler of one API key."""

    def register(func: Handler) -> Handler:
        HANDLERS[api_key] = func
        return func

    return register
