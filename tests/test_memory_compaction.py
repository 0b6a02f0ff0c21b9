"""Summarizers, the token monitor, segmentation and the seed's SDK example."""

from __future__ import annotations

from pathlib import Path

import pytest

from contextfold.errors import ConfigError
from contextfold.llm.openai_compat import OpenAICompatibleClient
from contextfold.memory.compactor import TokenMonitor
from contextfold.memory.summarize import ExtractiveSummarizer, LLMSummarizer
from contextfold.tokens import TiktokenCounter
from fake_llm import FakeLLMServer

COUNTER = TiktokenCounter("cl100k_base")

TURNS = [
    "user: I think the weather was lovely. We went outside for a while.",
    "assistant: The invoice of $4,250 is due on 12 March 2024. Priya Natarajan approved it.",
    "user: Sounds good to me. Let us keep going with the plan as it is.",
]


@pytest.mark.parametrize(
    ("tokens", "level"), [(0, "none"), (699, "none"), (700, "soft"), (849, "soft"), (850, "hard")]
)
def test_token_monitor_levels(tokens: int, level: str) -> None:
    assert TokenMonitor(1000).level(tokens) == level


def test_token_monitor_refuses_inverted_thresholds() -> None:
    with pytest.raises(ConfigError, match="soft <= hard"):
        TokenMonitor(1000, soft=0.9, hard=0.8)


def test_extractive_summary_keeps_numbers_dates_and_names_verbatim() -> None:
    summary = ExtractiveSummarizer(COUNTER, ratio=0.3).summarize(TURNS, max_tokens=40)
    assert "assistant: The invoice of $4,250 is due on 12 March 2024." in summary
    assert COUNTER.count(summary) <= 40
    assert "lovely" not in summary


def test_extractive_summary_respects_a_tiny_max_tokens() -> None:
    summary = ExtractiveSummarizer(COUNTER).summarize(TURNS, max_tokens=5)
    assert summary and COUNTER.count(summary) <= 6


def test_llm_summarizer_splits_its_input_to_fit_its_own_window(fake_llm: FakeLLMServer) -> None:
    fake_llm.reply = "Short summary with 12 March 2024."
    texts = [f"user: message {i} " + "word " * 40 for i in range(12)]  # ~550 tokens
    with OpenAICompatibleClient(base_url=fake_llm.base_url, api_key="k") as client:
        llm = LLMSummarizer(client, "m", counter=COUNTER, context_window=1200, reserve=1024)
        assert llm.summarize(texts, max_tokens=50) == "Short summary with 12 March 2024."
    prompts = [r.body["messages"][1]["content"] for r in fake_llm.requests]
    assert len(prompts) > 2  # pieces, then the summary of the piece summaries
    assert all(COUNTER.count(p) <= 176 for p in prompts)
    assert "verbatim" in fake_llm.requests[0].body["messages"][0]["content"]


def test_llm_summarizer_falls_back_to_extractive_and_says_so(fake_llm: FakeLLMServer) -> None:
    fake_llm.fail_next(500, times=10)
    with OpenAICompatibleClient(fake_llm.base_url, api_key="k", max_retries=0) as client:
        llm = LLMSummarizer(client, "m", counter=COUNTER)
        summary = llm.summarize(TURNS, max_tokens=40)
    assert "$4,250" in summary
    assert llm.fallbacks and "500" in llm.fallbacks[0]


SEED_OPTION_B = """
from virtual_context import VirtualContextEngine, Message

engine = VirtualContextEngine(config_path="./virtual-context.yaml")

# BEFORE sending to LLM - retrieve relevant stored context
assembled = engine.on_message_inbound(
    message="What was the Henninger filing deadline?",
    conversation_history=messages,
)
# assembled.prepend_text → enriched system prompt with retrieved summaries
# assembled.matched_tags → ["legal", "filing"]
# assembled.broad → False (this is a specific query)
# assembled.temporal → False (no time-position reference)

# AFTER LLM responds - tag, index, compact if needed
report = engine.on_turn_complete(messages)
if report:
    print(f"Compacted {report.segments_compacted} segments, freed {report.tokens_freed:,} tokens")
"""


def test_seed_option_b_runs_with_the_import_changed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "virtual-context.yaml").write_text(
        "context_window: 600\nrecall:\n  embedder: none\ncompaction:\n  protected_recent_turns: 2\n"
    )
    messages = []
    for n in range(30):
        messages.append({"role": "user", "content": f"The Henninger filing deadline is May {n}."})
        messages.append({"role": "assistant", "content": f"Noted, Henninger filing item {n}."})
    code = SEED_OPTION_B.replace(
        "from virtual_context import VirtualContextEngine, Message",
        "from contextfold.memory import MemoryEngine as VirtualContextEngine",
    )
    monkeypatch.chdir(tmp_path)
    runs = []
    for _ in range(2):  # the second run finds what the first stored
        namespace = {"messages": messages}
        exec(compile(code, "<seed-001>", "exec"), namespace)
        namespace["engine"].close()  # type: ignore[attr-defined]
        runs.append(namespace)
    namespace = runs[1]
    assembled = namespace["assembled"]
    assert "henninger" in assembled.matched_tags  # type: ignore[attr-defined]
    assert not assembled.broad and not assembled.temporal  # type: ignore[attr-defined]
    assert capsys.readouterr().out.startswith("Compacted ")
    assert runs[0]["assembled"].matched_tags == ()  # nothing stored before the first turn


def _deep_size(obj: object, seen: set[int] | None = None) -> int:
    """The bytes ``obj`` and everything it holds take (containers followed, each object once)."""
    import sys

    seen = set() if seen is None else seen
    if id(obj) in seen:
        return 0
    seen.add(id(obj))
    size = sys.getsizeof(obj)
    if isinstance(obj, dict):
        size += sum(_deep_size(k, seen) + _deep_size(v, seen) for k, v in obj.items())
    elif isinstance(obj, (list, tuple, set, frozenset)):
        size += sum(_deep_size(x, seen) for x in obj)
    return size


def test_the_extractive_summarizers_memo_holds_its_bytes_limit_measured_whole() -> None:
    """The memo of scored sentences stays within ``cache_bytes`` as really measured (keys,
    sentences, their words): it is what kept a long session's process growing."""
    limit = 256 * 1024
    summarizer = ExtractiveSummarizer(COUNTER, cache_bytes=limit)
    for n in range(3000):
        text = f"Ann: Kiln firing {n} on {n % 28 + 1} March reached {n}00 degrees for batch {n}."
        summarizer.summarize(
            [text, f"Bob: Glaze {n} cracked; Priya refired it twice."], max_tokens=20
        )
    memo = summarizer._cache
    assert 0 < memo.bytes <= limit
    assert len(memo) < 3000 * 2  # entries went out to hold it
    real = _deep_size(memo._data) - _deep_size(type(memo._data)())
    assert real <= limit, (real, memo.bytes)
    assert real >= memo.bytes * 0.6  # the measure is near the real size, not far above it


def test_summary_cache_mb_sets_the_engines_summarizer_memo_limit() -> None:
    from contextfold.memory.config import MemoryConfig
    from contextfold.memory.engine import MemoryEngine
    from contextfold.store.sqlite.memory import MemoryStore

    cfg = MemoryConfig.model_validate({"compaction": {"summary_cache_mb": 0.5}})
    engine = MemoryEngine(cfg, store=MemoryStore(counter=COUNTER), embedder=None, counter=COUNTER)
    summarizer = engine.compactor.summarizer
    assert isinstance(summarizer, ExtractiveSummarizer)
    assert summarizer._cache.max_bytes == 512 * 1024
    engine.close()
