"""Seed 002's own plug-in shapes work (issue 17, point 4): a chunker with only ``chunk(text)``,
a retriever returning ``{"text", "metadata", "score"}`` dicts and a composer reading dicts are
adapted at the boundary of ``ContextEngine`` and ``retriever_step``; a part missing its method
is refused with an error naming it. ``VectorRetriever(memory=index)`` and ``GraphRetriever``
plug into both."""

from __future__ import annotations

from typing import Any

import pytest

from contextfold import ContextEngine, ContextPipeline, retriever_step
from contextfold.errors import ConfigError, StepError
from contextfold.items import QueryBundle
from contextfold.retrieval.graph import GraphContextRequest, KnowledgeGraph, graph_context
from contextfold.retrieval.index import DocumentIndex
from contextfold.retrieval.seed_retrievers import GraphRetriever, VectorRetriever
from contextfold.testing import HashEmbedder

PYTHON = (
    "Python is a high-level, interpreted programming language.\n\n"
    "It was created by Guido van Rossum and first released in 1991.\n\n"
    "Its design philosophy emphasizes code readability."
)
JS = "JavaScript was created by Brendan Eich and first released in 1995."


class ParagraphChunker:
    """Seed-shaped: only ``chunk(text) -> list[str]``."""

    def __init__(self) -> None:
        self.calls = 0

    def chunk(self, text: str) -> list[str]:
        self.calls += 1
        return [p.strip() for p in text.split("\n\n") if p.strip()]


class DictRetriever:
    """Seed-shaped: ``retrieve(query: str, k)`` over a memory with ``search``, returning
    dicts."""

    def __init__(self, memory: DocumentIndex) -> None:
        self.memory = memory
        self.queries: list[Any] = []

    def retrieve(self, query: str, k: int = 5) -> list[dict[str, Any]]:
        self.queries.append(query)
        return [
            {"text": h.text, "metadata": {**h.metadata, "id": h.id}, "score": h.score}
            for h in self.memory.search(query, k)
        ]


class DictComposer:
    """Seed-shaped: reads ``chunk["score"]`` and ``chunk["text"]``."""

    def compose(self, query: str, chunks: list[dict[str, Any]]) -> str:
        ordered = sorted(chunks, key=lambda c: c["score"], reverse=True)
        body = "".join(
            f"Chunk {n} (Score: {c['score']:.2f}):\n{c['text']}\n\n"
            for n, c in enumerate(ordered, 1)
        )
        return f"Query: {query}\n\n{body}"


def _index() -> DocumentIndex:
    return DocumentIndex(embedder=HashEmbedder())


def test_a_chunk_only_chunker_is_adapted() -> None:
    chunker = ParagraphChunker()
    engine = ContextEngine(chunker=chunker, memory=_index())
    doc_id = engine.add_document(PYTHON)
    assert chunker.calls >= 1
    stored = sorted(
        (c["index"], c["text"])
        for c in engine.memory.store.chunks(engine.memory.store.chunk_ids(doc_id)).values()
    )
    assert [text for _, text in stored] == ParagraphChunker().chunk(PYTHON)
    chunks = engine.chunker.split(PYTHON, doc_id="d")
    assert all(PYTHON[c.start : c.end] == c.text for c in chunks)
    assert [c.metadata["chunk_count"] for c in chunks] == [3, 3, 3]
    assert len({c.id for c in chunks}) == 3


def test_a_dict_retriever_and_a_dict_composer_are_adapted() -> None:
    index = _index()
    index.add_document(PYTHON)
    index.add_document(JS)
    retriever = DictRetriever(index)
    engine = ContextEngine(retriever=retriever, composer=DictComposer(), memory=index)

    items = engine.retrieve("Who created Python?", k=2)
    hits = index.search("Who created Python?", 2)
    assert retriever.queries == ["Who created Python?"]  # the seed's retriever gets a str
    assert [(i.id, i.content, i.score) for i in items] == [(h.id, h.text, h.score) for h in hits]
    assert items[0].metadata["doc_id"] == hits[0].metadata["doc_id"]

    context = engine.get_context("Who created Python?", k=2)
    assert context.startswith("Query: Who created Python?\n\nChunk 1 (Score: ")
    assert hits[0].text in context


