"""DocumentIndex: hybrid search end to end, filters, idempotence, persistence."""

from __future__ import annotations

from typing import Any

import pytest

from contextfold.errors import ConfigError
from contextfold.items import QueryBundle, SourceType
from contextfold.retrieval.base import Chunk, chunk_id
from contextfold.retrieval.index import DocumentIndex
from contextfold.testing import HashEmbedder

DOCS = {
    "refunds": (
        "Refunds are processed within 14 days.\n\nRefund requests need the original receipt."
    ),
    "hotels": "Hotel stays in London are capped at 220 euros per night.",
    "flights": "Business class is allowed on flights longer than nine hours.",
    "taxis": "Taxis are reimbursable when public transport is impractical.",
}


class ParagraphChunker:
    """A minimal real chunker: one chunk per blank-line paragraph."""

    def chunk(self, text: str) -> list[str]:
        return [p for p in text.split("\n\n") if p.strip()]

    def split(
        self, text: str, *, doc_id: str, metadata: dict[str, Any] | None = None
    ) -> list[Chunk]:
        out, start = [], 0
        for i, part in enumerate(self.chunk(text)):
            start = text.index(part, start)
            out.append(
                Chunk(
                    id=chunk_id(doc_id, i, part),
                    doc_id=doc_id,
                    index=i,
                    text=part,
                    start=start,
                    end=start + len(part),
                    token_count=len(part.split()),
                    metadata={**(metadata or {}), "chunk_index": i},
                )
            )
        return out


def _index(path=None, **kwargs) -> DocumentIndex:
    index = DocumentIndex(path, embedder=HashEmbedder(), chunker=ParagraphChunker(), **kwargs)
    for name, text in DOCS.items():
        index.add_document(
            text,
            {"topic": name, "source": f"{name}.txt"},
            tenant="acme" if name != "taxis" else "globex",
        )
    return index


def test_documents_are_chunked_and_counted() -> None:
    index = _index()
    assert index.store.count() == (4, 5)
    assert len(index) == 5


@pytest.mark.parametrize("mode", ["bm25", "dense", "hybrid"])
def test_each_mode_finds_the_relevant_chunk_first(mode) -> None:
    hit = _index().search("how many days until refunds are processed", k=3, mode=mode)[0]
    assert hit.text.startswith("Refunds are processed")
    assert hit.metadata["source"] == "refunds.txt" and hit.metadata["topic"] == "refunds"


def test_rrf_hybrid_hits_carry_per_signal_ranks_and_match_source() -> None:
    hits = _index(fusion="rrf").search("refund receipt", k=5, mode="hybrid")
    both = [h for h in hits if h.match_source == "hybrid"]
    assert both, "a chunk found by BM25 and dense must be marked hybrid"
    for hit in both:
        assert set(hit.ranks) == {"bm25", "vector"}
        expected = sum(1 / (60 + r) for r in hit.ranks.values())
        assert hit.score == pytest.approx(expected) == hit.scores["hybrid"]
    assert [h.score for h in hits] == sorted((h.score for h in hits), reverse=True)


def test_convex_hybrid_scores_are_normalised_weighted_sums() -> None:
    index = _index(alpha=0.3)
    hits = index.search("refund receipt days", k=5, mode="hybrid")
    pool_bm25 = max(h.scores.get("bm25", 0.0) for h in hits)
    pool_cos = max(h.scores["vector"] for h in hits)
    for hit in hits:
        expected = 0.3 * hit.scores.get("bm25", 0.0) / pool_bm25 + 0.7 * (
            hit.scores["vector"] + 1
        ) / (pool_cos + 1)
        assert hit.score == pytest.approx(expected, rel=1e-5) == hit.scores["hybrid"]
    assert [h.score for h in hits] == sorted((h.score for h in hits), reverse=True)
    assert hits[0].match_source == "hybrid" and set(hits[0].ranks) == {"bm25", "vector"}


@pytest.mark.parametrize(
    ("kwargs", "fragment"), [({"fusion": "max"}, "fusion"), ({"alpha": 2}, "alpha")]
)
def test_invalid_fusion_settings(kwargs, fragment) -> None:
    with pytest.raises(ConfigError, match=fragment):
        DocumentIndex(embedder=False, **kwargs)


