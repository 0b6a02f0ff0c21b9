"""The OpenAI Responses API through the proxy (``POST /v1/responses``): memory, continuity and
streamed events, with the real ``openai`` SDK (``client.responses.create``) against the real
app under uvicorn and a fake provider that speaks Responses (``tests/fake_responses.py``)."""

from __future__ import annotations

import gzip
import json
import threading
import zlib
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest
import zstandard

from contextfold.memory.engine import MemoryEngine
from contextfold.server.config import LimitSettings, OutputSettings, ProxySettings, ServerConfig
from contextfold.server.proxy.responses import WIRE, response_reply
from contextfold.server.proxy.session import SESSION_HEADER
from contextfold.server.proxy.wire import reply_message
from fake_llm import FakeLLMServer, ModelTurn, ToolCall
from fake_responses import ResponsesFake
from proxy_support import Served, closed_after_test, serve

WEATHER: Any = {
    "type": "function",
    "name": "get_weather",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
}
MARK = "contextfold:session="


@pytest.fixture
def upstream(fake_llm: FakeLLMServer) -> ResponsesFake:
    return ResponsesFake(fake_llm)


@pytest.fixture
def proxy(
    fake_llm: FakeLLMServer, upstream: ResponsesFake, engine: MemoryEngine
) -> Iterator[Served]:
    config = ServerConfig(port=0, proxy=ProxySettings(upstream=fake_llm.url))
    with serve(config, engine) as served:
        yield served


def oa(served: Served, **headers: str) -> openai.OpenAI:
    return closed_after_test(
        openai.OpenAI(
            base_url=f"{served.url}/v1",
            api_key="sk-test",
            max_retries=0,
            default_headers=headers or None,
        )
    )


def sent(fake: FakeLLMServer, index: int = -1) -> dict[str, Any]:
    body = fake.requests[index].body
    assert isinstance(body, dict)
    return body


def stored(engine: MemoryEngine, session_id: str) -> list[tuple[str, str]]:
    return [(t.message.role, t.message.text()) for t in engine.store.turns(session_id)]


def memory_item(item: Any) -> bool:
    return (
        isinstance(item, dict)
        and item.get("role") == "user"
        and "<memory>" in json.dumps(item.get("content"))
    )


def echo(body: dict[str, Any]) -> str:
    """The fake model: answers the text of the conversation's last user item."""
    users = [i for i in body["input"] if i.get("role") == "user" and not memory_item(i)]
    content = users[-1]["content"]
    text = content if isinstance(content, str) else content[0]["text"]
    return f"Answer to: {text}"


# --------------------------------------------------------------------------- round trips


@pytest.mark.parametrize("stream", [False, True])
def test_a_response_comes_back_and_its_exchange_is_stored(
    proxy: Served, fake_llm: FakeLLMServer, engine: MemoryEngine, stream: bool
) -> None:
    fake_llm.reply = echo
    client = oa(proxy)
    if stream:
        events = list(
            client.responses.create(
                model="m", instructions="Be brief.", input="Capital of France?", stream=True
            )
        )
        assert events[0].type == "response.created" and events[-1].type == "response.completed"
        text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
        assert events[-1].response.output_text == text
    else:
        raw = client.responses.with_raw_response.create(
            model="m", instructions="Be brief.", input="Capital of France?"
        )
        assert raw.headers[SESSION_HEADER]
        text = raw.parse().output_text
    assert text == "Answer to: Capital of France?"  # no marker: the reply as the model wrote it
    assert sent(fake_llm)["input"] == "Capital of France?"  # a new conversation: untouched
    proxy.drain()
    (record,) = proxy.events.recent()
    assert record.format == "responses" and record.path == "/v1/responses"
    assert stored(engine, record.session_id) == [
        ("user", "Capital of France?"),
        ("assistant", "Answer to: Capital of France?"),
    ]


def test_stream_events_reach_the_client_byte_for_byte(
    proxy: Served, fake_llm: FakeLLMServer, upstream: ResponsesFake
) -> None:
    fake_llm.reply = ModelTurn("Let me look.", (ToolCall("get_weather", {"city": "Oslo"}),))
    upstream.reasoning = True
    body = {"model": "m", "input": "Weather in Oslo?", "tools": [WEATHER], "stream": True}
    response = httpx.post(f"{proxy.url}/v1/responses", json=body, timeout=30)
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/event-stream")
    assert response.content == b"".join(upstream.events)
    assert MARK not in response.text


