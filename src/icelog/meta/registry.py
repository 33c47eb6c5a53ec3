"""The schema registry's part of the metadata store: schemas by global id, subject versions, compatibility.

Kept apart from `store.py` so the registry's records and methods read as one unit: `RegistryStore` is the
registry's slice of the metadata store; `MetadataStore` includes it and every backend implements it (each
method one atomic transaction).
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from icelog.errors import StoreError


@dataclass(frozen=True)
class SchemaReference:
    """An import of a schema: the import name, and the subject version that supplies it."""

    name: str
    subject: str
    version: int


@dataclass(frozen=True)
class RegistrySchema:
    """A registered schema. Ids are global and never reused; `fingerprint` identifies equal schemas."""

    schema_id: int
    schema_type: str
    schema: str
    references: tuple[SchemaReference, ...]
    fingerprint: str


@dataclass(frozen=True)
class SubjectVersion:
    """One version of a subject and the schema it holds; `deleted` marks a soft delete."""

    subject: str
    version: int
    schema_id: int
    deleted: bool = False


class RegistryConflictError(StoreError):
    """The subject gained a version since the caller read it (the compatibility check must be redone)."""


@runtime_checkable
class RegistryStore(Protocol):
    """Durable schema-registry state: schemas by global id, subject versions, compatibility levels."""

    @abstractmethod
    def registry_add_version(
        self, subject: str, schema_type: str, schema: str, references: Iterable[SchemaReference],
        fingerprint: str, expected_latest: int | None,
    ) -> SubjectVersion:
        """Register a schema under a subject and return its version.

        The schema gets the id of an existing schema with the same fingerprint, else a new id. If the
        subject already has a live version with that schema, that version is returned unchanged.
        Otherwise a new version (one past the highest, soft-deleted included) is added, provided the
        subject's latest live version is still `expected_latest` (None: none); else RegistryConflictError.
        """

    @abstractmethod
    def registry_schema(self, schema_id: int) -> RegistrySchema | None:
        """The schema with this id, or None."""

    @abstractmethod
    def registry_schema_by_fingerprint(self, fingerprint: str) -> RegistrySchema | None:
        """The schema with this fingerprint, or None."""

    @abstractmethod
    def registry_versions(self, subject: str | None = None) -> list[SubjectVersion]:
        """Versions (soft-deleted included) of one subject or of all, ordered by subject and version."""

    @abstractmethod
    def registry_versions_of_schema(self, schema_id: int) -> list[SubjectVersion]:
        """Every subject version (soft-deleted included) that holds this schema id."""

    @abstractmethod
    def registry_delete_versions(self, subject: str, versions: Iterable[int], permanent: bool) -> None:
        """Soft-delete (mark) or permanently delete (remove) versions of a subject."""

    @abstractmethod
    def registry_compatibility(self, subject: str | None) -> str | None:
        """The compatibility level set for a subject (None: the global one), or None if unset."""

    @abstractmethod
    def registry_set_compatibility(self, subject: str | None, level: str | None) -> None:
        """Set (or with None, remove) the compatibility level of a subject or, for subject None, the global one."""
