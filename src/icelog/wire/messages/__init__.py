"""Request and response classes for APIs kafka-python's codec has no schema for, built the same way as its own: from
Kafka's JSON message definitions (copied unchanged from kafka-clients 4.1.1, `common/message/*.json`, beside this
file). kafka-python's metaclass reads `<ClassName>.json` from the package named by `load_json`.
"""

from __future__ import annotations

from kafka.protocol.api_message import ApiMessage

_HERE = __name__  # the package the JSON files are read from


class ConsumerGroupHeartbeatRequest(ApiMessage, load_json=_HERE):  # type: ignore[misc,call-arg]
    """KIP-848's heartbeat: join, leave, subscription and owned partitions, in one request."""


class ConsumerGroupHeartbeatResponse(ApiMessage, load_json=_HERE):  # type: ignore[misc,call-arg]
    """The member's id, epoch, heartbeat interval and (when it changed) its assignment, by topic id."""


class ConsumerGroupDescribeRequest(ApiMessage, load_json=_HERE):  # type: ignore[misc,call-arg]
    """Describe KIP-848 consumer groups (the Java AdminClient's describeConsumerGroups asks this first)."""


class ConsumerGroupDescribeResponse(ApiMessage, load_json=_HERE):  # type: ignore[misc,call-arg]
    """Group and assignment epochs, the assignor, and each member's current and target assignment."""


__all__ = [
    "ConsumerGroupDescribeRequest",
    "ConsumerGroupDescribeResponse",
    "ConsumerGroupHeartbeatRequest",
    "ConsumerGroupHeartbeatResponse",
]
