"""The conformance suite of the storage Protocols (``store/protocols.py``,
``store/facets.py``): what every backend must do, as pytest tests that run unchanged against
each one.

Imported only by tests (it needs pytest; ``import contextfold`` never loads it). The suite is
modules of tests and their fixtures:

- ``memory_*.py`` — the memory store (``MemoryStorage`` and its facets): sessions and turns,
  search, tags and vectors, compaction, branches and jobs, the derive, tag counts, the
  vocabulary, and properties over drawn histories (``memory_properties``: Hypothesis);
- ``documents.py`` — the document store (``DocumentStorage``);
- ``graph.py`` — the knowledge graph and its catalogue (``GraphStorage``,
  ``CatalogueStorage``);
- ``fixtures.py`` — the fixtures the tests take (``memory_store``, ``store_factory``,
  ``open_store``, ``docs_opener``, ``graph_opener``, …), built on the *places* a test suite
  provides: where each backend's store lives, one fixture per kind of store
  (``memory_place``, ``shared_memory_place``, ``document_place``, ``graph_place``);
- ``memory_support.py``, ``documents_support.py``, ``vocab_support.py``, ``histories.py`` —
  their data and helpers (``histories``: the message lists the properties draw).

A test suite runs it by importing the fixtures into its ``conftest.py``, defining the place
fixtures (parametrised over its backends) and importing each test module into a test module of
its own (``tests/store/`` does this for SQLite and PostgreSQL; docs/deployment.md shows a
backend of another package doing it)::

    # conftest.py
    import pytest

    pytest.register_assert_rewrite("contextfold.store.conformance")

    from contextfold.store.conformance.fixtures import *  # noqa: F403
    from contextfold.store.conformance.fixtures import Place


    @pytest.fixture(params=["mine"])
    def memory_place(request, tmp_path):
        return Place(request.param, str(tmp_path / "memory"), open=open_my_store)

    # test_memory_sessions.py
    from contextfold.store.conformance.memory_sessions import *  # noqa: F403
"""
