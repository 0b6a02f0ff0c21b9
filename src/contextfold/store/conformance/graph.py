"""The knowledge graph's contract (``GraphStorage``), run unchanged on SQLite and PostgreSQL:
ids never reused, atomic writes and transactions, edge rules, tenant scoping, views that are
never stale across store objects (processes), a fixed order — and graph context answering
alike on both."""

from __future__ import annotations

import re
import threading
from collections.abc import Iterator, Sequence

import numpy as np
import pytest

from contextfold.errors import ConfigError
from contextfold.retrieval.graph import GraphContextRequest, graph_context
from contextfold.store.conformance.documents_support import Opener
from contextfold.store.document_models import CatalogueEntry
from contextfold.store.graph_models import KnowledgeEdge, KnowledgeNode
from contextfold.store.protocols import CatalogueStorage, GraphStorage


class KeywordEmbedder:
    """Each concept word is one basis direction; a text with none points along the last."""

    def __init__(self, concepts: dict[str, int]) -> None:
        self.concepts = concepts
        self.dim = max(concepts.values()) + 2
        self.name = f"keywords-{self.dim}"

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        for row, text in enumerate(texts):
            for word in re.findall(r"\w+", text.lower()):
                if word in self.concepts:
                    out[row, self.concepts[word]] += 1.0
            if not out[row].any():
                out[row, -1] = 1.0
            out[row] /= np.linalg.norm(out[row])
        return out


@pytest.fixture
def graph(graph_opener: Opener) -> GraphStorage:
    opened: GraphStorage = graph_opener()
    return opened


def _chain(graph: GraphStorage, weight: float = 1.0, length: int = 3) -> list[int]:
    ids = [graph.add_node("t", "faq", "How to refund").id]
    for n in range(length):
        ids.append(graph.add_node("t", "playbook", f"Step {n}").id)
        graph.add_edge(ids[-2], ids[-1], "related", weight)
    return ids


def test_every_backend_implements_the_protocol(graph: GraphStorage) -> None:
    assert isinstance(graph, GraphStorage)
    assert graph.nodes() == [] and graph.edges() == [] and graph.tenant_counts() == {}


def test_auto_link_shared_tags_links_same_tenant_nodes_once(graph: GraphStorage) -> None:
    a = graph.add_node("t", "faq", "A", tags=["Refunds", "cards"]).id
    b = graph.add_node("t", "faq", "B", tags=["refunds", "cards"]).id
    c = graph.add_node("t", "faq", "C", tags=["refunds"]).id
    graph.add_node("u", "faq", "D", tags=["refunds", "cards"])
    assert graph.auto_link_shared_tags(min_shared=2, weight=0.6) == 1
    assert graph.edges() == [
        KnowledgeEdge(source_id=a, target_id=b, edge_type="shared_tag", weight=0.6)
    ]
    assert graph.auto_link_shared_tags() == 2  # a-c and b-c; a-b already exists
    assert {(e.source_id, e.target_id) for e in graph.edges()} == {(a, b), (a, c), (b, c)}
    assert graph.auto_link_shared_tags(tenant_ids=[]) == 0


def test_auto_link_similar_uses_embeddings(graph: GraphStorage) -> None:
    a = graph.add_node("t", "faq", "Refund policy").id
    b = graph.add_node("t", "playbook", "Issue a refund").id
    graph.add_node("t", "faq", "Hotel caps")
    graph.add_node("u", "faq", "Refund elsewhere")
    embedder = KeywordEmbedder({"refund": 0, "hotel": 1})
    assert graph.auto_link_similar(embedder, threshold=0.9) == 1
    assert graph.edges() == [KnowledgeEdge(source_id=a, target_id=b, edge_type="similar")]
    assert graph.auto_link_similar(embedder, threshold=0.9) == 0  # existing edges are kept


def test_undirected_edges_are_stored_once_and_re_adding_updates_the_weight(
    graph: GraphStorage,
) -> None:
    a, b = (graph.add_node("t", "faq", name).id for name in "AB")
    assert graph.add_edge(b, a, "related", 0.3).source_id == a
    graph.add_edge(a, b, "related", 0.7)
    graph.add_edge(b, a, "parent")
    kinds = [(e.source_id, e.target_id, e.edge_type, e.weight) for e in graph.edges()]
    assert kinds == [(a, b, "related", 0.7), (b, a, "parent", 1.0)]
    graph.add_edges(
        [
            KnowledgeEdge(source_id=a, target_id=b, weight=0.2),
            KnowledgeEdge(source_id=b, target_id=a, weight=0.4),  # the same edge: last wins
        ]
    )
    assert graph.edges()[0].weight == 0.4
    assert graph.remove_edge(b, a, "related") is True  # either orientation
    assert graph.remove_edge(a, b, "parent") is False  # a directed edge has one
    assert [(e.source_id, e.edge_type) for e in graph.edges()] == [(b, "parent")]


