"""Item retrievers (seed 000 API) and RRF across retrievers."""

from __future__ import annotations

import pytest

from contextfold.errors import ConfigError, EmbeddingError
from contextfold.items import ContextItem, QueryBundle
from contextfold.pipeline import ContextPipeline, retriever_step
from contextfold.retrieval.retrievers import (
    DenseRetriever,
    HybridRetriever,
    InMemoryContextStore,
    InMemoryVectorStore,
    SparseRetriever,
)
from contextfold.testing import HashEmbedder

ITEMS = [
    ContextItem(id="py", content="Python is great for data science."),
    ContextItem(id="rag", content="RAG combines retrieval with generation."),
    ContextItem(id="eiffel", content="The Eiffel Tower was built from 1887 to 1889."),
]


def _dense() -> DenseRetriever:
    dense = DenseRetriever(embedder=HashEmbedder())
    dense.index(ITEMS)
    return dense


def _sparse() -> SparseRetriever:
    sparse = SparseRetriever()
    sparse.index(ITEMS)
    return sparse


def test_dense_retriever_ranks_by_cosine_and_tags_hits() -> None:
    hits = _dense().retrieve(QueryBundle(query_str="when was the Eiffel Tower built"), top_k=2)
    assert hits[0].id == "eiffel"
    assert hits[0].metadata["match_source"] == "vector" and hits[0].metadata["ranks"] == {
        "vector": 1
    }
    assert hits[0].score >= hits[1].score


def test_dense_retriever_accepts_the_seed_embed_fn_and_normalises() -> None:
    calls: list[str] = []

    def embed_fn(text: str) -> list[float]:
        calls.append(text)
        return [3.0, 4.0] if "Python" in text else [4.0, -3.0]

    dense = DenseRetriever(InMemoryVectorStore(), InMemoryContextStore(), embed_fn=embed_fn)
    dense.index(ITEMS[:2])
    hit = dense.retrieve(QueryBundle(query_str="q", embedding=[0.6, 0.8]), top_k=1)[0]
    assert hit.id == "py" and hit.score == pytest.approx(1.0)
    assert calls == [
        ITEMS[0].content,
        ITEMS[1].content,
    ]  # a given query embedding is not recomputed


def test_embed_fn_with_inconsistent_dimensions_is_rejected() -> None:
    dense = DenseRetriever(embed_fn=lambda t: [1.0] * (2 if "Python" in t else 3))
    with pytest.raises(EmbeddingError, match="same length"):
        dense.index(ITEMS[:2])


def test_sparse_retriever_returns_only_matching_items() -> None:
    hits = _sparse().retrieve("retrieval generation", top_k=5)
    assert [h.id for h in hits] == ["rag"] and hits[0].metadata["match_source"] == "bm25"


def test_hybrid_fuses_with_rrf_and_marks_overlap() -> None:
    hits = HybridRetriever([_dense(), _sparse()]).retrieve("retrieval with generation", top_k=3)
    top = hits[0]
    assert top.id == "rag" and top.metadata["match_source"] == "hybrid"
    assert top.metadata["ranks"] == {"vector": 1, "bm25": 1}
    assert top.score == pytest.approx(2 / 61)
    assert {h.metadata["match_source"] for h in hits[1:]} == {"vector"}  # BM25 found only "rag"


def test_hybrid_weights_change_the_order() -> None:
    dense, sparse = _dense(), _sparse()
    query = "Python tower"
    by_dense = HybridRetriever([dense, sparse], weights=[1.0, 0.0]).retrieve(query, top_k=3)
    assert [h.id for h in by_dense] == [h.id for h in dense.retrieve(query, top_k=3)]


def test_hybrid_configuration_errors() -> None:
    with pytest.raises(ConfigError, match="either retrievers"):
        HybridRetriever()
    with pytest.raises(ConfigError, match="2 retrievers but 1 weights"):
        HybridRetriever([_dense(), _sparse()], weights=[1.0])


def test_retrievers_plug_into_a_pipeline_step() -> None:
    result = (
        ContextPipeline(max_tokens=2000)
        .add_step(retriever_step("search", HybridRetriever([_dense(), _sparse()]), top_k=2))
        .build("How does RAG work with retrieval?")
    )
    assert "RAG combines retrieval" in result.text
