"""The proxy under hostile input and careless configs (issue 21): credentials in an upstream
URL, paths that climb out of the upstream's prefix, client values in logs, a model's bad
memory-tool call, hop-by-hop ``Expect``. The real app under uvicorn on 127.0.0.1, the fake
provider behind it, real SDK clients or raw sockets where the bytes on the wire matter."""

from __future__ import annotations

import json
import logging
import re
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import pytest
from pydantic import ValidationError

from contextfold.memory.engine import MemoryEngine
from contextfold.server.config import (
    InstanceSettings,
    LimitSettings,
    ProxySettings,
    ServerConfig,
)
from contextfold.store.sqlite import memory as sqlite_memory
from contextfold.store.sqlite import memory_branches, memory_db
from fake_llm import FakeLLMServer, ModelTurn, ToolCall
from proxy_support import Served, closed_after_test, free_port, make_engine, serve

CANARY = "CANARY-7f3a9c-secret"


@pytest.fixture
def proxy(fake_llm: FakeLLMServer, engine: MemoryEngine) -> Iterator[Served]:
    config = ServerConfig(port=0, proxy=ProxySettings(upstream=f"{fake_llm.url}/v1"))
    with serve(config, engine) as served:
        yield served


def oa(served: Served, key: str = "sk-test") -> openai.OpenAI:
    return closed_after_test(openai.OpenAI(base_url=f"{served.url}/v1", api_key=key, max_retries=0))


