"""The proxy never breaks the client: markers are off by default, and opted in
(``proxy.markers: true``, the ``proxy`` fixture here) no session marker goes into a reply whose
text must stay as the model wrote it (JSON mode, structured outputs, forced tool calls, Gemini
JSON), none into a reply with tool calls, none at all with ``proxy.markers: false``; and a
body nested too deeply is a clear 400, not a 500. The real app under uvicorn, the fake provider
behind it, the real ``openai`` and ``anthropic`` SDKs (Gemini over plain httpx)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import pytest
from pydantic import BaseModel

from contextfold.memory.config import MemoryConfig
from contextfold.memory.engine import MemoryEngine
from contextfold.server.config import ProxySettings, ServerConfig
from contextfold.server.proxy.markers import withheld
from contextfold.server.proxy.session import SESSION_HEADER, make_token, marker_text
from contextfold.server.proxy.stream import SseSplitter, reply_of, stream_state, synthesize
from fake_llm import FakeLLMServer, ModelTurn, ToolCall
from proxy_support import Served, closed_after_test, serve

MARK = "contextfold:session="
WEATHER: Any = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}


def _serve(fake: FakeLLMServer, engine: MemoryEngine, **proxy: Any) -> Any:
    return serve(ServerConfig(port=0, proxy=ProxySettings(upstream=fake.url, **proxy)), engine)


@pytest.fixture
def proxy(fake_llm: FakeLLMServer, engine: MemoryEngine) -> Iterator[Served]:
    with _serve(fake_llm, engine, markers=True) as served:
        yield served


def oa(served: Served) -> openai.OpenAI:
    return closed_after_test(
        openai.OpenAI(base_url=f"{served.url}/v1", api_key="sk-test", max_retries=0)
    )


def an(served: Served) -> anthropic.Anthropic:
    return closed_after_test(
        anthropic.Anthropic(base_url=served.url, api_key="sk-ant-test", max_retries=0)
    )


def ask(text: str) -> Any:
    return [{"role": "user", "content": text}]


def _streamed_text(chunks: Any) -> str:
    return "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)


# --------------------------------------------------------------------------- OpenAI JSON


@pytest.mark.parametrize(
    "response_format",
    [
        {"type": "json_object"},
        {"type": "json_schema", "json_schema": {"name": "city", "schema": {"type": "object"}}},
    ],
)
@pytest.mark.parametrize("stream", [False, True])
def test_a_json_mode_reply_stays_json(
    proxy: Served, fake_llm: FakeLLMServer, response_format: Any, stream: bool
) -> None:
    fake_llm.reply = '{"city": "Paris", "country": "France"}'
    client = oa(proxy)
    if stream:
        text = _streamed_text(
            client.chat.completions.create(
                model="m", messages=ask("Capital?"), response_format=response_format, stream=True
            )
        )
    else:
        raw = client.chat.completions.with_raw_response.create(
            model="m", messages=ask("Capital?"), response_format=response_format
        )
        assert raw.headers[SESSION_HEADER]  # the session goes on by the header
        text = raw.parse().choices[0].message.content or ""
    assert json.loads(text) == {"city": "Paris", "country": "France"}


class City(BaseModel):
    name: str
    population: int


def test_structured_parse_returns_the_parsed_object(proxy: Served, fake_llm: FakeLLMServer) -> None:
    fake_llm.reply = '{"name": "Paris", "population": 2100000}'
    completion = oa(proxy).chat.completions.parse(
        model="m", messages=ask("Biggest city in France?"), response_format=City
    )
    assert completion.choices[0].message.parsed == City(name="Paris", population=2_100_000)
    assert fake_llm.requests[-1].body["response_format"]["type"] == "json_schema"
    proxy.drain()  # the record says why the reply has no marker
    assert "response_format json_schema" in proxy.events.recent()[-1].extra["notes"][-1]


def test_structured_stream_returns_the_parsed_object(
    proxy: Served, fake_llm: FakeLLMServer
) -> None:
    fake_llm.reply = '{"name": "Lyon", "population": 520000}'
    with oa(proxy).chat.completions.stream(
        model="m", messages=ask("Third city in France?"), response_format=City
    ) as events:
        completion = events.get_final_completion()
    assert completion.choices[0].message.parsed == City(name="Lyon", population=520_000)


# --------------------------------------------------------------------------- OpenAI tools


def _weather_then_answer(body: dict[str, Any]) -> ModelTurn:
    results = [m for m in body["messages"] if m.get("role") == "tool"]
    if not results:
        return ModelTurn("", (ToolCall("get_weather", {"city": "Oslo"}, "call_1"),))
    return ModelTurn(f"It is {json.loads(results[-1]['content'])['celsius']} °C in Oslo.")


def test_a_tool_call_round_trip(proxy: Served, fake_llm: FakeLLMServer) -> None:
    fake_llm.reply = _weather_then_answer
    client = oa(proxy)
    messages: Any = ask("Weather in Oslo?")
    message = client.chat.completions.create(model="m", messages=messages, tools=[WEATHER])
    message = message.choices[0].message
    assert message.content is None  # a tool-call-only reply stays one
    (call,) = message.tool_calls or []
    messages += [message.model_dump(exclude_none=True)]
    messages += [{"role": "tool", "tool_call_id": call.id, "content": '{"celsius": 12}'}]
    answer = client.chat.completions.create(model="m", messages=messages, tools=[WEATHER])
    text = answer.choices[0].message.content or ""
    assert text.startswith("It is 12 °C in Oslo.") and MARK in text  # text still gets one
    assert fake_llm.requests[-1].body["messages"][1]["tool_calls"][0]["id"] == "call_1"


def test_a_streamed_tool_call_round_trip(proxy: Served, fake_llm: FakeLLMServer) -> None:
    fake_llm.reply = _weather_then_answer
    client = oa(proxy)
    messages: Any = ask("Weather in Oslo?")
    chunks = list(
        client.chat.completions.create(model="m", messages=messages, tools=[WEATHER], stream=True)
    )
    assert _streamed_text(chunks) == ""  # no marker content delta
    with client.chat.completions.stream(model="m", messages=messages, tools=[WEATHER]) as events:
        message = events.get_final_completion().choices[0].message
    assert not message.content and message.tool_calls
    call = message.tool_calls[0]
    messages += [{"role": "assistant", "content": None, "tool_calls": [call.model_dump()]}]
    messages += [{"role": "tool", "tool_call_id": call.id, "content": '{"celsius": 9}'}]
    text = _streamed_text(
        client.chat.completions.create(model="m", messages=messages, tools=[WEATHER], stream=True)
    )
    assert text.startswith("It is 9 °C in Oslo.") and MARK in text


@pytest.fixture
def tools_proxy(fake_llm: FakeLLMServer, tmp_path: Path) -> Iterator[Served]:
    config = MemoryConfig.model_validate({"paging": {"mode": "tools"}})
    with (
        MemoryEngine(config, store=tmp_path / "tools.db", embedder=None) as memory,
        _serve(fake_llm, memory) as served,
    ):
        yield served


@pytest.mark.parametrize("stream", [False, True])
def test_the_in_proxy_tool_loop_marks_neither_json_nor_tool_calls(
    tools_proxy: Served, fake_llm: FakeLLMServer, stream: bool
) -> None:
    with oa(tools_proxy) as client:
        fake_llm.reply = '{"ok": true}'
        chunks = client.chat.completions.create(
            model="m", messages=ask("JSON?"), response_format={"type": "json_object"}, stream=stream
        )
        text = _streamed_text(chunks) if stream else chunks.choices[0].message.content  # type: ignore[union-attr]
        assert json.loads(text or "") == {"ok": True}
        fake_llm.reply = ModelTurn("", (ToolCall("get_weather", {"city": "Oslo"}, "call_1"),))
        reply = client.chat.completions.create(model="m", messages=ask("Oslo?"), tools=[WEATHER])
        assert reply.choices[0].message.content is None and reply.choices[0].message.tool_calls


# --------------------------------------------------------------------------- Anthropic


@pytest.mark.parametrize("stream", [False, True])
def test_an_anthropic_tool_use_only_reply_gets_no_text_block(
    proxy: Served, fake_llm: FakeLLMServer, stream: bool
) -> None:
    fake_llm.reply = ModelTurn("", (ToolCall("get_weather", {"city": "Oslo"}),))
    tool: Any = {"name": "get_weather", "input_schema": {"type": "object"}}
    request: Any = {
        "model": "claude-x",
        "max_tokens": 64,
        "tools": [tool],
        "messages": ask("Weather in Oslo?"),
    }
    if stream:
        with an(proxy).messages.stream(**request) as events:
            message = events.get_final_message()
    else:
        message = an(proxy).messages.create(**request)
    assert [block.type for block in message.content] == ["tool_use"]


def test_a_forced_anthropic_tool_choice_gets_no_marker(
    proxy: Served, fake_llm: FakeLLMServer
) -> None:
    fake_llm.reply = ModelTurn("Here it is.", (ToolCall("record", {"name": "Paris"}),))
    message = an(proxy).messages.create(
        model="claude-x",
        max_tokens=64,
        tools=[{"name": "record", "input_schema": {"type": "object"}}],
        tool_choice={"type": "tool", "name": "record"},
        messages=ask("Extract the city."),
    )
    assert [(b.type, getattr(b, "text", None)) for b in message.content] == [
        ("text", "Here it is."),
        ("tool_use", None),
    ]


def test_an_anthropic_structured_parse_returns_the_parsed_object(
    proxy: Served, fake_llm: FakeLLMServer
) -> None:
    fake_llm.reply = '{"name": "Marseille", "population": 870000}'
    message = an(proxy).messages.parse(
        model="claude-x", max_tokens=64, messages=ask("Second city?"), output_format=City
    )
    assert message.parsed_output == City(name="Marseille", population=870_000)
    assert fake_llm.requests[-1].body["output_config"]["format"]["type"] == "json_schema"


# --------------------------------------------------------------------------- Gemini


def _gemini(served: Served, method: str, config: dict[str, Any] | None = None) -> list[Any]:
    body: dict[str, Any] = {"contents": [{"role": "user", "parts": [{"text": "City?"}]}]}
    if config is not None:
        body["generationConfig"] = config
    response = httpx.post(f"{served.url}/v1beta/models/gemini-x:{method}", json=body)
    assert response.status_code == 200
    if method.startswith("stream"):
        events = [json.loads(line[6:]) for line in response.text.splitlines() if line]
        return [p for e in events for p in e["candidates"][0]["content"]["parts"]]
    return list(response.json()["candidates"][0]["content"]["parts"])


GEMINI_METHODS = ["generateContent", "streamGenerateContent?alt=sse"]


@pytest.mark.parametrize(
    "config",
    [
        {"responseMimeType": "application/json"},
        {"responseMimeType": "application/json", "responseSchema": {"type": "OBJECT"}},
    ],
)
@pytest.mark.parametrize("method", GEMINI_METHODS)
def test_a_gemini_json_reply_stays_json(
    proxy: Served, fake_llm: FakeLLMServer, config: dict[str, Any], method: str
) -> None:
    fake_llm.reply = '{"city": "Rome"}'
    parts = _gemini(proxy, method, config)
    assert json.loads("".join(p["text"] for p in parts)) == {"city": "Rome"}


@pytest.mark.parametrize("method", GEMINI_METHODS)
def test_a_gemini_function_call_only_reply_gets_no_text_part(
    proxy: Served, fake_llm: FakeLLMServer, method: str
) -> None:
    fake_llm.reply = ModelTurn("", (ToolCall("get_weather", {"city": "Rome"}),))
    parts = _gemini(proxy, method)
    assert parts == [{"functionCall": {"name": "get_weather", "args": {"city": "Rome"}}}]


# --------------------------------------------------------------------------- proxy.markers


def test_markers_default_off_and_configurable() -> None:
    assert ProxySettings().markers is False
    assert ServerConfig.model_validate({"proxy": {"markers": True}}).proxy.markers is True


@pytest.mark.parametrize("stream", [False, True])
def test_with_markers_off_no_reply_carries_one(
    fake_llm: FakeLLMServer, engine: MemoryEngine, stream: bool
) -> None:
    fake_llm.reply = "Plain answer."
    with _serve(fake_llm, engine) as served:  # the default
        raw = oa(served).chat.completions.with_raw_response.create(
            model="m", messages=ask("Hi"), stream=stream
        )
        message = an(served).messages.create(model="c", max_tokens=9, messages=ask("Hi"))
        text = _streamed_text(raw.parse()) if stream else raw.parse().choices[0].message.content
        parts = _gemini(served, GEMINI_METHODS[stream])
    assert raw.headers[SESSION_HEADER] and text == "Plain answer."
    assert [b.text for b in message.content if b.type == "text"] == ["Plain answer."]
    assert "".join(p["text"] for p in parts) == "Plain answer."


# --------------------------------------------------------------------------- deep nesting

DEEP = b'{"model": "m", "messages": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"


@pytest.mark.parametrize(
    ("path", "shape"),
    [
        ("/v1/chat/completions", {"message", "type", "code"}),
        ("/v1/messages", {"message", "type"}),
        ("/v1beta/models/gemini-x:generateContent", {"code", "message", "status"}),
    ],
)
def test_json_nested_too_deeply_is_a_provider_shaped_400(
    proxy: Served, fake_llm: FakeLLMServer, path: str, shape: set[str]
) -> None:
    with httpx.Client(base_url=proxy.url) as client:
        response = client.post(path, content=DEEP, headers={"content-type": "application/json"})
        assert response.status_code == 400
        error = response.json()["error"]
        assert set(error) == shape and "nested too deeply" in error["message"]
        assert client.get("/healthz").status_code == 200  # the same connection still works
    assert fake_llm.requests == []


# --------------------------------------------------------------------------- the rules, pure


@pytest.mark.parametrize(
    ("fmt", "body", "reason"),
    [
        ("openai", {"response_format": {"type": "json_object"}}, "JSON"),
        ("openai", {"response_format": {"type": "json_schema", "json_schema": {}}}, "JSON"),
        ("openai", {"response_format": {"type": "text"}}, None),
        ("openai", {"tool_choice": "required"}, "forces a tool call"),
        ("openai", {"tool_choice": {"type": "function", "function": {"name": "f"}}}, "forces"),
        ("openai", {"tool_choice": {"type": "allowed_tools",
                                    "allowed_tools": {"mode": "required"}}}, "forces"),
        ("openai", {"tool_choice": {"type": "allowed_tools",
                                    "allowed_tools": {"mode": "auto"}}}, None),
        ("openai", {"tool_choice": "auto"}, None),
        ("anthropic", {"tool_choice": {"type": "tool", "name": "f"}}, "forces a tool call"),
        ("anthropic", {"tool_choice": {"type": "any"}}, "forces a tool call"),
        ("anthropic", {"tool_choice": {"type": "auto"}}, None),
        ("anthropic", {"output_config": {"format": {"type": "json_schema"}}}, "JSON"),
        ("anthropic", {"output_config": {"effort": "low"}}, None),
        ("anthropic", {"output_format": {"type": "json_schema"}}, "JSON"),
        ("gemini", {"generationConfig": {"responseMimeType": "application/json"}}, "json"),
        ("gemini", {"generation_config": {"response_mime_type": "text/x.enum"}}, "x.enum"),
        ("gemini", {"generationConfig": {"responseMimeType": "text/plain"}}, None),
        ("gemini", {"generationConfig": {"responseJsonSchema": {"type": "object"}}}, "JSON"),
        ("gemini", {"toolConfig": {"functionCallingConfig": {"mode": "ANY"}}}, "forces"),
        ("gemini", {"toolConfig": {"functionCallingConfig": {"mode": "AUTO"}}}, None),
        ("gemini", {"generationConfig": "not an object"}, None),
    ],
)  # fmt: skip
def test_which_requests_get_no_marker(fmt: str, body: dict[str, Any], reason: str | None) -> None:
    found = withheld(fmt, body)
    assert found is None if reason is None else (found is not None and reason in found)


TOOL_ONLY: dict[str, Any] = {
    "openai": {"id": "x", "model": "m", "choices": [{"index": 0, "finish_reason": "tool_calls",
               "message": {"content": None, "tool_calls": [{"id": "c", "type": "function",
                                                            "function": {"name": "f",
                                                                         "arguments": "{}"}}]}}]},
    "anthropic": {"id": "x", "model": "m", "stop_reason": "tool_use", "usage": {}, "content": [
        {"type": "tool_use", "id": "c", "name": "f", "input": {}}]},
    "gemini": {"candidates": [{"content": {"parts": [{"functionCall": {"name": "f", "args": {}}}],
                                           "role": "model"}, "finishReason": "STOP"}]},
}  # fmt: skip


@pytest.mark.parametrize("fmt", ["openai", "anthropic", "gemini"])
def test_a_stream_of_only_tool_calls_gets_no_marker_event(fmt: str) -> None:
    stream = synthesize(fmt, TOOL_ONLY[fmt])
    state = stream_state(fmt, marker_text(make_token("p", "s1", 2, b"secret")))
    out = [piece for event in SseSplitter().feed(stream) for piece in state.feed(event)]
    out += state.finish()
    assert b"".join(out) == stream
    assert [c.name for c in state.reply.calls] == ["f"] and state.reply.tool_only


LEGACY_CALL = {"name": "get_weather", "arguments": '{"city": "Oslo"}'}


def test_a_legacy_function_call_reply_is_tool_only() -> None:
    """The ``functions`` API's ``function_call`` is a tool call: no marker text after it."""
    message = {"role": "assistant", "content": None, "function_call": LEGACY_CALL}
    choice = {"index": 0, "finish_reason": "function_call", "message": message}
    body = {"id": "x", "model": "m", "choices": [choice]}
    reply = reply_of("openai", body)
    assert [(c.name, c.input) for c in reply.calls] == [("get_weather", {"city": "Oslo"})]
    assert reply.tool_only


