"""Client security settings under librdkafka's names (`security.protocol`, `sasl.username`, `ssl.ca.location`, ...).

Operators already write these for confluent-kafka and kcat; the archive takes the same dictionary
(`archive.client_properties`). The password is held in a field that no repr, log line or Spark conf shows.
"""

from __future__ import annotations

import ssl
from collections.abc import Mapping
from dataclasses import dataclass, field

from icelog.errors import IcelogError

PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")
KNOWN = frozenset({
    "security.protocol", "sasl.mechanism", "sasl.mechanisms", "sasl.username", "sasl.password",
    "ssl.ca.location", "ssl.certificate.location", "ssl.key.location", "ssl.key.password",
    "ssl.endpoint.identification.algorithm", "client.id",
})
SECRET_KEYS = frozenset({"sasl.password", "ssl.key.password"})


class ClientConfigError(IcelogError):
    """Client properties that cannot work (an unknown protocol, SASL without a user): a config to fix."""


@dataclass(frozen=True)
class ClientProperties:
    """How to connect to the broker; built from librdkafka-named properties by `parse`."""

    security_protocol: str = "PLAINTEXT"
    sasl_mechanism: str = "PLAIN"
    sasl_username: str = ""
    sasl_password: str = field(default="", repr=False)
    ssl_ca_location: str | None = None
    ssl_certificate_location: str | None = None
    ssl_key_location: str | None = None
    ssl_key_password: str | None = field(default=None, repr=False)
    check_hostname: bool = True
    client_id: str = "icelog-archiver"

    @property
    def uses_tls(self) -> bool:
        return self.security_protocol.endswith("SSL")

    @property
    def uses_sasl(self) -> bool:
        return self.security_protocol.startswith("SASL_")

    def ssl_context(self) -> ssl.SSLContext | None:
        """The TLS context of an SSL or SASL_SSL connection (None for plaintext)."""
        if not self.uses_tls:
            return None
        context = ssl.create_default_context(cafile=self.ssl_ca_location)
        context.check_hostname = self.check_hostname
        if self.ssl_certificate_location:
            context.load_cert_chain(self.ssl_certificate_location, self.ssl_key_location, self.ssl_key_password)
        return context


def parse(properties: Mapping[str, str]) -> ClientProperties:
    """Typed client settings from librdkafka-named properties; ClientConfigError names what is wrong."""
    unknown = sorted(set(properties) - KNOWN)
    if unknown:
        raise ClientConfigError(f"unknown client properties {', '.join(unknown)} (known: {', '.join(sorted(KNOWN))})")
    protocol = properties.get("security.protocol", "PLAINTEXT").upper()
    if protocol not in PROTOCOLS:
        raise ClientConfigError(f"security.protocol {protocol!r} is not one of {', '.join(PROTOCOLS)}")
    mechanism = properties.get("sasl.mechanism", properties.get("sasl.mechanisms", "PLAIN")).upper()
    if mechanism not in MECHANISMS:
        raise ClientConfigError(f"sasl.mechanism {mechanism!r} is not one of {', '.join(MECHANISMS)}")
    out = ClientProperties(
        security_protocol=protocol,
        sasl_mechanism=mechanism,
        sasl_username=properties.get("sasl.username", ""),
        sasl_password=properties.get("sasl.password", ""),
        ssl_ca_location=properties.get("ssl.ca.location") or None,
        ssl_certificate_location=properties.get("ssl.certificate.location") or None,
        ssl_key_location=properties.get("ssl.key.location") or None,
        ssl_key_password=properties.get("ssl.key.password") or None,
        check_hostname=properties.get("ssl.endpoint.identification.algorithm", "https").lower() != "none",
        client_id=properties.get("client.id", "icelog-archiver"),
    )
    if out.uses_sasl and not out.sasl_username:
        raise ClientConfigError(f"security.protocol {protocol} needs sasl.username and sasl.password")
    return out


def redacted(properties: Mapping[str, str]) -> dict[str, str]:
    """The properties with every secret replaced, for status lines and logs."""
    return {k: ("******" if k in SECRET_KEYS else v) for k, v in properties.items()}