def test_removing_a_node_removes_its_edges(graph: GraphStorage) -> None:
    ids = _chain(graph)
    assert graph.remove_node(ids[1]) is True
    assert graph.get_node(ids[1]) is None
    assert [(e.source_id, e.target_id) for e in graph.edges()] == [(ids[2], ids[3])]
    request = GraphContextRequest(query="refund", tenant_ids=["t"])
    assert graph_context(graph, request).context == []
    assert graph.remove_node(ids[1]) is False
    assert graph.remove_nodes([]) == 0


def test_removals_scoped_to_tenants_leave_other_tenants_rows(graph: GraphStorage) -> None:
    a, b = graph.add_node("a", "faq", "A").id, graph.add_node("b", "faq", "B").id
    graph.add_edge(a, b)
    assert graph.remove_edge(a, b, tenant_ids=["a"]) is False  # one end is b's
    assert graph.remove_node(b, tenant_ids=["a"]) is False
    assert graph.remove_nodes([a, b], tenant_ids=[]) == 0
    assert [n.id for n in graph.get_nodes([b, a, 99])] == [a, b]
    assert len(graph.edges()) == 1
    assert graph.remove_edge(a, b, tenant_ids=["a", "b"]) is True
    assert graph.remove_nodes([a, b], tenant_ids=["a"]) == 1
    assert [n.id for n in graph.nodes()] == [b]


def test_the_graph_persists_across_instances(graph_opener: Opener, graph: GraphStorage) -> None:
    a = graph.add_node("t", "faq", "Refund", summary="s", content={"k": [1], "é": "ü"}, tags=["x"])
    b = graph.add_node("t", "playbook", "Steps")
    graph.add_edge(a.id, b.id, "parent", 0.25)
    graph.close()
    graph_opener.opened.remove(graph)
    reopened: GraphStorage = graph_opener()
    assert reopened.nodes() == [a, b]
    assert list(reopened.nodes()[0].content) == ["k", "é"]  # key order as written
    assert reopened.edges() == [
        KnowledgeEdge(source_id=a.id, target_id=b.id, edge_type="parent", weight=0.25)
    ]


def test_node_ids_are_never_reused(graph_opener: Opener, graph: GraphStorage) -> None:
    first = graph.add_node("a", "faq", "A's first").id
    last = graph.add_node("a", "faq", "A's last").id
    graph.remove_node(last)
    reborn = graph.add_node("b", "faq", "B's").id
    assert reborn == last + 1  # not ``last``, which A's old references still name
    assert graph.remove_nodes([first, reborn]) == 2
    other: GraphStorage = graph_opener()  # the highest id ever used is stored, not remembered
    assert other.add_node("b", "faq", "B's next").id == reborn + 1


def test_an_explicit_id_moves_the_counter_past_it(graph: GraphStorage) -> None:
    stored = graph.add_nodes(
        [
            {"tenant_id": "a", "node_type": "faq", "title": "x"},
            {"id": 40, "tenant_id": "b", "node_type": "entity", "title": "y"},
            {"tenant_id": "a", "node_type": "faq", "title": "z"},
        ]
    )
    assert [n.id for n in stored] == [1, 40, 41]
    graph.remove_nodes([40, 41])
    assert graph.add_node("a", "faq", "next").id == 42
    graph.add_node("a", "faq", "low", node_id=5)  # below the counter: it stays
    assert graph.add_node("a", "faq", "after").id == 43


def test_an_explicit_id_replaces_the_node_and_keeps_its_edges(graph: GraphStorage) -> None:
    a, b = graph.add_node("t", "faq", "A").id, graph.add_node("t", "faq", "B").id
    graph.add_edge(a, b, "parent", 0.5)
    replaced = graph.add_node("t", "concept", "A2", tags=["new"], node_id=a)
    assert graph.get_node(a) == replaced
    assert replaced == KnowledgeNode(
        id=a, tenant_id="t", node_type="concept", title="A2", tags=["new"]
    )
    assert len(graph.edges()) == 1


