"""Storage: the interfaces every store implements (``protocols``), the values they exchange
(``models``), and one package per backend — ``sqlite`` (the embedded default) and
``postgres`` (many processes and hosts sharing one database).

``open_memory_store`` picks the backend from where the store lives: a ``postgresql://`` URL
opens PostgreSQL, anything else is an SQLite file (or ``":memory:"``).

>>> from contextfold.tokens import CharCounter
>>> store = open_memory_store(":memory:", counter=CharCounter())
>>> type(store).__module__
'contextfold.store.sqlite.memory'
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlsplit, urlunsplit

if TYPE_CHECKING:
    from contextfold.store.protocols import (
        CatalogueStorage,
        DocumentStorage,
        GraphStorage,
        MemoryStorage,
    )
    from contextfold.tokens import TokenCounter

__all__ = [
    "STORE_URL_ENV",
    "describe_store",
    "is_database_url",
    "masked_location",
    "open_catalogue",
    "open_document_store",
    "open_graph_store",
    "open_memory_store",
    "store_url",
]

#: The environment variable that points every process at one shared store.
STORE_URL_ENV = "CONTEXTFOLD_STORE_URL"

_SCHEMES = ("postgresql://", "postgres://")


def is_database_url(location: str | Path) -> bool:
    """Whether ``location`` names a database server rather than an SQLite file."""
    return str(location).startswith(_SCHEMES)


def masked_location(location: str | Path) -> str:
    """``location`` fit to print: a database URL's password replaced by ``***``.

    >>> masked_location("postgresql://app:s3cret@db.internal:5432/memory")
    'postgresql://app:***@db.internal:5432/memory'
    >>> masked_location("/var/lib/contextfold/memory.db")
    '/var/lib/contextfold/memory.db'
    """
    text = str(location)
    if not is_database_url(text):
        return text
    parts = urlsplit(text)
    if parts.password is None:
        return text
    netloc = f"{parts.username}:***@{parts.hostname}" + (f":{parts.port}" if parts.port else "")
    return urlunsplit(parts._replace(netloc=netloc))


def store_url(configured: str | Path | None) -> str | Path | None:
    """Where memory lives: ``$CONTEXTFOLD_STORE_URL`` when set, else ``configured``."""
    return os.environ.get(STORE_URL_ENV) or configured


def describe_store(configured: str | Path | None) -> str:
    """Where memory lives, fit to print (a password masked; the default when nothing is
    configured).

    >>> describe_store(None)
    '$CONTEXTFOLD_HOME/memory.db'
    """
    where = store_url(configured)
    return masked_location(where) if where else "$CONTEXTFOLD_HOME/memory.db"


def open_memory_store(
    location: str | Path = ":memory:", *, counter: TokenCounter | None = None
) -> MemoryStorage:
    """The conversation-memory store at ``location``: PostgreSQL for a ``postgresql://`` URL
    (``contextfold[postgres]``), else SQLite (a file path, its folder made, or ``":memory:"``)."""
    if is_database_url(location):
        from contextfold.store.postgres.memory import PostgresMemoryStore

        store: MemoryStorage = PostgresMemoryStore(str(location), counter=counter)
        return store
    from contextfold.store.sqlite.memory import MemoryStore

    if str(location) != ":memory:":
        Path(location).parent.mkdir(parents=True, exist_ok=True)
    return MemoryStore(location, counter=counter)


def open_document_store(location: str | Path = ":memory:") -> DocumentStorage:
    """The document store (documents, chunks, vectors) at ``location``: PostgreSQL for a
    ``postgresql://`` URL (``contextfold[postgres]``), else SQLite (a file path, its folder
    made, or ``":memory:"``).

    >>> open_document_store(":memory:").version
    0
    """
    if is_database_url(location):
        from contextfold.store.postgres.documents import PostgresDocumentStore

        return PostgresDocumentStore(str(location))
    from contextfold.store.sqlite.documents import DocumentStore

    return DocumentStore(location)


def open_graph_store(location: str | Path = ":memory:") -> GraphStorage:
    """The knowledge graph at ``location``: PostgreSQL for a ``postgresql://`` URL, else
    SQLite (a file path, its folder made, or ``":memory:"``).

    >>> open_graph_store(":memory:").add_node("t", "faq", "Refunds").id
    1
    """
    if is_database_url(location):
        from contextfold.store.postgres.graph import PostgresGraph

        return PostgresGraph(str(location))
    from contextfold.store.sqlite.graph import KnowledgeGraph

    return KnowledgeGraph(location)


def open_catalogue(location: str | Path = ":memory:") -> CatalogueStorage:
    """The context API's document catalogue with its knowledge graph (``.graph``) at
    ``location``: PostgreSQL for a ``postgresql://`` URL, else SQLite — one file or
    database for both, so a document's nodes and its entry commit together.

    >>> open_catalogue(":memory:").graph.nodes()
    []
    """
    if is_database_url(location):
        from contextfold.store.postgres.catalogue import PostgresCatalogue
        from contextfold.store.postgres.graph import PostgresGraph

        pg = PostgresGraph(str(location))
        try:
            return PostgresCatalogue(pg)
        except BaseException:
            pg.close()
            raise
    from contextfold.store.sqlite.catalogue import SqliteCatalogue
    from contextfold.store.sqlite.graph import KnowledgeGraph

    graph = KnowledgeGraph(location)
    try:
        return SqliteCatalogue(graph)
    except BaseException:
        graph.close()
        raise