def test_a_streamed_legacy_function_call_gets_no_marker_event() -> None:
    chunks = [{"function_call": {"name": "get_weather", "arguments": ""}},
              {"function_call": {"arguments": '{"city": '}},
              {"function_call": {"arguments": '"Oslo"}'}}]  # fmt: skip
    events = [
        {"id": "x", "object": "chat.completion.chunk", "model": "m",
         "choices": [{"index": 0, "delta": delta, "finish_reason": None}]}
        for delta in chunks
    ] + [{"id": "x", "object": "chat.completion.chunk", "model": "m",
          "choices": [{"index": 0, "delta": {}, "finish_reason": "function_call"}]}]  # fmt: skip
    stream = b"".join(b"data: " + json.dumps(e).encode() + b"\n\n" for e in events)
    stream += b"data: [DONE]\n\n"
    state = stream_state("openai", marker_text(make_token("p", "s1", 2, b"secret")))
    out = [piece for event in SseSplitter().feed(stream) for piece in state.feed(event)]
    out += state.finish()
    assert b"".join(out) == stream
    assert [(c.name, c.input) for c in state.reply.calls] == [("get_weather", {"city": "Oslo"})]


@pytest.mark.parametrize("fmt", ["openai", "anthropic", "gemini"])
def test_a_stream_event_nested_too_deeply_passes_through(fmt: str) -> None:
    event = b"data: " + b"[" * 100_000 + b"]" * 100_000 + b"\n\n"
    assert stream_state(fmt, marker_text(make_token("p", "s1", 2, b"secret"))).feed(event) == [
        event
    ]
