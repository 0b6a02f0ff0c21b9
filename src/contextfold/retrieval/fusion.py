"""Rank fusion and diversity: pure functions over ranked id lists.

Reciprocal Rank Fusion (Cormack et al., 2009): ``score(d) = Σ_s w_s / (k + rank_s(d))`` with
1-based ranks; a list that does not contain ``d`` contributes nothing. It needs no score
calibration between signals, which is why BM25 and cosine similarities can be fused at all.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from contextfold.errors import ConfigError

__all__ = ["FusedHit", "convex", "mmr", "rrf"]


class FusedHit(tuple[str, float, dict[str, int]]):
    """``(id, fused score, {signal: 1-based rank})`` — a plain tuple with names."""

    __slots__ = ()

    @property
    def id(self) -> str:
        return self[0]

    @property
    def score(self) -> float:
        return self[1]

    @property
    def ranks(self) -> dict[str, int]:
        return self[2]


def rrf(
    rankings: Mapping[str, Sequence[str]],
    *,
    k: int = 60,
    weights: Mapping[str, float] | None = None,
    limit: int | None = None,
) -> list[FusedHit]:
    """Fuse ranked id lists (best first, keyed by signal name) with Reciprocal Rank Fusion.

    Ties break by the best single rank, then by first appearance, so the order is
    deterministic.

    >>> [hit.id for hit in rrf({"bm25": ["a", "b", "c"], "vector": ["c", "a"]})]
    ['a', 'c', 'b']
    >>> rrf({"bm25": ["a"]})[0].score == 1 / 61
    True
    """
    if k < 0:
        raise ConfigError(f"RRF needs k >= 0, got {k}")
    weights = weights or {}
    unknown = set(weights) - set(rankings)
    if unknown:
        raise ConfigError(f"weights name signals that were not ranked: {sorted(unknown)}")
    if any(w < 0 for w in weights.values()):
        raise ConfigError(f"RRF weights must be >= 0, got {dict(weights)}")
    scores: dict[str, float] = {}
    ranks: dict[str, dict[str, int]] = {}
    for signal, ids in rankings.items():
        weight = weights.get(signal, 1.0)
        seen: set[str] = set()
        for position, doc_id in enumerate(ids, start=1):
            if doc_id in seen:  # a list that repeats an id counts its best rank only
                continue
            seen.add(doc_id)
            scores[doc_id] = scores.get(doc_id, 0.0) + weight / (k + position)
            ranks.setdefault(doc_id, {})[signal] = position
    first_seen = {doc_id: n for n, doc_id in enumerate(scores)}
    ordered = sorted(scores, key=lambda d: (-scores[d], min(ranks[d].values()), first_seen[d]))
    if limit is not None:
        ordered = ordered[:limit]
    return [FusedHit((doc_id, scores[doc_id], ranks[doc_id])) for doc_id in ordered]


def mmr(
    candidates: Sequence[str],
    relevance: Mapping[str, float],
    similarity: Callable[[str, str], float],
    *,
    k: int,
    lambda_: float = 0.7,
) -> list[str]:
    """Maximal Marginal Relevance: pick ``k`` of ``candidates`` one at a time, maximising
    ``λ · relevance − (1 − λ) · max similarity to the already picked``.

    ``λ = 1`` keeps the relevance order; lower values favour diversity.

    >>> sim = lambda a, b: 1.0 if a[0] == b[0] else 0.0
    >>> mmr(["a1", "a2", "b1"], {"a1": 1.0, "a2": 0.9, "b1": 0.8}, sim, k=2, lambda_=0.5)
    ['a1', 'b1']
    """
    if not 0 <= lambda_ <= 1:
        raise ConfigError(f"MMR lambda must be within [0, 1], got {lambda_}")
    remaining = list(dict.fromkeys(candidates))
    picked: list[str] = []
    while remaining and len(picked) < k:
        best = max(
            remaining,
            key=lambda c: (
                lambda_ * relevance.get(c, 0.0)
                - (1 - lambda_) * max((similarity(c, p) for p in picked), default=0.0)
            ),
        )
        picked.append(best)
        remaining.remove(best)
    return picked


def convex(
    scores: Mapping[str, Mapping[str, float]],
    *,
    weights: Mapping[str, float],
    minimums: Mapping[str, float],
    ranks: Mapping[str, Mapping[str, int]] | None = None,
    limit: int | None = None,
) -> list[FusedHit]:
    """Fuse raw scores by a weighted sum of theoretically min-max normalised scores (TM2C2,
    Bruch et al., 2023): ``Σ_s w_s · (score_s − min_s) / (max_s − min_s)``, where ``min_s`` is the
    signal's theoretical minimum (0 for BM25, −1 for cosine) and ``max_s`` the best score it
    gave in this pool. An id a signal did not score contributes 0 for it.

    Unlike RRF it keeps how *much* better one hit is than the next, which on SciFact's train
    split beat every RRF setting tried (see docs/retrieval.md). ``ranks`` (per signal, 1-based)
    are carried into the hits for explanation; ties break by id order of first appearance.

    >>> hits = convex({"bm25": {"a": 4.0, "b": 2.0}, "vector": {"a": 0.2, "b": 0.6}},
    ...               weights={"bm25": 0.5, "vector": 0.5}, minimums={"bm25": 0, "vector": -1})
    >>> [(h.id, round(h.score, 3)) for h in hits]
    [('a', 0.875), ('b', 0.75)]
    """
    unknown = set(weights) ^ set(scores)
    if unknown:
        raise ConfigError(f"weights and scores must name the same signals; differ on {unknown}")
    if any(w < 0 for w in weights.values()):
        raise ConfigError(f"fusion weights must be >= 0, got {dict(weights)}")
    fused: dict[str, float] = {}
    for signal, values in scores.items():
        if not values:
            continue
        low = minimums.get(signal, 0.0)
        span = max(values.values()) - low
        for doc_id, value in values.items():
            share = (value - low) / span if span > 0 else 0.0
            fused[doc_id] = fused.get(doc_id, 0.0) + weights[signal] * share
    first_seen = {doc_id: n for n, doc_id in enumerate(fused)}
    ordered = sorted(fused, key=lambda d: (-fused[d], first_seen[d]))[:limit]
    ranks = ranks or {}
    return [FusedHit((d, fused[d], {s: r[d] for s, r in ranks.items() if d in r})) for d in ordered]
