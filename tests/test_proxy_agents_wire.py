"""Coding agents through the proxy (issue 20, points 1–3), on request shapes copied from what
the clients send: Claude Code 2.1.x (a ``system`` message inside ``messages``, ``anthropic-beta``
headers, ``system`` as text blocks with ``cache_control``, tool loops whose user messages hold
only ``tool_result`` blocks, thinking / image / document / server-tool blocks, up to four
breakpoints), OpenAI and Gemini agents.

- tolerant parsing: what is known is read, the rest is carried as sent and named in the notes;
- memory goes at the end of the request, after the last breakpoint; every byte before it is
  the client's, and every breakpoint survives (a property over random bodies);
- nothing the request holds is recalled again (the in-flight tool loop is history), nor an
  older version of a file it holds;
- no marker text by default; opted in, the marker goes into the last text block, never into
  tool-call or one-shot (helper) replies.

Request fixtures keep the clients' one-block-per-line shape, so some lines are long.
"""
# ruff: noqa: E501

from __future__ import annotations

import copy
import dataclasses
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import openai
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from contextfold.memory.engine import MemoryEngine
from contextfold.server.config import ProxySettings, ServerConfig
from contextfold.server.proxy.session import SESSION_HEADER, make_token, marker_text
from contextfold.server.proxy.stream import SseSplitter, stream_state, synthesize
from contextfold.server.proxy.wire import WIRES
from fake_llm import FakeLLMServer, ModelTurn, ToolCall
from proxy_support import Served, closed_after_test, make_engine, serve

BETA = "claude-code-20250219,interleaved-thinking-2025-05-14,context-management-2025-06-27"
CACHE = {"type": "ephemeral"}
MARK = marker_text(make_token("p", "s1", 2, b"secret"))


def breakpoints(value: Any) -> int:
    """How many ``cache_control`` breakpoints ``value`` holds."""
    return json.dumps(value).count('"cache_control"')


def claude_code_body(*, marker: str = "") -> dict[str, Any]:
    """A Claude Code 2.1.x request in the middle of a tool loop (shape as sent)."""
    return {
        "model": "claude-sonnet-4-6",
        "max_tokens": 32000,
        "stream": True,
        "system": [
            {"type": "text", "text": "You are Claude Code, Anthropic's official CLI for Claude."},
            {"type": "text", "text": "You are an interactive CLI tool.", "cache_control": CACHE},
        ],
        "tools": [
            {"name": "Read", "description": "Read a file", "input_schema": {"type": "object"}},
            {
                "name": "Bash",
                "description": "Run a command",
                "input_schema": {"type": "object"},
                "cache_control": CACHE,
            },
        ],
        "metadata": {"user_id": "user_abc_account__session_123"},
        "thinking": {"type": "enabled", "budget_tokens": 10000},
        "messages": [
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "<system-reminder>\nThe date is 2026-11-26.\n</system-reminder>"},
                    {"type": "text", "text": "Fix the failing test in calc.py"},
                    {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}},
                ],
            },
            {"role": "system", "content": "Plan mode is off. Tools may edit files."},
            {
                "role": "assistant",
                "content": [
                    {"type": "thinking", "thinking": "Read the file first.", "signature": "EqQBCkY"},
                    {"type": "redacted_thinking", "data": "EmwKAhgBEgy3"},
                    {"type": "text", "text": "I'll read the file." + marker},
                    {"type": "tool_use", "id": "toolu_01", "name": "Read", "input": {"file_path": "calc.py"}},
                ],
            },
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": "toolu_01", "content": [
                        {"type": "text", "text": "def add(a, b):\n    return a - b"},
                        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AA=="}},
                    ]},
                ],
            },
            {
                "role": "assistant",
                "content": [
                    {"type": "server_tool_use", "id": "srvtoolu_1", "name": "web_search", "input": {"query": "pytest"}},
                    {"type": "web_search_tool_result", "tool_use_id": "srvtoolu_1", "content": []},
                    {"type": "text", "text": "The bug is the minus sign."},
                    {"type": "tool_use", "id": "toolu_02", "name": "Bash", "input": {"command": "pytest"}},
                ],
            },
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": "toolu_02", "content": "1 failed", "is_error": True},
                    {"type": "document", "source": {"type": "text", "media_type": "text/plain", "data": "log"}},
                    {"type": "text", "text": "<system-reminder>Todo list is empty.</system-reminder>", "cache_control": CACHE},
                ],
            },
        ],
    }  # fmt: skip


