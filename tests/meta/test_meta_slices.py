"""The metadata store's slices are real: they cover the whole interface, each method in one slice, every
backend implements them all, and the layers take a slice, not the whole store."""

from __future__ import annotations

import inspect
import re
from pathlib import Path
from typing import Protocol

from icelog.meta.store import MetadataStore

SRC = Path(__file__).resolve().parents[2] / "src" / "icelog"


def slices() -> list[type]:
    return [base for base in MetadataStore.__bases__ if base is not Protocol]


def test_every_store_method_is_in_exactly_one_slice() -> None:
    """A new method must be placed in the slice of the data it keeps, not on MetadataStore itself."""
    own = [n for n, value in vars(MetadataStore).items() if inspect.isfunction(value) and not n.startswith("__")]
    assert own == [], f"declare these in a slice: {own}"
    seen: dict[str, str] = {}
    for piece in slices():
        assert getattr(piece, "_is_protocol", False), f"{piece.__name__} is not a Protocol"
        for name in piece.__abstractmethods__:
            assert name not in seen, f"{name} is in both {seen[name]} and {piece.__name__}"
            seen[name] = piece.__name__
    assert set(seen) == set(MetadataStore.__abstractmethods__)


def test_every_backend_implements_every_slice(store: MetadataStore) -> None:
    assert not type(store).__abstractmethods__
    for piece in slices():
        assert isinstance(store, piece), f"{type(store).__name__} lacks {piece.__name__}"


def test_the_layers_take_slices_not_the_whole_store() -> None:
    """Only the assemblers (broker, CLI) and the store's own package handle the whole MetadataStore."""
    whole = re.compile(r"\bMetadataStore\b")
    offenders = [
        str(path.relative_to(SRC))
        for package in ("log", "coordinator", "archive", "schema", "readback", "wire", "lake", "table")
        for path in sorted((SRC / package).rglob("*.py"))
        if whole.search(path.read_text())
    ]
    assert offenders == []
