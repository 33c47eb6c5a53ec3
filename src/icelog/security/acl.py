"""Kafka's ACL model: resource types, pattern types, operations and permissions (kafka-python's enums, Kafka's
codes), how a binding matches a resource, and how a filter (Describe/DeleteAcls, `icelog acl`) matches a binding."""

from __future__ import annotations

from kafka.protocol.admin.acl import ACLOperation, ACLPermissionType, ACLResourcePatternType, ACLResourceType

from icelog.meta.security import AclEntry

__all__ = ["ACLOperation", "ACLPermissionType", "ACLResourcePatternType", "ACLResourceType", "AclEntry", "AclFilter"]

CLUSTER_NAME = "kafka-cluster"  # the one CLUSTER resource's name, as Kafka's
WILDCARD = "*"  # a LITERAL resource name or a principal matching all


class AclFilter:
    """A filter over bindings as DescribeAcls / DeleteAcls carry it (ANY / MATCH, None for any name/principal/host)."""
