"""One SASL login on one connection: PLAIN (RFC 4616) or SCRAM-SHA-256/512 (RFC 5802), over the SecurityStore.

The wire layer hands each SaslAuthenticate token (or, after a v0 handshake, each raw token) to `step`; the
session answers the next server token and, once the client has proved who it is, names the user. The checks run
where LoginChecks puts them (PLAIN's key derivation in the login process, the rest on login threads), one client
address a few at a time; a token longer than any valid one is refused before any of that.
"""

from __future__ import annotations

from icelog.meta.security import SecurityStore
from icelog.security.credentials import (
    MAX_PASSWORD_CHARS,
    MAX_SCRAM_MESSAGE_BYTES,
    MAX_USER_NAME,
    SCRAM_MECHANISMS,
    AuthenticationError,
    ScramServer,
)
from icelog.security.logins import LoginChecks
from icelog.security.oauth import TokenValidator, bearer_token

PLAIN = "PLAIN"
OAUTHBEARER = "OAUTHBEARER"
# authzid NUL user NUL password, each at most 4 bytes a character
_PLAIN_TOKEN_BYTES = 4 * (2 * MAX_USER_NAME + MAX_PASSWORD_CHARS) + 2


def _failed(mechanism: str) -> AuthenticationError:
    # Kafka's words; never which of user or password was wrong
    return AuthenticationError(
        f"Authentication failed during authentication due to invalid credentials with SASL mechanism {mechanism}"
    )


class SaslSession:
    """The server side of one login; `user` is set once it succeeded."""

    def __init__(self, mechanism: str, store: SecurityStore, logins: LoginChecks, client: str,
                 tokens: TokenValidator | None = None) -> None:
        self.mechanism = mechanism
        self._store = store
        self._logins = logins
        self._client = client  # the client's address: its checks take turns (LoginChecks.turn)
        self._tokens = tokens
        self._scram = ScramServer(mechanism, store) if mechanism in SCRAM_MECHANISMS else None
        self._steps = 0
        self.user: str | None = None

    @property
    def max_token_bytes(self) -> int | None:
        """The longest token a login with this mechanism can accept (None: no bound of its own, OAUTHBEARER's
        tokens are the identity provider's): PLAIN's authzid, user name and password of at most 4 bytes a
        character, a SCRAM message."""
        if self.mechanism == PLAIN:
            return _PLAIN_TOKEN_BYTES
        if self._scram is not None:
            return MAX_SCRAM_MESSAGE_BYTES
        return None

    async def step(self, token: bytes) -> bytes:
        """The server's answer to the client's next token; AuthenticationError ends the login."""
        self._steps += 1
        if self.user is not None:
            raise AuthenticationError(f"{self.mechanism} authentication is already complete")
        async with self._logins.turn(self._client):
            return await self._step(token)

    async def _step(self, token: bytes) -> bytes:
        if self.mechanism == OAUTHBEARER:
            if self._tokens is None or self._steps > 1:
                raise _failed(OAUTHBEARER)
            self.user = await self._logins.in_thread(self._tokens.user, bearer_token(token))
            return b""
        if self._scram is None:
            self.user = await self._plain(token)
            return b""
        if len(token) > MAX_SCRAM_MESSAGE_BYTES or self._steps > 2:
            raise _failed(self.mechanism)
        if self._steps == 1:
            return await self._logins.in_thread(self._scram.first, token)
        final = await self._logins.in_thread(self._scram.final, token)
        self.user = self._scram.user
        return final

    async def _plain(self, token: bytes) -> str:
        if len(token) > _PLAIN_TOKEN_BYTES:
            raise _failed(PLAIN)
        parts = token.split(b"\0")
        if len(parts) != 3:
            raise AuthenticationError("Invalid SASL/PLAIN message: expected authzid NUL authcid NUL password")
        try:
            authzid, user, password = (p.decode("utf-8") for p in parts)
        except UnicodeDecodeError:
            raise AuthenticationError("Invalid SASL/PLAIN message: not UTF-8") from None
        if not user or not password:
            raise AuthenticationError("Invalid SASL/PLAIN message: empty user name or password")
        if authzid and authzid != user:
            raise AuthenticationError("SASL/PLAIN authorization id must be empty or the user name")
        if not await self._logins.password(self._store, user, password):
            raise _failed(PLAIN)
        return user
