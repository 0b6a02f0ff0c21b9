"""The relevance floor: a minimum score below which a search hit is noise, not an answer.

Dense search always returns its ``k`` nearest chunks, however far they are, and BM25 returns
any chunk that shares a word with the query; without a floor a query about something the
corpus does not cover ("weather on Mars" over a refund policy) still gets hits. The floor
compares each hit's *absolute* evidence, per retrieval mode:

- ``bm25``: the BM25 score of the query's content words as a share of the most they could
  score in this index (``BM25Index.shares``), so it does not grow with the query's length or
  the corpus's size; function words ("what", "is", "how") count in neither, so a query made of
  them alone has no BM25 evidence, however small the corpus;
- ``dense``: the cosine similarity of the query and the chunk, judged per query: a query
  whose best hit does not reach ``dense`` is off-topic and gets nothing; once its best hit
  does, every hit within ``dense_margin`` of that best one is kept too (as is any hit that
  reaches ``dense`` itself), so the floor rejects whole off-topic queries rather than trimming
  the tail of on-topic ones (``dense_margin=0`` is the plain absolute floor);
- ``hybrid``: a hit is kept when its cosine similarity reaches ``hybrid`` or its BM25 share
  reaches ``bm25`` (either signal may vouch for it; fusion scores are relative to the pool and
  cannot tell noise from an answer).

The defaults were calibrated on SciFact's *train* split only (``benchmarks/calibrate_floor.py``):
its queries are split by a hash of their id into a tune part, where each floor is the highest
(in steps of 0.005) that costs at most a tolerance of nDCG@10 (the dense margin the smallest
that costs nothing beyond what the dense floor's off-topic verdicts cost), and a dev part,
which chose that tolerance (the largest whose dev loss stays within 0.005 with a margin for
noise). Their cost on the test split, measured afterwards, is in docs/retrieval.md. The
cosine floors and the margin belong to the embedder they were calibrated with (the default
all-MiniLM-L6-v2): with any other embedder the dense and hybrid floors are off (-1, the lowest
cosine) unless set, while the BM25 share floor, which does not depend on the embedder, stays.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from contextfold.errors import ConfigError

__all__ = [
    "BM25_FLOOR",
    "CALIBRATED_FLOORS",
    "FLOOR_KEYS",
    "RelevanceFloor",
    "default_floor",
    "resolve_floor",
]

#: The keys a floor mapping takes: one minimum per mode, and the dense margin.
FLOOR_KEYS = ("bm25", "dense", "hybrid", "dense_margin")


@dataclass(frozen=True, slots=True)
class RelevanceFloor:
    """Minimum evidence for a hit, per retrieval mode (see the module docs).

    ``dense_margin`` (≥ 0, in cosine) relaxes the dense floor within a query whose best hit
    reaches it: hits that close to the best are kept as well. ``best_cosine`` is the cosine of
    the query's nearest chunk (what the dense search found first).

    >>> floor = RelevanceFloor(bm25=0.2, dense=0.3, hybrid=0.3, dense_margin=0.1)
    >>> floor.keeps("dense", None, 0.25, best_cosine=0.32), floor.keeps("hybrid", 0.5, 0.1)
    (True, True)
    >>> floor.keeps("dense", None, 0.25, best_cosine=0.29)  # an off-topic query: nothing
    False
    """

    bm25: float
    dense: float
    hybrid: float
    dense_margin: float = 0.0

    def __post_init__(self) -> None:
        for key in FLOOR_KEYS:
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, int | float) or math.isnan(value):
                raise ConfigError(f"relevance floor {key!r} must be a number, got {value!r}")
        if self.dense_margin < 0:
            raise ConfigError(
                "relevance floor 'dense_margin' must be at least 0 (a cosine distance below "
                f"the query's best hit), got {self.dense_margin!r}"
            )

    def keeps(
        self,
        mode: str,
        bm25_share: float | None,
        cosine: float | None,
        best_cosine: float | None = None,
    ) -> bool:
        """Whether a hit with this evidence (None: the signal did not score it) clears the
        floor of ``mode``; ``best_cosine`` (dense mode: the query's best cosine, None when
        unknown) lets the margin apply."""
        share = -math.inf if bm25_share is None else bm25_share
        cos = -math.inf if cosine is None else cosine
        if mode == "bm25":
            return share >= self.bm25
        if mode == "dense":
            if cos >= self.dense:
                return True
            best = -math.inf if best_cosine is None else best_cosine
            return best >= self.dense and cos >= best - self.dense_margin
        return cos >= self.hybrid or share >= self.bm25

    def as_dict(self) -> dict[str, float]:
        """The floor's values by key (what a mapping setting takes).

        >>> RelevanceFloor(0.1, 0.3, 0.35).as_dict()
        {'bm25': 0.1, 'dense': 0.3, 'hybrid': 0.35, 'dense_margin': 0.0}
        """
        return {key: getattr(self, key) for key in FLOOR_KEYS}


#: The BM25 share floor, calibrated on SciFact train (independent of the embedder).
BM25_FLOOR = 0.13
#: Floors per embedder name, calibrated on SciFact train with the default BM25 settings.
CALIBRATED_FLOORS: dict[str, RelevanceFloor] = {
    "all-MiniLM-L6-v2-int8": RelevanceFloor(
        bm25=BM25_FLOOR, dense=0.345, hybrid=0.385, dense_margin=0.065
    ),
}


def default_floor(embedder: str | None) -> RelevanceFloor:
    """The calibrated floor for an embedder (by name), or the BM25 floor alone when its cosine
    floors were never calibrated.

    >>> default_floor("all-MiniLM-L6-v2-int8").dense, default_floor("my-embedder").dense
    (0.345, -1.0)
    """
    found = CALIBRATED_FLOORS.get(embedder or "")
    return found if found is not None else RelevanceFloor(bm25=BM25_FLOOR, dense=-1.0, hybrid=-1.0)


def resolve_floor(
    value: RelevanceFloor | Mapping[str, float] | bool | None, embedder: str | None = None
) -> RelevanceFloor | None:
    """The floor a setting names for an index whose embedder is called ``embedder``: ``True``
    or ``None`` the calibrated default (``default_floor``), ``False`` none (every hit kept), a
    mapping the default with its values over it.

    >>> resolve_floor(False) is None, resolve_floor({"dense": 0.5}).dense
    (True, 0.5)
    """
    if value is None or value is True:
        return default_floor(embedder)
    if value is False:
        return None
    if isinstance(value, RelevanceFloor):
        return value
    if isinstance(value, Mapping):
        unknown = sorted(set(value) - set(FLOOR_KEYS))
        if unknown:
            raise ConfigError(
                "relevance floor modes are bm25, dense and hybrid (and dense_margin, the dense "
                f"floor's margin below a query's best hit); got {', '.join(map(str, unknown))}"
            )
        return RelevanceFloor(**{**default_floor(embedder).as_dict(), **value})
    raise ConfigError(
        f"relevance_floor takes true, false or a mapping of mode to minimum, got {value!r}"
    )
