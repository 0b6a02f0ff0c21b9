"""OpenTelemetry spans (issue 17, point 7), read with the SDK's in-memory exporter: one per
pipeline build, recall, compaction and proxied request, with token counts and decisions as
attributes; and nothing at all when OpenTelemetry is not installed."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from contextfold import ContextItem, ContextPipeline, SourceType, telemetry
from contextfold.memory.config import MemoryConfig
from contextfold.memory.engine import MemoryEngine
from contextfold.server.config import ProxySettings, ServerConfig
from contextfold.store.sqlite.memory import MemoryStore
from fake_llm import FakeLLMServer
from proxy_support import closed_after_test, serve

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    telemetry.use(provider)
    try:
        yield exporter
    finally:
        telemetry.use(None)
        provider.shutdown()


def _named(exporter: InMemorySpanExporter, name: str) -> list[ReadableSpan]:
    return [s for s in exporter.get_finished_spans() if s.name == name]


def _attrs(span: ReadableSpan) -> dict[str, Any]:
    return {k.removeprefix("contextfold."): v for k, v in (span.attributes or {}).items()}


def _pipeline() -> ContextPipeline:
    items = [
        ContextItem(content=f"fact {n}: " + "word " * 60, source=SourceType.RETRIEVAL, score=n)
        for n in range(8)
    ]
    return ContextPipeline(max_tokens=300).add_system_prompt("Be brief.").add_items(items)


def test_a_build_is_one_span_with_its_counts(spans: InMemorySpanExporter) -> None:
    result = _pipeline().build("What are the facts?")
    (span,) = _named(spans, "contextfold.pipeline.build")
    attrs = _attrs(span)
    d = result.diagnostics
    assert attrs["tokens.used"] == d.used_tokens
    assert attrs["tokens.max"] == 300
    assert (attrs["items.candidates"], attrs["items.kept"], attrs["items.dropped"]) == (
        d.candidates,
        d.kept,
        d.dropped,
    )
    assert d.dropped > 0  # the decisions the span reports are real ones
    assert attrs["format"] == d.format
    for section in d.sections:
        assert attrs[f"section.{section.name}.used"] == section.used

    asyncio.run(_pipeline().abuild("What are the facts?"))
    assert len(_named(spans, "contextfold.pipeline.build")) == 2


def _engine(**config: Any) -> MemoryEngine:
    return MemoryEngine(MemoryConfig.model_validate(config), store=MemoryStore(), embedder=None)


def test_a_recall_inside_a_build_is_its_child(spans: InMemorySpanExporter) -> None:
    engine = _engine()
    engine.on_turn_complete(
        [
            {"role": "user", "content": "Our Henninger filing deadline is March 3."},
            {"role": "assistant", "content": "Noted: the Henninger filing is due March 3."},
        ]
    )
    pipeline = ContextPipeline(max_tokens=2000).with_memory(engine)
    pipeline.build("When is the Henninger filing due?")
    (build,) = _named(spans, "contextfold.pipeline.build")
    (recall,) = _named(spans, "contextfold.memory.recall")
    assert recall.parent is not None and recall.parent.span_id == build.context.span_id
    assert recall.start_time is not None and build.start_time is not None
    assert build.start_time <= recall.start_time <= (recall.end_time or 0) <= (build.end_time or 0)
    attrs = _attrs(recall)
    assert attrs["session_id"] == "default"
    assert "henninger" in attrs["tags.matched"]
    assert attrs["recall.injected"] is True and attrs["memory.tokens"] > 0

    spans.clear()
    nothing = engine.on_message_inbound("What colour is the sky on Mars?")
    (miss,) = _named(spans, "contextfold.memory.recall")
    assert _attrs(miss)["recall.injected"] is (nothing.prepend_text != "")


def test_a_compaction_is_a_span_with_its_report(spans: InMemorySpanExporter) -> None:
    engine = _engine(compaction={"protected_recent_turns": 2})
    for n in range(6):
        engine.on_turn_complete(
            [
                {"role": "user", "content": f"Topic {n}: the kitchen tiles are white, batch {n}."},
                {"role": "assistant", "content": f"Noted batch {n} of white kitchen tiles."},
            ]
        )
    report = engine.compact()
    assert report is not None
    (span,) = _named(spans, "contextfold.memory.compaction")
    attrs = _attrs(span)
    assert (attrs["turns"], attrs["tokens.freed"], attrs["watermark.after"]) == (
        report.turns_compacted,
        report.tokens_freed,
        report.watermark_after,
    )
    assert attrs["level"] == "hard"
    assert span.end_time is not None and span.start_time is not None
    assert abs((span.end_time - span.start_time) / 1e6 - report.duration_ms) < 5


def test_a_proxied_request_is_a_span(
    spans: InMemorySpanExporter, fake_llm: FakeLLMServer, tmp_path: Path
) -> None:
    engine = MemoryEngine(store=tmp_path / "memory.db", embedder=None)
    config = ServerConfig(port=0, proxy=ProxySettings(upstream=fake_llm.url))
    with serve(config, engine) as served:
        client = closed_after_test(
            openai.OpenAI(base_url=f"{served.url}/v1", api_key="sk-test", max_retries=0)
        )
        first = [{"role": "user", "content": "Our Henninger filing is due on March 3."}]
        reply = client.chat.completions.create(model="gpt-4o-mini", messages=first)
        follow_up = [
            *first,
            {"role": "assistant", "content": reply.choices[0].message.content},
            {"role": "user", "content": "When is the Henninger filing due?"},
        ]
        client.chat.completions.create(model="gpt-4o-mini", messages=follow_up)
        served.drain()
        records = sorted(served.events.recent(), key=lambda r: r.created_at)
    engine.close()
    proxied = sorted(_named(spans, "contextfold.proxy.request"), key=lambda s: s.start_time or 0)
    assert len(proxied) == len(records) == 2
    for span, record in zip(proxied, records, strict=True):
        attrs = _attrs(span)
        assert attrs["http.status"] == 200
        assert attrs["path"] == "/v1/chat/completions" and attrs["format"] == "openai"
        assert attrs["model"] == "gpt-4o-mini"
        assert (attrs["tokens.in"], attrs["tokens.forwarded"]) == (
            record.tokens_in,
            record.tokens_forwarded,
        )
        assert attrs["tokens.forwarded"] > 0
        assert attrs["session_id"] == record.session_id
        assert attrs["memory.tokens"] == record.memory_tokens
    (recall,) = _named(spans, "contextfold.memory.recall")  # the second request's
    assert _attrs(recall)["session_id"] == records[1].session_id


def test_without_opentelemetry_every_hook_is_a_no_op() -> None:
    script = textwrap.dedent(
        """
        import sys
        sys.modules["opentelemetry"] = None  # as if the extra were not installed
        from contextfold import ContextPipeline, telemetry
        from contextfold.memory.engine import MemoryEngine
        assert not telemetry.enabled()
        result = ContextPipeline(max_tokens=200).add_system_prompt("Hi").build("q")
        engine = MemoryEngine(store=":memory:", embedder=None)
        engine.on_turn_complete([{"role": "user", "content": "The code is 4411."}])
        engine.on_message_inbound("What is the code?")
        print("ok", result.diagnostics.used_tokens > 0)
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=120,
        env={"PYTHONPATH": str(ROOT / "src"), "PATH": "/usr/bin:/bin"},
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok True"


def test_the_benchmark_runs_and_its_modes_do_what_they_say(tmp_path: Path) -> None:
    """``bench_telemetry.py --quick`` (it exits non-zero when a mode records the wrong spans);
    its table renders from the JSON it writes."""
    import json
    import os

    done = subprocess.run(
        [
            sys.executable,
            str(ROOT / "benchmarks" / "bench_telemetry.py"),
            "--quick",
            "--results-dir",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": str(ROOT / "src")},
        check=False,
    )
    assert done.returncode == 0, done.stderr
    (result,) = [json.loads(p.read_text()) for p in tmp_path.glob("telemetry-*-quick.json")]
    assert [row["work"] for row in result["rows"]] == ["pipeline build", "memory recall"]
    for row in result["rows"]:
        assert set(row["stats"]) == {"absent", "api", "sdk"}
        assert row["ratio_cpu"]["absent"] == 1.0
    assert "## OpenTelemetry hooks" in (tmp_path / "RESULTS.md").read_text()
