"""The embedded schema registry, through confluent-kafka's SchemaRegistryClient over HTTP."""

from __future__ import annotations

import base64
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests
from confluent_kafka.schema_registry import Schema, SchemaReference, SchemaRegistryClient
from confluent_kafka.schema_registry.error import SchemaRegistryError
from google.protobuf import descriptor_pb2

from icelog.schema.protobuf_schema import compile_schema, main_file_of
from tests.support.broker import BrokerProcess

V1 = """syntax = "proto3";
package reg.test;
message Order {
  string id = 1;
  int32 quantity = 2;
  double price = 3;
  message Line { string sku = 1; }
  repeated Line lines = 4;
}
message Customer { string name = 1; }
"""
COMMON = """syntax = "proto3";
package reg.common;
message Money { string currency = 1; int64 units = 2; }
"""
WITH_IMPORT = """syntax = "proto3";
package reg.test;
import "common.proto";
import "google/protobuf/timestamp.proto";
message Invoice { reg.common.Money total = 1; google.protobuf.Timestamp at = 2; }
"""


@pytest.fixture(scope="module")
def registry_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    proc = BrokerProcess(tmp_path_factory.mktemp("registry") / "data").start()
    yield proc
    proc.stop()


@pytest.fixture
def client(registry_broker: BrokerProcess) -> SchemaRegistryClient:
    return SchemaRegistryClient({"url": registry_broker.registry_url})


def proto(text: str) -> Schema:
    return Schema(text, "PROTOBUF")


def error_code(exc_info: pytest.ExceptionInfo[SchemaRegistryError]) -> int:
    return int(exc_info.value.error_code)


def test_register_lookup_versions_and_ids(client: SchemaRegistryClient, registry_broker: BrokerProcess) -> None:
    schema_id = client.register_schema("orders-value", proto(V1))
    assert client.register_schema("orders-value", proto(V1)) == schema_id  # idempotent
    # The same schema under another subject keeps its global id, as Confluent does.
    assert client.register_schema("orders-copy", proto(V1)) == schema_id
    latest = client.get_latest_version("orders-value")
    assert (latest.schema_id, latest.version, latest.subject) == (schema_id, 1, "orders-value")
    assert latest.schema.schema_str == V1 and latest.schema.schema_type == "PROTOBUF"
    assert client.get_version("orders-value", 1).schema_id == schema_id
    assert client.get_versions("orders-value") == [1]
    assert {"orders-value", "orders-copy"} <= set(client.get_subjects())
    assert client.get_schema(schema_id).schema_str == V1
    found = client.lookup_schema("orders-value", proto(V1))
    assert (found.schema_id, found.version) == (schema_id, 1)
    url = registry_broker.registry_url
    assert requests.get(f"{url}/schemas/types").json() == ["AVRO", "JSON", "PROTOBUF"]
    versions = requests.get(f"{url}/schemas/ids/{schema_id}/versions").json()
    assert {"subject": "orders-copy", "version": 1} in versions
    assert {"subject": "orders-value", "version": 1} in versions
    assert requests.get(f"{url}/subjects/orders-value/versions/1/schema").text == V1
    # format=serialized: a base64 FileDescriptorProto of the main file, which the Python client decodes.
    serialized = requests.get(f"{url}/schemas/ids/{schema_id}", params={"format": "serialized"}).json()["schema"]
    fdp = descriptor_pb2.FileDescriptorProto.FromString(base64.b64decode(serialized))
    assert [m.name for m in fdp.message_type] == ["Order", "Customer"]


def test_references(client: SchemaRegistryClient) -> None:
    common_id = client.register_schema("common", proto(COMMON))
    refs = [SchemaReference("common.proto", "common", 1)]
    invoice_id = client.register_schema("invoices-value", Schema(WITH_IMPORT, "PROTOBUF", refs))
    assert invoice_id != common_id
    got = client.get_schema(invoice_id)
    assert [(r.name, r.subject, r.version) for r in got.references] == [("common.proto", "common", 1)]
    # An import with no reference does not compile.
    with pytest.raises(SchemaRegistryError) as exc_info:
        client.register_schema("invoices-broken", proto(WITH_IMPORT))
    assert error_code(exc_info) == 42201
    # A reference to a version that does not exist is refused too.
    with pytest.raises(SchemaRegistryError) as exc_info:
        client.register_schema("invoices-broken", Schema(WITH_IMPORT, "PROTOBUF", [SchemaReference("common.proto",
                                                                                                   "common", 9)]))
    assert error_code(exc_info) == 42201


