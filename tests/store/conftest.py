"""The memory-store conformance fixtures: every test that takes ``memory_store``,
``store_factory`` or ``open_store`` runs once per backend, unchanged.

- ``memory_store``: a new, empty store, on each backend (``sqlite-file``: a file in the test's
  ``tmp_path``; ``sqlite-memory``: ``":memory:"``; ``postgres``: a new database of the test's
  own on the session's real server, ``postgres_url``).
- ``store_factory``: ``store_factory(counter=...)`` opens a store on the same backends; each
  call on ``sqlite-memory`` is a separate, empty database (it cannot be shared).
- ``open_store``: ``open_store()`` opens another store object on the SAME location each call
  (another process's view of the store), so only the backends that can be shared:
  ``sqlite-file`` and ``postgres``. ``open_store.location`` is where it lives (a child process
  opens it with ``open_memory_store``).

Every store opened here is closed when the test ends. Stores are opened through
``open_memory_store``, the same way the engine and the server open theirs, and the tests use
only the ``MemoryStorage`` Protocol's API.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from contextfold.store.protocols import MemoryStorage
from memory_support import StoreFactory

_POSTGRES = pytest.param("postgres", id="postgres")

#: Every backend, each store of its own.
ALL_BACKENDS = [
    pytest.param("sqlite-file", id="sqlite-file"),
    pytest.param("sqlite-memory", id="sqlite-memory"),
    _POSTGRES,
]
#: The backends several store objects (processes) can share: ``open_store``.
SHARED_BACKENDS = [pytest.param("sqlite-file", id="sqlite-file"), _POSTGRES]


def _location(backend: str, request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if backend == "sqlite-file":
        return str(tmp_path / f"memory-{uuid.uuid4().hex[:8]}.db")
    if backend == "sqlite-memory":
        return ":memory:"
    url: str = request.getfixturevalue("postgres_url")  # starts the server only for these
    return url


@pytest.fixture(params=ALL_BACKENDS)
def store_factory(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[StoreFactory]:
    factory = StoreFactory(request.param, _location(request.param, request, tmp_path))
    yield factory
    factory.close()


@pytest.fixture
def memory_store(store_factory: StoreFactory) -> MemoryStorage:
    """A new, empty store on each backend (``CharCounter`` counts its tokens)."""
    return store_factory()


@pytest.fixture(params=SHARED_BACKENDS)
def open_store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[StoreFactory]:
    """``open_store()``: another store object on one shared location, on each backend that
    several processes can share."""
    factory = StoreFactory(request.param, _location(request.param, request, tmp_path))
    yield factory
    factory.close()
