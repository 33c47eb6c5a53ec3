"""Registry subjects follow their topic's ACLs: the registry's routes in-process, with a stand-in authorizer."""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer

from icelog.meta.sqlite import SqliteStore
from icelog.schema.registry.access import RegistryAccess, subject_topic
from icelog.schema.registry.server import RegistryServer
from icelog.schema.registry.service import RegistryService
from icelog.security.acl import CLUSTER_NAME, ACLOperation, ACLResourceType
from icelog.security.credentials import make_credential

AVRO = json.dumps({"type": "record", "name": "Order", "fields": [{"name": "id", "type": "string"}]})
READ, WRITE, DELETE = ACLOperation.READ, ACLOperation.WRITE, ACLOperation.DELETE
TOPIC, CLUSTER = ACLResourceType.TOPIC, ACLResourceType.CLUSTER


class StandInAuthorizer:
    """Allows exactly the (principal, operation, resource type, name) it holds."""

    def __init__(self, allowed: set[tuple[str, ACLOperation, ACLResourceType, str]]) -> None:
        self.allowed = allowed
        self.asked: list[tuple[str, str]] = []

    def authorize(self, principal: str, host: str, operation: ACLOperation, resource_type: ACLResourceType,
                  name: str) -> bool:
        self.asked.append((principal, host))
        return (principal, operation, resource_type, name) in self.allowed


def auth(user: str) -> dict[str, str]:
    return {"Authorization": "Basic " + base64.b64encode(f"{user}:pw-{user}".encode()).decode()}


Scenario = Callable[[TestClient[Any, Any]], Awaitable[None]]


def run(tmp_path: Path, authorizer: StandInAuthorizer | None, scenario: Scenario) -> None:
    store = SqliteStore(tmp_path / "meta.db")
    for user in ("admin", "alice", "bob", "carol"):
        store.save_scram_credential(make_credential(user, "SCRAM-SHA-256", f"pw-{user}"))
    service = RegistryService(store)

    def subjects_of_schema(schema_id: int) -> list[str]:
        return sorted({v.subject for v in store.registry_versions_of_schema(schema_id)})

    access = RegistryAccess(store, {"User:admin"}, authorizer, subjects_of_schema)  # type: ignore[arg-type]

    async def main() -> None:
        async with TestClient(TestServer(RegistryServer(service, access).app())) as http:
            await scenario(http)

    try:
        asyncio.run(main())
    finally:
        store.close()


def test_subject_topic() -> None:
    assert subject_topic("orders-value") == "orders" and subject_topic("orders-key") == "orders"
    assert subject_topic("orders.v1-value") == "orders.v1"
    assert subject_topic("com.acme.Order") == "com.acme.Order" and subject_topic("-value") == "-value"


