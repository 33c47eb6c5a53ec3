"""KIP-848 consumer groups spoken to over a raw connection: the exact epochs, assignments and Kafka error codes of
ConsumerGroupHeartbeat, ConsumerGroupDescribe, and OffsetCommit / ListGroups / DescribeGroups / JoinGroup when
the group is a consumer group. The real clients' view is tests/coordinator/test_consumer_groups.py."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kafka.protocol.admin.groups import (
    DescribeGroupsRequest,
    DescribeGroupsResponse,
    ListGroupsRequest,
    ListGroupsResponse,
)
from kafka.protocol.consumer.group import (
    JoinGroupRequest,
    JoinGroupResponse,
    OffsetCommitRequest,
    OffsetCommitResponse,
)
from kafka.protocol.metadata import ApiVersionsRequest, ApiVersionsResponse, MetadataRequest, MetadataResponse

from icelog.wire.messages import (
    ConsumerGroupDescribeRequest,
    ConsumerGroupDescribeResponse,
    ConsumerGroupHeartbeatRequest,
    ConsumerGroupHeartbeatResponse,
)
from tests.coordinator.test_groups import create_topic
from tests.support.broker import BrokerProcess
from tests.support.wire_client import RawClient

INCONSISTENT_GROUP_PROTOCOL, UNKNOWN_MEMBER_ID, INVALID_REQUEST, UNSUPPORTED_VERSION = 23, 25, 42, 35
GROUP_ID_NOT_FOUND, FENCED_MEMBER_EPOCH, UNRELEASED_INSTANCE_ID, UNSUPPORTED_ASSIGNOR = 69, 110, 111, 112
STALE_MEMBER_EPOCH, INVALID_REGULAR_EXPRESSION = 113, 128
HEARTBEAT_INTERVAL_MS, SESSION_TIMEOUT_MS = 400, 2500
SETTLING_INTERVAL_MS = 50  # a tenth of the interval, at least 50 ms: asked of members that join or move


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    proc = BrokerProcess(tmp_path_factory.mktemp("kip848-raw") / "data", env={
        "ICELOG_GROUP_CONSUMER_HEARTBEAT_INTERVAL_MS": str(HEARTBEAT_INTERVAL_MS),
        "ICELOG_GROUP_CONSUMER_SESSION_TIMEOUT_MS": str(SESSION_TIMEOUT_MS),
        "ICELOG_GROUP_INITIAL_REBALANCE_DELAY_MS": "0",
    }).start()
    yield proc
    proc.stop()


@pytest.fixture
def client(broker: BrokerProcess) -> Iterator[RawClient]:
    raw = RawClient(broker.bootstrap)
    yield raw
    raw.close()


def heartbeat(client: RawClient, group: str, member: str, epoch: int, *, names: list[str] | None = None,
              regex: str | None = None, owned: dict[uuid.UUID, list[int]] | None = None,
              assignor: str | None = None, instance: str | None = None, rebalance_timeout_ms: int = -1,
              version: int = 1) -> Any:
    request = ConsumerGroupHeartbeatRequest(
        group_id=group, member_id=member, member_epoch=epoch, instance_id=instance, rack_id=None,
        rebalance_timeout_ms=rebalance_timeout_ms, subscribed_topic_names=names, subscribed_topic_regex=regex,
        server_assignor=assignor,
        topic_partitions=None if owned is None else [
            ConsumerGroupHeartbeatRequest.TopicPartitions(topic_id=t, partitions=p) for t, p in owned.items()
        ],
    )
    return client.request(request, version, ConsumerGroupHeartbeatResponse)


def join(client: RawClient, group: str, member: str, names: list[str] | None = None, **kw: Any) -> Any:
    return heartbeat(client, group, member, 0, names=names, owned={}, rebalance_timeout_ms=kw.pop("timeout", 5000),
                     **kw)


def assigned(response: Any) -> dict[uuid.UUID, list[int]]:
    assert response.assignment is not None, response
    return {t.topic_id: sorted(t.partitions) for t in response.assignment.topic_partitions if t.partitions}


def topic_id(client: RawClient, topic: str) -> uuid.UUID:
    request = MetadataRequest(topics=[MetadataRequest.MetadataRequestTopic(name=topic, topic_id=uuid.UUID(int=0))],
                              allow_auto_topic_creation=False, include_topic_authorized_operations=False)
    (answer,) = client.request(request, 12, MetadataResponse).topics
    return answer.topic_id


def describe(client: RawClient, group: str) -> Any:
    request = ConsumerGroupDescribeRequest(group_ids=[group], include_authorized_operations=False)
    return client.request(request, 1, ConsumerGroupDescribeResponse).groups[0]


def commit(client: RawClient, group: str, member: str, epoch: int, topic: str, version: int = 9) -> int:
    request = OffsetCommitRequest(
        group_id=group, generation_id_or_member_epoch=epoch, member_id=member, group_instance_id=None,
        retention_time_ms=-1, topics=[OffsetCommitRequest.OffsetCommitRequestTopic(name=topic, partitions=[
            OffsetCommitRequest.OffsetCommitRequestTopic.OffsetCommitRequestPartition(
                partition_index=0, committed_offset=3, committed_leader_epoch=-1, committed_metadata="")])],
    )
    return int(client.request(request, version, OffsetCommitResponse).topics[0].partitions[0].error_code)


def test_api_versions_finalize_group_version_1(client: RawClient) -> None:
    """librdkafka and the Java client look for group.version in ApiVersions' finalized features."""
    answer = client.request(ApiVersionsRequest(client_software_name="t", client_software_version="1"), 3,
                            ApiVersionsResponse)
    assert {(f.name, f.max_version_level) for f in answer.finalized_features} == {("group.version", 1)}
    keys = {k.api_key: (k.min_version, k.max_version) for k in answer.api_keys}
    assert keys[68] == (0, 1) and keys[69] == (0, 1)


