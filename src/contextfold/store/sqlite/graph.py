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
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from enum import StrEnum
from itertools import combinations
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, model_validator

from contextfold.errors import ConfigError, EmbeddingError
from contextfold.store.sqlite import MigrationRegistry, connect, transaction

if TYPE_CHECKING:
    import numpy.typing as npt

    from contextfold.retrieval.base import Embedder

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

_T = TypeVar("_T")


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


class NodeType(StrEnum):
    """What a knowledge node holds."""

    FAQ = "faq"  # question / answer pairs
    PLAYBOOK = "playbook"  # step-by-step procedures
    PERMISSION_RULE = "permission_rule"  # access-control rules
    CONCEPT = "concept"  # domain background
    SCHEMA_INDEX = "schema_index"  # a database table or collection
    SCHEMA_FIELD = "schema_field"  # one of its fields
    EXAMPLE = "example"  # worked Q&A examples
    ENTITY = "entity"  # a business object (content: entity_path, related_schemas)


class EdgeType(StrEnum):
    """How two nodes relate. ``related``, ``shared_tag`` and ``similar`` are undirected;
    ``parent`` (parent → child) and ``example_of`` (example → what it illustrates) are
    directed. Context expansion follows edges both ways regardless."""

    RELATED = "related"
    PARENT = "parent"
    EXAMPLE_OF = "example_of"
    SHARED_TAG = "shared_tag"  # generated by ``auto_link_shared_tags``
    SIMILAR = "similar"  # generated by ``auto_link_similar``

    @property
    def undirected(self) -> bool:
        return self in (EdgeType.RELATED, EdgeType.SHARED_TAG, EdgeType.SIMILAR)


_EDGE_ORDER = {edge_type: n for n, edge_type in enumerate(EdgeType)}


class KnowledgeNode(BaseModel):
    """One node of the knowledge graph.

    ``content`` is any JSON object. Entity nodes keep their ``entity_path`` (a string such as
    ``"orders.refund_requests"``) and ``related_schemas`` (a list of strings) in ``content``,
    as ContextForge does; the properties of the same names read them.

    >>> node = KnowledgeNode(id=1, tenant_id="t", node_type="entity", title="Refund Request",
    ...                      content={"entity_path": "orders.refund_requests"})
    >>> node.entity_path, node.related_schemas
    ('orders.refund_requests', [])
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    id: int
    tenant_id: str = Field(min_length=1)
    node_type: NodeType
    title: str
    summary: str | None = None
    content: dict[str, Any] = Field(default_factory=dict)
    tags: list[str] = Field(default_factory=list)

    @model_validator(mode="after")
    def _check(self) -> KnowledgeNode:
        try:
            json.dumps(self.content)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"node content must be a JSON object: {exc}") from None
        if self.node_type is NodeType.ENTITY:
            path = self.content.get("entity_path")
            schemas = self.content.get("related_schemas", [])
            if path is not None and not isinstance(path, str):
                raise ValueError(f"an entity's entity_path must be a string, got {path!r}")
            if not isinstance(schemas, list) or not all(isinstance(s, str) for s in schemas):
                raise ValueError(
                    f"an entity's related_schemas must be a list of strings, got {schemas!r}"
                )
        return self

    @property
    def entity_path(self) -> str | None:
        path = self.content.get("entity_path")
        return path if isinstance(path, str) else None

    @property
    def related_schemas(self) -> list[str]:
        schemas = self.content.get("related_schemas", [])
        return list(schemas) if isinstance(schemas, list) else []


class KnowledgeEdge(BaseModel):
    """A typed, weighted edge; ``weight`` is in ``(0, 1]``.

    >>> KnowledgeEdge(source_id=1, target_id=2, edge_type="parent", weight=0.8).weight
    0.8
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    source_id: int
    target_id: int
    edge_type: EdgeType = EdgeType.RELATED
    weight: float = Field(default=1.0, gt=0, le=1)

    @model_validator(mode="after")
    def _check(self) -> KnowledgeEdge:
        if self.source_id == self.target_id:
            raise ValueError(f"an edge needs two different nodes, got {self.source_id} twice")
        return self

    def normalized(self) -> KnowledgeEdge:
        """The stored form: an undirected edge points from the smaller id to the larger."""
        if self.edge_type.undirected and self.source_id > self.target_id:
            return self.model_copy(
                update={"source_id": self.target_id, "target_id": self.source_id}
            )
        return self


