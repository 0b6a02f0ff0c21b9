"""Tool-output compaction (issue 20, point 5): long agent sessions are brought under their
limit by stubbing old tool outputs, every call stays paired with its result, the bytes before
the newest stub do not change between compaction events, and the model can read a stubbed
output again through the proxy's restore tool."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import anthropic
import openai
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from contextfold.memory.engine import MemoryEngine
from contextfold.server.config import OutputSettings, ProxySettings, ServerConfig
from contextfold.server.proxy.outputs import RESTORE_TOOL, compact, stub_text, window_of
from fake_llm import FakeLLMServer, ModelTurn, ToolCall
from proxy_support import closed_after_test, serve

LIMIT = 4000
SETTINGS = OutputSettings(compact_above=LIMIT, keep_recent=2, min_tokens=50)


def _strings(value: Any) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [*value.keys(), *(s for v in value.values() for s in _strings(v))]
    if isinstance(value, list):
        return [s for v in value for s in _strings(v)]
    return []


def _size(body: dict[str, Any]) -> int:
    """The rule's size in tokens: the body as JSON (``json.dumps``), its strings' escapes not
    counted (a newline is one character of the text, not two), a token per 3 characters."""
    text = json.dumps(body, ensure_ascii=False)
    escapes = sum(len(json.dumps(s, ensure_ascii=False)) - len(s) - 2 for s in _strings(body))
    return -(-(len(text) - escapes) // 3)


def _session(fmt: str, outputs: list[int]) -> list[dict[str, Any]]:
    """An agent session: a prompt, then one tool call and its output of ``n`` characters per
    entry (each a different file), the output text unique."""
    messages: list[dict[str, Any]] = [{"role": "user", "content": "Fix the failing test."}]
    for i, n in enumerate(outputs):
        ref = f"call_{i}"
        text = f"file {i}\n" + "".join(f"line {j} of file {i}\n" for j in range(n // 20 + 1))
        text = text[: max(n, 10)]
        if fmt == "anthropic":
            messages.append(
                {
                    "role": "assistant",
                    "content": [{"type": "tool_use", "id": ref, "name": "Read", "input": {"i": i}}],
                }
            )
            messages.append(
                {
                    "role": "user",
                    "content": [{"type": "tool_result", "tool_use_id": ref, "content": text}],
                }
            )
        else:
            call = {"id": ref, "type": "function", "function": {"name": "read", "arguments": "{}"}}
            messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
            messages.append({"role": "tool", "tool_call_id": ref, "content": text})
    return messages


def _pairs(fmt: str, messages: list[dict[str, Any]]) -> list[str]:
    """The tool-result references, in order."""
    if fmt == "openai":
        return [m["tool_call_id"] for m in messages if m.get("role") == "tool"]
    return [
        b["tool_use_id"]
        for m in messages
        if isinstance(m["content"], list)
        for b in m["content"]
        if b.get("type") == "tool_result"
    ]


@settings(max_examples=60, deadline=None)
@given(
    fmt=st.sampled_from(["openai", "anthropic"]),
    sizes=st.lists(st.integers(min_value=10, max_value=6000), min_size=1, max_size=40),
)
def test_a_growing_session_stays_paired_bounded_and_stable_between_events(
    fmt: str, sizes: list[int]
) -> None:
    full = _session(fmt, sizes)
    previous: tuple[int, list[dict[str, Any]], list[str]] | None = None
    for steps in range(1, len(sizes) + 1):
        body = {"model": "m", "messages": full[: 1 + 2 * steps]}
        out, done = compact(fmt, body, SETTINGS)
        assert _pairs(fmt, out["messages"]) == _pairs(fmt, body["messages"])  # all paired
        assert len(out["messages"]) == len(body["messages"])
        refs, originals = _pairs(fmt, body["messages"]), _outputs_of(fmt, body["messages"])
        total = _size(body)
        if done is None:
            assert out is body
            previous = None
            continue
        assert total > LIMIT
        assert not set(done.stubbed) & set(refs[-SETTINGS.keep_recent :])  # newest kept
        for ref in done.stubbed:
            assert done.restore(ref) == originals[ref]
        assert _outputs_of(fmt, out["messages"]).keys() == originals.keys()
        if done.saved >= done.need:  # enough to stub: the request ends under its limit
            assert _size(out) <= LIMIT
        bucket = (total - LIMIT) // (LIMIT // 2)
        if previous is not None and previous[0] == bucket:
            # the same bucket: the same outputs stubbed, the earlier bytes unchanged
            assert done.stubbed == previous[2]
            assert out["messages"][: len(previous[1])] == previous[1]
        settled = done.saved >= done.need
        previous = (bucket, out["messages"], done.stubbed) if settled else None


def _outputs_of(fmt: str, messages: list[dict[str, Any]]) -> dict[str, str]:
    if fmt == "openai":
        return {m["tool_call_id"]: m["content"] for m in messages if m.get("role") == "tool"}
    return {
        b["tool_use_id"]: b["content"]
        for m in messages
        if isinstance(m["content"], list)
        for b in m["content"]
        if b.get("type") == "tool_result"
    }


def test_stubs_say_what_was_there_and_the_restore_tool_gives_it_back() -> None:
    messages = _session("anthropic", [12_000, 12_000, 300, 300])
    body = {"model": "m", "messages": messages}
    out, done = compact("anthropic", body, SETTINGS)
    assert done is not None and done.stubbed == ["call_0", "call_1"]
    original = messages[2]["content"][0]["content"]
    stub = out["messages"][2]["content"][0]["content"]
    assert stub == stub_text("call_0", original) and "file 0" in stub and "call_0" in stub
    assert len(stub) < 400 < len(original)
    assert done.answer({"ref": "call_0"}) == original
    assert "error" in json.loads(done.answer({"ref": "call_9"}))
    assert "error" in json.loads(done.answer({}))
    assert done.tokens_after < done.tokens_before
    # the client's body is untouched (the stubs are in a copy)
    assert messages[2]["content"][0]["content"] == original


def test_outputs_with_images_and_small_or_recent_ones_are_never_stubbed() -> None:
    messages = _session("anthropic", [9000, 9000, 9000])
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "x"}}
    messages[2]["content"][0]["content"] = [{"type": "text", "text": "y" * 9000}, image]
    body = {"model": "m", "messages": messages}
    _, done = compact("anthropic", body, OutputSettings(compact_above=1000, keep_recent=1))
    assert done is not None and done.stubbed == ["call_1"]  # call_0 has an image; call_2 recent
    off = OutputSettings(compact_above=1000, compact=False)
    assert compact("anthropic", body, off) == (body, None)


def test_the_limit_follows_the_models_window_when_not_set() -> None:
    assert window_of("claude-sonnet-4-5-20250929") == 200_000
    assert window_of("openai/gpt-4o-mini") == 128_000
    assert window_of("my-local-model") is None
    big = {"model": "my-local-model", "messages": _session("openai", [40_000] * 12)}
    assert _size(big) > 96_000
    assert compact("openai", big, OutputSettings())[1] is None  # unknown window: left alone
    big["model"] = "gpt-4o"  # the body's model, unless the caller names one
    out, done = compact("openai", big, OutputSettings())
    assert done is not None and done.limit == 96_000 and _size(out) < 96_000
    assert compact("openai", big, OutputSettings(), "my-local-model")[1] is None


# --------------------------------------------------------------------------- through the proxy


def _config(fake: FakeLLMServer) -> ServerConfig:
    outputs = OutputSettings(compact_above=2000, keep_recent=1, min_tokens=100)
    proxy = ProxySettings(upstream=fake.url, tool_outputs=outputs, markers=False)
    return ServerConfig(port=0, proxy=proxy)


@pytest.mark.parametrize("stream", [False, True])
def test_the_model_restores_a_stubbed_output_through_the_proxy(
    fake_llm: FakeLLMServer, tmp_path: Path, stream: bool
) -> None:
    """The real anthropic SDK sends a long tool session; the proxy stubs the old output,
    offers the restore tool, answers the model's call to it with the original text, and the
    client sees only the final answer."""
    messages = _session("anthropic", [20_000, 2_000])
    original = messages[2]["content"][0]["content"]

    def answer(body: dict[str, Any]) -> ModelTurn:
        last = body["messages"][-1]["content"]
        restored = [b for b in last if isinstance(b, dict) and b.get("tool_use_id") == "restore_1"]
        if restored:
            return ModelTurn(text=f"Restored {len(restored[0]['content'])} characters.")
        return ModelTurn(tool_calls=(ToolCall(RESTORE_TOOL, {"ref": "call_0"}, "restore_1"),))

    fake_llm.reply = answer
    with (
        MemoryEngine(store=tmp_path / "m.db", embedder=None) as engine,
        serve(_config(fake_llm), engine) as served,
    ):
        client = closed_after_test(
            anthropic.Anthropic(base_url=served.url, api_key="sk-test", max_retries=0)
        )
        tools = [{"name": "Read", "description": "read a file", "input_schema": {"type": "object"}}]
        if stream:
            with client.messages.stream(
                model="claude-x", max_tokens=100, messages=messages, tools=tools
            ) as events:
                reply = events.get_final_message()
        else:
            reply = client.messages.create(
                model="claude-x", max_tokens=100, messages=messages, tools=tools
            )
        assert [b.type for b in reply.content] == ["text"]
        assert reply.content[0].text == f"Restored {len(original)} characters."
        first, second = (r.body for r in fake_llm.requests[-2:])
        stubbed = first["messages"][2]["content"][0]["content"]
        assert stubbed == stub_text("call_0", original)
        assert first["messages"][4] == messages[4]  # the recent output, as sent
        assert [t["name"] for t in first["tools"]] == ["Read", RESTORE_TOOL]
        # the model's restore call is answered with the original output
        assert second["messages"][-1]["content"][0]["content"] == original


def test_openai_tool_sessions_are_compacted_through_the_proxy(
    fake_llm: FakeLLMServer, tmp_path: Path
) -> None:
    messages = _session("openai", [20_000, 2_000])
    fake_llm.reply = "Done."
    with (
        MemoryEngine(store=tmp_path / "m.db", embedder=None) as engine,
        serve(_config(fake_llm), engine) as served,
    ):
        client = closed_after_test(
            openai.OpenAI(base_url=f"{served.url}/v1", api_key="sk-test", max_retries=0)
        )
        reply = client.chat.completions.create(model="gpt-x", messages=messages)  # type: ignore[arg-type]
        assert reply.choices[0].message.content == "Done."
        sent = fake_llm.requests[-1].body
        assert sent["messages"][2]["content"] == stub_text("call_0", messages[2]["content"])
        assert sent["messages"][4]["content"] == messages[4]["content"]
        assert sent["tools"][-1]["function"]["name"] == RESTORE_TOOL


def test_the_default_limit_stays_within_the_memorys_window(
    fake_llm: FakeLLMServer, tmp_path: Path
) -> None:
    """A model whose window the table knows (200k for Claude) behind a memory configured for
    a smaller window: the default limit (three quarters of 200k) would let a tool session grow
    past ``context_window``; it is capped by what the window leaves the client's messages
    (the reply's reserve and the memory budget taken off), so the request goes stubbed and
    within the window."""
    from contextfold.memory.config import MemoryConfig
    from contextfold.tokens import TiktokenCounter
    from proxy_support import tokens_sent

    messages = _session("anthropic", [24_000] * 5)  # about 40k tokens of tool outputs
    fake_llm.reply = "Done."
    config = MemoryConfig.model_validate({"context_window": 20_000})
    outputs = OutputSettings(keep_recent=1)  # the limit left to its default
    proxy = ProxySettings(upstream=fake_llm.url, tool_outputs=outputs, markers=False)
    with (
        MemoryEngine(config, store=tmp_path / "m.db", embedder=None) as engine,
        serve(ServerConfig(port=0, proxy=proxy), engine) as served,
    ):
        client = closed_after_test(
            anthropic.Anthropic(base_url=served.url, api_key="sk-test", max_retries=0)
        )
        tools = [{"name": "Read", "description": "read a file", "input_schema": {"type": "object"}}]
        client.messages.create(
            model="claude-test-model", max_tokens=2000, messages=messages, tools=tools
        )
        sent = fake_llm.requests[-1].body
    counter = TiktokenCounter()
    assert tokens_sent({"messages": messages, "tools": tools}, "anthropic", counter) > 20_000
    assert sent["messages"][2]["content"][0]["content"] == stub_text(
        "call_0", messages[2]["content"][0]["content"]
    )
    assert tokens_sent(sent, "anthropic", counter) + 2000 <= 20_000


def test_outputs_are_sized_by_the_history_that_goes_upstream_and_the_limit_never_moves(
    fake_llm: FakeLLMServer, tmp_path: Path
) -> None:
    """The limit comes from the config and the request's own maximum (not from whether its
    memory work finished), and a request is sized by the client's messages as they go
    upstream: a long session whose compacted history the filter leaves out is not stubbed
    while what it forwards fits (sized by everything the client resends, every output but
    the newest four was stubbed at each request, a new compaction event each time)."""
    from contextfold.memory.config import MemoryConfig
    from contextfold.server.proxy.record import Plan

    messages = _session("anthropic", [4_000] * 40)  # ~55k tokens the client resends
    recent = messages[:1] + messages[-20:]  # what goes upstream once the filter left the rest
    config = MemoryConfig.model_validate({"context_window": 20_000})
    proxy = ProxySettings(upstream=fake_llm.url, markers=False)
    with (
        MemoryEngine(config, store=tmp_path / "m.db", embedder=None) as engine,
        serve(ServerConfig(port=0, proxy=proxy), engine) as served,
    ):
        body = {"model": "claude-x", "max_tokens": 2000, "messages": messages}
        bare = {**body, "messages": recent}
        cap = served.proxy._outputs_cap("anthropic", body)
        assert cap == 20_000 - 2000 - 2048  # whether or not memory ran
        filtered = Plan(
            id="a", format="anthropic", path="/v1/messages", model="claude-x", stream=False
        )
        filtered.body, filtered.bare = bare, bare
        served.proxy._compact_outputs(filtered, body)
        assert filtered.compaction is None  # what goes upstream fits: nothing stubbed
        skipped = Plan(
            id="b", format="anthropic", path="/v1/messages", model="claude-x", stream=False
        )
        served.proxy._compact_outputs(skipped, body)  # memory skipped: the whole body goes
        assert skipped.compaction is not None and skipped.compaction.limit == cap