# --------------------------------------------------------------------------- 1. tolerant parsing


def test_claude_code_2_1_body_is_parsed_not_refused() -> None:
    wire = WIRES["anthropic"]
    parsed = wire.parse(claude_code_body())
    roles = [m.role for m in parsed.messages]
    assert roles == ["system", "user", "system", "assistant", "tool", "assistant", "tool"]
    assert parsed.messages[2].text() == "Plan mode is off. Tools may edit files."
    assert parsed.sources[2] == (1,)  # the system message inside messages, at its own index
    # Claude Code's <system-reminder> blocks are its own context, not what the user said:
    # the query is the user's prompt, and the reminders are neither stored nor compared
    assert parsed.query_text == "Fix the failing test in calc.py"
    assert parsed.messages[1].text() == "Fix the failing test in calc.py"
    (note,) = parsed.notes
    for kind in ("'image' block,", "'image' block in a tool_result", "'thinking' block", "'redacted_thinking' block",
                 "'document' block", "'server_tool_use' block", "'web_search_tool_result'",
                 "system-reminder text block ×2"):  # fmt: skip
        assert kind in note


@pytest.mark.parametrize(
    ("fmt", "body", "roles", "unread"),
    [
        (
            "anthropic",
            {"messages": [
                {"role": "user", "content": "Hi"},
                {"role": "critic", "content": "A role from the future."},
                {"role": "assistant", "content": [{"type": "text"}, {"type": "text", "text": "Hello"}]},
                {"role": "user", "content": [{"type": "tool_result"}, {"type": "text", "text": "Go"}]},
            ]},
            ["user", "assistant", "user"],
            ["role 'critic'", "'text' block", "'tool_result' block"],
        ),
        (
            "openai",
            {"messages": [
                {"role": "developer", "content": "Be brief."},
                {"role": "user", "content": [{"type": "text", "text": "Hi"},
                                             {"type": "input_audio", "input_audio": {}}]},
                {"role": "function", "name": "f", "content": "legacy"},
                {"role": "assistant", "content": [{"type": "refusal", "refusal": "No."}],
                 "tool_calls": [{"id": "c1", "type": "custom", "custom": {"name": "x", "input": "y"}},
                                {"id": "c2", "type": "function",
                                 "function": {"name": "g", "arguments": "{}"}}]},
                {"role": "tool", "tool_call_id": "c2", "content": None},
                {"role": "user", "content": "Next"},
            ]},
            ["system", "user", "assistant", "tool", "user"],
            ["'input_audio' part", "role 'function'", "'refusal' part", "'custom' tool call"],
        ),
        (
            "gemini",
            {"contents": [
                {"role": "user", "parts": [{"text": "Hi"}, {"inlineData": {"mimeType": "image/png"}}]},
                {"role": "model", "parts": [{"text": "thinking…", "thought": True},
                                            {"executableCode": {"code": "1"}}, {"text": "Hello"}]},
                {"role": "critic", "parts": [{"text": "?"}]},
                {"role": "user", "parts": [{"text": "Go"}]},
            ]},
            ["user", "assistant", "user"],
            ["'inlineData' part", "thought part", "'executableCode' part", "role 'critic'"],
        ),
    ],
)  # fmt: skip
def test_unknown_roles_blocks_and_fields_are_carried_and_noted(
    fmt: str, body: dict[str, Any], roles: list[str], unread: list[str]
) -> None:
    parsed = WIRES[fmt].parse(body)
    assert [m.role for m in parsed.messages] == roles
    notes = " ".join(parsed.notes)
    for kind in unread:
        assert kind in notes


# --------------------------------------------------------------------------- 3. breakpoints


