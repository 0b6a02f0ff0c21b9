"""The knowledge graph store: typed nodes and weighted edges per tenant, in SQLite.

Nodes carry a type (FAQ, playbook, permission rule, concept, schema index/field, example,
entity), a title, an optional summary, a JSON ``content`` object and tags. Edges are typed and
weighted in ``(0, 1]``; ``related``, ``shared_tag`` and ``similar`` edges are undirected and are
stored once, with the smaller node id as the source. Removing a node removes its edges.

Reads go through a ``GraphView``: the nodes of a set of tenants and the edges between them, as
an adjacency map built once and cached until the next write (by this object or by any other
connection to the same file). An edge between two tenants is part of a view only when both
tenants are — so a view never reaches outside the tenants it was asked for.

>>> graph = KnowledgeGraph()
>>> faq = graph.add_node("support", "faq", "How to process refunds", tags=["refunds"])
>>> flow = graph.add_node("support", "playbook", "Approval workflow", tags=["refunds"])
>>> graph.auto_link_shared_tags()
1
>>> [(hop.neighbor, hop.edge_type.value) for hop in graph.view(["support"]).neighbors(flow.id)]
[(1, 'shared_tag')]
"""

from __future__ import annotations

import json
import sqlite3
import threading
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from contextfold.errors import ConfigError
from contextfold.store.graph_models import (
    EDGE_ORDER,
    EdgeType,
    GraphBase,
    GraphView,
    Hop,
    KnowledgeEdge,
    KnowledgeNode,
    NodeType,
    node_fields,
    search_text,
)
from contextfold.store.sqlite import MigrationRegistry, connect, select_in, transaction

__all__ = [
    "MIGRATIONS",
    "EdgeType",
    "GraphView",
    "Hop",
    "KnowledgeEdge",
    "KnowledgeGraph",
    "KnowledgeNode",
    "NodeType",
    "search_text",
]

MIGRATIONS = MigrationRegistry("graph")


@MIGRATIONS.migration
def m001_create_graph(conn: sqlite3.Connection) -> None:
    conn.execute(
        "CREATE TABLE graph_nodes ("
        " id INTEGER PRIMARY KEY, tenant_id TEXT NOT NULL, node_type TEXT NOT NULL,"
        " title TEXT NOT NULL, summary TEXT, content TEXT NOT NULL DEFAULT '{}',"
        " tags TEXT NOT NULL DEFAULT '[]')"
    )
    conn.execute("CREATE INDEX graph_nodes_by_tenant ON graph_nodes (tenant_id, node_type)")
    conn.execute(
        "CREATE TABLE graph_edges ("
        " source_id INTEGER NOT NULL REFERENCES graph_nodes(id) ON DELETE CASCADE,"
        " target_id INTEGER NOT NULL REFERENCES graph_nodes(id) ON DELETE CASCADE,"
        " edge_type TEXT NOT NULL,"
        " weight REAL NOT NULL DEFAULT 1.0 CHECK (weight > 0 AND weight <= 1),"
        " CHECK (source_id <> target_id),"
        " PRIMARY KEY (source_id, target_id, edge_type))"
    )
    conn.execute("CREATE INDEX graph_edges_by_target ON graph_edges (target_id)")


