"""The SQLite backend of every store (the embedded default): conversation memory
(``memory.MemoryStore``), documents (``documents.DocumentStore``) and the knowledge graph
(``graph.GraphStore``), on the connection helpers of ``connection``."""

from contextfold.store.sqlite.connection import (
    FairLock,
    Migration,
    MigrationRegistry,
    connect,
    home_dir,
    select_in,
    transaction,
)

__all__ = [
    "FairLock",
    "Migration",
    "MigrationRegistry",
    "connect",
    "home_dir",
    "select_in",
    "transaction",
]
