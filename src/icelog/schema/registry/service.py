"""The schema registry's logic over the metadata store, in Confluent's terms and with its error codes.

Synchronous and store-backed, so the REST server (in threads), produce-time enforcement and the
archiver can all use it. Compiled schemas are cached by id: ids are immutable.
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
import zlib
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from google.protobuf import descriptor_pb2

from icelog.errors import IcelogError
from icelog.meta.registry import RegistryConflictError, RegistrySchema, RegistryStore, SchemaReference, SubjectVersion
from icelog.schema.compiled import AVRO, PROTOBUF, SCHEMA_TYPES, CompiledSchema, canonical, compile_any
from icelog.schema.protobuf_schema import InvalidSchemaError, serialized_main
from icelog.schema.registry import compat

_MAX_VERSION = 2**31 - 1
_COMPILED_CACHE_SIZE = 1024
_REGISTER_ATTEMPTS = 5
_MAX_PARSER_MESSAGE = 500
_ID_TEXT = re.compile(r"[0-9]{1,10}")
_SUBJECT_LOCKS = 64  # registrations of one subject are serialised; of different subjects mostly not


class RegistryError(IcelogError):
    """A registry request fails; `status` and `error_code` are Confluent's."""

    def __init__(self, status: int, error_code: int, message: str) -> None:
        super().__init__(message)
        self.status, self.error_code, self.message = status, error_code, message


def subject_not_found(subject: str) -> RegistryError:
    return RegistryError(404, 40401, f"Subject '{subject}' not found.")


def version_not_found(subject: str, version: int | str) -> RegistryError:
    return RegistryError(404, 40402, f"Version {version} not found for subject '{subject}'.")


def schema_not_found(detail: str = "Schema not found") -> RegistryError:
    return RegistryError(404, 40403, detail)


def invalid_schema(message: str) -> RegistryError:
    return RegistryError(422, 42201, f"Invalid schema: {message}")


@dataclass(frozen=True)
class SchemaInput:
    """A schema as a client submits it."""

    schema: str
    schema_type: str = AVRO  # Confluent's default: AvroSerializer's requests name no type
    references: tuple[SchemaReference, ...] = ()

    @classmethod
    def from_json(cls, body: object) -> SchemaInput:
        """Parse a register/lookup/compatibility request body (42201 when malformed)."""
        if not isinstance(body, dict) or not isinstance(body.get("schema"), str):
            raise RegistryError(422, 42201, "Invalid schema: the body needs a 'schema' string")
        if not _is_utf8(body["schema"]):
            raise invalid_schema("the schema is not valid Unicode text (a lone surrogate)")
        given = body.get("references")
        if given is None:
            given = []
        if not isinstance(given, list):
            raise invalid_schema("'references' must be a list")
        refs = []
        for i, ref in enumerate(given):
            name = ref.get("name") if isinstance(ref, dict) else None
            subject = ref.get("subject") if isinstance(ref, dict) else None
            version = ref.get("version") if isinstance(ref, dict) else None
            if isinstance(version, str) and _ID_TEXT.fullmatch(version):
                version = int(version)  # "1", as Jackson's coercion accepts
            if not (isinstance(name, str) and isinstance(subject, str) and _is_utf8(name) and _is_utf8(subject)
                    and isinstance(version, int) and not isinstance(version, bool) and 1 <= version <= _MAX_VERSION):
                raise invalid_schema(
                    f"reference {i} must be an object with a 'name' and a 'subject' string and a 'version' "
                    f"between 1 and {_MAX_VERSION}"
                )
            refs.append(SchemaReference(name, subject, version))
        schema_type = body.get("schemaType") or AVRO
        if not isinstance(schema_type, str) or not _is_utf8(schema_type):
            raise invalid_schema(f"'schemaType' must be one of {', '.join(SCHEMA_TYPES)}")
        return cls(body["schema"], schema_type.upper(), tuple(refs))


def _is_utf8(text: str) -> bool:
    # json.loads turns "\ud800" into a lone surrogate, which no store or file can hold.
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _quote(text: str, limit: int = 40) -> str:
    """Client input for a message, bounded."""
    return text if len(text) <= limit else text[:limit] + "..."


def fingerprint(schema_type: str, compiled: CompiledSchema, refs: Sequence[SchemaReference]) -> str:
    """Identity of a schema: equal texts, their serialized forms and formatting variants share it."""
    digest = hashlib.sha256(schema_type.encode())
    digest.update(canonical(compiled))
    digest.update(json.dumps(sorted((r.name, r.subject, r.version) for r in refs)).encode())
    return digest.hexdigest()