def test_revoke_before_assign_with_epochs(broker: BrokerProcess, client: RawClient) -> None:
    """A second member gets nothing its predecessor still owns: the first gives partitions up (heartbeats without
    them) before the second is handed them, and member epochs move with the group epoch."""
    topic, group = "kip848-raw-revoke", "raw-revoke"
    create_topic(broker.bootstrap, topic, 4)
    tid = topic_id(client, topic)
    first = join(client, group, "m1", [topic])
    assert (first.error_code, first.member_id, first.member_epoch) == (0, "m1", 1)
    assert first.heartbeat_interval_ms == SETTLING_INTERVAL_MS, "a member that moves heartbeats more often"
    assert assigned(first) == {tid: [0, 1, 2, 3]}

    second = join(client, group, "m2", [topic])
    assert (second.error_code, second.member_epoch) == (0, 2)
    assert assigned(second) == {}, "every partition is still m1's"
    revoking = heartbeat(client, group, "m1", 1, owned={tid: [0, 1, 2, 3]})
    assert revoking.member_epoch == 1, "m1 stays at its epoch until it has given partitions up"
    kept = assigned(revoking)[tid]
    assert len(kept) == 2
    given = sorted({0, 1, 2, 3} - set(kept))
    waiting = heartbeat(client, group, "m2", 2)
    assert waiting.assignment is None or assigned(waiting) == {}, "not before m1 has acknowledged"
    assert describe(client, group).group_state == "Reconciling"

    acknowledged = heartbeat(client, group, "m1", 1, owned={tid: kept})
    assert acknowledged.member_epoch == 2 and assigned(acknowledged) == {tid: kept}
    handed = heartbeat(client, group, "m2", 2, owned={})
    assert handed.member_epoch == 2 and assigned(handed) == {tid: given}

    described = describe(client, group)
    assert (described.error_code, described.group_state, described.group_epoch, described.assignment_epoch,
            described.assignor_name) == (0, "Stable", 2, 2, "uniform")
    assert {m.member_id: m.member_epoch for m in described.members} == {"m1": 2, "m2": 2}
    assert {m.member_id: [t.topic_name for t in m.assignment.topic_partitions] for m in described.members} == {
        "m1": [topic], "m2": [topic]}

    # A zombie: m1's old epoch with partitions it no longer has is fenced; a member that is not there is unknown.
    assert heartbeat(client, group, "m1", 1, owned={tid: [0, 1, 2, 3]}).error_code == FENCED_MEMBER_EPOCH
    assert heartbeat(client, group, "m1", 7).error_code == FENCED_MEMBER_EPOCH
    assert heartbeat(client, group, "nobody", 2).error_code == UNKNOWN_MEMBER_ID

    # Offsets: the member epoch is the generation; OffsetCommit v9+ (as Kafka asks of KIP-848 members).
    assert commit(client, group, "m1", 2, topic) == 0
    assert commit(client, group, "m1", 1, topic) == STALE_MEMBER_EPOCH
    assert commit(client, group, "m1", 2, topic, version=8) == UNSUPPORTED_VERSION
    assert commit(client, group, "nobody", 2, topic) == UNKNOWN_MEMBER_ID

    left = heartbeat(client, group, "m2", -1)
    assert (left.error_code, left.member_epoch) == (0, -1)
    back = heartbeat(client, group, "m1", 2, owned={tid: kept})
    assert back.member_epoch == 3 and assigned(back) == {tid: [0, 1, 2, 3]}, "m2's partitions, at once (free)"
    assert heartbeat(client, group, "m1", -1).error_code == 0


