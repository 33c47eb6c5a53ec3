"""Users' credentials: SCRAM (RFC 5802/7677, through `scramp`) and PLAIN checked against the same salted keys.

Only salted SCRAM keys are stored (meta/security.py's ScramCredential); a PLAIN login derives the SCRAM keys
from the password it sent and compares them in constant time, so PLAIN needs no stored password either.
The SCRAM exchange itself is scramp's (a maintained implementation with constant-time proof checks); this
module only feeds it the stored keys and turns every failure into one message that names no cause, so a
client cannot tell an unknown user from a wrong password.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets

import scramp
from scramp.utils import ScramException, saslprep

from icelog.errors import IcelogError
from icelog.meta.security import ScramCredential, SecurityStore

SCRAM_MECHANISMS = ("SCRAM-SHA-256", "SCRAM-SHA-512")
DEFAULT_ITERATIONS = 4096  # Kafka's default for kafka-configs --add-config 'SCRAM-SHA-512=[password=...]'
MIN_ITERATIONS = 4096  # Kafka refuses fewer (RFC 7677's minimum)
MAX_ITERATIONS = 16384  # Kafka refuses more: each PLAIN login and each `icelog user add` pays the iterations
MIN_SALT_BYTES = 12  # scramp refuses shorter salts at login, so a credential with one could never be used
MAX_USER_NAME = 255
MAX_PASSWORD_CHARS = 1024  # longer passwords are refused when made and at login, before any work
# A SCRAM client message is a few hundred bytes (a user name of at most MAX_USER_NAME characters, each written
# as at most 3, a nonce, a proof); anything longer is refused before scramp parses (and SASLprep's) it.
MAX_SCRAM_MESSAGE_BYTES = 2048
_HASHES = {"SCRAM-SHA-256": hashlib.sha256, "SCRAM-SHA-512": hashlib.sha512}
# Salts of users that do not exist derive from this per-process secret: the same user gets the same salt at
# every attempt (as a real one would), and nothing outside the process can predict it.
_DECOY_SECRET = secrets.token_bytes(32)


class AuthenticationError(IcelogError):
    """A login failed; the message is safe to send to the client (it never says which part was wrong)."""


class CredentialError(IcelogError, ValueError):
    """A credential that cannot be made: a bad user name, mechanism, password, salt or iteration count.
    The message says what to change and never quotes the password."""


def failure_message(mechanism: str) -> str:
    """Kafka's wording for every failed SCRAM or PLAIN login."""
    return f"Authentication failed during authentication due to invalid credentials with SASL mechanism {mechanism}"


def check_user_name(user: str) -> str:
    """`user` if it can name a SCRAM user, else CredentialError with the rule.

    Printable, no white space, no ':' (HTTP basic auth splits on the first one), not '*' (a principal `User:*`
    is the ACL wildcard), and already in SASLprep's normal form (SCRAM clients send names through SASLprep, so
    a name that changes under it could never log in)."""
    if not user or len(user) > MAX_USER_NAME:
        raise CredentialError(f"a user name has 1 to {MAX_USER_NAME} characters")
    if user == "*" or ":" in user or any(c.isspace() or not c.isprintable() for c in user):
        raise CredentialError(f"user name {user!r}: use printable characters without spaces or ':' (and not '*')")
    try:
        prepared = saslprep(user)
    except ScramException:
        prepared = None
    if prepared != user:
        raise CredentialError(f"user name {user!r} is not in SASLprep normal form; use plain letters and digits")
    return user


def _check_mechanism(mechanism: str) -> None:
    if mechanism not in SCRAM_MECHANISMS:
        raise CredentialError(f"mechanism {mechanism!r} is not supported; use {' or '.join(SCRAM_MECHANISMS)}")


def _check_iterations(iterations: int) -> None:
    if not MIN_ITERATIONS <= iterations <= MAX_ITERATIONS:
        raise CredentialError(
            f"{iterations} iterations: use {MIN_ITERATIONS} to {MAX_ITERATIONS} (Kafka's bounds; RFC 7677 asks "
            f"for at least {MIN_ITERATIONS})"
        )


