"""Memory engine speed on the real LoCoMo dialogue: writes and recall.

* ``on_turn_complete`` throughput without an LLM (keyword tagging, extractive summaries,
  compaction included; embeddings are deferred to recall, off the write path): all 5,882
  LoCoMo turns fed one call per turn, one session per conversation, an 8k-token window so
  compaction fires. Bar: >= 500 turns/s.
* Recall latency with 5,000 stored turns in one session (the first 5,000 LoCoMo turns): median
  and p95 of ``on_message_inbound`` for the LoCoMo questions at a 2,048-token budget, with the
  offline MiniLM embedder (turn vectors embedded once before timing). Bar: median <= 50 ms.

Run: ``python benchmarks/bench_memory.py`` (``--quick`` for the smoke test).
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from pathlib import Path

import _common as common
from contextfold.memory.config import MemoryConfig
from contextfold.memory.engine import MemoryEngine
from contextfold.store.sqlite.memory import MemoryStore


def write_throughput(turns: list[common.Turn], quick: bool) -> dict[str, object]:
    config = MemoryConfig.model_validate({"context_window": 8192})
    folder = tempfile.mkdtemp(prefix="cf-bench-memory-")
    # A SQLite file in WAL mode, as the engine's default store is; the tokenizer is loaded
    # before the clock starts.
    engine = MemoryEngine(config, store=MemoryStore(Path(folder) / "memory.db"), embedder=None)
    engine.counter.count("warm up")
    started = time.perf_counter()
    cpu = time.process_time()
    reports = 0
    for turn in turns:
        role = "user" if turn.first_speaker else "assistant"
        report = engine.on_turn_complete(
            [{"role": role, "content": f"{turn.speaker}: {turn.text}"}],
            session_id=f"conv-{turn.conversation}",
        )
        reports += report is not None
    wall = time.perf_counter() - started
    engine.close()
    shutil.rmtree(folder, ignore_errors=True)
    return {
        "turns": len(turns),
        "seconds": wall,
        "cpu_seconds": time.process_time() - cpu,
        "turns_per_second": len(turns) / wall,
        "compactions": reports,
        "store": "sqlite file (WAL)",
        "quick": quick,
    }


def recall_latency(turns: list[common.Turn], questions: list[str]) -> dict[str, object]:
    config = MemoryConfig.model_validate({"context_window": 8192})
    engine = MemoryEngine(config, store=MemoryStore())
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
    engine.on_message_inbound(questions[0])  # warm: model loaded, vectors cached
    samples = common.Samples()
    for question in questions:
        samples.add(common.time_call(lambda q=question: engine.on_message_inbound(q, budget=2048)))
    return {"stored_turns": len(turns), "questions": len(questions), **samples.stats()}


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
    result = common.base_result("memory", __doc__.splitlines()[0], args.quick)
    result["write"] = write_throughput(turns, args.quick)
    result["recall"] = recall_latency(turns[:5000], questions[:300])
    path = common.write_result(result, args.results_dir, args.results_md)
    write, recall = result["write"], result["recall"]
    print(f"on_turn_complete: {write['turns_per_second']:.0f} turns/s ({write['turns']} turns)")
    print(f"recall at {recall['stored_turns']} turns: median {recall['median_ms']:.1f} ms")
    print(f"wrote {Path(path).name}")


if __name__ == "__main__":
    main()
