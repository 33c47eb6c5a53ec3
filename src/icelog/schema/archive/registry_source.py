"""Where the archive reads Protobuf schemas: the metadata store (embedded registry) or an external registry.

With the embedded registry the archiver reads the registry's state from the metadata store directly, so
archiving needs no running broker. With `registry_url` it asks that registry over HTTP (stdlib urllib:
Spark workers need no extra client). Both compile what they read with protoc and cache by schema id
(ids never change what they name).

Two kinds of failure are kept apart, because they end differently:
  - `RegistryUnavailableError`: the registry could not answer (connection refused, timeout, 5xx). The
    pass fails and is retried; a worker that sees it fails its task, never writes an `__err__` row.
  - `SchemaNotFoundError`: the registry answered that the id or subject does not exist. That is a fact
    about the data: the driver treats the side as raw, a worker writes the payload's `__err__` row.
"""

from __future__ import annotations

import json
import logging
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol
from urllib.parse import quote

from google.protobuf import descriptor_pb2

from icelog.errors import IcelogError
from icelog.schema.protobuf_schema import compile_schema

log = logging.getLogger(__name__)

_HTTP_TIMEOUT_S = 10


class RegistryUnavailableError(IcelogError):
    """The schema registry could not be asked (retry later); never a property of the data."""


class SchemaNotFoundError(IcelogError):
    """The registry answered: no such schema id (or subject)."""


@dataclass(frozen=True)
class LatestSchema:
    """The latest registered version of a subject, compiled."""

    subject: str
    schema_id: int
    version: int
    fds: descriptor_pb2.FileDescriptorSet


@dataclass(frozen=True)
class SourceSpec:
    """A picklable description of a schema source, shipped to Spark workers: ("store", meta url) or ("http", url)."""

    kind: str
    location: str


class SchemaSource(Protocol):
    """What the archive needs from a registry."""

    def latest(self, subject: str) -> LatestSchema | None:
        """The subject's latest Protobuf schema, or None if the subject has no live version."""

    def versions(self, subject: str) -> list[int]:
        """Schema ids of every version of the subject (soft-deleted included), oldest first."""

    def by_id(self, schema_id: int) -> descriptor_pb2.FileDescriptorSet:
        """The compiled schema with this id (SchemaNotFoundError, RegistryUnavailableError)."""


class _Compiled:
    """A compile cache by schema id, shared by both sources."""

    def __init__(self, compiled: dict[int, descriptor_pb2.FileDescriptorSet] | None) -> None:
        self._by_id = compiled if compiled is not None else {}

    def _cached(
        self, schema_id: int, text: Callable[[], tuple[str, dict[str, str]]]
    ) -> descriptor_pb2.FileDescriptorSet:
        fds = self._by_id.get(schema_id)
        if fds is None:
            schema, references = text()
            fds = self._by_id[schema_id] = compile_schema(schema, references)
        return fds


class StoreSchemaSource(_Compiled):
    """The embedded registry's state, read from the metadata store (no HTTP, no broker process)."""

    def __init__(self, store: Any, compiled: dict[int, descriptor_pb2.FileDescriptorSet] | None = None) -> None:
        super().__init__(compiled)
        from icelog.schema.registry.service import RegistryService

        self.service = RegistryService(store)

    def latest(self, subject: str) -> LatestSchema | None:
        version = self.service.latest(subject)
        if version is None:
            return None
        record = self.service.store.registry_schema(version.schema_id)
        if record is None or record.schema_type.upper() != "PROTOBUF":
            return None
        return LatestSchema(subject, version.schema_id, version.version, self.by_id(version.schema_id))

    def versions(self, subject: str) -> list[int]:
        return [v.schema_id for v in self.service.store.registry_versions(subject)]

    def by_id(self, schema_id: int) -> descriptor_pb2.FileDescriptorSet:
        from icelog.schema.registry.service import RegistryError

        fds = self._by_id.get(schema_id)
        if fds is None:
            try:  # the registry's own look-up: the stored text, its references, compiled
                fds = self._by_id[schema_id] = self.service.compiled(schema_id)
            except RegistryError as exc:
                if exc.status == 404:
                    raise SchemaNotFoundError(f"schema id {schema_id} is not in the registry") from None
                raise
        return fds


