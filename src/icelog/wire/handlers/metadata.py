"""ApiVersions and Metadata (with Kafka's auto.create.topics.enable)."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from kafka.protocol.api_key import ApiKey
from kafka.protocol.metadata import MetadataResponse

from icelog.errors import ErrorCode, KafkaApiError
from icelog.security.acl import ACLOperation, ACLResourceType
from icelog.wire.authz import may_create_topic
from icelog.wire.context import RequestContext, handles
from icelog.wire.versions import build_api_versions_response

if TYPE_CHECKING:
    from kafka.protocol.api_message import ApiMessage

log = logging.getLogger(__name__)


@handles(ApiKey.ApiVersions)
async def api_versions(ctx: RequestContext, request: ApiMessage) -> ApiMessage:
    return build_api_versions_response(ctx.api_version)


@handles(ApiKey.Metadata)
async def metadata(ctx: RequestContext, request: ApiMessage) -> ApiMessage:
    broker = ctx.broker
    logs = broker.logs
    node = broker.settings.node_id
    # A null topic list asks for every topic: those the principal may not DESCRIBE are left out, as Kafka does.
    if request.topics is None:
        names = [n for n in sorted(logs.topics) if ctx.authorize(ACLOperation.DESCRIBE, ACLResourceType.TOPIC, n)]
    else:
        names = [t.name for t in request.topics]
    allow_create = ctx.api_version < 4 or request.allow_auto_topic_creation
    topics = []
    for name in names:
        state = logs.get(name)
        error = ErrorCode.NONE
        if request.topics is not None and not ctx.authorize(ACLOperation.DESCRIBE, ACLResourceType.TOPIC, name):
            state, error = None, ErrorCode.TOPIC_AUTHORIZATION_FAILED
        elif state is None and allow_create and broker.settings.auto_create_topics_enable:
            if not may_create_topic(ctx, name):
                error = ErrorCode.TOPIC_AUTHORIZATION_FAILED
            else:
                try:
                    state = logs.create_topic(name, broker.settings.num_partitions, {})
                except KafkaApiError as exc:
                    error = exc.code
        if state is None:
            topics.append(
                MetadataResponse.MetadataResponseTopic(
                    error_code=int(error or ErrorCode.UNKNOWN_TOPIC_OR_PARTITION), name=name, partitions=[]
                )
            )
            continue
        partitions = [
            MetadataResponse.MetadataResponseTopic.MetadataResponsePartition(
                error_code=0, partition_index=p, leader_id=node, leader_epoch=-1,
                replica_nodes=[node], isr_nodes=[node], offline_replicas=[],
            )
            for p in range(len(state.partitions))
        ]
        topics.append(
            MetadataResponse.MetadataResponseTopic(
                error_code=0, name=name, topic_id=state.record.topic_id, is_internal=False, partitions=partitions
            )
        )
    brokers = [
        MetadataResponse.MetadataResponseBroker(
            node_id=node, host=ctx.connection.advertised[0], port=ctx.connection.advertised[1], rack=None
        )
    ]
    return MetadataResponse(
        throttle_time_ms=0, brokers=brokers, cluster_id=broker.settings.cluster_id, controller_id=node,
        topics=topics,
    )
