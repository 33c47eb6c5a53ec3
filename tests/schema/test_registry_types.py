"""The embedded registry holds AVRO, JSON and PROTOBUF schemas, as Confluent's clients use them.

Through confluent-kafka's SchemaRegistryClient over HTTP: Avro registered with no `schemaType` (as
AvroSerializer does), references between subjects for each type, and each compatibility level checked by
the type's own rules (an incompatible change is refused with Confluent's 409).
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
import requests
from confluent_kafka.schema_registry import Schema, SchemaReference, SchemaRegistryClient
from confluent_kafka.schema_registry.error import SchemaRegistryError

from tests.support.broker import BrokerProcess


@pytest.fixture(scope="module")
def registry_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    proc = BrokerProcess(tmp_path_factory.mktemp("registry-types") / "data").start()
    yield proc
    proc.stop()


@pytest.fixture
def client(registry_broker: BrokerProcess) -> SchemaRegistryClient:
    return SchemaRegistryClient({"url": registry_broker.registry_url})


def avro(fields: list[dict[str, object]], name: str = "User") -> str:
    return json.dumps({"type": "record", "name": name, "namespace": "reg", "fields": fields})


def js(properties: dict[str, object], additional: bool | None = None, required: list[str] | None = None) -> str:
    doc: dict[str, object] = {"type": "object", "properties": properties}
    if additional is not None:
        doc["additionalProperties"] = additional
    if required:
        doc["required"] = required
    return json.dumps(doc)


PROTO_V1 = 'syntax = "proto3"; package reg.p; message M { string id = 1; int32 n = 2; }'

# (type, v1, v2 compatible both ways, v3 readable only by old readers (forward-only), v4 incompatible both ways)
CASES = {
    "AVRO": (
        avro([{"name": "id", "type": "long"}]),
        avro([{"name": "id", "type": "long"}, {"name": "email", "type": ["null", "string"], "default": None}]),
        # a new field without a default: new readers cannot read old data (not backward); old readers ignore it
        avro([{"name": "id", "type": "long"}, {"name": "email", "type": ["null", "string"], "default": None},
              {"name": "age", "type": "int"}]),
        avro([{"name": "id", "type": "string"}]),
    ),
    "JSON": (
        js({"id": {"type": "integer"}}),
        js({"id": {"type": "integer", "description": "the user's id"}}),
        # a property added to an open content model: old data may hold `age` as anything (not backward);
        # old readers accept any extra property (forward)
        js({"id": {"type": "integer"}, "age": {"type": "integer"}}),
        js({"id": {"type": "string"}}),
    ),
}


@pytest.mark.parametrize("schema_type", ["AVRO", "JSON"])
def test_levels_follow_each_types_rules(client: SchemaRegistryClient, schema_type: str) -> None:
    v1, v2, forward_only, incompatible = CASES[schema_type]
    for level, accepts_forward_only in (("BACKWARD", False), ("FORWARD", True), ("FULL", False), ("NONE", True)):
        subject = f"levels-{schema_type}-{level}".lower()
        client.set_compatibility(subject, level)
        client.register_schema(subject, Schema(v1, schema_type))
        client.register_schema(subject, Schema(v2, schema_type))
        if accepts_forward_only:
            client.register_schema(subject, Schema(forward_only, schema_type))
        else:
            with pytest.raises(SchemaRegistryError) as refused:
                client.register_schema(subject, Schema(forward_only, schema_type))
            assert (refused.value.http_status_code, refused.value.error_code) == (409, 409), level
            assert "incompatible with an earlier schema" in refused.value.error_message
        if level != "NONE":
            with pytest.raises(SchemaRegistryError) as refused:
                client.register_schema(subject, Schema(incompatible, schema_type))
            assert refused.value.error_code == 409 and "id" in refused.value.error_message
        assert client.test_compatibility(subject, Schema(incompatible, schema_type)) is (level == "NONE")


def test_transitive_levels_check_every_version(client: SchemaRegistryClient) -> None:
    base = [{"name": "id", "type": "long"}]
    # A change only an older version objects to: drop the default of `a` (the latest has `a` too, v1 does not).
    for level, refused in (("BACKWARD", False), ("BACKWARD_TRANSITIVE", True)):
        subject = f"transitive-old-{level}".lower()
        client.set_compatibility(subject, "NONE")
        client.register_schema(subject, Schema(avro(base), "AVRO"))
        client.register_schema(subject, Schema(avro([*base, {"name": "a", "type": "int", "default": 0}]), "AVRO"))
        client.set_compatibility(subject, level)
        candidate = Schema(avro([*base, {"name": "a", "type": "int"}]), "AVRO")
        if refused:
            with pytest.raises(SchemaRegistryError) as exc_info:
                client.register_schema(subject, candidate)
            assert exc_info.value.error_code == 409
        else:
            client.register_schema(subject, candidate)


def test_avro_without_schema_type_and_references(client: SchemaRegistryClient,
                                                 registry_broker: BrokerProcess) -> None:
    url = registry_broker.registry_url
    # AvroSerializer's request: no schemaType. Confluent reads it as AVRO, and answers without one.
    address = json.dumps({"type": "record", "name": "Address", "namespace": "reg",
                          "fields": [{"name": "city", "type": "string"}]})
    posted = requests.post(f"{url}/subjects/address/versions", json={"schema": address})
    assert posted.status_code == 200, posted.text
    got = requests.get(f"{url}/subjects/address/versions/latest").json()
    assert "schemaType" not in got and got["schema"] == address
    # A named type from another subject, by its full name.
    person = avro([{"name": "name", "type": "string"}, {"name": "home", "type": "reg.Address"}], "Person")
    person_id = client.register_schema("person", Schema(person, "AVRO", [SchemaReference("reg.Address", "address",
                                                                                          1)]))
    assert client.get_schema(person_id).references[0].name == "reg.Address"
    unresolved = requests.post(f"{url}/subjects/person2/versions", json={"schema": person})
    assert (unresolved.status_code, unresolved.json()["error_code"]) == (422, 42201)
    assert "reg.Address" in unresolved.json()["message"]
    # Spelling does not make another schema: same id, same version.
    respelled = json.dumps(json.loads(address), indent=2)
    assert requests.post(f"{url}/subjects/address/versions", json={"schema": respelled}).json()["id"] == \
        got["id"]
    # JSON Schema: a $ref to another subject's schema by its reference name.
    client.register_schema("point", Schema(js({"x": {"type": "number"}}), "JSON"))
    shape = json.dumps({"type": "object", "properties": {"at": {"$ref": "point.json"}}})
    shape_id = client.register_schema("shape", Schema(shape, "JSON", [SchemaReference("point.json", "point", 1)]))
    assert client.get_schema(shape_id).schema_type == "JSON"
    dangling = requests.post(f"{url}/subjects/shape2/versions", json={"schema": shape, "schemaType": "JSON"})
    assert dangling.status_code == 422
    # Protobuf imports keep working next to them.
    client.register_schema("proto", Schema(PROTO_V1, "PROTOBUF"))
    assert requests.get(f"{url}/schemas/types").json() == ["AVRO", "JSON", "PROTOBUF"]
    # A subject is of one type: a Protobuf schema under an Avro subject is refused (unless NONE).
    with pytest.raises(SchemaRegistryError) as exc_info:
        client.register_schema("address", Schema(PROTO_V1, "PROTOBUF"))
    assert exc_info.value.error_code == 409
