"""RRF and MMR: the published formulas, deterministic ties, validation."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from contextfold.errors import ConfigError
from contextfold.retrieval.fusion import convex, mmr, rrf


def test_rrf_sums_reciprocal_ranks_with_k_60() -> None:
    fused = {h.id: h for h in rrf({"bm25": ["a", "b"], "vector": ["b", "c"]})}
    assert fused["a"].score == pytest.approx(1 / 61)
    assert fused["b"].score == pytest.approx(1 / 62 + 1 / 61)
    assert fused["c"].score == pytest.approx(1 / 62)
    assert fused["b"].ranks == {"bm25": 2, "vector": 1}


def test_an_absent_item_contributes_nothing_and_weights_scale() -> None:
    fused = {h.id: h.score for h in rrf({"s": ["a"], "t": ["b"]}, weights={"s": 2.0, "t": 0.5})}
    assert fused == pytest.approx({"a": 2 / 61, "b": 0.5 / 61})


def test_ties_break_by_best_rank_then_first_appearance() -> None:
    # a and c: 1/61 + 1/63 = 0.032266 (best rank 1 each); b: 2/62 = 0.032258
    assert [h.id for h in rrf({"x": ["a", "b", "c"], "y": ["c", "b", "a"]})] == ["a", "c", "b"]
    order = [h.id for h in rrf({"x": ["p", "q"], "y": ["q", "p"]})]
    assert order == ["p", "q"]  # equal scores, equal best rank -> first seen


def test_repeated_ids_in_one_list_count_once() -> None:
    assert rrf({"x": ["a", "a", "b"]})[0].score == pytest.approx(1 / 61)


def test_limit_and_validation() -> None:
    assert len(rrf({"x": list("abcdef")}, limit=3)) == 3
    with pytest.raises(ConfigError, match="k >= 0"):
        rrf({"x": ["a"]}, k=-1)
    with pytest.raises(ConfigError, match="not ranked"):
        rrf({"x": ["a"]}, weights={"y": 1.0})
    with pytest.raises(ConfigError, match=">= 0"):
        rrf({"x": ["a"]}, weights={"x": -1.0})


@given(
    st.dictionaries(
        st.sampled_from(["bm25", "vector", "graph"]),
        st.lists(st.sampled_from(list("abcdefgh")), unique=True, max_size=8),
        min_size=1,
    ),
    st.integers(min_value=0, max_value=100),
)
def test_rrf_property_scores_match_the_formula_and_sort(rankings, k) -> None:
    fused = rrf(rankings, k=k)
    for hit in fused:
        expected = sum(
            1 / (k + ids.index(hit.id) + 1) for ids in rankings.values() if hit.id in ids
        )
        assert hit.score == pytest.approx(expected)
    assert [h.score for h in fused] == sorted((h.score for h in fused), reverse=True)
    assert {h.id for h in fused} == {i for ids in rankings.values() for i in ids}


def test_mmr_trades_relevance_for_diversity() -> None:
    def same_topic(a: str, b: str) -> float:
        return 1.0 if a[0] == b[0] else 0.0

    relevance = {"a1": 1.0, "a2": 0.95, "b1": 0.6}
    assert mmr(list(relevance), relevance, same_topic, k=2, lambda_=1.0) == ["a1", "a2"]
    assert mmr(list(relevance), relevance, same_topic, k=2, lambda_=0.5) == ["a1", "b1"]
    with pytest.raises(ConfigError):
        mmr(["a"], {"a": 1.0}, same_topic, k=1, lambda_=1.5)


def test_convex_normalises_by_theoretical_minimum_and_pool_maximum() -> None:
    hits = convex(
        {"bm25": {"a": 8.0, "b": 2.0}, "vector": {"a": 0.0, "b": 0.5, "c": 1.0}},
        weights={"bm25": 0.2, "vector": 0.8},
        minimums={"bm25": 0.0, "vector": -1.0},
        ranks={"bm25": {"a": 1, "b": 2}, "vector": {"c": 1, "b": 2, "a": 3}},
    )
    scores = {h.id: h.score for h in hits}
    assert scores["a"] == pytest.approx(0.2 * 1.0 + 0.8 * 0.5)
    assert scores["b"] == pytest.approx(0.2 * 0.25 + 0.8 * 0.75)
    assert scores["c"] == pytest.approx(0.8 * 1.0)  # unscored by BM25: contributes 0 there
    assert [h.id for h in hits] == ["c", "b", "a"]
    assert hits[0].ranks == {"vector": 1}


def test_convex_validates_its_weights() -> None:
    with pytest.raises(ConfigError, match="same signals"):
        convex({"bm25": {"a": 1.0}}, weights={"vector": 1.0}, minimums={})
    with pytest.raises(ConfigError, match=">= 0"):
        convex({"bm25": {"a": 1.0}}, weights={"bm25": -1.0}, minimums={})
