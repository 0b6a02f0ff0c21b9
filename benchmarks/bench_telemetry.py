"""What the OpenTelemetry hooks cost (``contextfold.telemetry``): a pipeline build and a memory
recall, each timed in three modes, interleaved round by round in one process:

- ``absent``: as if ``opentelemetry`` were not installed (every hook returns at once);
- ``api``: the OpenTelemetry API installed, no SDK configured (the default: spans are
  non-recording);
- ``sdk``: the SDK's ``TracerProvider`` with a ``SimpleSpanProcessor`` into an in-memory
  exporter (every span recorded with its attributes).

The build packs 300 retrieval items and a system prompt into a 4,000-token window (warm token
counts); the recall is ``MemoryEngine.on_message_inbound`` over a 200-turn session (keyword
tags and full text, no embedding model). No data set is needed.

Run: ``python benchmarks/bench_telemetry.py`` (``--quick`` for the smoke test).
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections.abc import Callable
from typing import Any

from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import _common as common
from contextfold import ContextItem, ContextPipeline, SourceType, telemetry
from contextfold.memory.engine import MemoryEngine
from contextfold.store.sqlite.memory import MemoryStore

MODES = ("absent", "api", "sdk")
TOPICS = ["kitchen tiles", "Henninger filing", "dog allergy", "database timeouts", "Japan trip"]


def _pipeline() -> ContextPipeline:
    items = [
        ContextItem(
            content=f"Passage {n} about {TOPICS[n % len(TOPICS)]}: " + "detail " * (20 + n % 40),
            source=SourceType.RETRIEVAL,
            score=1.0 / (n + 1),
        )
        for n in range(300)
    ]
    return ContextPipeline(max_tokens=4000).add_system_prompt("Answer briefly.").add_items(items)


def _engine(turns: int) -> MemoryEngine:
    engine = MemoryEngine(store=MemoryStore(), embedder=None)
    for n in range(turns // 2):
        topic = TOPICS[n % len(TOPICS)]
        engine.on_turn_complete(
            [
                {"role": "user", "content": f"Note {n}: about the {topic}, item {n} matters."},
                {"role": "assistant", "content": f"Noted item {n} on the {topic}."},
            ],
            new_only=True,
        )
    return engine


class Mode:
    """Switches ``contextfold.telemetry`` between the three modes."""

    def __init__(self) -> None:
        self.exporter = InMemorySpanExporter()
        self.provider = TracerProvider()
        self.provider.add_span_processor(SimpleSpanProcessor(self.exporter))
        self.api = telemetry._trace()

    def set(self, mode: str) -> None:
        telemetry._api = None if mode == "absent" else self.api
        telemetry.use(self.provider if mode == "sdk" else None)
        self.exporter.clear()


def _measure(
    mode: Mode, work: dict[str, Callable[[], Any]], rounds: int, per_round: int
) -> dict[str, dict[str, common.Samples]]:
    samples = {name: {m: common.Samples() for m in MODES} for name in work}
    for fn in work.values():  # warm-up
        for m in MODES:
            mode.set(m)
            fn()
    for _ in range(rounds):
        for name, fn in work.items():
            for m in MODES:
                mode.set(m)
                for _ in range(per_round):
                    samples[name][m].add(common.time_call(fn))
    mode.set("api")
    return samples


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    common.common_arguments(parser)
    args = parser.parse_args()
    rounds, per_round, turns = (3, 3, 40) if args.quick else (20, 25, 200)

    pipeline = _pipeline()
    engine = _engine(turns)
    work: dict[str, Callable[[], Any]] = {
        "pipeline build": lambda: pipeline.build("What about the Henninger filing?"),
        "memory recall": lambda: engine.on_message_inbound("When is the Henninger filing?"),
    }
    mode = Mode()
    # Each mode does what it claims: no span, non-recording spans, recorded spans.
    for m in MODES:
        mode.set(m)
        pipeline.build("q")
        engine.on_message_inbound("Henninger?")
        recorded = {s.name for s in mode.exporter.get_finished_spans()}
        expected = {"contextfold.pipeline.build", "contextfold.memory.recall"}
        if (m == "sdk") != (recorded == expected):
            sys.exit(f"mode {m}: recorded spans {sorted(recorded)}")
    samples = _measure(mode, work, rounds, per_round)

    rows = []
    for name in work:
        stats = {m: samples[name][m].stats() for m in MODES}
        base = stats["absent"]["median_ms"]
        cpu_base = stats["absent"]["cpu_median_ms"]
        rows.append(
            {
                "work": name,
                "stats": stats,
                "ratio_median": {m: round(stats[m]["median_ms"] / base, 3) for m in MODES},
                "ratio_cpu": {m: round(stats[m]["cpu_median_ms"] / cpu_base, 3) for m in MODES},
                "overhead_us_cpu": {
                    m: round((stats[m]["cpu_median_ms"] - cpu_base) * 1000, 1) for m in MODES
                },
            }
        )
    result = common.base_result(
        "telemetry", "OpenTelemetry hook cost: absent / API only / SDK recording", args.quick
    )
    result.update(
        {
            "rounds": rounds,
            "per_round": per_round,
            "session_turns": turns,
            "rows": rows,
            "median_of_medians_ms": {
                row["work"]: statistics.median(s["median_ms"] for s in row["stats"].values())
                for row in rows
            },
            "peak_rss_mb": common.peak_rss_mb(),
        }
    )
    path = common.write_result(result, args.results_dir, args.results_md)
    for row in rows:
        print(row["work"], {m: row["stats"][m]["median_ms"] for m in MODES}, row["ratio_cpu"])
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
