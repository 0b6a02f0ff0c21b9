"""Recall's fusion of its signals, on arrays (``Recaller`` reads the signals and the
per-turn facts; what is done with them is here, with no store).

Each signal's hits, best first, are min-max scaled (``"score"``) or given ``1 / (k + rank)``
(``"rrf"``), weighted and summed per turn in signal order (bit for bit what a dict per turn
summed: ``tests/test_memory_fusion.py`` holds the two equal); each turn then earns a share of
its better neighbour's score (``with_neighbours``). At 100k turns the candidates reach a few
thousand once the caps bind, where a dict per candidate cost ~3 ms a text.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import NamedTuple

import numpy as np
import numpy.typing as npt

from contextfold.memory.decompose import interleave

__all__ = ["Fused", "Hit", "best_hits", "fuse_signals", "merge_parts", "with_neighbours"]

Seqs = npt.NDArray[np.int64]
Scores = npt.NDArray[np.float64]


class Hit(NamedTuple):
    """A ``RankedTurn`` while recall fuses and merges (thousands are made; a validated model
    each cost ~2 µs): only the ones returned become ``RankedTurn`` s."""

    seq: int
    score: float
    ranks: dict[str, int]
    similarity: float | None = None


class Fused(NamedTuple):
    """The candidates (sorted, unique), their fused scores, and each signal's kept seqs, best
    first (for the ranks)."""

    cands: Seqs
    scores: Scores
    kept: list[tuple[str, Seqs]]


def fuse_signals(
    signals: Mapping[str, Sequence[tuple[int, float]]],
    *,
    weights: Mapping[str, float],
    fusion: str,
    k: int,
    tag_limit: int | None,
    tag_low: float | None,
    excluded: Seqs | None,
) -> Fused | None:
    """The signals' hits (not ``excluded``) summed per turn; ``None`` when none is left. The
    tag hits, when cut at ``tag_limit``, are scaled against ``tag_low``, the lowest score of
    all of them, as they would have been uncut."""
    kept: list[tuple[str, Seqs]] = []
    shares: list[Scores] = []
    for name, hits in signals.items():
        if not hits:
            continue
        capped = name == "tags" and len(hits) == tag_limit
        seqs = np.fromiter((seq for seq, _ in hits), np.int64, len(hits))
        scores = np.fromiter((score for _, score in hits), np.float64, len(hits))
        if excluded is not None:
            keep = ~np.isin(seqs, excluded)
            seqs, scores = seqs[keep], scores[keep]
            if not len(seqs):
                continue
        high, low = float(scores[0]), float(scores[-1])
        if capped and tag_low is not None:
            low = min(low, tag_low)
        if fusion == "rrf":
            share = 1 / (k + np.arange(1, len(seqs) + 1, dtype=np.float64))
        elif high > low:
            share = (scores - low) / (high - low)
        else:
            share = np.ones(len(seqs))
        kept.append((name, seqs))
        shares.append(weights.get(name, 1.0) * share)
    if not kept:
        return None
    # Each turn's shares summed in signal order (as a dict would: bit for bit).
    cands, where = np.unique(np.concatenate([seqs for _, seqs in kept]), return_inverse=True)
    fused: Scores = np.bincount(where, weights=np.concatenate(shares), minlength=len(cands)).astype(
        np.float64, copy=False
    )
    return Fused(cands, fused, kept)


def with_neighbours(
    cands: Seqs, fused: Scores, excluded: Seqs | None, weight: float
) -> tuple[Seqs, Scores]:
    """A dialogue answer sits next to its question: each turn (candidate or not, never an
    excluded one nor seq 0) also earns ``weight`` of its better neighbour's score, when that
    is more than it had. ``cands`` sorted, unique."""
    near = np.concatenate([cands - 1, cands + 1])
    near = near[near >= 1]
    if excluded is not None:
        near = near[~np.isin(near, excluded)]
    every = np.union1d(cands, near)
    base = np.zeros(len(every))
    base[np.searchsorted(every, cands)] = fused

    def score_at(seqs: Seqs) -> Scores:
        at = np.minimum(np.searchsorted(cands, seqs), len(cands) - 1)
        return np.where(cands[at] == seqs, fused[at], -np.inf)

    better = np.maximum(score_at(every - 1), score_at(every + 1))
    has = better > -np.inf
    lifted = np.maximum(base, base + weight * np.where(has, better, 0.0))
    return every, np.where(has, lifted, base)


def best_hits(fused: Fused, similarity: Mapping[int, float], limit: int) -> list[Hit]:
    """The ``limit`` best candidates, ties by seq, with each signal's rank of them (found by
    a sorted search of the signal's seqs, each unique in it: no table of every hit) and
    their cosine (``similarity``)."""
    cands, scores = fused.cands, fused.scores
    order = np.lexsort((cands, -scores))[:limit]
    best = cands[order]
    ranks: list[dict[str, int]] = [{} for _ in range(len(best))]
    for name, seqs in fused.kept:
        sorter = np.argsort(seqs, kind="stable")
        at = np.minimum(np.searchsorted(seqs, best, sorter=sorter), len(seqs) - 1)
        where = sorter[at]
        for i in np.flatnonzero(seqs[where] == best).tolist():
            ranks[i][name] = int(where[i]) + 1
    return [
        Hit(seq, score, rank, similarity.get(seq))
        for seq, score, rank in zip(best.tolist(), scores[order].tolist(), ranks, strict=True)
    ]


def merge_parts(lists: Sequence[Sequence[Hit]], limit: int, judged: int = 1) -> list[Hit]:
    """The message's ranking (``lists[0]``) interleaved with its parts' (``memory.decompose``):
    a turn keeps the message's own score when the message ranked it; one only a part found
    gets that part's score scaled to the message's best, and the order of the interleave is
    the order returned. A turn's cosine is the best the first ``judged`` lists gave it (the
    message's, and a long message's asking sentences'): the relevance floor judges those,
    never a part with a name taken out."""
    own = {r.seq: r for r in lists[0]}
    cosines: dict[int, float] = {}
    for lst in lists[1:judged]:
        for r in lst:
            if r.similarity is not None:
                cosines[r.seq] = max(r.similarity, cosines.get(r.seq, r.similarity))
    tops = [lst[0].score if lst and lst[0].score > 0 else 1.0 for lst in lists]
    by_seq = [{r.seq: r for r in lst} for lst in lists]
    merged = []
    for seq, which in interleave([[r.seq for r in lst] for lst in lists], limit):
        hit = own.get(seq)
        if hit is None:
            hit = by_seq[which][seq]
            hit = Hit(seq, hit.score / tops[which] * tops[0], hit.ranks)
        if seq in cosines:
            cosine = cosines[seq] if hit.similarity is None else max(hit.similarity, cosines[seq])
            hit = hit._replace(similarity=cosine)
        merged.append(hit)
    return merged
