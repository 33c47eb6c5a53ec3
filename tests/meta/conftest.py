"""The metadata store, once per backend: the fixtures of the behaviour suite (tests/meta)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from icelog.meta.store import MetadataStore

# A backend joins by one entry: a function from the test's request and temporary directory to the URL of a new,
# empty store; opening that URL twice must reach the same database. Every test that takes `store` or
# `open_same_store` runs per entry.
STORE_BACKENDS: dict[str, Callable[[pytest.FixtureRequest, Path], str]] = {
    "sqlite": lambda request, tmp: f"sqlite:///{tmp / 'meta.db'}",
    # A database per test on the session's throwaway server (tests/support/postgres.py; ~0.1 s each).
    "postgresql": lambda request, tmp: request.getfixturevalue("postgres_cluster").new_database(),
}

OpenStore = Callable[[], "MetadataStore"]


@pytest.fixture(params=sorted(STORE_BACKENDS))
def open_same_store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[OpenStore]:
    """Opens (or re-opens) the one database of this test; every store opened is closed afterwards."""
    from icelog.meta.backends import open_store

    url = STORE_BACKENDS[request.param](request, tmp_path)
    opened: list[MetadataStore] = []

    def open_() -> MetadataStore:
        opened.append(open_store(url))
        return opened[-1]

    yield open_
    for store in opened:
        store.close()  # closing twice is allowed (a test may have closed it already)


@pytest.fixture
def store(open_same_store: OpenStore) -> MetadataStore:
    """A new, empty metadata store of the backend under test."""
    return open_same_store()