def test_stream_events_are_relayed_as_they_arrive(proxy: Served, fake_llm: FakeLLMServer) -> None:
    fake_llm.reply = "one two three"
    seen_first = threading.Event()
    waited: list[bool] = []

    def gate(index: int) -> None:
        if index == 5:  # hold the second delta until the client has the first
            waited.append(seen_first.wait(10))

    fake_llm.stream_gate = gate
    deltas = []
    for event in oa(proxy).responses.create(model="m", input="Count.", stream=True):
        if event.type == "response.output_text.delta":
            deltas.append(event.delta)
            seen_first.set()
    assert waited == [True] and deltas == ["one ", "two ", "three"]


def test_the_sdk_stream_helper_assembles_the_final_response(
    proxy: Served, fake_llm: FakeLLMServer
) -> None:
    fake_llm.reply = "Paris is the capital of France."
    with oa(proxy).responses.stream(model="m", input="Capital of France?") as events:
        for _ in events:
            pass
        final = events.get_final_response()
    assert final.output_text == "Paris is the capital of France."


# --------------------------------------------------------------------------- tools


def _weather_then_answer(body: dict[str, Any]) -> ModelTurn:
    results = [i for i in body["input"] if i.get("type") == "function_call_output"]
    if not results:
        return ModelTurn("", (ToolCall("get_weather", {"city": "Oslo"}, "call_w1"),))
    return ModelTurn(f"It is {json.loads(results[-1]['output'])['celsius']} °C in Oslo.")


@pytest.mark.parametrize("stream", [False, True])
def test_a_tool_call_round_trip_resending_everything(
    proxy: Served,
    fake_llm: FakeLLMServer,
    upstream: ResponsesFake,
    engine: MemoryEngine,
    stream: bool,
) -> None:
    """A ``store: false`` client (Codex) resends the whole conversation, reasoning items
    included; the second request continues the first's session by content."""
    fake_llm.reply = _weather_then_answer
    upstream.reasoning = True
    client = oa(proxy)
    items: list[Any] = [{"role": "user", "content": "Weather in Oslo?"}]

    def ask() -> Any:
        if stream:
            with client.responses.stream(
                model="m", input=items, tools=[WEATHER], store=False
            ) as events:
                return events.get_final_response()
        return client.responses.create(model="m", input=items, tools=[WEATHER], store=False)

    first = ask()
    calls = [o for o in first.output if o.type == "function_call"]
    assert [c.name for c in calls] == ["get_weather"] and first.output_text == ""
    items += [o.model_dump(exclude_none=True) for o in first.output]
    items += [{"type": "function_call_output", "call_id": "call_w1", "output": '{"celsius": 12}'}]
    second = ask()
    assert second.output_text == "It is 12 °C in Oslo."
    # The client's items went upstream as they were, reasoning included.
    assert sent(fake_llm)["input"][: len(items)] == items
    proxy.drain()
    one, two = proxy.events.recent()
    assert two.session_id == one.session_id and two.extra["session_source"] == "history"
    roles = [role for role, _ in stored(engine, one.session_id)]
    assert roles == ["user", "assistant", "tool", "assistant"]
    call = engine.store.turns(one.session_id)[1].message.content[-1]
    assert call.name == "get_weather" and call.input == {"city": "Oslo"}  # type: ignore[union-attr]


def test_previous_response_id_continues_the_branch(
    proxy: Served, fake_llm: FakeLLMServer, engine: MemoryEngine
) -> None:
    fake_llm.reply = _weather_then_answer
    client = oa(proxy)
    first = client.responses.create(model="m", input="Weather in Oslo?", tools=[WEATHER])
    (call,) = [o for o in first.output if o.type == "function_call"]
    second = client.responses.create(
        model="m",
        previous_response_id=first.id,
        input=[
            {"type": "function_call_output", "call_id": call.call_id, "output": '{"celsius": 7}'}
        ],
        tools=[WEATHER],
    )
    assert second.output_text == "It is 7 °C in Oslo."
    fake_llm.reply = "Take a coat."
    third = client.responses.create(
        model="m", previous_response_id=second.id, input="Should I take a coat?"
    )
    assert third.output_text == "Take a coat."
    # The provider holds the chain: nothing of it is injected again.
    assert not any(memory_item(i) for i in sent(fake_llm)["input"])
    proxy.drain()
    records = proxy.events.recent()
    assert len({r.session_id for r in records}) == 1
    assert [r.extra["session_source"] for r in records] == [
        "new",
        "previous_response_id",
        "previous_response_id",
    ]
    assert [role for role, _ in stored(engine, records[0].session_id)] == [
        "user",
        "assistant",
        "tool",
        "assistant",
        "user",
        "assistant",
    ]


