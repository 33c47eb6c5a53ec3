"""AlterUserScramCredentials and DescribeUserScramCredentials: users managed online (KIP-554), as Kafka answers.

ALTER on the cluster to alter, DESCRIBE on it to describe (CLUSTER_AUTHORIZATION_FAILED otherwise); one result
per user, with Kafka's codes: an unknown mechanism UNSUPPORTED_SASL_MECHANISM, a credential icelog cannot keep
(iterations, salt, name) UNACCEPTABLE_CREDENTIAL, a user named twice DUPLICATE_RESOURCE, deleting or describing
a credential that does not exist RESOURCE_NOT_FOUND. Only salted keys reach the store (the client sends a salted
password, never the password); writes are durable, so they run off the event loop.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import TYPE_CHECKING

from kafka.protocol.admin import AlterUserScramCredentialsResponse, DescribeUserScramCredentialsResponse
from kafka.protocol.api_key import ApiKey

from icelog.errors import ErrorCode, KafkaApiError
from icelog.meta.security import ScramCredential, SecurityStore
from icelog.security.acl import ACLOperation
from icelog.security.credentials import CredentialError, credential_from_salted_password
from icelog.wire.authz import on_cluster
from icelog.wire.context import RequestContext, handles

if TYPE_CHECKING:
    from kafka.protocol.api_message import ApiMessage

MECHANISMS = {1: "SCRAM-SHA-256", 2: "SCRAM-SHA-512"}  # Kafka's ScramMechanism codes
CODES = {name: code for code, name in MECHANISMS.items()}
REFUSED = "Cluster authorization failed."  # Kafka's message of CLUSTER_AUTHORIZATION_FAILED
AlterResult = AlterUserScramCredentialsResponse.AlterUserScramCredentialsResult
DescribeResult = DescribeUserScramCredentialsResponse.DescribeUserScramCredentialsResult


def _store(ctx: RequestContext) -> SecurityStore:
    store = ctx.broker.logs.store
    assert isinstance(store, SecurityStore), "every metadata store backend holds users"
    return store


def _mechanism(code: int) -> str:
    mechanism = MECHANISMS.get(code)
    if mechanism is None:
        raise KafkaApiError(ErrorCode.UNSUPPORTED_SASL_MECHANISM, "Unknown SCRAM mechanism")
    return mechanism


@handles(ApiKey.AlterUserScramCredentials)
async def alter_user_scram_credentials(ctx: RequestContext, request: ApiMessage) -> ApiMessage:
    users = list(dict.fromkeys([d.name for d in request.deletions] + [u.name for u in request.upsertions]))
    if not on_cluster(ctx, ACLOperation.ALTER):
        results = [AlterResult(user=u, error_code=int(ErrorCode.CLUSTER_AUTHORIZATION_FAILED), error_message=REFUSED)
                   for u in users]
        return AlterUserScramCredentialsResponse(throttle_time_ms=0, results=results)
    named = Counter([(d.name, d.mechanism) for d in request.deletions]
                    + [(u.name, u.mechanism) for u in request.upsertions])
    errors: dict[str, KafkaApiError] = {}
    for (user, _), count in named.items():
        if count > 1 and user not in errors:
            errors[user] = KafkaApiError(
                ErrorCode.DUPLICATE_RESOURCE, "A user credential cannot be altered twice in the same request"
            )
    deletions: list[tuple[str, str]] = []
    upsertions: list[ScramCredential] = []
    for deletion in request.deletions:
        if deletion.name in errors:
            continue
        try:
            if not deletion.name:
                raise KafkaApiError(ErrorCode.UNACCEPTABLE_CREDENTIAL, "Username must not be empty")
            deletions.append((deletion.name, _mechanism(deletion.mechanism)))
        except KafkaApiError as exc:
            errors[deletion.name] = exc
    for upsertion in request.upsertions:
        if upsertion.name in errors:
            continue
        try:
            upsertions.append(credential_from_salted_password(
                upsertion.name, _mechanism(upsertion.mechanism), bytes(upsertion.salt),
                bytes(upsertion.salted_password), upsertion.iterations,
            ))
        except CredentialError as exc:
            errors[upsertion.name] = KafkaApiError(ErrorCode.UNACCEPTABLE_CREDENTIAL, str(exc))
        except KafkaApiError as exc:
            errors[upsertion.name] = exc
    # a user's changes apply together or not at all: one bad change of a user drops its others
    deletions = [d for d in deletions if d[0] not in errors]
    upsertions = [c for c in upsertions if c.user not in errors]
    errors.update(await asyncio.to_thread(_apply, _store(ctx), deletions, upsertions))
    results = [
        AlterResult(user=u, error_code=int(errors[u].code) if u in errors else 0,
                    error_message=errors[u].message if u in errors else None)
        for u in users
    ]
    return AlterUserScramCredentialsResponse(throttle_time_ms=0, results=results)


def _apply(store: SecurityStore, deletions: list[tuple[str, str]],
           upsertions: list[ScramCredential]) -> dict[str, KafkaApiError]:
    """On a worker thread: the store writes; RESOURCE_NOT_FOUND for a deletion of nothing."""
    errors: dict[str, KafkaApiError] = {}
    for user, mechanism in deletions:
        if not store.delete_scram_credentials(user, mechanism):
            errors[user] = KafkaApiError(
                ErrorCode.RESOURCE_NOT_FOUND, "Attempt to delete a user credential that does not exist"
            )
    for credential in upsertions:
        store.save_scram_credential(credential)
    return errors


@handles(ApiKey.DescribeUserScramCredentials)
async def describe_user_scram_credentials(ctx: RequestContext, request: ApiMessage) -> ApiMessage:
    if not on_cluster(ctx, ACLOperation.DESCRIBE):
        # as Kafka's getErrorResponse: the error at the top and for every user asked (librdkafka reads both)
        denied = int(ErrorCode.CLUSTER_AUTHORIZATION_FAILED)
        return DescribeUserScramCredentialsResponse(
            throttle_time_ms=0, error_code=denied, error_message=REFUSED,
            results=[DescribeResult(user="", error_code=denied, error_message=REFUSED, credential_infos=[])
                     for u in request.users or []],
        )
    credentials = await asyncio.to_thread(_store(ctx).scram_credentials)
    by_user: dict[str, list[ScramCredential]] = {}
    for credential in credentials:
        by_user.setdefault(credential.user, []).append(credential)
    asked = None if request.users is None else [u.name for u in request.users]
    results = []
    for user in asked if asked is not None else sorted(by_user):
        result = DescribeResult(user=user, error_code=0, error_message=None, credential_infos=[])
        results.append(result)
        if asked is not None and asked.count(user) > 1:
            result.error_code = int(ErrorCode.DUPLICATE_RESOURCE)
            result.error_message = "Cannot describe SCRAM credentials for the same user twice in a single request"
        elif user not in by_user:
            result.error_code = int(ErrorCode.RESOURCE_NOT_FOUND)
            result.error_message = "Attempt to describe a user credential that does not exist"
        else:
            result.credential_infos = [
                DescribeResult.CredentialInfo(mechanism=CODES[c.mechanism], iterations=c.iterations)
                for c in by_user[user] if c.mechanism in CODES
            ]
    return DescribeUserScramCredentialsResponse(throttle_time_ms=0, error_code=0, error_message=None, results=results)