def _leaves(value: Any) -> Iterable[str]:
    if isinstance(value, Mapping):
        for item in value.values():
            yield from _leaves(item)
    elif isinstance(value, list | tuple):
        for item in value:
            yield from _leaves(item)
    elif value is not None and not isinstance(value, bool):
        yield str(value)


def search_text(node: KnowledgeNode) -> str:
    """The text entry-point search and ``auto_link_similar`` see: title, summary, every string
    and number inside ``content`` (keys left out) and the tags, one per line.

    >>> search_text(KnowledgeNode(id=1, tenant_id="t", node_type="faq", title="Refunds",
    ...                           content={"answer": "Within 14 days"}, tags=["billing"]))
    'Refunds\\nWithin 14 days\\nbilling'
    """
    parts = [node.title, node.summary or "", *_leaves(node.content), *node.tags]
    return "\n".join(p for p in parts if p)


@dataclass(frozen=True, slots=True)
class Hop:
    """One step from a node: the ``neighbor`` reached, over which edge, and whether the edge
    points away from the node (``outgoing``) or towards it.

    >>> Hop(neighbor=2, edge_type=EdgeType.RELATED, weight=1.0, outgoing=True).neighbor
    2
    """

    neighbor: int
    edge_type: EdgeType
    weight: float
    outgoing: bool


class GraphView:
    """A read-only snapshot of some tenants' nodes and the edges between them.

    ``neighbors(id)`` lists hops in both directions, ordered by neighbour id, then edge type
    (declaration order of ``EdgeType``), outgoing first — a fixed order, so traversals are
    deterministic. ``memo`` caches values derived from the snapshot (search indexes); they live
    exactly as long as the view.

    >>> graph = KnowledgeGraph()
    >>> a, b = graph.add_node("t", "faq", "A"), graph.add_node("t", "faq", "B")
    >>> _ = graph.add_edge(a.id, b.id, "parent", 0.5)
    >>> graph.view(["t"]).neighbors(b.id)
    [Hop(neighbor=1, edge_type=<EdgeType.PARENT: 'parent'>, weight=0.5, outgoing=False)]
    >>> len(graph.view(["other"]).nodes)
    0
    """

    def __init__(
        self,
        tenant_ids: frozenset[str],
        nodes: dict[int, KnowledgeNode],
        adjacency: dict[int, list[Hop]],
    ) -> None:
        self.tenant_ids = tenant_ids
        self.nodes = nodes
        self._adjacency = adjacency
        self._memo: dict[Any, Any] = {}
        self._lock = threading.Lock()

    def neighbors(self, node_id: int) -> Sequence[Hop]:
        return self._adjacency.get(node_id, ())

    def memo(self, key: Any, build: Callable[[], _T]) -> _T:
        """``build()`` once per ``key`` for this view, then the cached value."""
        with self._lock:
            if key not in self._memo:
                self._memo[key] = build()
            value: _T = self._memo[key]
            return value


def _tenant_clause(column: str, tenant_ids: Iterable[str] | None) -> tuple[str, list[str]]:
    """``" AND column IN (?, …)"`` and its parameters; nothing when ``tenant_ids`` is None
    (every tenant). An empty ``tenant_ids`` matches no row."""
    if tenant_ids is None:
        return "", []
    tenants = sorted(set(tenant_ids))
    if not tenants:
        return " AND 0", []
    return f" AND {column} IN ({','.join('?' * len(tenants))})", tenants