def test_each_route_asks_for_the_topic_operation(tmp_path: Path) -> None:
    authorizer = StandInAuthorizer({
        ("User:alice", READ, TOPIC, "orders"), ("User:alice", WRITE, TOPIC, "orders"),
        ("User:bob", READ, TOPIC, "orders"),
        ("User:bob", ACLOperation.DELETE, TOPIC, "orders"),
        ("User:alice", ACLOperation.ALTER_CONFIGS, TOPIC, "orders"),
        ("User:alice", ACLOperation.DESCRIBE_CONFIGS, TOPIC, "orders"),
    })

    async def scenario(http: TestClient[Any, Any]) -> None:
        async def call(method: str, path: str, user: str, body: object = None) -> tuple[int, Any]:
            reply = await http.request(method, path, headers=auth(user), json=body)
            return reply.status, await reply.json(content_type=None)

        register = {"schema": AVRO}
        assert (await call("POST", "/subjects/orders-value/versions", "alice", register))[0] == 200
        status, body = await call("POST", "/subjects/orders-value/versions", "bob", register)
        assert status == 403 and body["error_code"] == 40301 and "User:bob" in body["message"]
        assert (await call("POST", "/subjects/payments-value/versions", "alice", register))[0] == 403
        assert (await call("POST", "/subjects/payments-value/versions", "admin", register))[0] == 200  # super user

        assert (await call("GET", "/subjects/orders-value/versions", "bob"))[0] == 200
        assert (await call("GET", "/subjects/orders-value/versions/latest", "bob"))[0] == 200
        assert (await call("POST", "/subjects/orders-value", "bob", register))[0] == 200  # lookup: READ
        assert (await call("POST", "/compatibility/subjects/orders-value/versions/latest", "bob", register))[0] == 200
        assert (await call("GET", "/subjects/orders-value/versions", "carol"))[0] == 403
        # lists show only what the caller may read
        assert (await call("GET", "/subjects", "bob"))[1] == ["orders-value"]
        assert (await call("GET", "/subjects", "carol"))[1] == []
        assert (await call("GET", "/subjects", "admin"))[1] == ["orders-value", "payments-value"]
        # a schema by id: READ on some subject holding it; unknown ids stay 404
        assert (await call("GET", "/schemas/ids/1", "bob"))[0] == 200
        assert (await call("GET", "/schemas/ids/1/subjects", "bob"))[1] == ["orders-value"]
        assert (await call("GET", "/schemas/ids/1", "carol"))[0] == 403
        assert (await call("GET", "/schemas/ids/999", "carol"))[1]["error_code"] == 40403
        # open to any authenticated caller
        for path in ("/", "/schemas/types", "/config"):
            assert (await call("GET", path, "carol"))[0] == 200
        # config: ALTER_CONFIGS on the topic, on the cluster for the global level
        level = {"compatibility": "FULL"}
        assert (await call("PUT", "/config/orders-value", "alice", level))[0] == 200
        assert (await call("GET", "/config/orders-value", "alice"))[1] == {"compatibilityLevel": "FULL"}
        assert (await call("PUT", "/config/orders-value", "bob", level))[0] == 403
        assert (await call("GET", "/config/orders-value", "bob"))[0] == 403
        assert (await call("PUT", "/config", "alice", level))[0] == 403
        assert (await call("PUT", "/config", "admin", level))[0] == 200
        # deleting: DELETE on the topic
        assert (await call("DELETE", "/subjects/orders-value/versions/1", "alice"))[0] == 403
        assert (await call("DELETE", "/subjects/orders-value", "bob"))[0] == 200

    run(tmp_path, authorizer, scenario)
    assert {host for _, host in authorizer.asked} == {"127.0.0.1"}


def test_cluster_alter_configs_allows_the_global_level(tmp_path: Path) -> None:
    authorizer = StandInAuthorizer({("User:carol", ACLOperation.ALTER_CONFIGS, CLUSTER, CLUSTER_NAME)})

    async def scenario(http: TestClient[Any, Any]) -> None:
        reply = await http.put("/config", headers=auth("carol"), json={"compatibility": "NONE"})
        assert reply.status == 200

    run(tmp_path, authorizer, scenario)


def test_without_an_authorizer_authenticated_callers_may_do_anything(tmp_path: Path) -> None:
    async def scenario(http: TestClient[Any, Any]) -> None:
        reply = await http.post("/subjects/x-value/versions", headers=auth("carol"), json={"schema": AVRO})
        assert reply.status == 200
        assert (await http.delete("/subjects/x-value", headers=auth("carol"))).status == 200
        refused = await http.get("/subjects", headers={"Authorization": "Basic !!!"})
        assert refused.status == 401 and refused.headers["WWW-Authenticate"] == 'Basic realm="icelog"'
        refused = await http.get("/subjects", headers={"Authorization": "Bearer abc"})
        assert refused.status == 401

    run(tmp_path, None, scenario)


@pytest.mark.parametrize("header", ["Basic " + base64.b64encode(b"carol").decode(), "Basic " + base64.b64encode(
    b":pw").decode(), "Basic " + base64.b64encode(b"\xff:pw").decode()])
def test_malformed_basic_credentials_are_401(tmp_path: Path, header: str) -> None:
    async def scenario(http: TestClient[Any, Any]) -> None:
        reply = await http.get("/", headers={"Authorization": header})
        assert reply.status == 401 and (await reply.json())["error_code"] == 40101

    run(tmp_path, None, scenario)
