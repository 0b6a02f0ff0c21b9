"""Storage: the interfaces every store implements (``protocols``), the values they exchange
(``models``), and one package per backend — ``sqlite`` (the embedded default) and
``postgres`` (many processes and hosts sharing one database).

``open_memory_store`` picks the backend from where the store lives: a ``postgresql://`` URL
(``postgres://`` and ``postgresql+psycopg://`` too, any case) opens PostgreSQL, any other URL
is an error, anything else is an SQLite file (or ``":memory:"``).

>>> from contextfold.tokens import CharCounter
>>> store = open_memory_store(":memory:", counter=CharCounter())
>>> type(store).__module__
'contextfold.store.sqlite.memory'
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import TYPE_CHECKING

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
    "configured_location",
    "database_location",
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
#: A URL's scheme and the slash after it; two characters or more, so a drive letter (``C:/``)
#: is never one. One slash is enough: ``Path()`` collapses a URL's ``//`` into ``/``.
_URL = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]+):/")
#: The schemes that mean PostgreSQL: libpq's two and SQLAlchemy's ``postgresql+DRIVER``.
_POSTGRES = re.compile(r"^postgres(?:ql)?(?:\+[a-z0-9_]+)?$")
#: A URL up to its authority (``[user[:password]@]host[:port]``), and what follows it.
_AUTHORITY = re.compile(r"^(\s*[A-Za-z][A-Za-z0-9+.-]+:/{0,2})([^/?#]*)(.*)$", re.DOTALL)
_FORMS = (
    "name an SQLite file or a PostgreSQL URL, postgresql://USER:PASSWORD@HOST:PORT/DATABASE "
    "(postgres:// and postgresql+psycopg:// are read the same)"
)


def is_database_url(location: str | Path) -> bool:
    """Whether ``location`` is a PostgreSQL URL as psycopg reads it (``postgresql://`` or
    ``postgres://``) rather than an SQLite file. Other spellings of one (another case,
    ``postgresql+psycopg://``, white space around it) are not: ``database_location`` turns
    them into this one.

    >>> is_database_url("postgresql://app@db/memory"), is_database_url("memory.db")
    (True, False)
    """
    return str(location).startswith(_SCHEMES)


def _means_postgresql(text: str) -> bool:
    """Whether ``text`` (white space around it dropped) is a URL whose scheme means
    PostgreSQL: libpq's two, SQLAlchemy's ``postgresql+DRIVER``, in any case."""
    scheme, sep, _ = text.partition("://")
    return bool(sep) and _POSTGRES.match(scheme.lower()) is not None


def database_location(location: str | Path) -> str | Path:
    """``location`` as a store opens it: a PostgreSQL URL in the spelling psycopg reads
    (``postgresql://``, white space around it dropped), anything else that is not a URL as it
    is (an SQLite file or ``":memory:"``). Any other URL (``mysql://``, ``sqlite://``, a
    ``postgresql:/`` whose ``//`` was lost) raises ``ConfigError`` naming the supported forms,
    its password masked: it never becomes a file named after the URL.

    >>> database_location("postgres://app:s3cret@db/memory")
    'postgresql://app:s3cret@db/memory'
    >>> database_location("mysql://app:s3cret@db/memory")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    contextfold.errors.ConfigError: store 'mysql://app:***@db/memory': unsupported URL scheme ...
    """
    text = str(location).strip()
    if _means_postgresql(text):
        return "postgresql://" + text.partition("://")[2]
    url = _URL.match(text)
    if url is None:
        return location
    from contextfold.errors import ConfigError

    scheme = url.group(1).lower()
    shown = masked_location(text)
    if _POSTGRES.match(scheme):
        raise ConfigError(
            f"store {shown!r}: not a URL ({url.group(1)}: must be followed by //); {_FORMS}"
        )
    raise ConfigError(f"store {shown!r}: unsupported URL scheme {scheme!r}; {_FORMS}")


def configured_location(value: str, folder: str | Path | None = None) -> str:
    """A store location read from a config file, as ``database_location`` gives it; with
    ``folder`` (the file's own), a relative SQLite path is taken relative to it rather than to
    the current directory, so the file means the same wherever it is used from.

    >>> configured_location("memory.db", "/etc/contextfold"), configured_location(":memory:", "x")
    ('/etc/contextfold/memory.db', ':memory:')
    """
    where = str(database_location(value))
    if folder is None or not where.strip() or where == ":memory:" or is_database_url(where):
        return where
    return str(Path(folder) / where)  # an absolute ``where`` stays as it is


def masked_location(location: str | Path) -> str:
    """``location`` fit to print: a URL's password (in ``user:password@`` or a
    ``password=`` parameter) replaced by ``***``, the rest as it was written.

    >>> masked_location("postgresql://app:s3cret@db.internal:5432/memory")
    'postgresql://app:***@db.internal:5432/memory'
    >>> masked_location("/var/lib/contextfold/memory.db")
    '/var/lib/contextfold/memory.db'
    """
    text = str(location)
    parts = _AUTHORITY.match(text)
    if parts is None or _URL.match(text.strip()) is None:
        return text
    head, authority, rest = parts.groups()
    rest = re.sub(r"(?i)(\bpassword=)[^&#]*", r"\1***", rest)
    userinfo, at, host = authority.rpartition("@")
    if at and ":" in userinfo:
        authority = f"{userinfo.partition(':')[0]}:***@{host}"
    return head + authority + rest


def store_url(configured: str | Path | None) -> str | Path | None:
    """Where memory lives: ``$CONTEXTFOLD_STORE_URL`` when set, else ``configured``; a
    PostgreSQL URL in the spelling psycopg reads, and ``ConfigError`` for any other URL
    (``database_location``)."""
    from contextfold.errors import ConfigError

    env = os.environ.get(STORE_URL_ENV)
    if env and env.strip():
        try:
            return database_location(env)
        except ConfigError as exc:
            raise ConfigError(f"${STORE_URL_ENV}: {exc}") from None
    return database_location(configured) if configured else configured


def describe_store(configured: str | Path | None) -> str:
    """Where memory lives, fit to print (a password masked; the default when nothing is
    configured).

    >>> describe_store(None)
    '$CONTEXTFOLD_HOME/memory.db'
    """
    env = os.environ.get(STORE_URL_ENV)
    where = env if env and env.strip() else configured
    return masked_location(str(where).strip()) if where else "$CONTEXTFOLD_HOME/memory.db"


def open_memory_store(
    location: str | Path = ":memory:", *, counter: TokenCounter | None = None
) -> MemoryStorage:
    """The conversation-memory store at ``location``: PostgreSQL for a ``postgresql://`` URL
    (``contextfold[postgres]``), else SQLite (a file path, its folder made, or ``":memory:"``);
    any other URL is a ``ConfigError`` (``database_location``)."""
    location = database_location(location)
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
    location = database_location(location)
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
    location = database_location(location)
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
    location = database_location(location)
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
