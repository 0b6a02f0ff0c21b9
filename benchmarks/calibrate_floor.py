"""Calibrate the relevance floor on SciFact *train* only; measure its cost on SciFact *test* once.

For every query of a split, each mode (BM25, dense, hybrid) ranks the whole-document index 100
deep with the floor off; each hit carries its evidence (the BM25 share of the query's ceiling
and the cosine similarity; the query's best cosine is its first dense hit's). A floor then
keeps the hits that clear it, in the same order, and nDCG@10 is computed on what is left: the
same result as searching with that floor, without searching again for every candidate value.

The protocol has two steps, and the test split is read by the second only:

1. ``python benchmarks/calibrate_floor.py`` (train only). The train queries are split by a
   hash of their id: a query is *dev* when the first 8 hex digits of ``sha256(query id)`` are
   0 modulo 3 (about a third), else *tune*. For each tolerance ``t`` in ``TOLERANCES``, the
   floors are chosen on tune (for BM25 the highest share floor, for hybrid the highest cosine
   floor given that BM25 one, each costing at most ``t`` nDCG@10 on tune, in steps of 0.005;
   for dense, which judges the query (``RelevanceFloor.dense_margin``), the highest floor whose
   off-topic verdicts alone, every hit of a query whose best hit reaches it being kept, cost at
   most ``t``, then the smallest margin, in steps of 0.005, that costs nothing more on tune),
   then scored on dev. The tolerance kept is the largest
   whose dev loss stays within ``TARGET`` for every mode with a margin for sampling noise: the
   one-sided 95% upper bound of the mean per-query loss (mean + 1.645 standard errors) must be
   at most ``TARGET``. The off-topic probes (``OFF_TOPIC``, "weather on Mars" first) are
   searched over the same corpus with the chosen floors and reported; they choose nothing.
   Result: ``retrieval_floor_calibration-*.json`` and ``.md``.
2. Copy the chosen floors into ``contextfold/retrieval/floor.py``, commit, then
   ``python benchmarks/calibrate_floor.py --test``: it refuses to run unless the shipped floors
   are the ones the newest calibration chose, and scores the test split with the floor off and
   on. Result: ``retrieval_floor-*.json`` and ``.md``. Nothing is chosen from it.

Every number in the output is labelled with the split (tune, dev or test) it comes from.
The corpus is embedded once and cached under ``$CONTEXTFOLD_HOME`` (``embedding-cache.db``):
the first run embeds 5,183 abstracts (about 17 minutes on 2 cores in all); with the cache,
step 1 took 70 s and step 2 45 s on a quiet 2-core machine. Point ``CONTEXTFOLD_HOME`` at the
folder that holds the cache of an earlier run (the default is ``~/.contextfold``).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import _common as common
from contextfold.eval.datasets import IRDataset, load_scifact
from contextfold.eval.metrics import ndcg_at_k
from contextfold.retrieval.floor import RelevanceFloor, default_floor
from contextfold.retrieval.index import DocumentIndex

MODES = ("bm25", "dense", "hybrid")
DEPTH = 100
K = 10
STEP = 0.005
GRID = [round(STEP * i, 3) for i in range(0, 161)]  # 0 .. 0.8
TOLERANCES = (0.0005, 0.001, 0.0015, 0.002, 0.003, 0.004, 0.005)  # candidates, nDCG@10 on tune
TARGET = 0.005  # the most nDCG@10 the floor may cost (issue 14)
Z = 1.645  # one-sided 95% normal quantile for the dev upper bound
DEV_MODULUS = 3  # a train query is dev when its hash is 0 modulo this
MARGINS = [round(STEP * i, 3) for i in range(0, 101)]  # dense margins tried: 0 .. 0.5
QUICK_QUERIES = 60  # --quick: the first judged queries of the split only
#: Queries SciFact's corpus (biomedical abstracts) does not cover: each must return nothing.
OFF_TOPIC = (
    "weather on Mars",
    "What is the weather on Mars?",
    "how to bake sourdough bread",
    "best football team in the premier league",
    "stock market prices today",
    "how do I reset my router password",
    "Can I expense Uber rides during business travel?",
)
CALIBRATION = "retrieval_floor_calibration"
MEASURE = "retrieval_floor"


@dataclass(frozen=True)
class Hit:
    doc_id: str
    share: float | None
    cosine: float | None


Runs = dict[str, dict[str, list[Hit]]]  # mode -> query id -> hits, best first
Qrels = dict[str, dict[str, int]]


def train_part(qid: str) -> str:
    """``"dev"`` or ``"tune"``: a fixed function of the query id, independent of any result.

    >>> [train_part(str(qid)) for qid in range(4)]
    ['tune', 'dev', 'tune', 'dev']
    """
    digest = hashlib.sha256(qid.encode("utf-8")).hexdigest()
    return "dev" if int(digest[:8], 16) % DEV_MODULUS == 0 else "tune"


def build_index(dataset: IRDataset) -> DocumentIndex:
    from contextfold.cli.eval import retrieval_index

    return retrieval_index(dataset, embed=True, chunk_size=0, progress=False)


def collect(index: DocumentIndex, dataset: IRDataset, limit: int | None = None) -> Runs:
    """Each judged query's top ``DEPTH`` hits per mode, floor off, with their evidence (the
    first ``limit`` judged queries only, for ``--quick``)."""
    runs: Runs = {mode: {} for mode in MODES}
    judged = [(qid, text) for qid, text in dataset.queries.items() if dataset.qrels.get(qid)]
    for qid, text in judged[:limit]:
        for mode in MODES:
            hits = index.search(text, DEPTH, mode=mode, relevance_floor=False)  # type: ignore[arg-type]
            runs[mode][qid] = [
                Hit(h.metadata["doc_id"], h.scores.get("bm25_share"), h.scores.get("vector"))
                for h in hits
            ]
    return runs


def nearest(hits: Sequence[Hit]) -> float | None:
    """The query's best cosine among its hits (None when dense search scored none)."""
    return max((h.cosine for h in hits if h.cosine is not None), default=None)


