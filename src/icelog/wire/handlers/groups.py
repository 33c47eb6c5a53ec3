"""Consumer-group APIs: FindCoordinator, JoinGroup, SyncGroup, Heartbeat, LeaveGroup, OffsetCommit,
OffsetFetch, DescribeGroups, ListGroups, DeleteGroups, OffsetDelete (this broker coordinates everything)."""

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
from icelog.wire.context import RequestContext, handles

if TYPE_CHECKING:
    from kafka.protocol.api_message import ApiMessage

COORDINATOR_GROUP, COORDINATOR_TRANSACTION = 0, 1


def coordinator(ctx: RequestContext) -> GroupCoordinator:
    assert ctx.broker.groups is not None, "the broker starts a group coordinator"
    return ctx.broker.groups


def _host(ctx: RequestContext) -> str:
    return "/" + ctx.peer.rpartition(":")[0]


@handles(ApiKey.FindCoordinator)
async def find_coordinator(ctx: RequestContext, request: ApiMessage) -> ApiMessage:
    broker = ctx.broker
    error = ErrorCode.NONE
    if ctx.api_version >= 1 and request.key_type not in (COORDINATOR_GROUP, COORDINATOR_TRANSACTION):
        error = ErrorCode.INVALID_REQUEST
    return FindCoordinatorResponse(
        throttle_time_ms=0,
        error_code=int(error),
        error_message=None if not error else "unknown key type",
        node_id=broker.settings.node_id,
        host=ctx.connection.advertised[0],
        port=ctx.connection.advertised[1],
    )


@handles(ApiKey.JoinGroup)
async def join_group(ctx: RequestContext, request: ApiMessage) -> ApiMessage:
    v = ctx.api_version
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
    error = coordinator(ctx).heartbeat(
        request.group_id,
        request.generation_id,
        request.member_id,
        request.group_instance_id if ctx.api_version >= 3 else None,
    )
    return HeartbeatResponse(throttle_time_ms=0, error_code=int(error))


@handles(ApiKey.LeaveGroup)
async def leave_group(ctx: RequestContext, request: ApiMessage) -> ApiMessage:
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
    error = groups.check_commit(
        request.group_id,
        request.generation_id_or_member_epoch,
        request.member_id,
        request.group_instance_id if v >= 7 else None,
    )
    now = int(time.time() * 1000)
    offsets = {}
    topics = []
    for topic in request.topics:
        partitions = []
        for part in topic.partitions:
            code = error
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
    await groups.commit(request.group_id, offsets)
    return OffsetCommitResponse(throttle_time_ms=0, topics=topics)


@handles(ApiKey.OffsetFetch)
async def offset_fetch(ctx: RequestContext, request: ApiMessage) -> ApiMessage:
    v = ctx.api_version
    wanted = None
    if request.topics is not None:
        wanted = [(t.name, p) for t in request.topics for p in t.partition_indexes]
    found = coordinator(ctx).fetch(request.group_id, wanted, bool(v >= 7 and request.require_stable))
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
        if group is None:
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
    listed = [
        ListGroupsResponse.ListedGroup(
            group_id=g.group_id, protocol_type=g.protocol_type or "consumer", group_state=g.state.value
        )
        for g in coordinator(ctx).list_groups()
        if not states or g.state.value in states
    ]
    return ListGroupsResponse(throttle_time_ms=0, error_code=0, groups=listed)


@handles(ApiKey.DeleteGroups)
async def delete_groups(ctx: RequestContext, request: ApiMessage) -> ApiMessage:
    results = [
        DeleteGroupsResponse.DeletableGroupResult(group_id=g, error_code=int(coordinator(ctx).delete(g)))
        for g in request.groups_names
    ]
    return DeleteGroupsResponse(throttle_time_ms=0, results=results)


@handles(ApiKey.OffsetDelete)
async def offset_delete(ctx: RequestContext, request: ApiMessage) -> ApiMessage:
    wanted = [(t.name, p.partition_index) for t in request.topics for p in t.partitions]
    error, results = coordinator(ctx).delete_offsets(request.group_id, wanted)
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