def test_bm25_only_hits_are_marked_bm25() -> None:
    hits = _index().search("London hotel", k=2, mode="bm25")
    assert hits[0].match_source == "bm25" and set(hits[0].ranks) == {"bm25"}


def test_tenant_filter_applies_before_ranking() -> None:
    index = _index()
    assert all(
        h.metadata["tenant"] == "globex"
        for h in index.search("refunds taxis", k=5, tenants=["globex"])
    )
    assert [
        h.metadata["topic"] for h in index.search("taxis", k=5, tenants=["acme"], mode="bm25")
    ] == []


def test_metadata_filters_from_arguments_and_query_bundle() -> None:
    index = _index()
    hits = index.search("capped allowed reimbursable", k=5, filters={"topic": "flights"})
    assert {h.metadata["topic"] for h in hits} == {"flights"}
    bundle = QueryBundle(query_str="refunds hotels", filters={"topic": ["hotels"]})
    assert {h.metadata["topic"] for h in index.search(bundle, k=5)} == {"hotels"}


def test_adding_the_same_text_again_is_a_no_op() -> None:
    index = _index()
    version = index.version
    result = index.add_document(DOCS["hotels"], {"topic": "hotels"}, tenant="acme")
    assert result.added is False and index.version == version
    assert index.add_document(DOCS["hotels"], tenant="other").added is True  # other tenant


def test_empty_documents_are_rejected() -> None:
    with pytest.raises(ConfigError, match="empty"):
        _index().add_document("   \n")


def test_remove_document_and_clear() -> None:
    index = _index()
    hotels = index.search("London hotel", k=1)[0].metadata["doc_id"]
    assert index.remove_document(hotels) is True
    assert all(h.metadata["doc_id"] != hotels for h in index.search("London hotel", k=5))
    index.clear()
    assert len(index) == 0 and index.search("refunds", k=5) == []


def test_a_file_index_reopens_with_the_same_results(tmp_path) -> None:
    path = tmp_path / "docs.db"
    first = _index(path)
    first.save()
    expected = [(h.id, round(h.score, 6)) for h in first.search("refund receipt days", k=4)]
    again = DocumentIndex(path, embedder=HashEmbedder(), chunker=ParagraphChunker())
    assert [(h.id, round(h.score, 6)) for h in again.search("refund receipt days", k=4)] == expected
    again.add_document("Parking at airports is reimbursed up to 30 euros a day.")
    assert again.search("airport parking", k=1, mode="bm25")[0].text.startswith("Parking")
    again.save()  # replaces the files `again` itself has memory-mapped
    third = DocumentIndex(path, embedder=HashEmbedder(), chunker=ParagraphChunker())
    assert third.search("airport parking", k=1, mode="bm25")[0].text.startswith("Parking")
    assert sorted(p.name for p in tmp_path.iterdir() if "bm25" in p.name) == ["docs.db.bm25"]


def test_dense_search_without_an_embedder_is_a_clear_error() -> None:
    index = DocumentIndex(embedder=False, chunker=ParagraphChunker())
    index.add_document("Only BM25 here.")
    assert index.search("BM25", k=1, mode="hybrid")[0].match_source == "bm25"
    with pytest.raises(ConfigError, match="needs an embedder"):
        index.search("BM25", k=1, mode="dense")


def test_query_bundle_embedding_is_used_as_is() -> None:
    index = _index()
    vector = HashEmbedder().embed(["London hotel night cap"])[0].tolist()
    hit = index.search(QueryBundle(query_str="zzz", embedding=vector), k=1, mode="dense")[0]
    assert "London" in hit.text


def test_search_documents_aggregates_chunks_to_documents() -> None:
    index = _index()
    docs = index.search_documents("refund receipt original", k=3)
    ids = [d for d, _ in docs]
    assert len(ids) == len(set(ids))  # the two refund chunks collapse into one document
    refunds = index.search("refund receipt", k=1)[0].metadata["doc_id"]
    assert ids[0] == refunds