def parse_version(version: str | int) -> int | None:
    """A version path segment: a positive int, or None for latest ('latest' or -1); 42202 otherwise."""
    text = str(version)
    if text in ("latest", "-1"):
        return None
    # ASCII digits only: str.isdigit() accepts '²', which int() refuses.
    if _ID_TEXT.fullmatch(text) is None or not 1 <= int(text) <= _MAX_VERSION:
        raise RegistryError(
            422, 42202,
            f"The specified version '{_quote(text)}' is not a valid version id. Allowed values are between "
            f"[1, {_MAX_VERSION}] and the string \"latest\"",
        )
    return int(text)


def parse_schema_id(text: str) -> int:
    """A schema id path segment (40403 unless it is an id that can exist)."""
    if _ID_TEXT.fullmatch(text) is None or not 1 <= int(text) <= _MAX_VERSION:
        raise schema_not_found(f"Schema {_quote(text)} not found")
    return int(text)


class RegistryService:
    """Confluent Schema Registry semantics over a RegistryStore."""

    def __init__(self, store: RegistryStore) -> None:
        self.store = store
        self._compiled: OrderedDict[int, CompiledSchema] = OrderedDict()
        self._lock = threading.Lock()
        self._subject_locks = tuple(threading.Lock() for _ in range(_SUBJECT_LOCKS))

    # -- schemas -------------------------------------------------------------------------------
    def schema(self, schema_id: int) -> RegistrySchema:
        """The schema with this id (40403 if unknown or no longer in any subject)."""
        record = self.store.registry_schema(schema_id)
        if record is None or not self.store.registry_versions_of_schema(schema_id):
            raise schema_not_found(f"Schema {schema_id} not found")
        return record

    def resolve_references(self, refs: Sequence[SchemaReference]) -> dict[str, str]:
        """Import name -> schema text for every reference, transitively (42201 if one is missing)."""
        out: dict[str, str] = {}
        pending = list(refs)
        while pending:
            ref = pending.pop()
            if ref.name in out:
                continue
            found = [v for v in self.store.registry_versions(ref.subject) if v.version == ref.version]
            if not found:
                raise invalid_schema(
                    f"reference {_quote(ref.name)} -> {_quote(ref.subject)} version {ref.version} not found"
                )
            record = self.store.registry_schema(found[0].schema_id)
            assert record is not None
            out[ref.name] = record.schema
            pending.extend(record.references)
        return out

    def compile(self, schema_type: str, schema: str, refs: Sequence[SchemaReference]) -> CompiledSchema:
        """Compile a schema with its references (42201 with the parser's message when it does not compile)."""
        try:
            return compile_any(schema_type, schema, self.resolve_references(refs))
        except InvalidSchemaError as exc:
            raise invalid_schema(_quote(str(exc), _MAX_PARSER_MESSAGE)) from None  # may quote the schema
        except RecursionError:
            raise invalid_schema("the schema is nested too deeply") from None

    def _compat_check(self, level: str, compiled: CompiledSchema, against: Sequence[CompiledSchema]) -> list[str]:
        try:
            return compat.check(level, compiled, against)
        except RecursionError:
            raise invalid_schema("the schema is nested too deeply") from None

    def _fingerprint(self, given: SchemaInput, compiled: CompiledSchema) -> str:
        try:
            return fingerprint(given.schema_type, compiled, given.references)
        except RecursionError:
            raise invalid_schema("the schema is nested too deeply") from None

    def compiled(self, schema_id: int) -> CompiledSchema:
        """A registered schema, compiled (cached: ids are immutable)."""
        with self._lock:
            found = self._compiled.get(schema_id)
            if found is not None:
                self._compiled.move_to_end(schema_id)
                return found
        record = self.store.registry_schema(schema_id)
        if record is None:
            raise schema_not_found(f"Schema {schema_id} not found")
        compiled = self.compile(record.schema_type.upper(), record.schema, record.references)
        with self._lock:
            self._compiled[schema_id] = compiled
            while len(self._compiled) > _COMPILED_CACHE_SIZE:
                self._compiled.popitem(last=False)
        return compiled

    def is_compiled(self, schema_id: int) -> bool:
        """Whether the compiled form of a schema is cached (then serving it costs no protoc run)."""
        with self._lock:
            return schema_id in self._compiled

    def schema_text(self, record: RegistrySchema, fmt: str | None) -> str:
        """The schema as stored, or for Protobuf with fmt=serialized as a base64 FileDescriptorProto."""
        if fmt == "serialized" and record.schema_type.upper() == PROTOBUF:
            compiled = self.compiled(record.schema_id)
            assert isinstance(compiled, descriptor_pb2.FileDescriptorSet)
            return serialized_main(compiled)
        return record.schema

    # -- subjects and versions -----------------------------------------------------------------
    def subjects(self, deleted: bool = False, prefix: str = "") -> list[str]:
        """Subjects with a live version (with deleted=True also those with only soft-deleted ones)."""
        names = {v.subject for v in self.store.registry_versions() if deleted or not v.deleted}
        return sorted(n for n in names if n.startswith(prefix))

    def versions(self, subject: str, deleted: bool = False) -> list[SubjectVersion]:
        """A subject's versions (40401 if it has none, counting soft-deleted ones only with deleted=True)."""
        versions = [v for v in self.store.registry_versions(subject) if deleted or not v.deleted]
        if not versions:
            raise subject_not_found(subject)
        return versions

    def version(self, subject: str, version: str | int, deleted: bool = False) -> SubjectVersion:
        """One version of a subject by number or 'latest' (40401, 40402, 42202)."""
        number = parse_version(version)
        everything = self.store.registry_versions(subject)
        if not any(deleted or not v.deleted for v in everything):
            raise subject_not_found(subject)
        live = [v for v in everything if deleted or not v.deleted]
        if number is None:
            return live[-1]
        for v in live:
            if v.version == number:
                return v
        raise version_not_found(subject, number)

    def latest(self, subject: str) -> SubjectVersion | None:
        """The latest live version of a subject, or None."""
        live = [v for v in self.store.registry_versions(subject) if not v.deleted]
        return live[-1] if live else None

    # -- register, look up, check --------------------------------------------------------------
    def _check_type(self, given: SchemaInput) -> None:
        if given.schema_type not in SCHEMA_TYPES:
            raise RegistryError(
                422, 42201,
                f"Invalid schema: unknown schemaType {_quote(given.schema_type)}; one of {', '.join(SCHEMA_TYPES)}",
            )

    def register(self, subject: str, given: SchemaInput) -> SubjectVersion:
        """Register a schema under a subject after the compatibility check (409 if incompatible)."""
        self._check_type(given)
        compiled = self.compile(given.schema_type, given.schema, given.references)
        print_ = self._fingerprint(given, compiled)
        # One registration of a subject at a time in this process, so concurrent compatible ones all succeed
        # instead of failing the store's check that the latest version did not change meanwhile.
        with self._subject_locks[zlib.crc32(subject.encode("utf-8", "surrogatepass")) % _SUBJECT_LOCKS]:
            return self._register(subject, given, compiled, print_)

    def _register(self, subject: str, given: SchemaInput, compiled: CompiledSchema, print_: str) -> SubjectVersion:
        for _ in range(_REGISTER_ATTEMPTS):
            live = self.versions_or_empty(subject)
            same = self.store.registry_schema_by_fingerprint(print_)
            if same is not None:
                for v in live:
                    if v.schema_id == same.schema_id:
                        return v
            against = [self.compiled(v.schema_id) for v in live]
            problems = self._compat_check(self.compatibility(subject), compiled, against)
            if problems:
                raise RegistryError(
                    409, 409,
                    f"Schema being registered is incompatible with an earlier schema for subject \"{subject}\", "
                    f"details: {problems}",
                )
            try:
                return self.store.registry_add_version(
                    subject, given.schema_type, given.schema, given.references, print_,
                    live[-1].version if live else None,
                )
            except RegistryConflictError:
                continue  # someone registered meanwhile: check against the new latest
        raise RegistryError(500, 50001, f"subject '{subject}' keeps changing; retry the registration")

    def versions_or_empty(self, subject: str) -> list[SubjectVersion]:
        """Live versions of a subject, oldest first (empty if none)."""
        return [v for v in self.store.registry_versions(subject) if not v.deleted]

    def lookup(self, subject: str, given: SchemaInput, deleted: bool = False) -> tuple[SubjectVersion, RegistrySchema]:
        """The version of a subject that holds this schema (40401 no subject, 40403 not in it)."""
        self._check_type(given)
        everything = [v for v in self.store.registry_versions(subject) if deleted or not v.deleted]
        if not everything:
            raise subject_not_found(subject)
        compiled = self.compile(given.schema_type, given.schema, given.references)
        record = self.store.registry_schema_by_fingerprint(self._fingerprint(given, compiled))
        if record is not None:
            for v in everything:
                if v.schema_id == record.schema_id:
                    return v, record
        raise schema_not_found()

    def test_compatibility(self, subject: str, version: str, given: SchemaInput) -> list[str]:
        """Why the schema could not be registered against `version` (or all, for transitive levels)."""
        self._check_type(given)
        compiled = self.compile(given.schema_type, given.schema, given.references)
        level = self.compatibility(subject)
        if parse_version(version) is None and level.endswith("_TRANSITIVE"):
            against = self.versions_or_empty(subject)
        else:
            against = [self.version(subject, version)] if self.versions_or_empty(subject) else []
        return self._compat_check(level, compiled, [self.compiled(v.schema_id) for v in against])

    # -- deletes -------------------------------------------------------------------------------
    def delete_subject(self, subject: str, permanent: bool) -> list[int]:
        """Soft-delete every live version, or (permanent) remove a soft-deleted subject's versions."""
        everything = self.store.registry_versions(subject)
        if not everything:
            raise subject_not_found(subject)
        live = [v.version for v in everything if not v.deleted]
        if permanent:
            if live:
                raise RegistryError(
                    404, 40405, f"Subject '{subject}' was not deleted first before being permanently deleted"
                )
            versions = [v.version for v in everything]
        else:
            if not live:
                raise RegistryError(
                    404, 40404, f"Subject '{subject}' was soft deleted.Set permanent=true to delete permanently"
                )
            versions = live
        self._refuse_if_referenced(subject, versions, permanent)
        self.store.registry_delete_versions(subject, versions, permanent)
        if permanent:
            self.store.registry_set_compatibility(subject, None)
        return versions

    def delete_version(self, subject: str, version: str, permanent: bool) -> int:
        """Soft-delete one version, or (permanent) remove a soft-deleted one."""
        target = self.version(subject, version, deleted=permanent)
        if permanent and not target.deleted:
            raise RegistryError(
                404, 40407,
                f"Subject '{subject}' Version {target.version} was not deleted first before being permanently deleted",
            )
        self._refuse_if_referenced(subject, [target.version], permanent)
        self.store.registry_delete_versions(subject, [target.version], permanent)
        return target.version

    def _refuse_if_referenced(self, subject: str, versions: Sequence[int], permanent: bool) -> None:
        """42206 if a schema imports one of these versions, as Confluent refuses.

        A soft delete is refused while a live version holds such a schema; a permanent one while any
        version does (a soft-deleted schema is still served by id, and must still compile).
        """
        wanted = set(versions)
        holders: dict[int, bool] = {}  # schema id -> held by a live version
        for v in self.store.registry_versions():
            holders[v.schema_id] = holders.get(v.schema_id, False) or not v.deleted
        for schema_id, live in holders.items():
            if not live and not permanent:
                continue
            record = self.store.registry_schema(schema_id)
            if record is None:
                continue
            for ref in record.references:
                if ref.subject == subject and ref.version in wanted:
                    raise RegistryError(
                        422, 42206,
                        f"One or more references exist to the schema {{subject={subject}, version={ref.version}}}.",
                    )

    # -- compatibility config ------------------------------------------------------------------
    def compatibility(self, subject: str | None) -> str:
        """The level in force for a subject: its own, else the global one, else BACKWARD."""
        level = self.store.registry_compatibility(subject) if subject is not None else None
        return level or self.store.registry_compatibility(None) or compat.DEFAULT_LEVEL

    def subject_compatibility(self, subject: str) -> str | None:
        """The level set on the subject itself, or None."""
        return self.store.registry_compatibility(subject)

    def set_compatibility(self, subject: str | None, level: object) -> str:
        """Set a subject's (or the global) level (42203 if it is not a level)."""
        if not isinstance(level, str) or level.upper() not in compat.LEVELS:
            raise RegistryError(422, 42203, f"Invalid compatibility level. Valid values are {list(compat.LEVELS)}")
        self.store.registry_set_compatibility(subject, level.upper())
        return level.upper()

    def delete_compatibility(self, subject: str | None) -> str:
        """Remove a subject's (or reset the global) level; return the level it had."""
        previous = self.compatibility(subject)
        self.store.registry_set_compatibility(subject, None)
        return previous

    # -- for enforcement and the archive --------------------------------------------------------
    def latest_schema_id(self, subject: str) -> int | None:
        """The schema id of a subject's latest live version, or None."""
        latest = self.latest(subject)
        return None if latest is None else latest.schema_id


def reference_json(refs: Sequence[SchemaReference]) -> list[dict[str, object]]:
    """References in Confluent's JSON shape."""
    return [{"name": r.name, "subject": r.subject, "version": r.version} for r in refs]


def schema_json(record: RegistrySchema, text: str, extra: Mapping[str, object] | None = None) -> dict[str, object]:
    """A schema in Confluent's JSON shape (schemaType is omitted for AVRO, as Confluent does)."""
    out: dict[str, object] = dict(extra or {})
    out["schema"] = text
    if record.schema_type != "AVRO":
        out["schemaType"] = record.schema_type
    if record.references:
        out["references"] = reference_json(record.references)
    return out
