"""What query decomposition (``recall.decompose``) costs a recall: off and on side by side.

Two engines hold the same 5,000 LoCoMo turns in one session each (the first 5,000 turns, the
offline MiniLM embedder, turn vectors embedded once before timing). The LoCoMo questions are asked
of both at a 2,048-token budget, the two engines taking turns question by question, so load on
the shared machine falls on both alike. Reported: median and p95 of ``on_message_inbound`` for
each, their ratio, and how many questions were decomposed (named someone). Bar: the median with
decomposition on stays ≤ 50 ms, the recall bar of ``bench_memory.py``.

Run: ``python benchmarks/bench_decompose.py`` (``--quick`` for the smoke test).
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import _common as common
from contextfold.memory.config import MemoryConfig
from contextfold.memory.decompose import query_parts
from contextfold.memory.engine import MemoryEngine
from contextfold.retrieval.base import Embedder
from contextfold.retrieval.embedders import CachedEmbedder, MiniLMEmbedder
from contextfold.store.sqlite.memory import MemoryStore


def _engine(turns: list[common.Turn], decompose: bool, embedder: Embedder) -> MemoryEngine:
    config = MemoryConfig.model_validate(
        {"context_window": 8192, "recall": {"decompose": decompose}}
    )
    engine = MemoryEngine(config, store=MemoryStore(), embedder=embedder)
    engine.ingest_history(
        [
            {
                "role": "user" if t.first_speaker else "assistant",
                "content": f"{t.speaker}: {t.text}",
            }
            for t in turns
        ]
    )
    engine.recaller.ensure_vectors("default")
    return engine


def side_by_side(turns: list[common.Turn], questions: list[str]) -> dict[str, object]:
    # One MiniLM for both, its vectors cached in memory: the turns are embedded once.
    embedder = CachedEmbedder(MiniLMEmbedder())
    engines = {"off": _engine(turns, False, embedder), "on": _engine(turns, True, embedder)}
    for engine in engines.values():
        # Questions are embedded by the model itself, never from the shared cache (the
        # second engine would otherwise find each question embedded by the first).
        engine.recaller.embedder = embedder.inner
        engine.on_message_inbound(questions[0])  # warm: model loaded, vectors cached
    samples = {mode: common.Samples() for mode in engines}
    for question in questions:
        for mode, engine in engines.items():
            samples[mode].add(
                common.time_call(lambda q=question, e=engine: e.on_message_inbound(q, budget=2048))
            )
    stats = {mode: s.stats() for mode, s in samples.items()}
    return {
        "stored_turns": len(turns),
        "questions": len(questions),
        "decomposed": sum(bool(query_parts(q)) for q in questions),
        "stats": stats,
        "ratio_median": round(stats["on"]["median_ms"] / stats["off"]["median_ms"], 3),
        "ratio_p95": round(stats["on"]["p95_ms"] / stats["off"]["p95_ms"], 3),
        "load_avg_1m_at_end": round(os.getloadavg()[0], 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    common.common_arguments(parser)
    args = parser.parse_args()
    data_dir = args.data_dir or common.default_data_dir()
    common.check_data(data_dir)
    turns = common.locomo_turns(data_dir)
    questions = common.locomo_questions(data_dir)
    if args.quick:
        turns, questions = turns[:400], questions[:20]
    result = common.base_result("decompose", __doc__.splitlines()[0], args.quick)
    result["recall"] = side_by_side(turns[:5000], questions[:300])
    path = common.write_result(result, args.results_dir, args.results_md)
    recall = result["recall"]
    stats = recall["stats"]
    print(
        f"recall at {recall['stored_turns']} turns: median {stats['off']['median_ms']:.1f} ms "
        f"off, {stats['on']['median_ms']:.1f} ms on ({recall['ratio_median']}×)"
    )
    print(f"wrote {Path(path).name}")


if __name__ == "__main__":
    main()
