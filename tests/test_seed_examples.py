"""The seed README's examples run unchanged except for the package name.

Each block is the exact text of a code block in seed 000 (astro-context's README); the only edit
made before running it is ``astro_context`` → ``contextfold``.
"""

from __future__ import annotations

from typing import Any

import pytest

from contextfold import (
    AnthropicFormatter,
    ContextItem,
    ContextPipeline,
    MemoryManager,
    QueryBundle,
    TokenBudget,
)

QUICK_START = """\
from astro_context import ContextPipeline, MemoryManager, AnthropicFormatter

pipeline = (
    ContextPipeline(max_tokens=8192)
    .with_memory(MemoryManager(conversation_tokens=4096))
    .with_formatter(AnthropicFormatter())
    .add_system_prompt("You are a helpful assistant.")
)

result = pipeline.build("What is context engineering?")
print(result.formatted_output)   # Ready for the Anthropic API
print(result.diagnostics)        # Token usage, timing, overflow info
"""

TOKEN_BUDGETS = """\
from astro_context import ContextPipeline, default_chat_budget

budget = default_chat_budget(max_tokens=8192)
pipeline = ContextPipeline(max_tokens=8192).with_budget(budget)
"""

DECORATOR_API = '''\
from astro_context import ContextPipeline, ContextItem, QueryBundle

pipeline = ContextPipeline(max_tokens=8192)

@pipeline.step
def boost_recent(items: list[ContextItem], query: QueryBundle) -> list[ContextItem]:
    """Boost the score of recent items."""
    return [
        item.model_copy(update={"score": min(1.0, item.score * 1.5)})
        if item.metadata.get("recent")
        else item
        for item in items
    ]

result = pipeline.build("What is context engineering?")
'''


def run_seed(code: str) -> dict[str, Any]:
    assert "astro_context" in code  # the text is the seed's own
    namespace: dict[str, Any] = {"__name__": "seed_example"}
    exec(compile(code.replace("astro_context", "contextfold"), "<seed>", "exec"), namespace)
    return namespace


def test_quick_start(capsys: pytest.CaptureFixture[str]) -> None:
    ns = run_seed(QUICK_START)
    pipeline, result = ns["pipeline"], ns["result"]
    assert isinstance(pipeline, ContextPipeline)
    assert isinstance(pipeline.formatter, AnthropicFormatter)
    payload = result.formatted_output
    assert list(payload) == ["system", "messages"]
    (system,) = payload["system"]
    assert (system["type"], system["text"]) == ("text", "You are a helpful assistant.")
    assert system["cache_control"] == {"type": "ephemeral"}
    (message,) = payload["messages"]
    assert message == {
        "role": "user",
        "content": [{"type": "text", "text": "What is context engineering?"}],
    }
    d = result.diagnostics
    assert (d.format, d.max_tokens, d.kept, d.dropped) == ("anthropic", 8192, 2, 0)
    out = capsys.readouterr().out
    assert str(payload) in out
    assert "Context budget" in out and "anthropic format" in out


def test_quick_start_memory_joins_later_builds() -> None:
    ns = run_seed(QUICK_START)
    pipeline: ContextPipeline = ns["pipeline"]
    memory = pipeline._memory
    assert isinstance(memory, MemoryManager) and memory.conversation_tokens == 4096
    memory.add_user_message("Hi, I'm Ada.")
    memory.add_assistant_message("Hello Ada!")
    payload = pipeline.build("What is my name?").formatted_output
    roles = [m["role"] for m in payload["messages"]]
    assert roles == ["user", "assistant", "user"]
    assert payload["messages"][0]["content"][0]["text"] == "Hi, I'm Ada."
    assert payload["messages"][-1]["content"][-1]["text"] == "What is my name?"


def test_token_budgets() -> None:
    ns = run_seed(TOKEN_BUDGETS)
    budget, pipeline = ns["budget"], ns["pipeline"]
    assert isinstance(budget, TokenBudget)
    assert pipeline.budget is budget
    assert budget.max_tokens == 8192
    assert budget.reserve_output == int(8192 * 0.15) == 1228  # "reserves 15% for the response"
    conversation = next(s for s in budget.sections if s.name == "conversation")
    assert conversation.min == int(budget.available * 0.60)  # "60% conversation"
    result = pipeline.build("hello")
    assert result.diagnostics.reserve_output == 1228
    assert result.diagnostics.available == 6964


def test_decorator_api() -> None:
    ns = run_seed(DECORATOR_API)
    pipeline, result, boost_recent = ns["pipeline"], ns["result"], ns["boost_recent"]
    assert [s.name for s in pipeline.steps] == ["boost_recent"]
    (record,) = result.diagnostics.steps
    assert (record.name, record.status, record.error) == ("boost_recent", "ok", None)
    recent = ContextItem(content="new", score=0.5, metadata={"recent": True})
    old = ContextItem(content="old", score=0.5)
    boosted = boost_recent([recent, old], QueryBundle(query_str="q"))
    assert [i.score for i in boosted] == [0.75, 0.5]
    assert boost_recent.__doc__ == "Boost the score of recent items."


def test_decorator_step_changes_what_is_packed() -> None:
    ns = run_seed(DECORATOR_API)
    pipeline: ContextPipeline = ns["pipeline"]
    # Two 5,000-token items against 8,192: only one fits. Unboosted, "old" (0.6) would win.
    items = [
        ContextItem(id="old", content=" old" * 5000, score=0.6),
        ContextItem(id="new", content=" new" * 5000, score=0.5, metadata={"recent": True}),
    ]
    assert pipeline.counter.count(items[0].content) == 5000
    result = pipeline.add_items(items).build("What is context engineering?")
    assert [i.id for i in result.items if i.id in {"old", "new"}] == ["new"]
    assert [i.id for i in result.overflow_items] == ["old"]
    assert result.diagnostics.steps[0].items_after == 2