def make_credential(user: str, mechanism: str, password: str, iterations: int = DEFAULT_ITERATIONS,
                    salt: bytes | None = None) -> ScramCredential:
    """The salted SCRAM credential of `password` (a random salt unless given)."""
    check_user_name(user)
    _check_mechanism(mechanism)
    _check_iterations(iterations)
    if not password:
        raise CredentialError("the password is empty")
    if len(password) > MAX_PASSWORD_CHARS:
        raise CredentialError(f"a password has at most {MAX_PASSWORD_CHARS} characters (so that checking a PLAIN "
                              "login costs a bounded amount of work)")
    if salt is not None and len(salt) < MIN_SALT_BYTES:
        raise CredentialError(f"a salt has at least {MIN_SALT_BYTES} bytes")
    try:
        salt_out, stored_key, server_key, count = scramp.ScramMechanism(mechanism).make_auth_info(
            password, iteration_count=iterations, salt=salt
        )
    except ScramException:  # scramp's message may quote the offending character: say what to do instead
        raise CredentialError("the password has characters SASLprep forbids (control or unassigned "
                              "characters); choose another") from None
    return ScramCredential(user, mechanism, bytes(salt_out), stored_key, server_key, int(count))


def credential_from_salted_password(user: str, mechanism: str, salt: bytes, salted_password: bytes,
                                    iterations: int) -> ScramCredential:
    """The credential of a salted password a client computed (Kafka's AlterUserScramCredentials upsertion carries
    the salt and SaltedPassword = Hi(password, salt, iterations), never the password)."""
    check_user_name(user)
    _check_mechanism(mechanism)
    _check_iterations(iterations)
    if len(salt) < MIN_SALT_BYTES:
        raise CredentialError(f"a salt has at least {MIN_SALT_BYTES} bytes")
    digest = _HASHES[mechanism]
    if len(salted_password) != digest().digest_size:
        raise CredentialError(f"a {mechanism} salted password has {digest().digest_size} bytes")
    client_key = hmac.new(salted_password, b"Client Key", digest).digest()
    stored_key = digest(client_key).digest()
    server_key = hmac.new(salted_password, b"Server Key", digest).digest()
    return ScramCredential(user, mechanism, bytes(salt), stored_key, server_key, iterations)


def _decoy(user: str, mechanism: str) -> tuple[bytes, bytes, bytes, int]:
    """A credential no password matches, for a user that does not exist: stable salt, random keys."""
    salt = hmac.new(_DECOY_SECRET, f"{mechanism}\0{user}".encode(), hashlib.sha256).digest()[:16]
    size = _HASHES[mechanism]().digest_size
    return salt, secrets.token_bytes(size), secrets.token_bytes(size), DEFAULT_ITERATIONS


def plain_acceptable(user: str, password: str) -> bool:
    """Whether a PLAIN login (or an HTTP basic one) is worth checking at all: a user name or a password longer
    than any credential can have is refused before any work, so the work a login costs does not grow with
    what a client sends (a 1 MB password once cost seconds of SASLprep)."""
    return 0 < len(user) <= MAX_USER_NAME and 0 < len(password) <= MAX_PASSWORD_CHARS


def plain_candidates(store: SecurityStore, user: str) -> list[ScramCredential]:
    """The stored credentials a PLAIN login of `user` is checked against; for a user that does not exist, decoys
    of both mechanisms (as `icelog user add` stores both), so the work done does not tell who exists."""
    found = [c for c in store.scram_credentials(user) if c.mechanism in SCRAM_MECHANISMS] if user else []
    if found:
        return found
    return [ScramCredential(user, mechanism, *_decoy(user, mechanism)) for mechanism in SCRAM_MECHANISMS]


def derive_keys(password: str, params: list[tuple[str, bytes, int]]) -> list[tuple[bytes, bytes]] | None:
    """(StoredKey, ServerKey) of `password` for each (mechanism, salt, iterations), as RFC 5802 derives them from
    SASLprep(password); None for a password SASLprep refuses (it matches nothing). Printable ASCII is what
    SASLprep leaves unchanged, so it skips SASLprep's per-character tables."""
    if password.isascii() and password.isprintable():
        prepared = password
    else:
        try:
            prepared = saslprep(password)
        except ScramException:
            return None
    keys = []
    for mechanism, salt, iterations in params:
        digest = _HASHES[mechanism]
        salted = hashlib.pbkdf2_hmac(digest().name, prepared.encode("utf-8"), salt, iterations)
        client_key = hmac.new(salted, b"Client Key", digest).digest()
        keys.append((digest(client_key).digest(), hmac.new(salted, b"Server Key", digest).digest()))
    return keys


def keys_match(credentials: list[ScramCredential], keys: list[tuple[bytes, bytes]] | None) -> bool:
    """Whether the derived keys match one of the credentials they were derived for; every comparison is made,
    each in constant time."""
    if keys is None:
        return False
    matched = False
    for credential, (stored_key, server_key) in zip(credentials, keys, strict=True):
        matched |= hmac.compare_digest(stored_key, credential.stored_key) & hmac.compare_digest(
            server_key, credential.server_key)
    return matched