def test_a_stripped_marker_block_hands_its_breakpoint_to_the_block_before() -> None:
    body = {
        "messages": [
            {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": [
                {"type": "text", "text": "Answer."},
                {"type": "text", "text": MARK.lstrip(), "cache_control": CACHE},
            ]},
            {"role": "user", "content": [{"type": "text", "text": "More", "cache_control": CACHE}]},
        ]
    }  # fmt: skip
    stripped, tokens = WIRES["anthropic"].strip(body)
    assert tokens and "contextfold" not in json.dumps(stripped)
    assert stripped["messages"][1]["content"] == [
        {"type": "text", "text": "Answer.", "cache_control": CACHE}
    ]
    assert breakpoints(stripped) == breakpoints(body) == 2
    # No block before it: the breakpoint goes to the block after it.
    alone = {"messages": [{"role": "assistant", "content": [
        {"type": "text", "text": MARK.lstrip(), "cache_control": CACHE},
        {"type": "tool_use", "id": "t", "name": "f", "input": {}}]}]}  # fmt: skip
    stripped, _ = WIRES["anthropic"].strip(alone)
    assert stripped["messages"][0]["content"] == [
        {"type": "tool_use", "id": "t", "name": "f", "input": {}, "cache_control": CACHE}
    ]
    # Neither neighbour can take it (each has its own): the block stays where it was.
    crowded = [
        {"type": "text", "text": "A.", "cache_control": CACHE},
        {"type": "text", "text": MARK.lstrip(), "cache_control": CACHE},
        {"type": "tool_use", "id": "t", "name": "f", "input": {}, "cache_control": CACHE},
    ]
    body = {"messages": [{"role": "assistant", "content": crowded}]}
    stripped, _ = WIRES["anthropic"].strip(body)
    assert stripped["messages"][0]["content"] == crowded and breakpoints(stripped) == 3