def test_a_conversation_continues_like_a_chain(
    proxy: Served, fake_llm: FakeLLMServer, upstream: ResponsesFake
) -> None:
    fake_llm.reply = echo
    client = oa(proxy)
    for text in ["My locker combination is 4417.", "Plan a pasta dinner.", "And dessert?"]:
        client.responses.create(model="m", conversation="conv_1", input=text)
    assert len(upstream.conversations["conv_1"]) == 6
    assert not any(memory_item(i) for r in fake_llm.requests for i in r.body["input"])
    proxy.drain()
    records = proxy.events.recent()
    assert len({r.session_id for r in records}) == 1
    assert [r.extra["session_source"] for r in records][1:] == ["previous_response_id"] * 2


def test_a_response_id_opens_nothing_for_another_credential(
    proxy: Served, fake_llm: FakeLLMServer
) -> None:
    fake_llm.reply = "Noted."
    first = oa(proxy).responses.create(model="m", input="My locker combination is 4417.")
    other = closed_after_test(
        openai.OpenAI(base_url=f"{proxy.url}/v1", api_key="sk-other", max_retries=0)
    )
    other.responses.create(model="m", previous_response_id=first.id, input="My combination?")
    proxy.drain()
    one, two = proxy.events.recent()
    assert two.session_id != one.session_id and two.extra["session_source"] == "new"


# --------------------------------------------------------------------------- recall


def _talk(client: openai.OpenAI, items: list[Any], questions: list[str]) -> list[Any]:
    for question in questions:
        reply = client.responses.create(model="m", input=items, store=False)
        items = [*items, *[o.model_dump(exclude_none=True) for o in reply.output]]
        items.append({"role": "user", "content": question})
    return items


@pytest.mark.parametrize("stream", [False, True])
def test_a_fact_is_recalled_after_the_input_drops_it(
    proxy: Served, fake_llm: FakeLLMServer, stream: bool
) -> None:
    fake_llm.reply = "Noted."
    client = oa(proxy)
    items = _talk(
        client,
        [{"role": "user", "content": "My locker combination is 4417."}],
        ["Plan a pasta dinner.", "Which wine goes with it?", "And dessert?"],
    )
    proxy.drain()
    # The client keeps only its last exchange: the session goes on by content.
    trimmed = [*items[-2:-1], {"role": "user", "content": "What is my locker combination?"}]
    ask = {"model": "m", "input": trimmed, "store": False, "instructions": "Be brief."}
    if stream:
        with client.responses.stream(**ask) as events:
            events.get_final_response()
    else:
        client.responses.create(**ask)
    forwarded = sent(fake_llm)["input"]
    # Memory is one item after the client's last; the client's items are unchanged.
    assert forwarded[:-1] == trimmed and memory_item(forwarded[-1])
    assert sent(fake_llm)["instructions"] == "Be brief."
    assert "4417" in forwarded[-1]["content"][0]["text"]
    proxy.drain()
    assert "4417" in proxy.events.recent()[-1].context


def test_a_chained_request_recalls_what_came_before_its_chain(
    proxy: Served, fake_llm: FakeLLMServer
) -> None:
    """A client trims its input, then chains by ``previous_response_id``: what the provider
    holds is not injected again, what came before it is recalled."""
    fake_llm.reply = "Noted."
    client = oa(proxy)
    items = _talk(
        client,
        [{"role": "user", "content": "My locker combination is 4417."}],
        ["Plan a pasta dinner.", "Which wine goes with it?"],
    )
    proxy.drain()
    last = client.responses.create(model="m", input=items[-2:])  # stored upstream: a chain
    proxy.drain()
    client.responses.create(
        model="m", previous_response_id=last.id, input="What is my locker combination?"
    )
    forwarded = sent(fake_llm)["input"]
    assert forwarded[0] == {"role": "user", "content": "What is my locker combination?"}
    (memory,) = forwarded[1:]
    text = memory["content"][0]["text"]
    assert "4417" in text and "Which wine goes with it?" not in text
    proxy.drain()
    records = proxy.events.recent()
    assert records[-1].session_id == records[0].session_id