def check_plain(store: SecurityStore, user: str, password: str) -> bool:
    """Whether `password` is the user's, against any of its stored SCRAM credentials (constant-time compare), in
    the calling thread (the broker runs the key derivation in its login process: security/logins.py).

    A user that does not exist costs the same derivations, so the time taken does not tell who exists."""
    if not plain_acceptable(user, password):
        return False
    credentials = plain_candidates(store, user)
    return keys_match(credentials, derive_keys(password, [(c.mechanism, c.salt, c.iterations) for c in credentials]))


class ScramServer:
    """The server side of one SCRAM exchange (client-first → server-first → client-final → server-final).

    A user that does not exist is answered with a decoy salt and fails at the proof, as a wrong password does:
    both end in the same AuthenticationError at the same step. Channel binding and extensions (Kafka's
    `tokenauth` for delegation tokens, which icelog does not issue) are refused."""

    def __init__(self, mechanism: str, store: SecurityStore) -> None:
        _check_mechanism(mechanism)
        self.mechanism = mechanism
        self._store = store
        self._user: str | None = None
        self._authenticated = False
        self._failed = False
        self._client_nonce: str | None = None
        self._server = scramp.ScramMechanism(mechanism).make_server(self._auth_info)

    def _auth_info(self, user: str) -> tuple[bytes, bytes, bytes, int]:
        # scramp hands over the name saslname-decoded (=2C → ',', =3D → '=') and SASLprep'd
        self._user = user
        for credential in self._store.scram_credentials(user):
            if credential.mechanism == self.mechanism:
                return credential.salt, credential.stored_key, credential.server_key, credential.iterations
        return _decoy(user, self.mechanism)

    def _fail(self) -> AuthenticationError:
        self._failed = True
        return AuthenticationError(failure_message(self.mechanism))

    def first(self, client_first: bytes) -> bytes:
        """The server-first message; raises AuthenticationError (unknown user gets the same error as a bad proof)."""
        if self._failed:
            raise self._fail()
        if len(client_first) > MAX_SCRAM_MESSAGE_BYTES:
            raise self._fail()
        try:
            message = client_first.decode("utf-8")
            if not message.startswith("n,"):  # a gs2 flag of y or p asks for channel binding, which Kafka has not
                raise self._fail()
            # n,[a=authzid],n=<user>,r=<nonce>: a user name no credential can have costs no SASLprep
            parts = message.split(",", 3)
            if len(parts) < 3 or not parts[2].startswith("n="):
                raise self._fail()
            if len(parts[2][2:].replace("=2C", ",").replace("=3D", "=")) > MAX_USER_NAME:
                raise self._fail()
            self._server.set_client_first(message)
            self._client_nonce = next((p[2:] for p in message.split(",") if p.startswith("r=")), None)
            server_first: bytes = self._server.get_server_first().encode()
            return server_first
        except (ScramException, UnicodeDecodeError):
            raise self._fail() from None

    def final(self, client_final: bytes) -> bytes:
        """The server-final message once the client's proof checks; raises AuthenticationError otherwise."""
        if self._failed or self._user is None or len(client_final) > MAX_SCRAM_MESSAGE_BYTES:
            raise self._fail()
        try:
            message = client_final.decode("utf-8")
            self._accept_librdkafka_nonce(message)
            self._server.set_client_final(message)
            answer: bytes = self._server.get_server_final().encode()
        except (ScramException, UnicodeDecodeError):
            raise self._fail() from None
        self._authenticated = True
        return answer

    def _accept_librdkafka_nonce(self, client_final: str) -> None:
        """librdkafka before 2.6.1 (Debian's kcat, many language bindings) echoes the nonce as client nonce +
        server nonce, and the server nonce already starts with the client nonce (confluentinc/librdkafka#4895).
        Kafka 3.8.1–3.9 accept that (`endsWith`), so icelog does too, but only that exact form: the proof is
        still checked over the message the client sent, so nothing else is relaxed."""
        nonce = str(self._server.nonce)
        echoed = next((part[2:] for part in client_final.split(",") if part.startswith("r=")), None)
        client_nonce = str(self._client_nonce or "")
        if client_nonce and echoed == client_nonce + nonce:
            self._server.nonce = type(self._server.nonce)(echoed)  # scramp's Nonce of what the client echoed

    @property
    def user(self) -> str:
        """The authenticated user (after `final`)."""
        if not self._authenticated or self._user is None:
            raise AuthenticationError("no SCRAM exchange has succeeded on this connection")
        return self._user