class KnowledgeGraph:
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
        self._writes = 0
        self._stamp: tuple[int, int] | None = None
        self._views: dict[frozenset[str], GraphView] = {}
        self._vectors: dict[tuple[str, str], npt.NDArray[np.float32]] = {}

    def close(self) -> None:
        self._conn.close()

    def __enter__(self) -> KnowledgeGraph:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # -- writing ---------------------------------------------------------------------------

    def _changed(self) -> None:
        self._writes += 1
        self._views.clear()

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

    def add_node(
        self,
        tenant_id: str,
        node_type: NodeType | str,
        title: str,
        *,
        summary: str | None = None,
        content: Mapping[str, Any] | None = None,
        tags: Iterable[str] = (),
        node_id: int | None = None,
    ) -> KnowledgeNode:
        """Store one node and return it with its id."""
        fields: dict[str, Any] = {
            "tenant_id": tenant_id,
            "node_type": node_type,
            "title": title,
            "summary": summary,
            "content": dict(content or {}),
            "tags": list(tags),
        }
        if node_id is not None:
            fields["id"] = node_id
        return self.add_nodes([fields])[0]

    def add_nodes(self, nodes: Iterable[KnowledgeNode | Mapping[str, Any]]) -> list[KnowledgeNode]:
        """Store many nodes in one transaction. Each is a ``KnowledgeNode`` or a mapping of
        its fields where ``id`` may be left out (SQLite assigns one)."""
        prepared: list[tuple[KnowledgeNode, int | None]] = []
        for node in nodes:
            if isinstance(node, KnowledgeNode):
                prepared.append((node, node.id))
            else:
                data = dict(node)
                given = data.pop("id", None)
                placeholder = KnowledgeNode.model_validate({**data, "id": given or 0})
                prepared.append((placeholder, given))
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

    def add_edge(
        self,
        source_id: int,
        target_id: int,
        edge_type: EdgeType | str = EdgeType.RELATED,
        weight: float = 1.0,
    ) -> KnowledgeEdge:
        """Store one edge (undirected types are stored smaller id first) and return it."""
        edge = KnowledgeEdge(
            source_id=source_id, target_id=target_id, edge_type=EdgeType(edge_type), weight=weight
        )
        return self.add_edges([edge])[0]

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
        found: set[int] = set()
        batch = list(ids)
        for start in range(0, len(batch), 500):
            part = batch[start : start + 500]
            marks = ",".join("?" * len(part))
            rows = conn.execute(f"SELECT id FROM graph_nodes WHERE id IN ({marks})", part)
            found.update(int(r[0]) for r in rows)
        return found

    def remove_node(self, node_id: int, *, tenant_ids: Iterable[str] | None = None) -> bool:
        """Delete a node and every edge touching it; False when it was not stored (or, with
        ``tenant_ids``, belongs to none of them: then it is left alone)."""
        return self.remove_nodes([node_id], tenant_ids=tenant_ids) > 0

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

    def auto_link_shared_tags(
        self,
        min_shared: int = 1,
        weight: float = 0.5,
        *,
        tenant_ids: Iterable[str] | None = None,
    ) -> int:
        """Add a ``shared_tag`` edge between every two nodes of the same tenant that share at
        least ``min_shared`` tags (compared case-insensitively). Existing edges are kept as
        they are. Returns the number of edges added."""
        if min_shared < 1 or not 0 < weight <= 1:
            raise ConfigError(
                f"auto_link_shared_tags needs min_shared >= 1 and 0 < weight <= 1, "
                f"got min_shared={min_shared}, weight={weight}"
            )
        postings: dict[tuple[str, str], list[int]] = defaultdict(list)
        for node in self.nodes(tenant_ids=tenant_ids):
            for tag in sorted({t.casefold() for t in node.tags}):
                postings[(node.tenant_id, tag)].append(node.id)
        shared: Counter[tuple[int, int]] = Counter()
        for ids in postings.values():
            shared.update(combinations(sorted(ids), 2))
        pairs = sorted(pair for pair, n in shared.items() if n >= min_shared)
        return self._link(pairs, EdgeType.SHARED_TAG, [weight] * len(pairs))

    def auto_link_similar(
        self,
        embedder: Embedder,
        threshold: float = 0.8,
        top_k: int = 5,
        weight: float | None = None,
        *,
        tenant_ids: Iterable[str] | None = None,
    ) -> int:
        """Add a ``similar`` edge from every node to its ``top_k`` most similar nodes of the
        same tenant whose cosine similarity (of ``search_text``) is at least ``threshold``.
        The edge weight is ``weight``, or the similarity itself when ``weight`` is None.
        Existing edges are kept as they are. Returns the number of edges added."""
        if not 0 < threshold <= 1 or top_k < 1 or (weight is not None and not 0 < weight <= 1):
            raise ConfigError(
                f"auto_link_similar needs 0 < threshold <= 1, top_k >= 1 and 0 < weight <= 1, "
                f"got threshold={threshold}, top_k={top_k}, weight={weight}"
            )
        by_tenant: dict[str, list[KnowledgeNode]] = defaultdict(list)
        for node in self.nodes(tenant_ids=tenant_ids):
            by_tenant[node.tenant_id].append(node)
        best: dict[tuple[int, int], float] = {}
        for group in by_tenant.values():
            if len(group) < 2:
                continue
            vectors = self.embed_nodes(embedder, group)
            k = min(top_k, len(group) - 1)
            for start in range(0, len(group), 512):
                sims = vectors[start : start + 512] @ vectors.T
                for row, sim in enumerate(sims):
                    i = start + row
                    sim[i] = -np.inf
                    for j in np.argsort(-sim, kind="stable")[:k]:
                        if sim[j] < threshold:
                            break
                        pair = (min(group[i].id, group[j].id), max(group[i].id, group[j].id))
                        best[pair] = max(best.get(pair, 0.0), min(1.0, float(sim[j])))
        pairs = sorted(best)
        weights = [best[p] if weight is None else weight for p in pairs]
        return self._link(pairs, EdgeType.SIMILAR, weights)

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
        found: list[KnowledgeNode] = []
        with self._lock:
            for start in range(0, len(ids), 500):
                part = ids[start : start + 500]
                marks = ",".join("?" * len(part))
                rows = self._conn.execute(f"SELECT * FROM graph_nodes WHERE id IN ({marks})", part)
                found.extend(self._node(row) for row in rows)
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
                key=lambda e: (e.source_id, e.target_id, _EDGE_ORDER[e.edge_type]),
            )

    def view(self, tenant_ids: Iterable[str]) -> GraphView:
        """The (cached) snapshot of ``tenant_ids``' nodes and the edges between them."""
        tenants = frozenset(tenant_ids)
        with self._lock:
            stamp = (int(self._conn.execute("PRAGMA data_version").fetchone()[0]), self._writes)
            if stamp != self._stamp:
                self._views.clear()
                self._stamp = stamp
            view = self._views.get(tenants)
            if view is None:
                view = self._views[tenants] = self._build_view(tenants)
            return view

    def _build_view(self, tenants: frozenset[str]) -> GraphView:
        nodes = {n.id: n for n in self.nodes(tenant_ids=tenants)} if tenants else {}
        adjacency: dict[int, list[Hop]] = defaultdict(list)
        for edge in self.edges(tenant_ids=tenants) if tenants else []:
            adjacency[edge.source_id].append(
                Hop(edge.target_id, edge.edge_type, edge.weight, outgoing=True)
            )
            adjacency[edge.target_id].append(
                Hop(edge.source_id, edge.edge_type, edge.weight, outgoing=False)
            )
        for hops in adjacency.values():
            hops.sort(key=lambda h: (h.neighbor, _EDGE_ORDER[h.edge_type], not h.outgoing))
        return GraphView(tenants, nodes, dict(adjacency))

    def embed_nodes(
        self, embedder: Embedder, nodes: Sequence[KnowledgeNode]
    ) -> npt.NDArray[np.float32]:
        """The embeddings of the nodes' ``search_text`` (row *i* for node *i*), cached in
        memory by model name and text, so unchanged nodes are embedded once."""
        from contextfold.retrieval.base import content_hash

        keys: list[tuple[str, str]] = []
        todo: dict[tuple[str, str], str] = {}
        for node in nodes:
            text = search_text(node)
            key = (embedder.name, content_hash(text))
            keys.append(key)
            if key not in self._vectors:
                todo.setdefault(key, text)
        if todo:
            fresh = np.asarray(embedder.embed(list(todo.values())), dtype=np.float32)
            if fresh.shape != (len(todo), embedder.dim):
                raise EmbeddingError(
                    f"embedder {embedder.name!r} returned shape {fresh.shape} for {len(todo)} "
                    f"texts; expected ({len(todo)}, {embedder.dim})"
                )
            self._vectors.update(zip(todo, fresh, strict=True))
        if not keys:
            return np.zeros((0, embedder.dim), dtype=np.float32)
        return np.stack([self._vectors[key] for key in keys])
