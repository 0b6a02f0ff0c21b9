"""The knowledge graph in PostgreSQL: typed nodes and weighted edges per tenant, shared by
every process and host that opens the same database (``GraphStorage``).

The tables mirror the SQLite graph's (``contextfold.store.sqlite.graph``). Node ids come from
the sequence ``graph_node_ids``, which never goes back: a deleted node's id is never assigned
again, and a node stored under an explicit id moves the sequence past it (SQLite's
``AUTOINCREMENT``). Every write first bumps ``graph_meta.version``: that one row lock orders
the graph's writers (so an explicit id and an assigned one can never race to the same
number), and any store object reading the version before ``view`` drops a cached view
exactly when someone, anywhere, changed the graph. Auto-linking, views and node embeddings
are ``GraphBase``'s, shared with SQLite, so both backends answer alike.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

from contextfold.errors import ConfigError
from contextfold.store.graph_models import (
    EDGE_ORDER,
    EdgeType,
    GraphBase,
    KnowledgeEdge,
    KnowledgeNode,
    NodeType,
    node_fields,
)
from contextfold.store.postgres.pool import PgMigrationRegistry, Pooled, masked

__all__ = ["MIGRATIONS", "PostgresGraph"]

MIGRATIONS = PgMigrationRegistry("graph")

_NODE_COLUMNS = "id, tenant_id, node_type, title, summary, content, tags"


@MIGRATIONS.migration
def m001_create_graph(conn: Any) -> None:
    conn.execute("CREATE SEQUENCE graph_node_ids")
    conn.execute(
        "CREATE TABLE graph_nodes ("
        " id BIGINT PRIMARY KEY DEFAULT nextval('graph_node_ids'),"
        " tenant_id TEXT NOT NULL, node_type TEXT NOT NULL, title TEXT NOT NULL,"
        " summary TEXT, content TEXT NOT NULL DEFAULT '{}', tags TEXT NOT NULL DEFAULT '[]')"
    )
    conn.execute("ALTER SEQUENCE graph_node_ids OWNED BY graph_nodes.id")
    conn.execute("CREATE INDEX graph_nodes_by_tenant ON graph_nodes (tenant_id, node_type)")
    conn.execute(
        "CREATE TABLE graph_edges ("
        " source_id BIGINT NOT NULL REFERENCES graph_nodes(id) ON DELETE CASCADE,"
        " target_id BIGINT NOT NULL REFERENCES graph_nodes(id) ON DELETE CASCADE,"
        " edge_type TEXT NOT NULL,"
        " weight DOUBLE PRECISION NOT NULL DEFAULT 1.0 CHECK (weight > 0 AND weight <= 1),"
        " CHECK (source_id <> target_id),"
        " PRIMARY KEY (source_id, target_id, edge_type))"
    )
    conn.execute("CREATE INDEX graph_edges_by_target ON graph_edges (target_id)")
    conn.execute("CREATE TABLE graph_meta (key TEXT PRIMARY KEY, value BIGINT NOT NULL)")
    conn.execute("INSERT INTO graph_meta (key, value) VALUES ('version', 0)")


def _node(row: Sequence[Any]) -> KnowledgeNode:
    return KnowledgeNode(
        id=int(row[0]),
        tenant_id=row[1],
        node_type=NodeType(row[2]),
        title=row[3],
        summary=row[4],
        content=json.loads(row[5]),
        tags=json.loads(row[6]),
    )


def _tenants(tenant_ids: Iterable[str] | None) -> list[str] | None:
    return None if tenant_ids is None else sorted(set(tenant_ids))


class PostgresGraph(GraphBase):
    """Knowledge nodes and edges in a PostgreSQL database (``url``: ``postgresql://…``).

    Adding a node with an id already stored replaces its fields and keeps its edges; adding
    an edge that exists (same source, target and type) replaces its weight.
    """

    def __init__(self, url: str, *, max_connections: int = 4) -> None:
        self.path = masked(url)
        self._db = Pooled(url, max_size=max_connections)
        try:
            with self._db.connection() as conn:
                MIGRATIONS.apply(conn)
        except BaseException:
            self._db.close()
            raise
        self._lock = threading.RLock()
        self._init_caches()

    def close(self) -> None:
        self._db.close()

    def _all(self, sql: str, params: Sequence[Any] = ()) -> list[Any]:
        with self._db.connection() as conn:
            return conn.execute(sql, params).fetchall()

    def _change_stamp(self) -> tuple[int, int]:
        version = self._all("SELECT value FROM graph_meta WHERE key = 'version'")[0][0]
        return (int(version), self._writes)

    @contextmanager
    def _write(self) -> Iterator[Any]:
        """A transaction (joining this thread's open one) that first takes the graph's write
        lock by bumping the version."""
        try:
            with self._db.transaction() as conn:
                conn.execute("UPDATE graph_meta SET value = value + 1 WHERE key = 'version'")
                yield conn
        finally:
            self._changed()

    @contextmanager
    def connection(self) -> Iterator[Any]:
        """A connection for a store keeping its own tables in the same database: this
        thread's open transaction's (its statements join it), else one from the pool."""
        with self._db.connection() as conn:
            yield conn

    @contextmanager
    def transaction(self) -> Iterator[Any]:
        """One transaction over several writes of this thread: the graph's own join it, and
        so do statements run on the (psycopg) connection it yields. All commit at the end,
        or none does."""
        with self._write() as conn:
            yield conn

    # -- writing ---------------------------------------------------------------------------

    def add_nodes(self, nodes: Iterable[KnowledgeNode | Mapping[str, Any]]) -> list[KnowledgeNode]:
        """Store many nodes in one transaction (``id`` may be left out: the sequence assigns
        one)."""
        prepared = node_fields(nodes)
        stored: list[KnowledgeNode] = []
        with self._write() as conn:
            for node, given in prepared:
                fields = (
                    node.tenant_id,
                    node.node_type.value,
                    node.title,
                    node.summary,
                    json.dumps(node.content, ensure_ascii=False),
                    json.dumps(node.tags, ensure_ascii=False),
                )
                if given is None:  # no ON CONFLICT: an assigned id never overwrites a node
                    row = conn.execute(
                        "INSERT INTO graph_nodes (tenant_id, node_type, title, summary,"
                        " content, tags) VALUES (%s, %s, %s, %s, %s, %s) RETURNING id",
                        fields,
                    ).fetchone()
                else:
                    row = conn.execute(
                        "INSERT INTO graph_nodes (id, tenant_id, node_type, title, summary,"
                        " content, tags) VALUES (%s, %s, %s, %s, %s, %s, %s)"
                        " ON CONFLICT (id) DO UPDATE SET tenant_id = excluded.tenant_id,"
                        " node_type = excluded.node_type, title = excluded.title,"
                        " summary = excluded.summary, content = excluded.content,"
                        " tags = excluded.tags RETURNING id",
                        (given, *fields),
                    ).fetchone()
                    conn.execute(  # the sequence moves past it: never assigned again
                        "SELECT setval('graph_node_ids', %s) FROM graph_node_ids WHERE %s >"
                        " CASE WHEN is_called THEN last_value ELSE last_value - 1 END",
                        (given, given),
                    )
                stored.append(node.model_copy(update={"id": int(row[0])}))
        return stored

    def add_edges(self, edges: Iterable[KnowledgeEdge]) -> list[KnowledgeEdge]:
        """Store many edges in one transaction; both ends must exist."""
        stored = [edge.normalized() for edge in edges]
        ends = {i for edge in stored for i in (edge.source_id, edge.target_id)}
        latest = {(e.source_id, e.target_id, e.edge_type.value): e.weight for e in stored}
        with self._write() as conn:
            missing = ends - self._existing(conn, ends)
            if missing:
                raise ConfigError(
                    f"edges name nodes that do not exist: {sorted(missing)}; add the nodes first"
                )
            if latest:
                conn.execute(
                    "INSERT INTO graph_edges (source_id, target_id, edge_type, weight)"
                    " SELECT * FROM unnest(%s::bigint[], %s::bigint[], %s::text[],"
                    " %s::float8[]) ON CONFLICT (source_id, target_id, edge_type)"
                    " DO UPDATE SET weight = excluded.weight",
                    [
                        [k[0] for k in latest],
                        [k[1] for k in latest],
                        [k[2] for k in latest],
                        list(latest.values()),
                    ],
                )
        return stored

    @staticmethod
    def _existing(conn: Any, ids: Iterable[int]) -> set[int]:
        wanted = list(ids)
        if not wanted:
            return set()
        rows = conn.execute(
            "SELECT id FROM graph_nodes WHERE id = ANY(%s::bigint[])", (wanted,)
        ).fetchall()
        return {int(r[0]) for r in rows}

    def remove_nodes(
        self, node_ids: Iterable[int], *, tenant_ids: Iterable[str] | None = None
    ) -> int:
        """Delete many nodes and their edges in one transaction; how many existed (of
        ``tenant_ids``, when given: the check and the delete are one statement)."""
        ids = list(dict.fromkeys(node_ids))
        tenants = _tenants(tenant_ids)
        with self._write() as conn:
            if not ids:
                return 0
            sql = "DELETE FROM graph_nodes WHERE id = ANY(%s::bigint[])"
            params: list[Any] = [ids]
            if tenants is not None:
                sql += " AND tenant_id = ANY(%s::text[])"
                params.append(tenants)
            return int(conn.execute(sql, params).rowcount)

    def remove_edge(
        self,
        source_id: int,
        target_id: int,
        edge_type: EdgeType | str = EdgeType.RELATED,
        *,
        tenant_ids: Iterable[str] | None = None,
    ) -> bool:
        """Delete one edge (either orientation for undirected types); False when absent, or
        when ``tenant_ids`` is given and an end of it belongs to none of them."""
        kind = EdgeType(edge_type)
        if kind.undirected:
            source_id, target_id = min(source_id, target_id), max(source_id, target_id)
        tenants = _tenants(tenant_ids)
        sql = "DELETE FROM graph_edges WHERE source_id = %s AND target_id = %s AND edge_type = %s"
        params: list[Any] = [source_id, target_id, kind.value]
        if tenants is not None:
            sql += (
                " AND source_id IN (SELECT id FROM graph_nodes WHERE tenant_id = ANY(%s::text[]))"
                " AND target_id IN (SELECT id FROM graph_nodes WHERE tenant_id = ANY(%s::text[]))"
            )
            params += [tenants, tenants]
        with self._write() as conn:
            return int(conn.execute(sql, params).rowcount) > 0

    def _link(self, pairs: list[tuple[int, int]], kind: EdgeType, weights: list[float]) -> int:
        with self._write() as conn:
            if not pairs:
                return 0
            cursor = conn.execute(
                "INSERT INTO graph_edges (source_id, target_id, edge_type, weight)"
                " SELECT a, b, %s, w FROM unnest(%s::bigint[], %s::bigint[], %s::float8[])"
                " AS t(a, b, w) ON CONFLICT DO NOTHING",
                [kind.value, [a for a, _ in pairs], [b for _, b in pairs], weights],
            )
            return max(int(cursor.rowcount), 0)

    # -- reading ---------------------------------------------------------------------------

    def get_node(self, node_id: int) -> KnowledgeNode | None:
        rows = self._all(f"SELECT {_NODE_COLUMNS} FROM graph_nodes WHERE id = %s", (node_id,))
        return _node(rows[0]) if rows else None

    def get_nodes(self, node_ids: Iterable[int]) -> list[KnowledgeNode]:
        """The stored nodes among ``node_ids``, by id (unknown ids are left out)."""
        ids = list(dict.fromkeys(node_ids))
        if not ids:
            return []
        rows = self._all(
            f"SELECT {_NODE_COLUMNS} FROM graph_nodes WHERE id = ANY(%s::bigint[]) ORDER BY id",
            (ids,),
        )
        return [_node(r) for r in rows]

    def existing(self, node_ids: Iterable[int]) -> set[int]:
        with self._db.connection() as conn:
            return self._existing(conn, node_ids)

    def tenant_counts(self) -> dict[str, int]:
        rows = self._all(
            "SELECT tenant_id, count(*) FROM graph_nodes GROUP BY tenant_id"
            ' ORDER BY tenant_id COLLATE "C"'
        )
        return {str(r[0]): int(r[1]) for r in rows}

    def nodes(
        self,
        *,
        tenant_ids: Iterable[str] | None = None,
        node_types: Iterable[NodeType | str] | None = None,
    ) -> list[KnowledgeNode]:
        sql, params = f"SELECT {_NODE_COLUMNS} FROM graph_nodes WHERE TRUE", []
        tenants = _tenants(tenant_ids)
        if tenants is not None:
            sql += " AND tenant_id = ANY(%s::text[])"
            params.append(tenants)
        if node_types is not None:
            sql += " AND node_type = ANY(%s::text[])"
            params.append(sorted({NodeType(t).value for t in node_types}))
        return [_node(r) for r in self._all(sql + " ORDER BY id", params)]

    def edges(self, *, tenant_ids: Iterable[str] | None = None) -> list[KnowledgeEdge]:
        sql = "SELECT e.source_id, e.target_id, e.edge_type, e.weight FROM graph_edges e"
        params: list[Any] = []
        tenants = _tenants(tenant_ids)
        if tenants is not None:
            sql += (
                " JOIN graph_nodes s ON s.id = e.source_id JOIN graph_nodes t ON t.id = e.target_id"
                " WHERE s.tenant_id = ANY(%s::text[]) AND t.tenant_id = ANY(%s::text[])"
            )
            params = [tenants, tenants]
        return sorted(
            (
                KnowledgeEdge(
                    source_id=int(r[0]),
                    target_id=int(r[1]),
                    edge_type=EdgeType(r[2]),
                    weight=float(r[3]),
                )
                for r in self._all(sql, params)
            ),
            key=lambda e: (e.source_id, e.target_id, EDGE_ORDER[e.edge_type]),
        )
