"""The transparent proxy end to end: the real app under uvicorn on 127.0.0.1, the fake provider
behind it, and the real ``openai`` and ``anthropic`` SDK clients (Gemini over plain httpx)."""

from __future__ import annotations

import gzip
import json
import logging
import re
import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import pytest

from contextfold.memory.engine import MemoryEngine
from contextfold.server.config import InstanceSettings, ProxySettings, ServerConfig
from contextfold.server.proxy.session import SESSION_HEADER, find_tokens, make_token
from fake_llm import FakeLLMServer, ModelTurn, ToolCall
from proxy_support import Served, closed_after_test, free_port, make_engine, serve

SYSTEM = "You are a careful assistant."


@pytest.fixture
def marking(fake_llm: FakeLLMServer, engine: MemoryEngine) -> Iterator[Served]:
    """The proxy with session markers opted in (``proxy.markers: true``)."""
    config = ServerConfig(port=0, proxy=ProxySettings(upstream=fake_llm.url, markers=True))
    with serve(config, engine) as served:
        yield served


def oa(served: Served) -> openai.OpenAI:
    return closed_after_test(
        openai.OpenAI(base_url=f"{served.url}/v1", api_key="sk-test", max_retries=0)
    )


def an(served: Served) -> anthropic.Anthropic:
    return closed_after_test(
        anthropic.Anthropic(base_url=served.url, api_key="sk-ant-test", max_retries=0)
    )


def sent(fake: FakeLLMServer, index: int = -1) -> dict[str, Any]:
    body = fake.requests[index].body
    assert isinstance(body, dict)
    return body


# --------------------------------------------------------------------------- OpenAI SDK


@pytest.mark.parametrize("stream", [False, True])
def test_openai_sdk_gets_the_reply_as_the_model_wrote_it(
    proxy: Served, fake_llm: FakeLLMServer, engine: MemoryEngine, stream: bool
) -> None:
    fake_llm.reply = "Paris is the capital of France."
    messages: Any = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Capital?"}]
    if stream:
        chunks = oa(proxy).chat.completions.create(model="m", messages=messages, stream=True)
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    else:
        reply = oa(proxy).chat.completions.create(model="m", messages=messages)
        text = reply.choices[0].message.content or ""
    assert text == "Paris is the capital of France."  # no marker text by default
    assert sent(fake_llm)["messages"][0] == {"role": "system", "content": SYSTEM}
    proxy.drain()
    (sid,) = [s for s in engine.store.sessions() if s != "default"]
    assert [t.message.text() for t in engine.store.turns(sid)] == [
        "Capital?",
        "Paris is the capital of France.",
    ]


def test_the_marker_is_stripped_and_continues_the_session(
    marking: Served, fake_llm: FakeLLMServer
) -> None:
    client = oa(marking)
    history: list[Any] = [{"role": "user", "content": "Hello"}]
    for question in ["Hi", "Again"]:
        reply = client.chat.completions.create(model="m", messages=history).choices[0].message
        history += [{"role": "assistant", "content": reply.content}]
        history += [{"role": "user", "content": question}]
    # A one-shot request gets no marker (helper calls look like that); the next reply does.
    assert "contextfold" not in history[1]["content"] and find_tokens(history[3]["content"])
    client.chat.completions.create(model="m", messages=history)
    assert "contextfold" not in fake_llm.requests[-1].raw.decode()
    marking.drain()
    records = marking.events.recent()
    assert len({r.session_id for r in records}) == 1
    assert [r.extra["session_source"] for r in records] == ["new", "history", "marker"]


def test_a_forged_marker_starts_a_new_session(proxy: Served, fake_llm: FakeLLMServer) -> None:
    client = oa(proxy)
    client.chat.completions.create(model="m", messages=[{"role": "user", "content": "Hello"}])
    proxy.drain()
    victim = proxy.events.recent()[0].session_id
    forged = f"{victim}.{'0' * 32}"  # the right id with a made-up MAC
    history: Any = [
        {"role": "user", "content": "Hello"},
        {"role": "assistant", "content": f"Hi.\n\n<!-- contextfold:session={forged} -->"},
        {"role": "user", "content": "What did I say before?"},
    ]
    raw = client.chat.completions.with_raw_response.create(model="m", messages=history)
    proxy.drain()
    record = proxy.events.recent()[-1]
    assert record.session_id != victim and record.extra["session_source"] == "forged"
    assert raw.headers[SESSION_HEADER].startswith(record.session_id)
    assert "contextfold" not in fake_llm.requests[-1].raw.decode()


