"""The conformance suite (``contextfold.store.conformance``) on contextfold's own backends:
the suite's fixtures, and the places they are built on — every backend, each store of its own.

- ``memory_place``: ``sqlite-file`` (a file in the test's ``tmp_path``), ``sqlite-memory``
  (``":memory:"``: each store opened is a separate, empty database) and ``postgres`` (a new
  database of the test's own on the session's real server, ``postgres_url``);
- ``shared_memory_place``: the backends several store objects (processes) can share:
  ``sqlite-file`` and ``postgres``;
- ``document_place``, ``graph_place``: ``sqlite`` (a file in ``tmp_path``, so two store
  objects share it, as two processes would) and ``postgres``.

Stores are opened through ``open_memory_store`` / ``open_document_store`` /
``open_graph_store``, the way the engine, the index and the server open theirs. The test
modules here import the suite's modules (their tests run here, unchanged) and add the tests
of one backend only.
"""

from __future__ import annotations

import sqlite3
import uuid
from pathlib import Path

import pytest

pytest.register_assert_rewrite("contextfold.store.conformance")

from contextfold.store import open_document_store, open_graph_store  # noqa: E402
from contextfold.store.conformance.fixtures import *  # noqa: E402, F403
from contextfold.store.conformance.fixtures import Place  # noqa: E402

_POSTGRES = pytest.param("postgres", id="postgres")

#: Every backend, each store of its own.
ALL_BACKENDS = [
    pytest.param("sqlite-file", id="sqlite-file"),
    pytest.param("sqlite-memory", id="sqlite-memory"),
    _POSTGRES,
]
#: The backends several store objects (processes) can share: ``open_store``.
SHARED_BACKENDS = [pytest.param("sqlite-file", id="sqlite-file"), _POSTGRES]
#: The document store's and the graph's backends.
BACKENDS = ["sqlite", "postgres"]


def _postgres_url(request: pytest.FixtureRequest) -> str:
    url: str = request.getfixturevalue("postgres_url")  # starts the server only for these
    return url


def _memory_location(backend: str, request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if backend == "sqlite-file":
        return str(tmp_path / f"memory-{uuid.uuid4().hex[:8]}.db")
    if backend == "sqlite-memory":
        return ":memory:"
    return _postgres_url(request)


def _integrity_error(backend: str) -> type[Exception]:
    """The error a write breaking a uniqueness or reference rule raises on ``backend``."""
    if backend == "sqlite":
        return sqlite3.IntegrityError
    import psycopg

    return psycopg.IntegrityError


@pytest.fixture(params=ALL_BACKENDS)
def memory_place(request: pytest.FixtureRequest, tmp_path: Path) -> Place:
    return Place(request.param, _memory_location(request.param, request, tmp_path))


@pytest.fixture(params=SHARED_BACKENDS)
def shared_memory_place(request: pytest.FixtureRequest, tmp_path: Path) -> Place:
    return Place(request.param, _memory_location(request.param, request, tmp_path))


@pytest.fixture(params=BACKENDS)
def document_place(request: pytest.FixtureRequest, tmp_path: Path) -> Place:
    backend = request.param
    where = str(tmp_path / "docs.db") if backend == "sqlite" else _postgres_url(request)
    return Place(backend, where, open_document_store, _integrity_error(backend))


@pytest.fixture(params=BACKENDS)
def graph_place(request: pytest.FixtureRequest, tmp_path: Path) -> Place:
    backend = request.param
    where = str(tmp_path / "graph.db") if backend == "sqlite" else _postgres_url(request)
    return Place(backend, where, open_graph_store, _integrity_error(backend))