def test_memory_goes_after_the_last_breakpoint_in_each_format() -> None:
    body = claude_code_body()
    out = WIRES["anthropic"].inject(body, "MEMORY")
    assert out["messages"][:-1] == body["messages"][:-1] and out["system"] == body["system"]
    assert out["messages"][-1]["content"] == [
        *body["messages"][-1]["content"],
        {"type": "text", "text": "MEMORY"},
    ]
    # OpenAI: a tool message takes no extra text; a user message follows the tool results.
    calls = [{"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}}]
    openai_body = {"messages": [
        {"role": "user", "content": "Run it"},
        {"role": "assistant", "content": None, "tool_calls": calls},
        {"role": "tool", "tool_call_id": "c", "content": "ok"},
    ]}  # fmt: skip
    out = WIRES["openai"].inject(openai_body, "MEMORY")
    assert out["messages"] == [*openai_body["messages"], {"role": "user", "content": "MEMORY"}]
    # Gemini: a part after the last user turn's parts; after a function turn, a user turn.
    gemini = {"contents": [{"role": "user", "parts": [{"text": "Q"}]}]}
    assert WIRES["gemini"].inject(gemini, "M")["contents"][0]["parts"] == [
        {"text": "Q"},
        {"text": "M"},
    ]
    gemini = {"contents": [*gemini["contents"], {"role": "function", "parts": [
        {"functionResponse": {"name": "f", "response": {}}}]}]}  # fmt: skip
    out = WIRES["gemini"].inject(gemini, "M")
    assert out["contents"] == [*gemini["contents"], {"role": "user", "parts": [{"text": "M"}]}]


_TEXT = st.text(alphabet="abcdefgh .\n", min_size=1, max_size=20)


@st.composite
def anthropic_bodies(draw: st.DrawFn) -> dict[str, Any]:
    """Alternating user/assistant messages of text, tool_use/tool_result, thinking and image
    blocks, some text blocks carrying a marker, up to 4 ``cache_control`` breakpoints."""
    blocks: list[tuple[int, dict[str, Any]]] = []
    messages: list[dict[str, Any]] = []
    for n in range(draw(st.integers(1, 4)) * 2 - 1):
        role = "user" if n % 2 == 0 else "assistant"
        if draw(st.booleans()) and n > 0:
            messages.append({"role": role, "content": draw(_TEXT)})
            continue
        content: list[dict[str, Any]] = []
        if role == "user" and n > 0 and draw(st.booleans()):
            content.append(
                {"type": "tool_result", "tool_use_id": f"t{n - 1}", "content": draw(_TEXT)}
            )
        for _ in range(draw(st.integers(0 if content else 1, 3))):
            kind = draw(st.sampled_from(["text", "text", "image", "thinking"]))
            if kind == "text":
                text = draw(_TEXT)
                if role == "assistant" and draw(st.booleans()):
                    text = draw(st.sampled_from(["", text])) + MARK  # a marker, maybe alone
                content.append({"type": "text", "text": text})
            elif kind == "image":
                content.append({"type": "image", "source": {"type": "base64", "data": "AA=="}})
            elif role == "assistant":
                content.append({"type": "thinking", "thinking": draw(_TEXT), "signature": "s"})
        if role == "assistant" and draw(st.booleans()):
            content.append({"type": "tool_use", "id": f"t{n}", "name": "f", "input": {}})
        if not content:
            content.append({"type": "text", "text": draw(_TEXT)})
        blocks += [(len(messages), b) for b in content]
        messages.append({"role": role, "content": content})
    marked = (
        draw(st.lists(st.sampled_from(range(len(blocks))), max_size=4, unique=True))
        if blocks
        else []
    )
    for i in marked:
        blocks[i][1]["cache_control"] = {"type": "ephemeral"}
    return {"model": "claude", "max_tokens": 100, "system": [
        {"type": "text", "text": "Sys.", "cache_control": {"type": "ephemeral"}}], "messages": messages}  # fmt: skip


@settings(max_examples=300, deadline=None)
@given(anthropic_bodies(), _TEXT)
def test_forwarded_anthropic_body_is_the_clients_up_to_the_appended_memory(
    body: dict[str, Any], memory: str
) -> None:
    wire = WIRES["anthropic"]
    sent = copy.deepcopy(body)
    stripped, _ = wire.strip(body)
    wire.parse(stripped)  # never raises on these shapes
    out = wire.inject(stripped, memory)
    assert body == sent  # the client's body is never mutated
    assert breakpoints(out) == breakpoints(body)  # every breakpoint survives
    # A marker stays only where its block held nothing else and its breakpoint had nowhere
    # to go (the blocks beside it carry their own): the breakpoint wins.
    for message in out["messages"]:
        for block in message["content"] if isinstance(message["content"], list) else []:
            if "contextfold:session" in json.dumps(block):
                assert not block["text"].replace(MARK, "").strip() and "cache_control" in block
    # Everything but the last message, system and tools included, is the client's (markers
    # aside); the last message is the client's with the memory after all of it.
    assert {k: v for k, v in out.items() if k != "messages"} == {
        k: v for k, v in body.items() if k != "messages"
    }
    assert out["messages"][:-1] == stripped["messages"][:-1]
    last, before = out["messages"][-1], stripped["messages"][-1]
    if isinstance(before["content"], str):
        assert last["content"] == before["content"] + "\n\n" + memory
    else:
        assert last["content"] == [*before["content"], {"type": "text", "text": memory}]
    if "contextfold" not in json.dumps(body):  # no marker to strip: untouched byte for byte
        assert out["messages"][:-1] == body["messages"][:-1]


# --------------------------------------------------------------------------- the live proxy


def _lenient(fake: FakeLLMServer) -> None:
    """The fake Anthropic answers requests with a ``system`` message inside ``messages`` as
    the real API now does for Claude Code 2.1.x (the request is still recorded as sent)."""

    def handler(request: Any, match: re.Match[str]) -> Any:
        body = dict(request.body)
        body["messages"] = [m for m in body["messages"] if m.get("role") != "system"]
        return fake._anthropic_messages(dataclasses.replace(request, body=body), match)

    fake.route("POST", r"/v1/messages", handler)


@pytest.fixture
def proxy(fake_llm: FakeLLMServer, engine: MemoryEngine) -> Iterator[Served]:
    _lenient(fake_llm)
    with serve(ServerConfig(port=0, proxy=ProxySettings(upstream=fake_llm.url)), engine) as s:
        yield s


def an(served: Served) -> anthropic.Anthropic:
    return closed_after_test(
        anthropic.Anthropic(base_url=served.url, api_key="sk-ant-test", max_retries=0)
    )


def oa(served: Served) -> openai.OpenAI:
    return closed_after_test(
        openai.OpenAI(base_url=f"{served.url}/v1", api_key="sk-test", max_retries=0)
    )


def _create(client: anthropic.Anthropic, body: dict[str, Any]) -> Any:
    kwargs = {k: v for k, v in body.items() if k not in ("stream",)}
    kwargs["max_tokens"] = 1024  # the SDK wants a stream above that
    return client.messages.create(**kwargs, extra_headers={"anthropic-beta": BETA})


def test_claude_code_2_1_requests_are_stored_and_continued(
    proxy: Served, fake_llm: FakeLLMServer, engine: MemoryEngine
) -> None:
    fake_llm.reply = "The test passes now."
    body = claude_code_body()
    first = _create(an(proxy), body)
    assert first.content[-1].text == "The test passes now."  # no marker text by default
    upstream = fake_llm.requests[-1]
    assert upstream.headers["anthropic-beta"] == BETA
    assert upstream.body["messages"][:-1] == body["messages"][:-1]  # as sent, up to memory
    body["messages"] += [
        {"role": "assistant", "content": [{"type": "text", "text": first.content[-1].text}]},
        {"role": "user", "content": [{"type": "text", "text": "Commit it."}]},
    ]
    _create(an(proxy), body)
    proxy.drain()
    one, two = proxy.events.recent()[-2:]
    assert one.error is None and two.error is None  # memory was on for both
    assert "not read, forwarded as sent" in " ".join(one.extra["notes"])
    assert two.session_id == one.session_id and two.extra["session_source"] == "history"
    texts = [t.message.text() for t in engine.store.turns(one.session_id)]
    assert "Fix the failing test in calc.py" in texts[0] and texts[-1] == "The test passes now."
    assert not any("Plan mode is off" in t for t in texts)  # instructions are not turns


def test_an_agent_tool_loop_gets_no_memory_of_itself_and_keeps_its_prefix(
    proxy: Served, fake_llm: FakeLLMServer
) -> None:
    """A tool loop: each request is the last one plus the call and its result. The upstream
    body equals the client's in every message (nothing of the loop is recalled into it), and
    every breakpoint is still there."""
    steps = iter([ModelTurn(text="", tool_calls=(ToolCall("Bash", {"command": f"step {i}"}),))
                  for i in range(4)] + [ModelTurn(text="All done.")])  # fmt: skip
    fake_llm.reply = lambda _: next(steps)
    client = an(proxy)
    messages: list[Any] = [
        {"role": "user", "content": [
            {"type": "text", "text": "Run the build and fix every warning in the parser module."},
            {"type": "text", "text": "Context: the repository uses make.", "cache_control": CACHE}]},
    ]  # fmt: skip
    system = [{"type": "text", "text": "You are an agent.", "cache_control": CACHE}]
    for step in range(5):
        reply = client.messages.create(
            model="claude-x", max_tokens=512, system=system, messages=messages
        )
        upstream = fake_llm.requests[-1].body
        assert upstream["messages"] == messages, f"step {step}: the request was changed"
        assert upstream["system"] == system and breakpoints(upstream) == breakpoints(messages) + 1
        if reply.stop_reason != "tool_use":
            break
        call = reply.content[-1]
        messages = [
            *[{**m, "content": [{k: v for k, v in b.items() if k != "cache_control"}
                                for b in m["content"]]} for m in messages],
            {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in reply.content]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call.id,
                                          "content": f"warning {step}: unused import in parser.py",
                                          "cache_control": CACHE}]},
        ]  # fmt: skip
        proxy.drain()
    assert reply.content[-1].text == "All done."


