"""SCRAM and PLAIN credentials: scramp's own client against icelog's ScramServer over a real SQLite store."""

from __future__ import annotations

import hashlib
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import scramp

from icelog.meta.sqlite import SqliteStore
from icelog.security.credentials import (
    MAX_PASSWORD_CHARS,
    SCRAM_MECHANISMS,
    AuthenticationError,
    CredentialError,
    ScramServer,
    check_plain,
    credential_from_salted_password,
    derive_keys,
    make_credential,
    plain_acceptable,
)


@pytest.fixture
def store(tmp_path: Path) -> Iterator[SqliteStore]:
    store = SqliteStore(tmp_path / "meta.db")
    for mechanism in SCRAM_MECHANISMS:
        store.save_scram_credential(make_credential("alice", mechanism, "secret"))
    yield store
    store.close()


def _login(store: SqliteStore, mechanism: str, user: str, password: str) -> str:
    """One whole exchange; the user the server authenticated, or AuthenticationError."""
    client = scramp.ScramClient([mechanism], user, password)
    server = ScramServer(mechanism, store)
    server_first = server.first(client.get_client_first().encode())
    client.set_server_first(server_first.decode())
    server_final = server.final(client.get_client_final().encode())
    client.set_server_final(server_final.decode())  # the client checks the server knew the keys too
    return server.user


@pytest.mark.parametrize("mechanism", SCRAM_MECHANISMS)
def test_scram_login_right_and_wrong_password(store: SqliteStore, mechanism: str) -> None:
    assert _login(store, mechanism, "alice", "secret") == "alice"
    with pytest.raises(AuthenticationError) as wrong:
        _login(store, mechanism, "alice", "not-it")
    with pytest.raises(AuthenticationError) as unknown:
        _login(store, mechanism, "mallory", "secret")
    # one message, Kafka's, that does not say which part was wrong
    expected = f"Authentication failed during authentication due to invalid credentials with SASL mechanism {mechanism}"
    assert str(wrong.value) == str(unknown.value) == expected


def test_unknown_user_fails_at_the_proof_like_a_wrong_password(store: SqliteStore) -> None:
    """The first step answers an unknown user with a salt too, the same one each time: no user enumeration."""
    firsts = []
    for _ in range(2):
        client = scramp.ScramClient(["SCRAM-SHA-512"], "mallory", "x")
        server = ScramServer("SCRAM-SHA-512", store)
        server_first = server.first(client.get_client_first().encode()).decode()
        firsts.append(dict(p.split("=", 1) for p in server_first.split(",")))
        client.set_server_first(server_first)
        with pytest.raises(AuthenticationError):
            server.final(client.get_client_final().encode())
    assert firsts[0]["s"] == firsts[1]["s"] and firsts[0]["i"] == "4096"


def test_saslname_encoded_user(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "meta.db")
    store.save_scram_credential(make_credential("a,b=c", "SCRAM-SHA-256", "pw"))
    client = scramp.ScramClient(["SCRAM-SHA-256"], "a,b=c", "pw")
    first = client.get_client_first()
    assert "n=a=2Cb=3Dc," in first
    server = ScramServer("SCRAM-SHA-256", store)
    client.set_server_first(server.first(first.encode()).decode())
    client.set_server_final(server.final(client.get_client_final().encode()).decode())
    assert server.user == "a,b=c"
    store.close()


@pytest.mark.parametrize("message", [
    b"", b"garbage", b"\xff\xfe", b"n,,r=abc", b"p=tls-unique,,n=alice,r=abc", b"y,,n=alice,r=abc",
    b"n,a=alice,n=alice,r=abc", b"n,,n=alice,r=abc,tokenauth=true",
])
def test_malformed_or_unsupported_first_message(store: SqliteStore, message: bytes) -> None:
    server = ScramServer("SCRAM-SHA-512", store)
    with pytest.raises(AuthenticationError, match="invalid credentials with SASL mechanism SCRAM-SHA-512"):
        server.first(message)
    with pytest.raises(AuthenticationError):  # a failed exchange stays failed
        server.final(b"c=biws,r=abc,p=AAAA")


