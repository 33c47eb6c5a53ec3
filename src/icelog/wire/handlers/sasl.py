"""SaslHandshake (v0, v1) and SaslAuthenticate: logins on SASL_PLAINTEXT and SASL_SSL listeners.

Until a connection has logged in, the server serves it nothing but ApiVersions and these two (wire/server.py).
A v1 handshake is followed by SaslAuthenticate requests; a v0 handshake by raw tokens, each a size-prefixed
frame with no request header (KIP-152's older form), which the server hands to `raw_token`.
"""

from __future__ import annotations

import asyncio
import logging
import struct
import time

from kafka.protocol.api_key import ApiKey
from kafka.protocol.api_message import ApiMessage
from kafka.protocol.sasl import SaslAuthenticateResponse, SaslHandshakeResponse

from icelog.errors import ErrorCode
from icelog.meta.security import SecurityStore
from icelog.security.credentials import AuthenticationError
from icelog.security.sasl import SaslSession
from icelog.wire.context import Connection, RequestContext, handles

log = logging.getLogger(__name__)

_SIZE = struct.Struct(">i")


class _FailureLog:
    """One log line per ten seconds about failed logins, however many there are (a guesser cannot flood it)."""

    def __init__(self) -> None:
        self.count = 0
        self.logged = 0.0

    def failed(self, connection: Connection, mechanism: str, reason: str) -> None:
        self.count += 1
        now = time.monotonic()
        if now - self.logged >= 10:
            log.warning("%d failed SASL login(s); the last from %s with %s: %s",
                        self.count, connection.peer, mechanism, reason)
            self.count, self.logged = 0, now


_failures = _FailureLog()


def _store(ctx: RequestContext) -> SecurityStore:
    store = ctx.broker.security
    assert store is not None, "a SASL listener runs with the broker's store"
    return store


@handles(ApiKey.SaslHandshake)
async def sasl_handshake(ctx: RequestContext, request: ApiMessage) -> ApiMessage:
    connection = ctx.connection
    enabled = list(ctx.broker.settings.sasl_mechanisms)
    if connection.listener is None or not connection.listener.sasl or connection.sasl is not None:
        connection.close_after_response = True
        return SaslHandshakeResponse(error_code=int(ErrorCode.ILLEGAL_SASL_STATE), mechanisms=enabled)
    mechanism = str(request.mechanism)
    if mechanism not in enabled:
        connection.close_after_response = True  # Kafka closes the connection after saying which it has
        return SaslHandshakeResponse(error_code=int(ErrorCode.UNSUPPORTED_SASL_MECHANISM), mechanisms=enabled)
    connection.sasl = SaslSession(mechanism, _store(ctx), ctx.broker.logins, connection.host, ctx.broker.tokens)
    connection.sasl_raw = ctx.api_version == 0
    return SaslHandshakeResponse(error_code=0, mechanisms=enabled)


@handles(ApiKey.SaslAuthenticate)
async def sasl_authenticate(ctx: RequestContext, request: ApiMessage) -> ApiMessage:
    connection = ctx.connection
    session = connection.sasl
    if session is None or connection.sasl_raw or connection.authenticated:
        connection.close_after_response = True
        return SaslAuthenticateResponse(
            error_code=int(ErrorCode.ILLEGAL_SASL_STATE), error_message="Unexpected SaslAuthenticate request",
            auth_bytes=b"", session_lifetime_ms=0,
        )
    try:
        token = await _step(ctx.broker.settings.connection_failed_authentication_delay_ms, connection, session,
                            bytes(request.auth_bytes))
    except AuthenticationError as exc:
        connection.close_after_response = True
        return SaslAuthenticateResponse(
            error_code=int(ErrorCode.SASL_AUTHENTICATION_FAILED), error_message=str(exc), auth_bytes=b"",
            session_lifetime_ms=0,
        )
    return SaslAuthenticateResponse(error_code=0, error_message=None, auth_bytes=token, session_lifetime_ms=0)


async def raw_token(delay_ms: int, connection: Connection, token: bytes) -> bytes | None:
    """A token after a v0 handshake: the answer as a size-prefixed frame; a failed login closes the connection
    with no answer, as Kafka does for this form."""
    assert connection.sasl is not None
    try:
        answer = await _step(delay_ms, connection, connection.sasl, token)
    except AuthenticationError as exc:
        raise ConnectionAbortedError(f"SASL authentication failed: {exc}") from None
    return _SIZE.pack(len(answer)) + answer


async def _step(delay_ms: int, connection: Connection, session: SaslSession, token: bytes) -> bytes:
    try:
        answer = await session.step(token)
    except AuthenticationError as exc:
        _failures.failed(connection, session.mechanism, str(exc))
        # Kafka's connection.failed.authentication.delay.ms: the answer (and the close) waits, which slows
        # password guessing; the connection's checks are over, so the wait holds no login turn.
        await asyncio.sleep(delay_ms / 1000)
        raise
    if session.user is not None:
        connection.principal = f"User:{session.user}"
        connection.authenticated = True
        connection.sasl_raw = False
    return answer
