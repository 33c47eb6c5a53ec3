"""Where the archive reads schemas (Avro, JSON Schema, Protobuf): the metadata store (embedded registry) or an
external registry.

With the embedded registry the archiver reads the registry's state from the metadata store directly, so
archiving needs no running broker. With `registry_url` it asks that registry over HTTP through the one
registry client (`schema/registry_client.py`). Failures: a registry that cannot answer raises
`RegistryUnavailableError` (the pass fails and is retried; a worker fails its task, never writes an
`__err__` row); `SchemaNotFoundError` is a fact about the data (the driver treats the side as raw, a worker
writes the payload's `__err__` row).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from icelog.meta.registry import RegistryStore
from icelog.schema.compiled import CompiledSchema
from icelog.schema.registry_client import (
    CompiledCache,
    LatestSchema,
    RegistryClient,
    RegistryUnavailableError,
    SchemaNotFoundError,
)


@dataclass(frozen=True)
class SourceSpec:
    """A picklable description of a schema source, shipped to Spark workers: ("store", meta url) or ("http", url)."""

    kind: str
    location: str


class SchemaSource(Protocol):
    """What the archive needs from a registry."""

    def latest(self, subject: str) -> LatestSchema | None:
        """The subject's latest schema, or None if the subject has no live version."""

    def versions(self, subject: str) -> list[int]:
        """Schema ids of every version of the subject (soft-deleted included), oldest first."""

    def by_id(self, schema_id: int) -> CompiledSchema:
        """The compiled schema with this id (SchemaNotFoundError, RegistryUnavailableError)."""


class StoreSchemaSource(CompiledCache):
    """The embedded registry's state, read from the metadata store (no HTTP, no broker process)."""

    def __init__(
        self, store: RegistryStore, compiled: dict[int, CompiledSchema] | None = None
    ) -> None:
        super().__init__(compiled)
        from icelog.schema.registry.service import RegistryService

        self.service = RegistryService(store)

    def latest(self, subject: str) -> LatestSchema | None:
        version = self.service.latest(subject)
        if version is None:
            return None
        return LatestSchema(subject, version.schema_id, version.version, self.by_id(version.schema_id))

    def versions(self, subject: str) -> list[int]:
        return [v.schema_id for v in self.service.store.registry_versions(subject)]

    def by_id(self, schema_id: int) -> CompiledSchema:
        from icelog.schema.registry.service import RegistryError

        found = self._by_id.get(schema_id)
        if found is None:
            try:  # the registry's own look-up: the stored text, its references, compiled
                found = self._by_id[schema_id] = self.service.compiled(schema_id)
            except RegistryError as exc:
                if exc.status == 404:
                    raise SchemaNotFoundError(f"schema id {schema_id} is not in the registry") from None
                raise
        return found


def open_source(spec: SourceSpec, store: RegistryStore | None = None) -> SchemaSource:
    """The schema source a spec names; a worker opens the metadata store itself (`store` None)."""
    if spec.kind == "http":
        return RegistryClient(spec.location)
    if store is None:
        from icelog.meta.backends import open_store

        try:
            store = open_store(spec.location)
        except Exception as exc:
            raise RegistryUnavailableError(f"metadata store {spec.location}: {exc}") from exc
    return StoreSchemaSource(store)