class HttpSchemaSource(_Compiled):
    """An external Confluent-compatible registry (`registry_url`), over HTTP."""

    def __init__(
        self,
        url: str,
        compiled: dict[int, descriptor_pb2.FileDescriptorSet] | None = None,
        version_ids: dict[tuple[str, int], int] | None = None,
    ) -> None:
        super().__init__(compiled)
        self.url = url.rstrip("/")
        # (subject, version) → schema id never changes either: one request per new version, not per pass.
        self._version_ids = version_ids if version_ids is not None else {}

    def _get(self, path: str) -> Any:
        """The JSON body, or None on 404; RegistryUnavailableError when the registry cannot answer."""
        try:
            with urllib.request.urlopen(self.url + path, timeout=_HTTP_TIMEOUT_S) as response:
                return json.loads(response.read())
        except urllib.error.HTTPError as exc:
            if exc.code == 404:
                return None
            raise RegistryUnavailableError(f"schema registry {self.url}{path}: HTTP {exc.code}") from None
        except (OSError, ValueError) as exc:  # refused, timeout, DNS, a body that is not JSON
            raise RegistryUnavailableError(f"schema registry {self.url} unreachable: {exc}") from None

    def latest(self, subject: str) -> LatestSchema | None:
        body = self._get(f"/subjects/{quote(subject, safe='')}/versions/latest")
        if body is None:
            return None
        if str(body.get("schemaType") or "AVRO").upper() != "PROTOBUF":
            log.warning("subject %s holds a %s schema; only Protobuf is decoded", subject, body.get("schemaType"))
            return None
        schema_id = int(body["id"])
        fds = self._cached(schema_id, lambda: (body["schema"], self._references(body.get("references"))))
        return LatestSchema(subject, schema_id, int(body["version"]), fds)

    def versions(self, subject: str) -> list[int]:
        numbers = self._get(f"/subjects/{quote(subject, safe='')}/versions?deleted=true") or []
        ids = []
        for number in numbers:
            known = self._version_ids.get((subject, int(number)))
            if known is None:
                body = self._get(f"/subjects/{quote(subject, safe='')}/versions/{int(number)}?deleted=true")
                if body is None:
                    continue
                known = self._version_ids[(subject, int(number))] = int(body["id"])
            ids.append(known)
        return ids

    def by_id(self, schema_id: int) -> descriptor_pb2.FileDescriptorSet:
        def text() -> tuple[str, dict[str, str]]:
            body = self._get(f"/schemas/ids/{schema_id}")
            if body is None:
                raise SchemaNotFoundError(f"schema id {schema_id} is not in the registry at {self.url}")
            return body["schema"], self._references(body.get("references"))

        return self._cached(schema_id, text)

    def _references(self, refs: Any) -> dict[str, str]:
        out: dict[str, str] = {}
        pending = list(refs or [])
        while pending:
            ref = pending.pop()
            if ref["name"] in out:
                continue
            body = self._get(f"/subjects/{quote(ref['subject'], safe='')}/versions/{int(ref['version'])}")
            if body is None:
                raise SchemaNotFoundError(f"reference {ref['name']} ({ref['subject']} v{ref['version']}) not found")
            out[ref["name"]] = body["schema"]
            pending.extend(body.get("references") or [])
        return out


def open_source(spec: SourceSpec, store: Any = None) -> SchemaSource:
    """The schema source a spec names; a worker opens the metadata store itself (`store` None)."""
    if spec.kind == "http":
        return HttpSchemaSource(spec.location)
    if store is None:
        from icelog.meta.store import open_store

        try:
            store = open_store(spec.location)
        except Exception as exc:
            raise RegistryUnavailableError(f"metadata store {spec.location}: {exc}") from exc
    return StoreSchemaSource(store)
