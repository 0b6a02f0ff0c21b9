"""The relevance floor: a query the corpus does not cover returns nothing rather than noise.

Over the real example policy corpus (examples/policies) with the real default embedder: an
unrelated question gets no hit in any mode and no entry point from ``/api/context``'s
``graph_context``, a related one still does, and ``relevance_floor=False`` brings back the
behaviour before the floor (dense search always answers ``k`` hits).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from contextfold.errors import ConfigError
from contextfold.retrieval.embedders import default_embedder
from contextfold.retrieval.floor import BM25_FLOOR, RelevanceFloor, default_floor, resolve_floor
from contextfold.retrieval.graph import GraphContextRequest, KnowledgeGraph, graph_context
from contextfold.retrieval.index import DocumentIndex
from contextfold.testing import HashEmbedder

POLICIES = Path(__file__).parents[1] / "examples" / "policies"
RESULTS = Path(__file__).parents[1] / "benchmarks" / "results"
UNRELATED = "weather on Mars"  # the query of the report
RELATED = "Can I expense Uber rides during business travel?"
MODES = ["bm25", "dense", "hybrid"]


@pytest.fixture(scope="module")
def index() -> DocumentIndex:
    index = DocumentIndex(embedder=default_embedder())
    for path in sorted(POLICIES.glob("*.[mt][dx]*")):
        index.add_document(path.read_text(encoding="utf-8"), {"source": path.name})
    return index


@pytest.fixture(scope="module")
def graph() -> KnowledgeGraph:
    graph = KnowledgeGraph()
    for path in sorted(POLICIES.glob("*.[mt][dx]*")):
        for n, part in enumerate(path.read_text(encoding="utf-8").split("\n\n")):
            if part.strip():
                graph.add_node("t", "faq", f"{path.stem} {n}", summary=part.strip()[:500])
    return graph


@pytest.mark.parametrize("mode", MODES)
def test_an_unrelated_query_returns_nothing(index: DocumentIndex, mode: str) -> None:
    assert index.search(UNRELATED, 5, mode=mode) == []  # type: ignore[arg-type]
    assert index.search_documents(UNRELATED, 5, mode=mode) == []  # type: ignore[arg-type]


@pytest.mark.parametrize("mode", MODES)
def test_a_related_query_still_finds_the_policy(index: DocumentIndex, mode: str) -> None:
    hits = index.search(RELATED, 5, mode=mode)  # type: ignore[arg-type]
    assert hits and hits[0].metadata["source"] == "ground_transport_policy.txt"


def test_floor_off_is_the_old_behaviour(index: DocumentIndex) -> None:
    off = index.search(UNRELATED, 5, mode="dense", relevance_floor=False)
    assert len(off) == 5  # dense search always answers k hits, however far
    unfloored = DocumentIndex(embedder=default_embedder(), relevance_floor=False)
    assert unfloored.relevance_floor is None
    for mode in MODES:
        on = [h.id for h in index.search(RELATED, 5, mode=mode)]  # type: ignore[arg-type]
        every = [h.id for h in index.search(RELATED, 5, mode=mode, relevance_floor=False)]  # type: ignore[arg-type]
        assert on == every[: len(on)]  # the floor only cuts the tail, never reorders


def test_api_context_has_no_entry_points_for_an_unrelated_query(graph: KnowledgeGraph) -> None:
    embedder = default_embedder()
    request = GraphContextRequest(query=UNRELATED, tenant_ids=["t"])
    response = graph_context(graph, request, embedder=embedder)
    assert response.entry_points == [] and response.context == []
    assert graph_context(graph, request, embedder=embedder, relevance_floor=False).entry_points
    related = request.model_copy(update={"query": RELATED})
    assert graph_context(graph, related, embedder=embedder).entry_points


def test_floors_resolve_per_embedder() -> None:
    calibrated = default_floor(default_embedder().name)
    # The shipped floors are the ones the newest calibration chose on SciFact train.
    runs = sorted(RESULTS.glob("retrieval_floor_calibration-*Z.json"))
    chosen = json.loads(runs[-1].read_text(encoding="utf-8"))["chosen"]["floors"]
    assert calibrated == RelevanceFloor(**chosen) and chosen["bm25"] == BM25_FLOOR
    # Cosine floors are not carried over to an embedder they were not calibrated for.
    assert DocumentIndex(embedder=HashEmbedder()).relevance_floor == RelevanceFloor(
        bm25=BM25_FLOOR, dense=-1.0, hybrid=-1.0
    )
    assert resolve_floor({"dense": 0.5}, default_embedder().name) == RelevanceFloor(
        bm25=BM25_FLOOR, dense=0.5, hybrid=calibrated.hybrid, dense_margin=calibrated.dense_margin
    )
    assert calibrated.dense_margin > 0  # the dense floor judges the query, not each hit
    with pytest.raises(ConfigError, match="bm25, dense and hybrid"):
        DocumentIndex(embedder=False, relevance_floor={"sparse": 0.1})


def test_the_server_config_key_takes_on_off_or_per_mode_floors() -> None:
    from pydantic import ValidationError

    from contextfold.server.config import ContextApiSettings

    assert ContextApiSettings().relevance_floor is True
    assert ContextApiSettings(relevance_floor=False).relevance_floor is False
    assert ContextApiSettings(relevance_floor={"dense": 0.4}).relevance_floor == {"dense": 0.4}
    with pytest.raises(ValidationError, match="bm25, dense and hybrid"):
        ContextApiSettings(relevance_floor={"sparse": 0.1})


# --------------------------------------------------------------------------- function words

TINY = [
    "Refunds are issued within 14 days of the return. What you get back depends on how you paid.",
    "Uber rides are reimbursed for business travel; keep the receipt.",
    "The office is closed on public holidays, and it opens at nine otherwise.",
]


@pytest.fixture(scope="module")
def tiny() -> DocumentIndex:
    """Three short documents: too few for IDF to tell a function word from a topic word."""
    index = DocumentIndex(embedder=False)
    for text in TINY:
        index.add_document(text)
    return index


@pytest.mark.parametrize(
    "query", ["what", "what is it", "What is it?", "how do you", "What is the weather on Mars?"]
)
def test_function_words_are_no_evidence_on_a_tiny_corpus(tiny: DocumentIndex, query: str) -> None:
    # Each query shares a word with a document ("what", "it", "how", "you"), and on three
    # documents that word is as rare as any; the floor must still see no topic in common.
    assert tiny.search(query, 5, mode="bm25") == []
    assert tiny.search_documents(query, 5, mode="bm25") == []
    assert tiny.search(query, 5, mode="bm25", relevance_floor=False)  # the match exists


@pytest.mark.parametrize("query", ["refund", "How do I get a refund?", "what about uber rides"])
def test_a_topic_word_among_function_words_still_counts(tiny: DocumentIndex, query: str) -> None:
    hits = tiny.search(query, 5, mode="bm25")
    assert hits and hits[0].text in TINY[:2]
    assert all(h.scores["bm25_share"] >= BM25_FLOOR for h in hits)


@pytest.mark.parametrize("mode", ["bm25", "hybrid"])
def test_function_words_alone_find_no_policy(index: DocumentIndex, mode: str) -> None:
    for query in ("what", "what is it", "What is the weather on Mars?"):
        assert index.search(query, 5, mode=mode) == [], query  # type: ignore[arg-type]


def test_api_context_ignores_function_words(graph: KnowledgeGraph) -> None:
    request = GraphContextRequest(query="what is it", tenant_ids=["t"])
    assert graph_context(graph, request, embedder=None).entry_points == []
    related = request.model_copy(update={"query": "what about uber rides"})
    assert graph_context(graph, related, embedder=None).entry_points


# --------------------------------------------------------------------------- the dense margin

ABSOLUTE = RelevanceFloor(bm25=BM25_FLOOR, dense=0.34, hybrid=0.385)  # the floor before margins
MARGIN = RelevanceFloor(bm25=BM25_FLOOR, dense=0.34, hybrid=0.385, dense_margin=0.2)


def test_the_dense_margin_keeps_an_on_topic_tail(index: DocumentIndex) -> None:
    # "receipts" is on topic (its best chunk, the meals policy, is at cosine 0.49), but the
    # lodging policy's receipt rule sits at 0.31: under the absolute floor (0.34), kept within
    # the margin of the best hit.
    query = "receipts"
    absolute = index.search(query, 10, mode="dense", relevance_floor=ABSOLUTE)
    relative = index.search(query, 10, mode="dense", relevance_floor=MARGIN)
    assert "lodging.md" not in {h.metadata["source"] for h in absolute}
    lodging = [h for h in relative if h.metadata["source"] == "lodging.md"]
    assert lodging and "receipt" in lodging[0].text.lower()
    assert lodging[0].scores["vector"] < ABSOLUTE.dense
    best = relative[0].scores["vector"]
    assert all(h.scores["vector"] >= best - MARGIN.dense_margin for h in relative)
    assert [h.id for h in absolute] == [h.id for h in relative][: len(absolute)]
    every = index.search(query, 10, mode="dense", relevance_floor=False)
    assert len(relative) < len(every)  # the margin still trims the far tail
    docs = index.search_documents(query, 10, mode="dense", relevance_floor=MARGIN)
    fewer = index.search_documents(query, 10, mode="dense", relevance_floor=ABSOLUTE)
    assert len(docs) > len(fewer)


@pytest.mark.parametrize("margin", [0.2, 1.0, 2.0])
def test_the_dense_margin_never_lets_an_off_topic_query_through(
    index: DocumentIndex, margin: float
) -> None:
    # The margin applies only below a best hit that reaches the floor: a query whose nearest
    # chunk is far (cosine 0.13 for "weather on Mars") still gets nothing, however wide it is.
    floor = {"dense": 0.34, "dense_margin": margin}
    assert index.search(UNRELATED, 5, mode="dense", relevance_floor=floor) == []
    assert index.search_documents(UNRELATED, 5, mode="dense", relevance_floor=floor) == []


def test_the_margin_is_per_query() -> None:
    floor = RelevanceFloor(bm25=0.2, dense=0.34, hybrid=0.385, dense_margin=0.1)
    assert floor.keeps("dense", None, 0.30, best_cosine=0.36)  # within 0.1 of an on-topic best
    assert not floor.keeps("dense", None, 0.25, best_cosine=0.36)  # beyond the margin
    assert not floor.keeps("dense", None, 0.30, best_cosine=0.33)  # the query is off topic
    assert not floor.keeps("dense", None, 0.30)  # no best known: the absolute floor alone
    assert floor.keeps("dense", None, 0.40, best_cosine=0.60)  # reaching the floor is enough
    # BM25 and hybrid ignore the margin and the best cosine.
    assert not floor.keeps("hybrid", 0.1, 0.30, best_cosine=0.36)
    assert floor.keeps("bm25", 0.2, None, best_cosine=0.0) == ABSOLUTE.keeps("bm25", 0.2, None)
    assert RelevanceFloor(0.2, 0.34, 0.385).dense_margin == 0.0  # no margin: the absolute rule


@pytest.mark.parametrize("bad", [-0.1, math.nan, "0.1", True, None])
def test_a_bad_dense_margin_is_a_config_error(bad: object) -> None:
    with pytest.raises(ConfigError, match="dense_margin"):
        RelevanceFloor(bm25=0.1, dense=0.3, hybrid=0.3, dense_margin=bad)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="dense_margin"):
        DocumentIndex(embedder=False, relevance_floor={"dense_margin": bad})  # type: ignore[dict-item]


def test_the_dense_margin_is_a_mapping_key() -> None:
    from pydantic import ValidationError

    from contextfold.server.config import ContextApiSettings

    name = default_embedder().name
    assert resolve_floor({"dense_margin": 0.05}, name) == RelevanceFloor(
        **{**default_floor(name).as_dict(), "dense_margin": 0.05}
    )
    assert ContextApiSettings(relevance_floor={"dense_margin": 0.1}).relevance_floor == {
        "dense_margin": 0.1
    }
    with pytest.raises(ValidationError, match="dense_margin"):
        ContextApiSettings(relevance_floor={"dense_margin": -0.1})
