"""Model-tiered delegation through the real proxy (``paging.mode: tools``): a strong model gets
the budget dashboard and expand/collapse/find_quote, a weak one the topic list and
expand_topic; both sessions page topics in through their tool calls and end within budget."""

from __future__ import annotations

import logging
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest

from contextfold.memory.engine import MemoryEngine
from contextfold.server.config import ProxySettings, ServerConfig
from contextfold.server.proxy.fit import CUT, reply_reserve
from fake_llm import FakeLLMServer, ModelTurn, ToolCall
from proxy_support import Served, closed_after_test, make_engine, serve, tokens_sent

PAGING_BUDGET = 400
MEMORY_BUDGET = 700

TOPICS = {
    "kiln": "The kiln firing schedule for load {n} peaks at cone six, held ten minutes, "
    "then cools slowly overnight with the damper shut.",
    "sourdough": "Sourdough batch {n}: feed the starter at 8am, bulk ferment five hours, "
    "shape, then proof overnight in the fridge.",
    "marathon": "Marathon week {n}: long run of {n}8 kilometres, two tempo runs, one rest "
    "day, and hill repeats on Thursday.",
}


@pytest.fixture
def served(fake_llm: FakeLLMServer, tmp_path: Path) -> Iterator[tuple[Served, MemoryEngine]]:
    config = {
        # A small window, so compaction starts soon; memory's budget fits inside it beside
        # the tools and the reply's reserve (half the window: the client names no max_tokens).
        "context_window": 4 * MEMORY_BUDGET,
        "compaction": {"protected_recent_turns": 2, "soft_threshold": 0.3},
        "paging": {"mode": "tools", "budget": PAGING_BUDGET},
        "assembly": {"memory_budget": MEMORY_BUDGET, "context_hint_share": 0.3},
    }
    with make_engine(tmp_path, **config) as memory:
        settings = ServerConfig(port=0, proxy=ProxySettings(upstream=fake_llm.url))
        with serve(settings, memory) as running:
            yield running, memory


def topics_listed(body: dict[str, Any]) -> list[str]:
    """The topics the request's memory lists: the topic hint's, or the budget dashboard's
    (both go in a user message), the dashboard's first."""
    for message in reversed(body["messages"]):
        text = str(message.get("content"))
        board = re.findall(r"^- ([\w-]+): \d+ / \d+ / \d+", text, re.MULTILINE)
        if board:
            return board
        found = re.search(r"Earlier topics \(turns\): (.*)", text)
        if found:
            return re.findall(r"([\w-]+) \(\d+\)", found.group(1))
    return []


def model_that_pages(body: dict[str, Any]) -> str | ModelTurn:
    """A model that uses the memory tools it is offered: it expands the listed topics in full
    (the budget cannot hold them all: contextfold collapses the cold ones), a strong one then
    collapses the last again, and it answers."""
    offered = [t["function"]["name"] for t in body.get("tools", [])]
    done = [m for m in body["messages"] if m.get("role") == "tool"]
    topics = topics_listed(body)
    if "expand_topic" not in offered or done or not topics:
        return "Noted."
    calls = [
        ToolCall("expand_topic", {"tag": t, "depth": "full"}, f"e{i}")
        for i, t in enumerate(topics[:4])
    ]
    if "collapse_topic" in offered:
        calls.append(ToolCall("collapse_topic", {"tag": topics[:4][-1], "depth": "summary"}, "c0"))
    return ModelTurn("", tuple(calls))


def converse(served: Served, fake: FakeLLMServer, model: str) -> str:
    client = closed_after_test(
        openai.OpenAI(base_url=f"{served.url}/v1", api_key="sk-test", max_retries=0)
    )
    fake.reply = model_that_pages
    history: list[Any] = []
    for n in range(1, 4):
        for text in TOPICS.values():
            history.append({"role": "user", "content": text.format(n=n)})
            reply = client.chat.completions.create(model=model, messages=history)
            history.append({"role": "assistant", "content": reply.choices[0].message.content})
            served.drain()
    history.append({"role": "user", "content": "What did we settle about the kiln?"})
    client.chat.completions.create(model=model, messages=history)
    served.drain()
    record = served.events.recent()[-1]
    assert record.session_id is not None
    return str(record.session_id)


def forwarded_with_tools(fake: FakeLLMServer) -> list[dict[str, Any]]:
    return [r.body for r in fake.requests if isinstance(r.body, dict) and r.body.get("tools")]


