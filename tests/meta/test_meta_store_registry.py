"""Metadata-store behaviour of the schema registry's slice (RegistryStore), once per backend.

Runs once per backend in STORE_BACKENDS (the `store` and `open_same_store` fixtures of tests/meta/conftest.py); the
registry's HTTP semantics over it are tests/schema/test_registry.py.
"""

from __future__ import annotations

import pytest

from icelog.meta.registry import RegistryConflictError, RegistrySchema, SchemaReference, SubjectVersion
from icelog.meta.store import MetadataStore
from tests.meta.conftest import OpenStore


def test_store_guards_concurrent_registrations(store: MetadataStore) -> None:
    """registry_add_version refuses a version checked against a stale latest; ids are never reused."""
    v1 = store.registry_add_version("s", "PROTOBUF", "a", [], "fp-a", None)
    assert (v1.version, v1.schema_id) == (1, 1)
    with pytest.raises(RegistryConflictError):  # checked against "no versions", but v1 exists now
        store.registry_add_version("s", "PROTOBUF", "b", [], "fp-b", None)
    assert store.registry_add_version("s", "PROTOBUF", "a", [], "fp-a", 99) == v1  # already there
    v2 = store.registry_add_version("s", "PROTOBUF", "b", [], "fp-b", 1)
    store.registry_delete_versions("s", [1, 2], permanent=False)
    store.registry_delete_versions("s", [1, 2], permanent=True)
    assert store.registry_versions("s") == []
    v3 = store.registry_add_version("s", "PROTOBUF", "c", [], "fp-c", None)
    assert v3.schema_id > v2.schema_id and v3.version == 1


def test_one_schema_id_per_fingerprint_across_subjects_and_reopen(open_same_store: OpenStore) -> None:
    first = open_same_store()
    common = first.registry_add_version("common", "PROTOBUF", "message C {}", [], "fp-c", None)
    ref = SchemaReference("common.proto", "common", common.version)
    orders = first.registry_add_version("orders", "PROTOBUF", "message O {}", [ref], "fp-o", None)
    again = first.registry_add_version("orders-copy", "PROTOBUF", "message O {}", [ref], "fp-o", None)
    assert again == SubjectVersion("orders-copy", 1, orders.schema_id)  # same schema, same id
    first.close()

    store = open_same_store()
    expected = RegistrySchema(orders.schema_id, "PROTOBUF", "message O {}", (ref,), "fp-o")
    assert store.registry_schema(orders.schema_id) == expected
    assert store.registry_schema_by_fingerprint("fp-o") == expected
    assert store.registry_schema(999) is None and store.registry_schema_by_fingerprint("nope") is None
    assert [(v.subject, v.version) for v in store.registry_versions_of_schema(orders.schema_id)] == [
        ("orders", 1), ("orders-copy", 1)
    ]
    assert [v.subject for v in store.registry_versions()] == ["common", "orders", "orders-copy"]


def test_soft_deleted_versions_stay_listed_and_numbers_go_on(store: MetadataStore) -> None:
    v1 = store.registry_add_version("s", "PROTOBUF", "a", [], "fp-a", None)
    store.registry_delete_versions("s", [1], permanent=False)
    assert store.registry_versions("s") == [SubjectVersion("s", 1, v1.schema_id, deleted=True)]
    # The subject has no live version now; the next one is numbered past the soft-deleted one.
    v2 = store.registry_add_version("s", "PROTOBUF", "b", [], "fp-b", None)
    assert v2.version == 2
    assert store.registry_versions_of_schema(v1.schema_id) == [SubjectVersion("s", 1, v1.schema_id, deleted=True)]


def test_compatibility_levels_global_and_per_subject_survive_reopen(open_same_store: OpenStore) -> None:
    first = open_same_store()
    assert first.registry_compatibility(None) is None and first.registry_compatibility("s") is None
    first.registry_set_compatibility(None, "FULL")
    first.registry_set_compatibility("s", "NONE")
    first.registry_set_compatibility("t", "BACKWARD")
    first.registry_set_compatibility("t", None)  # removed: falls back to the global one (the service's rule)
    first.close()
    store = open_same_store()
    assert store.registry_compatibility(None) == "FULL"
    assert store.registry_compatibility("s") == "NONE"
    assert store.registry_compatibility("t") is None
