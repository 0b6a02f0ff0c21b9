"""The context API's document catalogue in PostgreSQL: one row per loaded document, in the
knowledge graph's database and transactions (``CatalogueStorage``)."""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from typing import Any

from contextfold.store.document_models import CatalogueEntry
from contextfold.store.postgres.graph import PostgresGraph
from contextfold.store.postgres.pool import PgMigrationRegistry

__all__ = ["MIGRATIONS", "PostgresCatalogue"]

MIGRATIONS = PgMigrationRegistry("context_api_documents")

_COLUMNS = "tenant_id, document_id, title, node_type, node_ids, tokens, metadata, created_at"


@MIGRATIONS.migration
def m001_create_documents(conn: Any) -> None:
    conn.execute(
        "CREATE TABLE api_documents ("
        " tenant_id TEXT NOT NULL, document_id TEXT NOT NULL, title TEXT NOT NULL,"
        " node_type TEXT NOT NULL, node_ids TEXT NOT NULL, tokens INTEGER NOT NULL,"
        " metadata TEXT NOT NULL DEFAULT '{}', created_at TEXT NOT NULL,"
        " PRIMARY KEY (tenant_id, document_id))"
    )


def _entry(row: Sequence[Any]) -> CatalogueEntry:
    return CatalogueEntry(
        tenant_id=row[0],
        document_id=row[1],
        title=row[2],
        node_type=row[3],
        node_ids=[int(i) for i in json.loads(row[4])],
        tokens=int(row[5]),
        metadata=json.loads(row[6]),
        created_at=row[7],
    )


class PostgresCatalogue:
    """The catalogue on ``graph``'s connections: its statements join ``graph.transaction()``."""

    def __init__(self, graph: PostgresGraph) -> None:
        self.graph = graph
        with graph.connection() as conn:
            MIGRATIONS.apply(conn)

    def close(self) -> None:
        self.graph.close()

    def get(self, tenant_id: str, document_id: str) -> CatalogueEntry | None:
        with self.graph.connection() as conn:
            row = conn.execute(
                f"SELECT {_COLUMNS} FROM api_documents WHERE tenant_id = %s AND document_id = %s",
                (tenant_id, document_id),
            ).fetchone()
        return None if row is None else _entry(row)

    def entries(self, tenant_ids: Iterable[str] | None = None) -> list[CatalogueEntry]:
        sql, params = f"SELECT {_COLUMNS} FROM api_documents", []
        if tenant_ids is not None:
            sql += " WHERE tenant_id = ANY(%s::text[])"
            params.append(sorted(set(tenant_ids)))
        sql += ' ORDER BY tenant_id COLLATE "C", document_id COLLATE "C"'
        with self.graph.connection() as conn:
            rows = conn.execute(sql, params).fetchall()
        return [_entry(row) for row in rows]

    def insert(self, entry: CatalogueEntry) -> None:
        with self.graph.transaction() as conn:
            conn.execute(
                f"INSERT INTO api_documents ({_COLUMNS}) VALUES (%s, %s, %s, %s, %s, %s, %s, %s)",
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
                "DELETE FROM api_documents WHERE tenant_id = %s AND document_id = %s",
                (tenant_id, document_id),
            )
            return int(cursor.rowcount) > 0

    def counts(self) -> dict[str, int]:
        with self.graph.connection() as conn:
            rows = conn.execute(
                "SELECT tenant_id, count(*) FROM api_documents GROUP BY tenant_id"
                ' ORDER BY tenant_id COLLATE "C"'
            ).fetchall()
        return {str(r[0]): int(r[1]) for r in rows}
