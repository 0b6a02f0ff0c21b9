"""Ranking metrics, pure functions over ranked id lists and graded judgments.

The conventions are trec_eval's (``ndcg_cut.k`` and ``recall_k``), which BEIR reports through
pytrec_eval, so numbers compare with published ones:

- **nDCG@k**: ``DCG = Σ_{i=1..k} grade(d_i) / log2(i + 1)`` with 1-based ranks and linear gain
  (the relevance grade itself, not ``2**grade - 1``); the ideal DCG takes the judged grades
  sorted best first, cut at ``k``.
- **recall@k**: the share of relevant documents (grade > 0) found in the top ``k``.

A query with no relevant document has no defined score: the per-query functions return
``None`` and :func:`mean_over_queries` leaves the query out of the mean (trec_eval would
average in a 0 for nDCG). Judgments with grade ``<= 0`` count as not relevant. A ranking that
repeats an id keeps its first occurrence only, so a searcher cannot earn a document's gain
twice.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import TypeAlias

from contextfold.errors import ConfigError

__all__ = ["QueryMetric", "mean_over_queries", "ndcg_at_k", "recall_at_k"]

QueryMetric: TypeAlias = Callable[[Sequence[str], Mapping[str, int], int], float | None]
"""A per-query metric: ``(ranked ids best first, {doc_id: grade}, k) -> score or None``."""


def _check_k(k: int) -> None:
    if k < 1:
        raise ConfigError(f"metric cut-off k must be >= 1, got {k}")


def _top_k(ranked_ids: Sequence[str], k: int) -> list[str]:
    """The first ``k`` distinct ids, in order."""
    seen: set[str] = set()
    top: list[str] = []
    for doc_id in ranked_ids:
        if doc_id not in seen:
            seen.add(doc_id)
            top.append(doc_id)
            if len(top) == k:
                break
    return top


def _dcg(gains: Sequence[int]) -> float:
    return sum(g / math.log2(rank + 1) for rank, g in enumerate(gains, start=1))


def ndcg_at_k(
    ranked_ids: Sequence[str], qrels_for_query: Mapping[str, int], k: int = 10
) -> float | None:
    """nDCG@k of one ranking (trec_eval ``ndcg_cut``); ``None`` when nothing is relevant.

    >>> ndcg_at_k(["a", "b"], {"a": 1, "b": 1})
    1.0
    >>> round(ndcg_at_k(["x", "a"], {"a": 1}), 4)  # 1/log2(3) over 1/log2(2)
    0.6309
    >>> ndcg_at_k(["a"], {}) is None
    True
    """
    _check_k(k)
    grades = sorted((g for g in qrels_for_query.values() if g > 0), reverse=True)
    if not grades:
        return None
    gains = [max(qrels_for_query.get(doc_id, 0), 0) for doc_id in _top_k(ranked_ids, k)]
    return _dcg(gains) / _dcg(grades[:k])


def recall_at_k(
    ranked_ids: Sequence[str], qrels_for_query: Mapping[str, int], k: int = 100
) -> float | None:
    """Share of the relevant documents (grade > 0) in the top ``k``; ``None`` when none is.

    >>> recall_at_k(["a", "x", "b"], {"a": 2, "b": 1, "c": 1}, k=2)  # only "a" in the top 2
    0.3333333333333333
    """
    _check_k(k)
    relevant = {doc_id for doc_id, g in qrels_for_query.items() if g > 0}
    if not relevant:
        return None
    return len(relevant.intersection(_top_k(ranked_ids, k))) / len(relevant)


def mean_over_queries(
    metric: QueryMetric,
    runs: Mapping[str, Sequence[str]],
    qrels: Mapping[str, Mapping[str, int]],
    k: int,
) -> float:
    """Mean of ``metric`` over the judged queries that have a relevant document.

    The queries are those of ``qrels``: a query missing from ``runs`` scores as an empty
    ranking (0), a query in ``runs`` without judgments is ignored, and a query whose judgments
    hold no relevant document is left out (its score is undefined).

    >>> runs = {"q1": ["a", "b"], "q2": ["x"], "q3": ["a"]}
    >>> mean_over_queries(recall_at_k, runs, {"q1": {"a": 1}, "q2": {"y": 1}, "q3": {}}, 10)
    0.5
    """
    scores = [
        score
        for qid, judged in qrels.items()
        if (score := metric(runs.get(qid, ()), judged, k)) is not None
    ]
    if not scores:
        raise ConfigError(
            f"none of the {len(qrels)} judged queries has a relevant document (grade > 0); "
            "check the qrels file"
        )
    return math.fsum(scores) / len(scores)
