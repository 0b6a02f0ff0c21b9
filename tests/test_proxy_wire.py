"""The proxy's pure parts: session tokens, request edits per wire format, SSE splitting, stream
accumulation with the marker, synthesized streams, the server config file and the CLI."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from hypothesis import given
from hypothesis import strategies as st

from contextfold.errors import ConfigError
from contextfold.items import ToolUseBlock
from contextfold.server.config import load_server_config
from contextfold.server.proxy.forward import upstream_url
from contextfold.server.proxy.session import (
    find_tokens,
    make_token,
    marker_text,
    strip_markers,
    verify_token,
)
from contextfold.server.proxy.stream import (
    SseSplitter,
    continuation,
    mark_json,
    reply_of,
    stream_state,
    synthesize,
)
from contextfold.server.proxy.wire import WIRES
from fake_llm import FakeLLMServer
from proxy_support import free_port

SECRET = b"test-secret"
TOKEN = make_token("p", "s1", 2, SECRET)
MARK = marker_text(TOKEN)


@pytest.mark.parametrize(
    "token",
    [
        make_token("p", "s1", 2, b"other secret"),
        make_token("another principal", "s1", 2, SECRET),
        make_token("p", "s1", 2, SECRET).replace(".2.", ".3."),  # another turn, same MAC
        "s1.2." + "0" * 32,
        "s1." + "0" * 32,
        "s1",
        "../etc.1.deadbeef",
        make_token("p", "s1", 2, SECRET)[:-1],
    ],
)
def test_tokens_that_do_not_verify_open_no_session(token: str) -> None:
    assert verify_token(token, "p", SECRET) is None
    assert verify_token(make_token("p", "s1", 2, SECRET), "p", SECRET) == ("s1", 2)


def test_markers_are_found_and_stripped_exactly() -> None:
    text = "Answer." + MARK
    assert strip_markers(text) == "Answer." and find_tokens(text) == [
        make_token("p", "s1", 2, SECRET)
    ]
    assert strip_markers("a" + MARK + "b") == "ab"  # inserted mid-text, removed exactly


# --------------------------------------------------------------------------- request edits

BODIES: dict[str, dict[str, Any]] = {
    "openai": {
        "model": "m",
        "messages": [
            {"role": "system", "content": "Sys."},
            {"role": "user", "content": "Q1"},
            {"role": "assistant", "content": "A1" + MARK},
            {"role": "user", "content": [{"type": "text", "text": "Q2"}, {"type": "image_url"}]},
        ],
    },
    "anthropic": {
        "model": "c",
        "system": "Sys.",
        "messages": [
            {"role": "user", "content": "Q1"},
            {"role": "assistant", "content": [{"type": "text", "text": "A1" + MARK}]},
            {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Q2"}]},
        ],
    },
    "gemini": {
        "systemInstruction": {"parts": [{"text": "Sys."}]},
        "contents": [
            {"role": "user", "parts": [{"text": "Q1"}]},
            {"role": "model", "parts": [{"text": "A1" + MARK}]},
            {"role": "user", "parts": [{"inlineData": {}}, {"text": "Q2"}]},
        ],
    },
}


@pytest.mark.parametrize("fmt", sorted(BODIES))
def test_strip_parse_and_inject_per_format(fmt: str) -> None:
    wire, body = WIRES[fmt], BODIES[fmt]
    original = json.dumps(body)
    stripped, tokens = wire.strip(body)
    assert tokens == [TOKEN] and "contextfold" not in json.dumps(stripped)
    parsed = wire.parse(stripped)
    assert [m.role for m in parsed.messages] == ["system", "user", "assistant", "user"]
    assert parsed.query_text == "Q2" and parsed.messages[2].text() == "A1"
    out = wire.inject(stripped, "MEMORY")
    text = json.dumps(out)
    # Memory goes at the very end: after the last user message's own text.
    assert text.index("Sys.") < text.index("Q1") < text.index("Q2") < text.index("MEMORY")
    items = out[wire.key]
    assert items[:-1] == stripped[wire.key][:-1]  # every message before the last: as sent
    assert json.dumps(body) == original  # the client's dicts are never mutated


def test_parse_maps_each_message_to_its_raw_source() -> None:
    body = {
        "messages": [
            {"role": "user", "content": "Weather?"},
            {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "w"}]},
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": "t1", "content": "sunny"},
                    {"type": "text", "text": "And tomorrow?"},
                ],
            },
        ]
    }
    parsed = WIRES["anthropic"].parse(body)
    assert [m.role for m in parsed.messages] == ["user", "assistant", "tool", "user"]
    assert parsed.sources == [(0,), (1,), (2,), (2,)] and parsed.query == 3
    openai = {
        "messages": [
            {"role": "assistant", "tool_calls": [
                {"id": "a", "type": "function", "function": {"name": "f", "arguments": "{}"}},
                {"id": "b", "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
            {"role": "tool", "tool_call_id": "a", "content": "1"},
            {"role": "tool", "tool_call_id": "b", "content": "2"},
        ]
    }  # fmt: skip
    assert WIRES["openai"].parse(openai).sources == [(0,), (1, 2)]


def test_anthropic_memory_goes_after_tool_results() -> None:
    message = {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t"}]}
    out = WIRES["anthropic"].inject({"messages": [message]}, "MEM")
    assert [b["type"] for b in out["messages"][0]["content"]] == ["tool_result", "text"]


def test_memory_tools_are_added_next_to_the_clients() -> None:
    client_tool = {"type": "function", "function": {"name": "mine"}}
    out = WIRES["openai"].add_tools({"tools": [client_tool]}, [{"function": {"name": "x"}}])
    assert out["tools"] == [client_tool, {"function": {"name": "x"}}]
    out = WIRES["gemini"].add_tools({}, [{"name": "find_quote"}])
    assert out["tools"] == [{"functionDeclarations": [{"name": "find_quote"}]}]


@pytest.mark.parametrize(
    ("base", "path", "query", "url"),
    [
        ("https://api.openai.com", "/v1/chat/completions", "", "https://api.openai.com/v1/chat/completions"),
        ("https://api.openai.com/v1/", "/v1/chat/completions", "", "https://api.openai.com/v1/chat/completions"),
        ("http://h:1/google", "/v1beta/models/g:generateContent", "key=k", "http://h:1/google/v1beta/models/g:generateContent?key=k"),
    ],
)  # fmt: skip
def test_upstream_url_joins_without_repeating_the_version(
    base: str, path: str, query: str, url: str
) -> None:
    assert upstream_url(base, path, query) == url


# --------------------------------------------------------------------------- responses


@pytest.mark.parametrize(
    ("fmt", "body"),
    [
        ("openai", {"choices": [{"message": {"content": None, "tool_calls": [
            {"id": "c", "function": {"name": "f", "arguments": '{"a": 1}'}}]}}]}),
        ("anthropic", {"content": [{"type": "tool_use", "id": "c", "name": "f",
                                    "input": {"a": 1}}]}),
        ("gemini", {"candidates": [{"content": {"parts": [
            {"functionCall": {"id": "c", "name": "f", "args": {"a": 1}}}]}}]}),
    ],
)  # fmt: skip
def test_a_tool_only_reply_gets_no_marker(fmt: str, body: dict[str, Any]) -> None:
    reply = reply_of(fmt, body)
    assert reply.calls == [ToolUseBlock(id="c", name="f", input={"a": 1})] and reply.text == ""
    assert reply.tool_only and mark_json(fmt, body, MARK) == body


@given(st.lists(st.integers(min_value=1, max_value=40), min_size=1, max_size=30))
def test_sse_splitter_gives_whole_events_whatever_the_chunking(cuts: list[int]) -> None:
    stream = b"".join(f'event: e\ndata: {{"n": {i}}}\n\n'.encode() for i in range(12))
    splitter, events, at = SseSplitter(), [], 0
    for size in cuts * 20:
        events += splitter.feed(stream[at : at + size])
        at += size
    events += splitter.feed(stream[at:])
    assert b"".join(events) == stream and len(events) == 12 and splitter.rest() == b""


@pytest.mark.parametrize("calls", [False, True])
@pytest.mark.parametrize("fmt", ["openai", "anthropic"])
def test_stream_state_accumulates_and_marks_once(fmt: str, calls: bool) -> None:
    body: dict[str, Any] = (
        {"id": "x", "model": "m", "choices": [{"index": 0, "finish_reason": "tool_calls",
         "message": {"content": "Hi there", "tool_calls": [
             {"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}}]}}]}
        if fmt == "openai"
        else {"id": "x", "model": "m", "stop_reason": "end_turn", "usage": {}, "content": [
            {"type": "text", "text": "Hi there"},
            {"type": "tool_use", "id": "c", "name": "f", "input": {}}]}
    )  # fmt: skip
    if not calls:
        if fmt == "openai":
            del body["choices"][0]["message"]["tool_calls"]
        else:
            body["content"] = body["content"][:1]
    state = stream_state(fmt, MARK)
    out = [
        piece for event in SseSplitter().feed(synthesize(fmt, body)) for piece in state.feed(event)
    ]
    out += state.finish()
    assert state.reply.text == "Hi there" and len(state.reply.calls) == calls
    marked = stream_state(fmt, None)
    for event in SseSplitter().feed(b"".join(out)):
        marked.feed(event)
    marked.finish()
    # A reply with a tool call gets no marker (the client is in a tool loop).
    assert marked.reply.text == "Hi there" + ("" if calls else MARK)


def test_continuation_answers_only_memory_calls() -> None:
    calls = [
        {"id": "m1", "type": "function", "function": {"name": "find_quote", "arguments": "{}"}},
        {"id": "c1", "type": "function", "function": {"name": "mine", "arguments": "{}"}},
    ]
    response = {"choices": [{"message": {"content": None, "tool_calls": calls}}]}
    call = ToolUseBlock(id="m1", name="find_quote", input={})
    out = continuation("openai", {"messages": []}, response, [(call, "[]")])
    assert [c["id"] for c in out["messages"][0]["tool_calls"]] == ["m1"]
    assert out["messages"][1] == {"role": "tool", "tool_call_id": "m1", "content": "[]"}


# --------------------------------------------------------------------------- config and CLI


def test_server_config_file_errors_name_the_field(tmp_path: Path) -> None:
    path = tmp_path / "server.yaml"
    path.write_text("port: 5757\nproxy:\n  instances:\n    - {name: a, port: 5757, upstream: x}\n")
    with pytest.raises(ConfigError) as caught:
        load_server_config(path)
    assert "proxy.instances.0.upstream" in str(caught.value)
    path.write_text(
        "proxy:\n  upstream: https://api.openai.com\n  instances:\n"
        "    - {name: claude, port: 5758, upstream: 'https://api.anthropic.com'}\n"
    )
    config = load_server_config(path)
    assert config.proxy.instances[0].upstream == "https://api.anthropic.com"


@pytest.mark.integration
def test_the_proxy_command_serves_and_stops_cleanly(
    tmp_path: Path, fake_llm: FakeLLMServer
) -> None:
    port = free_port()
    memory = tmp_path / "contextfold.yaml"
    memory.write_text(f"storage_path: {tmp_path / 'memory.db'}\nrecall:\n  embedder: none\n")
    command = [sys.executable, "-c", "from contextfold.cli import main; main()", "proxy"]
    command += ["--upstream", fake_llm.url, "--port", str(port), "--memory-config", str(memory)]
    process = subprocess.Popen(command, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                response = httpx.post(
                    f"http://127.0.0.1:{port}/v1/chat/completions",
                    json={"model": "m", "messages": [{"role": "user", "content": "hi"}]},
                )
                break
            except httpx.ConnectError:
                assert time.monotonic() < deadline and process.poll() is None
                time.sleep(0.2)
        assert response.status_code == 200 and response.headers["x-contextfold-session"]
        assert "contextfold:session=" not in response.text  # no marker text by default
    finally:
        process.send_signal(signal.SIGINT)
        _, stderr = process.communicate(timeout=60)
    assert process.returncode == 0, stderr
    assert f"listening on http://127.0.0.1:{port}" in stderr


@pytest.mark.parametrize("command", [["serve"], ["proxy", "--upstream", "http://127.0.0.1:9"]])
def test_serve_and_proxy_without_the_server_extra_name_it(
    command: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from typer.testing import CliRunner

    from contextfold.cli import app

    monkeypatch.chdir(tmp_path)
    for name in [m for m in sys.modules if m.startswith(("contextfold.server", "uvicorn"))]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "uvicorn", None)  # as if the extra were not installed
    result = CliRunner().invoke(app, command)
    assert result.exit_code == 2, result.output
    assert "the server needs the server extra (uvicorn is missing)" in result.stderr
    assert 'pip install "contextfold[server]"' in result.stderr