def test_heartbeat_interval_is_short_while_a_member_moves_and_configured_once_settled(broker: BrokerProcess,
                                                                                     client: RawClient) -> None:
    topic, group = "kip848-raw-interval", "raw-interval"
    create_topic(broker.bootstrap, topic, 2)
    joined = join(client, group, "m1", [topic])
    assert joined.heartbeat_interval_ms == SETTLING_INTERVAL_MS
    owned = assigned(joined)
    assert heartbeat(client, group, "m1", 1, owned=owned).heartbeat_interval_ms == SETTLING_INTERVAL_MS
    time.sleep(HEARTBEAT_INTERVAL_MS / 1000 + 0.1)
    assert heartbeat(client, group, "m1", 1).heartbeat_interval_ms == HEARTBEAT_INTERVAL_MS
    join(client, group, "m2", [topic])  # m1 must give a partition up: it is asked to come back soon
    assert heartbeat(client, group, "m1", 1).heartbeat_interval_ms == SETTLING_INTERVAL_MS
    for member in ("m1", "m2"):
        assert heartbeat(client, group, member, -1).error_code == 0


def test_request_errors(broker: BrokerProcess, client: RawClient) -> None:
    topic = "kip848-raw-errors"
    create_topic(broker.bootstrap, topic, 1)
    assert join(client, "raw-errors", "m1", [topic], assignor="sticky").error_code == UNSUPPORTED_ASSIGNOR
    assert "uniform, range" in join(client, "raw-errors", "m1", [topic], assignor="sticky").error_message
    assert join(client, "raw-errors", "m1", regex="(unclosed").error_code == INVALID_REGULAR_EXPRESSION
    assert join(client, "raw-errors", "", [topic]).error_code == INVALID_REQUEST  # v1: the member names itself
    assert heartbeat(client, "raw-errors", "m1", 0, names=[topic], owned={}).error_code == INVALID_REQUEST
    assert join(client, "raw-errors", "m1").error_code == INVALID_REQUEST  # neither names nor a regex
    assert join(client, "", "m1", [topic]).error_code == INVALID_REQUEST
    assert heartbeat(client, "raw-errors", "m1", 3).error_code == UNKNOWN_MEMBER_ID  # no such group (a restart)
    v0 = join(client, "raw-errors-v0", "", [topic], version=0)
    assert v0.error_code == 0 and v0.member_id, "v0: the coordinator names the member"
    assert heartbeat(client, "raw-errors-v0", v0.member_id, -1, version=0).error_code == 0