@MIGRATIONS.migration
def m002_never_reuse_node_ids(conn: sqlite3.Connection) -> None:
    """``graph_nodes.id`` becomes ``AUTOINCREMENT``: an id, once assigned, is never assigned
    again, even after its node (or the node with the highest id) is deleted — so an id a
    client or a document still holds can never come to name someone else's node. SQLite
    adds ``AUTOINCREMENT`` only by rebuilding the table; the rows keep their ids and the
    counter starts at the highest id stored. The edges are set aside while the node table is
    rebuilt (dropping it would cascade-delete them) and then restored."""
    conn.execute("CREATE TEMP TABLE graph_edges_kept AS SELECT * FROM graph_edges")
    conn.execute("DROP TABLE graph_edges")
    conn.execute("ALTER TABLE graph_nodes RENAME TO graph_nodes_old")
    conn.execute("DROP INDEX graph_nodes_by_tenant")
    conn.execute(
        "CREATE TABLE graph_nodes ("
        " id INTEGER PRIMARY KEY AUTOINCREMENT, tenant_id TEXT NOT NULL,"
        " node_type TEXT NOT NULL, title TEXT NOT NULL, summary TEXT,"
        " content TEXT NOT NULL DEFAULT '{}', tags TEXT NOT NULL DEFAULT '[]')"
    )
    conn.execute(
        "INSERT INTO graph_nodes (id, tenant_id, node_type, title, summary, content, tags)"
        " SELECT id, tenant_id, node_type, title, summary, content, tags FROM graph_nodes_old"
    )  # explicit ids: SQLite sets the counter to the largest
    conn.execute("DROP TABLE graph_nodes_old")
    conn.execute("CREATE INDEX graph_nodes_by_tenant ON graph_nodes (tenant_id, node_type)")
    conn.execute(
        "CREATE TABLE graph_edges ("
        " source_id INTEGER NOT NULL REFERENCES graph_nodes(id) ON DELETE CASCADE,"
        " target_id INTEGER NOT NULL REFERENCES graph_nodes(id) ON DELETE CASCADE,"
        " edge_type TEXT NOT NULL,"
        " weight REAL NOT NULL DEFAULT 1.0 CHECK (weight > 0 AND weight <= 1),"
        " CHECK (source_id <> target_id),"
        " PRIMARY KEY (source_id, target_id, edge_type))"
    )
    conn.execute(
        "INSERT INTO graph_edges (source_id, target_id, edge_type, weight)"
        " SELECT source_id, target_id, edge_type, weight FROM temp.graph_edges_kept"
    )
    conn.execute("DROP TABLE temp.graph_edges_kept")
    conn.execute("CREATE INDEX graph_edges_by_target ON graph_edges (target_id)")


def _tenant_clause(column: str, tenant_ids: Iterable[str] | None) -> tuple[str, list[str]]:
    """``" AND column IN (?, …)"`` and its parameters; nothing when ``tenant_ids`` is None
    (every tenant). An empty ``tenant_ids`` matches no row."""
    if tenant_ids is None:
        return "", []
    tenants = sorted(set(tenant_ids))
    if not tenants:
        return " AND 0", []
    return f" AND {column} IN ({','.join('?' * len(tenants))})", tenants