def test_the_session_header_works_like_the_marker(proxy: Served) -> None:
    raw = oa(proxy).chat.completions.with_raw_response.create(
        model="m", messages=[{"role": "user", "content": "Hello"}]
    )
    token = raw.headers[SESSION_HEADER]
    client = openai.OpenAI(
        base_url=f"{proxy.url}/v1", api_key="sk-test", default_headers={SESSION_HEADER: token}
    )
    client.chat.completions.create(model="m", messages=[{"role": "user", "content": "Again"}])
    # The same header with another credential opens nothing: a new conversation.
    other = openai.OpenAI(
        base_url=f"{proxy.url}/v1", api_key="sk-other", default_headers={SESSION_HEADER: token}
    )
    other.chat.completions.create(model="m", messages=[{"role": "user", "content": "Mine?"}])
    proxy.drain()
    first, second, third = proxy.events.recent()
    assert token.startswith(first.session_id) and second.session_id == first.session_id
    assert second.extra["session_source"] == "header"
    assert third.session_id != first.session_id and third.extra["session_source"] == "forged"


def test_a_fact_said_early_is_recalled_later(proxy: Served, fake_llm: FakeLLMServer) -> None:
    client = oa(proxy)
    fake_llm.reply = "Noted."
    history: list[Any] = [{"role": "user", "content": "My locker combination is 4417."}]
    for question in ["Plan a pasta dinner.", "Which wine goes with it?", "And dessert?"]:
        answer = client.chat.completions.create(model="m", messages=history)
        history += [{"role": "assistant", "content": answer.choices[0].message.content}]
        history += [{"role": "user", "content": question}]
    proxy.drain()
    # The client keeps only its last exchange; its content names the stored reply.
    trimmed = [*history[-2:-1], {"role": "user", "content": "What is my locker combination?"}]
    client.chat.completions.create(model="m", messages=trimmed)
    forwarded = sent(fake_llm)["messages"]
    assert forwarded[:-1] == trimmed[:-1]
    # The memory goes after the question, at the end of the request.
    assert forwarded[-1]["content"].startswith("What is my locker combination?\n\n")
    assert "4417" in forwarded[-1]["content"]
    proxy.drain()
    assert "4417" in proxy.events.recent()[-1].context


def test_consecutive_turns_share_a_byte_identical_prefix(
    proxy: Served, fake_llm: FakeLLMServer
) -> None:
    client = oa(proxy)
    client.chat.completions.create(model="m", messages=[{"role": "user", "content": "budget?"}])
    history: list[Any] = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": "Our travel budget is 3,200 euros."},
    ]
    raws = []
    for question in ["Book the flights.", "What was the travel budget again?"]:
        reply = client.chat.completions.create(model="m", messages=history)
        raws.append(fake_llm.requests[-1].raw)
        history += [{"role": "assistant", "content": reply.choices[0].message.content}]
        history += [{"role": "user", "content": question}]
        proxy.drain()
    reply = client.chat.completions.create(model="m", messages=history)
    raws.append(fake_llm.requests[-1].raw)
    # The stable part (system prompt and every earlier message) is a shared byte prefix.
    stable = json.dumps(sent(fake_llm)["messages"][:3], separators=(",", ":"))[:-1].encode()
    assert stable in raws[1] and stable in raws[2]
    shared = raws[1][: raws[1].index(stable) + len(stable)]
    assert raws[2].startswith(shared)


# --------------------------------------------------------------------------- Anthropic SDK


@pytest.mark.parametrize("stream", [False, True])
def test_anthropic_sdk_round_trip(
    proxy: Served, fake_llm: FakeLLMServer, engine: MemoryEngine, stream: bool
) -> None:
    fake_llm.reply = "The Henninger filing is due March 3."
    client = an(proxy)
    messages: Any = [{"role": "user", "content": "When is the Henninger filing due?"}]
    if stream:
        with client.messages.stream(
            model="claude-x", max_tokens=64, system=SYSTEM, messages=messages
        ) as events:
            message = events.get_final_message()
    else:
        message = client.messages.create(
            model="claude-x", max_tokens=64, system=SYSTEM, messages=messages
        )
    text = "".join(b.text for b in message.content if b.type == "text")
    assert text == "The Henninger filing is due March 3."  # no marker text by default
    assert sent(fake_llm)["system"] == SYSTEM
    # Sent back as the SDK returned it, the reply continues the session by its content.
    messages += [{"role": "assistant", "content": message.content}]
    messages += [{"role": "user", "content": "Thanks"}]
    client.messages.create(model="claude-x", max_tokens=64, messages=messages)
    assert sent(fake_llm)["messages"][1]["content"] == [
        {"type": "text", "text": "The Henninger filing is due March 3."}
    ] or sent(fake_llm)["messages"][1]["content"][0]["text"] == (
        "The Henninger filing is due March 3."
    )
    proxy.drain()
    assert len({r.session_id for r in proxy.events.recent()}) == 1


