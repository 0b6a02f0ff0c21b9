"""Conversation history: trim_history's contiguous suffix and MemoryManager's sliding window,
both measured with a format's overhead and never splitting a tool call from its result."""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

import pytest

from contextfold.conversation import MemoryManager, trim_history
from contextfold.errors import ConfigError
from contextfold.formats import AnthropicFormatter
from contextfold.items import Message, QueryBundle, SourceType, ToolResultBlock, ToolUseBlock
from contextfold.tokens import OVERHEADS, TiktokenCounter, count_messages


def user(text: str) -> Message:
    return Message(role="user", content=text)


def assistant(text: str) -> Message:
    return Message(role="assistant", content=text)


def call(call_id: str, name: str = "search") -> Message:
    return Message(
        role="assistant", content=[ToolUseBlock(id=call_id, name=name, input={"q": "x"})]
    )


def result(call_id: str, text: str = "result text") -> Message:
    return Message(role="tool", content=[ToolResultBlock(tool_use_id=call_id, content=text)])


CONVERSATION = json.loads(
    (Path(__file__).parents[1] / "examples" / "conversation.json").read_text(encoding="utf-8")
)

HISTORY = [
    Message(role="system", content="You are terse."),
    user("one two three"),
    call("c1"),
    result("c1"),
    assistant("answer one"),
    user("four five"),
    call("c2"),
    result("c2"),
    assistant("answer two"),
]


def _cost(messages: list[Message], counter: TiktokenCounter, fmt: str = "openai") -> int:
    return count_messages(messages, counter, fmt) + OVERHEADS[fmt].per_request


def _pairs_intact(messages: list[Message]) -> bool:
    calls = {t for m in messages for t in m.tool_use_ids}
    results = {t for m in messages for t in m.tool_result_ids}
    return calls == results


@pytest.mark.parametrize("fmt", ["openai", "anthropic", "text"])
def test_trim_keeps_the_longest_run_of_whole_exchanges(o200k: TiktokenCounter, fmt: str) -> None:
    full = _cost(HISTORY, o200k, fmt)
    assert trim_history(HISTORY, full, o200k, format=fmt) == HISTORY
    system_cost = _cost(HISTORY[:1], o200k, fmt)
    starts = [i for i, m in enumerate(HISTORY) if m.role == "user"]  # exchanges start here
    for budget in range(system_cost, full):
        kept = trim_history(HISTORY, budget, o200k, format=fmt)
        assert kept[0] == HISTORY[0]  # the system message stays
        body = kept[1:]
        assert body == HISTORY[len(HISTORY) - len(body) :]  # a contiguous suffix
        assert not body or body[0].role == "user"  # that starts on a user turn
        assert _cost(kept, o200k, fmt) <= budget
        assert _pairs_intact(kept)
        # The next longer run of whole exchanges would not fit.
        start = len(HISTORY) - len(body)
        longer = max((i for i in starts if i < start), default=None)
        if longer is not None:
            assert _cost(HISTORY[:1] + HISTORY[longer:], o200k, fmt) > budget


def test_trim_never_starts_on_an_orphan_reply(o200k: TiktokenCounter) -> None:
    """The defect: one token short of the last exchange, the old trim kept its tail (a call, a
    result and a reply) right after the system prompt, an assistant-first history."""
    last = HISTORY[-4:]  # user, call, result, reply
    budget = _cost(HISTORY[:1] + last, o200k) - 1
    assert _cost(HISTORY[:1] + last[1:], o200k) <= budget
    assert trim_history(HISTORY, budget, o200k) == [HISTORY[0]]
    assert trim_history(HISTORY, budget + 1, o200k) == [HISTORY[0], *last]


def test_trim_leaves_out_what_comes_before_the_first_user_turn(o200k: TiktokenCounter) -> None:
    history = [assistant("Hello! How can I help?"), user("hi"), assistant("hey")]
    assert trim_history(history, 1000, o200k) == history[1:]


def test_trim_drops_incomplete_tool_exchanges(o200k: TiktokenCounter) -> None:
    pending = [user("look it up"), call("c9"), user("never mind"), assistant("ok")]
    assert trim_history(pending, 1000, o200k) == [pending[0], pending[2], pending[3]]
    orphan = [result("zz"), user("hi")]  # a result whose call was already trimmed away
    assert trim_history(orphan, 1000, o200k) == [orphan[1]]


def test_trim_keeps_parallel_calls_together(o200k: TiktokenCounter) -> None:
    parallel = [
        user("a"),
        Message(
            role="assistant",
            content=[ToolUseBlock(id="x", name="f"), ToolUseBlock(id="y", name="g")],
        ),
        result("x", "1"),
        result("y", "2"),
        assistant("done"),
    ]
    full = _cost(parallel, o200k)
    assert trim_history(parallel, full, o200k) == parallel
    # One token short of the whole exchange: none of it is kept.
    assert trim_history(parallel, full - 1, o200k) == []


def test_trim_without_keep_system(o200k: TiktokenCounter) -> None:
    budget = _cost(HISTORY[-4:], o200k)
    assert trim_history(HISTORY, budget, o200k, keep_system=False) == HISTORY[-4:]
    assert trim_history(HISTORY, budget - 1, o200k, keep_system=False) == []
    assert trim_history(HISTORY[1:2], 0, o200k) == []  # nothing fits: nothing kept
    assert trim_history([], 10, o200k) == []


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"max_tokens": 5}, "system message alone needs 11 tokens, more than the 5 allowed"),
        ({"max_tokens": 100, "format": "xml"}, "unknown format 'xml'"),
    ],
)
def test_trim_bad_arguments(o200k: TiktokenCounter, kwargs: dict[str, Any], message: str) -> None:
    assert _cost(HISTORY[:1], o200k) == 3 + 3 + 1 + o200k.count("You are terse.") == 11
    with pytest.raises(ConfigError, match=message):
        trim_history(HISTORY, counter=o200k, **kwargs)


