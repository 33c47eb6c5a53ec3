"""The API version ranges icelog advertises: every one is served, and driven by a real client in the tests.

Ranges follow Apache Kafka 2.8's for the APIs Kafka 2.8 has, so that clients which infer a broker release
(kafka-python) see a real one; APIs added since are served at the versions Kafka 4's clients use. Held back on
purpose (see docs/architecture.md): Fetch >= 13, Produce >= 10 and OffsetFetch >= 8 (topic ids, groups arrays),
FindCoordinator >= 4 (batched keys). docs/compatibility.md lists them all (tests/system/test_docs.py checks it).
"""

from __future__ import annotations

from kafka.protocol.api_key import ApiKey
from kafka.protocol.api_message import ApiMessage

from icelog.errors import ErrorCode
from icelog.wire import codec

SUPPORTED_VERSIONS: dict[int, tuple[int, int]] = {
    ApiKey.Produce: (0, 9),
    ApiKey.Fetch: (0, 12),
    ApiKey.ListOffsets: (0, 7),  # v7: MAX_TIMESTAMP (KIP-734), which the Java AdminClient's maxTimestamp needs
    ApiKey.Metadata: (0, 12),  # v12: topics by id (librdkafka resolves KIP-848 assignments' topic ids so)
    ApiKey.ApiVersions: (0, 3),
    ApiKey.CreateTopics: (0, 7),
    ApiKey.DeleteTopics: (0, 6),
    ApiKey.DescribeConfigs: (0, 4),
    ApiKey.AlterConfigs: (0, 2),
    ApiKey.CreatePartitions: (0, 3),
    ApiKey.IncrementalAlterConfigs: (0, 1),
    # What the Java AdminClient 4.x asks first (describeCluster, describeTopics / kafka-topics --describe).
    ApiKey.DescribeCluster: (0, 2),
    ApiKey.DescribeTopicPartitions: (0, 0),
    ApiKey.DescribeLogDirs: (0, 4),  # v5's cordoned log dirs (KIP-1066) not: icelog's one dir is never cordoned
    ApiKey.DeleteRecords: (0, 2),  # kafka-delete-records.sh: moves the log start (the table keeps its rows)
    ApiKey.OffsetForLeaderEpoch: (2, 4),  # as Kafka 4 (v0-1 gone; the codec has no schema for them)
    # Consumer groups (OffsetCommit/OffsetFetch start at 2/1: the codec has no older schemas).
    ApiKey.FindCoordinator: (0, 3),
    ApiKey.JoinGroup: (0, 7),
    ApiKey.SyncGroup: (0, 5),
    ApiKey.Heartbeat: (0, 4),
    ApiKey.LeaveGroup: (0, 4),
    ApiKey.OffsetCommit: (2, 9),  # v9: the first KIP-848 members commit with (STALE_MEMBER_EPOCH)
    ApiKey.OffsetFetch: (1, 7),
    ApiKey.DescribeGroups: (0, 5),
    ApiKey.ListGroups: (0, 5),  # v5: group types (classic, consumer) and their filter
    ApiKey.DeleteGroups: (0, 2),
    ApiKey.OffsetDelete: (0, 0),
    # KIP-848 consumer groups (group.protocol=consumer), at the versions Kafka 4.1's clients use.
    ApiKey.ConsumerGroupHeartbeat: (0, 1),
    ApiKey.ConsumerGroupDescribe: (0, 1),
    # Idempotent producers and transactions.
    ApiKey.InitProducerId: (0, 4),
    ApiKey.AddPartitionsToTxn: (0, 3),
    ApiKey.AddOffsetsToTxn: (0, 3),
    ApiKey.EndTxn: (0, 3),
    ApiKey.TxnOffsetCommit: (0, 3),
    # kafka-transactions.sh (KIP-664): listing and describing transactions and producers, and aborting a hanging
    # transaction (the AdminClient's abortTransaction writes its marker with WriteTxnMarkers; Kafka 4 serves v1+).
    ApiKey.ListTransactions: (0, 1),
    ApiKey.DescribeTransactions: (0, 0),
    ApiKey.DescribeProducers: (0, 0),
    ApiKey.WriteTxnMarkers: (1, 1),
    # Logins on SASL listeners (v0's bare tokens included; Kafka 4 dropped that form, older clients send it).
    ApiKey.SaslHandshake: (0, 1),
    ApiKey.SaslAuthenticate: (0, 2),
    # ACLs (Kafka 2.8 serves v0-2; v3 is its flexible form, which kafka-python's codec has too).
    ApiKey.DescribeAcls: (0, 2),
    ApiKey.CreateAcls: (0, 2),
    ApiKey.DeleteAcls: (0, 2),
    # Users (KIP-554, Kafka 2.7+).
    ApiKey.DescribeUserScramCredentials: (0, 0),
    ApiKey.AlterUserScramCredentials: (0, 0),
}


# Feature levels finalized in ApiVersions v3+ (KIP-584), each only as far as it is implemented: group.version 1 is
# KIP-848's consumer groups. transaction.version (KIP-890) is not advertised: transactions are v1.
FINALIZED_FEATURES: dict[str, int] = {"group.version": 1}
FEATURES_EPOCH = 1  # the features never change while a broker runs


def is_supported(api_key: int, api_version: int) -> bool:
    """Whether icelog serves this API at this version."""
    versions = SUPPORTED_VERSIONS.get(api_key)
    return versions is not None and versions[0] <= api_version <= versions[1]


def build_api_versions_response(version: int, error: ErrorCode = ErrorCode.NONE) -> ApiMessage:
    """An ApiVersions response listing every API icelog serves."""
    cls = codec.response_class(ApiKey.ApiVersions)
    keys = [
        cls.ApiVersion(api_key=int(k), min_version=lo, max_version=hi)
        for k, (lo, hi) in sorted(SUPPORTED_VERSIONS.items())
    ]
    response = cls(error_code=int(error), api_keys=keys, throttle_time_ms=0)
    if version >= 3 and not error:
        response.supported_features = [
            cls.SupportedFeatureKey(name=name, min_version=0, max_version=level)
            for name, level in FINALIZED_FEATURES.items()
        ]
        response.finalized_features_epoch = FEATURES_EPOCH
        response.finalized_features = [
            cls.FinalizedFeatureKey(name=name, max_version_level=level, min_version_level=level)
            for name, level in FINALIZED_FEATURES.items()
        ]
    return response