def test_anthropic_client_tool_calls_reach_the_client(
    proxy: Served, fake_llm: FakeLLMServer
) -> None:
    fake_llm.reply = ModelTurn("Checking.", (ToolCall("get_weather", {"city": "Oslo"}),))
    tool = {"name": "get_weather", "input_schema": {"type": "object"}}
    with an(proxy).messages.stream(
        model="claude-x",
        max_tokens=64,
        tools=[tool],  # type: ignore[list-item]
        messages=[{"role": "user", "content": "Weather in Oslo?"}],
    ) as events:
        message = events.get_final_message()
    (call,) = [b for b in message.content if b.type == "tool_use"]
    assert (call.name, call.input, message.stop_reason) == ("get_weather", {"city": "Oslo"},
                                                             "tool_use")  # fmt: skip


# --------------------------------------------------------------------------- tools


@pytest.mark.parametrize("stream", [False, True])
def test_openai_client_tool_calls_reach_the_client(
    proxy: Served, fake_llm: FakeLLMServer, stream: bool
) -> None:
    fake_llm.reply = ModelTurn("", (ToolCall("get_weather", {"city": "Oslo"}, "call_1"),))
    tool: Any = {"type": "function", "function": {"name": "get_weather", "parameters": {}}}
    messages: Any = [{"role": "user", "content": "Weather in Oslo?"}]
    client = oa(proxy)
    if stream:
        with client.chat.completions.stream(model="m", messages=messages, tools=[tool]) as s:
            message = s.get_final_completion().choices[0].message
    else:
        message = client.chat.completions.create(model="m", messages=messages, tools=[tool])
        message = message.choices[0].message
    (call,) = message.tool_calls or []
    assert call.function.name == "get_weather"  # type: ignore[union-attr]
    assert json.loads(call.function.arguments) == {"city": "Oslo"}  # type: ignore[union-attr]


@pytest.fixture
def tools_proxy(fake_llm: FakeLLMServer, tmp_path: Path) -> Iterator[Served]:
    with make_engine(tmp_path, paging={"mode": "tools"}) as memory:
        config = ServerConfig(port=0, proxy=ProxySettings(upstream=fake_llm.url))
        with serve(config, memory) as served:
            yield served


def _find_then_answer(body: dict[str, Any]) -> ModelTurn:
    messages = body.get("messages", [])
    results = [m for m in messages if m.get("role") == "tool"]
    if not results:
        return ModelTurn("", (ToolCall("find_quote", {"query": "locker combination"}, "q1"),))
    return ModelTurn(f"Found it: {results[-1]['content'][:300]}")


@pytest.mark.parametrize("stream", [False, True])
def test_memory_tool_calls_are_run_in_the_proxy(
    tools_proxy: Served, fake_llm: FakeLLMServer, stream: bool
) -> None:
    client = oa(tools_proxy)
    fake_llm.reply = "Noted."
    ask: Any = [{"role": "user", "content": "My locker combination is 4417."}]
    noted = client.chat.completions.create(model="m", messages=ask).choices[0].message.content
    tools_proxy.drain()
    fake_llm.reply = _find_then_answer
    before = len(fake_llm.requests)
    ask += [{"role": "assistant", "content": noted}]  # its marker carries the session
    ask += [{"role": "user", "content": "Remind me of my locker combination."}]
    if stream:
        chunks = client.chat.completions.create(model="m", messages=ask, stream=True)
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    else:
        text = client.chat.completions.create(model="m", messages=ask).choices[0].message.content
    assert text is not None and text.startswith("Found it:") and "4417" in text
    assert len(fake_llm.requests) == before + 2
    names = [t["function"]["name"] for t in sent(fake_llm, before)["tools"]]
    assert names == ["expand_topic", "collapse_topic", "find_quote"]
    tools_proxy.drain()
    assert tools_proxy.events.recent()[-1].extra["memory_tool_calls"][0]["name"] == "find_quote"


# --------------------------------------------------------------------------- Gemini


@pytest.mark.parametrize("method", ["generateContent", "streamGenerateContent?alt=sse"])
def test_gemini_round_trip_with_marker(
    marking: Served, fake_llm: FakeLLMServer, method: str
) -> None:
    proxy = marking
    fake_llm.reply = "Bonjour."
    body = {
        "systemInstruction": {"parts": [{"text": SYSTEM}]},
        "contents": [
            {"role": "user", "parts": [{"text": "Hi."}]},
            {"role": "model", "parts": [{"text": "Hello."}]},
            {"role": "user", "parts": [{"text": "Say hello in French."}]},
        ],
    }
    url = f"{proxy.url}/v1beta/models/gemini-x:{method}"
    response = httpx.post(url, json=body, headers={"x-goog-api-key": "g-key"})
    assert response.status_code == 200
    if method.startswith("stream"):
        events = [json.loads(line[6:]) for line in response.text.splitlines() if line]
        parts = [p for e in events for p in e["candidates"][0]["content"]["parts"]]
    else:
        parts = response.json()["candidates"][0]["content"]["parts"]
    text = "".join(p["text"] for p in parts)
    assert text.startswith("Bonjour.\n\n<!-- contextfold:session=")
    assert fake_llm.requests[-1].headers["x-goog-api-key"] == "g-key"
    assert sent(fake_llm)["systemInstruction"] == body["systemInstruction"]