def test_memory_evicts_oldest_first(o200k: TiktokenCounter) -> None:
    memory = MemoryManager(conversation_tokens=30, counter=o200k)
    for i in range(6):
        memory.add_user_message(f"message number {i}")  # 8 tokens each with overhead
        assert memory.total_tokens <= 30
    assert [m.text() for m in memory.messages] == [f"message number {i}" for i in range(3, 6)]
    assert memory.evicted == 3
    assert memory.total_tokens == count_messages(memory.messages, o200k, "openai") == 24
    assert "evicted=3" in repr(memory)


def test_memory_evicts_whole_exchanges(o200k: TiktokenCounter) -> None:
    first = [user("hi"), call("c1"), result("c1"), assistant("done")]
    window = count_messages(first, o200k) + 2  # the next question does not fit beside it
    memory = MemoryManager(conversation_tokens=window, counter=o200k)
    memory.add_messages(first)
    assert memory.messages == first
    memory.add_user_message("next question please")  # over: the whole first exchange goes
    assert [m.text() for m in memory.messages] == ["next question please"]
    assert memory.evicted == 4


def test_memory_evicts_a_tool_pair_together(o200k: TiktokenCounter) -> None:
    memory = MemoryManager(conversation_tokens=30, counter=o200k)
    exchange = [call("c1"), result("c1", "long result " * 3)]
    memory.add_messages(exchange)
    assert [count_messages([m], o200k) for m in memory.messages] == [14, 13]
    memory.add_user_message("hello there")  # 6 more: 33 > 30
    # Evicting the call alone would have been enough; its result goes with it.
    assert [m.text() for m in memory.messages] == ["hello there"]
    memory.add_user_message("next question please")
    assert [m.text() for m in memory.messages] == ["hello there", "next question please"]
    assert memory.evicted == 2
    assert memory.total_tokens == 13


def test_memory_keeps_a_pending_call_then_evicts_the_exchange(o200k: TiktokenCounter) -> None:
    memory = MemoryManager(conversation_tokens=10, counter=o200k)
    memory.add_user_message("please call it")
    memory.add_message(call("c9", name="a_really_long_tool_name_that_costs_tokens"))
    assert [m.role for m in memory.messages] == ["user", "assistant"]  # over budget, but its
    assert memory.total_tokens > 10  # result is still to come
    memory.add_message(
        {"role": "tool", "content": [{"type": "tool_result", "tool_use_id": "c9", "content": "k"}]}
    )
    assert memory.messages == []  # the completed exchange alone exceeds the window: it goes
    assert memory.evicted == 3


@pytest.mark.parametrize(("fmt", "cost"), [("openai", 3 + 1 + 1), ("anthropic", 4 + 1 + 2)])
def test_memory_counts_with_the_format_overhead(o200k: TiktokenCounter, fmt: str, cost: int):
    memory = MemoryManager(conversation_tokens=2 * cost + 2, counter=o200k, format=fmt)
    memory.add_user_message("hi")
    memory.add_assistant_message("hello")
    assert memory.total_tokens == 2 * cost  # 1 token of text, the overhead and the role
    for _ in range(3):
        memory.add_user_message("more")
    assert [m.text() for m in memory.messages] == ["more", "more"]


@pytest.mark.parametrize("window", [45, 50, 120, 400])
def test_memory_window_always_opens_on_a_user_turn(o200k: TiktokenCounter, window: int) -> None:
    """The defect: on the README conversation a 45- or 50-token window evicted down to an
    orphan assistant reply, and AnthropicFormatter sent an assistant-first messages list."""
    memory = MemoryManager(conversation_tokens=window, counter=o200k)
    for raw in CONVERSATION:
        memory.add_message(raw)
        messages = memory.messages
        assert memory.total_tokens <= window
        assert not messages or messages[0].role == "user"
        items = memory.context_items(QueryBundle(query_str=""))
        payload = AnthropicFormatter().format(items)["messages"]
        assert not payload or payload[0]["role"] == "user"
        assert all(a["role"] != b["role"] for a, b in itertools.pairwise(payload))


def test_memory_supplies_conversation_items(o200k: TiktokenCounter) -> None:
    memory = MemoryManager(conversation_tokens=100, counter=o200k, priority=4)
    memory.add_user_message("hi")
    memory.add_message({"role": "assistant", "content": "hello"})
    items = memory.context_items(QueryBundle(query_str="x"))
    assert [(i.source, i.priority, i.content) for i in items] == [
        (SourceType.CONVERSATION, 4, "hi"),
        (SourceType.CONVERSATION, 4, "hello"),
    ]
    items.clear()  # a copy: the memory is untouched
    assert len(memory.messages) == 2
    memory.clear()
    assert memory.messages == []


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"conversation_tokens": 0}, "conversation_tokens must be > 0, got 0"),
        ({"conversation_tokens": -5}, "got -5"),
        ({"format": "xml"}, "unknown format 'xml'"),
        ({"priority": 0}, "priority must be in 1..10, got 0"),
        ({"priority": 11}, "got 11"),
    ],
)
def test_memory_bad_arguments(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        MemoryManager(**kwargs)
