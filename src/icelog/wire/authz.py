"""Authorization rules more than one handler applies, as Kafka's KafkaApis / AuthHelper states them.

Every check goes through `RequestContext.authorize` (always true without an authorizer); refusals are answered
with Kafka's *_AUTHORIZATION_FAILED codes and never logged (clients retry them: a log line each would flood).
"""

from __future__ import annotations

from icelog.security.acl import CLUSTER_NAME, ACLOperation, ACLResourceType
from icelog.wire.context import RequestContext


def on_cluster(ctx: RequestContext, operation: ACLOperation) -> bool:
    """Whether the principal may do `operation` on the one CLUSTER resource."""
    return ctx.authorize(operation, ACLResourceType.CLUSTER, CLUSTER_NAME)


def may_create_topic(ctx: RequestContext, topic: str) -> bool:
    """CreateTopics and Metadata's auto-creation: CREATE on the cluster, else CREATE on the topic."""
    return on_cluster(ctx, ACLOperation.CREATE) or ctx.authorize(ACLOperation.CREATE, ACLResourceType.TOPIC, topic)


def may_write_some_topic(ctx: RequestContext) -> bool:
    """KIP-679: an idempotent (non-transactional) producer needs IDEMPOTENT_WRITE on the cluster or WRITE on any
    topic (Kafka's authorizeByResourceType)."""
    if on_cluster(ctx, ACLOperation.IDEMPOTENT_WRITE):
        return True
    authorizer = ctx.broker.authorizer
    if authorizer is None:
        return True
    connection = ctx.connection
    return authorizer.authorize_any(connection.principal, connection.host, ACLOperation.WRITE, ACLResourceType.TOPIC)
