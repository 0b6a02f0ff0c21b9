"""Formatter behaviour: merging, where memory and retrieval go, Anthropic's cache breakpoint,
Gemini and OpenAI tool traffic, the cache-stable prefix, and the pinned cost model."""

from __future__ import annotations

import itertools
import json
from typing import Any

import pytest

from contextfold.formats import (
    AnthropicFormatter,
    BaseFormatter,
    GeminiFormatter,
    OpenAIFormatter,
    render_part,
)
from contextfold.items import (
    ContextItem,
    Message,
    SourceType,
    TextBlock,
    ToolResultBlock,
    ToolUseBlock,
)
from contextfold.pipeline import ContextPipeline
from contextfold.tokens import OVERHEADS, TiktokenCounter

CHAT = [OpenAIFormatter, AnthropicFormatter, GeminiFormatter]

SYSTEM = ContextItem(content="Answer from the policy.", source=SourceType.SYSTEM, pinned=True)
MEMORY = ContextItem(content="User prefers euros.", source=SourceType.MEMORY)
DOC = ContextItem(content="Taxis are reimbursed.", source=SourceType.RETRIEVAL)
QUERY = ContextItem(content="Can I expense Uber?", source=SourceType.USER, pinned=True)
USE = {"id": "c1", "name": "lookup"}


def _turn(role: Any, *blocks: Any) -> ContextItem:
    return ContextItem.from_message(Message(role=role, content=blocks))


def _roles(payload: dict[str, Any]) -> list[str]:
    return [m["role"] for m in payload.get("messages", payload.get("contents", []))]


def _system_text(payload: dict[str, Any]) -> str:
    """Everything that reaches the model as system instructions."""
    if "system_instruction" in payload:
        return json.dumps(payload["system_instruction"])
    if "system" in payload:
        return json.dumps(payload["system"])
    return json.dumps([m for m in payload["messages"] if m["role"] == "system"])


@pytest.mark.parametrize("formatter", CHAT)
def test_same_role_turns_are_merged_never_dropped(formatter: type[BaseFormatter]) -> None:
    history = [
        _turn("user", TextBlock(text="first question")),
        _turn("user", TextBlock(text="second question")),
        _turn("assistant", TextBlock(text="first answer")),
        _turn("assistant", TextBlock(text="second answer")),
    ]
    payload = formatter().format([SYSTEM, MEMORY, DOC, *history, QUERY])
    text = json.dumps(payload)
    for item in (SYSTEM, MEMORY, DOC, *history, QUERY):
        assert item.content in text
    roles = _roles(payload)
    assert all(a != b for a, b in itertools.pairwise(roles))
    assert roles[-2:] == ["assistant" if formatter is not GeminiFormatter else "model", "user"]


@pytest.mark.parametrize("memory_as_system", [False, True])
@pytest.mark.parametrize("formatter", CHAT)
def test_only_memory_as_system_puts_memory_in_system(
    formatter: type[BaseFormatter], memory_as_system: bool
) -> None:
    payload = formatter(memory_as_system=memory_as_system).format([SYSTEM, MEMORY, DOC, QUERY])
    system = _system_text(payload)
    assert SYSTEM.content in system
    assert (MEMORY.content in system) is memory_as_system
    assert DOC.content not in system
    assert DOC.content in json.dumps(payload.get("messages", payload.get("contents")))


MEMORY2 = ContextItem(content="Trip to Rome next week.", source=SourceType.MEMORY)


@pytest.mark.parametrize(
    ("items", "memory_as_system", "marked"),
    [
        ([SYSTEM, MEMORY, MEMORY2, DOC, QUERY], False, [("messages", render_part(MEMORY2))]),
        ([MEMORY, DOC, QUERY], False, [("messages", render_part(MEMORY))]),
        ([SYSTEM, DOC, QUERY], False, [("system", SYSTEM.content)]),
        ([SYSTEM, MEMORY, MEMORY2, DOC, QUERY], True, [("system", render_part(MEMORY2))]),
        ([DOC, QUERY], False, []),
    ],
)
def test_anthropic_cache_breakpoint_only_on_last_stable_block(
    items: list[ContextItem], memory_as_system: bool, marked: list[tuple[str, str]]
) -> None:
    payload = AnthropicFormatter(memory_as_system=memory_as_system).format(items)
    blocks = [("system", b) for b in payload.get("system", [])] + [
        ("messages", b) for m in payload["messages"] for b in m["content"]
    ]
    assert [(where, b["text"]) for where, b in blocks if "cache_control" in b] == marked
    assert json.dumps(payload).count("cache_control") == len(marked)


def test_gemini_payload_shape_and_response_names() -> None:
    call = ToolUseBlock(id="c1", name="lookup", input={"q": "uber"})
    history = [
        _turn("user", TextBlock(text="Check the policy.")),
        _turn("assistant", call),
        _turn("tool", ToolResultBlock(tool_use_id="c1", content="Taxis only.")),
    ]
    payload = GeminiFormatter().format([SYSTEM, *history, QUERY])
    assert payload["system_instruction"] == {"parts": [{"text": SYSTEM.content}]}
    assert _roles(payload) == ["user", "model", "user"]
    assert payload["contents"][1]["parts"] == [
        {"functionCall": {"id": "c1", "name": "lookup", "args": {"q": "uber"}}}
    ]
    assert payload["contents"][2]["parts"] == [
        {"functionResponse": {**USE, "response": {"content": "Taxis only."}}},
        {"text": QUERY.content},
    ]