# --------------------------------------------------------------------------- streaming


def test_stream_events_are_forwarded_as_they_arrive(proxy: Served, fake_llm: FakeLLMServer) -> None:
    fake_llm.reply = "one two three"
    seen_first = threading.Event()
    waited: list[bool] = []

    def gate(index: int) -> None:
        if index == 2:  # hold the second word until the client has the first
            waited.append(seen_first.wait(10))

    fake_llm.stream_gate = gate
    chunks = oa(proxy).chat.completions.create(
        model="m", messages=[{"role": "user", "content": "count"}], stream=True
    )
    words = []
    for chunk in chunks:
        if chunk.choices and chunk.choices[0].delta.content:
            words.append(chunk.choices[0].delta.content)
            seen_first.set()
    assert waited == [True]
    assert words[:3] == ["one ", "two ", "three"]


# --------------------------------------------------------------------------- failures


def test_the_proxy_fails_open_when_the_engine_raises(
    proxy: Served,
    fake_llm: FakeLLMServer,
    engine: MemoryEngine,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    def broken(*args: object, **kwargs: object) -> None:
        raise RuntimeError("index corrupted")

    client = openai.OpenAI(base_url=f"{proxy.url}/v1", api_key="sk-secret-123", max_retries=0)
    first = client.chat.completions.create(
        model="m", messages=[{"role": "user", "content": "Hello"}]
    )
    reply = json.dumps(first.choices[0].message.content)
    monkeypatch.setattr(engine, "on_message_inbound", broken)
    raw = (
        b'{"model": "m", "messages": [{"role": "user", "content": "Hello"},'
        b' {"role": "assistant", "content": %s},'
        b' {"role": "user", "content": "Still there?"}]}' % reply.encode()
    )
    with caplog.at_level(logging.WARNING, "contextfold.server.proxy"):
        response = httpx.post(
            f"{proxy.url}/v1/chat/completions",
            content=raw,
            headers={"Authorization": "Bearer sk-secret-123", "content-type": "application/json"},
        )
    assert response.status_code == 200
    assert fake_llm.requests[-1].raw == raw  # forwarded byte for byte, the marker too
    proxy.drain()
    assert "RuntimeError: index corrupted" in (proxy.events.recent()[-1].error or "")
    assert "index corrupted" in caplog.text and "sk-secret-123" not in caplog.text


@pytest.mark.parametrize("status", [429, 500])
def test_upstream_errors_pass_through_with_status_and_body(
    proxy: Served, fake_llm: FakeLLMServer, status: int
) -> None:
    body = {"error": {"message": f"upstream says {status}", "type": "rate_limit"}}
    fake_llm.fail_next(status, body=body, headers={"retry-after": "7"})
    response = httpx.post(
        f"{proxy.url}/v1/chat/completions",
        json={"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True},
    )
    assert response.status_code == status
    assert response.json() == body and response.headers["retry-after"] == "7"
    fake_llm.fail_next(status, body=body)
    with pytest.raises(openai.APIStatusError) as caught:
        oa(proxy).chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}])
    assert caught.value.status_code == status and f"upstream says {status}" in str(caught.value)


def test_auth_headers_are_forwarded(proxy: Served, fake_llm: FakeLLMServer) -> None:
    fake_llm.api_key = "sk-right"
    ok = openai.OpenAI(base_url=f"{proxy.url}/v1", api_key="sk-right", max_retries=0)
    ok.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
    assert fake_llm.requests[-1].headers["authorization"] == "Bearer sk-right"
    with pytest.raises(openai.AuthenticationError):  # the upstream's 401 comes back
        oa(proxy).chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}])
    fake_llm.api_key = None
    headers = {"x-api-key": "sk-ant-1", "anthropic-version": "2023-06-01"}
    claude = anthropic.Anthropic(base_url=proxy.url, api_key="x", default_headers=headers)
    claude.messages.create(model="c", max_tokens=5, messages=[{"role": "user", "content": "hi"}])
    forwarded = fake_llm.requests[-1].headers
    assert forwarded["x-api-key"] == "sk-ant-1" and forwarded["anthropic-version"] == "2023-06-01"


@pytest.mark.parametrize(
    ("body", "problem"),
    [
        (b'{"messages": [', "not valid JSON"),
        (b"\xff\xfe{}", "not valid UTF-8"),
        (b"[1, 2]", "expected an object"),
        (b"", "empty"),
    ],
)
@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/messages"])
def test_bad_request_bodies_get_a_clear_400(
    proxy: Served, fake_llm: FakeLLMServer, body: bytes, problem: str, path: str
) -> None:
    response = httpx.post(proxy.url + path, content=body)
    assert response.status_code == 400
    assert problem in response.json()["error"]["message"]
    assert fake_llm.requests == []


