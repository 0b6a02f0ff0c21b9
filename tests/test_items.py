"""Items and messages: block and role validation, conversation items built from messages, and
the per-item token cache."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from contextfold.items import (
    ContextItem,
    Message,
    QueryBundle,
    SourceType,
    TextBlock,
    ToolResultBlock,
    ToolUseBlock,
)
from contextfold.tokens import CharCounter, TiktokenCounter

CALL = ToolUseBlock(id="c1", name="search", input={"q": "fox", "k": 3})
RESULT = ToolResultBlock(tool_use_id="c1", content="3 hits")


@pytest.mark.parametrize(
    ("role", "content", "message"),
    [
        ("user", [RESULT], "tool_result blocks belong in a 'tool' message, not 'user'"),
        ("assistant", [RESULT], "tool_result blocks belong in a 'tool' message, not 'assistant'"),
        ("tool", [RESULT, TextBlock(text="x")], "a 'tool' message holds only tool_result blocks"),
        ("tool", "plain text", "a 'tool' message holds only tool_result blocks"),
        ("user", [CALL], "tool_use blocks belong in an 'assistant' message, not 'user'"),
        ("system", [TextBlock(text="a"), CALL], "not 'system'"),
        ("bot", "hi", "Input should be 'system', 'user', 'assistant' or 'tool'"),
        ("user", [{"type": "image", "url": "x"}], "does not match any of the expected tags"),
        ("user", [{"type": "text"}], "Field required"),
    ],
)
def test_message_validation(role: str, content: Any, message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        Message(role=role, content=content)  # type: ignore[arg-type]


def test_message_accepts_a_string_and_dict_blocks() -> None:
    assert Message(role="user", content="hi").content == (TextBlock(text="hi"),)
    message = Message.model_validate(
        {
            "role": "assistant",
            "content": [
                {"type": "text", "text": "Searching."},
                {"type": "tool_use", "id": "c1", "name": "search", "input": {"q": "fox", "k": 3}},
            ],
        }
    )
    assert message.content[1] == CALL
    assert message.tool_use_ids == ("c1",)
    assert Message(role="tool", content=[RESULT]).tool_result_ids == ("c1",)


def test_message_text_renders_tool_traffic() -> None:
    call = Message(role="assistant", content=[TextBlock(text="Let me look."), CALL])
    result = Message(role="tool", content=[RESULT])
    assert call.text() == 'Let me look.\n[tool call search({"k":3,"q":"fox"})]'
    assert result.text() == "[tool result c1] 3 hits"
    unicode = ToolUseBlock(id="u", name="f", input={"city": "Zürich"})
    assert unicode.arguments_json() == '{"city":"Zürich"}'  # sorted, compact, not escaped


def test_messages_and_blocks_are_frozen() -> None:
    message = Message(role="user", content="hi")
    with pytest.raises(ValidationError, match="frozen"):
        message.role = "assistant"  # type: ignore[misc]
    with pytest.raises(ValidationError, match="Extra inputs"):
        TextBlock(text="x", extra=1)  # type: ignore[call-arg]


def test_from_message_makes_a_conversation_item() -> None:
    message = Message(role="assistant", content=[TextBlock(text="Let me look."), CALL])
    item = ContextItem.from_message(message)
    assert item.source is SourceType.CONVERSATION
    assert item.priority == 7
    assert item.message is message
    assert item.content == message.text()
    custom = ContextItem.from_message(message, priority=3, content="summary", group_id="g")
    assert (custom.priority, custom.content, custom.group_id) == (3, "summary", "g")


def test_item_from_a_message_dict() -> None:
    item = ContextItem(
        source=SourceType.CONVERSATION, message={"role": "user", "content": "hello there"}
    )
    assert isinstance(item.message, Message)
    assert item.content == "hello there"


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"priority": 0}, "greater than or equal to 1"),
        ({"priority": 11}, "less than or equal to 10"),
        ({"source": "database"}, "Input should be"),
        ({"bogus": 1}, "Extra inputs are not permitted"),
        ({"message": Message(role="user", content="hi")}, "only CONVERSATION items carry"),
    ],
)
def test_item_validation(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        ContextItem(content="x", **kwargs)


def test_item_defaults() -> None:
    a, b = ContextItem(content="x"), ContextItem(content="x")
    assert a.id != b.id and len(a.id) == 16
    assert (a.source, a.priority, a.score, a.pinned) == (SourceType.RETRIEVAL, 5, 0.0, False)
    assert a.created_at.tzinfo is not None
    assert a.metadata == {} and a.metadata is not b.metadata


def test_token_cache_computes_once() -> None:
    calls: list[str] = []

    class Counting(CharCounter):
        def count(self, text: str) -> int:
            calls.append(text)
            return super().count(text)

    item = ContextItem(content="abcdefgh")
    counter = Counting()
    assert item.tokens(counter) == item.tokens(counter) == 2
    assert calls == ["abcdefgh"]


def test_token_cache_is_invalidated_by_model_copy_content(o200k: TiktokenCounter) -> None:
    item = ContextItem(content="short")
    assert item.tokens(o200k) == 1
    longer = item.model_copy(update={"content": "a much longer piece of content here"})
    assert longer.tokens(o200k) == o200k.count(longer.content) == 7
    assert item.tokens(o200k) == 1  # the original still counts its own content
    same = item.model_copy(update={"score": 0.9})
    assert same.tokens(o200k) == 1


def test_token_cache_is_keyed_by_counter(o200k: TiktokenCounter) -> None:
    item = ContextItem(content="Paris is the capital of France, a country in Europe.")
    assert item.tokens(CharCounter()) == 13
    assert item.tokens(o200k) == o200k.count(item.content) == 12
    assert item.tokens(CharCounter(chars_per_token=2)) == 26


def test_query_bundle() -> None:
    query = QueryBundle(query_str="q", embedding=[0.1, 0.2], filters={"lang": "en"})
    assert query.embedding == [0.1, 0.2]
    with pytest.raises(ValidationError, match="frozen"):
        query.query_str = "other"  # type: ignore[misc]


def test_a_copy_with_new_metadata_is_costed_again() -> None:
    from contextfold.formats import GenericTextFormatter
    from contextfold.tokens import TiktokenCounter

    counter, formatter = TiktokenCounter("cl100k_base"), GenericTextFormatter()
    item = ContextItem(content="Refunds take 14 days.", metadata={"source": "a.txt"})
    short = formatter.item_costs([item], counter)[0]
    longer = item.model_copy(update={"metadata": {"source": "a-much-longer-file-name.txt"}})
    assert formatter.item_costs([longer], counter)[0] > short
    assert formatter.item_costs([item], counter)[0] == short
    moved = item.model_copy(update={"source": SourceType.MEMORY})
    formatter.item_cost(moved, counter)  # recomputed for the new source, not read from item's
    entries = moved.__pydantic_private__["_tokens"].values()  # type: ignore[index]
    assert {entry[2] for entry in entries} == {SourceType.MEMORY}
