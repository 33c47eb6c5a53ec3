"""The broker's TLS server context, one builder for every TLS endpoint (Kafka listeners, the schema registry).

Built from Kafka-named settings (ssl_certfile, ssl_keyfile, ssl_keyfile_password, ssl_cafile, ssl_client_auth);
TLS 1.2 at least, as Kafka's default ssl.enabled.protocols. The private key file must be readable by its owner
only: a key others can read is refused at start-up, with the command that fixes it.
"""

from __future__ import annotations

import os
import ssl
import stat
from pathlib import Path

from cryptography import x509

from icelog.config import PrincipalRule, Settings
from icelog.errors import ConfigError

_VERIFY_MODES = {"none": ssl.CERT_NONE, "requested": ssl.CERT_OPTIONAL, "required": ssl.CERT_REQUIRED}


def check_key_file(path: Path) -> None:
    """Refuse a private key file that group or others may read or write (mode & 0o077), or that is missing."""
    try:
        mode = os.stat(path).st_mode
    except OSError as exc:
        raise ConfigError(f"ssl_keyfile {path}: {exc.strerror or exc}; point ssl_keyfile at the PEM private key") \
            from None
    if mode & 0o077:
        raise ConfigError(
            f"ssl_keyfile {path} may be read by other users (mode {stat.S_IMODE(mode):04o}); "
            f"make it the owner's only: chmod 600 {path}"
        )


def server_context(settings: Settings, client_auth: str | None = None) -> ssl.SSLContext | None:
    """The server-side TLS context of the broker's certificate, or None when no listener uses TLS.

    client_auth (none / requested / required) defaults to settings.ssl_client_auth; an endpoint that identifies
    its clients otherwise (the registry: HTTP basic auth) passes "none". Raises ConfigError with the fix for a
    key file others can read, a missing file, a wrong key password or a certificate that does not match its key
    (never quoting the password)."""
    if not any(spec.tls for spec in settings.listener_specs):
        return None
    certfile, keyfile = settings.ssl_certfile, settings.ssl_keyfile
    if certfile is None or keyfile is None:  # the settings' own check makes this unreachable; keep mypy honest
        raise ConfigError("an SSL or SASL_SSL listener needs ssl_certfile and ssl_keyfile (PEM files)")
    check_key_file(keyfile)
    mode = client_auth or settings.ssl_client_auth
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    password = settings.ssl_keyfile_password.get_secret_value() if settings.ssl_keyfile_password else None
    try:
        context.load_cert_chain(certfile, keyfile, password=password)
    except FileNotFoundError as exc:
        raise ConfigError(f"ssl_certfile/ssl_keyfile: {exc.filename} does not exist") from None
    except ssl.SSLError as exc:  # wrong password, not PEM, certificate and key that do not match
        raise ConfigError(
            f"cannot load ssl_certfile {certfile} with ssl_keyfile {keyfile} ({exc.reason or 'unreadable'}): check "
            "that both are PEM, that the key is the certificate's, and ssl_keyfile_password if the key is encrypted"
        ) from None
    if mode != "none" and settings.ssl_cafile is None:
        raise ConfigError(f"ssl_client_auth={mode} needs ssl_cafile: the PEM CA certificates that client "
                          "certificates must chain to")
    if settings.ssl_cafile is not None:
        try:
            context.load_verify_locations(cafile=settings.ssl_cafile)
        except (OSError, ssl.SSLError) as exc:
            raise ConfigError(f"cannot load ssl_cafile {settings.ssl_cafile}: {exc}; it must be PEM certificates") \
                from None
    context.verify_mode = _VERIFY_MODES[mode]
    return context


class NoMatchingRule(ValueError):
    """No ssl.principal.mapping.rules entry applies to a client certificate's subject (Kafka refuses it too)."""


def certificate_principal(der: bytes | None, rules: list[PrincipalRule]) -> str | None:
    """Kafka's principal of a client certificate: User:<name>, the name the first applicable mapping rule makes of
    the subject as RFC 2253/4514 writes it (CN=alice,O=...); None without a certificate."""
    if not der:
        return None
    subject = x509.load_der_x509_certificate(der).subject.rfc4514_string()
    for rule in rules:
        name = rule.apply(subject)
        if name is not None:
            return f"User:{name}"
    raise NoMatchingRule(f"no ssl_principal_mapping_rules entry applies to {subject}")