def test_recalled_memory_goes_at_the_end_after_the_tool_results(
    proxy: Served, fake_llm: FakeLLMServer
) -> None:
    client = an(proxy)
    fake_llm.reply = "Noted."
    history: list[Any] = [
        {"role": "user", "content": "The deploy key lives in vault path kv/ops/deploy."}
    ]
    for question in ["Plan the release.", "Where does the deploy key live? Check deploy.sh."]:
        reply = client.messages.create(model="c", max_tokens=64, messages=history)
        history += [{"role": "assistant", "content": reply.content[0].text},
                    {"role": "user", "content": [{"type": "text", "text": question}]}]  # fmt: skip
        proxy.drain()
    fake_llm.reply = lambda _: ModelTurn(tool_calls=(ToolCall("Read", {"path": "deploy.sh"}),))
    reply = client.messages.create(model="c", max_tokens=64, messages=history)
    proxy.drain()
    # The agent's context trims the front; its tool loop goes on: memory comes back, at the end.
    fake_llm.reply = "Use kv/ops/deploy."
    trimmed = [
        history[-1],
        {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in reply.content]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": reply.content[-1].id,
                                      "content": "#!/bin/sh\nmake deploy", "cache_control": CACHE}]},
    ]  # fmt: skip
    client.messages.create(model="c", max_tokens=64, messages=trimmed)
    upstream = fake_llm.requests[-1].body["messages"]
    assert upstream[:-1] == trimmed[:-1]  # messages[0] is the client's, byte for byte
    *kept, memory = upstream[-1]["content"]
    assert kept == trimmed[-1]["content"] and memory["type"] == "text"
    assert "kv/ops/deploy" in memory["text"] and "cache_control" not in memory
    assert "make deploy" not in memory["text"]  # nothing the request holds comes back


