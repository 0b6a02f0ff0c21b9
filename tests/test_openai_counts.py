"""OpenAI chat counts conform to the cookbook's published formula.

The reference below is written from the formula in OpenAI's cookbook ("How to count tokens with
tiktoken", ``num_tokens_from_messages``), not from contextfold's code: ``tokens_per_message =
3``; every value of a message is encoded, the role included; ``tokens_per_name = 1`` more for a
``name``; 3 more per request to prime the reply. The cookbook defines string values only: what
it leaves out (content parts, tool calls, images, tool definitions) is estimated as
docs/concepts.md describes, and checked here against that description separately.
"""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from contextfold.formats import OpenAIFormatter
from contextfold.formats.openai import IMAGE_TOKENS
from contextfold.tokens import TiktokenCounter, load_encoding

ENCODING = "o200k_base"
COUNTER = TiktokenCounter(ENCODING)
FORMATTER = OpenAIFormatter()
#: Conformance payloads per run, whatever the hypothesis profile (the CI profile runs more).
PAYLOADS = max(500, settings.default.max_examples)


def cookbook_tokens(messages: list[dict[str, Any]]) -> int:
    """``num_tokens_from_messages`` from the cookbook, over the string values it defines."""
    encoding = load_encoding(ENCODING)
    tokens_per_message, tokens_per_name = 3, 1
    num_tokens = 0
    for message in messages:
        num_tokens += tokens_per_message
        for key, value in message.items():
            if not isinstance(value, str):
                continue  # not defined by the cookbook: estimated, checked below
            num_tokens += len(encoding.encode(value))
            if key == "name":
                num_tokens += tokens_per_name
    num_tokens += 3  # every reply is primed with <|start|>assistant<|message|>
    return num_tokens


def documented_estimate(messages: list[dict[str, Any]]) -> int:
    """What docs/concepts.md says the non-cookbook values cost."""
    encoding = load_encoding(ENCODING)

    def n(text: str) -> int:
        return len(encoding.encode(text))

    total = 0
    for message in messages:
        content = message.get("content")
        if isinstance(content, list):
            for part in content:
                if part["type"] == "text":
                    total += n(part["text"])
                else:
                    total += IMAGE_TOKENS[part["image_url"].get("detail", "auto")]
            total += len(content) - 1  # 1 per part after the first
        for call in message.get("tool_calls", ()):
            function = call["function"]
            total += n(call["id"]) + n(call["type"]) + n(function["name"])
            total += n(function["arguments"]) + 1
    return total


# Text without special-token strings (the cookbook's ``encode`` refuses them).
_TEXT = st.text(alphabet=st.characters(blacklist_categories=["Cs"]), max_size=40).filter(
    lambda t: "<|" not in t
)
_WORDS = st.sampled_from(["hello", " world", "数据", "🙂", "\n\n", "42", "naïve", "  ", "<", "|"])
texts = st.one_of(_TEXT, st.lists(_WORDS, max_size=12).map("".join))
names = st.from_regex(r"[A-Za-z0-9_-]{1,16}", fullmatch=True)
ids = st.from_regex(r"call_[A-Za-z0-9]{1,24}", fullmatch=True)


@st.composite
def content_parts(draw: st.DrawFn) -> list[dict[str, Any]]:
    text_part = texts.map(lambda t: {"type": "text", "text": t})
    image_part = st.sampled_from([None, "low", "high", "auto"]).map(
        lambda d: {
            "type": "image_url",
            "image_url": {"url": "https://example.invalid/x.png"} | ({"detail": d} if d else {}),
        }
    )
    return draw(st.lists(st.one_of(text_part, image_part), min_size=1, max_size=4))


@st.composite
def tool_calls(draw: st.DrawFn) -> list[dict[str, Any]]:
    calls = []
    for _ in range(draw(st.integers(1, 3))):
        arguments = draw(st.dictionaries(names, st.one_of(texts, st.integers()), max_size=3))
        calls.append(
            {
                "id": draw(ids),
                "type": "function",
                "function": {
                    "name": draw(names),
                    "arguments": json.dumps(arguments, ensure_ascii=draw(st.booleans())),
                },
            }
        )
    return calls


@st.composite
def messages(draw: st.DrawFn, *, cookbook_only: bool) -> dict[str, Any]:
    role = draw(st.sampled_from(["system", "developer", "user", "assistant", "tool"]))
    message: dict[str, Any] = {"role": role}
    if role == "tool":
        message["tool_call_id"] = draw(ids)
        message["content"] = draw(texts)
        return message
    if not cookbook_only and role == "user" and draw(st.booleans()):
        message["content"] = draw(content_parts())
    elif not cookbook_only and role == "assistant" and draw(st.booleans()):
        message["content"] = draw(st.one_of(st.none(), texts))
        message["tool_calls"] = draw(tool_calls())
    else:
        message["content"] = draw(texts)
    if "tool_calls" not in message and draw(st.booleans()):
        message["name"] = draw(names)
    return message


@settings(max_examples=PAYLOADS)
@given(payload=st.lists(messages(cookbook_only=True), min_size=1, max_size=8))
def test_string_valued_messages_count_exactly_as_the_cookbook(
    payload: list[dict[str, Any]],
) -> None:
    assert FORMATTER.count_payload({"messages": payload}, COUNTER) == cookbook_tokens(payload)


@settings(max_examples=PAYLOADS)
@given(payload=st.lists(messages(cookbook_only=False), min_size=1, max_size=8))
def test_every_payload_is_the_cookbook_count_plus_the_documented_estimate(
    payload: list[dict[str, Any]],
) -> None:
    """Roles, names, tool calls and multi-part content: the cookbook's parts are exact, the
    rest adds exactly what the docs say."""
    expected = cookbook_tokens(payload) + documented_estimate(payload)
    assert FORMATTER.count_payload({"messages": payload}, COUNTER) == expected


def test_each_message_costs_its_role_and_name() -> None:
    """The defect: the role's token was not counted, nor a name, nor a tool_call_id."""
    c = COUNTER.count
    plain = {"messages": [{"role": "user", "content": "Hello"}]}
    assert FORMATTER.count_payload(plain, COUNTER) == 3 + 3 + c("user") + c("Hello")
    named = {"messages": [{"role": "user", "content": "", "name": "bob"}]}
    assert FORMATTER.count_payload(named, COUNTER) == 3 + 3 + c("user") + c("bob") + 1
    tool = {"messages": [{"role": "tool", "tool_call_id": "call_abc123", "content": "ok"}]}
    assert FORMATTER.count_payload(tool, COUNTER) == 3 + 3 + c("tool") + c("call_abc123") + 1


def test_tool_definitions_are_estimated_as_their_compact_json() -> None:
    tools = [{"type": "function", "function": {"name": "search", "parameters": {}}}]
    base = {"messages": [{"role": "user", "content": "hi"}]}
    extra = COUNTER.count(json.dumps(tools[0], separators=(",", ":")))
    with_tools = FORMATTER.count_payload({**base, "tools": tools}, COUNTER)
    assert with_tools == FORMATTER.count_payload(base, COUNTER) + extra