def test_a_write_from_another_object_invalidates_the_cached_view(graph_opener: Opener) -> None:
    reader: GraphStorage = graph_opener()
    writer: GraphStorage = graph_opener()
    a = writer.add_node("t", "faq", "Refund").id
    b = writer.add_node("t", "playbook", "Steps").id
    assert reader.view(["t"]).neighbors(a) == ()
    assert reader.view(["t"]) is reader.view(["t"])  # cached while nothing changes
    writer.add_edge(a, b)
    assert [h.neighbor for h in reader.view(["t"]).neighbors(a)] == [b]
    writer.remove_node(b)
    assert reader.view(["t"]).neighbors(a) == () and b not in reader.view(["t"]).nodes


def test_a_view_never_reaches_outside_its_tenants(graph: GraphStorage) -> None:
    a, b = graph.add_node("a", "faq", "A").id, graph.add_node("b", "faq", "B").id
    c = graph.add_node("a", "faq", "C").id
    graph.add_edge(a, b)
    graph.add_edge(a, c, "parent", 0.5)
    view = graph.view(["a"])
    assert set(view.nodes) == {a, c}
    assert [(h.neighbor, h.edge_type, h.outgoing) for h in view.neighbors(a)] == [
        (c, "parent", True)
    ]
    assert [h.neighbor for h in graph.view(["a", "b"]).neighbors(a)] == [b, c]
    assert graph.view([]).nodes == {}
    assert graph.edges(tenant_ids=["a"]) == [
        KnowledgeEdge(source_id=a, target_id=c, edge_type="parent", weight=0.5)
    ]
    assert graph.tenant_counts() == {"a": 2, "b": 1}


def test_nodes_filter_by_tenant_and_type(graph: GraphStorage) -> None:
    stored = graph.add_nodes(
        [
            {"tenant_id": "a", "node_type": "faq", "title": "x"},
            {"id": 40, "tenant_id": "b", "node_type": "entity", "title": "y"},
        ]
    )
    assert graph.nodes(tenant_ids=["b"]) == [stored[1]]
    assert graph.nodes(node_types=["faq"]) == [stored[0]]
    assert graph.nodes(tenant_ids=["a", "b"], node_types=["entity", "faq"]) == stored
    assert graph.existing([1, 40, 41]) == {1, 40}


def test_edges_to_missing_nodes_fail_the_whole_write(graph: GraphStorage) -> None:
    a = graph.add_node("t", "faq", "A").id
    b = graph.add_node("t", "faq", "B").id
    with pytest.raises(ConfigError, match=r"\[99\]"):
        graph.add_edges(
            [KnowledgeEdge(source_id=a, target_id=b), KnowledgeEdge(source_id=a, target_id=99)]
        )
    assert graph.edges() == []


def test_a_transaction_is_all_or_nothing(graph: GraphStorage) -> None:
    kept = graph.add_node("t", "faq", "kept").id
    with pytest.raises(RuntimeError, match="boom"), graph.transaction():
        a = graph.add_node("t", "faq", "A").id
        graph.add_edge(a, kept)
        graph.remove_node(kept)
        raise RuntimeError("boom")
    assert [n.id for n in graph.nodes()] == [kept]
    assert graph.edges() == [] and graph.view(["t"]).neighbors(kept) == ()
    with graph.transaction():
        a = graph.add_node("t", "faq", "A").id
        graph.add_edge(a, kept)
    assert len(graph.edges()) == 1


def test_writers_in_threads_never_share_an_id(graph_opener: Opener) -> None:
    graphs: list[GraphStorage] = [graph_opener() for _ in range(4)]
    ids: list[int] = []
    errors: list[BaseException] = []
    lock = threading.Lock()

    def write(n: int) -> None:
        try:
            for k in range(5):
                node = graphs[n].add_nodes(
                    [{"tenant_id": "t", "node_type": "faq", "title": f"{n}-{k}"}]
                )
                with lock:
                    ids.extend(x.id for x in node)
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=write, args=(n,)) for n in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert len(ids) == len(set(ids)) == 20
    assert sorted(ids) == [n.id for n in graphs[0].nodes()]


