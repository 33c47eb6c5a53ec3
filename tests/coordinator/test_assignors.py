"""The KIP-848 server-side assignors as functions: every subscribed partition to exactly one subscriber, balance where
subscriptions allow, and `uniform`'s stickiness (a join or a leave moves only the share that must move)."""

from __future__ import annotations

import uuid

from icelog.coordinator.assignors import MemberSubscription, range_, uniform
from icelog.coordinator.consumer_model import Assignment, TopicMetadata, partitions_of

A, B = uuid.UUID(int=1), uuid.UUID(int=2)
TOPICS = {A: TopicMetadata(A, "a", 12), B: TopicMetadata(B, "b", 3)}


def counts(assignment: dict[str, Assignment]) -> dict[str, int]:
    return {member: len(partitions_of(parts)) for member, parts in assignment.items()}


def owners_are_unique(assignment: dict[str, Assignment]) -> bool:
    every = [tp for parts in assignment.values() for tp in partitions_of(parts)]
    return len(every) == len(set(every))


def test_uniform_balances_and_a_join_or_leave_moves_only_what_it_must() -> None:
    subscribed = MemberSubscription(frozenset({A}))
    two = uniform({"m1": subscribed, "m2": subscribed}, {A: TOPICS[A]}, {})
    assert counts(two) == {"m1": 6, "m2": 6} and owners_are_unique(two)
    three = uniform({"m1": subscribed, "m2": subscribed, "m3": subscribed}, {A: TOPICS[A]}, two)
    assert counts(three) == {"m1": 4, "m2": 4, "m3": 4} and owners_are_unique(three)
    for member in ("m1", "m2"):
        assert partitions_of(three[member]) <= partitions_of(two[member])
    after_leave = uniform({"m1": subscribed, "m3": subscribed}, {A: TOPICS[A]}, three)
    assert counts(after_leave) == {"m1": 6, "m3": 6}
    for member in ("m1", "m3"):
        assert partitions_of(after_leave[member]) >= partitions_of(three[member])


def test_uniform_with_different_subscriptions_gives_each_topic_to_its_subscribers_only() -> None:
    members = {"both": MemberSubscription(frozenset({A, B})), "a-only": MemberSubscription(frozenset({A}))}
    out = uniform(members, TOPICS, {})
    assert owners_are_unique(out)
    assert B not in out["a-only"]
    assert sum(counts(out).values()) == 15 and abs(counts(out)["both"] - counts(out)["a-only"]) <= 1


def test_uniform_drops_partitions_that_are_gone_and_takes_new_ones() -> None:
    subscribed = MemberSubscription(frozenset({A}))
    before = uniform({"m1": subscribed}, {A: TOPICS[A]}, {})
    shrunk = uniform({"m1": subscribed}, {A: TopicMetadata(A, "a", 4)}, before)
    assert shrunk == {"m1": {A: frozenset(range(4))}}
    grown = uniform({"m1": subscribed, "m2": subscribed}, {A: TopicMetadata(A, "a", 16)}, shrunk)
    assert counts(grown) == {"m1": 8, "m2": 8} and partitions_of(grown["m1"]) >= partitions_of(shrunk["m1"])


def test_range_gives_contiguous_ranges_in_instance_then_member_order() -> None:
    members = {"z": MemberSubscription(frozenset({A, B}), "i1"), "a": MemberSubscription(frozenset({A, B}), "i2")}
    out = range_(members, TOPICS, {})
    assert out == {"z": {A: frozenset(range(6)), B: frozenset({0, 1})},
                   "a": {A: frozenset(range(6, 12)), B: frozenset({2})}}
