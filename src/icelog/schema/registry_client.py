"""A Confluent-compatible schema registry over HTTP: the one client the archive and produce-time enforcement use.

Sync, stdlib urllib (Spark workers need no extra client; the broker calls it from a thread). What it reads
is compiled (schema/compiled.py: protoc, fastavro or jsonschema) and cached by schema id (ids never change
what they name).

Two kinds of failure are kept apart, because they end differently:
  - `RegistryUnavailableError`: the registry could not answer (connection refused, timeout, 5xx). An
    archive pass fails and is retried; a produce gets a broker-side error, never a bad-record one.
  - `SchemaNotFoundError`: the registry answered that the id or subject does not exist. That is a fact
    about the data.
"""

from __future__ import annotations

import json
import logging
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

from icelog.errors import IcelogError
from icelog.schema.compiled import AVRO, CompiledSchema, compile_any

log = logging.getLogger(__name__)

_HTTP_TIMEOUT_S = 10


class RegistryUnavailableError(IcelogError):
    """The schema registry could not be asked (retry later); never a property of the data."""

    retriable = True


class SchemaNotFoundError(IcelogError):
    """The registry answered: no such schema id (or subject)."""


@dataclass(frozen=True)
class LatestSchema:
    """The latest registered version of a subject, compiled."""

    subject: str
    schema_id: int
    version: int
    schema: CompiledSchema


class CompiledCache:
    """A compile cache by schema id (shared by every schema source)."""

    def __init__(self, compiled: dict[int, CompiledSchema] | None) -> None:
        self._by_id = compiled if compiled is not None else {}

    def _cached(self, schema_id: int, text: Callable[[], tuple[str, str, dict[str, str]]]) -> CompiledSchema:
        """The compiled schema of an id; `text` gives (schema type, schema text, references) when not cached."""
        found = self._by_id.get(schema_id)
        if found is None:
            schema_type, schema, references = text()
            found = self._by_id[schema_id] = compile_any(schema_type, schema, references)
        return found


class RegistryClient(CompiledCache):
    """A Confluent-compatible registry (`registry_url`, or the embedded one's REST address), over HTTP."""

    def __init__(
        self,
        url: str,
        compiled: dict[int, CompiledSchema] | None = None,
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
        schema_id = int(body["id"])
        compiled = self._cached(
            schema_id, lambda: (_schema_type(body), body["schema"], self._references(body.get("references")))
        )
        return LatestSchema(subject, schema_id, int(body["version"]), compiled)

    def latest_id(self, subject: str) -> int | None:
        """The schema id of the subject's latest version (any schema type), or None if it has none."""
        body = self._get(f"/subjects/{quote(subject, safe='')}/versions/latest")
        return None if body is None else int(body["id"])

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

    def by_id(self, schema_id: int) -> CompiledSchema:
        def text() -> tuple[str, str, dict[str, str]]:
            body = self._get(f"/schemas/ids/{schema_id}")
            if body is None:
                raise SchemaNotFoundError(f"schema id {schema_id} is not in the registry at {self.url}")
            return _schema_type(body), body["schema"], self._references(body.get("references"))

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


def _schema_type(body: Any) -> str:
    """A schema's type in a registry answer: absent means AVRO (Confluent omits it for Avro)."""
    return str(body.get("schemaType") or AVRO).upper()