def kept(hits: Sequence[Hit], mode: str, floor: RelevanceFloor) -> list[Hit]:
    best = nearest(hits)
    return [h for h in hits if floor.keeps(mode, h.share, h.cosine, best)]


def subset(runs: Runs, qids: set[str]) -> Runs:
    return {mode: {q: h for q, h in per.items() if q in qids} for mode, per in runs.items()}


def per_query(
    runs: dict[str, list[Hit]], qrels: Qrels, mode: str, floor: RelevanceFloor | None
) -> list[float]:
    """nDCG@10 of each query (in ``runs`` order) with ``floor`` applied (None: off)."""
    scores = []
    for qid, hits in runs.items():
        ranked = [h.doc_id for h in (hits if floor is None else kept(hits, mode, floor))]
        score = ndcg_at_k(ranked[:K], qrels[qid], K)
        assert score is not None
        scores.append(score)
    return scores


def mean(values: Sequence[float]) -> float:
    return math.fsum(values) / len(values)


def highest(cost: Callable[[float], float], base: float, tolerance: float) -> float:
    """The highest grid value whose nDCG stays within ``tolerance`` of ``base`` (the grid is
    scanned upwards and stops at the first value past the tolerance)."""
    best = GRID[0]
    for value in GRID:
        if cost(value) < base - tolerance:
            break
        best = value
    return best


def smallest(cost: Callable[[float], float], base: float) -> float:
    """The smallest margin whose nDCG is no lower than ``base`` (up to rounding); the largest
    margin tried when none is."""
    for value in MARGINS:
        if cost(value) >= base - 1e-12:
            return value
    return MARGINS[-1]


class Tuner:
    """Chooses floors on one set of runs, memoising every nDCG it computes."""

    def __init__(self, runs: Runs, qrels: Qrels) -> None:
        self.runs, self.qrels = runs, qrels
        self.off = {mode: mean(per_query(runs[mode], qrels, mode, None)) for mode in MODES}
        self._memo: dict[tuple[str, RelevanceFloor], float] = {}

    def ndcg(self, mode: str, floor: RelevanceFloor) -> float:
        key = (mode, floor)
        if key not in self._memo:
            self._memo[key] = mean(per_query(self.runs[mode], self.qrels, mode, floor))
        return self._memo[key]

    def choose(self, tolerance: float) -> RelevanceFloor:
        bm25 = highest(
            lambda v: self.ndcg("bm25", RelevanceFloor(v, 0, 0)), self.off["bm25"], tolerance
        )
        # Dense: the floor's off-topic verdicts alone (every hit of a query whose best hit
        # reaches the floor kept) may cost the tolerance; the margin then trims on-topic
        # queries' tails only as far as costs nothing more on tune.
        dense = highest(
            lambda v: self.ndcg("dense", RelevanceFloor(0, v, 0, math.inf)),
            self.off["dense"],
            tolerance,
        )
        verdicts = self.ndcg("dense", RelevanceFloor(0, dense, 0, math.inf))
        margin = smallest(lambda m: self.ndcg("dense", RelevanceFloor(0, dense, 0, m)), verdicts)
        hybrid = highest(
            lambda v: self.ndcg("hybrid", RelevanceFloor(bm25, 0, v)), self.off["hybrid"], tolerance
        )
        return RelevanceFloor(bm25=bm25, dense=dense, hybrid=hybrid, dense_margin=margin)