def test_openai_tool_messages_one_per_result() -> None:
    calls = [ToolUseBlock(id=f"c{i}", name="lookup", input={"q": i}) for i in (1, 2)]
    results = [ToolResultBlock(tool_use_id=f"c{i}", content=f"r{i}") for i in (1, 2)]
    payload = OpenAIFormatter().format(
        [_turn("assistant", TextBlock(text="Two lookups."), *calls), _turn("tool", *results), QUERY]
    )
    assistant, *tools, query = payload["messages"]
    assert assistant["content"] == "Two lookups."
    assert [c["function"]["arguments"] for c in assistant["tool_calls"]] == ['{"q":1}', '{"q":2}']
    assert tools == [
        {"role": "tool", "tool_call_id": "c1", "content": "r1"},
        {"role": "tool", "tool_call_id": "c2", "content": "r2"},
    ]
    assert query == {"role": "user", "content": QUERY.content}


@pytest.mark.parametrize("formatter", CHAT)
def test_tool_item_cost_bounds_its_payload_tokens(
    formatter: type[BaseFormatter], o200k: TiktokenCounter
) -> None:
    calls = [ToolUseBlock(id=f"c{i}", name="lookup", input={"q": i}) for i in range(3)]
    results = [ToolResultBlock(tool_use_id=f"c{i}", content=f"r{i}") for i in range(3)]
    turns = [_turn("assistant", *calls), _turn("tool", *results)]
    fmt = formatter()
    items = [SYSTEM, *turns, QUERY]
    bound = fmt.base_cost(o200k) + sum(fmt.item_cost(i, o200k) for i in items)
    assert fmt.count_payload(fmt.format(items), o200k) <= bound


@pytest.mark.parametrize("formatter", CHAT)
def test_builds_differing_in_retrieval_share_the_stable_prefix(
    formatter: type[BaseFormatter],
) -> None:
    system = 'Answer from the "travel" policy.\nCite sections.'
    memory = ContextItem(content="Topics: travel, expenses — in €.", source=SourceType.MEMORY)

    def build(*docs: str) -> str:
        retrieved = [ContextItem(content=d, source=SourceType.RETRIEVAL) for d in docs]
        pipeline = ContextPipeline(max_tokens=4000, formatter=formatter())
        result = pipeline.add_system_prompt(system).add_items([memory, *retrieved]).build("Uber?")
        return json.dumps(result.formatted_output)

    first, second = build("Taxis are reimbursed."), build("Rideshare needs a receipt.", "Max 50€.")
    common = next(i for i, (a, b) in enumerate(zip(first, second, strict=False)) if a != b)
    for stable in (system, memory.content):
        escaped = json.dumps(stable)[1:-1]
        assert first.index(escaped) + len(escaped) <= common
    assert "Taxis" not in first[:common]
    if formatter is AnthropicFormatter:  # the breakpoint closes the stable prefix
        assert first.count("cache_control") == 1
        assert "cache_control" in first[:common]


ARGS = '{"q":"x"}'
COUNT_CASES = [
    (
        OpenAIFormatter(),
        {
            "messages": [
                {"role": "system", "content": "Be brief."},
                {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [
                        {
                            "id": "c1",
                            "type": "function",
                            "function": {"name": "lookup", "arguments": ARGS},
                        }
                    ],
                },
                {"role": "tool", "tool_call_id": "c1", "content": "42"},
            ]
        },
    ),
    (
        AnthropicFormatter(),
        {
            "system": [{"type": "text", "text": "Be brief."}],
            "messages": [
                {
                    "role": "assistant",
                    "content": [{"type": "tool_use", **USE, "input": {"q": "x"}}],
                },
                {
                    "role": "user",
                    "content": [{"type": "tool_result", "tool_use_id": "c1", "content": "42"}],
                },
            ],
        },
    ),
    (
        GeminiFormatter(),
        {
            "system_instruction": {"parts": [{"text": "Be brief."}]},
            "contents": [
                {"role": "model", "parts": [{"functionCall": {**USE, "args": {"q": "x"}}}]},
                {
                    "role": "user",
                    "parts": [{"functionResponse": {**USE, "response": {"error": "42"}}}],
                },
            ],
        },
    ),
]


@pytest.mark.parametrize(("fmt", "payload"), COUNT_CASES, ids=["openai", "anthropic", "gemini"])
def test_count_payload_matches_hand_computation(
    fmt: BaseFormatter, payload: dict[str, Any], o200k: TiktokenCounter
) -> None:
    """Three messages: system text, one tool call, one tool result."""
    c, oh = o200k.count, OVERHEADS[fmt.name]
    if fmt.name == "openai":  # the cookbook: every value, the role and tool_call_id included
        text = c("system") + c("Be brief.")
        call = c("assistant") + c("c1") + c("function") + c("lookup") + c(ARGS) + oh.per_part
        result = c("tool") + c("c1") + c("42")
    else:
        text = c("Be brief.") + oh.per_part
        call = c("lookup") + c(ARGS) + 2 * oh.per_part
        result = c("42") + oh.per_part
    expected = oh.per_request + 3 * oh.per_message + text + call + result
    assert fmt.count_payload(payload, o200k) == expected