def test_unknown_paths_get_a_404_and_provider_paths_pass_through(
    proxy: Served, fake_llm: FakeLLMServer
) -> None:
    assert httpx.post(f"{proxy.url}/nope", json={}).status_code == 404
    raw = b'{"model":"m","input":"hi <!-- contextfold:session=x.y -->"}'
    response = httpx.post(f"{proxy.url}/v1/moderations", content=raw)
    assert response.status_code == 404  # the fake has no such route: its own answer comes back
    assert "no route for POST /v1/moderations" in response.json()["error"]["message"]
    assert fake_llm.requests[-1].raw == raw  # untouched, marker-like text included


def test_a_10_mb_body_does_not_break_the_proxy(proxy: Served, fake_llm: FakeLLMServer) -> None:
    big = "word " * (2 * 1024 * 1024)  # 10 MiB of text
    body = {"model": "m", "messages": [{"role": "user", "content": big}]}
    response = httpx.post(f"{proxy.url}/v1/chat/completions", json=body, timeout=120)
    assert response.status_code in (200, 413)
    assert httpx.get(f"{proxy.url}/healthz").status_code == 200


def test_no_upstream_configured_is_a_clear_503(engine: MemoryEngine) -> None:
    with serve(ServerConfig(port=0), engine) as served:
        response = httpx.post(f"{served.url}/v1/messages", json={"messages": []})
    assert response.status_code == 503
    assert "contextfold proxy --upstream" in response.json()["error"]["message"]


def test_an_unreachable_upstream_is_a_502(engine: MemoryEngine) -> None:
    config = ServerConfig(port=0, proxy=ProxySettings(upstream=f"http://127.0.0.1:{free_port()}"))
    with serve(config, engine) as served:
        response = httpx.post(
            f"{served.url}/v1/chat/completions",
            json={"model": "m", "messages": [{"role": "user", "content": "hi"}]},
        )
    assert response.status_code == 502 and "unreachable" in response.json()["error"]["message"]


def test_an_upstream_that_does_not_answer_in_time_is_a_504_naming_the_timeout(
    engine: MemoryEngine,
) -> None:
    """Reachable but silent for ``proxy.timeout``: a gateway timeout, not "unreachable"."""
    silent = socket.create_server(("127.0.0.1", 0))  # accepts (the backlog), never answers
    try:
        upstream = f"http://127.0.0.1:{silent.getsockname()[1]}"
        config = ServerConfig(port=0, proxy=ProxySettings(upstream=upstream, timeout=0.5))
        with serve(config, engine) as served:
            for path, shape in (("/v1/chat/completions", "openai"), ("/v1/messages", "anthropic")):
                response = httpx.post(
                    f"{served.url}{path}",
                    json={
                        "model": "m",
                        "max_tokens": 5,
                        "messages": [{"role": "user", "content": "hi"}],
                    },
                    timeout=30,
                )
                assert response.status_code == 504, (path, response.text)
                body = response.json()
                if shape == "anthropic":
                    assert body["type"] == "error"
                message = body["error"]["message"]
                assert "timed out" in message and "0.5 s" in message and "proxy.timeout" in message
                assert "unreachable" not in message
    finally:
        silent.close()


class OneShotUpstream:
    """A raw HTTP/1.1 upstream on 127.0.0.1 that answers one request with fixed bytes and then
    closes the connection: for what a real provider does rarely (breaks off mid-stream,
    compresses its reply) and the fake provider never does."""

    def __init__(self, response: bytes) -> None:
        self.response = response
        self.request = b""
        self._sock = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self._sock.getsockname()[1]}"
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        conn, _ = self._sock.accept()
        with conn:
            while b"\r\n\r\n" not in self.request:
                self.request += conn.recv(65536)
            head, _, body = self.request.partition(b"\r\n\r\n")
            length = int(re.search(rb"(?i)content-length: *(\d+)", head).group(1))  # type: ignore[union-attr]
            while len(body) < length:
                body += conn.recv(65536)
            conn.sendall(self.response)
        self._sock.close()


def _chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