def test_base64_file_descriptor_registration(client: SchemaRegistryClient) -> None:
    text = V1.replace("reg.test", "reg.b64")
    fdp = main_file_of(compile_schema(text, {}))
    encoded = base64.b64encode(fdp.SerializeToString()).decode()
    b64_id = client.register_schema("b64-value", proto(encoded))
    # The same schema given as .proto text is the same schema: same id.
    assert client.register_schema("b64-text", proto(text)) == b64_id
    assert client.lookup_schema("b64-value", proto(text)).schema_id == b64_id


def evolve(old: str, new: str, level: str, client: SchemaRegistryClient, subject: str) -> bool:
    """Register old then new under a fresh subject at `level`; True if new was accepted."""
    client.set_compatibility(subject, level)
    client.register_schema(subject, proto(old))
    try:
        client.register_schema(subject, proto(new))
    except SchemaRegistryError as exc:
        assert exc.error_code == 409
        return False
    return True


BASE = 'syntax = "proto3";\npackage reg.compat;\nmessage M { string a = 1; int32 b = 2; oneof c { string c1 = 3; } }\n'
BASE_AND_N = BASE + "message N { string x = 1; }\n"
MAPS = 'syntax = "proto3";\npackage reg.maps;\nmessage M { map<string, int32> tags = 1; }\n'
P2 = 'syntax = "proto2";\npackage reg.p2;\nmessage M { optional string a = 1; required int32 r = 2; }\n'
CHANGES = {
    "proto2 required field added": (P2, P2.replace("required int32 r = 2;", "required int32 r = 2; "
                                                   "required int32 s = 3;"), False),
    "proto2 required field removed": (P2, P2.replace("required int32 r = 2;", ""), False),
    "proto2 optional field removed": (P2, P2.replace("optional string a = 1;", ""), True),
    "map renamed": (MAPS, MAPS.replace("tags", "labels"), True),
    "map value int32 to string": (MAPS, MAPS.replace("int32>", "string>"), False),
    "add field": (BASE, BASE.replace("int32 b = 2;", "int32 b = 2; string d = 4;"), True),
    "remove field": (BASE, BASE.replace("int32 b = 2;", ""), True),
    "int32 to int64 (same wire type)": (BASE, BASE.replace("int32 b", "int64 b"), True),
    "int32 to string": (BASE, BASE.replace("int32 b", "string b"), False),
    "int32 to sint32 (zigzag)": (BASE, BASE.replace("int32 b", "sint32 b"), False),
    "string to bytes": (BASE, BASE.replace("string a", "bytes a"), True),
    "scalar to message": (BASE_AND_N, BASE_AND_N.replace("string a = 1", "N a = 1"), False),
    "message removed": (BASE_AND_N, BASE, False),
    "field moved into existing oneof": (BASE, BASE.replace("int32 b = 2; oneof c { string c1 = 3; }",
                                                           "oneof c { string c1 = 3; int32 b = 2; }"), False),
    "two fields moved into a new oneof": (BASE, BASE.replace("string a = 1; int32 b = 2;",
                                                             "oneof n { string a = 1; int32 b = 2; }"), False),
    "field removed from oneof": (BASE, BASE.replace("oneof c { string c1 = 3; }", ""), False),
    "package changed": (BASE, BASE.replace("reg.compat", "reg.other"), False),
}


@pytest.mark.parametrize("change", sorted(CHANGES))
def test_backward_compatibility_rules(client: SchemaRegistryClient, change: str) -> None:
    old, new, accepted = CHANGES[change]
    subject = "compat-" + change.replace(" ", "-").replace("(", "").replace(")", "")
    assert evolve(old, new, "BACKWARD", client, subject) is accepted