def test_graph_context_answers_alike_on_every_backend(graph: GraphStorage) -> None:
    from contextfold.store.sqlite.graph import KnowledgeGraph

    reference = KnowledgeGraph()

    def build(target: GraphStorage) -> None:
        faq = target.add_node("t", "faq", "How to process refunds", tags=["refunds"]).id
        flow = target.add_node("t", "playbook", "Refund approval workflow", tags=["refunds"]).id
        rule = target.add_node("t", "permission_rule", "Managers approve large refunds").id
        entity = target.add_node(
            "t", "entity", "Refund Request", content={"entity_path": "orders.refund_requests"}
        ).id
        target.add_node("u", "faq", "Refunds elsewhere")
        target.add_edge(faq, flow, "related", 0.9)
        target.add_edge(flow, rule, "parent", 0.7)
        target.add_edge(rule, entity, "related", 0.5)
        background = target.add_node("t", "concept", "Why limits exist").id
        target.add_edge(background, rule, "example_of", 0.6)
        target.auto_link_shared_tags()

    build(graph)
    build(reference)
    request = GraphContextRequest(query="refund approval", tenant_ids=["t"], max_depth=3)
    embedder = KeywordEmbedder({"refund": 0, "approval": 1, "manager": 2})
    ours = graph_context(graph, request, embedder=embedder, relevance_floor=False).model_dump()
    theirs = graph_context(
        reference, request, embedder=embedder, relevance_floor=False
    ).model_dump()
    assert ours == theirs
    assert ours["entry_points"] and ours["context"] and ours["entities"]
    reference.close()


# -- the context API's document catalogue ---------------------------------------------------

POLICY = "# Refunds\nWithin 14 days.\n# Large\nA manager approves.\n# Cards\nBack to the card."


@pytest.fixture
def catalogue(graph_opener: Opener) -> Iterator[CatalogueStorage]:
    from contextfold.store import open_catalogue

    opened = open_catalogue(graph_opener.location)
    yield opened
    opened.close()


def _entry(tenant: str, document: str, node_ids: list[int]) -> CatalogueEntry:
    return CatalogueEntry(
        tenant_id=tenant,
        document_id=document,
        title=document.title(),
        node_type="concept",
        node_ids=node_ids,
        tokens=7,
        metadata={"z": 1, "a": [2]},
        created_at="2026-01-01T00:00:00+00:00",
    )


def test_the_catalogue_keeps_one_entry_per_tenant_and_id(
    graph_opener: Opener, catalogue: CatalogueStorage
) -> None:
    assert isinstance(catalogue, CatalogueStorage)
    catalogue.insert(_entry("b", "policy", [3, 1]))
    catalogue.insert(_entry("a", "policy", []))
    catalogue.insert(_entry("B", "zeta", [2]))
    with pytest.raises(graph_opener.integrity_error):
        catalogue.insert(_entry("a", "policy", [9]))
    assert catalogue.get("b", "policy") == _entry("b", "policy", [3, 1])
    assert list(catalogue.get("b", "policy").metadata) == ["z", "a"]  # type: ignore[union-attr]
    assert catalogue.get("c", "policy") is None
    assert [(e.tenant_id, e.document_id) for e in catalogue.entries()] == [
        ("B", "zeta"),
        ("a", "policy"),
        ("b", "policy"),
    ]
    assert [e.tenant_id for e in catalogue.entries(["b", "nobody"])] == ["b"]
    assert catalogue.entries([]) == []
    assert catalogue.counts() == {"B": 1, "a": 1, "b": 1}
    assert catalogue.delete("a", "policy") is True and catalogue.delete("a", "policy") is False


def test_a_document_loads_and_goes_in_one_transaction(
    graph_opener: Opener, monkeypatch: pytest.MonkeyPatch
) -> None:
    from contextfold.server.knowledge import DocumentConflict, DocumentSpec, KnowledgeStore

    spec = DocumentSpec(
        tenant_id="support", id="refunds", title="Policy", text=POLICY, chunker="markdown"
    )
    with KnowledgeStore(graph_opener.location) as store:
        info = store.add_document(spec)
        assert info.chunks == 3 and len(store.graph.edges()) == 2
        with pytest.raises(DocumentConflict):
            store.add_document(spec)
        assert store.document_counts() == {"support": 1}
        other = KnowledgeStore(graph_opener.location)  # another process sees all of it
        try:
            assert other.document("support", "refunds") == info
        finally:
            other.close()
        assert store.remove_document("support", "refunds") is True
        assert store.graph.nodes() == [] and store.documents() == []

        def fail(*args: object, **kwargs: object) -> None:
            raise RuntimeError("the disk is full")

        monkeypatch.setattr(type(store.graph), "add_edges", fail)
        with pytest.raises(RuntimeError, match="disk is full"):
            store.add_document(spec)
        assert store.graph.nodes() == [] and store.documents() == []
        assert store.document("support", "refunds") is None
