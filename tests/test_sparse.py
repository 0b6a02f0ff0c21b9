"""BM25Index: scores match bm25s and the Lucene formula; filters, updates, persistence."""

from __future__ import annotations

import math

import bm25s
import numpy as np
import pytest
import Stemmer

from contextfold.errors import ConfigError, StoreError
from contextfold.retrieval.sparse import BM25Index, analyze

CORPUS = {
    "d1": "The cat sat on the mat while the other cats watched.",
    "d2": "Dogs chase cats in the park every morning.",
    "d3": "Quantum computers factor integers with Shor's algorithm.",
    "d4": "A cat and a dog can share a home peacefully.",
    "d5": "Refund requests are processed within fourteen days.",
}


@pytest.fixture
def index() -> BM25Index:
    idx = BM25Index()
    idx.add(list(CORPUS), list(CORPUS.values()))
    return idx


def test_scores_equal_raw_bm25s_with_the_same_analysis(index: BM25Index) -> None:
    raw = bm25s.BM25()
    raw.index(
        bm25s.tokenize(
            list(CORPUS.values()),
            stopwords="en",
            stemmer=Stemmer.Stemmer("english"),
            show_progress=False,
        ),
        show_progress=False,
    )
    for query in ["cats and dogs", "refund processing time", "quantum algorithm cat"]:
        tokens = bm25s.tokenize(
            query,
            stopwords="en",
            stemmer=Stemmer.Stemmer("english"),
            return_ids=False,
            show_progress=False,
        )[0]
        np.testing.assert_allclose(index.scores(query), raw.get_scores(tokens), rtol=1e-6)


def test_scores_follow_the_lucene_bm25_formula(index: BM25Index) -> None:
    docs = [analyze(text) for text in CORPUS.values()]
    avgdl = sum(map(len, docs)) / len(docs)
    k1, b = 1.5, 0.75

    def lucene(term: str, doc: list[str]) -> float:
        df = sum(term in d for d in docs)
        idf = math.log(1 + (len(docs) - df + 0.5) / (df + 0.5))
        tf = doc.count(term)
        # Lucene (since 8.0) drops the constant (k1 + 1) factor from the numerator.
        return idf * tf / (tf + k1 * (1 - b + b * len(doc) / avgdl))

    expected = [sum(lucene(t, d) for t in analyze("cat park")) for d in docs]
    np.testing.assert_allclose(index.scores("cat park"), expected, rtol=1e-5)


def test_search_returns_only_documents_sharing_a_term_best_first(index: BM25Index) -> None:
    hits = index.search("cats", k=10)
    assert {doc for doc, _ in hits} == {"d1", "d2", "d4"}
    assert [s for _, s in hits] == sorted((s for _, s in hits), reverse=True)
    assert index.search("zebra unicorn", k=10) == []


def test_allowed_restricts_matches_before_ranking(index: BM25Index) -> None:
    assert [doc for doc, _ in index.search("cat", k=10, allowed={"d4", "d3"})] == ["d4"]
    assert index.search("cat", k=10, allowed=set()) == []


def test_k_caps_results(index: BM25Index) -> None:
    assert len(index.search("cat dog", k=2)) == 2
    assert index.search("cat", k=0) == []


def test_adding_an_id_again_replaces_its_text(index: BM25Index) -> None:
    index.add(["d3"], ["A kitten is a young cat."])
    assert "d3" in {doc for doc, _ in index.search("kitten", k=5)}
    assert index.search("quantum", k=5) == []
    assert len(index) == 5


def test_remove_and_clear(index: BM25Index) -> None:
    index.remove(["d1", "missing"])
    assert "d1" not in {doc for doc, _ in index.search("cat", k=10)}
    index.clear()
    assert len(index) == 0 and index.search("cat", k=10) == []


def test_save_and_mmap_load_give_identical_results(index: BM25Index, tmp_path) -> None:
    index.save(tmp_path / "bm25")
    loaded = BM25Index.load(tmp_path / "bm25", mmap=True)
    for query in ["cat", "refund days", "dogs park"]:
        assert loaded.search(query, k=5) == index.search(query, k=5)


def test_a_loaded_index_needs_its_texts_before_adding(index: BM25Index, tmp_path) -> None:
    index.save(tmp_path / "bm25")
    loaded = BM25Index.load(tmp_path / "bm25")
    with pytest.raises(StoreError, match="cannot be extended"):
        loaded.add(["d9"], ["new text"])
    loaded.set_texts(CORPUS)
    loaded.add(["d9"], ["a giraffe appears"])
    assert [doc for doc, _ in loaded.search("giraffe", k=3)] == ["d9"]


def test_loading_a_missing_folder_is_a_store_error(tmp_path) -> None:
    with pytest.raises(StoreError, match="no readable BM25 index"):
        BM25Index.load(tmp_path / "nothing")


@pytest.mark.parametrize(("k1", "b"), [(-1.0, 0.75), (1.2, 1.5), (1.2, -0.1)])
def test_invalid_parameters_are_config_errors(k1: float, b: float) -> None:
    with pytest.raises(ConfigError, match="k1"):
        BM25Index(k1=k1, b=b)


def test_mismatched_ids_and_texts_are_rejected() -> None:
    with pytest.raises(ConfigError, match="2 ids but 1 texts"):
        BM25Index().add(["a", "b"], ["only one"])


def test_analysis_without_stemming_or_stopwords() -> None:
    assert analyze("The Running dogs", stemmer=None, stopwords=None) == ["the", "running", "dogs"]
    with pytest.raises(ConfigError, match="stemmer"):
        analyze("several words", stemmer="klingon")


def test_score_of_and_reusing_a_scores_vector(index: BM25Index) -> None:
    scores = index.scores("cat park")
    assert index.search("ignored", k=3, scores=scores) == index.search("cat park", k=3)
    looked_up = index.score_of(scores, ["d2", "d3", "nope"])
    assert looked_up[0] > 0 and looked_up[1] == 0.0 and looked_up[2] == 0.0
