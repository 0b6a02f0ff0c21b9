"""The model's window caps what the proxy forwards: ``memory.context_window`` less the reply's
reserve is never exceeded by a request the proxy makes larger, and compaction counts the
request's fixed parts (system prompt, tools, memory, the reply's reserve) beside the live turns.

The real proxy in front of the fake upstream, driven by the real SDK clients; a client that
resends its whole history every turn (as chat clients do) under a large system prompt with
tools. Each body the upstream received is counted with the engine's counter, per format, as
the provider would (``count_openai_message`` / ``count_messages``), the tools' JSON included."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import anthropic
import openai
import pytest

from contextfold.items import ContextItem, SourceType, ToolUseBlock
from contextfold.memory.assemble import MemoryBudget
from contextfold.memory.engine import AssembledContext, MemoryEngine
from contextfold.server.config import ProxySettings, ServerConfig
from contextfold.server.proxy.fit import CUT, Fit, overflow, reply_reserve, tool_round
from contextfold.server.proxy.recall import add_memory
from contextfold.server.proxy.record import Plan
from contextfold.server.proxy.wire import WIRES, reply_message
from contextfold.tokens import TiktokenCounter, TokenCounter
from fake_llm import FakeLLMServer
from fake_responses import ResponsesFake
from proxy_support import Served, closed_after_test, make_engine, serve, tokens_sent

WINDOW = 8_000
REPLY = 512  # the clients' max_tokens: the reply's reserve
TOPICS = ["harbour", "glacier", "orchard", "violin", "comet", "lantern", "canyon", "meadow"]
FACTS = {
    3: ("My locker combination is 4417.", "What is my locker combination?", "4417"),
    6: ("The Henninger filing is due March 3.", "When is the Henninger filing due?", "March 3"),
}


def system_prompt() -> str:
    """About 3,000 tokens of rules."""
    return "\n".join(
        f"Rule {n}: when the user mentions the {TOPICS[n % 8]} or the {TOPICS[(n * 3) % 8]},"
        f" answer in plain words, cite rule {n}, keep paragraph {n} short and check item {n}."
        for n in range(1, 111)
    )


def user_text(turn: int) -> str:
    """About 220 tokens on the turn's topic; a planted fact first on the turns that carry one."""
    topic = TOPICS[turn % len(TOPICS)]
    body = " ".join(
        f"Note {turn}.{k}: the {topic} survey found {turn * 7 + k} samples near site {k}."
        for k in range(1, 13)
    )
    fact = FACTS.get(turn)
    return f"{fact[0]} {body}" if fact else body


def reply_text(_: dict[str, Any]) -> str:
    return "Understood. " + " ".join(f"Point {k}: the survey data is noted." for k in range(12))


OPENAI_TOOLS: Any = [
    {
        "type": "function",
        "function": {
            "name": f"lookup_{name}",
            "description": f"Look up the {name} records of the survey by site and date range.",
            "parameters": {
                "type": "object",
                "properties": {"site": {"type": "string"}, "from": {"type": "string"}},
            },
        },
    }
    for name in TOPICS
]
ANTHROPIC_TOOLS: Any = [
    {
        "name": t["function"]["name"],
        "description": t["function"]["description"],
        "input_schema": t["function"]["parameters"],
    }
    for t in OPENAI_TOOLS
]


Send = Callable[[list[dict[str, Any]]], str]


def sender(served: Served, fmt: str) -> Send:
    """Send the whole history (the system prompt and tools with it); returns the reply text."""
    if fmt == "openai":
        oa = closed_after_test(
            openai.OpenAI(base_url=f"{served.url}/v1", api_key="sk-test", max_retries=0)
        )

        def send_openai(history: list[dict[str, Any]]) -> str:
            messages: Any = [{"role": "system", "content": system_prompt()}, *history]
            reply = oa.chat.completions.create(
                model="m", messages=messages, tools=OPENAI_TOOLS, max_tokens=REPLY
            )
            return reply.choices[0].message.content or ""

        return send_openai
    an = closed_after_test(
        anthropic.Anthropic(base_url=served.url, api_key="sk-ant-test", max_retries=0)
    )

    def send_anthropic(history: list[dict[str, Any]]) -> str:
        messages: Any = history
        reply = an.messages.create(
            model="claude-x",
            max_tokens=REPLY,
            system=system_prompt(),
            tools=ANTHROPIC_TOOLS,
            messages=messages,
        )
        return "".join(b.text for b in reply.content if b.type == "text")

    return send_anthropic