def test_a_stream_that_breaks_off_keeps_what_arrived(
    engine: MemoryEngine, caplog: pytest.LogCaptureFixture
) -> None:
    event = {"id": "c1", "object": "chat.completion.chunk", "model": "m",
             "choices": [{"index": 0, "delta": {"content": "Partial answer"}}]}  # fmt: skip
    upstream = OneShotUpstream(
        b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
        b"transfer-encoding: chunked\r\n\r\n"
        + _chunk(b"data: " + json.dumps(event).encode() + b"\n\n")
        + b"5\r\nda"  # a chunk cut short, then the connection closes
    )
    config = ServerConfig(port=0, proxy=ProxySettings(upstream=upstream.url))
    server_log = logging.getLogger("uvicorn.error")  # (uvicorn's own: it may not propagate)
    with serve(config, engine) as served:
        server_log.addHandler(caplog.handler)  # (once it runs: its log config drops handlers)
        try:
            with httpx.stream(
                "POST",
                f"{served.url}/v1/chat/completions",
                json={
                    "model": "m",
                    "stream": True,
                    "messages": [{"role": "user", "content": "hi"}],
                },
            ) as response:
                assert response.status_code == 200
                received = b""
                with pytest.raises(httpx.RemoteProtocolError):  # the client sees the cut too
                    for chunk in response.iter_raw():
                        received += chunk
            served.drain()
            (record,) = served.events.recent()
        finally:
            server_log.removeHandler(caplog.handler)
    assert b"Partial answer" in received
    assert record.error is not None and "broke off" in record.error
    stored = [t.message.text() for t in engine.store.turns(record.session_id)]
    assert stored == ["hi", "Partial answer"]
    # An expected event, logged once as a warning: no error, no traceback (the cut is made
    # by raising out of the body, which the server's handlers would each log again).
    logged = [(r.levelname, r.getMessage()) for r in caplog.records if r.levelno >= logging.WARNING]
    assert [m for level, m in logged if level == "WARNING" and "broke off" in m] != []
    assert [(level, m) for level, m in logged if level in ("ERROR", "CRITICAL")] == []
    assert not any(r.exc_info for r in caplog.records), [r.getMessage() for r in caplog.records]


def _sse_reply(*events: bytes) -> bytes:
    """A 200 event-stream answer of ``events`` (each a whole SSE event), ended cleanly."""
    return (
        b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
        b"transfer-encoding: chunked\r\n\r\n"
        + b"".join(_chunk(event) for event in events)
        + b"0\r\n\r\n"
    )


def _openai_chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
    chunk = {"id": "c1", "object": "chat.completion.chunk", "model": "m",
             "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}  # fmt: skip
    return b"data: " + json.dumps(chunk).encode() + b"\n\n"


def _anthropic_event(name: str, data: dict[str, Any]) -> bytes:
    return f"event: {name}\ndata: {json.dumps({'type': name, **data})}\n\n".encode()


_ANTHROPIC_MESSAGE = {
    "id": "m1",
    "type": "message",
    "role": "assistant",
    "model": "c",
    "content": [],
    "stop_reason": None,
    "usage": {"input_tokens": 1, "output_tokens": 0},
}
_ANTHROPIC_START = [
    _anthropic_event("message_start", {"message": _ANTHROPIC_MESSAGE}),
    _anthropic_event(
        "content_block_start", {"index": 0, "content_block": {"type": "text", "text": ""}}
    ),
    _anthropic_event(
        "content_block_delta",
        {"index": 0, "delta": {"type": "text_delta", "text": "Half an answ"}},
    ),
]

#: Streams that end cleanly but not complete: what arrived is stored marked partial, never
#: as a whole reply a later recall would offer as what the model said.
_UNFINISHED = {
    "openai error event": (
        "/v1/chat/completions",
        [
            _openai_chunk({"role": "assistant", "content": "Half an answ"}),
            b'data: {"error": {"message": "overloaded", "type": "server_error"}}\n\n',
        ],
        "overloaded",
    ),
    "openai no finish": (
        "/v1/chat/completions",
        [_openai_chunk({"role": "assistant", "content": "Half an answ"})],
        "final event",
    ),
    "anthropic error event": (
        "/v1/messages",
        [
            *_ANTHROPIC_START,
            _anthropic_event(
                "error", {"error": {"type": "overloaded_error", "message": "Overloaded"}}
            ),
        ],
        "overloaded_error",
    ),
    "anthropic no stop": ("/v1/messages", _ANTHROPIC_START, "final event"),
}


@pytest.mark.parametrize("case", list(_UNFINISHED))
def test_a_stream_that_ends_unfinished_is_stored_partial(engine: MemoryEngine, case: str) -> None:
    path, events, why = _UNFINISHED[case]
    upstream = OneShotUpstream(_sse_reply(*events))
    config = ServerConfig(port=0, proxy=ProxySettings(upstream=upstream.url))
    body: dict[str, Any] = {"model": "m", "stream": True, "max_tokens": 50,
                            "messages": [{"role": "user", "content": "hi"}]}  # fmt: skip
    with serve(config, engine) as served:
        with httpx.stream("POST", f"{served.url}{path}", json=body) as response:
            assert response.status_code == 200
            received = response.read()
        served.drain()
        (record,) = served.events.recent()
    assert b"Half an answ" in received  # the client got every byte, as sent
    turns = engine.store.turns(record.session_id)
    assert [(t.message.text(), t.partial) for t in turns] == [
        ("hi", False),
        ("Half an answ", True),
    ]
    assert record.error is not None and why in record.error, record.error


def test_a_compressed_upstream_reply_reaches_the_client_decoded_and_marked(
    engine: MemoryEngine,
) -> None:
    reply = {"id": "c1", "object": "chat.completion", "model": "m",
             "choices": [{"index": 0, "finish_reason": "stop",
                          "message": {"role": "assistant", "content": "Zipped"}}]}  # fmt: skip
    body = gzip.compress(json.dumps(reply).encode())
    upstream = OneShotUpstream(
        b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-encoding: gzip\r\n"
        b"content-length: %d\r\nconnection: close\r\n\r\n" % len(body) + body
    )
    config = ServerConfig(port=0, proxy=ProxySettings(upstream=upstream.url, markers=True))
    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "Hello."},
                {"role": "user", "content": "zip it"}]  # fmt: skip
    with serve(config, engine) as served:
        response = httpx.post(
            f"{served.url}/v1/chat/completions", json={"model": "m", "messages": messages}
        )
    assert response.status_code == 200 and "content-encoding" not in response.headers
    content = response.json()["choices"][0]["message"]["content"]
    assert content.startswith("Zipped") and find_tokens(content)
    assert b"accept-encoding: identity" in upstream.request.lower()


