"""The first recall after a restart and after a compaction, beside the steady recall, repeated.

``bench_memory_scale.py`` times one first recall of each kind per configuration: a single
sample, which the shared machine's load swings by 2x either way. This benchmark repeats them
on one stored session (built once per size, keyword-only, as ``bench_memory_scale`` builds
it: LoCoMo dialogue turns cycled with renamed speakers, stored 500 at a time and derived
after each chunk, an 8k-token window) and reports medians:

* **steady** — ``on_message_inbound`` (LoCoMo questions, 2,048-token budget) on a warm engine;
* **after a restart** — ``--repeats`` times: the engine closed and a new one opened on the
  same store (the process and its tokenizer stay), then one recall;
* **after a compaction** — ``--repeats`` times: ``--grow`` turns appended and derived, a
  compaction forced (``MemoryEngine.compact``), then one recall.

Each ratio is the kind's median over the steady median, in wall time and in CPU time (the
CPU time of the measuring process, which other processes on a shared machine do not
inflate). Every measurement runs in a fresh child process on its own copy of the stored
session. With ``--other-src DIR`` (another checkout's ``src``, e.g. main exported with
``git archive``) the same children run that code too, alternating with this checkout's
``--rounds`` times, so the two are measured side by side.

Run: ``python benchmarks/bench_first_recall.py --sizes 1k,10k --other-src /tmp/main/src``
(``--quick`` for the smoke test).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import _common as common
import bench_memory_scale as scale
from contextfold.memory.config import MemoryConfig
from contextfold.memory.engine import MemoryEngine
from contextfold.store.sqlite.memory import MemoryStore

SID = "s0000"
BUDGET = 2048


def _config() -> MemoryConfig:
    return MemoryConfig.model_validate({"context_window": 8192})


def _questions(data_dir: Path) -> list[str]:
    questions = common.locomo_questions(data_dir)
    random.Random(22).shuffle(questions)
    return questions


def build(spec: dict[str, Any], data_dir: Path) -> dict[str, Any]:
    """Store and derive ``spec["turns"]`` turns in one session at ``spec["path"]``."""
    turns = common.locomo_turns(data_dir)
    engine = MemoryEngine(_config(), store=MemoryStore(Path(spec["path"])), embedder=None)
    started = time.perf_counter()
    for at in range(0, spec["turns"], scale.CHUNK):
        count = min(scale.CHUNK, spec["turns"] - at)
        engine.store_turns(SID, scale.messages(turns, at, count))
        engine.derive(SID)
    seconds = time.perf_counter() - started
    tags = len(engine.vocabulary(session_id=SID))
    engine.close()
    return {"seconds": round(seconds, 2), "tags": tags}


def measure(spec: dict[str, Any], data_dir: Path) -> dict[str, Any]:
    """Steady, after-restart and after-compaction recalls on the stored session."""
    turns = common.locomo_turns(data_dir)
    questions = _questions(data_dir)
    path = Path(spec["path"])
    config = _config()

    def recall(engine: MemoryEngine, question: str) -> common.Timed:
        return common.time_call(
            lambda: engine.on_message_inbound(question, session_id=SID, budget=BUDGET)
        )

    engine = MemoryEngine(config, store=MemoryStore(path), embedder=None)
    engine.counter.count("warm up")
    asked = iter(questions)
    recall(engine, next(asked))  # the process's imports and first statements
    engine.recaller.settle()  # the whole reads that recall started (bench_memory_scale's)
    steady = common.Samples()
    for _ in range(spec["questions"]):
        steady.add(recall(engine, next(asked)))
    restart = common.Samples()
    for _ in range(spec["repeats"]):
        engine.close()
        engine = MemoryEngine(config, store=MemoryStore(path), embedder=None)
        restart.add(recall(engine, next(asked)))
    compaction = common.Samples()
    position = engine.store.last_seq(SID)
    for _ in range(spec["repeats"]):
        position = scale.grow_and_compact(engine, SID, turns, position, spec["grow"])
        compaction.add(recall(engine, next(asked)))
    engine.close()
    return {
        "steady": steady.stats(),
        "after_restart": restart.stats(),
        "after_compaction": compaction.stats(),
    }


def _child(args: list[str], src: Path | None) -> dict[str, Any]:
    """This script with ``args`` in a fresh interpreter; ``src`` first on its import path."""
    env = dict(os.environ)
    if src is not None:
        env["PYTHONPATH"] = os.pathsep.join([str(src), env.get("PYTHONPATH", "")])
    done = subprocess.run(
        [sys.executable, __file__, *args], capture_output=True, text=True, check=False, env=env
    )
    if done.returncode != 0:
        raise SystemExit(f"child {args[-1][:80]} failed:\n{done.stderr}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def _ratios(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Per kind: the median over the rounds of the kind's median, and its ratio to steady."""

    def median(kind: str, key: str) -> float:
        return statistics.median(r[kind][key] for r in runs)

    out: dict[str, Any] = {}
    for key, name in (("median_ms", "wall"), ("cpu_median_ms", "cpu")):
        base = median("steady", key)
        out[f"steady_{name}_ms"] = round(base, 2)
        for kind in ("after_restart", "after_compaction"):
            value = median(kind, key)
            out[f"{kind}_{name}_ms"] = round(value, 2)
            out[f"{kind}_{name}_ratio"] = round(value / base, 2) if base else None
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    common.common_arguments(parser)
    parser.add_argument("--sizes", default="1k,10k", help="comma-separated session sizes")
    parser.add_argument("--repeats", type=int, default=None, help="first recalls of each kind")
    parser.add_argument("--questions", type=int, default=None, help="steady recalls timed")
    parser.add_argument("--grow", type=int, default=None, help="turns added per compaction")
    parser.add_argument("--rounds", type=int, default=None, help="children per code version")
    parser.add_argument("--other-src", type=Path, default=None, help="another checkout's src")
    parser.add_argument("--other-label", default="other", help="the name of --other-src")
    parser.add_argument("--label", default="this checkout", help="the name of this code")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    data_dir = args.data_dir or common.default_data_dir()
    common.check_data(data_dir)
    if args.child is not None:
        spec = json.loads(args.child)
        run = build if spec["mode"] == "build" else measure
        print(json.dumps(run(spec, data_dir)))
        return
    quick = args.quick
    sizes = ["300"] if quick else args.sizes.split(",")
    repeats = args.repeats or (2 if quick else 8)
    questions = args.questions or (3 if quick else 30)
    grow = args.grow or (50 if quick else 200)
    rounds = args.rounds or (1 if quick else 2)
    sides: list[tuple[str, Path | None]] = [(args.label, None)]
    if args.other_src is not None:
        sides.insert(0, (args.other_label, args.other_src.resolve()))
    folder = Path(tempfile.mkdtemp(prefix="cf-bench-first-"))
    results: list[dict[str, Any]] = []
    try:
        for size in sizes:
            count = int(float(size[:-1]) * 1000) if size.endswith("k") else int(size)
            built = folder / f"{size}.db"
            made = _child(
                ["--data-dir", str(data_dir), "--child", json.dumps({
                    "mode": "build", "path": str(built), "turns": count,
                })],
                None,
            )  # fmt: skip
            entry: dict[str, Any] = {"size": size, "turns": count, "build": made, "sides": {}}
            for n in range(rounds):
                for label, src in sides:
                    copy = folder / f"{size}-{n}-{len(entry['sides'].get(label, []))}.db"
                    for suffix in ("", "-wal", "-shm"):
                        if Path(f"{built}{suffix}").exists():
                            shutil.copy(f"{built}{suffix}", f"{copy}{suffix}")
                    spec = {
                        "mode": "measure",
                        "path": str(copy),
                        "questions": questions,
                        "repeats": repeats,
                        "grow": grow,
                    }
                    load = os.getloadavg()[0]
                    run = _child(["--data-dir", str(data_dir), "--child", json.dumps(spec)], src)
                    run["load_avg_1m"] = round(load, 2)
                    entry["sides"].setdefault(label, []).append(run)
                    shutil.rmtree(copy.with_suffix(".db.vectors"), ignore_errors=True)
            entry["summary"] = {label: _ratios(runs) for label, runs in entry["sides"].items()}
            for label, summary in entry["summary"].items():
                print(
                    f"{size} {label}: steady {summary['steady_wall_ms']:.1f} ms; after restart "
                    f"{summary['after_restart_wall_ratio']}x (CPU "
                    f"{summary['after_restart_cpu_ratio']}x), after compaction "
                    f"{summary['after_compaction_wall_ratio']}x (CPU "
                    f"{summary['after_compaction_cpu_ratio']}x)",
                    flush=True,
                )
            results.append(entry)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    result = common.base_result("first_recall", __doc__.splitlines()[0], quick)
    result["parameters"] = {
        "budget": BUDGET,
        "context_window": 8192,
        "questions": questions,
        "repeats": repeats,
        "grow": grow,
        "rounds": rounds,
        "sides": [label for label, _ in sides],
    }
    result["runs"] = results
    result["correctness"] = {
        "every recall timed": all(
            run[kind]["n"] == (questions if kind == "steady" else repeats)
            for entry in results
            for runs in entry["sides"].values()
            for run in runs
            for kind in ("steady", "after_restart", "after_compaction")
        ),
    }
    result["peak_rss_mb"] = common.peak_rss_mb()
    path = common.write_result(result, args.results_dir, args.results_md)
    print(f"wrote {Path(path).name}")


if __name__ == "__main__":
    main()