@pytest.fixture
def small(fake_llm: FakeLLMServer, tmp_path: Path) -> Iterator[tuple[Served, MemoryEngine]]:
    with make_engine(tmp_path, context_window=WINDOW) as engine:
        config = ServerConfig(port=0, proxy=ProxySettings(upstream=fake_llm.url))
        with serve(config, engine) as served:
            yield served, engine


@pytest.mark.parametrize("fmt", ["openai", "anthropic"])
def test_a_long_conversation_never_overflows_the_window(
    small: tuple[Served, MemoryEngine], fake_llm: FakeLLMServer, fmt: str
) -> None:
    """30 turns of ~220 tokens under a ~3,000-token system prompt and tools, the whole history
    resent each turn, in an 8,000-token window: no forwarded request (with the reply's 512)
    passes the window, the planted facts are recalled when asked, and every turn is stored."""
    served, engine = small
    fake_llm.reply = reply_text
    send, history = sender(served, fmt), []
    for turn in range(1, 31):
        history.append({"role": "user", "content": user_text(turn)})
        history.append({"role": "assistant", "content": send(history)})
        served.drain()  # the derive jobs (tags, compaction) done, as between a user's turns
    for _, question, answer in FACTS.values():
        history.append({"role": "user", "content": question})
        history.append({"role": "assistant", "content": send(history)})
        served.drain()
        body = fake_llm.requests[-1].body
        planted = next(m["content"] for m in history if answer in m["content"])
        assert planted not in [m["content"] for m in body["messages"]]  # compacted away
        assert answer in json.dumps(body), f"{answer!r} not recalled"
    sizes = [tokens_sent(r.body, fmt, engine.counter) for r in fake_llm.requests]
    over = [(n, size) for n, size in enumerate(sizes, 1) if size + REPLY > WINDOW]
    assert not over, f"requests over the {WINDOW:,}-token window (with the reply's {REPLY}): {over}"
    (sid,) = {r.session_id for r in served.events.recent() if r.kind != "compaction"}
    stored = [t.message.text() for t in engine.store.turns(sid)]
    assert stored == [m["content"] for m in history]  # nothing lost, nothing twice


