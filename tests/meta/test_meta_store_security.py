"""Metadata-store behaviour of the security slice (SecurityStore), once per backend: users' SCRAM credentials and
ACL bindings survive a reopen, replace and delete as the authorizer and `icelog user` / `icelog acl` expect, and the
security generation moves with every change (another process's broker notices changes by it)."""

from __future__ import annotations

from icelog.meta.security import AclEntry, ScramCredential
from icelog.meta.store import MetadataStore
from tests.meta.conftest import OpenStore


def _credential(user: str, mechanism: str, key: bytes) -> ScramCredential:
    return ScramCredential(user, mechanism, b"salt-salt-salt", key, key[::-1], 4096)


def test_credentials_replace_delete_and_survive_a_reopen(open_same_store: OpenStore) -> None:
    store = open_same_store()
    start = store.security_generation()
    store.save_scram_credential(_credential("alice", "SCRAM-SHA-256", b"k1"))
    store.save_scram_credential(_credential("alice", "SCRAM-SHA-512", b"k2"))
    store.save_scram_credential(_credential("alice", "SCRAM-SHA-512", b"k3"))  # a new password replaces
    store.save_scram_credential(_credential("bob", "SCRAM-SHA-512", b"k4"))
    assert store.security_generation() > start
    again = open_same_store()
    assert [(c.user, c.mechanism, c.stored_key) for c in again.scram_credentials()] == [
        ("alice", "SCRAM-SHA-256", b"k1"), ("alice", "SCRAM-SHA-512", b"k3"), ("bob", "SCRAM-SHA-512", b"k4"),
    ]
    assert [c.mechanism for c in again.scram_credentials("alice")] == ["SCRAM-SHA-256", "SCRAM-SHA-512"]
    generation = again.security_generation()
    assert again.delete_scram_credentials("alice", "SCRAM-SHA-256") == 1
    assert again.delete_scram_credentials("alice") == 1
    assert again.delete_scram_credentials("nobody") == 0
    assert [c.user for c in again.scram_credentials()] == ["bob"]
    assert again.security_generation() > generation


def test_acls_are_a_set(store: MetadataStore) -> None:
    read = AclEntry(2, "orders", 3, "User:alice", "*", 3, 3)
    deny = AclEntry(2, "orders", 3, "User:bob", "*", 4, 2)
    prefixed = AclEntry(3, "orders-", 4, "User:alice", "*", 3, 3)
    store.add_acls([read, deny])
    generation = store.security_generation()
    store.add_acls([read, prefixed])  # one already present stays once
    assert sorted(store.acls(), key=repr) == sorted([read, deny, prefixed], key=repr)
    store.delete_acls([deny, AclEntry(2, "absent", 3, "User:x", "*", 3, 3)])
    assert sorted(store.acls(), key=repr) == sorted([read, prefixed], key=repr)
    assert store.security_generation() > generation
