"""DescribeLogDirs (`kafka-log-dirs.sh`, UIs that show partition sizes): icelog's one log directory is the intake.

A partition's size is the bytes of its intake chunks (what `retention.bytes` counts). Records archived to Iceberg
and trimmed from the intake live in the warehouse, not in a log directory: they are not counted here
(`icelog status --tables` shows table sizes). As Kafka: DESCRIBE on the cluster, else CLUSTER_AUTHORIZATION_FAILED
(v3+; older versions get no directories); a null topic list describes every partition; a partition the broker does
not have is left out; a topic with no partition left is left out.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

from kafka.protocol.api_key import ApiKey

from icelog.errors import ErrorCode
from icelog.security.acl import ACLOperation
from icelog.wire import codec
from icelog.wire.authz import on_cluster
from icelog.wire.context import RequestContext, handles

if TYPE_CHECKING:
    from kafka.protocol.api_message import ApiMessage


@handles(ApiKey.DescribeLogDirs)
async def describe_log_dirs(ctx: RequestContext, request: ApiMessage) -> ApiMessage:
    cls: Any = codec.response_class(ApiKey.DescribeLogDirs)
    if not on_cluster(ctx, ACLOperation.DESCRIBE):
        return cls(throttle_time_ms=0, error_code=int(ErrorCode.CLUSTER_AUTHORIZATION_FAILED), results=[])
    logs = ctx.broker.logs
    if request.topics is None:
        wanted = {name: set(range(len(state.partitions))) for name, state in logs.topics.items()}
    else:
        wanted = {}
        for topic in request.topics:
            wanted.setdefault(topic.topic, set()).update(topic.partitions)
    topics = []
    for name, indexes in sorted(wanted.items()):
        state = logs.get(name)
        if state is None:
            continue
        partitions = [
            cls.DescribeLogDirsResult.DescribeLogDirsTopic.DescribeLogDirsPartition(
                partition_index=index, partition_size=state.partitions[index].intake_bytes, offset_lag=0,
                is_future_key=False)
            for index in sorted(indexes) if 0 <= index < len(state.partitions)]
        if partitions:
            topics.append(cls.DescribeLogDirsResult.DescribeLogDirsTopic(name=name, partitions=partitions))
    capacity = await asyncio.to_thread(logs.storage.capacity)  # a statvfs: never on the event loop
    # Kafka's UNKNOWN_VOLUME_BYTES (-1) where the store has no size (object storage)
    result = cls.DescribeLogDirsResult(error_code=0, log_dir=capacity.location, topics=topics,
                                       total_bytes=-1 if capacity.total_bytes is None else capacity.total_bytes,
                                       usable_bytes=-1 if capacity.free_bytes is None else capacity.free_bytes,
                                       is_cordoned=False)
    return cls(throttle_time_ms=0, error_code=0, results=[result])
