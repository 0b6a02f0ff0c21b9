"""An argument that is an empty container-like object (``__len__`` 0) is still the argument:
constructors test ``is None``, never truthiness, before falling back to a default."""

from __future__ import annotations

from contextfold.memory.compactor import Compactor, TokenMonitor
from contextfold.memory.rules import TagRules
from contextfold.retrieval.index import DocumentIndex
from contextfold.retrieval.retrievers import SparseRetriever
from contextfold.retrieval.sparse import BM25Index
from contextfold.store.sqlite.memory import MemoryStore

PARAMS = {"k1": 0.9, "b": 0.4, "method": "robertson", "stemmer": None, "stopwords": None}


def _params(index: BM25Index) -> dict[str, object]:
    return {key: getattr(index, key) for key in PARAMS}


def test_document_index_uses_the_empty_bm25_index_it_is_given() -> None:
    bm25 = BM25Index(**PARAMS)  # type: ignore[arg-type]
    assert len(bm25) == 0 and not bm25  # falsy: ``bm25 or BM25Index()`` dropped it
    index = DocumentIndex(embedder=False, bm25=bm25)
    for text in ("Refunds take fourteen days.", "Shipping is free.", "Returns need a receipt."):
        index.add_document(text)
    assert _params(index._bm25) == PARAMS  # kept through the rebuild from the store
    assert index._bm25_params == PARAMS
    hits = index.search("refunds", mode="bm25")
    assert [h.text for h in hits] == ["Refunds take fourteen days."]


def test_sparse_retriever_uses_the_empty_bm25_index_it_is_given() -> None:
    bm25 = BM25Index(**PARAMS)  # type: ignore[arg-type]
    assert SparseRetriever(bm25=bm25)._bm25 is bm25


def test_compactor_keeps_the_empty_rules_it_is_given(tmp_path) -> None:
    rules = TagRules([])
    assert len(rules) == 0
    store = MemoryStore(tmp_path / "memory.db")
    compactor = Compactor(store, summarizer=None, monitor=TokenMonitor(1000), rules=rules)  # type: ignore[arg-type]
    assert compactor.rules is rules