def test_a_dict_retriever_in_retriever_step() -> None:
    index = _index()
    index.add_document(PYTHON)
    pipeline = ContextPipeline(max_tokens=500).add_step(
        retriever_step("seed", DictRetriever(index), top_k=1)
    )
    result = pipeline.build("When was Python released?")
    assert index.search("When was Python released?", 1)[0].text in result.text


def test_parts_without_their_method_are_refused_by_name() -> None:
    with pytest.raises(ConfigError, match=r"chunker: it has no chunk\(text\)"):
        ContextEngine(chunker=object())  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=r"retriever: it has no retrieve\(query, k\)"):
        ContextEngine(retriever=object(), memory=_index())
    with pytest.raises(ConfigError, match=r"composer: it has no compose\(query, chunks\)"):
        ContextEngine(composer=object(), memory=_index())  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=r"no retrieve"):
        retriever_step("x", object())  # type: ignore[arg-type]


def test_bad_retrieved_values_get_a_clear_error() -> None:
    class NoText:
        def retrieve(self, query: str, k: int = 5) -> list[dict[str, Any]]:
            return [{"content_missing": "x", "score": 1.0}]

    class BadScore:
        def retrieve(self, query: str, k: int = 5) -> list[dict[str, Any]]:
            return [{"text": "x", "score": "high"}]

    class Strings:
        def retrieve(self, query: str, k: int = 5) -> list[str]:
            return ["x"]

    for part, message in [
        (NoText(), 'without a "text" string'),
        (BadScore(), '"score" that is not a number'),
        (Strings(), "returned a str"),
    ]:
        engine = ContextEngine(retriever=part, memory=_index())
        with pytest.raises(ConfigError, match=message):
            engine.retrieve("q")
    pipeline = ContextPipeline(max_tokens=200).add_step(retriever_step("bad", NoText()))
    with pytest.raises(StepError, match='"text"'):
        pipeline.build("q")


def test_vector_retriever_over_an_index() -> None:
    index = _index()
    index.add_document(PYTHON)
    index.add_document(JS)
    dense = index.search("Who created JavaScript?", 2, mode="dense")
    engine = ContextEngine(retriever=VectorRetriever(memory=index), memory=index)
    items = engine.retrieve("Who created JavaScript?", k=2)
    assert [i.id for i in items] == [h.id for h in dense]
    assert all(i.metadata["match_source"] == "vector" for i in items)
    pipeline = ContextPipeline(max_tokens=500).add_step(
        retriever_step("dense", VectorRetriever(memory=index), top_k=1)
    )
    assert dense[0].text in pipeline.build("Who created JavaScript?").text
    with pytest.raises(ConfigError, match="DocumentIndex"):
        VectorRetriever(memory=object())  # type: ignore[arg-type]


def _graph() -> KnowledgeGraph:
    graph = KnowledgeGraph()
    faq = graph.add_node("support", "faq", "How to process a refund", summary="Refund steps")
    flow = graph.add_node("support", "playbook", "Approval chain for payments over 100 dollars")
    rule = graph.add_node("support", "permission_rule", "Only managers approve large payments")
    graph.add_node("sales", "faq", "Refund policy for sales", summary="not support's")
    graph.add_edge(faq.id, flow.id, "related")
    graph.add_edge(flow.id, rule.id, "related")
    return graph


def test_graph_retriever_in_the_engine_and_a_step() -> None:
    graph = _graph()
    response = graph_context(
        graph,
        GraphContextRequest(query="refund", tenant_ids=["support"], entry_limit=4),
    )
    retriever = GraphRetriever(graph, ["support"])
    items = retriever.retrieve(QueryBundle(query_str="refund"), 4)
    assert [i.metadata["node_id"] for i in items if i.section == "entry_points"] == [
        e.id for e in response.entry_points
    ]
    assert [i.metadata["node_id"] for i in items if i.section == "expanded"] == [
        c.id for c in response.context
    ]
    assert all("sales" not in i.content for i in items)  # another tenant's node
    assert len(retriever.retrieve("refund", 1)) == 1

    engine = ContextEngine(retriever=retriever, memory=_index())
    context = engine.get_context("refund", k=3)
    assert "How to process a refund" in context and "Approval chain" in context
    pipeline = ContextPipeline(max_tokens=500).add_step(retriever_step("graph", retriever, 3))
    assert "Approval chain" in pipeline.build("refund").text
    with pytest.raises(ConfigError, match="tenant"):
        GraphRetriever(graph, [])
