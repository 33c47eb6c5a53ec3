"""Fetching Protobuf schemas (with their references) from a Confluent-compatible schema registry over HTTP.

Used by the archiver's driver at the start of a pass (latest version of each subject, cached for the
pass) and by Spark workers for the schema ids of older versions that payloads name in their envelope.
A registry that cannot be reached raises (the pass fails cleanly and is retried, like a catalog outage).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from google.protobuf import descriptor_pb2

from icelog.schema.protobuf_schema import compile_schema

log = logging.getLogger(__name__)

SUBJECT_NOT_FOUND = (40401, 40402)  # subject not found, version not found
# Per request: the client's default is no timeout at all, and a registry that accepts but never answers
# would hold its topic's archiving forever (the pass itself goes on: Archiver.run_pass bounds its wait).
REQUEST_TIMEOUT_S = 10


@dataclass(frozen=True)
class LatestSchema:
    """The latest registered version of a subject, compiled."""

    subject: str
    schema_id: int
    version: int
    fds: descriptor_pb2.FileDescriptorSet


class RegistrySchemas:
    """A registry client that compiles what it fetches; one per pass (its caches are the pass's cache)."""

    def __init__(self, url: str, compiled: dict[int, descriptor_pb2.FileDescriptorSet] | None = None) -> None:
        from confluent_kafka.schema_registry import SchemaRegistryClient

        self.url = url
        self.client = SchemaRegistryClient({"url": url, "timeout": REQUEST_TIMEOUT_S})
        # Schema ids never change what they name: compiled sets may outlive the pass (protoc is slow).
        self._by_id = compiled if compiled is not None else {}
        self._latest: dict[str, LatestSchema | None] = {}

    def latest(self, subject: str) -> LatestSchema | None:
        """The subject's latest Protobuf schema, or None if the subject does not exist (or is not Protobuf)."""
        from confluent_kafka.schema_registry.error import SchemaRegistryError

        if subject not in self._latest:
            try:
                registered = self.client.get_latest_version(subject)
            except SchemaRegistryError as exc:
                if exc.error_code in SUBJECT_NOT_FOUND or exc.http_status_code == 404:
                    self._latest[subject] = None
                    return None
                raise
            schema = registered.schema
            if (schema.schema_type or "AVRO").upper() != "PROTOBUF":
                log.warning("subject %s holds a %s schema; only Protobuf is decoded", subject, schema.schema_type)
                self._latest[subject] = None
                return None
            assert registered.schema_id is not None and registered.version is not None
            fds = self._by_id.get(registered.schema_id) or self._compile(schema)
            self._by_id[registered.schema_id] = fds
            self._latest[subject] = LatestSchema(subject, registered.schema_id, registered.version, fds)
        return self._latest[subject]

    def by_id(self, schema_id: int) -> descriptor_pb2.FileDescriptorSet:
        """The compiled schema a payload's envelope names."""
        if schema_id not in self._by_id:
            self._by_id[schema_id] = self._compile(self.client.get_schema(schema_id))
        return self._by_id[schema_id]

    def _compile(self, schema: Any) -> descriptor_pb2.FileDescriptorSet:
        references: dict[str, str] = {}
        self._collect_references(schema, references)
        return compile_schema(schema.schema_str or "", references)

    def _collect_references(self, schema: Any, into: dict[str, str]) -> None:
        for ref in schema.references or ():
            if ref.name in into:
                continue
            referenced = self.client.get_version(ref.subject, ref.version).schema
            into[ref.name] = referenced.schema_str or ""
            self._collect_references(referenced, into)