class KnowledgeGraph(GraphBase):
    """Knowledge nodes and edges in one SQLite file (or ``":memory:"``).

    Node ids are integers, assigned by SQLite unless given, and never assigned twice: a
    deleted node's id stays retired (``m002_never_reuse_node_ids``). Adding a node with an id
    already stored replaces its fields and keeps its edges; adding an edge that exists (same
    source, target and type) replaces its weight.

    >>> graph = KnowledgeGraph()
    >>> a = graph.add_node("shop", "concept", "Refund")
    >>> b = graph.add_node("shop", "faq", "How long do refunds take?")
    >>> graph.add_edge(b.id, a.id, "related")
    KnowledgeEdge(source_id=1, target_id=2, edge_type=<EdgeType.RELATED: 'related'>, weight=1.0)
    >>> graph.remove_node(a.id), graph.edges()
    (True, [])
    """

    def __init__(self, path: str | Path = ":memory:") -> None:
        self.path = str(path)
        self._conn = connect(self.path)
        MIGRATIONS.apply(self._conn)
        self._lock = threading.RLock()
        self._init_caches()

    def close(self) -> None:
        self._conn.close()

    def _change_stamp(self) -> tuple[int, int]:
        """SQLite's ``data_version`` moves when another connection commits; our own writes
        are counted apart (``data_version`` does not see them)."""
        return (int(self._conn.execute("PRAGMA data_version").fetchone()[0]), self._writes)

    # -- writing ---------------------------------------------------------------------------

    @contextmanager
    def connection(self) -> Iterator[sqlite3.Connection]:
        """The graph's connection, under its lock, for a store keeping its own tables in the
        same file (its statements join an open ``transaction``)."""
        with self._lock:
            yield self._conn

    @contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        """One transaction over several writes: the graph's own (``add_nodes``,
        ``add_edges``, ``remove_nodes``, …) join it, and so do statements run on the
        connection it yields — a store keeping its own tables in the same file writes them
        in step with the nodes. Everything commits at the end, or nothing does (an exception,
        or the process dying, rolls all of it back). Holds the graph's lock throughout.

        >>> graph = KnowledgeGraph()
        >>> with graph.transaction():
        ...     a = graph.add_node("t", "faq", "A")
        ...     _ = graph.add_edge(a.id, graph.add_node("t", "faq", "B").id)
        >>> len(graph.edges())
        1
        """
        with self._lock:
            try:
                with transaction(self._conn) as conn:
                    yield conn
            finally:  # views built inside it may hold rows that were rolled back
                self._changed()

    def add_nodes(self, nodes: Iterable[KnowledgeNode | Mapping[str, Any]]) -> list[KnowledgeNode]:
        """Store many nodes in one transaction. Each is a ``KnowledgeNode`` or a mapping of
        its fields where ``id`` may be left out (SQLite assigns one)."""
        prepared = node_fields(nodes)
        stored: list[KnowledgeNode] = []
        with self._lock, transaction(self._conn) as conn:
            for node, given in prepared:
                row = conn.execute(
                    "INSERT INTO graph_nodes (id, tenant_id, node_type, title, summary, content,"
                    " tags) VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT (id) DO UPDATE SET"
                    " tenant_id = excluded.tenant_id, node_type = excluded.node_type,"
                    " title = excluded.title, summary = excluded.summary,"
                    " content = excluded.content, tags = excluded.tags RETURNING id",
                    (
                        given,
                        node.tenant_id,
                        node.node_type.value,
                        node.title,
                        node.summary,
                        json.dumps(node.content, ensure_ascii=False),
                        json.dumps(node.tags, ensure_ascii=False),
                    ),
                ).fetchone()
                stored.append(node.model_copy(update={"id": int(row[0])}))
            self._changed()
        return stored

    def add_edges(self, edges: Iterable[KnowledgeEdge]) -> list[KnowledgeEdge]:
        """Store many edges in one transaction; both ends must exist."""
        stored = [edge.normalized() for edge in edges]
        ends = {i for edge in stored for i in (edge.source_id, edge.target_id)}
        with self._lock, transaction(self._conn) as conn:
            missing = ends - self._existing(conn, ends)
            if missing:
                raise ConfigError(
                    f"edges name nodes that do not exist: {sorted(missing)}; add the nodes first"
                )
            conn.executemany(
                "INSERT INTO graph_edges (source_id, target_id, edge_type, weight)"
                " VALUES (?, ?, ?, ?) ON CONFLICT (source_id, target_id, edge_type)"
                " DO UPDATE SET weight = excluded.weight",
                [(e.source_id, e.target_id, e.edge_type.value, e.weight) for e in stored],
            )
            self._changed()
        return stored

    @staticmethod
    def _existing(conn: sqlite3.Connection, ids: Iterable[int]) -> set[int]:
        rows = select_in(conn, "SELECT id FROM graph_nodes WHERE id IN ({})", list(ids))
        return {int(r[0]) for r in rows}

    def remove_nodes(
        self, node_ids: Iterable[int], *, tenant_ids: Iterable[str] | None = None
    ) -> int:
        """Delete many nodes and their edges in one transaction; returns how many existed.
        With ``tenant_ids``, only the nodes of those tenants are deleted (and counted): the
        check and the delete are one statement, so no other write can slip between them."""
        ids = list(dict.fromkeys(node_ids))
        where, scope = _tenant_clause("tenant_id", tenant_ids)
        deleted = 0
        with self._lock, transaction(self._conn) as conn:
            for start in range(0, len(ids), 500):
                part = ids[start : start + 500]
                marks = ",".join("?" * len(part))
                cursor = conn.execute(
                    f"DELETE FROM graph_nodes WHERE id IN ({marks}){where}", [*part, *scope]
                )
                deleted += cursor.rowcount
            self._changed()
        return deleted

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
        where, scope = _tenant_clause("tenant_id", tenant_ids)
        ends = ""
        if where:
            ends = (
                f" AND source_id IN (SELECT id FROM graph_nodes WHERE 1 = 1{where})"
                f" AND target_id IN (SELECT id FROM graph_nodes WHERE 1 = 1{where})"
            )
        with self._lock, transaction(self._conn) as conn:
            deleted = conn.execute(
                "DELETE FROM graph_edges WHERE source_id = ? AND target_id = ? AND edge_type = ?"
                + ends,
                (source_id, target_id, kind.value, *scope, *scope),
            ).rowcount
            self._changed()
        return deleted > 0

    def _link(self, pairs: list[tuple[int, int]], kind: EdgeType, weights: list[float]) -> int:
        with self._lock, transaction(self._conn) as conn:
            added = conn.executemany(
                "INSERT OR IGNORE INTO graph_edges (source_id, target_id, edge_type, weight)"
                " VALUES (?, ?, ?, ?)",
                [(a, b, kind.value, w) for (a, b), w in zip(pairs, weights, strict=True)],
            ).rowcount
            self._changed()
        return max(added, 0)

    # -- reading ---------------------------------------------------------------------------

    @staticmethod
    def _node(row: sqlite3.Row) -> KnowledgeNode:
        return KnowledgeNode(
            id=row["id"],
            tenant_id=row["tenant_id"],
            node_type=NodeType(row["node_type"]),
            title=row["title"],
            summary=row["summary"],
            content=json.loads(row["content"]),
            tags=json.loads(row["tags"]),
        )

    def get_node(self, node_id: int) -> KnowledgeNode | None:
        with self._lock:
            row = self._conn.execute("SELECT * FROM graph_nodes WHERE id = ?", (node_id,))
            found = row.fetchone()
        return None if found is None else self._node(found)

    def get_nodes(self, node_ids: Iterable[int]) -> list[KnowledgeNode]:
        """The stored nodes among ``node_ids``, by id (unknown ids are left out)."""
        ids = list(dict.fromkeys(node_ids))
        with self._lock:
            rows = select_in(self._conn, "SELECT * FROM graph_nodes WHERE id IN ({})", ids)
            found = [self._node(row) for row in rows]
        return sorted(found, key=lambda node: node.id)

    def existing(self, node_ids: Iterable[int]) -> set[int]:
        """Which of ``node_ids`` are stored."""
        with self._lock:
            return self._existing(self._conn, node_ids)

    def tenant_counts(self) -> dict[str, int]:
        """Stored nodes per tenant, by tenant id."""
        with self._lock:
            rows = self._conn.execute(
                "SELECT tenant_id, count(*) FROM graph_nodes GROUP BY tenant_id ORDER BY tenant_id"
            ).fetchall()
        return {str(r[0]): int(r[1]) for r in rows}

    def nodes(
        self,
        *,
        tenant_ids: Iterable[str] | None = None,
        node_types: Iterable[NodeType | str] | None = None,
    ) -> list[KnowledgeNode]:
        """Stored nodes by id, optionally only those of some tenants and types."""
        sql, params = "SELECT * FROM graph_nodes WHERE 1 = 1", []
        if tenant_ids is not None:
            tenants = sorted(set(tenant_ids))
            sql += f" AND tenant_id IN ({','.join('?' * len(tenants))})"
            params.extend(tenants)
        if node_types is not None:
            types = sorted({NodeType(t).value for t in node_types})
            sql += f" AND node_type IN ({','.join('?' * len(types))})"
            params.extend(types)
        with self._lock:
            rows = self._conn.execute(sql + " ORDER BY id", params).fetchall()
        return [self._node(row) for row in rows]

    def edges(self, *, tenant_ids: Iterable[str] | None = None) -> list[KnowledgeEdge]:
        """Stored edges (both ends among ``tenant_ids`` when given), in a fixed order."""
        sql, params = "SELECT e.* FROM graph_edges e", []
        if tenant_ids is not None:
            tenants = sorted(set(tenant_ids))
            marks = ",".join("?" * len(tenants))
            sql += (
                " JOIN graph_nodes s ON s.id = e.source_id JOIN graph_nodes t ON t.id = e.target_id"
                f" WHERE s.tenant_id IN ({marks}) AND t.tenant_id IN ({marks})"
            )
            params = tenants + tenants
        with self._lock:
            rows = self._conn.execute(sql + " ORDER BY e.source_id, e.target_id", params)
            return sorted(
                (
                    KnowledgeEdge(
                        source_id=r["source_id"],
                        target_id=r["target_id"],
                        edge_type=EdgeType(r["edge_type"]),
                        weight=r["weight"],
                    )
                    for r in rows
                ),
                key=lambda e: (e.source_id, e.target_id, EDGE_ORDER[e.edge_type]),
            )
