"""Parsing provider payloads into ``Message`` values: round trips through the formatters' own
message renderers, real-looking payloads of each provider, and every ``FormatError`` case."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from contextfold.errors import FormatError
from contextfold.formats import (
    parse_anthropic_messages,
    parse_gemini_contents,
    parse_openai_messages,
)
from contextfold.formats.anthropic import message_to_anthropic
from contextfold.formats.gemini import message_to_gemini
from contextfold.formats.openai import message_to_openai
from contextfold.items import Message, TextBlock, ToolResultBlock, ToolUseBlock

# --------------------------------------------------------------------------- round trips

WEATHER = (
    Message(role="user", content="Weather in Paris and Rome?", name="ana"),
    Message(
        role="assistant",
        content=(
            TextBlock(text="Checking both."),
            ToolUseBlock(id="c1", name="weather", input={"city": "Paris", "units": ["C"]}),
            ToolUseBlock(id="c2", name="weather", input={"city": "Rome"}),
        ),
    ),
    Message(
        role="tool",
        content=(
            ToolResultBlock(tool_use_id="c1", content='{"temp": 18}'),
            ToolResultBlock(tool_use_id="c2", content="upstream timeout", is_error=True),
        ),
    ),
    Message(role="assistant", content="Paris is 18 °C; Rome timed out."),
)
CONVERSATIONS = {
    "text": (Message(role="user", content="Hi"), Message(role="assistant", content="Hello!")),
    "tool calls": WEATHER,
    "call without text": (
        Message(role="user", content="Ping"),
        Message(role="assistant", content=(ToolUseBlock(id="p", name="ping"),)),
        Message(role="tool", content=(ToolResultBlock(tool_use_id="p", content="pong"),)),
    ),
}


def _via_openai(messages: tuple[Message, ...]) -> list[Message]:
    return parse_openai_messages([d for m in messages for d in message_to_openai(m)])


def _via_anthropic(messages: tuple[Message, ...]) -> list[Message]:
    return parse_anthropic_messages([message_to_anthropic(m) for m in messages])


def _via_gemini(messages: tuple[Message, ...]) -> list[Message]:
    names: dict[str, str] = {}
    return parse_gemini_contents([message_to_gemini(m, names) for m in messages])


def _normalised(fmt: str, messages: tuple[Message, ...]) -> list[Message]:
    """What each format keeps: OpenAI has no is_error, Anthropic and Gemini no message names,
    Gemini names every result after its call."""
    calls = {b.id: b.name for m in messages for b in m.content if isinstance(b, ToolUseBlock)}
    out = []
    for m in messages:
        blocks = []
        for b in m.content:
            if isinstance(b, ToolResultBlock) and fmt == "openai":
                b = b.model_copy(update={"is_error": False})
            if isinstance(b, ToolResultBlock) and fmt == "gemini":
                b = b.model_copy(update={"name": calls[b.tool_use_id]})
            blocks.append(b)
        name = m.name if fmt == "openai" else None
        out.append(m.model_copy(update={"content": tuple(blocks), "name": name}))
    return out


@pytest.mark.parametrize("case", CONVERSATIONS)
@pytest.mark.parametrize(
    ("fmt", "round_trip"),
    [("openai", _via_openai), ("anthropic", _via_anthropic), ("gemini", _via_gemini)],
)
def test_round_trip(
    fmt: str, round_trip: Callable[[tuple[Message, ...]], list[Message]], case: str
) -> None:
    messages = CONVERSATIONS[case]
    assert round_trip(messages) == _normalised(fmt, messages)


def test_openai_round_trip_joins_text_blocks_before_tool_calls() -> None:
    message = Message(
        role="assistant",
        content=(TextBlock(text="a"), ToolUseBlock(id="x", name="f"), TextBlock(text="b")),
    )
    expected = Message(
        role="assistant", content=(TextBlock(text="a\nb"), ToolUseBlock(id="x", name="f"))
    )
    assert _via_openai((message,)) == [expected]


# --------------------------------------------------------------------------- real payloads


def test_parse_openai_tool_conversation() -> None:
    payload: list[dict[str, Any]] = [
        {"role": "developer", "content": "Use tools."},
        {"role": "user", "content": [{"type": "text", "text": "Weather in"}, {"type": "text", "text": "Paris?"}], "name": "ana"},  # noqa: E501
        {"role": "assistant", "content": "", "refusal": None, "tool_calls": [
            {"id": "call_A", "type": "function", "function": {"name": "weather", "arguments": '{"city": "Paris"}'}},  # noqa: E501
            {"id": "call_B", "type": "function", "function": {"name": "clock", "arguments": ""}},
        ]},
        {"role": "tool", "tool_call_id": "call_A", "content": "18C"},
        {"role": "tool", "tool_call_id": "call_B", "content": [{"type": "text", "text": "09:00"}]},
        {"role": "assistant", "content": None, "tool_calls": []},
    ]  # fmt: skip
    assert parse_openai_messages(payload) == [
        Message(role="system", content="Use tools."),
        Message(role="user", content=(TextBlock(text="Weather in"), TextBlock(text="Paris?")), name="ana"),  # noqa: E501
        Message(role="assistant", content=(
            ToolUseBlock(id="call_A", name="weather", input={"city": "Paris"}),
            ToolUseBlock(id="call_B", name="clock"),
        )),
        Message(role="tool", content=(
            ToolResultBlock(tool_use_id="call_A", content="18C"),
            ToolResultBlock(tool_use_id="call_B", content="09:00"),
        )),
        Message(role="assistant", content=()),
    ]  # fmt: skip


def test_parse_anthropic_tool_conversation() -> None:
    system = [{"type": "text", "text": "Be brief.", "cache_control": {"type": "ephemeral"}}]
    payload: list[dict[str, Any]] = [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": [
            {"type": "text", "text": "Checking."},
            {"type": "tool_use", "id": "toolu_1", "name": "weather", "input": {"city": "Paris"}},
        ]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "toolu_1", "content": [
                {"type": "text", "text": "18C"}, {"type": "text", "text": "sunny"}]},
            {"type": "tool_result", "tool_use_id": "toolu_2", "is_error": True},
            {"type": "text", "text": "Thanks!"},
        ]},
    ]  # fmt: skip
    assert parse_anthropic_messages(payload, system=system) == [
        Message(role="system", content="Be brief."),
        Message(role="user", content="Weather in Paris?"),
        Message(role="assistant", content=(
            TextBlock(text="Checking."),
            ToolUseBlock(id="toolu_1", name="weather", input={"city": "Paris"}),
        )),
        Message(role="tool", content=(
            ToolResultBlock(tool_use_id="toolu_1", content="18C\nsunny"),
            ToolResultBlock(tool_use_id="toolu_2", content="", is_error=True),
        )),
        Message(role="user", content="Thanks!"),
    ]  # fmt: skip


def test_parse_gemini_matches_responses_to_calls_by_name() -> None:
    contents: list[dict[str, Any]] = [
        {"parts": [{"text": "Weather in Paris and Rome?"}]},
        {"role": "model", "parts": [
            {"functionCall": {"name": "weather", "args": {"city": "Paris"}}, "thoughtSignature": "x"},  # noqa: E501
            {"function_call": {"name": "weather", "args": {"city": "Rome"}}},
        ]},
        {"role": "user", "parts": [
            {"functionResponse": {"name": "weather", "response": {"content": "18C"}}},
            {"functionResponse": {"name": "weather", "response": {"temp": 21, "sky": "clear"}}},
            {"text": "And tomorrow?"},
        ]},
        {"role": "model", "parts": [{"functionCall": {"id": "fc9", "name": "forecast"}}]},
        {"role": "function", "parts": [
            {"functionResponse": {"id": "fc9", "name": "forecast", "response": {"error": "quota"}}}]},  # noqa: E501
    ]  # fmt: skip
    system = {"parts": [{"text": "Be brief."}]}
    assert parse_gemini_contents(contents, system_instruction=system) == [
        Message(role="system", content="Be brief."),
        Message(role="user", content="Weather in Paris and Rome?"),
        Message(role="assistant", content=(
            ToolUseBlock(id="call_1_0", name="weather", input={"city": "Paris"}),
            ToolUseBlock(id="call_1_1", name="weather", input={"city": "Rome"}),
        )),
        Message(role="tool", content=(
            ToolResultBlock(tool_use_id="call_1_0", content="18C", name="weather"),
            ToolResultBlock(tool_use_id="call_1_1", content='{"sky":"clear","temp":21}', name="weather"),  # noqa: E501
        )),
        Message(role="user", content="And tomorrow?"),
        Message(role="assistant", content=(ToolUseBlock(id="fc9", name="forecast"),)),
        Message(role="tool", content=(
            ToolResultBlock(tool_use_id="fc9", content="quota", name="forecast", is_error=True),
        )),
    ]  # fmt: skip


# --------------------------------------------------------------------------- errors

_CALL = {"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}}


def _openai(*messages: Any) -> Callable[[], object]:
    return lambda: parse_openai_messages(list(messages))


def _anthropic(*messages: Any, system: Any = None) -> Callable[[], object]:
    return lambda: parse_anthropic_messages(list(messages), system=system)


def _gemini(*contents: Any, system: Any = None) -> Callable[[], object]:
    return lambda: parse_gemini_contents(list(contents), system_instruction=system)


def _call(name: str = "f") -> dict[str, Any]:
    return {"role": "model", "parts": [{"functionCall": {"name": name}}]}


ERRORS: list[tuple[Callable[[], object], str]] = [
    (lambda: parse_openai_messages({"role": "user"}), "messages is an object; expected an array"),  # type: ignore[arg-type]
    (_openai("hi"), "messages[0] is a string; expected an object"),
    (_openai({"role": "robot", "content": "x"}), "messages[0].role 'robot' is unknown"),
    (_openai({"role": "function", "content": "x"}), "legacy function role is not supported yet"),
    (_openai({"content": "x"}), "messages[0].role is null"),
    (_openai({"role": "user", "content": 3}), "messages[0].content is a number; expected a string"),
    (_openai({"role": "user"}), "messages[0].content is missing or null"),
    (_openai({"role": "user", "content": [{"type": "image_url", "image_url": {}}]}),
     "messages[0].content[0] has type 'image_url', which is not supported yet"),
    (_openai({"role": "user", "content": [{"type": "text", "text": 1}]}),
     "messages[0].content[0].text is a number; expected a string"),
    (_openai({"role": "user", "content": "x", "name": 7}), "messages[0].name is a number"),
    (_openai({"role": "user", "content": "x", "tool_calls": [_CALL]}),
     "messages[0].tool_calls appears in a 'user' message"),
    (_openai({"role": "assistant", "function_call": {"name": "f"}}),
     "messages[0].function_call (the legacy form) is not supported yet"),
    (_openai({"role": "assistant", "tool_calls": [{**_CALL, "type": "custom"}]}),
     "messages[0].tool_calls[0].type is 'custom'; only 'function' tool calls are supported yet"),
    (_openai({"role": "assistant", "tool_calls": [{**_CALL, "function": {"name": "f", "arguments": "{oops"}}]}),  # noqa: E501
     "messages[0].tool_calls[0].function.arguments is not valid JSON: Expecting property name"),
    (_openai({"role": "assistant", "tool_calls": [{**_CALL, "function": {"name": "f", "arguments": "[1]"}}]}),  # noqa: E501
     "messages[0].tool_calls[0].function.arguments is an array; expected a JSON object"),
    (_openai({"role": "assistant", "tool_calls": [{"function": {"name": "f"}}]}),
     "messages[0].tool_calls[0].id is null; expected a string"),
    (_openai({"role": "tool", "content": "x"}), "messages[0].tool_call_id is null"),
    (_openai({"role": "tool", "tool_call_id": "c", "content": {"a": 1}}),
     "messages[0].content is an object; a tool message needs a string"),
    (_anthropic({"role": "system", "content": "x"}),
     "messages[0].role 'system' is unknown; expected 'user' or 'assistant'; put system text in"),
    (_anthropic({"role": "user", "content": None}), "messages[0].content is null; expected an array"),  # noqa: E501
    (_anthropic(system=5), "system is a number; expected a string or an array of text blocks"),
    (_anthropic(system=[{"type": "image"}]), "system[0] has type 'image', which is not supported yet"),  # noqa: E501
    (_anthropic({"role": "user", "content": [{"type": "image", "source": {}}]}),
     "messages[0].content[0] has type 'image', which is not supported yet"),
    (_anthropic({"role": "user", "content": [{"text": "x"}]}), "messages[0].content[0].type is null"),  # noqa: E501
    (_anthropic({"role": "user", "content": [{"type": "tool_use", "id": "t", "name": "f"}]}),
     "messages[0].content[0] is a tool_use block in a user message"),
    (_anthropic({"role": "assistant", "content": [{"type": "tool_result", "tool_use_id": "t"}]}),
     "messages[0].content[0] is a tool_result block in an assistant message"),
    (_anthropic({"role": "assistant", "content": [{"type": "tool_use", "id": "t", "name": "f", "input": []}]}),  # noqa: E501
     "messages[0].content[0].input is an array; expected an object"),
    (_anthropic({"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t", "content": 1}]}),  # noqa: E501
     "messages[0].content[0].content is a number; expected a string or an array of text blocks"),
    (_anthropic({"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t", "content": [{"type": "image"}]}]}),  # noqa: E501
     "messages[0].content[0].content[0] has type 'image', which is not supported yet"),
    (_anthropic({"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t", "is_error": "yes"}]}),  # noqa: E501
     "messages[0].content[0].is_error is a string; expected a boolean"),
    (_gemini({"role": "system", "parts": []}), "contents[0].role 'system' is unknown"),
    (_gemini({"role": ["user"], "parts": []}), "contents[0].role is an array; expected one of"),
    (_anthropic({"content": "x"}), "messages[0].role is null; expected 'user' or 'assistant'"),
    (_gemini({"role": "user"}), "contents[0].parts is null; expected an array"),
    (_gemini(_call(), {"parts": [{"function_response": {"name": "f", "response": {}, "id": 3}}]}),
     "contents[1].parts[0].function_response.id is a number; expected a string"),
    (_gemini({"parts": [{"inlineData": {"mimeType": "image/png", "data": ""}}]}),
     "contents[0].parts[0] has 'inlineData', which is not supported yet"),
    (_gemini({"parts": [{"text": "a", "functionCall": {"name": "f"}}]}),
     "contents[0].parts[0] has both 'text' and 'functionCall'"),
    (_gemini({"parts": [{}]}), "contents[0].parts[0] is empty"),
    (_gemini({"parts": [{"text": "t", "thought": True}]}), "contents[0].parts[0] is a thought summary"),  # noqa: E501
    (_gemini({"parts": [{"functionCall": {"name": "f"}}]}),
     "contents[0].parts[0] is a functionCall in a user turn"),
    (_gemini({"role": "model", "parts": [{"functionResponse": {"name": "f", "response": {}}}]}),
     "contents[0].parts[0] is a functionResponse in a model turn"),
    (_gemini({"role": "model", "parts": [{"functionCall": {"name": "f", "args": "x=1"}}]}),
     "contents[0].parts[0].functionCall.args is a string; expected an object"),
    (_gemini(_call("g"), {"parts": [{"functionResponse": {"name": "f", "response": {}}}]}),
     "contents[1].parts[0].functionResponse has no id and answers no earlier unanswered functionCall named 'f'"),  # noqa: E501
    (_gemini(_call(), {"parts": [{"functionResponse": {"name": "f", "response": "ok"}}]}),
     "contents[1].parts[0].functionResponse.response is a string; expected an object"),
    (_gemini(_call(), {"role": "function", "parts": [{"text": "x"}]}),
     "contents[1].parts mixes text into a function turn"),
    (_gemini(system={"parts": [{"functionCall": {"name": "f"}}]}),
     "system_instruction.parts[0] is not a text part"),
]  # fmt: skip


@pytest.mark.parametrize(("parse", "message"), ERRORS)
def test_malformed_payload_names_path_and_problem(
    parse: Callable[[], object], message: str
) -> None:
    with pytest.raises(FormatError) as info:
        parse()
    assert message in str(info.value)


def test_second_response_without_id_fails_when_its_call_is_answered() -> None:
    response = {"functionResponse": {"name": "f", "response": {}}}
    with pytest.raises(FormatError, match=r"contents\[1\]\.parts\[1\]\.functionResponse has no"):
        parse_gemini_contents([_call(), {"parts": [response, response]}])
