"""One connection to a Kafka broker: TCP, then TLS and a SASL login as the client properties say.

Requests are kafka-python's generated protocol classes (Kafka's own JSON message specs); nothing here
decodes records, so what a Fetch answers comes back as the broker's bytes.
"""

from __future__ import annotations

import contextlib
import socket
import ssl
import struct
from typing import Any

from kafka.protocol.sasl import (
    SaslAuthenticateRequest,
    SaslAuthenticateResponse,
    SaslHandshakeRequest,
    SaslHandshakeResponse,
)

from icelog.client.properties import ClientProperties
from icelog.errors import IcelogError

_SIZE = struct.Struct(">i")
CONNECT_TIMEOUT_S = 10.0
REQUEST_TIMEOUT_S = 60.0


class BrokerUnreachableError(IcelogError):
    """The broker did not answer at the address given (down, a wrong address, a firewall): retried."""

    retriable = True


class BrokerLoginError(IcelogError):
    """The broker refused the TLS handshake or the SASL login: the client properties need fixing."""


class BrokerRequestError(IcelogError):
    """The broker answered a request with a Kafka error code."""

    def __init__(self, message: str, code: int, retriable: bool) -> None:
        super().__init__(message)
        self.code = code
        self.retriable = retriable


def split_address(address: str) -> tuple[str, int]:
    """(host, port) of `host:port` (a listener URL's scheme, if any, is dropped)."""
    address = address.rsplit("://", 1)[-1]
    host, _, port = address.rpartition(":")
    return host.strip("[]") or "127.0.0.1", int(port)


class BrokerConnection:
    """A blocking connection; `request` sends one request object and returns its decoded response."""

    def __init__(self, address: str, props: ClientProperties) -> None:
        self.address = address
        self.props = props
        host, port = split_address(address)
        try:
            raw = socket.create_connection((host, port), timeout=CONNECT_TIMEOUT_S)
        except OSError as exc:
            raise BrokerUnreachableError(f"cannot reach the broker at {address}: {exc.strerror or exc}") from None
        raw.settimeout(REQUEST_TIMEOUT_S)
        raw.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.sock: socket.socket = raw
        self.correlation = 0
        try:
            context = props.ssl_context()
            if context is not None:
                try:
                    self.sock = context.wrap_socket(raw, server_hostname=host)
                except (ssl.SSLError, ssl.CertificateError) as exc:
                    raise BrokerLoginError(f"TLS with the broker at {address} failed: {exc}") from None
            if props.uses_sasl:
                self._login()
        except BaseException:
            self.close()
            raise

    def request(self, request: Any, version: int, response_class: Any) -> Any:
        """Send `request` at `version`; its response decoded (BrokerUnreachableError if the connection drops)."""
        self.correlation += 1
        request.API_VERSION = version
        request.with_header(correlation_id=self.correlation, client_id=self.props.client_id)
        try:
            self.sock.sendall(request.encode(version=version, header=True, framed=True))
            size = _SIZE.unpack(self._read(4))[0]
            frame = self._read(size)
        except OSError as exc:
            raise BrokerUnreachableError(f"the connection to the broker at {self.address} broke: {exc}") from None
        return response_class.decode(frame, version=version, header=True)

    def _read(self, n: int) -> bytes:
        buffer = bytearray(n)
        view = memoryview(buffer)
        got = 0
        while got < n:
            read = self.sock.recv_into(view[got:])
            if not read:
                raise ConnectionError("the broker closed the connection")
            got += read
        return bytes(buffer)

    def _login(self) -> None:
        """SaslHandshake v1, then SaslAuthenticate rounds (PLAIN: one; SCRAM: two, with scramp's client)."""
        props = self.props
        handshake = self.request(SaslHandshakeRequest(mechanism=props.sasl_mechanism), 1, SaslHandshakeResponse)
        if handshake.error_code:
            raise BrokerLoginError(
                f"the broker at {self.address} does not take SASL {props.sasl_mechanism} "
                f"(it offers {', '.join(handshake.mechanisms or []) or 'none'})"
            )
        if props.sasl_mechanism == "PLAIN":
            token = b"\0" + props.sasl_username.encode() + b"\0" + props.sasl_password.encode()
            self._authenticate(token)
            return
        from scramp import ScramClient

        client = ScramClient([props.sasl_mechanism], props.sasl_username, props.sasl_password)
        server_first = self._authenticate(client.get_client_first().encode())
        client.set_server_first(server_first.decode())
        server_final = self._authenticate(client.get_client_final().encode())
        try:
            client.set_server_final(server_final.decode())
        except Exception as exc:  # scramp raises its own ScramException: the server proved no knowledge
            raise BrokerLoginError(f"the broker at {self.address} failed SCRAM's server proof: {exc}") from None

    def _authenticate(self, token: bytes) -> bytes:
        response = self.request(SaslAuthenticateRequest(auth_bytes=token), 1, SaslAuthenticateResponse)
        if response.error_code:
            raise BrokerLoginError(
                f"the broker at {self.address} refused the SASL {self.props.sasl_mechanism} login of "
                f"{self.props.sasl_username!r}: {response.error_message or response.error_code}"
            )
        return bytes(response.auth_bytes)

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.close()
