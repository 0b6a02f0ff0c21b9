"""Calibrate the relevance floor on SciFact *train*, and measure what it costs on SciFact *test*.

For every query of a split, each mode (BM25, dense, hybrid) ranks the whole-document index 100
deep with the floor off; each hit carries its evidence (the BM25 share of the query's ceiling
and the cosine similarity). A floor then keeps the hits that clear it, in the same order, and
nDCG@10 is computed on what is left: the same result as searching with that floor, without
searching again for every candidate value.

Calibration (train only): for BM25 the highest share floor, for dense the highest cosine floor,
and for hybrid the highest cosine floor given the BM25 one, that each cost at most
``TOLERANCE`` nDCG@10 on train. The test split is only scored, with the floors chosen on train
and with the floor off (the ``floor_off`` / ``floor_on`` columns).

The result (``benchmarks/results/retrieval_floor-*.json``, and a table in RESULTS.md) holds the
floors chosen on train and, per mode, nDCG@10 on test with the floor off and on.

Run: ``python benchmarks/calibrate_floor.py`` (the corpus is embedded once and cached under
``$CONTEXTFOLD_HOME``; about 17 minutes on 2 cores the first time, 5 after).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import _common as common
from contextfold.eval.datasets import IRDataset, load_scifact
from contextfold.eval.metrics import ndcg_at_k
from contextfold.retrieval.floor import RelevanceFloor, default_floor
from contextfold.retrieval.index import DocumentIndex

MODES = ("bm25", "dense", "hybrid")
DEPTH = 100
K = 10
TOLERANCE = 0.001  # the most nDCG@10 a floor may cost on train
GRID = [round(0.005 * i, 3) for i in range(0, 161)]  # 0 .. 0.8


@dataclass(frozen=True)
class Hit:
    doc_id: str
    share: float | None
    cosine: float | None


Runs = dict[str, dict[str, list[Hit]]]  # mode -> query id -> hits, best first


def build_index(dataset: IRDataset) -> DocumentIndex:
    from contextfold.cli.eval import retrieval_index

    return retrieval_index(dataset, embed=True, chunk_size=0, progress=False)


def collect(index: DocumentIndex, dataset: IRDataset) -> Runs:
    """Each judged query's top ``DEPTH`` hits per mode, floor off, with their evidence."""
    runs: Runs = {mode: {} for mode in MODES}
    for qid, text in dataset.queries.items():
        if not dataset.qrels.get(qid):
            continue
        for mode in MODES:
            hits = index.search(text, DEPTH, mode=mode, relevance_floor=False)  # type: ignore[arg-type]
            runs[mode][qid] = [
                Hit(h.metadata["doc_id"], h.scores.get("bm25_share"), h.scores.get("vector"))
                for h in hits
            ]
    return runs


def mean_ndcg(
    runs: dict[str, list[Hit]],
    qrels: dict[str, dict[str, int]],
    mode: str,
    floor: RelevanceFloor | None,
) -> float:
    scores = []
    for qid, hits in runs.items():
        kept = [h.doc_id for h in hits if floor is None or floor.keeps(mode, h.share, h.cosine)]
        score = ndcg_at_k(kept[:K], qrels[qid], K)
        assert score is not None
        scores.append(score)
    return math.fsum(scores) / len(scores)


def highest(values: Sequence[float], cost: Any, base: float) -> float:
    """The highest value whose nDCG stays within ``TOLERANCE`` of ``base`` (the grid is scanned
    upwards and stops at the first value past the tolerance)."""
    best = values[0]
    for value in values:
        if cost(value) < base - TOLERANCE:
            break
        best = value
    return best


def calibrate(runs: Runs, qrels: dict[str, dict[str, int]]) -> RelevanceFloor:
    off = {mode: mean_ndcg(runs[mode], qrels, mode, None) for mode in MODES}
    bm25 = highest(
        GRID, lambda v: mean_ndcg(runs["bm25"], qrels, "bm25", RelevanceFloor(v, 0, 0)), off["bm25"]
    )
    dense = highest(
        GRID,
        lambda v: mean_ndcg(runs["dense"], qrels, "dense", RelevanceFloor(0, v, 0)),
        off["dense"],
    )
    hybrid = highest(
        GRID,
        lambda v: mean_ndcg(runs["hybrid"], qrels, "hybrid", RelevanceFloor(bm25, 0, v)),
        off["hybrid"],
    )
    return RelevanceFloor(bm25=bm25, dense=dense, hybrid=hybrid)


def report(runs: Runs, qrels: dict[str, dict[str, int]], floor: RelevanceFloor) -> dict[str, Any]:
    rows = {}
    for mode in MODES:
        off = mean_ndcg(runs[mode], qrels, mode, None)
        on = mean_ndcg(runs[mode], qrels, mode, floor)
        emptied = sum(
            1
            for hits in runs[mode].values()
            if not any(floor.keeps(mode, h.share, h.cosine) for h in hits)
        )
        rows[mode] = {
            "ndcg10_floor_off": round(off, 4),
            "ndcg10_floor_on": round(on, 4),
            "delta": round(on - off, 4),
            "queries_left_empty": emptied,
        }
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    common.common_arguments(parser)
    args = parser.parse_args(argv)
    data = (args.data_dir or common.default_data_dir()) / "scifact"
    started = time.perf_counter()
    train, test = load_scifact(data, split="train"), load_scifact(data, split="test")
    index = build_index(train)  # the corpus is the same for both splits
    print(f"indexed {len(index):,} documents", file=sys.stderr)
    train_runs, test_runs = collect(index, train), collect(index, test)
    floor = calibrate(train_runs, train.qrels)
    shipped = default_floor(index.embedder.name if index.embedder is not None else None)
    result = common.base_result(
        "retrieval_floor",
        "The relevance floor on SciFact (whole documents, the default embedder and BM25): floors "
        f"calibrated on the train split (the highest costing at most {TOLERANCE} nDCG@10 there), "
        "and nDCG@10 on the test split with the shipped floor off and on, per mode.",
        args.quick,
    )
    result.update(
        {
            "parameters": {
                "depth": DEPTH,
                "k": K,
                "tolerance_train": TOLERANCE,
                "grid_step": 0.005,
            },
            "calibrated": {"bm25": floor.bm25, "dense": floor.dense, "hybrid": floor.hybrid},
            "shipped": {"bm25": shipped.bm25, "dense": shipped.dense, "hybrid": shipped.hybrid},
            "train": {
                "queries": len(train_runs["bm25"]),
                **report(train_runs, train.qrels, shipped),
            },
            "test": {"queries": len(test_runs["bm25"]), **report(test_runs, test.qrels, shipped)},
            "seconds": round(time.perf_counter() - started, 1),
        }
    )
    path = common.write_result(result, args.results_dir, args.results_md)
    print(json.dumps({k: result[k] for k in ("calibrated", "shipped", "train", "test")}, indent=2))
    print(f"wrote {path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