# --------------------------------------------------------------------------- records, instances


def test_each_request_publishes_a_record_then_its_response_tags(
    proxy: Served, fake_llm: FakeLLMServer
) -> None:
    fake_llm.reply = "Sourdough needs a ripe starter."
    history = [{"role": "user", "content": "How do I bake sourdough bread?"}]
    first = oa(proxy).chat.completions.create(model="gpt-x", messages=history)
    proxy.drain()
    (record,) = proxy.events.recent()
    # A new conversation: nothing to recall yet, its record says so.
    assert "a new conversation" in " ".join(record.extra["notes"])
    history += [
        {"role": "assistant", "content": first.choices[0].message.content or ""},
        {"role": "user", "content": "And rye bread?"},
    ]
    oa(proxy).chat.completions.create(model="gpt-x", messages=history)
    proxy.drain()
    _, record = proxy.events.recent()
    assert (record.format, record.path, record.model, record.status) == (
        "openai", "/v1/chat/completions", "gpt-x", 200)  # fmt: skip
    assert record.turn == 2 and record.tokens_in > 0 and record.upstream_ms is not None
    assert record.response_tags and "bread" in record.response_tags
    assert [m.role for m in record.messages] == ["user", "assistant", "user", "assistant"]
    assert {row.section for row in record.budget} >= {"memory", "history"}


def test_instances_share_one_engine(tmp_path: Path, engine: MemoryEngine) -> None:
    with FakeLLMServer(reply="from A") as a, FakeLLMServer(reply="from B") as b:
        ports = [free_port(), free_port()]
        config = ServerConfig(
            port=0,
            proxy=ProxySettings(
                instances=[
                    InstanceSettings(name="a", port=ports[0], upstream=a.url),
                    InstanceSettings(name="b", port=ports[1], upstream=b.url),
                ]
            ),
        )
        with serve(config, engine) as served:
            for port in ports:
                client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="k")
                reply = client.chat.completions.create(
                    model="m", messages=[{"role": "user", "content": f"hello {port}"}]
                )
                assert (reply.choices[0].message.content or "").startswith(
                    "from A" if port == ports[0] else "from B"
                )
            served.drain()
            assert [r.extra["instance"] for r in served.events.recent()] == ["a", "b"]
        assert len(a.requests) == len(b.requests) == 1
    assert len([s for s in engine.store.sessions() if s != "default"]) == 2


def test_token_verification_needs_the_servers_secret(proxy: Served) -> None:
    token = make_token("", "someone", 1, b"another server's secret")
    client = openai.OpenAI(
        base_url=f"{proxy.url}/v1", api_key="k", default_headers={SESSION_HEADER: token}
    )
    client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
    proxy.drain()
    record = proxy.events.recent()[-1]
    assert record.session_id != "someone" and record.extra["session_source"] == "forged"