def test_compatibility_levels(client: SchemaRegistryClient) -> None:
    incompatible = BASE.replace("int32 b", "string b")
    assert evolve(BASE, incompatible, "NONE", client, "levels-none")
    # Adding a message is backward compatible but not forward compatible (old readers lack it).
    assert evolve(BASE, BASE_AND_N, "BACKWARD", client, "levels-backward")
    assert not evolve(BASE, BASE_AND_N, "FORWARD", client, "levels-forward")
    assert evolve(BASE_AND_N, BASE_AND_N.replace("int32 b = 2;", "int32 b = 2; string e = 5;"), "FULL", client,
                  "levels-full")
    assert not evolve(BASE, BASE_AND_N, "FULL", client, "levels-full-2")
    # Transitive: v3 is compatible with v2 but not with v1.
    subject = "levels-transitive"
    client.set_compatibility(subject, "BACKWARD_TRANSITIVE")
    client.register_schema(subject, proto(BASE))
    client.register_schema(subject, proto(BASE.replace("int32 b = 2;", "")))  # field 2 removed: fine
    with pytest.raises(SchemaRegistryError) as exc_info:  # field 2 back with another wire type: v1 disagrees
        client.register_schema(subject, proto(BASE.replace("int32 b = 2;", "string b = 2;")))
    assert error_code(exc_info) == 409
    client.set_compatibility(subject, "BACKWARD")  # only against the latest: accepted
    client.register_schema(subject, proto(BASE.replace("int32 b = 2;", "string b = 2;")))
    # The compatibility endpoint answers without registering.
    assert client.test_compatibility("levels-backward", proto(BASE_AND_N.replace("int32 b", "string b"))) is False
    assert client.test_compatibility("levels-backward", proto(BASE_AND_N)) is True


def test_config_round_trip(client: SchemaRegistryClient, registry_broker: BrokerProcess) -> None:
    url = registry_broker.registry_url
    assert client.get_compatibility() == "BACKWARD"
    client.register_schema("cfg", proto(BASE))
    assert client.set_compatibility("cfg", "FULL_TRANSITIVE")["compatibility"] == "FULL_TRANSITIVE"
    assert requests.get(f"{url}/config/cfg").json() == {"compatibilityLevel": "FULL_TRANSITIVE"}
    assert requests.delete(f"{url}/config/cfg").json() == {"compatibilityLevel": "FULL_TRANSITIVE"}
    assert requests.get(f"{url}/config/cfg").json()["error_code"] == 40408
    assert requests.get(f"{url}/config/cfg", params={"defaultToGlobal": "true"}).json()["compatibilityLevel"]
    assert requests.put(f"{url}/config", json={"compatibility": "FORWARD"}).json() == {"compatibility": "FORWARD"}
    assert requests.get(f"{url}/config").json() == {"compatibilityLevel": "FORWARD"}
    assert requests.delete(f"{url}/config").json() == {"compatibilityLevel": "FORWARD"}
    assert requests.get(f"{url}/config").json() == {"compatibilityLevel": "BACKWARD"}
    with pytest.raises(SchemaRegistryError) as exc_info:
        client.set_compatibility("cfg", "SIDEWAYS")
    assert error_code(exc_info) == 42203


def test_error_codes(client: SchemaRegistryClient, registry_broker: BrokerProcess) -> None:
    client.register_schema("errors", proto(BASE))
    cases = {
        40401: lambda: client.get_latest_version("no-such-subject"),
        40402: lambda: client.get_version("errors", 7),
        40403: lambda: client.get_schema(987654),
        42201: lambda: client.register_schema("errors", proto("message {")),
        409: lambda: client.register_schema("errors", proto(BASE.replace("int32 b", "string b"))),
    }
    for code, call in cases.items():
        with pytest.raises(SchemaRegistryError) as exc_info:
            call()
        assert error_code(exc_info) == code, code
    url = registry_broker.registry_url
    assert requests.get(f"{url}/subjects/errors/versions/0").json()["error_code"] == 42202
    assert requests.get(f"{url}/subjects/errors/versions/x").json()["error_code"] == 42202
    assert requests.post(f"{url}/subjects/errors", json={"schema": BASE_AND_N, "schemaType": "PROTOBUF"}).json()[
        "error_code"] == 40403
    bad_avro = requests.post(f"{url}/subjects/errors/versions", json={"schema": "{}", "schemaType": "AVRO"})
    assert (bad_avro.status_code, bad_avro.json()["error_code"]) == (422, 42201)
    bad_type = requests.post(f"{url}/subjects/errors/versions", json={"schema": "{}", "schemaType": "XML"})
    assert (bad_type.status_code, bad_type.json()["error_code"]) == (422, 42201)
    assert "AVRO, JSON, PROTOBUF" in bad_type.json()["message"]