def test_range_assignor_and_static_member_replacement(broker: BrokerProcess, client: RawClient) -> None:
    """`range` gives contiguous ranges; a static member that leaves with epoch -2 keeps its partitions for its
    instance, whose next member id gets them back at once, while a second claim of a live instance is refused."""
    topic, group = "kip848-raw-range", "raw-range"
    create_topic(broker.bootstrap, topic, 4)
    tid = topic_id(client, topic)
    a = join(client, group, "a1", [topic], assignor="range", instance="a")
    b = join(client, group, "b1", [topic], assignor="range", instance="b")
    kept = assigned(heartbeat(client, group, "a1", a.member_epoch, owned=assigned(a)))
    heartbeat(client, group, "a1", a.member_epoch, owned=kept)
    b = heartbeat(client, group, "b1", b.member_epoch, owned={})
    assert assigned(b) == {tid: [2, 3]} and kept == {tid: [0, 1]}
    assert describe(client, group).assignor_name == "range"

    assert join(client, group, "b2", [topic], assignor="range", instance="b").error_code == UNRELEASED_INSTANCE_ID
    assert heartbeat(client, group, "b1", -2, instance="b").member_epoch == -2
    back = join(client, group, "b2", [topic], assignor="range", instance="b")
    assert back.error_code == 0 and assigned(back) == {tid: [2, 3]}
    members = {m.member_id: m.instance_id for m in describe(client, group).members}
    assert members == {"a1": "a", "b2": "b"}
    for member, instance in (("a1", "a"), ("b2", "b")):
        assert heartbeat(client, group, member, -1, instance=instance).error_code == 0


def test_session_timeout_removes_a_silent_member(broker: BrokerProcess, client: RawClient) -> None:
    topic, group = "kip848-raw-session", "raw-session"
    create_topic(broker.bootstrap, topic, 2)
    tid = topic_id(client, topic)
    join(client, group, "quiet", [topic])
    talker = join(client, group, "talker", [topic])
    deadline = time.monotonic() + SESSION_TIMEOUT_MS / 1000 * 4
    owned: dict[uuid.UUID, list[int]] = {}
    while assigned_or_none(talker) != {tid: [0, 1]}:
        assert time.monotonic() < deadline, "the silent member was not removed"
        time.sleep(HEARTBEAT_INTERVAL_MS / 1000)
        talker = heartbeat(client, group, "talker", talker.member_epoch, owned=owned)
        owned = assigned_or_none(talker) or owned
    assert [m.member_id for m in describe(client, group).members] == ["talker"]
    heartbeat(client, group, "talker", -1)


def assigned_or_none(response: Any) -> dict[uuid.UUID, list[int]] | None:
    return None if response.assignment is None else assigned(response)


def test_regex_subscription_takes_a_new_topic(broker: BrokerProcess, client: RawClient) -> None:
    create_topic(broker.bootstrap, "kip848-rx-a", 1)
    first = join(client, "raw-regex", "r1", regex="kip848-rx-.*")
    assert list(assigned(first).values()) == [[0]]
    create_topic(broker.bootstrap, "kip848-rx-b", 2)
    later = heartbeat(client, "raw-regex", "r1", first.member_epoch, owned=assigned(first))
    assert later.member_epoch == first.member_epoch + 1
    assert sorted(map(len, assigned(later).values())) == [1, 2]
    assert describe(client, "raw-regex").members[0].subscribed_topic_regex == "kip848-rx-.*"
    heartbeat(client, "raw-regex", "r1", -1)