def test_no_marker_text_by_default_and_the_history_continues_the_session(
    proxy: Served, fake_llm: FakeLLMServer
) -> None:
    fake_llm.reply = "Paris."
    client = oa(proxy)
    history: list[Any] = [{"role": "user", "content": "Capital of France?"}]
    raw = client.chat.completions.with_raw_response.create(model="m", messages=history)
    first = raw.parse().choices[0].message.content
    assert first == "Paris." and raw.headers[SESSION_HEADER]
    stream = client.chat.completions.create(
        model="m", messages=[*history, {"role": "assistant", "content": first},
                             {"role": "user", "content": "And Italy?"}], stream=True)  # fmt: skip
    assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices) == "Paris."
    proxy.drain()
    one, two = proxy.events.recent()[-2:]
    assert two.session_id == one.session_id and two.extra["session_source"] == "history"


# --------------------------------------------------------------------------- markers opted in


@pytest.fixture
def marking(fake_llm: FakeLLMServer, engine: MemoryEngine) -> Iterator[Served]:
    config = ServerConfig(port=0, proxy=ProxySettings(upstream=fake_llm.url, markers=True))
    with serve(config, engine) as served:
        yield served


def _two_blocks(_: Any) -> Any:
    return ModelTurn(text="Answer.")


@pytest.mark.parametrize("stream", [False, True])
def test_an_opted_in_marker_goes_into_the_last_text_block(
    marking: Served, fake_llm: FakeLLMServer, stream: bool
) -> None:
    fake_llm.reply = "The answer."
    client = an(marking)
    history: list[Any] = [{"role": "user", "content": "Question one?"}]
    first = client.messages.create(model="c", max_tokens=64, messages=history)
    # A one-shot request (what helper calls look like) gets no marker.
    assert [b.text for b in first.content] == ["The answer."]
    history += [{"role": "assistant", "content": "The answer."},
                {"role": "user", "content": "Question two?"}]  # fmt: skip
    if stream:
        with client.messages.stream(model="c", max_tokens=64, messages=history) as events:
            message = events.get_final_message()
    else:
        message = client.messages.create(model="c", max_tokens=64, messages=history)
    (block,) = message.content  # no block of its own: the last block carries the marker
    assert block.text.startswith("The answer.\n\n<!-- contextfold:session=")


