"""KIP-848 consumer groups: ConsumerGroupHeartbeat and ConsumerGroupDescribe (the coordinator is
`coordinator/consumer_groups.py`; offsets go through OffsetCommit and OffsetFetch, as for classic groups)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from kafka.protocol.api_key import ApiKey

from icelog.coordinator.consumer_groups import HeartbeatRequest
from icelog.coordinator.consumer_model import Assignment, TopicMetadata
from icelog.errors import ErrorCode
from icelog.security.acl import ACLOperation, ACLResourceType
from icelog.wire.context import RequestContext, handles
from icelog.wire.handlers.groups import coordinator, not_served
from icelog.wire.messages import ConsumerGroupDescribeResponse, ConsumerGroupHeartbeatResponse

if TYPE_CHECKING:
    from kafka.protocol.api_message import ApiMessage

AUTHORIZED_OPERATIONS_OMITTED = -2147483648  # Kafka's "not computed"


@handles(ApiKey.ConsumerGroupHeartbeat)
async def consumer_group_heartbeat(ctx: RequestContext, request: ApiMessage) -> ApiMessage:
    groups = coordinator(ctx)
    if not ctx.authorize(ACLOperation.READ, ACLResourceType.GROUP, request.group_id):
        return _heartbeat_error(ErrorCode.GROUP_AUTHORIZATION_FAILED, None)
    if away := not_served(ctx, request.group_id):  # another broker of the cluster coordinates the group, or will
        return _heartbeat_error(away, None)
    names = request.subscribed_topic_names
    if names and any(not ctx.authorize(ACLOperation.DESCRIBE, ACLResourceType.TOPIC, n) for n in names):
        # Kafka refuses a subscription to a topic the member may not describe.
        return _heartbeat_error(ErrorCode.TOPIC_AUTHORIZATION_FAILED, "Unauthorized topics in the subscription.")
    owned = None
    if request.topic_partitions is not None:
        owned = [(t.topic_id, p) for t in request.topic_partitions for p in t.partitions]
    result = await groups.consumer_heartbeat(HeartbeatRequest(
        group_id=request.group_id,
        member_id=request.member_id,
        member_epoch=request.member_epoch,
        instance_id=request.instance_id,
        rack_id=request.rack_id,
        rebalance_timeout_ms=request.rebalance_timeout_ms,
        subscribed_topic_names=names,
        subscribed_topic_regex=request.subscribed_topic_regex if ctx.api_version >= 1 else None,
        server_assignor=request.server_assignor,
        owned=owned,
        client_id=ctx.client_id or "",
        client_host="/" + ctx.peer.rpartition(":")[0],
        api_version=ctx.api_version,
    ))
    if result.error:
        return _heartbeat_error(result.error, result.message)
    cls = ConsumerGroupHeartbeatResponse
    assignment = None
    if result.assignment is not None:
        assignment = cls.Assignment(topic_partitions=[
            cls.Assignment.TopicPartitions(topic_id=topic_id, partitions=sorted(parts))
            for topic_id, parts in result.assignment.items()
        ])
    return cls(
        throttle_time_ms=0, error_code=0, error_message=None, member_id=result.member_id,
        member_epoch=result.member_epoch,
        heartbeat_interval_ms=result.interval_ms, assignment=assignment,
    )


def _heartbeat_error(error: ErrorCode, message: str | None) -> ApiMessage:
    return ConsumerGroupHeartbeatResponse(
        throttle_time_ms=0, error_code=int(error), error_message=message, member_id=None, member_epoch=-1,
        heartbeat_interval_ms=0, assignment=None,
    )


@handles(ApiKey.ConsumerGroupDescribe)
async def consumer_group_describe(ctx: RequestContext, request: ApiMessage) -> ApiMessage:
    groups = coordinator(ctx)
    cls = ConsumerGroupDescribeResponse.DescribedGroup
    described = []
    for group_id in request.group_ids:
        group = groups.describe(group_id)
        error, message = ErrorCode.NONE, None
        if not ctx.authorize(ACLOperation.DESCRIBE, ACLResourceType.GROUP, group_id):
            error = ErrorCode.GROUP_AUTHORIZATION_FAILED
        elif not group_id:
            error, message = ErrorCode.INVALID_GROUP_ID, "GroupId can't be empty."
        elif away := not_served(ctx, group_id):
            error = away
        elif group is None:
            error, message = ErrorCode.GROUP_ID_NOT_FOUND, f"Group {group_id} not found."
        elif group.consumer is None:
            # The Java AdminClient then asks DescribeGroups (a classic group), as it does of Kafka.
            error, message = ErrorCode.GROUP_ID_NOT_FOUND, f"Group {group_id} is not a consumer group."
        if error or group is None or group.consumer is None:
            described.append(cls(
                error_code=int(error), error_message=message, group_id=group_id, group_state="", group_epoch=-1,
                assignment_epoch=-1, assignor_name="", members=[],
                authorized_operations=AUTHORIZED_OPERATIONS_OMITTED,
            ))
            continue
        consumer = group.consumer
        by_id = {meta.topic_id: meta for meta in groups.consumer_groups.topics().values()}
        members = [
            cls.Member(
                member_id=m.member_id, instance_id=m.instance_id, rack_id=m.rack_id, member_epoch=m.member_epoch,
                client_id=m.client_id, client_host=m.client_host, subscribed_topic_names=m.subscribed_topic_names,
                subscribed_topic_regex=m.subscribed_topic_regex, assignment=_assignment(m.assigned, by_id),
                target_assignment=_assignment(consumer.target.get(m.member_id, {}), by_id),
                member_type=1,  # a consumer (KIP-848) member; icelog's consumer groups have no classic ones
            )
            for m in consumer.members.values()
        ]
        described.append(cls(
            error_code=0, error_message=None, group_id=group_id, group_state=group.state_name,
            group_epoch=consumer.group_epoch, assignment_epoch=consumer.assignment_epoch,
            assignor_name=consumer.assignor or groups.consumer_groups.settings.assignors[0], members=members,
            authorized_operations=AUTHORIZED_OPERATIONS_OMITTED,
        ))
    return ConsumerGroupDescribeResponse(throttle_time_ms=0, groups=described)


def _assignment(assignment: Assignment, topics: dict[Any, TopicMetadata]) -> Any:
    cls = ConsumerGroupDescribeResponse.DescribedGroup.Member.Assignment
    return cls(topic_partitions=[
        cls.TopicPartitions(topic_id=topic_id, topic_name=topics[topic_id].name if topic_id in topics else "",
                            partitions=sorted(parts))
        for topic_id, parts in assignment.items()
    ])