def floor_dict(floor: RelevanceFloor) -> dict[str, float]:
    return floor.as_dict()


def score(runs: Runs, qrels: Qrels, floor: RelevanceFloor) -> dict[str, Any]:
    """Per mode: mean nDCG@10 with the floor off and on, the loss (off − on) with its standard
    error and one-sided 95% upper bound over queries, and the queries the floor left empty."""
    rows: dict[str, Any] = {"queries": len(runs["bm25"])}
    for mode in MODES:
        off = per_query(runs[mode], qrels, mode, None)
        on = per_query(runs[mode], qrels, mode, floor)
        losses = [a - b for a, b in zip(off, on, strict=True)]
        loss = mean(losses)
        se = statistics.stdev(losses) / math.sqrt(len(losses)) if len(losses) > 1 else 0.0
        emptied = sum(1 for hits in runs[mode].values() if not kept(hits, mode, floor))
        rows[mode] = {
            "ndcg10_floor_off": round(mean(off), 4),
            "ndcg10_floor_on": round(mean(on), 4),
            "loss": round(loss, 4),
            "loss_se": round(se, 4),
            "loss_upper95": round(loss + Z * se, 4),
            "queries_hurt": sum(1 for x in losses if x > 1e-12),
            "queries_helped": sum(1 for x in losses if x < -1e-12),
            "queries_left_empty": emptied,
        }
    return rows


def off_topic(index: DocumentIndex, floor: RelevanceFloor) -> list[dict[str, Any]]:
    """Each off-topic probe's best cosine over the corpus and its hits per mode with
    ``floor`` (all should be 0)."""
    rows = []
    for query in OFF_TOPIC:
        nearest_hits = index.search(query, 1, mode="dense", relevance_floor=False)
        rows.append(
            {
                "query": query,
                "best_cosine": round(nearest_hits[0].scores["vector"], 4) if nearest_hits else None,
                "hits": {
                    mode: len(index.search(query, K, mode=mode, relevance_floor=floor))  # type: ignore[arg-type]
                    for mode in MODES
                },
            }
        )
    return rows


def calibrate(data: Path, limit: int | None) -> dict[str, Any]:
    """Step 1: floors and tolerance from SciFact train (tune / dev); test is never loaded."""
    train = load_scifact(data, split="train")
    index = build_index(train)
    print(f"indexed {len(index):,} documents; searching the train queries", file=sys.stderr)
    runs = collect(index, train, limit)
    parts = {p: {q for q in runs["bm25"] if train_part(q) == p} for p in ("tune", "dev")}
    tune, dev = subset(runs, parts["tune"]), subset(runs, parts["dev"])
    tuner = Tuner(tune, train.qrels)
    candidates = []
    for tolerance in TOLERANCES:
        floor = tuner.choose(tolerance)
        dev_rows = score(dev, train.qrels, floor)
        accepted = all(dev_rows[m]["loss_upper95"] <= TARGET for m in MODES)
        candidates.append(
            {
                "tolerance_tune": tolerance,
                "floors": floor_dict(floor),
                "tune": score(tune, train.qrels, floor),
                "dev": dev_rows,
                "accepted": accepted,
            }
        )
    accepted_ones = [c for c in candidates if c["accepted"]]
    chosen = accepted_ones[-1] if accepted_ones else candidates[0]
    return {
        "parameters": {
            "depth": DEPTH,
            "k": K,
            "grid_step": STEP,
            "tolerances_tune": list(TOLERANCES),
            "target": TARGET,
            "rule": (
                "largest tolerance whose dev loss upper bound (mean + 1.645 SE over queries) is "
                f"at most {TARGET} for every mode; per tolerance, on tune: the highest BM25 "
                "floor, the highest hybrid floor given it, and the highest dense floor whose "
                "off-topic verdicts alone (every hit of a query whose best hit reaches it kept) "
                "cost at most the tolerance, then the smallest dense margin that costs nothing "
                "more"
            ),
            "split": (
                "SciFact train queries with qrels; dev when int(sha256(query id)[:8], 16) % "
                f"{DEV_MODULUS} == 0, else tune"
            ),
            "embedder": index.embedder.name if index.embedder is not None else None,
        },
        "queries": {"tune": len(parts["tune"]), "dev": len(parts["dev"])},
        "candidates": candidates,
        "chosen": {
            "tolerance_tune": chosen["tolerance_tune"],
            "floors": chosen["floors"],
            "any_accepted": bool(accepted_ones),
        },
        "off_topic": off_topic(index, RelevanceFloor(**chosen["floors"])),
    }


