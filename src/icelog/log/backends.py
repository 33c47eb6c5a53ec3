"""The intake backends by `intake.url`: the one place that knows every backend (as meta/backends.py for the store)
and the one place an intake location is built."""

from __future__ import annotations

from pathlib import Path

from icelog.config import Settings
from icelog.log.intake import IntakeFiles
from icelog.log.local import LocalStorage
from icelog.log.s3 import ObjectReader, ObjectStorage
from icelog.log.storage import IntakeReader, IntakeStorage
from icelog.meta.store import IntakeIndex


def intake_directory(settings: Settings) -> Path:
    """The local backend's directory."""
    return Path(settings.data_dir).resolve() / "intake"


def clustered(settings: Settings) -> bool:
    """Whether this broker is one of a cluster (issue 46): its intake on object storage and its metadata in
    PostgreSQL, the two things several brokers can share. Alone or not, such a broker registers and leads what it
    serves (a cluster of one)."""
    return settings.intake.url is not None and settings.metadata_url.startswith(("postgresql:", "postgres:"))


def open_storage(settings: Settings, index: IntakeIndex) -> IntakeStorage:
    """The backend `settings` name (intake.url: s3://… for object storage, else files in the data dir)."""
    if settings.intake.url is not None:
        return ObjectStorage(settings.intake.url, index, settings.intake)
    return LocalStorage(intake_directory(settings), index, settings.intake)


def open_reader(settings: Settings) -> IntakeReader:
    """A reader of the intake `settings` name, for a process other than the broker's (the archiver, its tasks)."""
    if settings.intake.url is not None:
        return ObjectReader(settings.intake.url)
    return IntakeFiles(intake_directory(settings))