@pytest.mark.parametrize(
    ("model", "tools", "dashboard"),
    [
        ("claude-opus-4-1", ["expand_topic", "collapse_topic", "find_quote"], True),
        ("claude-3-5-haiku-latest", ["expand_topic"], False),
    ],
    ids=["strong", "weak"],
)
def test_each_tier_gets_its_tools_and_ends_within_budget(
    served: tuple[Served, MemoryEngine],
    fake_llm: FakeLLMServer,
    model: str,
    tools: list[str],
    dashboard: bool,
) -> None:
    running, engine = served
    sid = converse(running, fake_llm, model)
    bodies = forwarded_with_tools(fake_llm)
    assert bodies and all([t["function"]["name"] for t in b["tools"]] == tools for b in bodies)
    asked = [b for b in bodies if b["messages"][-1]["role"] == "user"]
    last = str(asked[-1]["messages"][-1]["content"])
    assert ("<memory-budget>" in last) is dashboard
    if not dashboard:
        assert "Use expand_topic to read one of these topics in detail." in last
    # The model paged topics in through its calls…
    calls = [c for r in running.events.recent() for c in r.extra.get("memory_tool_calls", [])]
    assert any(c["name"] == "expand_topic" for c in calls)
    assert any(c["name"] == "collapse_topic" for c in calls) is dashboard
    # …and both sessions end within budget: the working set within the paging budget, every
    # memory block within the memory budget.
    working = engine.store.paging.working_set(sid)
    assert any(e.depth != "none" for e in working.values())
    assert sum(e.tokens for e in working.values()) <= PAGING_BUDGET
    memory = [r.memory_tokens for r in running.events.recent() if r.session_id == sid]
    assert any(memory) and max(memory) <= MEMORY_BUDGET


def test_the_tool_loops_rounds_stay_within_the_window(
    served: tuple[Served, MemoryEngine], fake_llm: FakeLLMServer
) -> None:
    """The proxy's own follow-up rounds (the model's memory tool calls and their results
    appended) are counted like the request: each result is cut to what the window leaves it,
    so no round passes the window (less the reply's reserve: half of it, no max_tokens sent),
    and the record's ``tokens_sent`` is the largest round's."""
    running, engine = served
    converse(running, fake_llm, "claude-opus-4-1")
    window = engine.config.context_window
    limit = window - reply_reserve("openai", {}, 4096, window)
    bodies = [r.body for r in fake_llm.requests if isinstance(r.body, dict)]
    rounds = [b for b in bodies if any(m.get("role") == "tool" for m in b["messages"])]
    assert rounds, "the model paged topics in"
    sizes = [tokens_sent(b, "openai", engine.counter) for b in bodies]
    assert max(sizes) <= limit, f"{max(sizes):,} tokens sent > {limit:,}"
    cut = [m["content"] for b in rounds for m in b["messages"] if m.get("role") == "tool"]
    assert any(c.endswith(CUT) for c in cut)
    looped = [r for r in running.events.recent() if r.extra.get("memory_tool_calls")]
    assert all(r.extra["window"]["tokens_sent"] <= limit for r in looped)


def test_a_tool_loop_round_over_the_window_is_logged_and_noted(
    served: tuple[Served, MemoryEngine],
    fake_llm: FakeLLMServer,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A round the request itself fills (a message near the window's size) cannot be cut to
    fit: it goes, with a warning and a note naming the round."""
    running, _ = served

    def model(body: dict[str, Any]) -> str | ModelTurn:
        if any(m.get("role") == "tool" for m in body["messages"]):
            return "Done."
        return ModelTurn("", (ToolCall("expand_topic", {"tag": "kiln", "depth": "full"}),))

    fake_llm.reply = model
    client = closed_after_test(
        openai.OpenAI(base_url=f"{running.url}/v1", api_key="sk-test", max_retries=0)
    )
    text = " ".join(TOPICS["kiln"].format(n=n) for n in range(60))  # ~1,500 tokens
    with caplog.at_level(logging.WARNING, logger="contextfold.server.proxy"):
        client.chat.completions.create(
            model="claude-opus-4-1", messages=[{"role": "user", "content": text}]
        )
        running.drain()
    (record,) = [r for r in running.events.recent() if r.kind != "compaction"]
    assert record.extra.get("memory_tool_calls")
    notes = [n for n in record.extra["notes"] if n.startswith("memory tool round 1 over")]
    assert notes, record.extra["notes"]
    assert any(n in r.getMessage() for n in notes for r in caplog.records)


def test_the_model_table_is_configurable(tmp_path: Path) -> None:
    paging = {"mode": "tools", "tiers": {"weak": ["acme-*"], "strong": ["big-*"]}}
    with make_engine(tmp_path, paging={**paging, "default_tier": "weak"}) as memory:
        assert memory.tier("ACME-small-2") == "weak" and memory.tier("big-model") == "strong"
        assert memory.tier("claude-opus-4-1") == "weak"  # the built-in table is replaced
        assert memory.tier(None) == "weak"
        names = [t["name"] for t in memory.tool_definitions("anthropic", model="acme-1")]
        assert names == ["expand_topic"]
        names = [t["name"] for t in memory.tool_definitions("anthropic", model="big-1")]
        assert names == ["expand_topic", "collapse_topic", "find_quote"]