def test_soft_and_hard_deletes(client: SchemaRegistryClient, registry_broker: BrokerProcess) -> None:
    url = registry_broker.registry_url
    subject = "deletes"
    client.set_compatibility(subject, "NONE")
    first = client.register_schema(subject, proto(BASE))
    client.register_schema(subject, proto(BASE_AND_N))
    assert client.delete_version(subject, 1) == 1
    assert client.get_versions(subject) == [2]
    assert requests.get(f"{url}/subjects/{subject}/versions", params={"deleted": "true"}).json() == [1, 2]
    assert requests.get(f"{url}/subjects/{subject}/versions/1").json()["error_code"] == 40402
    assert requests.get(f"{url}/subjects/{subject}/versions/1", params={"deleted": "true"}).json()["id"] == first
    assert requests.delete(f"{url}/subjects/{subject}/versions/2", params={"permanent": "true"}).json()[
        "error_code"] == 40407  # not soft-deleted first
    assert client.delete_version(subject, 1, permanent=True) == 1
    with pytest.raises(SchemaRegistryError) as exc_info:
        client.delete_subject(subject, permanent=True)  # version 2 is live
    assert error_code(exc_info) == 40405
    assert client.delete_subject(subject) == [2]
    with pytest.raises(SchemaRegistryError) as exc_info:
        client.get_versions(subject)
    assert error_code(exc_info) == 40401
    assert subject not in client.get_subjects()
    assert subject in requests.get(f"{url}/subjects", params={"deleted": "true"}).json()
    with pytest.raises(SchemaRegistryError) as exc_info:
        client.delete_subject(subject)  # already soft-deleted
    assert error_code(exc_info) == 40404
    assert client.delete_subject(subject, permanent=True) == [2]
    assert subject not in requests.get(f"{url}/subjects", params={"deleted": "true"}).json()
    # Registering again starts the subject afresh; the schema keeps its id.
    assert client.register_schema(subject, proto(BASE)) == first


@pytest.mark.crash
def test_registry_survives_sigkill(tmp_path: Path) -> None:
    proc = BrokerProcess(tmp_path / "data").start()
    try:
        client = SchemaRegistryClient({"url": proc.registry_url})
        client.register_schema("common", proto(COMMON))
        refs = [SchemaReference("common.proto", "common", 1)]
        invoice_id = client.register_schema("durable-value", Schema(WITH_IMPORT, "PROTOBUF", refs))
        client.set_compatibility("durable-value", "FULL")
        proc.restart()  # SIGKILL, then start on the same data directory
        fresh = SchemaRegistryClient({"url": proc.registry_url})
        latest = fresh.get_latest_version("durable-value")
        assert (latest.schema_id, latest.version) == (invoice_id, 1)
        assert [r.name for r in latest.schema.references] == ["common.proto"]
        assert fresh.get_compatibility("durable-value") == "FULL"
        # Ids continue after the restart; nothing is reused.
        assert fresh.register_schema("after-restart", proto(BASE)) > invoice_id
    finally:
        proc.stop()


def test_registry_port_taken_stops_startup(tmp_path: Path) -> None:
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        proc = BrokerProcess(tmp_path / "data", env={"ICELOG_REGISTRY_LISTEN": f"127.0.0.1:{port}"})
        with pytest.raises(RuntimeError, match="cannot serve the schema registry"):
            proc.start()


def test_kafka_port_taken_stops_startup_with_one_line(tmp_path: Path) -> None:
    """As for the registry's port: a clear line naming the fix, not uvloop's traceback."""
    import os
    import socket
    import subprocess
    import sys

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        served = subprocess.run(
            [sys.executable, "-m", "icelog", "serve", "--listen", f"127.0.0.1:{port}", "--registry-listen", "off",
             "--metrics-listen", "off", "--data-dir", str(tmp_path / "data")],
            capture_output=True, text=True, timeout=120, env={**os.environ, "ICELOG_ARCHIVE__ENABLED": "false"})
    assert served.returncode != 0
    assert f"icelog: cannot serve Kafka on 127.0.0.1:{port}" in served.stderr, served.stderr
    assert "Traceback" not in served.stderr, served.stderr
