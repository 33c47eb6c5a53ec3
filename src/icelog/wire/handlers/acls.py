"""CreateAcls, DescribeAcls, DeleteAcls: Kafka's ACL admin APIs over the broker's Authorizer.

As Kafka: SECURITY_DISABLED when no authorizer is configured, ALTER on the cluster to create or delete and DESCRIBE
on it to describe (CLUSTER_AUTHORIZATION_FAILED otherwise), a per-creation / per-filter error for a binding or
filter Kafka refuses (INVALID_REQUEST). Store writes are durable (an fsync), so they run off the event loop.
"""

from __future__ import annotations

import asyncio
from itertools import groupby
from typing import TYPE_CHECKING

from kafka.protocol.admin.acl import CreateAclsResponse, DeleteAclsResponse, DescribeAclsResponse
from kafka.protocol.api_key import ApiKey

from icelog.errors import ErrorCode
from icelog.meta.security import AclEntry
from icelog.security.acl import AclFilter, ACLOperation, InvalidAclError, validate_binding
from icelog.wire.authz import on_cluster
from icelog.wire.context import RequestContext, handles

if TYPE_CHECKING:
    from kafka.protocol.api_message import ApiMessage

NO_AUTHORIZER = "No Authorizer is configured on the broker"
CreationResult = CreateAclsResponse.AclCreationResult
FilterResult = DeleteAclsResponse.DeleteAclsFilterResult
MatchingAcl = FilterResult.DeleteAclsMatchingAcl


def _refusal(ctx: RequestContext, operation: ACLOperation) -> tuple[ErrorCode, str | None] | None:
    """Why the whole request is refused, or None."""
    if ctx.broker.authorizer is None:
        return ErrorCode.SECURITY_DISABLED, NO_AUTHORIZER
    if not on_cluster(ctx, operation):
        return ErrorCode.CLUSTER_AUTHORIZATION_FAILED, None
    return None


def _filter(message: ApiMessage) -> AclFilter:
    """A filter from DescribeAcls or DeleteAcls (same fields)."""
    return AclFilter(
        message.resource_type_filter, message.resource_name_filter, message.pattern_type_filter,
        message.principal_filter, message.host_filter, message.operation, message.permission_type,
    )


@handles(ApiKey.CreateAcls)
async def create_acls(ctx: RequestContext, request: ApiMessage) -> ApiMessage:
    refused = _refusal(ctx, ACLOperation.ALTER)
    results = [CreationResult(error_code=0, error_message=None) for _ in request.creations]
    if refused is not None:
        for result in results:
            result.error_code, result.error_message = int(refused[0]), refused[1]
        return CreateAclsResponse(throttle_time_ms=0, results=results)
    authorizer = ctx.broker.authorizer
    assert authorizer is not None
    valid: list[AclEntry] = []
    for creation, result in zip(request.creations, results, strict=True):
        entry = AclEntry(
            creation.resource_type, creation.resource_name, creation.resource_pattern_type, creation.principal,
            creation.host, creation.operation, creation.permission_type,
        )
        try:
            validate_binding(entry)
        except InvalidAclError as exc:
            result.error_code, result.error_message = int(ErrorCode.INVALID_REQUEST), str(exc)
            continue
        valid.append(entry)
    if valid:
        await asyncio.to_thread(authorizer.create, valid)
    return CreateAclsResponse(throttle_time_ms=0, results=results)


@handles(ApiKey.DescribeAcls)
async def describe_acls(ctx: RequestContext, request: ApiMessage) -> ApiMessage:
    refused = _refusal(ctx, ACLOperation.DESCRIBE)
    if refused is not None:
        return DescribeAclsResponse(
            throttle_time_ms=0, error_code=int(refused[0]), error_message=refused[1], resources=[]
        )
    authorizer = ctx.broker.authorizer
    assert authorizer is not None
    flt = _filter(request)
    try:
        flt.validate()
    except InvalidAclError as exc:
        return DescribeAclsResponse(
            throttle_time_ms=0, error_code=int(ErrorCode.INVALID_REQUEST), error_message=str(exc), resources=[]
        )
    Resource = DescribeAclsResponse.DescribeAclsResource

    def pattern(e: AclEntry) -> tuple[int, str, int]:
        return e.resource_type, e.resource_name, e.pattern_type

    resources = [
        Resource(
            resource_type=rtype, resource_name=name, pattern_type=ptype,
            acls=[
                Resource.AclDescription(
                    principal=e.principal, host=e.host, operation=e.operation, permission_type=e.permission
                )
                for e in entries
            ],
        )
        for (rtype, name, ptype), entries in groupby(sorted(authorizer.describe(flt), key=pattern), key=pattern)
    ]
    return DescribeAclsResponse(throttle_time_ms=0, error_code=0, error_message=None, resources=resources)


@handles(ApiKey.DeleteAcls)
async def delete_acls(ctx: RequestContext, request: ApiMessage) -> ApiMessage:
    refused = _refusal(ctx, ACLOperation.ALTER)
    if refused is not None:
        return DeleteAclsResponse(
            throttle_time_ms=0,
            filter_results=[
                FilterResult(error_code=int(refused[0]), error_message=refused[1], matching_acls=[])
                for _ in request.filters
            ],
        )
    authorizer = ctx.broker.authorizer
    assert authorizer is not None
    results = []
    for message in request.filters:
        flt = _filter(message)
        try:
            flt.validate()
        except InvalidAclError as exc:
            results.append(
                FilterResult(error_code=int(ErrorCode.INVALID_REQUEST), error_message=str(exc), matching_acls=[])
            )
            continue
        removed = await asyncio.to_thread(authorizer.delete, flt)
        results.append(
            FilterResult(
                error_code=0, error_message=None,
                matching_acls=[
                    MatchingAcl(
                        error_code=0, error_message=None, resource_type=e.resource_type,
                        resource_name=e.resource_name, pattern_type=e.pattern_type, principal=e.principal,
                        host=e.host, operation=e.operation, permission_type=e.permission,
                    )
                    for e in removed
                ],
            )
        )
    return DeleteAclsResponse(throttle_time_ms=0, filter_results=results)
