"""``EmbeddingReranker`` (issue 17, point 8) and the ``Reranker`` protocol in
``reranker_step``: the order follows the blend of cosine and first-stage score, computed here
from the embedder itself; at most ``top_k``; inputs untouched."""

from __future__ import annotations

import numpy as np
import pytest

from contextfold import ContextPipeline, Reranker, reranker_step, retriever_step
from contextfold.errors import ConfigError
from contextfold.items import ContextItem, QueryBundle, SourceType
from contextfold.retrieval.index import DocumentIndex
from contextfold.retrieval.rerank import EmbeddingReranker
from contextfold.testing import HashEmbedder

TEXTS = [
    "Refunds are processed within 14 days of the request.",
    "The office kitchen is cleaned every Friday.",
    "Refund requests over 100 dollars need a manager.",
    "Passwords rotate every 90 days.",
]


def _items() -> list[ContextItem]:
    return [
        ContextItem(id=f"i{n}", content=t, source=SourceType.RETRIEVAL, score=float(10 - n))
        for n, t in enumerate(TEXTS)
    ]


@pytest.mark.parametrize("weight", [0.0, 0.5, 1.0])
def test_order_is_the_blend(weight: float) -> None:
    embedder = HashEmbedder()
    items = _items()
    before = [i.model_dump() for i in items]
    query = QueryBundle(query_str="how do refund requests work")
    out = EmbeddingReranker(embedder, weight=weight).rerank(query, items, 3)

    q = embedder.embed([query.query_str])[0]
    cos = embedder.embed(TEXTS) @ q
    first = np.array([i.score for i in items])
    scaled = (first - first.min()) / (first.max() - first.min())
    blend = weight * cos + (1 - weight) * scaled
    expected = sorted(range(4), key=lambda i: (-blend[i], i))[:3]
    assert [i.id for i in out] == [f"i{n}" for n in expected]
    assert [i.score for i in out] == pytest.approx([blend[n] for n in expected])
    assert out[0].metadata["rerank"]["first_stage_rank"] == expected[0] + 1
    assert [i.model_dump() for i in items] == before  # inputs untouched
    if weight == 0.0:
        assert [i.id for i in out] == ["i0", "i1", "i2"]  # the first stage's order


def test_a_query_embedding_is_used_as_given() -> None:
    embedder = HashEmbedder()
    target = embedder.embed([TEXTS[3]])[0]
    query = QueryBundle(query_str="unrelated words", embedding=[float(x) * 3 for x in target])
    out = EmbeddingReranker(embedder, weight=1.0).rerank(query, _items(), 1)
    assert out[0].content == TEXTS[3]


def test_edges_and_errors() -> None:
    reranker = EmbeddingReranker(HashEmbedder())
    assert isinstance(reranker, Reranker)
    assert reranker.rerank(QueryBundle(query_str="q"), [], 3) == []
    assert reranker.rerank(QueryBundle(query_str="q"), _items(), 0) == []
    same = [i.model_copy(update={"score": 1.0}) for i in _items()]
    assert len(reranker.rerank(QueryBundle(query_str="q"), same, 10)) == 4
    with pytest.raises(ConfigError, match="weight"):
        EmbeddingReranker(HashEmbedder(), weight=1.5)


def test_in_a_pipeline_after_a_bm25_retriever() -> None:
    index = DocumentIndex(embedder=False)  # BM25 only: no dense signal in the first stage
    for text in TEXTS:
        index.add_document(text)
    embedder = HashEmbedder()
    pipeline = (
        ContextPipeline(max_tokens=400)
        .add_step(retriever_step("bm25", index, top_k=4))
        .add_step(reranker_step("rerank", EmbeddingReranker(embedder, weight=1.0), top_k=1))
    )
    result = pipeline.build("refund requests over 100 dollars")
    kept = [i for i in result.window.items if i.source is SourceType.RETRIEVAL]
    assert len(kept) == 1 and "rerank" in kept[0].metadata