def test_history_compacted_into_memory_is_left_out(fake_llm: FakeLLMServer, tmp_path: Path) -> None:
    fake_llm.reply = lambda body: "Noted: " + body["messages"][-1]["content"][-60:]
    settings = {"context_window": 512, "compaction": {"protected_recent_turns": 4}}
    with make_engine(tmp_path, **settings) as memory:
        config = ServerConfig(port=0, proxy=ProxySettings(upstream=fake_llm.url))
        with serve(config, memory) as served:
            client = oa(served)
            history: list[Any] = [{"role": "system", "content": SYSTEM}]
            for n in range(14):
                topic = ["the garden shed roof", "the tax return forms", "the piano lessons"][n % 3]
                text = f"Update {n} on {topic}: we decided on option {n * 11} after a long talk."
                history.append({"role": "user", "content": text})
                reply = client.chat.completions.create(model="m", messages=history)
                history.append({"role": "assistant", "content": reply.choices[0].message.content})
                served.drain()
            # (the last exchange's derive may have compacted too: its event comes after)
            record = [r for r in served.events.recent() if r.kind != "compaction"][-1]
            assert memory.store.session(record.session_id).compaction_watermark
            forwarded = sent(fake_llm)["messages"]
    assert forwarded[0]["content"].startswith(SYSTEM)  # the client's system prompt stays first
    assert len(forwarded) < len(history) - 1 and record.dropped_turns > 0
    assert all(reason.startswith("compacted: ") for reason in record.dropped)
    assert forwarded[1]["role"] == "user"


def test_a_new_conversations_history_is_stored_and_tagged_before_its_first_recall(
    proxy: Served, fake_llm: FakeLLMServer, engine: MemoryEngine
) -> None:
    """A client arriving with a conversation the proxy never saw: its earlier turns are
    ingested first, so the first request's message is tagged against them."""
    fake_llm.reply = "Noted."
    history: list[Any] = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": "Our kiln firing schedule peaks at cone six."},
        {"role": "assistant", "content": "Cone six it is; hold the kiln there ten minutes."},
        {"role": "user", "content": "The glaze crawled on the last kiln load."},
        {"role": "assistant", "content": "Crawling glaze usually means dust under it."},
        {"role": "user", "content": "How do I keep the glaze from crawling next time?"},
    ]
    oa(proxy).chat.completions.create(model="m", messages=history)
    proxy.drain()
    [record] = proxy.events.recent()
    assert "glaze" in record.inbound_tags
    sid = record.session_id
    texts = [t.message.text() for t in engine.store.turns(sid)]
    # Every turn stored once, in order, the reply last.
    assert texts == [m["content"] for m in history[1:]] + ["Noted."]


# --------------------------------------------------------------------------- envelopes

ENVELOPED = (
    "[Telegram Ada (@ada) id:42 +2m 2026-01-05 10:00 UTC] Book the rooftop table for Friday.\n"
    "[message_id: 881]"
)


def test_a_client_envelope_is_not_tagged_or_stored_and_goes_upstream_unchanged(
    proxy: Served, fake_llm: FakeLLMServer, engine: MemoryEngine
) -> None:
    fake_llm.reply = "Booked."
    event = "System: [2026-01-05 10:01:00] Node connected"
    messages = [{"role": "user", "content": f"{event}\n{ENVELOPED}"}]
    oa(proxy).chat.completions.create(model="m", messages=messages)
    proxy.drain()
    # Upstream got the body as the client sent it.
    assert sent(fake_llm)["messages"][0]["content"] == messages[0]["content"]
    [record] = proxy.events.recent()
    notes = " ".join(record.extra["notes"])
    assert "channel-header ×1" in notes and "message-footer ×1" in notes
    assert "event-line ×1" in notes
    [user, _] = engine.store.turns(record.session_id)
    assert user.message.text() == "Book the rooftop table for Friday."
    tags = set(user.tags) | set(user.related_tags)
    assert not {t for t in tags if "telegram" in t or "message-id" in t or "node" in t}
    # The next request resends the enveloped message: found by content, stored once.
    messages += [
        {"role": "assistant", "content": "Booked."},
        {"role": "user", "content": ENVELOPED.replace("rooftop table", "cake")},
    ]
    oa(proxy).chat.completions.create(model="m", messages=messages)
    proxy.drain()
    texts = [t.message.text() for t in engine.store.turns(record.session_id)]
    assert texts == [user.message.text(), "Booked.", "Book the cake for Friday.", "Booked."]


def test_envelope_patterns_are_configurable(fake_llm: FakeLLMServer, engine: MemoryEngine) -> None:
    proxy_settings = ProxySettings(
        upstream=fake_llm.url,
        envelope={"defaults": False, "patterns": {"ticket": r"^TICKET-\d+:\s*"}},
    )
    with serve(ServerConfig(port=0, proxy=proxy_settings), engine) as served:
        fake_llm.reply = "Done."
        oa(served).chat.completions.create(
            model="m", messages=[{"role": "user", "content": f"TICKET-7: {ENVELOPED}"}]
        )
        served.drain()
        [record] = served.events.recent()
    [user, _] = engine.store.turns(record.session_id)
    assert user.message.text() == ENVELOPED  # the built-in patterns are off
    with pytest.raises(ValueError, match="not a regular expression"):
        ProxySettings(envelope={"patterns": {"bad": "(unclosed"}})