def test_final_before_first_and_user_before_success(store: SqliteStore) -> None:
    server = ScramServer("SCRAM-SHA-256", store)
    with pytest.raises(AuthenticationError):
        server.final(b"c=biws,r=abc,p=AAAA")
    with pytest.raises(AuthenticationError):
        _ = server.user


def test_a_credential_for_one_mechanism_does_not_log_in_with_the_other(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "meta.db")
    store.save_scram_credential(make_credential("bob", "SCRAM-SHA-256", "pw"))
    assert _login(store, "SCRAM-SHA-256", "bob", "pw") == "bob"
    with pytest.raises(AuthenticationError):
        _login(store, "SCRAM-SHA-512", "bob", "pw")
    store.close()


def test_plain_checks_against_the_salted_keys(store: SqliteStore) -> None:
    assert check_plain(store, "alice", "secret")
    assert not check_plain(store, "alice", "Secret")
    assert not check_plain(store, "alice", "")
    assert not check_plain(store, "mallory", "secret")
    assert not check_plain(store, "", "secret")
    assert not check_plain(store, "alice", "bad\x00char")


@pytest.mark.parametrize("mechanism", SCRAM_MECHANISMS)
def test_salted_password_gives_the_same_keys(mechanism: str) -> None:
    salt = b"0123456789abcdef"
    made = make_credential("carol", mechanism, "pw", iterations=8192, salt=salt)
    name = "sha256" if mechanism.endswith("256") else "sha512"
    salted = hashlib.pbkdf2_hmac(name, b"pw", salt, 8192)  # what a client sends in AlterUserScramCredentials
    assert credential_from_salted_password("carol", mechanism, salt, salted, 8192) == made
    with pytest.raises(CredentialError, match="salted password has"):
        credential_from_salted_password("carol", mechanism, salt, salted[:10], 8192)
    with pytest.raises(CredentialError, match="salt has at least 12 bytes"):
        credential_from_salted_password("carol", mechanism, b"short", salted, 8192)


def test_make_credential_refuses_what_kafka_refuses() -> None:
    with pytest.raises(CredentialError, match="use 4096 to 16384"):
        make_credential("a", "SCRAM-SHA-512", "pw", iterations=1000)
    with pytest.raises(CredentialError, match="use 4096 to 16384"):
        make_credential("a", "SCRAM-SHA-512", "pw", iterations=100_000)
    with pytest.raises(CredentialError, match="SCRAM-SHA-256 or SCRAM-SHA-512"):
        make_credential("a", "SCRAM-SHA-1", "pw")
    with pytest.raises(CredentialError, match="password is empty"):
        make_credential("a", "SCRAM-SHA-512", "")
    for bad in ("", "a b", "a:b", "*", "tab\there", "x" * 256, "\u2168"):  # Ⅸ changes under SASLprep
        with pytest.raises(CredentialError):
            make_credential(bad, "SCRAM-SHA-512", "pw")
    with pytest.raises(CredentialError) as forbidden:
        make_credential("a", "SCRAM-SHA-512", "pw\x07secret")
    assert "secret" not in str(forbidden.value)
    assert make_credential("a", "SCRAM-SHA-512", "pw", iterations=16384).iterations == 16384


def test_credential_repr_shows_no_keys() -> None:
    credential = make_credential("alice", "SCRAM-SHA-512", "secret")
    shown = repr(credential) + str(credential)
    assert "alice" in shown and "4096" in shown
    for secret in (credential.salt, credential.stored_key, credential.server_key):
        assert secret.hex() not in shown and repr(secret) not in shown
    assert "stored_key" not in shown and "server_key" not in shown