# --------------------------------------------------------------------------- bodies


def test_unknown_items_are_carried_byte_for_byte(proxy: Served, fake_llm: FakeLLMServer) -> None:
    fake_llm.reply = "Noted."
    client = oa(proxy)
    _talk(client, [{"role": "user", "content": "My locker combination is 4417."}], ["Pasta?", ""])
    proxy.drain()
    items: list[Any] = [
        {"role": "user", "content": "Pasta?"},
        {"type": "message", "role": "assistant", "content": [
            {"type": "output_text", "text": "Noted.", "annotations": [], "x-new": {"ü": [1]}}]},
        {"type": "reasoning", "id": "rs_9", "summary": [], "encrypted_content": "gAAA=="},
        {"type": "local_shell_call", "id": "lsh_1", "call_id": "c1", "status": "completed",
         "action": {"type": "exec", "command": ["ls"], "env": {}}},
        {"type": "local_shell_call_output", "call_id": "c1", "output": "a.txt"},
        {"type": "item_reference", "id": "msg_0"},
        {"type": "future_item", "payload": {"nested": [1.5, None, "ß"]}},
        {"role": "user", "content": [
            {"type": "input_text", "text": "What is my locker combination?"},
            {"type": "input_image", "image_url": "data:image/png;base64,AAAA", "detail": "low"}]},
    ]  # fmt: skip
    raw = json.dumps({"model": "m", "input": items, "store": False}, ensure_ascii=False)
    response = httpx.post(
        f"{proxy.url}/v1/responses",
        content=raw.encode(),
        headers={"authorization": "Bearer sk-test", "content-type": "application/json"},
    )
    assert response.status_code == 200
    upstream_raw = fake_llm.requests[-1].raw.decode()
    prefix = json.dumps(items, ensure_ascii=False, separators=(",", ":"))[:-1]
    assert prefix in upstream_raw  # every item's bytes, in the proxy's compact spelling
    forwarded = sent(fake_llm)["input"]
    assert forwarded[:-1] == items and memory_item(forwarded[-1])
    proxy.drain()
    record = proxy.events.recent()[-1]
    assert record.extra["session_source"] == "history"
    (note,) = [n for n in record.extra["notes"] if "not read" in n]
    for kind in ("future_item", "item_reference", "local_shell_call", "local_shell_call_output"):
        assert kind in note


@pytest.mark.parametrize(
    ("body", "problem"),
    [
        (b"{not json", "not valid JSON"),
        (b"[1, 2]", "JSON list; expected an object"),
        (b"\xff\xfe", "not valid UTF-8"),
    ],
)
def test_malformed_bodies_get_an_openai_shaped_400(
    proxy: Served, fake_llm: FakeLLMServer, body: bytes, problem: str
) -> None:
    response = httpx.post(f"{proxy.url}/v1/responses", content=body)
    assert response.status_code == 400
    error = response.json()["error"]
    assert problem in error["message"] and error["type"] == "invalid_request_error"
    assert fake_llm.requests == []


def test_an_input_of_the_wrong_type_gets_the_providers_400(
    proxy: Served, fake_llm: FakeLLMServer
) -> None:
    with pytest.raises(openai.BadRequestError) as raised:
        oa(proxy).responses.create(model="m", input=42)  # type: ignore[arg-type]
    assert "Invalid type for 'input'" in str(raised.value)
    assert fake_llm.requests[-1].body == {"model": "m", "input": 42}  # forwarded unmodified
    proxy.drain()
    assert "memory skipped" in (proxy.events.recent()[-1].error or "")


