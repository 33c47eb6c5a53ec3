"""Users' credentials: SCRAM (RFC 5802/7677, through `scramp`) and PLAIN checked against the same salted keys.

Only salted SCRAM keys are stored (meta/security.py's ScramCredential); a PLAIN login derives the SCRAM keys
from the password it sent and compares them in constant time, so PLAIN needs no stored password either.
"""

from __future__ import annotations

from icelog.errors import IcelogError
from icelog.meta.security import ScramCredential, SecurityStore

SCRAM_MECHANISMS = ("SCRAM-SHA-256", "SCRAM-SHA-512")
DEFAULT_ITERATIONS = 4096  # Kafka's default for kafka-configs --add-config 'SCRAM-SHA-512=[password=...]'
MIN_ITERATIONS = 4096  # Kafka refuses fewer (RFC 7677's minimum)


class AuthenticationError(IcelogError):
    """A login failed; the message is safe to send to the client (it never says which part was wrong)."""


def make_credential(user: str, mechanism: str, password: str, iterations: int = DEFAULT_ITERATIONS,
                    salt: bytes | None = None) -> ScramCredential:
    """The salted SCRAM credential of `password` (a random salt unless given)."""
    raise NotImplementedError


def check_plain(store: SecurityStore, user: str, password: str) -> bool:
    """Whether `password` is the user's, against any of its stored SCRAM credentials (constant-time compare)."""
    raise NotImplementedError


class ScramServer:
    """The server side of one SCRAM exchange (client-first → server-first → client-final → server-final)."""

    def __init__(self, mechanism: str, store: SecurityStore) -> None:
        raise NotImplementedError

    def first(self, client_first: bytes) -> bytes:
        """The server-first message; raises AuthenticationError (unknown user gets the same error as a bad proof)."""
        raise NotImplementedError

    def final(self, client_final: bytes) -> bytes:
        """The server-final message once the client's proof checks; raises AuthenticationError otherwise."""
        raise NotImplementedError

    @property
    def user(self) -> str:
        """The authenticated user (after `final`)."""
        raise NotImplementedError
