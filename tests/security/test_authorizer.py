"""The authorizer's rules (Kafka's AclAuthorizer) over a real SQLite metadata store."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from icelog.meta.security import AclEntry
from icelog.meta.sqlite import SqliteStore
from icelog.security.acl import (
    CLUSTER_NAME,
    AclFilter,
    ACLOperation,
    ACLPermissionType,
    ACLResourcePatternType,
    ACLResourceType,
    InvalidAclError,
)
from icelog.security.authorizer import Authorizer

TOPIC, GROUP, CLUSTER, TXN = (ACLResourceType.TOPIC, ACLResourceType.GROUP, ACLResourceType.CLUSTER,
                              ACLResourceType.TRANSACTIONAL_ID)
LITERAL, PREFIXED = ACLResourcePatternType.LITERAL, ACLResourcePatternType.PREFIXED
ALLOW, DENY = ACLPermissionType.ALLOW, ACLPermissionType.DENY
Op = ACLOperation
ALICE, BOB = "User:alice", "User:bob"


def acl(rtype: int, name: str, op: int, principal: str = ALICE, permission: int = ALLOW,
        pattern: int = LITERAL, host: str = "*") -> AclEntry:
    return AclEntry(rtype, name, pattern, principal, host, op, permission)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def store(tmp_path: Path) -> Iterator[SqliteStore]:
    s = SqliteStore(tmp_path / "meta.db")
    yield s
    s.close()


def make(store: SqliteStore, *entries: AclEntry, supers: tuple[str, ...] = (), open_: bool = False,
         clock: Clock | None = None) -> Authorizer:
    if entries:
        store.add_acls(entries)
    return Authorizer(store, supers, open_, clock=clock or Clock())


def test_literal_allow_and_no_acl_means_denied_unless_open(store: SqliteStore) -> None:
    auth = make(store, acl(TOPIC, "orders", Op.READ))
    assert auth.authorize(ALICE, "10.0.0.1", Op.READ, TOPIC, "orders")
    assert not auth.authorize(BOB, "10.0.0.1", Op.READ, TOPIC, "orders")  # bindings exist, none for bob
    assert not auth.authorize(ALICE, "10.0.0.1", Op.WRITE, TOPIC, "orders")
    assert not auth.authorize(ALICE, "10.0.0.1", Op.READ, TOPIC, "other")  # no binding at all: closed
    assert Authorizer(store, (), True).authorize(ALICE, "h", Op.READ, TOPIC, "other")  # ... unless open
    assert not Authorizer(store, (), True).authorize(BOB, "h", Op.READ, TOPIC, "orders")  # bound: ACLs rule


def test_wildcard_name_principal_and_prefixed(store: SqliteStore) -> None:
    auth = make(
        store,
        acl(TOPIC, "*", Op.DESCRIBE, principal="User:*"),
        acl(TOPIC, "pay.", Op.WRITE, pattern=PREFIXED),
    )
    assert auth.authorize(BOB, "h", Op.DESCRIBE, TOPIC, "anything")
    assert auth.authorize(ALICE, "h", Op.WRITE, TOPIC, "pay.eu")
    assert not auth.authorize(ALICE, "h", Op.WRITE, TOPIC, "pa")
    assert not auth.authorize(BOB, "h", Op.WRITE, TOPIC, "pay.eu")
    assert not auth.authorize(ALICE, "h", Op.DESCRIBE, GROUP, "pay.eu")  # another resource type


def test_host_must_match(store: SqliteStore) -> None:
    auth = make(store, acl(TOPIC, "t", Op.READ, host="10.0.0.1"))
    assert auth.authorize(ALICE, "10.0.0.1", Op.READ, TOPIC, "t")
    assert not auth.authorize(ALICE, "10.0.0.2", Op.READ, TOPIC, "t")


def test_deny_wins_and_all_matches_every_operation(store: SqliteStore) -> None:
    auth = make(
        store,
        acl(TOPIC, "t", Op.ALL),
        acl(TOPIC, "t", Op.WRITE, permission=DENY),
        acl(TOPIC, "secret", Op.ALL, principal="User:*", permission=DENY, pattern=PREFIXED),
        acl(TOPIC, "secret-x", Op.READ),
    )
    assert auth.authorize(ALICE, "h", Op.READ, TOPIC, "t")
    assert auth.authorize(ALICE, "h", Op.ALTER_CONFIGS, TOPIC, "t")
    assert not auth.authorize(ALICE, "h", Op.WRITE, TOPIC, "t")
    assert not auth.authorize(ALICE, "h", Op.READ, TOPIC, "secret-x")


def test_implied_describe(store: SqliteStore) -> None:
    auth = make(
        store,
        acl(TOPIC, "r", Op.READ), acl(TOPIC, "w", Op.WRITE), acl(TOPIC, "d", Op.DELETE), acl(TOPIC, "a", Op.ALTER),
        acl(TOPIC, "c", Op.ALTER_CONFIGS), acl(TOPIC, "x", Op.CREATE),
    )
    for name in "rwda":
        assert auth.authorize(ALICE, "h", Op.DESCRIBE, TOPIC, name)
    assert auth.authorize(ALICE, "h", Op.DESCRIBE_CONFIGS, TOPIC, "c")
    assert not auth.authorize(ALICE, "h", Op.DESCRIBE, TOPIC, "c")
    assert not auth.authorize(ALICE, "h", Op.DESCRIBE, TOPIC, "x")
    assert not auth.authorize(ALICE, "h", Op.READ, TOPIC, "w")  # implication goes one way
    # a DENY of DESCRIBE is not lifted by an ALLOW of READ
    store.add_acls([acl(TOPIC, "r", Op.DESCRIBE, permission=DENY)])
    assert not make(store).authorize(ALICE, "h", Op.DESCRIBE, TOPIC, "r")


def test_super_users_may_do_anything(store: SqliteStore) -> None:
    auth = make(store, acl(TOPIC, "t", Op.ALL, principal="User:root", permission=DENY), supers=("User:root",))
    assert auth.authorize("User:root", "h", Op.WRITE, TOPIC, "t")
    assert auth.authorize("User:root", "h", Op.ALTER, CLUSTER, CLUSTER_NAME)


def test_changes_from_another_process_apply_after_a_second(store: SqliteStore, tmp_path: Path) -> None:
    clock = Clock()
    auth = make(store, acl(TOPIC, "t", Op.READ), clock=clock)
    other = SqliteStore(tmp_path / "meta.db")  # as `icelog acl add` would, from another process
    try:
        other.add_acls([acl(TOPIC, "t", Op.READ, principal=BOB)])
        assert not auth.authorize(BOB, "h", Op.READ, TOPIC, "t")  # not checked yet: still the cached copy
        clock.now += 1.0
        assert auth.authorize(BOB, "h", Op.READ, TOPIC, "t")
        other.delete_acls([acl(TOPIC, "t", Op.READ, principal=BOB)])
        clock.now += 1.0
        assert not auth.authorize(BOB, "h", Op.READ, TOPIC, "t")
    finally:
        other.close()


def test_authorize_reads_the_store_at_most_once_a_second(store: SqliteStore, monkeypatch: pytest.MonkeyPatch) -> None:
    clock = Clock()
    auth = make(store, acl(TOPIC, "t", Op.READ), clock=clock)
    reads: list[int] = []
    real = store.security_generation

    def counted() -> int:
        reads.append(1)
        return real()

    monkeypatch.setattr(store, "security_generation", counted)
    for _ in range(1000):
        auth.authorize(ALICE, "h", Op.READ, TOPIC, "t")
    assert reads == []
    clock.now += 1.5
    for _ in range(1000):
        auth.authorize(ALICE, "h", Op.READ, TOPIC, "t")
    assert reads == [1]


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        (acl(ACLResourceType.ANY, "t", Op.READ), "Invalid resourceType ANY"),
        (acl(ACLResourceType.UNKNOWN, "t", Op.READ), "Invalid resourceType UNKNOWN"),
        (acl(TOPIC, "t", Op.READ, pattern=ACLResourcePatternType.MATCH), "Invalid patternType MATCH"),
        (acl(TOPIC, "t", Op.ANY), "Invalid operation ANY"),
        (acl(TOPIC, "t", Op.READ, permission=ACLPermissionType.ANY), "Invalid permissionType ANY"),
        (acl(TOPIC, "", Op.READ), "Resource name should not be empty"),
        (acl(TOPIC, "t", Op.READ, principal="alice"), "Could not parse principal"),
        (acl(TOPIC, "t", Op.READ, principal="Group:x"), "is not User:NAME"),
        (acl(TOPIC, "t", Op.READ, principal="User:"), "is not User:NAME"),
        (acl(TOPIC, "*", Op.READ, pattern=PREFIXED), "PREFIXED pattern may not be '*'"),
        (acl(CLUSTER, "c", Op.ALTER), "The only valid name for the CLUSTER resource is kafka-cluster"),
        (acl(GROUP, "g", Op.WRITE), "Invalid operation WRITE for resource type GROUP"),
        (acl(TXN, "t", Op.READ), "Invalid operation READ for resource type TRANSACTIONAL_ID"),
    ],
)
def test_create_refuses_what_kafka_refuses(store: SqliteStore, entry: AclEntry, message: str) -> None:
    auth = make(store)
    with pytest.raises(InvalidAclError, match=message):
        auth.create([acl(TOPIC, "fine", Op.READ), entry])
    assert store.acls() == []  # nothing stored when one is refused


def test_filters_describe_and_delete(store: SqliteStore) -> None:
    entries = [
        acl(TOPIC, "orders", Op.READ),
        acl(TOPIC, "*", Op.DESCRIBE, principal=BOB),
        acl(TOPIC, "ord", Op.WRITE, pattern=PREFIXED),
        acl(TOPIC, "other", Op.READ, permission=DENY, host="10.0.0.9"),
        acl(GROUP, "orders", Op.READ),
    ]
    auth = make(store)
    auth.create(entries)
    assert auth.describe(AclFilter()) == sorted(entries, key=lambda e: (e.resource_type, e.resource_name,
                                                                         e.pattern_type, e.principal))
    match = AclFilter(TOPIC, "orders", ACLResourcePatternType.MATCH)
    assert set(auth.describe(match)) == set(entries[:3])
    assert auth.describe(AclFilter(TOPIC, "orders", ACLResourcePatternType.ANY)) == [entries[0]]
    assert auth.describe(AclFilter(TOPIC, "ord", PREFIXED)) == [entries[2]]
    assert auth.describe(AclFilter(TOPIC, "ord", LITERAL)) == []
    assert auth.describe(AclFilter(ACLResourceType.ANY, "orders", LITERAL)) == [entries[0], entries[4]]
    assert auth.describe(AclFilter(principal=BOB)) == [entries[1]]
    assert auth.describe(AclFilter(host="10.0.0.9")) == [entries[3]]
    assert auth.describe(AclFilter(operation=Op.WRITE)) == [entries[2]]
    assert auth.describe(AclFilter(permission=DENY)) == [entries[3]]
    assert AclFilter(ACLResourceType.ANY, None, ACLResourcePatternType.MATCH).matches(entries[2])

    removed = auth.delete(AclFilter(TOPIC, "orders", ACLResourcePatternType.MATCH, principal=ALICE))
    assert set(removed) == {entries[0], entries[2]}
    assert set(store.acls()) == {entries[1], entries[3], entries[4]}
    assert not auth.authorize(ALICE, "h", Op.READ, TOPIC, "orders")
    with pytest.raises(InvalidAclError, match="Invalid operation UNKNOWN in filter"):
        auth.delete(AclFilter(operation=Op.UNKNOWN))


def test_authorize_any_is_kafkas_authorize_by_resource_type(store: SqliteStore) -> None:
    auth = make(store, acl(TOPIC, "a", Op.WRITE), acl(TOPIC, "a", Op.WRITE, permission=DENY),
                acl(TOPIC, "b", Op.WRITE, principal=BOB, pattern=PREFIXED))
    assert not auth.authorize_any(ALICE, "h", Op.WRITE, TOPIC)  # her only ALLOW is denied
    assert auth.authorize_any(BOB, "h", Op.WRITE, TOPIC)
    store.add_acls([acl(TOPIC, "b", Op.ALL, principal=BOB, permission=DENY, pattern=PREFIXED)])
    assert not make(store).authorize_any(BOB, "h", Op.WRITE, TOPIC)
    assert make(store, supers=(ALICE,)).authorize_any(ALICE, "h", Op.WRITE, TOPIC)
    assert make(store, open_=True).authorize_any(ALICE, "h", Op.WRITE, GROUP)  # nothing bound: open