def test_a_stream_cut_off_is_stored_partial(
    proxy: Served, fake_llm: FakeLLMServer, upstream: ResponsesFake, engine: MemoryEngine
) -> None:
    fake_llm.reply = "one two three four five six"
    upstream.cut_after = 6  # created, in_progress, item added, part added, two deltas
    events = list(oa(proxy).responses.create(model="m", input="Count.", stream=True))
    assert [e.type for e in events][-1] == "response.output_text.delta"
    proxy.drain()
    record = proxy.events.recent()[-1]
    turns = engine.store.turns(record.session_id)
    assert turns[-1].message.text() == "one two " and turns[-1].partial


def test_an_incomplete_response_is_stored_partial(
    proxy: Served, fake_llm: FakeLLMServer, upstream: ResponsesFake, engine: MemoryEngine
) -> None:
    fake_llm.reply = "A long answer cut by max_output_tokens"
    upstream.status = "incomplete"
    events = list(oa(proxy).responses.create(model="m", input="Explain.", stream=True))
    assert events[-1].type == "response.incomplete"
    proxy.drain()
    turns = engine.store.turns(proxy.events.recent()[-1].session_id)
    assert turns[-1].message.text() == "A long answer cut by max_output_tokens"
    assert turns[-1].partial


def test_too_many_input_items_get_a_413(fake_llm: FakeLLMServer, engine: MemoryEngine) -> None:
    config = ServerConfig(
        port=0,
        proxy=ProxySettings(upstream=fake_llm.url),
        limits=LimitSettings(max_messages=3),
    )
    with serve(config, engine) as served:
        items = [{"role": "user", "content": str(i)} for i in range(4)]
        with pytest.raises(openai.APIStatusError) as raised:
            oa(served).responses.create(model="m", input=items)  # type: ignore[arg-type]
    assert raised.value.status_code == 413
    assert "limits.max_messages" in str(raised.value)
    assert fake_llm.requests == []


# --------------------------------------------------------------------------- the wire


def test_a_resent_output_reads_as_the_reply_that_was_stored() -> None:
    """One response's output, resent as input items, is the assistant message the proxy
    stored for it: the resent history is recognised by content."""
    output: list[Any] = [
        {"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": "gAAA"},
        {"type": "message", "role": "assistant", "id": "msg_1", "phase": "commentary",
         "content": [{"type": "output_text", "text": "Patching.", "annotations": []}]},
        {"type": "custom_tool_call", "call_id": "c1", "name": "apply_patch",
         "input": "*** Begin Patch\n*** End Patch"},
        {"type": "function_call", "call_id": "c2", "name": "shell", "arguments": '{"cmd":"ls"}'},
        {"type": "web_search_call", "id": "ws_1", "status": "completed"},
    ]  # fmt: skip
    reply = response_reply({"id": "resp_1", "status": "completed", "output": output})
    stored_reply = reply_message(reply.text, reply.calls)
    results: list[Any] = [
        {"type": "custom_tool_call_output", "call_id": "c1", "output": "Done."},
        {"type": "function_call_output", "call_id": "c2", "output": "a.txt"},
    ]
    parsed = WIRE.parse(
        {"instructions": "Be brief.", "input": [{"role": "user", "content": "Fix it."}, *output,
                                                *results]}
    )  # fmt: skip
    system, user, assistant, tool = parsed.messages
    assert system.role == "system" and user.text() == "Fix it."
    assert assistant == stored_reply and assistant.tool_use_ids == ("c1", "c2")
    assert tool.tool_result_ids == ("c1", "c2")
    assert parsed.sources == [(-1,), (0,), (1, 2, 3, 4, 5), (6, 7)]
    assert WIRE.unread({"input": output}) == {"web_search_call": 1}


# --------------------------------------------------------------------------- compressed bodies


@pytest.mark.parametrize("coding", ["zstd", "gzip", "deflate"])
def test_a_compressed_body_is_decoded_read_and_forwarded(
    proxy: Served, fake_llm: FakeLLMServer, engine: MemoryEngine, coding: str
) -> None:
    """Codex CLI sends its bodies zstd-compressed: they are read (and stored) like any."""
    fake_llm.reply = echo
    raw = json.dumps({"model": "m", "input": "Capital of France?", "store": False}).encode()
    packed = {
        "zstd": zstandard.ZstdCompressor(level=3).compress,
        "gzip": gzip.compress,
        "deflate": zlib.compress,
    }[coding](raw)
    headers = {"content-encoding": coding, "content-type": "application/json"}
    response = httpx.post(f"{proxy.url}/v1/responses", content=packed, headers=headers)
    assert response.status_code == 200
    assert response.json()["output"][0]["content"][0]["text"] == "Answer to: Capital of France?"
    assert fake_llm.requests[-1].raw == raw  # decoded, and sent on without the coding
    assert "content-encoding" not in fake_llm.requests[-1].headers
    proxy.drain()
    assert stored(engine, proxy.events.recent()[-1].session_id)[0] == ("user", "Capital of France?")
    # The pass-through decodes too.
    httpx.post(f"{proxy.url}/v1/embeddings", content=packed, headers=headers)
    assert fake_llm.requests[-1].raw == raw