def test_a_request_that_cannot_fit_is_forwarded_whole_with_a_warning_and_a_note(
    small: tuple[Served, MemoryEngine], fake_llm: FakeLLMServer, caplog: pytest.LogCaptureFixture
) -> None:
    """A message too large for the window beside the system prompt (the query: never left
    out) goes upstream whole, without memory, with a warning and a note in its record naming
    how far over it is."""
    served, _ = small
    fake_llm.reply = reply_text
    send, history = sender(served, "openai"), []
    for turn in (1, 2):
        history.append({"role": "user", "content": user_text(turn)})
        history.append({"role": "assistant", "content": send(history)})
    served.drain()
    history.append({"role": "user", "content": " ".join(user_text(t) for t in range(3, 23))})
    with caplog.at_level(logging.WARNING, logger="contextfold.server.proxy"):
        send(history)
        served.drain()
    assert fake_llm.requests[-1].body["messages"][1:] == history  # whole, and no memory
    record = [r for r in served.events.recent() if r.kind != "compaction"][-1]
    notes = record.extra.get("notes", [])
    assert any(n.startswith("no room in the window for memory") for n in notes), notes
    (note,) = [n for n in notes if "over the model's window" in n]
    assert "tokens over" in note and f"> {WINDOW:,} (context_window)" in note, note
    assert any("over the model's window" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize("fmt", ["openai", "anthropic"])
def test_each_request_notes_its_fixed_parts_for_compaction(
    small: tuple[Served, MemoryEngine], fake_llm: FakeLLMServer, fmt: str
) -> None:
    """What the proxy notes on the engine for the session's compaction is everything a request
    carries besides its history: the system prompt, the tools, the memory budget and the
    reply's reserve (and the format's framing: a few tokens)."""
    served, engine = small
    fake_llm.reply = reply_text
    sender(served, fmt)([{"role": "user", "content": user_text(1)}])
    served.drain()
    (record,) = [r for r in served.events.recent() if r.kind != "compaction"]
    tools = OPENAI_TOOLS if fmt == "openai" else ANTHROPIC_TOOLS
    counted = (
        engine.counter.count(system_prompt())
        + engine.counter.count(json.dumps(tools))
        + engine.config.assembly.memory_budget
        + REPLY
    )
    assert 0 <= engine.fixed_tokens(record.session_id) - counted <= 30


def test_a_responses_chain_is_history_the_proxy_cannot_leave_out(
    small: tuple[Served, MemoryEngine], fake_llm: FakeLLMServer
) -> None:
    """A Responses conversation chained by ``previous_response_id``: the provider holds every
    earlier turn, compacted or not. Memory gets what the window leaves beside them (it used to
    be given room as if the compacted ones were gone, then left out whole), and a request the
    chain alone takes past the window says so, not that compaction is behind."""
    served, _ = small
    ResponsesFake(fake_llm)
    fake_llm.reply = reply_text
    client = closed_after_test(
        openai.OpenAI(base_url=f"{served.url}/v1", api_key="sk-test", max_retries=0)
    )
    previous: dict[str, Any] = {}
    for turn in range(1, 26):
        reply = client.responses.create(
            model="m", input=user_text(turn), max_output_tokens=REPLY, **previous
        )
        previous = {"previous_response_id": reply.id}
        served.drain()
    records = [r for r in served.events.recent() if r.kind != "compaction"]
    notes = [n for r in records for n in r.extra.get("notes", [])]
    assert not [n for n in notes if n.startswith("memory left out")]
    cut = [r for r in records if any(n.startswith("memory budget cut") for n in r.extra["notes"])]
    assert cut and all(r.memory_tokens for r in cut)  # what the window left, not nothing
    for record in records:
        if record.memory_tokens:
            assert record.extra["window"]["tokens_sent"] + REPLY <= WINDOW
    over = [n for n in notes if "over the model's window" in n]
    assert over, "the chain grows past the window"
    assert all("the provider holds" in n and "not caught up" not in n for n in over), over


@pytest.mark.parametrize(
    ("fmt", "body", "reserve"),
    [
        ("openai", {}, 4096),  # none named: proxy.reply_reserve_tokens
        ("openai", {"max_tokens": 300}, 300),
        ("openai", {"max_completion_tokens": 200, "max_tokens": 300}, 200),
        ("anthropic", {"max_tokens": 1024}, 1024),
        ("responses", {"max_output_tokens": 700}, 700),
        ("gemini", {"generationConfig": {"maxOutputTokens": 900}}, 900),
        ("openai", {"max_tokens": 32_000}, 5000),  # at most half the window
        ("openai", {"max_tokens": True}, 4096),  # not a number: the default
        ("anthropic", {"max_tokens": 0}, 4096),
    ],
)
def test_the_reply_reserve_is_the_requests_own_maximum_else_the_default(
    fmt: str, body: dict[str, Any], reserve: int
) -> None:
    assert reply_reserve(fmt, body, 4096, 10_000) == reserve


HINT = "<context-topics>\nEarlier topics (turns): harbour (4), glacier (3)\n</context-topics>"
BLOCK = "<memory>\n" + user_text(3) + "\n</memory>"


def assembled_memory(counter: TokenCounter, room_left: int) -> AssembledContext:
    hint = ContextItem(content=HINT, source=SourceType.MEMORY, metadata={"kind": "hint"})
    text = f"{HINT}\n{BLOCK}"
    budget = MemoryBudget(budget=2000, hint=counter.count(HINT), used=counter.count(text))
    return AssembledContext(
        session_id="s",
        prepend_text=text,
        matched_tags=(),
        related_tags=(),
        broad=False,
        temporal=False,
        items=(hint,),
        budget=budget,
        recalled=(),
        room_left=room_left,
    )


@pytest.mark.parametrize(
    ("kept", "note"),
    [
        ("all", None),  # fits: the whole block
        ("hint", "memory cut to its topic hint"),
        ("none", "memory left out"),
    ],
)
def test_memory_past_the_window_all_the_same_keeps_what_fits(kept: str, note: str | None) -> None:
    """Where more history goes than the room foresaw, the memory block is cut to its topic
    hint when that fits, else left out — noted with the numbers, the body counted."""
    counter = TiktokenCounter()
    memory = assembled_memory(counter, room_left=500)
    history = [1000]
    # The window leaves ``spare`` tokens beside the history, the reply's reserve and the
    # whole block: 10 more, 10 too few (the hint fits), or 5 left in all (nothing fits).
    spare = {"all": 10, "hint": -10, "none": 5 - memory.budget.used}[kept]
    window = 100 + 1000 + memory.budget.used + 512 + spare
    plan = Plan(id="r", format="openai", path="/v1/chat/completions", model="m", stream=False)
    plan.fit = Fit(window=window, reserve=512, fixed=100, costs=history, system=0)
    bare: dict[str, Any] = {"messages": [{"role": "user", "content": "What was found?"}]}
    body = add_memory(plan, WIRES["openai"], bare, memory)
    text = json.dumps(body)
    assert (json.dumps(HINT)[1:-1] in text, user_text(3) in text) == {
        "all": (True, True),
        "hint": (True, False),
        "none": (False, False),
    }[kept]
    assert plan.fit.sent is not None and plan.fit.sent <= plan.fit.limit
    notes = [n for n in plan.notes if note and n.startswith(note)]
    assert bool(notes) is bool(note)
    if note:
        assert "tokens over the window (the history forwarded takes" in notes[0], notes


@pytest.mark.parametrize(("before", "over"), [(600, False), (1995, True)])
def test_a_tool_round_is_cut_to_the_window_and_noted_when_over_all_the_same(
    before: int, over: bool
) -> None:
    """A follow-up round of the proxy's tool loop: the memory tool's result is cut to what the
    window leaves it; a round the request and the model's call fill is over all the same, and
    ``overflow`` says so, naming the round."""
    counter = TiktokenCounter()
    plan = Plan(id="r", format="openai", path="/v1/chat/completions", model="m", stream=False)
    plan.fit = Fit(window=2512, reserve=512, fixed=0, costs=[], system=0, sent=before)
    call = ToolUseBlock(id="c1", name="expand_topic", input={"tag": "harbour"})
    asked = reply_message("", [call])
    (result,) = tool_round(plan, counter, asked, [(call, user_text(4) * 20)])
    assert result[1].endswith(CUT)
    note = overflow(plan, round_=1)
    assert (note is not None) is over
    if over:
        assert note is not None and note.startswith("memory tool round 1 over the model's window")
    else:
        assert plan.fit.sent <= plan.fit.limit


@pytest.mark.parametrize(
    ("fixed", "system", "held", "why"),
    [
        (200, 300, 0, "compaction has not caught up"),
        (200, 2500, 0, "the system prompt and tools alone take about 2,700 tokens"),
        (200, 300, 1500, "which the proxy cannot leave out and compaction cannot shrink"),
    ],
)
def test_an_over_window_note_names_what_takes_the_window(
    fixed: int, system: int, held: int, why: str
) -> None:
    """The note of a request over the window all the same says what fills it: a conversation
    compaction has not caught up with, a system prompt and tools larger than the window on
    their own (nothing the proxy does to the history can help), or a Responses chain the
    provider holds."""
    plan = Plan(id="r", format="openai", path="/v1/chat/completions", model="m", stream=False)
    plan.fit = Fit(window=3000, reserve=500, fixed=fixed, costs=[], system=system, held=held)
    plan.fit.sent = 3500
    note = overflow(plan)
    assert note is not None and "1,000 tokens over" in note and why in note, note