def measure(data: Path, results_dir: Path, limit: int | None) -> dict[str, Any]:
    """Step 2: the shipped floors on the test split, once; refuses floors not chosen on train."""
    latest = common.latest_results(results_dir).get(CALIBRATION)
    if latest is None:
        sys.exit(f"no {CALIBRATION} result in {results_dir}: run the calibration (no --test) first")
    path, calibration = latest
    index = build_index(load_scifact(data, split="train"))  # the corpus is the same for both
    embedder = index.embedder.name if index.embedder is not None else None
    shipped = default_floor(embedder)
    if floor_dict(shipped) != calibration["chosen"]["floors"] or (
        embedder != calibration["parameters"]["embedder"]
    ):
        sys.exit(
            f"the shipped floors {floor_dict(shipped)} ({embedder}) are not the ones "
            f"{path.name} chose on train ({calibration['chosen']['floors']}); ship those, "
            "commit, then measure the test split"
        )
    chosen = next(
        c
        for c in calibration["candidates"]
        if c["tolerance_tune"] == calibration["chosen"]["tolerance_tune"]
    )
    test = load_scifact(data, split="test")
    print(f"indexed {len(index):,} documents; searching the test queries", file=sys.stderr)
    runs = collect(index, test, limit)
    return {
        "parameters": {"depth": DEPTH, "k": K, "embedder": embedder},
        "calibration": {
            "file": common._relative(str(path)),
            "git": calibration["git"],
            "tolerance_tune": chosen["tolerance_tune"],
            "tune": chosen["tune"],
            "dev": chosen["dev"],
        },
        "shipped": floor_dict(shipped),
        "test": score(runs, test.qrels, shipped),
        "off_topic": off_topic(index, shipped),
    }


def markdown(result: dict[str, Any], path: Path) -> str:
    return "\n".join(common.render_one(result["name"], path, result)) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    common.common_arguments(parser)
    parser.add_argument(
        "--test",
        action="store_true",
        help="step 2: score the shipped floors on the test split (once, after committing them)",
    )
    args = parser.parse_args(argv)
    data = (args.data_dir or common.default_data_dir()) / "scifact"
    started = time.perf_counter()
    limit = QUICK_QUERIES if args.quick else None
    if args.test:
        name = MEASURE
        description = (
            "What the shipped relevance floor costs on SciFact test (300 queries, whole "
            "documents, the default embedder and BM25), measured once after the floors were "
            "chosen on SciFact train; the tune and dev rows are the calibration's. (The dense "
            "rule, a floor per query with a margin, replaced an absolute dense floor whose test "
            "cost had been measured once before: see docs/retrieval.md.)"
        )
        body = measure(data, args.results_dir, limit)
    else:
        name = CALIBRATION
        description = (
            "Relevance floor calibration on SciFact train only: floors chosen on the tune part "
            "for each tolerance, checked on the dev part; the test split is not read."
        )
        body = calibrate(data, limit)
    result = common.base_result(name, description, args.quick)
    result.update(body)
    result["seconds"] = round(time.perf_counter() - started, 1)
    path = common.write_result(result, args.results_dir, args.results_md)
    md = path.with_suffix(".md")
    md.write_text(markdown(result, path), encoding="utf-8")
    summary = (
        {"shipped": result["shipped"], "calibration": result["calibration"], "test": result["test"]}
        if args.test
        else {"chosen": result["chosen"], "candidates": result["candidates"]}
    )
    print(json.dumps(summary, indent=2))
    print(f"wrote {path} and {md}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
