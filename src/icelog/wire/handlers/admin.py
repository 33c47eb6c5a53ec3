"""Admin APIs: CreateTopics, DeleteTopics, CreatePartitions, DescribeConfigs, AlterConfigs,
IncrementalAlterConfigs."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from kafka.protocol.admin import (
    AlterConfigsResponse,
    CreatePartitionsResponse,
    CreateTopicsResponse,
    DeleteTopicsResponse,
    DescribeConfigsResponse,
    IncrementalAlterConfigsResponse,
)
from kafka.protocol.api_key import ApiKey

from icelog.errors import ErrorCode, KafkaApiError
from icelog.security.acl import ACLOperation, ACLResourceType
from icelog.topics import TOPIC_CONFIG_KEYS
from icelog.wire.authz import may_create_topic, on_cluster
from icelog.wire.context import RequestContext, handles

if TYPE_CHECKING:
    from kafka.protocol.api_message import ApiMessage

RESOURCE_TOPIC = 2
RESOURCE_BROKER = 4
SOURCE_TOPIC = 1  # DYNAMIC_TOPIC_CONFIG
SOURCE_STATIC_BROKER = 4
SOURCE_DEFAULT = 5
OP_SET, OP_DELETE, OP_APPEND, OP_SUBTRACT = 0, 1, 2, 3


def _error(exc: KafkaApiError) -> tuple[int, str]:
    return int(exc.code), exc.message or exc.code.name


def _check_topic(ctx: RequestContext, operation: ACLOperation, topic: str) -> None:
    """TOPIC_AUTHORIZATION_FAILED unless the principal may do `operation` on the topic (before any existence
    check, so a topic one may not see is not revealed)."""
    if not ctx.authorize(operation, ACLResourceType.TOPIC, topic):
        raise KafkaApiError(ErrorCode.TOPIC_AUTHORIZATION_FAILED, "Authorization failed.")


def _check_configs(ctx: RequestContext, operation: ACLOperation, resource: Any) -> None:
    """DESCRIBE_CONFIGS / ALTER_CONFIGS on the topic, or on the cluster for a broker resource."""
    if resource.resource_type == RESOURCE_TOPIC:
        _check_topic(ctx, operation, resource.resource_name)
    elif resource.resource_type == RESOURCE_BROKER and not on_cluster(ctx, operation):
        raise KafkaApiError(ErrorCode.CLUSTER_AUTHORIZATION_FAILED, "Authorization failed.")


@handles(ApiKey.CreateTopics)
async def create_topics(ctx: RequestContext, request: ApiMessage) -> ApiMessage:
    logs = ctx.broker.logs
    settings = ctx.broker.settings
    results = []
    for topic in request.topics:
        result = CreateTopicsResponse.CreatableTopicResult(
            name=topic.name, error_code=0, error_message=None, num_partitions=-1, replication_factor=-1, configs=[]
        )
        results.append(result)
        try:
            if not may_create_topic(ctx, topic.name):
                raise KafkaApiError(ErrorCode.TOPIC_AUTHORIZATION_FAILED, "Authorization failed.")
            partitions = topic.num_partitions
            if topic.assignments:
                partitions = len(topic.assignments)
            elif partitions == -1:
                partitions = settings.num_partitions
            if topic.replication_factor not in (-1, 1) and not topic.assignments:
                raise KafkaApiError(
                    ErrorCode.INVALID_REPLICATION_FACTOR,
                    f"replication factor {topic.replication_factor} is larger than the 1 available broker; "
                    "icelog keeps one durable copy (use -1 or 1)",
                )
            configs = {c.name: c.value for c in topic.configs}
            if ctx.broker.enforcer is not None:  # partition.by / bucket.key against a registered schema
                await ctx.broker.enforcer.check_table_configs(
                    topic.name, {k: v for k, v in configs.items() if v is not None}
                )
            state = logs.create_topic(topic.name, partitions, configs, validate_only=request.validate_only)
            result.num_partitions = partitions
            result.replication_factor = 1
            if state is not None:
                result.topic_id = state.record.topic_id
        except KafkaApiError as exc:
            result.error_code, result.error_message = _error(exc)
    return CreateTopicsResponse(throttle_time_ms=0, topics=results)


@handles(ApiKey.DeleteTopics)
async def delete_topics(ctx: RequestContext, request: ApiMessage) -> ApiMessage:
    logs = ctx.broker.logs
    if ctx.api_version >= 6:
        names = [t.name or _name_for_id(ctx, t.topic_id) for t in request.topics]
    else:
        names = list(request.topic_names)
    responses = []
    for name in names:
        result = DeleteTopicsResponse.DeletableTopicResult(name=name, error_code=0, error_message=None)
        responses.append(result)
        try:
            if name:  # an unknown topic id stays unknown
                _check_topic(ctx, ACLOperation.DELETE, name)
            state = logs.get(name or "")
            if state is not None:
                result.topic_id = state.record.topic_id
            logs.delete_topic(name or "")
            if ctx.broker.groups is not None:  # Kafka drops the committed offsets of a deleted topic
                ctx.broker.groups.forget_topic(name or "")
        except KafkaApiError as exc:
            result.error_code, result.error_message = _error(exc)
    return DeleteTopicsResponse(throttle_time_ms=0, responses=responses)


def _name_for_id(ctx: RequestContext, topic_id: Any) -> str:
    for name, state in ctx.broker.logs.topics.items():
        if state.record.topic_id == topic_id:
            return name
    return ""


@handles(ApiKey.CreatePartitions)
async def create_partitions(ctx: RequestContext, request: ApiMessage) -> ApiMessage:
    results = []
    for topic in request.topics:
        result = CreatePartitionsResponse.CreatePartitionsTopicResult(name=topic.name, error_code=0)
        results.append(result)
        try:
            _check_topic(ctx, ACLOperation.ALTER, topic.name)
            ctx.broker.logs.add_partitions(topic.name, topic.count, validate_only=request.validate_only)
        except KafkaApiError as exc:
            result.error_code, result.error_message = _error(exc)
    return CreatePartitionsResponse(throttle_time_ms=0, results=results)


@handles(ApiKey.DescribeConfigs)
async def describe_configs(ctx: RequestContext, request: ApiMessage) -> ApiMessage:
    Result = DescribeConfigsResponse.DescribeConfigsResult
    Entry = Result.DescribeConfigsResourceResult
    results = []
    for resource in request.resources:
        result = Result(
            error_code=0, error_message=None, resource_type=resource.resource_type,
            resource_name=resource.resource_name, configs=[],
        )
        results.append(result)
        wanted = set(resource.configuration_keys) if resource.configuration_keys else None
        try:
            _check_configs(ctx, ACLOperation.DESCRIBE_CONFIGS, resource)
        except KafkaApiError as exc:
            result.error_code, result.error_message = _error(exc)
            continue
        if resource.resource_type == RESOURCE_TOPIC:
            state = ctx.broker.logs.get(resource.resource_name)
            if state is None:
                result.error_code = int(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION)
                result.error_message = f"topic {resource.resource_name!r} does not exist"
                continue
            for name, value in sorted(state.config.values.items()) + sorted(
                (k, v) for k, v in state.record.configs.items() if k not in state.config.values
            ):
                if wanted is not None and name not in wanted:
                    continue
                explicit = name in state.config.explicit
                spec = TOPIC_CONFIG_KEYS.get(name)
                result.configs.append(
                    Entry(
                        name=name, value=value, read_only=False, is_default=not explicit,
                        config_source=SOURCE_TOPIC if explicit else SOURCE_DEFAULT, is_sensitive=False,
                        synonyms=[], config_type=0, documentation=spec.doc if spec else None,
                    )
                )
        elif resource.resource_type == RESOURCE_BROKER:
            for name, value in _broker_configs(ctx).items():
                if wanted is None or name in wanted:
                    sensitive = name in SENSITIVE_BROKER_CONFIGS  # as Kafka: said to be set, never shown
                    result.configs.append(
                        Entry(
                            name=name, value=None if sensitive else value, read_only=True, is_default=False,
                            config_source=SOURCE_STATIC_BROKER, is_sensitive=sensitive, synonyms=[],
                            config_type=0, documentation=None,
                        )
                    )
        else:
            result.error_code = int(ErrorCode.INVALID_REQUEST)
            result.error_message = f"resource type {resource.resource_type} is not supported"
    return DescribeConfigsResponse(throttle_time_ms=0, results=results)


SENSITIVE_BROKER_CONFIGS = frozenset({"ssl.key.password"})


def _broker_configs(ctx: RequestContext) -> dict[str, str]:
    settings = ctx.broker.settings
    configs = {
        "auto.create.topics.enable": str(settings.auto_create_topics_enable).lower(),
        "num.partitions": str(settings.num_partitions),
        "socket.request.max.bytes": str(settings.socket_request_max_bytes),
        "broker.id": str(settings.node_id),
        "listeners": ",".join(f"{s.name}://{s.host}:{s.port}" for s in settings.listener_specs),
        "sasl.enabled.mechanisms": ",".join(settings.sasl_mechanisms),
        "ssl.client.auth": settings.ssl_client_auth,
        "super.users": ";".join(sorted(settings.super_user_set)),
        "allow.everyone.if.no.acl.found": str(settings.allow_everyone_if_no_acl_found).lower(),
    }
    if settings.ssl_keyfile_password is not None:
        configs["ssl.key.password"] = ""  # answered as null with is_sensitive
    return configs


@handles(ApiKey.AlterConfigs)
async def alter_configs(ctx: RequestContext, request: ApiMessage) -> ApiMessage:
    """Legacy AlterConfigs: the given set replaces every explicit config of the topic."""
    responses = []
    for resource in request.resources:
        result = AlterConfigsResponse.AlterConfigsResourceResponse(
            error_code=0, error_message=None, resource_type=resource.resource_type,
            resource_name=resource.resource_name,
        )
        responses.append(result)
        try:
            _check_configs(ctx, ACLOperation.ALTER_CONFIGS, resource)
            state = _topic_resource(ctx, resource)
            new = {c.name: c.value for c in resource.configs if c.value is not None}
            removed = [k for k in state.record.configs if k not in new]
            ctx.broker.logs.alter_configs(state.name, new, removed, validate_only=request.validate_only)
        except KafkaApiError as exc:
            result.error_code, result.error_message = _error(exc)
    return AlterConfigsResponse(throttle_time_ms=0, responses=responses)


@handles(ApiKey.IncrementalAlterConfigs)
async def incremental_alter_configs(ctx: RequestContext, request: ApiMessage) -> ApiMessage:
    responses = []
    for resource in request.resources:
        result = IncrementalAlterConfigsResponse.AlterConfigsResourceResponse(
            error_code=0, error_message=None, resource_type=resource.resource_type,
            resource_name=resource.resource_name,
        )
        responses.append(result)
        try:
            _check_configs(ctx, ACLOperation.ALTER_CONFIGS, resource)
            state = _topic_resource(ctx, resource)
            current = dict(state.config.values) | dict(state.record.configs)
            new: dict[str, str] = {}
            removed: list[str] = []
            for config in resource.configs:
                if config.config_operation == OP_SET:
                    new[config.name] = config.value
                elif config.config_operation == OP_DELETE:
                    removed.append(config.name)
                elif config.config_operation in (OP_APPEND, OP_SUBTRACT):
                    items = [v for v in current.get(config.name, "").split(",") if v]
                    change = [v for v in (config.value or "").split(",") if v]
                    if config.config_operation == OP_APPEND:
                        items += [v for v in change if v not in items]
                    else:
                        items = [v for v in items if v not in change]
                    new[config.name] = ",".join(items)
                else:
                    raise KafkaApiError(
                        ErrorCode.INVALID_REQUEST, f"unknown config operation {config.config_operation}"
                    )
            ctx.broker.logs.alter_configs(state.name, new, removed, validate_only=request.validate_only)
        except KafkaApiError as exc:
            result.error_code, result.error_message = _error(exc)
    return IncrementalAlterConfigsResponse(throttle_time_ms=0, responses=responses)


def _topic_resource(ctx: RequestContext, resource: Any) -> Any:
    if resource.resource_type != RESOURCE_TOPIC:
        raise KafkaApiError(ErrorCode.INVALID_REQUEST, "only topic configs can be altered")
    state = ctx.broker.logs.get(resource.resource_name)
    if state is None:
        raise KafkaApiError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"topic {resource.resource_name!r} does not exist")
    return state