def test_classic_and_consumer_groups_do_not_mix(broker: BrokerProcess, client: RawClient) -> None:
    """Kafka's answers: a classic JoinGroup into a live consumer group, INCONSISTENT_GROUP_PROTOCOL; a KIP-848
    heartbeat into a live classic group, GROUP_ID_NOT_FOUND; each kind listed with its type and described by its
    own API (DescribeGroups < 6 says Dead of a consumer group, ConsumerGroupDescribe GROUP_ID_NOT_FOUND of a
    classic one)."""
    topic = "kip848-raw-mix"
    create_topic(broker.bootstrap, topic, 1)
    join(client, "mix-consumer", "c1", [topic])
    protocol = JoinGroupRequest.JoinGroupRequestProtocol(name="range", metadata=b"\x00\x00\x00\x00\x00\x00")
    classic = JoinGroupRequest(group_id="mix-consumer", session_timeout_ms=6000, rebalance_timeout_ms=6000,
                               member_id="", group_instance_id="i", protocol_type="consumer", protocols=[protocol])
    assert client.request(classic, 5, JoinGroupResponse).error_code == INCONSISTENT_GROUP_PROTOCOL

    classic.group_id = "mix-classic"
    assert client.request(classic, 5, JoinGroupResponse).error_code == 0  # a static member: joins at once
    assert join(client, "mix-classic", "c2", [topic]).error_code == GROUP_ID_NOT_FOUND
    assert describe(client, "mix-classic").error_code == GROUP_ID_NOT_FOUND
    assert describe(client, "no-such-group").error_code == GROUP_ID_NOT_FOUND

    described = client.request(DescribeGroupsRequest(groups=["mix-consumer"], include_authorized_operations=False),
                               5, DescribeGroupsResponse).groups[0]
    assert (described.error_code, described.group_state) == (0, "Dead")

    def listed(types: list[str]) -> dict[str, tuple[str, str]]:
        answer = client.request(ListGroupsRequest(states_filter=[], types_filter=types), 5, ListGroupsResponse)
        return {g.group_id: (g.group_type, g.group_state) for g in answer.groups if g.group_id.startswith("mix-")}

    assert listed([]) == {"mix-consumer": ("consumer", "Stable"), "mix-classic": ("classic", "CompletingRebalance")}
    assert listed(["Consumer"]) == {"mix-consumer": ("consumer", "Stable")}
    assert listed(["classic"]) == {"mix-classic": ("classic", "CompletingRebalance")}
    heartbeat(client, "mix-consumer", "c1", -1)


@pytest.mark.crash
def test_members_keep_their_epochs_and_partitions_across_a_broker_restart(tmp_path: Path) -> None:
    """The group's members, epochs and assignments are in the store before a heartbeat is answered: after kill -9
    and a restart the members heartbeat on at their epochs with their partitions (Kafka reloads them from
    __consumer_offsets), rather than being answered UNKNOWN_MEMBER_ID and rejoining."""
    topic, group = "kip848-raw-restart", "raw-restart"
    proc = BrokerProcess(tmp_path / "data", env={"ICELOG_GROUP_INITIAL_REBALANCE_DELAY_MS": "0"}).start()
    try:
        create_topic(proc.bootstrap, topic, 4)
        client = RawClient(proc.bootstrap)
        tid = topic_id(client, topic)
        first = join(client, group, "m1", [topic])
        second = join(client, group, "m2", [topic])
        kept = assigned(heartbeat(client, group, "m1", first.member_epoch, owned={tid: [0, 1, 2, 3]}))[tid]
        assert heartbeat(client, group, "m1", first.member_epoch, owned={tid: kept}).member_epoch == 2
        given = assigned(heartbeat(client, group, "m2", second.member_epoch, owned={}))[tid]
        assert sorted(kept + given) == [0, 1, 2, 3]
        client.close()
        proc.kill()
        proc.start()

        client = RawClient(proc.bootstrap)
        for member, owned in (("m1", kept), ("m2", given)):
            again = heartbeat(client, group, member, 2, owned={tid: owned})
            assert (again.error_code, again.member_epoch) == (0, 2), (member, again)
            assert again.assignment is None or assigned(again) == {tid: owned}
        described = describe(client, group)
        assert (described.group_state, described.group_epoch) == ("Stable", 2)
        third = join(client, group, "m3", [topic])
        assert (third.error_code, third.member_epoch) == (0, 3), "the group epoch goes on from the stored one"
        client.close()
    finally:
        proc.stop()