def raw_request(port: int, head: bytes, body: bytes = b"") -> tuple[int, bytes]:
    """Send ``head`` (request line and headers, without the blank line) and ``body`` as they
    are; returns the final (non-1xx) status and body of the answer."""
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(head + b"\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
        data = b""
        while True:
            chunk = sock.recv(65536)
            data += chunk
            while data.startswith(b"HTTP/1.1 1") and b"\r\n\r\n" in data:
                data = data.partition(b"\r\n\r\n")[2]  # 100 Continue
            headers, found, rest = data.partition(b"\r\n\r\n")
            length = re.search(rb"(?i)\r\ncontent-length: *(\d+)", headers)
            if not chunk or (found and length and len(rest) >= int(length.group(1))):
                return int(headers.split(b" ", 2)[1]), rest


# --------------------------------------------------------------------------- credentials


@pytest.mark.parametrize(
    "url", ["http://user:PASSWORD@127.0.0.1:9", "https://PASSWORD@api.example.com/v1"]
)
def test_credentials_in_an_upstream_url_are_refused_at_config_load(url: str) -> None:
    for make in (
        lambda: ProxySettings(upstream=url),
        lambda: InstanceSettings(name="a", port=7001, upstream=url),
    ):
        with pytest.raises(ValidationError) as caught:
            make()
        message = str(caught.value)
        assert "PASSWORD" not in message
        assert "credentials" in message and "Authorization" in message


def test_an_unreachable_upstream_names_its_host_only(engine: MemoryEngine) -> None:
    config = ServerConfig(port=0, proxy=ProxySettings(upstream=f"http://127.0.0.1:{free_port()}"))
    with serve(config, engine) as served:
        response = httpx.post(
            f"{served.url}/v1/chat/completions",
            json={"model": "m", "messages": [{"role": "user", "content": "hi"}]},
        )
    message = response.json()["error"]["message"]
    assert response.status_code == 502 and message.startswith("upstream 127.0.0.1:")


# --------------------------------------------------------------------------- paths


@pytest.mark.parametrize(
    "target",
    [
        b"/v1/..%2f..%2fadmin/keys",
        b"/v1/..%2F..%2Fadmin/keys",
        b"/v1/%2e%2e/%2e%2e/admin/keys",
        b"/v1/models/../../admin",
        b"/v1/models%20x",
        b"/v1/models%00",
        b"/v1/models%0d%0aX-Injected:%20yes",
        b"/v1/models%5c..%5cadmin",
        b"/v1beta/models/..%2fadmin:generateContent",
    ],
)
def test_paths_leaving_the_upstream_prefix_get_400_and_send_nothing(
    proxy: Served, fake_llm: FakeLLMServer, target: bytes
) -> None:
    for method in (b"GET", b"POST"):
        status, body = raw_request(
            proxy.ports[0],
            method + b" " + target + b" HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            b"Content-Type: application/json",
            b'{"model": "m", "messages": [{"role": "user", "content": "hi"}]}',
        )
        assert status == 400, body[:200]
        assert "path" in json.loads(body)["error"]["message"]  # the proxy's own answer
    assert fake_llm.requests == []


def test_an_ordinary_path_is_forwarded_under_the_prefix(
    proxy: Served, fake_llm: FakeLLMServer
) -> None:
    fake_llm.route("GET", r"/v1/models/gpt-4o:latest", lambda *_: _json_reply({"id": "x"}))
    response = httpx.get(f"{proxy.url}/v1/models/gpt-4o:latest?x=%2F")
    assert response.status_code == 200
    assert fake_llm.requests[-1].path == "/v1/models/gpt-4o:latest?x=%2F"


def _json_reply(data: Any) -> Any:
    from fake_llm import Reply

    return Reply(200, json.dumps(data).encode(), {"content-type": "application/json"})


# --------------------------------------------------------------------------- logs


def test_a_rejected_field_value_reaches_no_log_record_or_response_in_full(
    proxy: Served, fake_llm: FakeLLMServer, caplog: pytest.LogCaptureFixture
) -> None:
    role = "x" * 200_000 + CANARY
    body = {"model": "m", "messages": [{"role": role, "content": "hi"}]}
    with caplog.at_level(logging.DEBUG):
        response = httpx.post(f"{proxy.url}/v1/chat/completions", json=body)
        proxy.drain()
    assert CANARY not in response.text and len(response.content) < 10_000
    assert CANARY not in caplog.text and len(caplog.text) < 20_000
    for record in proxy.events.recent():
        dumped = record.model_dump_json()
        assert CANARY not in dumped and len(dumped) < 50_000


# --------------------------------------------------------------------------- tools mode


@pytest.fixture
def tools_proxy(fake_llm: FakeLLMServer, tmp_path: Path) -> Iterator[Served]:
    with make_engine(tmp_path, paging={"mode": "tools"}) as memory:
        config = ServerConfig(port=0, proxy=ProxySettings(upstream=fake_llm.url))
        with serve(config, memory) as served:
            yield served


def _bad_call_then_answer(body: dict[str, Any]) -> ModelTurn:
    results = [m for m in body.get("messages", []) if m.get("role") == "tool"]
    if not results:
        call = ToolCall("find_quote", {"query": "locker", "limit": "abc"}, "q1")
        return ModelTurn("", (call,))
    return ModelTurn(f"Tool said: {results[-1]['content']}")


def test_a_bad_tool_argument_is_a_tool_error_the_model_reads(
    tools_proxy: Served, fake_llm: FakeLLMServer
) -> None:
    fake_llm.reply = _bad_call_then_answer
    ask: Any = [{"role": "user", "content": "Remind me of my locker combination."}]
    text = oa(tools_proxy).chat.completions.create(model="m", messages=ask).choices[0]
    assert text.message.content is not None
    assert "limit" in text.message.content and "error" in text.message.content


def test_an_engine_error_in_the_tool_loop_fails_open(
    tools_proxy: Served, fake_llm: FakeLLMServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(*args: object, **kwargs: object) -> str:
        raise RuntimeError("pager corrupted")

    monkeypatch.setattr(tools_proxy.app.state.contextfold.memory, "handle_tool_call", broken)
    fake_llm.reply = _bad_call_then_answer
    raw = b'{"model":"m","messages":[{"role":"user","content":"Where is my locker?"}]}'
    response = httpx.post(
        f"{tools_proxy.url}/v1/chat/completions",
        content=raw,
        headers={"content-type": "application/json"},
    )
    assert response.status_code == 200, response.text
    assert fake_llm.requests[-1].raw == raw  # the client's request, unmodified
    tools_proxy.drain()
    assert "RuntimeError: pager corrupted" in (tools_proxy.events.recent()[-1].error or "")


# --------------------------------------------------------------------------- hop-by-hop


def test_expect_100_continue_is_not_forwarded(proxy: Served, fake_llm: FakeLLMServer) -> None:
    status, _ = raw_request(
        proxy.ports[0],
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        b"Content-Type: application/json\r\nExpect: 100-continue",
        b'{"model": "m", "messages": [{"role": "user", "content": "hi"}]}',
    )
    assert status == 200
    assert "expect" not in fake_llm.requests[-1].headers


# --------------------------------------------------------------------------- limits


def _many(n: int) -> list[dict[str, str]]:
    roles = ("user", "assistant")
    return [{"role": roles[i % 2], "content": f"m{i}"} for i in range(n - 1)] + [
        {"role": "user", "content": "last"}
    ]


@pytest.fixture
def limited(fake_llm: FakeLLMServer, engine: MemoryEngine) -> Iterator[Served]:
    limits = LimitSettings(max_messages=50, max_message_bytes=4096, max_json_depth=20)
    config = ServerConfig(port=0, proxy=ProxySettings(upstream=fake_llm.url), limits=limits)
    with serve(config, engine) as served:
        yield served


def test_too_many_messages_get_a_provider_shaped_413_naming_the_limit(
    limited: Served, fake_llm: FakeLLMServer
) -> None:
    with pytest.raises(openai.APIStatusError) as caught:
        oa(limited).chat.completions.create(model="m", messages=_many(51))  # type: ignore[arg-type]
    assert caught.value.status_code == 413
    assert "51 messages" in caught.value.message and "limits.max_messages" in caught.value.message
    client = closed_after_test(
        anthropic.Anthropic(base_url=limited.url, api_key="k", max_retries=0)
    )
    with pytest.raises(anthropic.APIStatusError) as refused:
        client.messages.create(model="m", max_tokens=5, messages=_many(51))  # type: ignore[arg-type]
    assert refused.value.status_code == 413
    assert refused.value.body["error"]["type"] == "request_too_large"  # type: ignore[index]
    gemini = httpx.post(
        f"{limited.url}/v1beta/models/g:generateContent",
        json={"contents": [{"role": "user", "parts": [{"text": "x"}]}] * 51},
    )
    assert gemini.status_code == 413 and gemini.json()["error"]["code"] == 413
    assert fake_llm.requests == []


@pytest.mark.parametrize(
    ("messages", "status", "setting"),
    [
        ([{"role": "user", "content": "x" * 5000}], 413, "limits.max_message_bytes"),
        ([{"role": "user", "content": "ü" * 2100}], 413, "limits.max_message_bytes"),
        (
            [
                {
                    "role": "user",
                    "content": [
                        {"type": "text", "text": "x", "n": [[[[[[[[[[[[[[[[[[1]]]]]]]]]]]]]]]]]]}
                    ],
                }
            ],
            400,
            "limits.max_json_depth",
        ),
    ],
)
def test_a_message_too_big_or_too_deep_is_refused_before_anything_goes_upstream(
    limited: Served, fake_llm: FakeLLMServer, messages: Any, status: int, setting: str
) -> None:
    response = httpx.post(
        f"{limited.url}/v1/chat/completions", json={"model": "m", "messages": messages}
    )
    assert response.status_code == status
    assert setting in response.json()["error"]["message"]
    assert fake_llm.requests == []


def test_the_default_limits_take_an_ordinary_long_chat(proxy: Served) -> None:
    reply = oa(proxy).chat.completions.create(model="m", messages=_many(2000))  # type: ignore[arg-type]
    assert reply.choices[0].message.content


# --------------------------------------------------------------------------- one request, others


def test_a_long_history_being_stored_holds_no_other_session(
    fake_llm: FakeLLMServer, engine: MemoryEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The store write of a 3,000-message history, made slow (a slow disk), does not hold a
    small request of another client: that one's exchange is stored and its reply received
    while the long one is still being written."""
    insert = memory_db.insert_turns
    written = 0
    writing = threading.Event()

    def slow_insert(conn: Any, session_id: str, rows: Any) -> list[int]:
        nonlocal written
        if len(rows) > 20:  # the long history's rows
            writing.set()
            time.sleep(len(rows) * 0.002)
            written += len(rows)
        return insert(conn, session_id, rows)

    assert isinstance(engine.store, sqlite_memory.MemoryStore)
    for module in (sqlite_memory, memory_branches):  # every SQLite path that writes turns
        monkeypatch.setattr(module, "insert_turns", slow_insert)
    config = ServerConfig(port=0, proxy=ProxySettings(upstream=fake_llm.url))
    with serve(config, engine) as served:
        big = threading.Thread(
            target=lambda: oa(served, "sk-a").chat.completions.create(
                model="m",
                messages=_many(3000),  # type: ignore[arg-type]
            )
        )
        big.start()
        assert writing.wait(60), "the long history was never written"
        small = oa(served, "sk-b").chat.completions.create(
            model="m", messages=[{"role": "user", "content": "Quick question?"}]
        )
        written_when_small_done = written
        big.join(120)
    assert small.choices[0].message.content
    assert written_when_small_done < 2999, "the small request waited for the whole write"
    # All of it, in the end: the 2,999 messages before the query are stored (and derived)
    # before its recall, the query with its reply by the commit.
    assert written >= 2999
    longest = max(engine.store.sessions(), key=engine.store.last_seq)
    assert engine.store.last_seq(longest) >= 3001
    stored = [t.message.text() for sid in engine.store.sessions() for t in engine.store.turns(sid)]
    assert "Quick question?" in stored


def test_a_body_over_one_mb_is_forwarded_whole_with_its_length(
    proxy: Served, fake_llm: FakeLLMServer
) -> None:
    text = "word " * 300_000  # 1.5 MB
    body = {"model": "m", "messages": [{"role": "user", "content": text}]}
    response = httpx.post(f"{proxy.url}/v1/chat/completions", json=body, timeout=60)
    assert response.status_code == 200
    received = fake_llm.requests[-1]
    assert received.body["messages"][-1]["content"].endswith(text)
    assert int(received.headers["content-length"]) == len(received.raw)


# --------------------------------------------------------------------------- loopback names


@pytest.mark.parametrize(("host", "status"), [("app.localhost", 200), ("rebound.example", 403)])
def test_the_dashboard_and_the_api_take_loopback_names_by_one_rule(
    proxy: Served, host: str, status: int
) -> None:
    headers = {"Host": f"{host}:{proxy.ports[0]}"}
    with httpx.Client(base_url=proxy.url, headers=headers) as client:
        api = client.post("/api/context", json={"query": "x", "tenant_ids": ["t"]})
        dashboard = client.get("/dashboard/api/records")
    assert (api.status_code, dashboard.status_code) == (status, status)
