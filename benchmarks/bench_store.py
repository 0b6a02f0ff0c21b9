"""The memory store's backends side by side: SQLite (a WAL file) and PostgreSQL (a real server).

Measured in one run, on the same machine, through the engine's own API, the two backends
taking turns call by call (so a load that changes during the run weighs on both alike):

* **the write path** — ``MemoryEngine.on_turn_complete`` with one new message per call (the
  turn stored raw, tagged and compaction checked, as the library does it; keyword tags, no
  embedder, so storage dominates), and the proxy's ``MemoryStore.commit_exchange`` of a
  user/assistant pair: milliseconds per turn on each backend and their ratio (the bar:
  PostgreSQL within 3x of SQLite);
* **recall** — ``on_message_inbound`` at the default 2,048-token budget for LoCoMo questions
  on the stored conversation, p50/p95 on each backend, and whether both gave the same memory
  text for every question;
* **LoCoMo** — ``run_locomo`` with the ``contextfold`` system on a fresh in-memory SQLite store
  per conversation and on one PostgreSQL store (each conversation's session deleted before the
  next): evidence recall per budget on each, and whether every question's recall and token
  count agree (the backend must not change the answer).

The PostgreSQL server is Debian's ``postgresql`` started in a temporary folder
(``tests/postgres_support.py``), or ``--postgres URL`` (a database the run may fill).

Run: ``python benchmarks/bench_store.py`` (``--quick`` for the smoke test).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import _common as common
from contextfold.items import Message
from contextfold.memory.config import MemoryConfig
from contextfold.memory.engine import MemoryEngine
from contextfold.store import masked_location, open_memory_store
from contextfold.tokens import TiktokenCounter

sys.path.insert(0, str(common.ROOT / "tests"))
from postgres_support import PostgresServer

BUDGET = 2048


@contextmanager
def postgres(url: str | None) -> Iterator[PostgresServer]:
    server = PostgresServer()
    if url:
        server.url = url
    with server:
        yield server


def locations(server: PostgresServer, folder: Path, label: str) -> dict[str, str]:
    return {"sqlite": str(folder / f"{label}.db"), "postgres": server.new_database()}


def write_paths(
    locs: dict[str, str], turns: list[common.Turn], counter: TiktokenCounter
) -> tuple[dict[str, MemoryEngine], dict[str, dict[str, list[float]]]]:
    """Seconds per turn of ``on_turn_complete`` (one message per call) and of
    ``commit_exchange`` (pairs) on each backend's store, the backends taking turns call by
    call (in alternating order), so a load that changes during the run weighs on both."""
    engines = {
        backend: MemoryEngine(
            MemoryConfig(),
            store=open_memory_store(loc, counter=counter),
            embedder=None,
            counter=counter,
        )
        for backend, loc in locs.items()
    }
    per_turn: dict[str, list[float]] = {backend: [] for backend in locs}
    for n, t in enumerate(turns):
        message = Message(role="user" if t.first_speaker else "assistant", content=t.text)
        for backend in _alternating(list(locs), n):
            started = time.perf_counter()
            engines[backend].on_turn_complete([message], session_id="conversation", new_only=True)
            per_turn[backend].append(time.perf_counter() - started)
    sids = {b: engines[b].store.create_session("exchanges") for b in locs}
    per_pair: dict[str, list[float]] = {backend: [] for backend in locs}
    for n, i in enumerate(range(0, len(turns) - 1, 2)):
        pair = [Message(role="user", content=turns[i].text),
                Message(role="assistant", content=turns[i + 1].text)]  # fmt: skip
        for backend in _alternating(list(locs), n):
            started = time.perf_counter()
            engines[backend].store.commit_exchange(sids[backend], pair)
            per_pair[backend].append((time.perf_counter() - started) / 2)
    return engines, {
        backend: {
            "on_turn_complete": per_turn[backend],
            "commit_exchange_per_turn": per_pair[backend],
        }
        for backend in locs
    }


def _alternating(backends: list[str], n: int) -> list[str]:
    """The backends in their order on even calls, reversed on odd ones."""
    return backends if n % 2 == 0 else backends[::-1]


def recall(
    engines: dict[str, MemoryEngine], questions: list[str]
) -> tuple[dict[str, list[float]], dict[str, list[str]]]:
    """Seconds of ``on_message_inbound`` on each backend (taking turns, as ``write_paths``)
    and the memory text each gave."""
    seconds: dict[str, list[float]] = {b: [] for b in engines}
    texts: dict[str, list[str]] = {b: [] for b in engines}
    for n, q in enumerate(questions):
        for backend in _alternating(list(engines), n):
            started = time.perf_counter()
            ctx = engines[backend].on_message_inbound(q, session_id="conversation", budget=BUDGET)
            seconds[backend].append(time.perf_counter() - started)
            texts[backend].append(ctx.prepend_text)
    return seconds, texts


_MEASURES = ("on_turn_complete", "commit_exchange_per_turn", "recall")


def _ratio(
    written: dict[str, dict[str, list[float]]], recalled: dict[str, list[float]], key: str
) -> float:
    """PostgreSQL's median over SQLite's, in one repeat."""
    got = {b: recalled[b] if key == "recall" else written[b][key] for b in recalled}
    return round(statistics.median(got["postgres"]) / statistics.median(got["sqlite"]), 2)


def locomo(data_dir: Path, store: str | None, quick: bool) -> Any:
    import contextfold.eval.locomo_memory  # noqa: F401 - registers "contextfold"
    from contextfold.eval.locomo import load_locomo
    from contextfold.eval.locomo_run import run_locomo
    from contextfold.eval.locomo_systems import SystemContext
    from contextfold.store.sqlite import home_dir
    from contextfold.testing import HashEmbedder

    conversations = load_locomo(data_dir / "locomo" / "locomo10.json")
    if quick:
        conversations = conversations[:1]
        ctx = SystemContext(embedder=HashEmbedder(), memory_store=store)
    else:
        ctx = SystemContext(embedding_cache=home_dir() / "embedding-cache.db", memory_store=store)
    try:
        return run_locomo(
            conversations, ["contextfold"], [512, 2048], progress=False, context=ctx,
            per_question=True,
        )  # fmt: skip
    finally:
        ctx.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    common.common_arguments(parser)
    parser.add_argument("--postgres", default=None, help="a PostgreSQL URL instead of a local one")
    parser.add_argument("--turns", type=int, default=None, help="turns written (default 2,000)")
    parser.add_argument("--no-locomo", action="store_true", help="skip the LoCoMo comparison")
    parser.add_argument(
        "--repeats", type=int, default=None, help="write/recall runs, fresh stores each (3)"
    )
    args = parser.parse_args()
    data_dir = args.data_dir or common.default_data_dir()
    common.check_data(data_dir)
    n_turns = args.turns or (60 if args.quick else 2000)
    args.repeats = args.repeats or (1 if args.quick else 3)
    all_turns = common.locomo_turns(data_dir)
    turns = [all_turns[i % len(all_turns)] for i in range(n_turns)]
    with (data_dir / "locomo/locomo10.json").open(encoding="utf-8") as f:
        samples = json.load(f)
    # The questions of the conversations whose turns were written, in file order.
    asked = {t.conversation for t in turns}
    questions = [str(qa["question"]) for c in sorted(asked) for qa in samples[c]["qa"]]
    questions = questions[: 10 if args.quick else 200]
    counter = TiktokenCounter("cl100k_base")
    result = common.base_result("store", __doc__.splitlines()[0], args.quick)
    result["parameters"] = {
        "turns": n_turns,
        "questions": len(questions),
        "budget": BUDGET,
        "repeats": args.repeats,
    }
    configs: list[dict[str, Any]] = []
    with postgres(args.postgres) as server, tempfile.TemporaryDirectory() as tmp:
        result["postgres"] = masked_location(server.url)
        samples: dict[str, dict[str, list[float]]] = {
            b: {key: [] for key in _MEASURES} for b in ("sqlite", "postgres")
        }
        repeats = []
        same_text = True
        for repeat in range(args.repeats):
            load = round(os.getloadavg()[0], 2)
            locs = locations(server, Path(tmp), f"write{repeat}")
            engines, written = write_paths(locs, turns, counter)
            recalled, texts = recall(engines, questions)
            for engine in engines.values():
                engine.close()
            same_text = same_text and texts["sqlite"] == texts["postgres"]
            for backend in samples:
                for key, values in (*written[backend].items(), ("recall", recalled[backend])):
                    samples[backend][key] += values
            ratios = {key: _ratio(written, recalled, key) for key in _MEASURES}
            repeats.append({"load_avg_1m_at_start": load, "ratios": ratios})
            print(f"repeat {repeat + 1} (load {load}): ratios {ratios}", flush=True)
        for backend, measures in samples.items():
            stats = {key: common.timing_stats(values) for key, values in measures.items()}
            configs.append({"label": backend, **stats})
            print(
                f"{backend}: on_turn_complete {stats['on_turn_complete']['median_ms']:.2f} ms,"
                f" commit_exchange {stats['commit_exchange_per_turn']['median_ms']:.2f} ms"
                f" per turn; recall p50 {stats['recall']['median_ms']:.1f} ms",
                flush=True,
            )
        result["repeats"] = repeats
        locomo_runs = {}
        if not args.no_locomo:
            runs_at: list[tuple[str, str | None]] = [
                ("sqlite", None),
                ("postgres", server.new_database()),
            ]
            for backend, loc in runs_at:
                report = locomo(data_dir, loc, args.quick)
                locomo_runs[backend] = report.system("contextfold")
                print(f"{backend}: LoCoMo done", flush=True)
    sqlite, pg = configs
    ratios = {
        key: round(pg[key]["median_ms"] / sqlite[key]["median_ms"], 2)
        for key in ("on_turn_complete", "commit_exchange_per_turn", "recall")
    }
    result["configs"] = configs
    result["ratios_postgres_over_sqlite"] = ratios
    result["goals"] = {"write path (on_turn_complete) on PostgreSQL within 3x of SQLite": (
        ratios["on_turn_complete"] <= 3.0
    )}  # fmt: skip
    correctness = {"same memory text for every recall": same_text}
    if locomo_runs:
        runs = {b: r.model_dump() for b, r in locomo_runs.items()}
        result["locomo"] = {
            b: {
                "conversations": len(r["ingest_s"]),
                "questions": len(r["questions"] or []),
                "evidence_recall": {
                    str(x["budget"]): x["evidence_recall"]["1-4"]["mean"] for x in r["budgets"]
                },
            }
            for b, r in runs.items()
        }

        def answers(r: dict[str, Any]) -> list[tuple[Any, ...]]:
            return [(q["question_id"], q["recall"], q["tokens"]) for q in r["questions"] or []]

        same = answers(runs["sqlite"]) == answers(runs["postgres"])
        correctness["LoCoMo: every question's recall and tokens identical"] = same
    result["correctness"] = correctness
    result["peak_rss_mb"] = common.peak_rss_mb()
    path = common.write_result(result, args.results_dir, args.results_md)
    print(f"ratios (PostgreSQL / SQLite): {ratios}; correctness {correctness}")
    print(f"wrote {Path(path).name}")


if __name__ == "__main__":
    main()