def test_a_stream_marker_is_a_delta_into_the_last_text_block() -> None:
    body = {"id": "x", "model": "m", "stop_reason": "end_turn", "usage": {}, "content": [
        {"type": "text", "text": "First part."}, {"type": "text", "text": "Last part."}]}  # fmt: skip
    state = stream_state("anthropic", MARK)
    out = [p for e in SseSplitter().feed(synthesize("anthropic", body)) for p in state.feed(e)]
    out += state.finish()
    events = [json.loads(e.split(b"data: ", 1)[1]) for e in SseSplitter().feed(b"".join(out))]
    starts = [e for e in events if e["type"] == "content_block_start"]
    assert len(starts) == 2  # no extra block
    deltas = [e for e in events if e["type"] == "content_block_delta"]
    assert deltas[-1] == {"type": "content_block_delta", "index": 1,
                          "delta": {"type": "text_delta", "text": MARK}}  # fmt: skip
    kinds = [e["type"] for e in events]
    assert kinds.index("message_delta") > len(kinds) - 3  # the held stop went out before it
    assert kinds[-3:] == ["content_block_stop", "message_delta", "message_stop"]


# --------------------------------------------------------------------------- older versions

CALC_V1 = """calc.py
def add(a, b):
    return a - b  # the bug

def multiply(a, b):
    return a * b

def divide(a, b):
    return a / b
"""
CALC_V2 = CALC_V1.replace("return a - b  # the bug", "return a + b")


def test_an_older_version_of_a_file_the_request_holds_is_not_recalled(tmp_path: Path) -> None:
    """The rule (``memory.assemble.Held``): a recalled turn of 3+ lines of 8+ characters is
    left out when half or more of those lines are in the request already."""
    with make_engine(tmp_path) as memory:
        memory.on_turn_complete(
            [
                {"role": "user", "content": "Here is the file:\n" + CALC_V1},
                {"role": "assistant", "content": "I see the add function subtracts."},
                {"role": "user", "content": "Let us talk about the weekend."},
                {"role": "assistant", "content": "Sure, what are the plans?"},
            ],
            session_id="s",
        )
        question = "What does the add function in calc.py return?"
        unrelated = [{"role": "user", "content": "Something else entirely."}]
        recalled = memory.on_message_inbound(question, unrelated, session_id="s")
        assert "return a - b" in recalled.prepend_text  # control: v1 is recalled
        edited = [{"role": "user", "content": "The file now:\n" + CALC_V2}]
        recalled = memory.on_message_inbound(question, edited, session_id="s")
        assert "return a - b" not in recalled.prepend_text
        assert recalled.budget.turns_held == 1


def test_a_pre_edit_copy_of_a_file_is_not_injected_beside_the_new_one(
    proxy: Served, fake_llm: FakeLLMServer
) -> None:
    """aider resends the files in the chat with every request; after an edit, the stored
    pre-edit copy must not come back as memory beside the new one."""
    fake_llm.reply = "Understood."
    client = oa(proxy)
    history: list[Any] = [{"role": "user", "content": "I added calc.py to the chat:\n" + CALC_V1}]
    for text in ["Explain the divide function.", "What is the weather like?"]:
        reply = client.chat.completions.create(model="m", messages=history)
        history += [{"role": "assistant", "content": reply.choices[0].message.content},
                    {"role": "user", "content": text}]  # fmt: skip
        proxy.drain()
    client.chat.completions.create(model="m", messages=history)
    proxy.drain()
    last = {"role": "assistant", "content": "Understood."}
    question = "What does the add function in calc.py return?"
    # Control: the client trims its history to the last reply; the stored file comes back.
    client.chat.completions.create(
        model="m", messages=[last, {"role": "user", "content": question}]
    )
    assert "return a - b" in json.dumps(fake_llm.requests[-1].body)
    # With the edited file in the request, its pre-edit copy is not recalled beside it.
    edited = {"role": "user", "content": "The true contents of calc.py now:\n" + CALC_V2}
    client.chat.completions.create(
        model="m", messages=[last, edited, {"role": "user", "content": question}]
    )
    body = json.dumps(fake_llm.requests[-1].body)
    assert "return a + b" in body and "return a - b" not in body
    proxy.drain()
    assert "older versions" in " ".join(proxy.events.recent()[-1].extra["notes"])
