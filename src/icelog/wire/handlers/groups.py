"""Consumer-group APIs: FindCoordinator, JoinGroup, SyncGroup, Heartbeat, LeaveGroup, OffsetCommit,
OffsetFetch, DescribeGroups, ListGroups, DeleteGroups, OffsetDelete.

A broker alone coordinates every group. In a cluster FindCoordinator names the broker that leads the group's
coordinator shard (the cluster's view), and every group API asked of another broker answers NOT_COORDINATOR, as
Kafka's coordinator does (the client finds the coordinator again), or COORDINATOR_LOAD_IN_PROGRESS from the broker the
view names until it has taken the shard (`not_served`); ListGroups lists this broker's groups, as Kafka's per-broker
ListGroups."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from kafka.protocol.admin.groups import (
    DeleteGroupsResponse,
    DescribeGroupsResponse,
    ListGroupsResponse,
)
from kafka.protocol.api_key import ApiKey
from kafka.protocol.consumer.group import (
    HeartbeatResponse,
    JoinGroupResponse,
    LeaveGroupResponse,
    OffsetCommitResponse,
    OffsetDeleteResponse,
    OffsetFetchResponse,
    SyncGroupResponse,
)
from kafka.protocol.metadata.find_coordinator import FindCoordinatorResponse

from icelog.coordinator.groups import GroupCoordinator
from icelog.errors import ErrorCode
from icelog.meta.store import CommittedOffset
from icelog.security.acl import ACLOperation, ACLResourceType
from icelog.wire.authz import on_cluster
from icelog.wire.context import RequestContext, handles
from icelog.wire.handlers.metadata import live_brokers

if TYPE_CHECKING:
    from kafka.protocol.api_message import ApiMessage

COORDINATOR_GROUP, COORDINATOR_TRANSACTION = 0, 1


def coordinator(ctx: RequestContext) -> GroupCoordinator:
    assert ctx.broker.groups is not None, "the broker starts a group coordinator"
    return ctx.broker.groups


def not_served(ctx: RequestContext, group_id: str) -> ErrorCode:
    """NONE when this broker coordinates the group; else what Kafka's group coordinator answers for a group whose
    shard it does not serve: COORDINATOR_LOAD_IN_PROGRESS when this broker's own view names it the coordinator (its
    FindCoordinator does) but it has not taken and loaded the shard yet (it claims it at its next review, as a Kafka
    broker just elected leader of a __consumer_offsets partition answers while it loads it), NOT_COORDINATOR when
    another broker is the coordinator. The client retries the first at this broker and looks the coordinator up
    again after the second; librdkafka's admin client even crashes on a NOT_COORDINATOR OffsetFetch answer (its
    OffsetFetch handler asks a consumer group it does not have to look the coordinator up: librdkafka issue 5040),
    so the broker FindCoordinator names must not answer it for its own group."""
    if coordinator(ctx).serves(group_id):
        return ErrorCode.NONE
    cluster = ctx.broker.cluster
    if cluster is not None and cluster.view.group_coordinator(group_id) == ctx.broker.settings.node_id:
        return ErrorCode.COORDINATOR_LOAD_IN_PROGRESS
    return ErrorCode.NOT_COORDINATOR


def _may(ctx: RequestContext, operation: ACLOperation, group_id: str) -> bool:
    return ctx.authorize(operation, ACLResourceType.GROUP, group_id)


def _may_topic(ctx: RequestContext, operation: ACLOperation, topic: str) -> bool:
    return ctx.authorize(operation, ACLResourceType.TOPIC, topic)


def _host(ctx: RequestContext) -> str:
    return "/" + ctx.peer.rpartition(":")[0]


@handles(ApiKey.FindCoordinator)
async def find_coordinator(ctx: RequestContext, request: ApiMessage) -> ApiMessage:
    broker = ctx.broker
    error = ErrorCode.NONE
    key_type = request.key_type if ctx.api_version >= 1 else COORDINATOR_GROUP
    if key_type not in (COORDINATOR_GROUP, COORDINATOR_TRANSACTION):
        error = ErrorCode.INVALID_REQUEST
    elif key_type == COORDINATOR_GROUP and not _may(ctx, ACLOperation.DESCRIBE, request.key):
        error = ErrorCode.GROUP_AUTHORIZATION_FAILED
    elif key_type == COORDINATOR_TRANSACTION and not ctx.authorize(
        ACLOperation.DESCRIBE, ACLResourceType.TRANSACTIONAL_ID, request.key
    ):
        error = ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED
    node, host, port = broker.settings.node_id, ctx.connection.advertised[0], ctx.connection.advertised[1]
    if not error and broker.cluster is not None:
        view = broker.cluster.view
        node = view.group_coordinator(request.key) if key_type == COORDINATOR_GROUP else view.txn_coordinator(
            request.key)
        endpoint = next(((h, p) for n, h, p, _ in live_brokers(ctx) if n == node), None)
        if endpoint is None:  # no broker alive, or the coordinator has no endpoint on this listener
            error = ErrorCode.COORDINATOR_NOT_AVAILABLE
        else:
            host, port = endpoint
    if error:
        node, host, port = -1, "", -1
    return FindCoordinatorResponse(
        throttle_time_ms=0,
        error_code=int(error),
        error_message=None if error != ErrorCode.INVALID_REQUEST else "unknown key type",
        node_id=node,
        host=host,
        port=port,
    )


@handles(ApiKey.JoinGroup)
async def join_group(ctx: RequestContext, request: ApiMessage) -> ApiMessage:
    v = ctx.api_version
    if not _may(ctx, ACLOperation.READ, request.group_id):
        return JoinGroupResponse(
            throttle_time_ms=0, error_code=int(ErrorCode.GROUP_AUTHORIZATION_FAILED), generation_id=-1,
            protocol_type=None, protocol_name=None if v >= 7 else "", leader="", skip_assignment=False,
            member_id="", members=[],
        )
    if away := not_served(ctx, request.group_id):
        return JoinGroupResponse(
            throttle_time_ms=0, error_code=int(away), generation_id=-1,
            protocol_type=None, protocol_name=None if v >= 7 else "", leader="", skip_assignment=False,
            member_id=request.member_id, members=[],
        )
    result = await coordinator(ctx).join(
        request.group_id,
        request.member_id,
        request.group_instance_id if v >= 5 else None,
        ctx.client_id or "",
        _host(ctx),
        request.session_timeout_ms,
        request.rebalance_timeout_ms if v >= 1 else -1,
        request.protocol_type,
        [(p.name, bytes(p.metadata)) for p in request.protocols],
        require_known_member=v >= 4,
    )
    members = [
        JoinGroupResponse.JoinGroupResponseMember(member_id=m, group_instance_id=i, metadata=meta)
        for m, i, meta in result.members
    ]
    return JoinGroupResponse(
        throttle_time_ms=0,
        error_code=int(result.error),
        generation_id=result.generation,
        protocol_type=result.protocol_type,
        protocol_name=result.protocol_name if v >= 7 else (result.protocol_name or ""),
        leader=result.leader,
        skip_assignment=False,
        member_id=result.member_id,
        members=members,
    )


@handles(ApiKey.SyncGroup)
async def sync_group(ctx: RequestContext, request: ApiMessage) -> ApiMessage:
    v = ctx.api_version
    if not _may(ctx, ACLOperation.READ, request.group_id):
        return SyncGroupResponse(
            throttle_time_ms=0, error_code=int(ErrorCode.GROUP_AUTHORIZATION_FAILED), protocol_type=None,
            protocol_name=None, assignment=b"",
        )
    if away := not_served(ctx, request.group_id):
        return SyncGroupResponse(
            throttle_time_ms=0, error_code=int(away), protocol_type=None, protocol_name=None,
            assignment=b"",
        )
    result = await coordinator(ctx).sync(
        request.group_id,
        request.generation_id,
        request.member_id,
        request.group_instance_id if v >= 3 else None,
        request.protocol_type if v >= 5 else None,
        request.protocol_name if v >= 5 else None,
        {a.member_id: bytes(a.assignment) for a in request.assignments},
    )
    return SyncGroupResponse(
        throttle_time_ms=0,
        error_code=int(result.error),
        protocol_type=result.protocol_type,
        protocol_name=result.protocol_name,
        assignment=result.assignment,
    )


@handles(ApiKey.Heartbeat)
async def heartbeat(ctx: RequestContext, request: ApiMessage) -> ApiMessage:
    if not _may(ctx, ACLOperation.READ, request.group_id):
        return HeartbeatResponse(throttle_time_ms=0, error_code=int(ErrorCode.GROUP_AUTHORIZATION_FAILED))
    if away := not_served(ctx, request.group_id):
        return HeartbeatResponse(throttle_time_ms=0, error_code=int(away))
    error = coordinator(ctx).heartbeat(
        request.group_id,
        request.generation_id,
        request.member_id,
        request.group_instance_id if ctx.api_version >= 3 else None,
    )
    return HeartbeatResponse(throttle_time_ms=0, error_code=int(error))


@handles(ApiKey.LeaveGroup)
async def leave_group(ctx: RequestContext, request: ApiMessage) -> ApiMessage:
    if not _may(ctx, ACLOperation.READ, request.group_id):
        return LeaveGroupResponse(
            throttle_time_ms=0, error_code=int(ErrorCode.GROUP_AUTHORIZATION_FAILED), members=[]
        )
    if away := not_served(ctx, request.group_id):
        return LeaveGroupResponse(throttle_time_ms=0, error_code=int(away), members=[])
    if ctx.api_version < 3:
        (error,) = coordinator(ctx).leave(request.group_id, [(request.member_id, None)])
        return LeaveGroupResponse(throttle_time_ms=0, error_code=int(error), members=[])
    pairs = [(m.member_id, m.group_instance_id) for m in request.members]
    errors = coordinator(ctx).leave(request.group_id, pairs)
    members = [
        LeaveGroupResponse.MemberResponse(member_id=m, group_instance_id=i, error_code=int(e))
        for (m, i), e in zip(pairs, errors, strict=True)
    ]
    top = (
        ErrorCode.UNKNOWN_MEMBER_ID if coordinator(ctx).describe(request.group_id) is None else ErrorCode.NONE
    )
    return LeaveGroupResponse(throttle_time_ms=0, error_code=int(top), members=members)


@handles(ApiKey.OffsetCommit)
async def offset_commit(ctx: RequestContext, request: ApiMessage) -> ApiMessage:
    v = ctx.api_version
    groups = coordinator(ctx)
    logs = ctx.broker.logs
    if not _may(ctx, ACLOperation.READ, request.group_id):
        error = ErrorCode.GROUP_AUTHORIZATION_FAILED
    elif away := not_served(ctx, request.group_id):
        error = away
    else:
        error = groups.check_commit(
            request.group_id,
            request.generation_id_or_member_epoch,
            request.member_id,
            request.group_instance_id if v >= 7 else None,
            api_version=v,
        )
    now = int(time.time() * 1000)
    offsets = {}
    topics = []
    for topic in request.topics:
        partitions = []
        topic_denied = not error and not _may_topic(ctx, ACLOperation.READ, topic.name)
        for part in topic.partitions:
            code = ErrorCode.TOPIC_AUTHORIZATION_FAILED if topic_denied else error
            if not code:
                state = logs.get(topic.name)
                if state is None or not 0 <= part.partition_index < len(state.partitions):
                    code = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
                else:
                    offsets[(topic.name, part.partition_index)] = CommittedOffset(
                        part.committed_offset, part.committed_metadata or "", now
                    )
            partitions.append(
                OffsetCommitResponse.OffsetCommitResponseTopic.OffsetCommitResponsePartition(
                    partition_index=part.partition_index, error_code=int(code)
                )
            )
        topics.append(OffsetCommitResponse.OffsetCommitResponseTopic(name=topic.name, partitions=partitions))
    if not await groups.commit(request.group_id, offsets):  # the group moved to another broker meanwhile
        for topic in topics:
            for part in topic.partitions:
                if (topic.name, part.partition_index) in offsets:
                    part.error_code = int(ErrorCode.NOT_COORDINATOR)
    return OffsetCommitResponse(throttle_time_ms=0, topics=topics)


@handles(ApiKey.OffsetFetch)
async def offset_fetch(ctx: RequestContext, request: ApiMessage) -> ApiMessage:
    v = ctx.api_version
    wanted = None
    denied: list[tuple[str, int]] = []  # asked for by name, not DESCRIBE-able: TOPIC_AUTHORIZATION_FAILED
    if request.topics is not None:
        wanted = [(t.name, p) for t in request.topics for p in t.partition_indexes]
        denied = [(t, p) for t, p in wanted if not _may_topic(ctx, ACLOperation.DESCRIBE, t)]
        wanted = [(t, p) for t, p in wanted if (t, p) not in denied] if denied else wanted
    if not _may(ctx, ACLOperation.DESCRIBE, request.group_id):
        if v >= 2:
            return OffsetFetchResponse(
                throttle_time_ms=0, topics=[], error_code=int(ErrorCode.GROUP_AUTHORIZATION_FAILED)
            )
        found: dict[tuple[str, int], tuple[CommittedOffset | None, ErrorCode]] = {
            tp: (None, ErrorCode.GROUP_AUTHORIZATION_FAILED) for tp in wanted or []
        }
    elif away := not_served(ctx, request.group_id):
        if v >= 2:
            return OffsetFetchResponse(throttle_time_ms=0, topics=[], error_code=int(away))
        found = {tp: (None, away) for tp in wanted or []}
    else:
        found = coordinator(ctx).fetch(request.group_id, wanted, bool(v >= 7 and request.require_stable))
        if wanted is None:  # every committed offset of the group: those of topics not DESCRIBE-able left out
            found = {tp: r for tp, r in found.items() if _may_topic(ctx, ACLOperation.DESCRIBE, tp[0])}
    for tp in denied:
        found[tp] = (None, ErrorCode.TOPIC_AUTHORIZATION_FAILED)
    by_topic: dict[str, list[Any]] = {}
    for (topic, partition), (committed, error) in found.items():
        by_topic.setdefault(topic, []).append(
            OffsetFetchResponse.OffsetFetchResponseTopic.OffsetFetchResponsePartition(
                partition_index=partition,
                committed_offset=committed.offset if committed else -1,
                committed_leader_epoch=-1,
                metadata=committed.metadata if committed else "",
                error_code=int(error),
            )
        )
    topics = [OffsetFetchResponse.OffsetFetchResponseTopic(name=n, partitions=p) for n, p in by_topic.items()]
    return OffsetFetchResponse(throttle_time_ms=0, topics=topics, error_code=0)


@handles(ApiKey.DescribeGroups)
async def describe_groups(ctx: RequestContext, request: ApiMessage) -> ApiMessage:
    groups = coordinator(ctx)
    described = []
    for group_id in request.groups:
        group = groups.describe(group_id)
        if not _may(ctx, ACLOperation.DESCRIBE, group_id):
            described.append(
                DescribeGroupsResponse.DescribedGroup(
                    error_code=int(ErrorCode.GROUP_AUTHORIZATION_FAILED), error_message=None, group_id=group_id,
                    group_state="", protocol_type="", protocol_data="", members=[], authorized_operations=None,
                )
            )
            continue
        if away := not_served(ctx, group_id):
            described.append(
                DescribeGroupsResponse.DescribedGroup(
                    error_code=int(away), error_message=None, group_id=group_id,
                    group_state="", protocol_type="", protocol_data="", members=[], authorized_operations=None,
                )
            )
            continue
        if group is None or group.consumer is not None:
            # A KIP-848 group is Dead to DescribeGroups < 6, as in Kafka (ConsumerGroupDescribe describes it).
            described.append(
                DescribeGroupsResponse.DescribedGroup(
                    error_code=0,
                    error_message=None,
                    group_id=group_id,
                    group_state="Dead",
                    protocol_type="",
                    protocol_data="",
                    members=[],
                    authorized_operations=None,
                )
            )
            continue
        stable = group.state.value == "Stable"
        members = [
            DescribeGroupsResponse.DescribedGroup.DescribedGroupMember(
                member_id=m.member_id,
                group_instance_id=m.instance_id,
                client_id=m.client_id,
                client_host=m.client_host,
                member_metadata=m.metadata(group.protocol_name),
                member_assignment=m.assignment if stable else b"",
            )
            for m in group.members.values()
        ]
        described.append(
            DescribeGroupsResponse.DescribedGroup(
                error_code=0,
                error_message=None,
                group_id=group_id,
                group_state=group.state.value,
                protocol_type=group.protocol_type or "",
                protocol_data=group.protocol_name or "",
                members=members,
                authorized_operations=None,
            )
        )
    return DescribeGroupsResponse(throttle_time_ms=0, groups=described)


@handles(ApiKey.ListGroups)
async def list_groups(ctx: RequestContext, request: ApiMessage) -> ApiMessage:
    states = set(request.states_filter or []) if ctx.api_version >= 4 else set()
    # v5 (KIP-848): classic or consumer, matched without regard to case as Kafka's GroupType.parse does
    types = {t.lower() for t in request.types_filter or []} if ctx.api_version >= 5 else set()
    every = on_cluster(ctx, ACLOperation.DESCRIBE)  # else only the groups the principal may DESCRIBE
    listed = [
        ListGroupsResponse.ListedGroup(
            group_id=g.group_id, protocol_type=g.protocol_type or "consumer", group_state=g.state_name,
            group_type=g.group_type,
        )
        for g in coordinator(ctx).list_groups()
        if (not states or g.state_name in states) and (not types or g.group_type in types)
        and (every or _may(ctx, ACLOperation.DESCRIBE, g.group_id))
    ]
    return ListGroupsResponse(throttle_time_ms=0, error_code=0, groups=listed)


@handles(ApiKey.DeleteGroups)
async def delete_groups(ctx: RequestContext, request: ApiMessage) -> ApiMessage:
    results = [
        DeleteGroupsResponse.DeletableGroupResult(
            group_id=g,
            error_code=int(
                ErrorCode.GROUP_AUTHORIZATION_FAILED if not _may(ctx, ACLOperation.DELETE, g)
                else not_served(ctx, g) or coordinator(ctx).delete(g)
            ),
        )
        for g in request.groups_names
    ]
    return DeleteGroupsResponse(throttle_time_ms=0, results=results)


@handles(ApiKey.OffsetDelete)
async def offset_delete(ctx: RequestContext, request: ApiMessage) -> ApiMessage:
    if not _may(ctx, ACLOperation.DELETE, request.group_id):
        return OffsetDeleteResponse(
            error_code=int(ErrorCode.GROUP_AUTHORIZATION_FAILED), throttle_time_ms=0, topics=[]
        )
    if away := not_served(ctx, request.group_id):
        return OffsetDeleteResponse(error_code=int(away), throttle_time_ms=0, topics=[])
    readable = {t.name for t in request.topics if _may_topic(ctx, ACLOperation.READ, t.name)}
    wanted = [(t.name, p.partition_index) for t in request.topics if t.name in readable for p in t.partitions]
    error, results = coordinator(ctx).delete_offsets(request.group_id, wanted)
    results = dict(results)
    for t in request.topics:
        if t.name not in readable:
            for p in t.partitions:
                results[(t.name, p.partition_index)] = ErrorCode.TOPIC_AUTHORIZATION_FAILED
    by_topic: dict[str, list[Any]] = {}
    for (topic, partition), code in results.items():
        by_topic.setdefault(topic, []).append(
            OffsetDeleteResponse.OffsetDeleteResponseTopic.OffsetDeleteResponsePartition(
                partition_index=partition, error_code=int(code)
            )
        )
    topics = [
        OffsetDeleteResponse.OffsetDeleteResponseTopic(name=n, partitions=p) for n, p in by_topic.items()
    ]
    return OffsetDeleteResponse(error_code=int(error), throttle_time_ms=0, topics=topics)