def _hand_login(store: SqliteStore, password: str, echo: str) -> bytes:
    """A SCRAM-SHA-512 login computed by hand, echoing the nonce as `echo` says: 'server' (RFC 5802),
    'librdkafka' (client nonce + server nonce, as librdkafka before 2.6.1 sends it) or 'client' (wrong)."""
    import base64
    import hmac

    server = ScramServer("SCRAM-SHA-512", store)
    client_nonce = "rdkafkaNonce0123"
    first_bare = f"n=alice,r={client_nonce}"
    server_first = server.first(f"n,,{first_bare}".encode()).decode()
    fields = dict(part.split("=", 1) for part in server_first.split(","))
    nonce = {"server": fields["r"], "librdkafka": client_nonce + fields["r"], "client": client_nonce}[echo]
    without_proof = f"c=biws,r={nonce}"
    salted = hashlib.pbkdf2_hmac("sha512", password.encode(), base64.b64decode(fields["s"]), int(fields["i"]))
    client_key = hmac.new(salted, b"Client Key", "sha512").digest()
    auth_message = f"{first_bare},{server_first},{without_proof}".encode()
    signature = hmac.new(hashlib.sha512(client_key).digest(), auth_message, "sha512").digest()
    proof = base64.b64encode(bytes(a ^ b for a, b in zip(client_key, signature, strict=True))).decode()
    return server.final(f"{without_proof},p={proof}".encode())


def test_librdkafka_before_2_6_1_nonce_is_accepted_as_kafka_3_9_does(store: SqliteStore) -> None:
    """librdkafka < 2.6.1 (Debian's kcat) echoes client nonce + server nonce; Kafka 3.8.1-3.9 accept it. Only
    that form: a nonce without the server's part still fails, and so does a wrong password in that form."""
    store.save_scram_credential(make_credential("alice", "SCRAM-SHA-512", "pw"))
    assert _hand_login(store, "pw", "server").startswith(b"v=")
    assert _hand_login(store, "pw", "librdkafka").startswith(b"v=")
    with pytest.raises(AuthenticationError):
        _hand_login(store, "pw", "client")
    with pytest.raises(AuthenticationError):
        _hand_login(store, "not-pw", "librdkafka")


@pytest.mark.parametrize("password", ["secret", "with space ~!@#", "p\u00e4ss\u00a0w\u00f6rd", "\u2168x", "x" * 1024])
@pytest.mark.parametrize("mechanism", SCRAM_MECHANISMS)
def test_derived_keys_are_scramps(mechanism: str, password: str) -> None:
    """The login process's derivation (printable ASCII skips SASLprep's tables) gives scramp's keys, also for
    passwords SASLprep changes (a no-break space, a roman numeral)."""
    salt = b"0123456789abcdef"
    _, stored_key, server_key, _ = scramp.ScramMechanism(mechanism).make_auth_info(password, 4096, salt)
    assert derive_keys(password, [(mechanism, salt, 4096)]) == [(stored_key, server_key)]
    assert derive_keys("bad\x07char", [(mechanism, salt, 4096)]) is None  # SASLprep refuses it: matches nothing


def test_overlong_credentials_are_refused_before_any_work(store: SqliteStore) -> None:
    """A password or user name longer than any credential can have is refused without SASLprep or PBKDF2 (a 1 MB
    password once cost 6-7 s); such a password cannot be made either."""
    long_password = "x" * (MAX_PASSWORD_CHARS + 1)
    assert not plain_acceptable("alice", long_password) and not plain_acceptable("u" * 256, "pw")
    started = time.process_time()
    for _ in range(20):
        assert not check_plain(store, "alice", "x" * 1_000_000)
    assert time.process_time() - started < 1.0  # once 6-7 s each
    with pytest.raises(CredentialError, match="at most 1024 characters"):
        make_credential("alice", "SCRAM-SHA-512", long_password)
    assert make_credential("alice", "SCRAM-SHA-512", "x" * MAX_PASSWORD_CHARS).user == "alice"


def test_scram_refuses_an_overlong_user_name_at_once(store: SqliteStore) -> None:
    """A client-first whose user name no credential can have (or which is longer than any valid message) fails
    before scramp parses it, with the same error as any failed login."""
    for client_first in (f"n,,n={'u' * 256},r=nonce", f"n,,n={'u' * 100_000},r=nonce", "n,,n=alice,r=" + "r" * 4000):
        with pytest.raises(AuthenticationError, match="invalid credentials"):
            ScramServer("SCRAM-SHA-512", store).first(client_first.encode())
    assert _login(store, "SCRAM-SHA-512", "alice", "secret") == "alice"
