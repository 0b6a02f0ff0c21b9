"""The fixtures of the conformance suite, built on the places a test suite provides.

A *place* (``Place``) is where one test's store lives on one backend and how to open a store
object there: ``open(location)`` (memory stores: ``open(location, counter=...)``). A test suite
defines, parametrised over its backends (the parameter's id names the backend in test ids):

- ``memory_place`` — every backend's memory store; each test gets a new, empty one (a store
  opened again on a ``":memory:"`` place is another, empty database);
- ``shared_memory_place`` — the backends whose memory store several store objects (several
  processes) can open at once;
- ``document_place`` and ``graph_place`` — the document store and the knowledge graph (with
  its catalogue) on each backend, shared by the store objects a test opens.

From those the suite's tests take:

- ``store_factory``: ``store_factory(counter=...)`` opens a memory store at ``memory_place``;
  ``memory_store``: one of them (``CharCounter`` counts its tokens);
- ``open_store``: ``open_store()`` opens another store object on the ``shared_memory_place``
  each call (another process's view); ``open_store.location`` is where it lives (a child
  process opens it with ``open_memory_store``);
- ``docs_opener`` / ``graph_opener``: ``opener()`` opens another document store / graph on
  the test's place; ``opener.location``, ``opener.backend`` and ``opener.integrity_error``
  (the error a write breaking a uniqueness or reference rule raises) come from the place.

Every store opened through them is closed when the test ends.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from contextfold.store import open_memory_store
from contextfold.store.conformance.documents_support import Opener
from contextfold.store.conformance.memory_support import StoreFactory
from contextfold.store.protocols import MemoryStorage

__all__ = ["Place", "docs_opener", "graph_opener", "memory_store", "open_store", "store_factory"]


@dataclass(frozen=True)
class Place:
    """Where a test's store lives on ``backend``, and how to open a store object there."""

    backend: str
    location: str
    open: Callable[..., Any] = open_memory_store
    integrity_error: type[Exception] = Exception


@pytest.fixture
def store_factory(memory_place: Place) -> Iterator[StoreFactory]:
    factory = StoreFactory(memory_place.backend, memory_place.location, memory_place.open)
    yield factory
    factory.close()


@pytest.fixture
def memory_store(store_factory: StoreFactory) -> MemoryStorage:
    """A new, empty store on each backend (``CharCounter`` counts its tokens)."""
    return store_factory()


@pytest.fixture
def open_store(shared_memory_place: Place) -> Iterator[StoreFactory]:
    """``open_store()``: another store object on one shared location, on each backend that
    several processes can share."""
    place = shared_memory_place
    factory = StoreFactory(place.backend, place.location, place.open)
    yield factory
    factory.close()


@pytest.fixture
def docs_opener(document_place: Place) -> Iterator[Opener]:
    place = document_place
    opener = Opener(place.open, place.location, place.backend, place.integrity_error)
    yield opener
    opener.close()


@pytest.fixture
def graph_opener(graph_place: Place) -> Iterator[Opener]:
    place = graph_place
    opener = Opener(place.open, place.location, place.backend, place.integrity_error)
    yield opener
    opener.close()