@pytest.mark.parametrize(
    ("packed", "coding", "status", "problem"),
    [
        (zstandard.ZstdCompressor().compress(b" " * (9 << 20)), "zstd", 413, "max_body_bytes"),
        (gzip.compress(b" " * (9 << 20)), "gzip", 413, "max_body_bytes"),
        (zstandard.ZstdCompressor().compress(b'{"input": "hi"}')[:-4], "zstd", 400, "too early"),
        (b"not gzip", "gzip", 400, "not valid gzip"),
        (b"{}", "br", 415, "decodes gzip, deflate and zstd"),
    ],
)
def test_a_body_that_does_not_decode_is_refused(
    proxy: Served, fake_llm: FakeLLMServer, packed: bytes, coding: str, status: int, problem: str
) -> None:
    headers = {"content-encoding": coding, "content-type": "application/json"}
    response = httpx.post(f"{proxy.url}/v1/responses", content=packed, headers=headers)
    assert response.status_code == status
    assert problem in response.json()["error"]["message"]
    assert fake_llm.requests == []


def test_a_compressed_body_too_large_once_decoded_is_anthropics_request_too_large(
    proxy: Served, fake_llm: FakeLLMServer
) -> None:
    headers = {"content-encoding": "gzip", "content-type": "application/json"}
    packed = gzip.compress(b" " * (9 << 20))
    response = httpx.post(f"{proxy.url}/v1/messages", content=packed, headers=headers)
    assert response.status_code == 413
    body = response.json()
    assert body["type"] == "error" and body["error"]["type"] == "request_too_large", body
    assert fake_llm.requests == []


def test_a_long_responses_tool_session_is_compacted_without_a_restore_tool(
    fake_llm: FakeLLMServer, upstream: ResponsesFake, engine: MemoryEngine
) -> None:
    """Codex CLI's long sessions: old ``function_call_output`` items are stubbed once the
    request is over ``proxy.tool_outputs.compact_above`` (issue 20, point 5). The Responses
    route has no in-proxy tool loop, so the stub asks for the call again and no
    ``contextfold_restore`` tool is added; every call keeps its output item."""
    outputs = OutputSettings(compact_above=3000, keep_recent=2, min_tokens=50)
    config = ServerConfig(port=0, proxy=ProxySettings(upstream=fake_llm.url, tool_outputs=outputs))
    items: list[Any] = [{"role": "user", "content": "Review the repository."}]
    for i in range(8):
        items.append(
            {"type": "function_call", "call_id": f"c{i}", "name": "shell", "arguments": "{}"}
        )
        text = f"file {i}\n" + "".join(f"line {j} of file {i}\n" for j in range(120))
        items.append({"type": "function_call_output", "call_id": f"c{i}", "output": text})
    fake_llm.reply = "Reviewed."
    with serve(config, engine) as served:
        reply = oa(served).responses.create(model="gpt-4o", input=items, tools=[WEATHER])
    assert reply.output_text == "Reviewed."
    body = sent(fake_llm)
    forwarded = [i for i in body["input"] if i.get("type") == "function_call_output"]
    assert [i["call_id"] for i in forwarded] == [f"c{i}" for i in range(8)]  # all still paired
    stubbed = [i["call_id"] for i in forwarded if i["output"].startswith("[contextfold:")]
    assert stubbed and "c6" not in stubbed and "c7" not in stubbed  # the newest 2 kept
    assert all("Make the call again" in i["output"] for i in forwarded if i["call_id"] in stubbed)
    assert [t.get("name") for t in body["tools"]] == ["get_weather"]  # no restore tool
    assert len(json.dumps(body)) < len(json.dumps(items)) * 3 // 4
