"""Conversation history: trim_history's contiguous suffix and MemoryManager's sliding window,
both measured with a format's overhead and never splitting a tool call from its result."""

from __future__ import annotations

from typing import Any

import pytest

from contextfold.conversation import MemoryManager, trim_history
from contextfold.errors import ConfigError
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
def test_trim_keeps_the_longest_fitting_suffix(o200k: TiktokenCounter, fmt: str) -> None:
    full = _cost(HISTORY, o200k, fmt)
    assert trim_history(HISTORY, full, o200k, format=fmt) == HISTORY
    system_cost = _cost(HISTORY[:1], o200k, fmt)
    for budget in range(system_cost, full):
        kept = trim_history(HISTORY, budget, o200k, format=fmt)
        assert kept[0] == HISTORY[0]  # the system message stays
        body = kept[1:]
        assert body == HISTORY[len(HISTORY) - len(body) :]  # a contiguous suffix
        assert _cost(kept, o200k, fmt) <= budget
        assert _pairs_intact(kept)
        # The next longer suffix whose start is not a tool result would not fit.
        start = len(HISTORY) - len(body)
        longer = next(i for i in range(start - 1, 0, -1) if HISTORY[i].role != "tool")
        assert _cost(HISTORY[:1] + HISTORY[longer:], o200k, fmt) > budget


def test_trim_never_splits_a_tool_pair(o200k: TiktokenCounter) -> None:
    # Budget for [result c2, assistant] but not the call: the pair goes as one.
    tail = HISTORY[-3:]
    budget = _cost(HISTORY[:1] + tail, o200k) - 1
    kept = trim_history(HISTORY, budget, o200k)
    assert kept == [HISTORY[0], HISTORY[-1]]
    assert [m.role for m in trim_history(HISTORY, budget + 1, o200k)] == [
        "system",
        "assistant",
        "tool",
        "assistant",
    ]


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
    # One token short of the whole: the user turn goes; the call and both results stay.
    assert trim_history(parallel, full - 1, o200k) == parallel[1:]
    # One token short of the call with its results: none of the three is kept.
    assert trim_history(parallel, _cost(parallel[1:], o200k) - 1, o200k) == parallel[4:]


def test_trim_without_keep_system(o200k: TiktokenCounter) -> None:
    budget = _cost(HISTORY[-1:], o200k)
    assert trim_history(HISTORY, budget, o200k, keep_system=False) == HISTORY[-1:]
    assert trim_history(HISTORY[1:2], 0, o200k) == []  # nothing fits: nothing kept
    assert trim_history([], 10, o200k) == []


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"max_tokens": 5}, "system message alone needs 10 tokens, more than the 5 allowed"),
        ({"max_tokens": 100, "format": "xml"}, "unknown format 'xml'"),
    ],
)
def test_trim_bad_arguments(o200k: TiktokenCounter, kwargs: dict[str, Any], message: str) -> None:
    assert _cost(HISTORY[:1], o200k) == 10
    with pytest.raises(ConfigError, match=message):
        trim_history(HISTORY, counter=o200k, **kwargs)


def test_memory_evicts_oldest_first(o200k: TiktokenCounter) -> None:
    memory = MemoryManager(conversation_tokens=30, counter=o200k)
    for i in range(6):
        memory.add_user_message(f"message number {i}")  # 7 tokens each with overhead
        assert memory.total_tokens <= 30
    assert [m.text() for m in memory.messages] == [f"message number {i}" for i in range(2, 6)]
    assert memory.evicted == 2
    assert memory.total_tokens == count_messages(memory.messages, o200k, "openai") == 28
    assert "evicted=2" in repr(memory)


def test_memory_evicts_a_tool_pair_together(o200k: TiktokenCounter) -> None:
    memory = MemoryManager(conversation_tokens=30, counter=o200k)
    memory.add_messages([call("c1"), result("c1", "long result " * 3), user("hello there")])
    assert [count_messages([m], o200k) for m in memory.messages] == [10, 10, 5]
    memory.add_user_message("next question please")  # 6 more: 31 > 30
    # Evicting the call alone would have been enough; its result goes with it.
    assert [m.text() for m in memory.messages] == ["hello there", "next question please"]
    assert memory.evicted == 2
    assert memory.total_tokens == 11


def test_memory_keeps_a_pending_call_then_evicts_the_pair(o200k: TiktokenCounter) -> None:
    memory = MemoryManager(conversation_tokens=10, counter=o200k)
    memory.add_user_message("please call it")
    memory.add_message(call("c9", name="a_really_long_tool_name_that_costs_tokens"))
    assert [m.role for m in memory.messages] == ["assistant"]  # over budget, but its result
    assert memory.total_tokens > 10  # is still to come
    memory.add_message(
        {"role": "tool", "content": [{"type": "tool_result", "tool_use_id": "c9", "content": "k"}]}
    )
    assert memory.messages == []  # the completed pair alone exceeds the window: both go
    assert memory.evicted == 3


@pytest.mark.parametrize(("fmt", "per_message"), [("openai", 3), ("anthropic", 4), ("text", 0)])
def test_memory_counts_with_the_format_overhead(
    o200k: TiktokenCounter, fmt: str, per_message: int
) -> None:
    memory = MemoryManager(conversation_tokens=12, counter=o200k, format=fmt)
    memory.add_user_message("hi")
    memory.add_assistant_message("hello")
    assert memory.total_tokens == 2 + 2 * per_message
    for _ in range(3):
        memory.add_user_message("more")
    expected = 12 // (1 + per_message)  # every message costs 1 token of text plus overhead
    assert len(memory.messages) == min(5, expected)


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
