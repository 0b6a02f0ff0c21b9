"""Rerankers: the ``Reranker`` protocol's offline implementation, ``EmbeddingReranker``.

No cross-encoder ships with contextfold: none installs from a package with its weights, so
every one would download a model at run time (docs/reranking.md says which were checked).
``EmbeddingReranker`` re-scores retrieved items by the cosine similarity of the query and each
item under an ``Embedder`` (the offline MiniLM by default), blended with the item's own score
(min-max scaled over the candidates) by ``weight``. It helps where the first stage had no
dense signal (BM25-only retrieval, graph context, items from a keyword search elsewhere).

>>> from contextfold.items import ContextItem, QueryBundle
>>> from contextfold.testing import HashEmbedder
>>> items = [ContextItem(content="the kitchen tiles are white", score=2.0),
...          ContextItem(content="refunds take 14 days", score=1.0)]
>>> best = EmbeddingReranker(HashEmbedder(), weight=1.0).rerank(
...     QueryBundle(query_str="refunds take 14 days"), items, 1)
>>> best[0].content
'refunds take 14 days'
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from contextfold.errors import ConfigError
from contextfold.items import ContextItem, QueryBundle

if TYPE_CHECKING:
    from contextfold.retrieval.base import Embedder

__all__ = ["EmbeddingReranker"]


class EmbeddingReranker:
    """Re-orders items by ``weight × cosine(query, item) + (1 − weight) × scaled score``.

    ``score`` of each returned item is that blend; its metadata gains ``rerank`` with the
    cosine, the scaled first-stage score and the first-stage rank. A ``QueryBundle`` with an
    ``embedding`` is not embedded again. Returns at most ``top_k`` items, best first (ties:
    first-stage order), and never changes its inputs."""

    def __init__(self, embedder: Embedder | None = None, *, weight: float = 0.7) -> None:
        if not 0.0 <= weight <= 1.0:
            raise ConfigError(f"weight must be in [0, 1], got {weight}")
        if embedder is None:
            from contextfold.retrieval.embedders import default_embedder

            embedder = default_embedder()
        self.embedder = embedder
        self.weight = weight

    def __repr__(self) -> str:
        return f"EmbeddingReranker(embedder={self.embedder.name!r}, weight={self.weight})"

    def rerank(
        self, query: QueryBundle, items: Sequence[ContextItem], top_k: int
    ) -> list[ContextItem]:
        if top_k <= 0 or not items:
            return []
        if query.embedding is not None:
            q = np.asarray(query.embedding, dtype=np.float32)
            q = q / (np.linalg.norm(q) or 1.0)
        else:
            q = self.embedder.embed([query.query_str])[0]
        vectors = self.embedder.embed([item.content for item in items])
        cosine = vectors @ q
        first = np.array([item.score for item in items], dtype=np.float64)
        spread = float(first.max() - first.min())
        scaled = (first - first.min()) / spread if spread > 0 else np.ones_like(first)
        blended = self.weight * cosine + (1.0 - self.weight) * scaled
        order = sorted(range(len(items)), key=lambda i: (-float(blended[i]), i))[:top_k]
        return [
            items[i].model_copy(
                update={
                    "score": float(blended[i]),
                    "metadata": {
                        **items[i].metadata,
                        "rerank": {
                            "cosine": float(cosine[i]),
                            "first_stage": float(scaled[i]),
                            "first_stage_rank": i + 1,
                        },
                    },
                }
            )
            for i in order
        ]
