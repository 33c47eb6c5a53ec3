"""OAUTHBEARER logins with JWTs checked against a JWKS file (Kafka's file-based JWKS endpoint): confluent-kafka's
`oauth_cb` and kafka-python's token provider log in; a token signed by another key, expired, or for another
audience is refused with SASL_AUTHENTICATION_FAILED; the key set can rotate without a restart."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jwt
import pytest
from confluent_kafka import KafkaError
from confluent_kafka.admin import AdminClient
from cryptography.hazmat.primitives.asymmetric import rsa

from tests.support.clients_util import WAIT_S
from tests.support.security import SecureBroker, start_secure_broker

pytestmark = pytest.mark.slow

ISSUER, AUDIENCE = "https://idp.example.com", "icelog"


def new_key() -> rsa.RSAPrivateKey:
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


def write_jwks(path: Path, keys: dict[str, rsa.RSAPrivateKey]) -> None:
    entries = []
    for kid, key in keys.items():
        entry = json.loads(jwt.algorithms.RSAAlgorithm.to_jwk(key.public_key()))
        entries.append({**entry, "kid": kid, "use": "sig", "alg": "RS256"})
    path.write_text(json.dumps({"keys": entries}))


def token(key: rsa.RSAPrivateKey, kid: str, sub: str = "svc-orders", lifetime: int = 600,
          audience: str = AUDIENCE) -> str:
    now = int(time.time())
    claims = {"sub": sub, "iss": ISSUER, "aud": audience, "iat": now, "exp": now + lifetime}
    return jwt.encode(claims, key, algorithm="RS256", headers={"kid": kid})


@pytest.fixture(scope="module")
def idp(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[SecureBroker, Path, rsa.RSAPrivateKey]]:
    tmp = tmp_path_factory.mktemp("oauth")
    key, jwks = new_key(), tmp / "jwks.json"
    write_jwks(jwks, {"k1": key})
    broker = start_secure_broker(tmp, ("SASL_SSL", "PLAINTEXT"), env={
        "ICELOG_SASL_ENABLED_MECHANISMS": "OAUTHBEARER,SCRAM-SHA-512",
        "ICELOG_SASL_OAUTHBEARER_JWKS_ENDPOINT_URL": f"file://{jwks}",
        "ICELOG_SASL_OAUTHBEARER_EXPECTED_AUDIENCE": AUDIENCE,
        "ICELOG_SASL_OAUTHBEARER_EXPECTED_ISSUER": ISSUER,
        "ICELOG_SUPER_USERS": "User:svc-orders",
    })
    yield broker, jwks, key
    broker.broker.stop()


def librdkafka(secure: SecureBroker, make_token: Any) -> dict[str, Any]:
    return {"bootstrap.servers": secure.bootstrap("SASL_SSL"), "security.protocol": "SASL_SSL",
            "ssl.ca.location": str(secure.pki.ca_pem), "sasl.mechanism": "OAUTHBEARER",
            "oauth_cb": lambda _config: (make_token(), time.time() + 600)}


def login_error(secure: SecureBroker, make_token: Any) -> KafkaError | None:
    errors: list[KafkaError] = []
    admin = AdminClient({**librdkafka(secure, make_token), "error_cb": errors.append})
    try:
        admin.list_topics(timeout=5)
        return None
    except Exception:  # noqa: BLE001 - the error callback says why
        for _ in range(20):
            if errors:
                break
            admin.poll(0.5)
        assert errors, "librdkafka reported no error"
        return errors[0]


def test_confluent_kafka_logs_in_with_a_jwt(idp: tuple[SecureBroker, Path, rsa.RSAPrivateKey]) -> None:
    from confluent_kafka import Consumer, Producer

    secure, _, key = idp
    topic = f"oauth-{uuid.uuid4().hex[:6]}"

    conf = librdkafka(secure, lambda: token(key, "k1"))
    producer = Producer(conf)
    for i in range(5):
        producer.produce(topic, value=f"v{i}".encode(), partition=0)
    assert producer.flush(WAIT_S) == 0
    consumer = Consumer({**conf, "group.id": "oauth-g", "auto.offset.reset": "earliest"})
    consumer.subscribe([topic])
    got: list[bytes] = []
    end = time.monotonic() + WAIT_S
    while len(got) < 5 and time.monotonic() < end:
        msg = consumer.poll(0.5)
        if msg is not None and msg.error() is None:
            got.append(msg.value())
    consumer.close()
    assert got == [f"v{i}".encode() for i in range(5)]


def test_kafka_python_token_provider(idp: tuple[SecureBroker, Path, rsa.RSAPrivateKey]) -> None:
    import ssl

    from kafka import KafkaAdminClient
    from kafka.net.sasl.oauth import AbstractTokenProvider

    secure, _, key = idp

    class Provider(AbstractTokenProvider):  # type: ignore[misc]
        def token(self) -> str:
            return token(key, "k1")

    admin = KafkaAdminClient(bootstrap_servers=secure.bootstrap("SASL_SSL"), security_protocol="SASL_SSL",
                             ssl_context=ssl.create_default_context(cafile=str(secure.pki.ca_pem)),
                             sasl_mechanism="OAUTHBEARER", sasl_oauth_token_provider=Provider())
    try:
        assert isinstance(admin.list_topics(), list)
    finally:
        admin.close()


def test_bad_tokens_are_refused(idp: tuple[SecureBroker, Path, rsa.RSAPrivateKey]) -> None:
    secure, _, key = idp
    stranger = new_key()
    for bad in (lambda: token(stranger, "k1"),  # signed by a key not in the JWKS
                lambda: token(key, "k1", lifetime=-120),  # expired past the clock skew
                lambda: token(key, "k1", audience="someone-else")):
        error = login_error(secure, bad)
        assert error is not None and error.code() == KafkaError._AUTHENTICATION, error
    assert "eyJ" not in secure.broker.log()  # no token (base64 JSON) in the log


def test_keys_rotate_without_a_restart(idp: tuple[SecureBroker, Path, rsa.RSAPrivateKey]) -> None:
    secure, jwks, key = idp
    rotated = new_key()
    assert login_error(secure, lambda: token(rotated, "k2")) is not None
    time.sleep(1.1)  # a different mtime
    write_jwks(jwks, {"k1": key, "k2": rotated})
    assert login_error(secure, lambda: token(rotated, "k2")) is None
