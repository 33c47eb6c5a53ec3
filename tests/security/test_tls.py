"""The broker's TLS server context (shared by the Kafka listeners and the registry) and the key file check."""

from __future__ import annotations

import os
import ssl
from pathlib import Path
from typing import Any

import pytest
import trustme
from cryptography.hazmat.primitives import serialization

from icelog.config import Settings
from icelog.errors import ConfigError
from icelog.security.tls import check_key_file, server_context


@pytest.fixture
def pems(tmp_path: Path) -> dict[str, Path]:
    ca = trustme.CA()
    cert = ca.issue_cert("localhost")
    paths = {"ca": tmp_path / "ca.pem", "cert": tmp_path / "cert.pem", "key": tmp_path / "key.pem",
             "encrypted": tmp_path / "encrypted.pem"}
    ca.cert_pem.write_to_path(str(paths["ca"]))
    cert.cert_chain_pems[0].write_to_path(str(paths["cert"]))
    cert.private_key_pem.write_to_path(str(paths["key"]))
    key = serialization.load_pem_private_key(cert.private_key_pem.bytes(), password=None)
    paths["encrypted"].write_bytes(key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
        serialization.BestAvailableEncryption(b"key-pass-123"),
    ))
    for name in ("key", "encrypted"):
        os.chmod(paths[name], 0o600)
    return paths


def settings(pems: dict[str, Path], **more: Any) -> Settings:
    values: dict[str, Any] = {"listeners": "SSL://127.0.0.1:9093", "ssl_certfile": pems["cert"],
                              "ssl_keyfile": pems["key"], **more}
    return Settings(**values)


def test_no_tls_listener_no_context() -> None:
    assert server_context(Settings(listeners="SASL_PLAINTEXT://127.0.0.1:9093")) is None
    assert server_context(Settings()) is None


def test_context_is_tls12_at_least_and_asks_as_configured(pems: dict[str, Path]) -> None:
    context = server_context(settings(pems))
    assert context is not None and context.minimum_version == ssl.TLSVersion.TLSv1_2
    assert context.verify_mode == ssl.CERT_NONE
    requested = server_context(settings(pems, ssl_client_auth="requested", ssl_cafile=pems["ca"]))
    assert requested is not None and requested.verify_mode == ssl.CERT_OPTIONAL
    required = settings(pems, ssl_client_auth="required", ssl_cafile=pems["ca"])
    required_context = server_context(required)
    assert required_context is not None and required_context.verify_mode == ssl.CERT_REQUIRED
    registry = server_context(required, client_auth="none")
    assert registry is not None and registry.verify_mode == ssl.CERT_NONE


def test_client_auth_without_a_ca_is_refused(pems: dict[str, Path]) -> None:
    with pytest.raises(ConfigError, match="ssl_client_auth=required needs ssl_cafile"):
        server_context(settings(pems, ssl_client_auth="required"))


def test_encrypted_key(pems: dict[str, Path]) -> None:
    assert server_context(settings(pems, ssl_keyfile=pems["encrypted"], ssl_keyfile_password="key-pass-123"))
    with pytest.raises(ConfigError, match="ssl_keyfile_password") as wrong:
        server_context(settings(pems, ssl_keyfile=pems["encrypted"], ssl_keyfile_password="nope-pass-456"))
    assert "nope-pass-456" not in str(wrong.value)


def test_key_and_certificate_that_do_not_match(pems: dict[str, Path], tmp_path: Path) -> None:
    other = tmp_path / "other.pem"
    trustme.CA().issue_cert("localhost").private_key_pem.write_to_path(str(other))
    os.chmod(other, 0o600)
    with pytest.raises(ConfigError, match="the key is the certificate's"):
        server_context(settings(pems, ssl_keyfile=other))


def test_key_file_modes(pems: dict[str, Path], tmp_path: Path) -> None:
    check_key_file(pems["key"])
    os.chmod(pems["key"], 0o400)
    check_key_file(pems["key"])
    for mode in (0o644, 0o640, 0o604, 0o620):
        os.chmod(pems["key"], mode)
        with pytest.raises(ConfigError, match=f"mode 0{mode:o}.*chmod 600 {pems['key']}"):
            check_key_file(pems["key"])
    with pytest.raises(ConfigError, match="ssl_keyfile .*missing.pem"):
        check_key_file(tmp_path / "missing.pem")
    with pytest.raises(ConfigError, match="chmod 600"):  # server_context checks before loading
        server_context(settings(pems))


def test_principal_mapping_rules_as_kafka_writes_them() -> None:
    """ssl.principal.mapping.rules: the first rule whose pattern matches the whole subject names the user."""
    from icelog.config import principal_rules

    rules = principal_rules("RULE:^CN=([^,]*),OU=ops,.*$/$1-ops/U, RULE:^CN=([^,]*),.*$/$1/L, DEFAULT")
    names = [next(n for r in rules if (n := r.apply(s)) is not None)
             for s in ("CN=Alice,OU=ops,O=x", "CN=Bob,OU=dev,O=x", "O=no-cn")]
    assert names == ["ALICE-OPS", "bob", "O=no-cn"]
    assert [r.apply("O=no-cn") for r in principal_rules("RULE:^CN=(.*)$/$1/")] == [None]  # Kafka refuses it
    with pytest.raises(ValueError, match="RULE:REGEX/REPLACEMENT"):
        principal_rules("RULE:^CN=(.*)$")
