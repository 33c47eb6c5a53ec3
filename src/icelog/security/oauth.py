"""OAUTHBEARER (RFC 7628, KIP-255/768): a client's JWT checked as Kafka's broker-side validator checks it.

The token must be signed by a key of the identity provider's JWKS (a file, re-read when it changes: key rotation
needs no restart), unexpired (with `sasl_oauthbearer_clock_skew_seconds` of leeway), and, when configured, for the
expected audience and issuer. The user is the `sasl_oauthbearer_sub_claim_name` claim. Verification is PyJWT's.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path
from urllib.parse import urlparse

import jwt

from icelog.config import Settings
from icelog.errors import ConfigError
from icelog.security.credentials import AuthenticationError

ALGORITHMS = ["RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "ES512"]


def _path(url: str) -> Path:
    parsed = urlparse(url)
    if parsed.scheme in ("", "file"):
        return Path(parsed.path if parsed.scheme else url)
    raise ConfigError(f"sasl_oauthbearer_jwks_endpoint_url {url!r}: only a JWKS file is read (a path or file: "
                      "URL); fetch your provider's keys to a file and point at it")


class TokenValidator:
    """Checks OAUTHBEARER tokens against a JWKS file."""

    def __init__(self, settings: Settings) -> None:
        assert settings.sasl_oauthbearer_jwks_endpoint_url is not None
        self._path = _path(settings.sasl_oauthbearer_jwks_endpoint_url)
        audience = settings.sasl_oauthbearer_expected_audience
        self._audience = [a.strip() for a in audience.split(",") if a.strip()] if audience else None
        self._issuer = settings.sasl_oauthbearer_expected_issuer
        self._claim = settings.sasl_oauthbearer_sub_claim_name
        self._leeway = settings.sasl_oauthbearer_clock_skew_seconds
        self._lock = threading.Lock()
        self._loaded: tuple[float, jwt.PyJWKSet] | None = None
        self._keys()  # a missing or broken file stops start-up, not the first login

    def _keys(self) -> jwt.PyJWKSet:
        try:
            mtime = self._path.stat().st_mtime
        except OSError as exc:
            raise ConfigError(f"JWKS file {self._path}: {exc.strerror}") from None
        with self._lock:
            if self._loaded is None or self._loaded[0] != mtime:
                try:
                    self._loaded = (mtime, jwt.PyJWKSet.from_dict(json.loads(self._path.read_text())))
                except (ValueError, jwt.PyJWTError) as exc:
                    raise ConfigError(f"JWKS file {self._path} holds no usable keys: {exc}") from None
            return self._loaded[1]

    def user(self, token: str) -> str:
        """The user a valid token names; AuthenticationError (saying what is wrong, never the token) otherwise."""
        try:
            header = jwt.get_unverified_header(token)
            keys = self._keys()
            kid = header.get("kid")
            candidates = [k for k in keys.keys if kid is None or k.key_id == kid]
            if not candidates:
                raise AuthenticationError(f"OAUTHBEARER token signed with an unknown key (kid {kid!r})")
            claims = jwt.decode(
                token, candidates[0].key, algorithms=ALGORITHMS, audience=self._audience, issuer=self._issuer,
                leeway=self._leeway, options={"require": ["exp", self._claim]},
            )
        except jwt.PyJWTError as exc:
            raise AuthenticationError(f"invalid OAUTHBEARER token: {exc}") from None
        except ConfigError as exc:
            raise AuthenticationError(f"OAUTHBEARER tokens cannot be checked: {exc}") from None
        subject = claims.get(self._claim)
        if not isinstance(subject, str) or not subject:
            raise AuthenticationError(f"OAUTHBEARER token has no {self._claim} claim naming the user")
        return subject


def bearer_token(message: bytes) -> str:
    """The token of an OAUTHBEARER client-first message (gs2 header, then \\x01-separated key=value pairs with
    auth=Bearer TOKEN, ending \\x01\\x01); AuthenticationError when it is not one."""
    try:
        text = message.decode("utf-8")
    except UnicodeDecodeError:
        raise AuthenticationError("invalid OAUTHBEARER message: not UTF-8") from None
    header, sep, rest = text.partition("\x01")
    if not sep or not header.startswith(("n,", "y,")) or not rest.endswith("\x01\x01"):
        raise AuthenticationError("invalid OAUTHBEARER message: expected gs2 header, auth=Bearer TOKEN")
    pairs = dict(p.split("=", 1) for p in rest[:-2].split("\x01") if "=" in p)
    scheme, _, token = pairs.get("auth", "").partition(" ")
    if scheme.lower() != "bearer" or not token:
        raise AuthenticationError("invalid OAUTHBEARER message: no auth=Bearer TOKEN")
    return token.strip()
