"""Who may call the schema registry: HTTP basic auth with the broker's users, and topic ACLs per subject.

On as soon as a Kafka listener authenticates its clients (or ACLs are on): a registry anyone can write to would
let any client change what producers must send. Every request then needs credentials, reads included (a read
from an unknown caller cannot be checked against ACLs, which name users); they are checked as a PLAIN login is,
against the stored SCRAM keys, where the broker's LoginChecks run them (the login process, never the threads that
serve Fetch), a few at a time per client address; a failed login is answered after Kafka's
connection.failed.authentication.delay.ms, as a failed SASL login is. An address that has failed too often
(FailedLoginLimit: by default 20 at once, then one a second) gets 429 (42901) with Retry-After, after that wait
and with no check at all, unless its user and password logged in before; a well-behaved client (Confluent's retry
on 429) waits, a guesser is slowed to one check a second per address.

A subject follows the ACLs of the topic its name derives from (`<topic>-key` / `<topic>-value`; any other name
is its own topic name): READ to read it, WRITE to register, DELETE to delete, DESCRIBE_CONFIGS / ALTER_CONFIGS
for its compatibility config (ALTER_CONFIGS on the cluster for the global one). Super users may do anything,
and without an authorizer so may every authenticated user. Refusals use Confluent's codes (40101, 40301).
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import json
import logging
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from aiohttp import web

from icelog.config import Settings
from icelog.meta.security import SecurityStore
from icelog.schema.registry.service import RegistryError, parse_schema_id
from icelog.security.acl import CLUSTER_NAME, ACLOperation, ACLResourceType
from icelog.security.log_lines import ThrottledLog, bounded
from icelog.security.logins import FailedLoginLimit, LoginChecks

if TYPE_CHECKING:
    from icelog.security.authorizer import Authorizer

log = logging.getLogger(__name__)
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
REALM = 'Basic realm="icelog"'
_OPEN = object()  # any authenticated caller
_SCHEMA = object()  # READ on some subject that holds the schema of the path's id

# (method, route) -> what the caller needs; a route missing here is for super users only, so a route added
# later is closed until its rule is written. Lists (/subjects, a schema's subjects/versions) are filtered by
# the handlers (`readable`).
_RULES: dict[tuple[str, str], object] = {
    ("GET", "/"): _OPEN,
    ("GET", "/schemas/types"): _OPEN,
    ("GET", "/subjects"): _OPEN,
    ("GET", "/config"): _OPEN,
    ("PUT", "/config"): (ACLResourceType.CLUSTER, ACLOperation.ALTER_CONFIGS),
    ("DELETE", "/config"): (ACLResourceType.CLUSTER, ACLOperation.ALTER_CONFIGS),
    ("GET", "/schemas/ids/{id}"): _SCHEMA,
    ("GET", "/schemas/ids/{id}/schema"): _SCHEMA,
    ("GET", "/schemas/ids/{id}/versions"): _SCHEMA,
    ("GET", "/schemas/ids/{id}/subjects"): _SCHEMA,
    ("POST", "/subjects/{subject}"): ACLOperation.READ,  # look up a schema under the subject
    ("DELETE", "/subjects/{subject}"): ACLOperation.DELETE,
    ("GET", "/subjects/{subject}/versions"): ACLOperation.READ,
    ("POST", "/subjects/{subject}/versions"): ACLOperation.WRITE,
    ("GET", "/subjects/{subject}/versions/{version}"): ACLOperation.READ,
    ("DELETE", "/subjects/{subject}/versions/{version}"): ACLOperation.DELETE,
    ("GET", "/subjects/{subject}/versions/{version}/schema"): ACLOperation.READ,
    ("POST", "/compatibility/subjects/{subject}/versions"): ACLOperation.READ,
    ("POST", "/compatibility/subjects/{subject}/versions/{version}"): ACLOperation.READ,
    ("GET", "/config/{subject}"): ACLOperation.DESCRIBE_CONFIGS,
    ("PUT", "/config/{subject}"): ACLOperation.ALTER_CONFIGS,
    ("DELETE", "/config/{subject}"): ACLOperation.ALTER_CONFIGS,
}


def asks_credentials(settings: Settings) -> bool:
    """Whether the registry authenticates its callers: when ACLs are on or some Kafka listener authenticates."""
    return settings.authorizes or any(spec.authenticates(settings.ssl_client_auth) for spec in settings.listener_specs)


@dataclass(frozen=True)
class Caller:
    """An authenticated registry client: its Kafka principal and address, as ACLs name them."""

    principal: str
    host: str


CALLER = web.RequestKey("icelog.caller", Caller)  # the authenticated caller of a request


def subject_topic(subject: str) -> str:
    """The topic whose ACLs a subject follows (TopicNameStrategy's `<topic>-key` / `<topic>-value`)."""
    for suffix in ("-key", "-value"):
        if subject.endswith(suffix) and len(subject) > len(suffix):
            return subject.removesuffix(suffix)
    return subject


def _refusal(status: int, error_code: int, message: str) -> web.Response:
    headers = {"WWW-Authenticate": REALM} if status == 401 else None
    return web.Response(text=json.dumps({"error_code": error_code, "message": message}), status=status,
                        content_type="application/json", headers=headers)


def _basic_credentials(header: str) -> tuple[str, str] | None:
    """(user, password) of an `Authorization: Basic ...` header, or None if it is not one."""
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "basic":
        return None
    try:
        user, sep, password = base64.b64decode(token.strip(), validate=True).decode("utf-8").partition(":")
    except (binascii.Error, UnicodeDecodeError):
        return None
    return (user, password) if sep and user else None


class _Limited(Exception):
    """The caller's address has no failed login left: answer 429 after `seconds`."""

    def __init__(self, seconds: float) -> None:
        super().__init__(seconds)
        self.seconds = seconds


class RegistryAccess:
    """Authentication (an aiohttp middleware) and per-subject authorization of registry requests."""

    def __init__(self, store: SecurityStore, super_users: Iterable[str], authorizer: Authorizer | None,
                 subjects_of_schema: Callable[[int], list[str]], logins: LoginChecks | None = None,
                 failure_delay_ms: int = 100, failures: FailedLoginLimit | None = None) -> None:
        self._store = store
        self._super_users = frozenset(super_users)
        self.authorizer = authorizer
        self._subjects_of_schema = subjects_of_schema
        self._logins = logins or LoginChecks()
        self._failure_delay_s = failure_delay_ms / 1000
        self._failures = failures or FailedLoginLimit()
        self._limited = ThrottledLog(log, "schema registry: logins refused unchecked (429), the address has failed "
                                          "too often")

    def close(self) -> None:
        self._limited.close()

    async def _authenticate(self, request: web.Request) -> Caller | None:
        """The caller, or None for no or wrong credentials; raises _Limited when the address may not try now."""
        credentials = _basic_credentials(request.headers.get("Authorization", ""))
        if credentials is None:
            return None
        user, password = credentials
        client = request.remote or ""
        let_through = self._logins.logged_in_before(user, password)  # a user of this address, under attack
        if not let_through and (wait := self._failures.take(client)):
            raise _Limited(max(wait, self._failure_delay_s))  # no store read, no key derivation
        async with self._logins.turn(client):
            valid = await self._logins.password(self._store, user, password)
        if not valid:
            if let_through:
                self._failures.failed(client)
            await asyncio.sleep(self._failure_delay_s)  # slows guessing; the client's turn is already given back
            return None
        if not let_through:
            self._failures.give_back(client)
        return Caller(f"User:{user}", client)

    def may(self, caller: Caller, operation: ACLOperation, resource_type: ACLResourceType, name: str) -> bool:
        """Whether the caller may do `operation` on the resource (a topic, or the cluster)."""
        if caller.principal in self._super_users or self.authorizer is None:
            return True
        return self.authorizer.authorize(caller.principal, caller.host, operation, resource_type, name)

    def may_read(self, caller: Caller, subject: str) -> bool:
        return self.may(caller, ACLOperation.READ, ACLResourceType.TOPIC, subject_topic(subject))

    def readable(self, request: web.Request, subjects: Iterable[str]) -> list[str]:
        """The subjects the request's caller may read (every one when access is not checked)."""
        caller = request.get(CALLER)
        if caller is None:
            return list(subjects)
        return [s for s in subjects if self.may_read(caller, s)]

    def _allowed(self, caller: Caller, request: web.Request) -> bool:
        resource = request.match_info.route.resource
        if resource is None:  # no such route: the router answers 404 / 405
            return True
        rule = _RULES.get((request.method, resource.canonical))
        if rule is _OPEN:
            return True
        if rule is _SCHEMA:
            try:
                subjects = self._subjects_of_schema(parse_schema_id(request.match_info["id"]))
            except RegistryError:  # not an id that can exist: the handler answers 404 (40403)
                return True
            return not subjects or any(self.may_read(caller, s) for s in subjects)  # none: the handler's 404
        if isinstance(rule, ACLOperation):
            return self.may(caller, rule, ACLResourceType.TOPIC, subject_topic(request.match_info["subject"]))
        if isinstance(rule, tuple):
            resource_type, operation = rule
            return self.may(caller, operation, resource_type, CLUSTER_NAME)
        return caller.principal in self._super_users

    @web.middleware
    async def middleware(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        """401 without valid credentials, 429 while the caller's address has failed too often, 403 when the
        caller's ACLs do not allow the request."""
        try:
            caller = await self._authenticate(request)
        except _Limited as limited:
            self._limited.event(f"from {bounded(request.remote or '')}")
            await asyncio.sleep(limited.seconds)  # answered when a check would be: retrying at once gains nothing
            retry = FailedLoginLimit.header(limited.seconds)
            return web.Response(
                text=json.dumps({"error_code": 42901, "message": "Too many failed logins from this address: "
                                 f"retry after {retry} s"}),
                status=429, content_type="application/json", headers={"Retry-After": retry})
        if caller is None:
            # one answer for a missing header, an unknown user and a wrong password; never quoting the header
            return _refusal(401, 40101, "Unauthorized: send the credentials of an icelog user (HTTP basic auth, "
                                        "basic.auth.user.info)")
        if not self._allowed(caller, request):
            what = f"{request.method} {request.path[:200]}"
            return _refusal(403, 40301, f"{caller.principal} is not authorized to {what}")
        request[CALLER] = caller
        return await handler(request)
