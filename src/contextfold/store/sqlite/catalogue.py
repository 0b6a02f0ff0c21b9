"""The context API's document catalogue in SQLite: one row per loaded document, in the
knowledge graph's own file and transactions (``CatalogueStorage``)."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterable

from contextfold.store.document_models import CatalogueEntry
from contextfold.store.sqlite import MigrationRegistry
from contextfold.store.sqlite.graph import KnowledgeGraph

__all__ = ["MIGRATIONS", "SqliteCatalogue"]

MIGRATIONS = MigrationRegistry("context_api_documents")


@MIGRATIONS.migration
def m001_create_documents(conn: sqlite3.Connection) -> None:
    conn.execute(
        "CREATE TABLE api_documents ("
        " tenant_id TEXT NOT NULL, document_id TEXT NOT NULL, title TEXT NOT NULL,"
        " node_type TEXT NOT NULL, node_ids TEXT NOT NULL, tokens INTEGER NOT NULL,"
        " metadata TEXT NOT NULL DEFAULT '{}', created_at TEXT NOT NULL,"
        " PRIMARY KEY (tenant_id, document_id))"
    )


def _entry(row: sqlite3.Row) -> CatalogueEntry:
    return CatalogueEntry(
        tenant_id=row["tenant_id"],
        document_id=row["document_id"],
        title=row["title"],
        node_type=row["node_type"],
        node_ids=[int(i) for i in json.loads(row["node_ids"])],
        tokens=int(row["tokens"]),
        metadata=json.loads(row["metadata"]),
        created_at=row["created_at"],
    )


class SqliteCatalogue:
    """The catalogue on ``graph``'s connection: its statements join ``graph.transaction()``."""

    def __init__(self, graph: KnowledgeGraph) -> None:
        self.graph = graph
        with graph.connection() as conn:
            MIGRATIONS.apply(conn)

    def close(self) -> None:
        self.graph.close()

    def get(self, tenant_id: str, document_id: str) -> CatalogueEntry | None:
        with self.graph.connection() as conn:
            row = conn.execute(
                "SELECT * FROM api_documents WHERE tenant_id = ? AND document_id = ?",
                (tenant_id, document_id),
            ).fetchone()
        return None if row is None else _entry(row)

    def entries(self, tenant_ids: Iterable[str] | None = None) -> list[CatalogueEntry]:
        sql, params = "SELECT * FROM api_documents", []
        if tenant_ids is not None:
            tenants = sorted(set(tenant_ids))
            if not tenants:
                return []
            sql += f" WHERE tenant_id IN ({','.join('?' * len(tenants))})"
            params = tenants
        with self.graph.connection() as conn:
            rows = conn.execute(sql + " ORDER BY tenant_id, document_id", params).fetchall()
        return [_entry(row) for row in rows]

    def insert(self, entry: CatalogueEntry) -> None:
        with self.graph.transaction() as conn:
            conn.execute(
                "INSERT INTO api_documents (tenant_id, document_id, title, node_type,"
                " node_ids, tokens, metadata, created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    entry.tenant_id,
                    entry.document_id,
                    entry.title,
                    entry.node_type,
                    json.dumps(entry.node_ids),
                    entry.tokens,
                    json.dumps(entry.metadata, ensure_ascii=False),
                    entry.created_at,
                ),
            )

    def delete(self, tenant_id: str, document_id: str) -> bool:
        with self.graph.transaction() as conn:
            cursor = conn.execute(
                "DELETE FROM api_documents WHERE tenant_id = ? AND document_id = ?",
                (tenant_id, document_id),
            )
            return cursor.rowcount > 0

    def counts(self) -> dict[str, int]:
        with self.graph.connection() as conn:
            rows = conn.execute(
                "SELECT tenant_id, count(*) FROM api_documents GROUP BY tenant_id"
                " ORDER BY tenant_id"
            ).fetchall()
        return {str(r[0]): int(r[1]) for r in rows}
