"""What a handler sees: the request's version and client, and the broker's state."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from kafka.protocol.api_message import ApiMessage

from icelog.config import Settings
from icelog.log.manager import LogManager

if TYPE_CHECKING:
    from icelog.coordinator.groups import GroupCoordinator
    from icelog.coordinator.transactions import TransactionCoordinator
    from icelog.schema.enforce.enforcement import Enforcer


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


@dataclass(frozen=True, slots=True)
class RequestContext:
    broker: BrokerState
    api_version: int
    client_id: str | None
    peer: str


Handler = Callable[[RequestContext, ApiMessage], Awaitable[ApiMessage | None]]
HANDLERS: dict[int, Handler] = {}


def handles(api_key: int) -> Callable[[Handler], Handler]:
    """Register a coroutine as the handler of one API key."""

    def register(func: Handler) -> Handler:
        HANDLERS[api_key] = func
        return func

    return register
