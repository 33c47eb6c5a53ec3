"""The embedded schema registry against hostile or buggy clients (issue 29, case 7).

Every client mistake is a 4xx with Confluent's error code and no traceback in the broker's log; concurrent
compatible registrations under one subject all succeed; a referenced subject version cannot be deleted;
no answer reveals a server path. Each case is a real HTTP request to a real broker.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests

from tests.support.broker import BrokerProcess

COMMON = 'syntax = "proto3";\npackage hostile.common;\nmessage Money { string currency = 1; int64 units = 2; }\n'
IMPORTER = (
    'syntax = "proto3";\npackage hostile.test;\nimport "common.proto";\n'
    "message Invoice { hostile.common.Money total = 1; }\n"
)
DEEP = 100_000  # far past json's recursion limit


@pytest.fixture(scope="module")
def registry_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    proc = BrokerProcess(tmp_path_factory.mktemp("registry-hostile") / "data").start()
    url = proc.registry_url
    # A referenced schema for the cases that name imports.
    reply = requests.post(f"{url}/subjects/hostile-common/versions", json={"schema": COMMON, "schemaType": "PROTOBUF"})
    assert reply.status_code == 200, reply.text
    yield proc
    proc.stop()


@pytest.fixture
def clean_log(registry_broker: BrokerProcess) -> Iterator[None]:
    """The broker logs no traceback and no server path while the test runs."""
    start = len(registry_broker.log())
    yield
    added = registry_broker.log()[start:]
    assert "Traceback" not in added, added[-4000:]
    assert "icelog-protoc-" not in added, added[-4000:]


def _avro_record(name: str, doc: str = "") -> str:
    return json.dumps({"type": "record", "name": name, "doc": doc, "fields": [{"name": "a", "type": "int"}]},
                      ensure_ascii=False)


def _check(reply: requests.Response, status: int, code: int) -> None:
    assert (reply.status_code, reply.json()["error_code"]) == (status, code), reply.text[:500]
    message = reply.json()["message"]
    assert len(message) < 1000, message[:200]  # quotes no unbounded input
    assert "icelog-protoc-" not in message and "/tmp" not in message, message


def _proto_ref(name: str) -> bytes:
    body = {"schema": IMPORTER.replace("common.proto", name), "schemaType": "PROTOBUF",
            "references": [{"name": name, "subject": "hostile-common", "version": 1}]}
    return json.dumps(body).encode()


BODIES: dict[str, tuple[bytes, int, int]] = {
    "deeply nested body": (b"[" * DEEP + b"]" * DEEP, 422, 42201),
    "avro schema nested 450 deep": (
        json.dumps({"schema": '{"type": "array", "items": ' * 450 + '"int"' + "}" * 450}).encode(), 422, 42201),
    "deeply nested json schema": (
        json.dumps({"schema": '{"items":' * 5000 + "{}" + "}" * 5000, "schemaType": "JSON"}).encode(), 422, 42201),
    "references not a list": (json.dumps({"schema": _avro_record("R"), "references": 5}).encode(), 422, 42201),
    "reference version overflows": (
        b'{"schema": "\\"int\\"", "references": [{"name": "a", "subject": "b", "version": 1e400}]}', 422, 42201),
    "long reference entry": (
        json.dumps({"schema": '"int"', "references": [{"name": "x" * 100_000, "subject": 1, "version": 1}]}).encode(),
        422, 42201),
    "long schemaType": (json.dumps({"schema": '"int"', "schemaType": "X" * 100_000}).encode(), 422, 42201),
    "long missing reference": (
        json.dumps({"schema": '"int"', "references": [{"name": "x" * 100_000, "subject": "y" * 100_000,
                                                       "version": 1}]}).encode(), 422, 42201),
    "lone surrogate in the schema": (
        b'{"schema": "{\\"type\\": \\"record\\", \\"name\\": \\"R\\", \\"doc\\": \\"\\ud800\\", '
        b'\\"fields\\": []}"}', 422, 42201),
    "reference named .": (_proto_ref("."), 422, 42201),
}


@pytest.mark.usefixtures("clean_log")
@pytest.mark.parametrize("case", list(BODIES))
def test_bad_bodies_get_42201(registry_broker: BrokerProcess, case: str) -> None:
    body, status, code = BODIES[case]
    url = registry_broker.registry_url
    headers = {"Content-Type": "application/vnd.schemaregistry.v1+json"}
    for path in ("/subjects/hostile-bodies/versions", "/compatibility/subjects/hostile-common/versions/latest"):
        _check(requests.post(url + path, data=body, headers=headers), status, code)
    # Lookup of a subject that exists parses the body too.
    _check(requests.post(f"{url}/subjects/hostile-common", data=body, headers=headers), status, code)


PATHS: dict[str, tuple[str, int, int]] = {
    "schema id overflows": ("/schemas/ids/99999999999999999999", 404, 40403),
    "schema id overflows, versions": ("/schemas/ids/99999999999999999999/versions", 404, 40403),
    "schema id overflows, subjects": ("/schemas/ids/99999999999999999999/subjects", 404, 40403),
    "schema id overflows, raw": ("/schemas/ids/99999999999999999999/schema", 404, 40403),
    "schema id is a superscript": ("/schemas/ids/²", 404, 40403),
    "version is a superscript": ("/subjects/hostile-common/versions/²", 422, 42202),
    "version is a superscript, raw": ("/subjects/hostile-common/versions/²/schema", 422, 42202),
}


@pytest.mark.usefixtures("clean_log")
@pytest.mark.parametrize("case", list(PATHS))
def test_bad_ids_and_versions(registry_broker: BrokerProcess, case: str) -> None:
    path, status, code = PATHS[case]
    _check(requests.get(registry_broker.registry_url + path), status, code)


@pytest.mark.usefixtures("clean_log")
def test_bad_version_in_delete_and_compatibility(registry_broker: BrokerProcess) -> None:
    url = registry_broker.registry_url
    _check(requests.delete(f"{url}/subjects/hostile-common/versions/²"), 422, 42202)
    reply = requests.post(f"{url}/compatibility/subjects/hostile-common/versions/²",
                          json={"schema": COMMON, "schemaType": "PROTOBUF"})
    _check(reply, 422, 42202)


@pytest.mark.usefixtures("clean_log")
def test_concurrent_compatible_registrations_all_succeed(registry_broker: BrokerProcess) -> None:
    url = registry_broker.registry_url
    subject = "hostile-concurrent"
    # Checked against every live version: the check takes longer as versions pile up, as in a busy registry.
    assert requests.put(f"{url}/config/{subject}", json={"compatibility": "FULL_TRANSITIVE"}).status_code == 200

    def register(i: int) -> requests.Response:
        schema = {"type": "record", "name": "R", "fields": [
            {"name": "id", "type": "string"}, {"name": f"f{i}", "type": ["null", "int"], "default": None}]}
        return requests.post(f"{url}/subjects/{subject}/versions", json={"schema": json.dumps(schema)}, timeout=120)

    with ThreadPoolExecutor(50) as pool:
        replies = list(pool.map(register, range(50)))
    assert [r.status_code for r in replies] == [200] * 50, [r.text for r in replies if r.status_code != 200][:3]
    assert sorted(r.json()["version"] for r in replies) == list(range(1, 51))
    assert requests.get(f"{url}/subjects/{subject}/versions").json() == list(range(1, 51))


@pytest.mark.usefixtures("clean_log")
def test_referenced_subject_version_cannot_be_deleted(registry_broker: BrokerProcess) -> None:
    url = registry_broker.registry_url
    common, importer = "hostile-ref-common", "hostile-ref-importer"
    assert requests.post(f"{url}/subjects/{common}/versions",
                         json={"schema": COMMON, "schemaType": "PROTOBUF"}).status_code == 200
    body = {"schema": IMPORTER, "schemaType": "PROTOBUF",
            "references": [{"name": "common.proto", "subject": common, "version": 1}]}
    assert requests.post(f"{url}/subjects/{importer}/versions", json=body).status_code == 200

    _check(requests.delete(f"{url}/subjects/{common}/versions/1"), 422, 42206)
    _check(requests.delete(f"{url}/subjects/{common}/versions/latest"), 422, 42206)
    _check(requests.delete(f"{url}/subjects/{common}"), 422, 42206)
    assert common in requests.get(f"{url}/subjects/{common}/versions/1").json()["subject"]

    # Once the importer is soft-deleted, a soft delete of the import is allowed, a permanent one is not:
    # the importer's schema (still readable by id) would no longer compile.
    assert requests.delete(f"{url}/subjects/{importer}").json() == [1]
    assert requests.delete(f"{url}/subjects/{common}").json() == [1]
    _check(requests.delete(f"{url}/subjects/{common}", params={"permanent": "true"}), 422, 42206)
    _check(requests.delete(f"{url}/subjects/{common}/versions/1", params={"permanent": "true"}), 422, 42206)
    assert requests.delete(f"{url}/subjects/{importer}", params={"permanent": "true"}).json() == [1]
    assert requests.delete(f"{url}/subjects/{common}", params={"permanent": "true"}).json() == [1]


@pytest.mark.usefixtures("clean_log")
def test_no_path_in_answers_to_bad_imports(registry_broker: BrokerProcess) -> None:
    url = registry_broker.registry_url
    # Two references where one's name is the other's directory: the temp dir must not show.
    body = {"schema": IMPORTER.replace("common.proto", "a/common.proto"), "schemaType": "PROTOBUF",
            "references": [{"name": "a", "subject": "hostile-common", "version": 1},
                           {"name": "a/common.proto", "subject": "hostile-common", "version": 1}]}
    _check(requests.post(f"{url}/subjects/hostile-paths/versions", json=body), 422, 42201)