def test_mmr_prefers_diverse_chunks() -> None:
    index = DocumentIndex(embedder=HashEmbedder(), chunker=ParagraphChunker())
    index.add_document(
        "Refund policy refund rules.\n\nRefund policy refund rules again.\n\nHotel refund."
    )
    plain = [h.text for h in index.search("refund policy", k=2)]
    diverse = [h.text for h in index.search("refund policy", k=2, mmr_lambda=0.3)]
    assert plain[:2] != diverse[:2] and "Hotel refund." in diverse


def test_retrieve_returns_retrieval_items() -> None:
    items = _index().retrieve("London hotel", top_k=2)
    assert items[0].source is SourceType.RETRIEVAL
    assert items[0].metadata["match_source"] in {"bm25", "vector", "hybrid"}
    assert items[0].score >= items[1].score


def test_invalid_mode_is_rejected() -> None:
    with pytest.raises(ConfigError, match="search mode"):
        _index().search("x", mode="fuzzy")  # type: ignore[arg-type]


def test_a_second_writer_on_the_same_file_is_seen(tmp_path) -> None:
    path = tmp_path / "shared.db"
    reader = _index(path)
    assert reader.search("giraffe", k=1, mode="bm25") == []
    writer = DocumentIndex(path, embedder=HashEmbedder(), chunker=ParagraphChunker())
    writer.add_document("A giraffe may be expensed as a team mascot.")
    assert reader.search("giraffe", k=1)[0].text.startswith("A giraffe")
    assert reader.search("giraffe mascot", k=1, mode="dense")[0].text.startswith("A giraffe")


def test_chunks_stored_without_vectors_are_embedded_when_dense_search_needs_them(tmp_path) -> None:
    path = tmp_path / "late.db"
    bm25_only = DocumentIndex(path, embedder=False, chunker=ParagraphChunker())
    bm25_only.add_document("Hotel stays in London are capped at 220 euros per night.")
    dense = DocumentIndex(path, embedder=HashEmbedder(), chunker=ParagraphChunker())
    hit = dense.search("London hotel", k=1, mode="dense")[0]
    assert hit.match_source == "vector" and "London" in hit.text
    assert dense.store.chunks_without_vectors(HashEmbedder().name) == []


def test_embedded_ahead_stores_the_vectors_the_plain_path_stores() -> None:
    """``embedded_ahead`` embeds a text's chunks before the block, and ``add_documents``
    inside it embeds none of them again; the vectors stored are those embedded inline."""
    texts = [DOCS["hotels"], DOCS["flights"] + "\n\n" + DOCS["hotels"]]
    plain = DocumentIndex(embedder=HashEmbedder(), chunker=ParagraphChunker())
    plain.add_documents([(t, None) for t in texts])
    calls: list[list[str]] = []

    class Counting(HashEmbedder):
        def embed(self, texts: Any) -> Any:
            calls.append(list(texts))
            return super().embed(texts)

    ahead = DocumentIndex(embedder=Counting(), chunker=ParagraphChunker())
    with ahead.embedded_ahead(texts):
        before = len(calls)
        ahead.add_documents([(t, None) for t in texts])
        assert len(calls) == before, "embedded again inside the block"
    assert not ahead._ahead, "vectors kept after the block"
    query = DOCS["flights"]
    assert [(h.id, round(h.score, 6)) for h in plain.search(query, mode="dense")] == [
        (h.id, round(h.score, 6)) for h in ahead.search(query, mode="dense")
    ]
    assert calls[0] == [DOCS["hotels"], DOCS["flights"]]  # each chunk text once


def test_a_tenant_given_as_a_string_is_that_one_tenant() -> None:
    """``tenants="acme"`` means the tenant ``acme``, not the tenants a, c, m and e."""
    index = DocumentIndex(embedder=False, chunker=ParagraphChunker(), relevance_floor=False)
    index.add_document("Acme refunds take fourteen days.", tenant="acme")
    index.add_document("Tenant a refunds take one day.", tenant="a")
    index.add_document("Tenant c refunds take two days.", tenant="c")
    texts = [h.text for h in index.search("refunds", mode="bm25", tenants="acme")]
    assert texts == ["Acme refunds take fourteen days."]
    by_doc = index.search_documents("refunds", mode="bm25", tenants="acme")
    assert [d for d, _ in by_doc] == [index.search("fourteen", mode="bm25")[0].metadata["doc_id"]]
