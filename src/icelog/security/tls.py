"""TLS for the Kafka listeners and the schema registry: one server context from the broker's settings."""

from __future__ import annotations

import ssl
import stat
from pathlib import Path

from cryptography import x509

from icelog.config import Settings
from icelog.errors import ConfigError

_CLIENT_AUTH = {"none": ssl.CERT_NONE, "requested": ssl.CERT_OPTIONAL, "required": ssl.CERT_REQUIRED}


def check_key_file(path: Path) -> None:
    """Refuse a private key that other users can read: the broker would be serving a key that is not secret."""
    try:
        mode = path.stat().st_mode
    except OSError as exc:
        raise ConfigError(f"ssl_keyfile {path}: {exc.strerror}") from None
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise ConfigError(
            f"ssl_keyfile {path} is readable by other users (mode {stat.S_IMODE(mode):o}); "
            f"run `chmod 600 {path}` and start again"
        )


def server_context(settings: Settings) -> ssl.SSLContext | None:
    """The TLS context of the SSL/SASL_SSL listeners and the registry, or None when no listener uses TLS."""
    if not any(spec.tls for spec in settings.listener_specs):
        return None
    assert settings.ssl_certfile is not None and settings.ssl_keyfile is not None  # checked at load
    check_key_file(settings.ssl_keyfile)
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    password = settings.ssl_keyfile_password.get_secret_value() if settings.ssl_keyfile_password else None
    try:
        context.load_cert_chain(settings.ssl_certfile, settings.ssl_keyfile, password=password)
        if settings.ssl_cafile is not None:
            context.load_verify_locations(cafile=settings.ssl_cafile)
    except (OSError, ssl.SSLError) as exc:  # never the password: only which file and what failed
        raise ConfigError(
            f"cannot load the TLS certificate/key ({settings.ssl_certfile}, {settings.ssl_keyfile}"
            f"{', ' + str(settings.ssl_cafile) if settings.ssl_cafile else ''}): {type(exc).__name__}: "
            f"{getattr(exc, 'strerror', None) or getattr(exc, 'reason', None) or exc}"
        ) from None
    context.verify_mode = _CLIENT_AUTH[settings.ssl_client_auth]
    if context.verify_mode != ssl.CERT_NONE and settings.ssl_cafile is None:
        raise ConfigError(f"ssl_client_auth={settings.ssl_client_auth} needs ssl_cafile: the CA client "
                          "certificates must chain to")
    return context


def certificate_principal(der: bytes | None) -> str | None:
    """Kafka's principal of a client certificate: User:<subject as RFC 2253/4514 writes it> (CN=alice,O=...)."""
    if not der:
        return None
    return "User:" + x509.load_der_x509_certificate(der).subject.rfc4514_string()
