"""Retrievers over ``ContextItem``s: dense, sparse, and hybrid (RRF), plus in-memory stores.

These implement the ``Retriever`` protocol, so they plug into ``retriever_step``. They index
items you already have (the seed-000 API); for documents that need chunking and persistence use
``DocumentIndex``, which is itself a retriever.

>>> from contextfold.testing import HashEmbedder
>>> items = [ContextItem(content="Python is great for data science."),
...          ContextItem(content="RAG combines retrieval with generation.")]
>>> sparse = SparseRetriever()
>>> sparse.index(items)
>>> dense = DenseRetriever(embedder=HashEmbedder())
>>> dense.index(items)
>>> hybrid = HybridRetriever([dense, sparse])
>>> hit = hybrid.retrieve(QueryBundle(query_str="How does retrieval work?"), top_k=1)[0]
>>> hit.content, hit.metadata["match_source"]
('RAG combines retrieval with generation.', 'hybrid')
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from contextfold.errors import ConfigError
from contextfold.items import ContextItem, QueryBundle
from contextfold.protocols import Retriever
from contextfold.retrieval.base import Embedder
from contextfold.retrieval.dense import NumpyVectorIndex, Vectors
from contextfold.retrieval.embedders import FunctionEmbedder
from contextfold.retrieval.fusion import rrf
from contextfold.retrieval.sparse import BM25Index

if TYPE_CHECKING:
    from contextfold.retrieval.index import DocumentIndex

__all__ = [
    "DenseRetriever",
    "HybridRetriever",
    "InMemoryContextStore",
    "InMemoryVectorStore",
    "SparseRetriever",
]


def _bundle(query: str | QueryBundle) -> QueryBundle:
    return query if isinstance(query, QueryBundle) else QueryBundle(query_str=query)


def _tagged(item: ContextItem, score: float, signal: str, rank: int) -> ContextItem:
    metadata = {
        **item.metadata,
        "match_source": signal,
        "ranks": {signal: rank},
        "scores": {signal: score},
    }
    return item.model_copy(update={"score": score, "metadata": metadata})


class InMemoryContextStore:
    """Items by id, in insertion order."""

    def __init__(self) -> None:
        self._items: dict[str, ContextItem] = {}

    def __len__(self) -> int:
        return len(self._items)

    def add(self, items: Sequence[ContextItem]) -> None:
        for item in items:
            self._items[item.id] = item

    def get(self, item_id: str) -> ContextItem | None:
        return self._items.get(item_id)

    def items(self) -> list[ContextItem]:
        return list(self._items.values())

    def clear(self) -> None:
        self._items.clear()


class InMemoryVectorStore:
    """Exact cosine search over vectors by id; the dimension is set by the first add."""

    def __init__(self) -> None:
        self._index: NumpyVectorIndex | None = None

    def __len__(self) -> int:
        return 0 if self._index is None else len(self._index)

    def add(self, ids: Sequence[str], vectors: Vectors) -> None:
        array = np.asarray(vectors, dtype=np.float32)
        if array.ndim != 2 or not len(array):
            return
        if self._index is None:
            self._index = NumpyVectorIndex(array.shape[1])
        self._index.add(ids, array)

    def search(self, vector: Vectors, k: int) -> list[tuple[str, float]]:
        return [] if self._index is None else self._index.search(vector, k)

    def clear(self) -> None:
        self._index = None


class DenseRetriever:
    """Nearest items by embedding similarity.

    Give an ``embedder`` (the ``Embedder`` protocol) or the seed's ``embed_fn``; with neither,
    the offline default model is used. A ``QueryBundle.embedding`` is used as-is.
    """

    def __init__(
        self,
        vector_store: InMemoryVectorStore | None = None,
        context_store: InMemoryContextStore | None = None,
        embed_fn: Callable[[str], Sequence[float]] | None = None,
        *,
        embedder: Embedder | None = None,
    ) -> None:
        if embed_fn is not None and embedder is not None:
            raise ConfigError("give embed_fn or embedder, not both")
        self.vector_store = vector_store if vector_store is not None else InMemoryVectorStore()
        self.context_store = context_store if context_store is not None else InMemoryContextStore()
        self._embedder: Embedder | None = (
            FunctionEmbedder(embed_fn, name=f"function:{getattr(embed_fn, '__qualname__', '?')}")
            if embed_fn is not None
            else embedder
        )

    @property
    def embedder(self) -> Embedder:
        if self._embedder is None:
            from contextfold.retrieval.embedders import default_embedder

            self._embedder = default_embedder()
        return self._embedder

    def index(self, items: Sequence[ContextItem]) -> None:
        """Embed and store ``items`` (an item id indexed again is replaced)."""
        if not items:
            return
        self.context_store.add(items)
        self.vector_store.add(
            [i.id for i in items], self.embedder.embed([i.content for i in items])
        )

    def retrieve(self, query: str | QueryBundle, top_k: int = 5) -> list[ContextItem]:
        bundle = _bundle(query)
        if bundle.embedding is not None:
            vector = np.asarray(bundle.embedding, dtype=np.float32)
        else:
            vector = self.embedder.embed([bundle.query_str])[0]
        out = []
        for rank, (item_id, score) in enumerate(self.vector_store.search(vector, top_k), 1):
            item = self.context_store.get(item_id)
            if item is not None:
                out.append(_tagged(item, score, "vector", rank))
        return out


class SparseRetriever:
    """Items ranked by BM25 (bm25s; stemmed English with stop words removed by default)."""

    def __init__(
        self, context_store: InMemoryContextStore | None = None, *, bm25: BM25Index | None = None
    ) -> None:
        self.context_store = context_store if context_store is not None else InMemoryContextStore()
        self._bm25 = bm25 if bm25 is not None else BM25Index()

    def index(self, items: Sequence[ContextItem]) -> None:
        self.context_store.add(items)
        self._bm25.add([i.id for i in items], [i.content for i in items])

    def retrieve(self, query: str | QueryBundle, top_k: int = 5) -> list[ContextItem]:
        out = []
        for rank, (item_id, score) in enumerate(
            self._bm25.search(_bundle(query).query_str, top_k), 1
        ):
            item = self.context_store.get(item_id)
            if item is not None:
                out.append(_tagged(item, score, "bm25", rank))
        return out


class HybridRetriever:
    """Fuses several retrievers with Reciprocal Rank Fusion (k = 60, 1-based ranks).

    Either ``retrievers`` (each asked for ``fetch_k`` items; items are matched by id) with
    optional per-retriever ``weights``, or ``memory=`` a ``DocumentIndex`` (the seed-002 form),
    whose own BM25 + dense hybrid search is used. A result's ``metadata["match_source"]`` is
    ``"hybrid"`` when more than one signal found it.
    """

    def __init__(
        self,
        retrievers: Sequence[Retriever] | None = None,
        *,
        memory: DocumentIndex | None = None,
        weights: Sequence[float] | None = None,
        rrf_k: int = 60,
        fetch_k: int = 50,
    ) -> None:
        if (retrievers is None) == (memory is None):
            raise ConfigError("HybridRetriever needs either retrievers=[...] or memory=<index>")
        if retrievers is not None and weights is not None and len(weights) != len(retrievers):
            raise ConfigError(f"{len(retrievers)} retrievers but {len(weights)} weights")
        self.retrievers = list(retrievers or [])
        self.memory = memory
        self.weights = list(weights) if weights is not None else None
        self.rrf_k, self.fetch_k = rrf_k, fetch_k

    def retrieve(self, query: str | QueryBundle, top_k: int = 5) -> list[ContextItem]:
        bundle = _bundle(query)
        if self.memory is not None:
            from contextfold.retrieval.index import hits_to_items

            return hits_to_items(self.memory.search(bundle, top_k, mode="hybrid"))
        rankings: dict[str, list[str]] = {}
        found: dict[str, ContextItem] = {}
        signal_of: dict[str, str] = {}
        per_signal: dict[str, dict[str, float]] = {}
        for n, retriever in enumerate(self.retrievers):
            results = retriever.retrieve(bundle, max(top_k, self.fetch_k))
            name = f"{n}:{type(retriever).__name__}"
            signal_of[name] = str(
                results[0].metadata.get("match_source", name) if results else name
            )
            rankings[name] = [item.id for item in results]
            per_signal[name] = {item.id: item.score for item in results}
            for item in results:
                found.setdefault(item.id, item)
        weights: Mapping[str, float] | None = (
            dict(zip(rankings, self.weights, strict=True)) if self.weights else None
        )
        out = []
        for hit in rrf(rankings, k=self.rrf_k, weights=weights, limit=top_k):
            signals = {signal_of[name] for name in hit.ranks}
            source = "hybrid" if len(hit.ranks) > 1 else next(iter(signals))
            metadata: dict[str, Any] = {
                **found[hit.id].metadata,
                "match_source": source,
                "ranks": {signal_of[name]: rank for name, rank in hit.ranks.items()},
                "scores": {
                    **{signal_of[name]: per_signal[name][hit.id] for name in hit.ranks},
                    "hybrid": hit.score,
                },
            }
            out.append(found[hit.id].model_copy(update={"score": hit.score, "metadata": metadata}))
        return out
