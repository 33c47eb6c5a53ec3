"""One SASL login on one connection: PLAIN (RFC 4616) or SCRAM-SHA-256/512 (RFC 5802), over the SecurityStore.

The wire layer hands each SaslAuthenticate token (or, after a v0 handshake, each raw token) to `step`; the
session answers the next server token and, once the client has proved who it is, names the user. Key
derivation (PLAIN's PBKDF2) and store reads run on a thread: the event loop serves other connections meanwhile.
"""

from __future__ import annotations

import asyncio

from icelog.meta.security import SecurityStore
from icelog.security.credentials import SCRAM_MECHANISMS, AuthenticationError, ScramServer, check_plain
from icelog.security.oauth import TokenValidator, bearer_token

PLAIN = "PLAIN"
OAUTHBEARER = "OAUTHBEARER"


def _failed(mechanism: str) -> AuthenticationError:
    # Kafka's words; never which of user or password was wrong
    return AuthenticationError(
        f"Authentication failed during authentication due to invalid credentials with SASL mechanism {mechanism}"
    )


class SaslSession:
    """The server side of one login; `user` is set once it succeeded."""

    def __init__(self, mechanism: str, store: SecurityStore, tokens: TokenValidator | None = None) -> None:
        self.mechanism = mechanism
        self._store = store
        self._tokens = tokens
        self._scram = ScramServer(mechanism, store) if mechanism in SCRAM_MECHANISMS else None
        self._steps = 0
        self.user: str | None = None

    async def step(self, token: bytes) -> bytes:
        """The server's answer to the client's next token; AuthenticationError ends the login."""
        self._steps += 1
        if self.user is not None:
            raise AuthenticationError(f"{self.mechanism} authentication is already complete")
        if self.mechanism == OAUTHBEARER:
            if self._tokens is None or self._steps > 1:
                raise _failed(OAUTHBEARER)
            self.user = await asyncio.to_thread(self._tokens.user, bearer_token(token))
            return b""
        if self._scram is None:
            user = await asyncio.to_thread(self._plain, token)
            self.user = user
            return b""
        if self._steps == 1:
            return await asyncio.to_thread(self._scram.first, token)
        if self._steps == 2:
            final = await asyncio.to_thread(self._scram.final, token)
            self.user = self._scram.user
            return final
        raise _failed(self.mechanism)

    def _plain(self, token: bytes) -> str:
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
        if not check_plain(self._store, user, password):
            raise _failed(PLAIN)
        return user
