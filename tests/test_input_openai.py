"""OpenAI Chat Completions messages (assistant ``tool_calls``, ``tool`` messages with a
``tool_call_id``) as memory input, through the library and ``contextfold memory compact``: the
tool call and its result are kept as content blocks, and a malformed message is one clear line.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner, Result

from contextfold.cli import app
from contextfold.errors import ConfigError, FormatError
from contextfold.formats.openai import message_from_dict, parse_openai_messages
from contextfold.items import Message, TextBlock, ToolResultBlock, ToolUseBlock
from contextfold.memory.config import MemoryConfig, load_config
from contextfold.memory.engine import MemoryEngine

CALL = {"id": "c1", "type": "function", "function": {"name": "w", "arguments": '{"city":"Paris"}'}}
OPENAI: list[dict[str, Any]] = [
    {"role": "user", "content": "Weather in Paris?"},
    {"role": "assistant", "content": None, "tool_calls": [CALL]},
    {"role": "tool", "tool_call_id": "c1", "content": "18C"},
    {"role": "assistant", "content": "18C."},
]
EXPECTED = [
    Message(role="user", content="Weather in Paris?"),
    Message(role="assistant", content=(ToolUseBlock(id="c1", name="w", input={"city": "Paris"}),)),
    Message(role="tool", content=(ToolResultBlock(tool_use_id="c1", content="18C"),)),
    Message(role="assistant", content="18C."),
]
#: contextfold's own shape (Anthropic's, for an assistant's tool_use blocks).
NATIVE: list[dict[str, Any]] = [
    {"role": "user", "content": [{"type": "text", "text": "Weather in Paris?"}]},
    {
        "role": "assistant",
        "content": [{"type": "tool_use", "id": "c1", "name": "w", "input": {"city": "Paris"}}],
    },
    {"role": "tool", "content": [{"type": "tool_result", "tool_use_id": "c1", "content": "18C"}]},
    {"role": "assistant", "content": "18C."},
]


def engine() -> MemoryEngine:
    return MemoryEngine(MemoryConfig(), store=":memory:", embedder=None)


def stored(eng: MemoryEngine) -> list[Message]:
    return [t.message for t in eng.store.turns("default")]


@pytest.mark.parametrize("messages", [OPENAI, NATIVE], ids=["openai", "native"])
def test_message_from_dict_reads_both_shapes(messages: list[dict[str, Any]]) -> None:
    assert [message_from_dict(m) for m in messages] == EXPECTED


def test_message_from_dict_keeps_openai_text_beside_tool_calls_and_developer_role() -> None:
    message = message_from_dict({"role": "assistant", "content": "Checking.", "tool_calls": [CALL]})
    assert message.content == (
        TextBlock(text="Checking."),
        ToolUseBlock(id="c1", name="w", input={"city": "Paris"}),
    )
    assert message_from_dict({"role": "developer", "content": "Be brief."}).role == "system"


def test_parse_openai_messages_still_merges_consecutive_tool_messages() -> None:
    two = [
        {"role": "tool", "tool_call_id": "a", "content": "1"},
        {"role": "tool", "tool_call_id": "b", "content": "2"},
    ]
    (message,) = parse_openai_messages(two)
    assert message.tool_result_ids == ("a", "b")
    with pytest.raises(FormatError, match=r"^messages\[1\]\.tool_call_id is null"):
        parse_openai_messages([two[0], {"role": "tool", "content": "2"}])


@pytest.mark.parametrize(
    ("message", "error"),
    [
        ({"role": "tool", "content": "18C"}, "tool_call_id is null; expected a string"),
        (
            {"role": "user", "content": "hi", "tool_calls": [CALL]},
            "tool_calls appears in a 'user' message; only assistant messages call tools",
        ),
        (
            {
                "role": "assistant",
                "tool_calls": [{**CALL, "function": {"name": "w", "arguments": "{"}}],
            },
            "tool_calls[0].function.arguments is not valid JSON",
        ),
        (
            {"role": "tool", "content": [{"type": "text", "text": "18C"}]},
            "a 'tool' message holds only tool_result blocks",
        ),
        ({"role": "robot", "content": "hi"}, "role: Input should be"),
        ({"role": "user", "content": "hi", "when": 3}, "when: Extra inputs are not permitted"),
    ],
)
def test_message_from_dict_errors_are_one_clear_line(message: dict[str, Any], error: str) -> None:
    with pytest.raises(FormatError) as info:
        message_from_dict(message)
    text = str(info.value)
    assert text.startswith(error), text
    assert "\n" not in text and "Value error" not in text and not text.startswith((":", " "))


def test_the_engine_stores_openai_tool_calls_as_blocks() -> None:
    eng = engine()
    eng.on_turn_complete(OPENAI)
    assert stored(eng) == EXPECTED
    eng.on_turn_complete(OPENAI)  # the same history again stores nothing twice
    assert len(stored(eng)) == 4
    assembled = eng.on_message_inbound({"role": "user", "content": "And Rome?"}, OPENAI)
    assert assembled.history is not None


def test_the_engine_still_reads_its_own_and_anthropic_shapes() -> None:
    eng = engine()
    eng.on_turn_complete(NATIVE)
    assert stored(eng) == EXPECTED


def test_the_engine_refuses_a_bad_message_in_one_line() -> None:
    with pytest.raises(ConfigError) as info:
        engine().on_turn_complete([{"role": "tool", "content": "18C"}])
    text = str(info.value)
    assert text.startswith("not a chat message: tool_call_id is null; expected a string")
    assert "\n" not in text and "pydantic" not in text
    with pytest.raises(ConfigError, match=r"^not a chat message: expected a message object"):
        engine().on_turn_complete(["hello"])  # type: ignore[list-item]


# --------------------------------------------------------------------------- the CLI


def invoke(*args: str | Path) -> Result:
    return CliRunner().invoke(app, [str(a) for a in args])


@pytest.fixture
def config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("CONTEXTFOLD_HOME", str(tmp_path / "home"))
    path = tmp_path / "contextfold.yaml"
    path.write_text(
        f"recall: {{embedder: none}}\nstorage_path: {tmp_path / 'memory.db'}\n", encoding="utf-8"
    )
    return path


def write(tmp_path: Path, messages: object) -> Path:
    path = tmp_path / "oa.json"
    path.write_text(json.dumps(messages), encoding="utf-8")
    return path


def stored_in(config: Path) -> list[Message]:
    eng = MemoryEngine(load_config(config))
    try:
        return stored(eng)
    finally:
        eng.close()


@pytest.mark.parametrize("messages", [OPENAI, {"messages": OPENAI}, NATIVE])
def test_compact_reads_openai_tool_calls(config: Path, tmp_path: Path, messages: object) -> None:
    result = invoke("memory", "compact", "-i", write(tmp_path, messages), "-c", config)
    assert result.exit_code == 0, result.output
    assert "stored 4 new turn(s) of 4 message(s)" in result.stdout
    assert stored_in(config) == EXPECTED


def test_compact_reads_a_tool_call_turn_without_content(config: Path, tmp_path: Path) -> None:
    no_content = [OPENAI[0], {"role": "assistant", "tool_calls": [CALL]}, *OPENAI[2:]]
    result = invoke("memory", "compact", "-i", write(tmp_path, no_content), "-c", config)
    assert result.exit_code == 0, result.output
    assert stored_in(config) == EXPECTED


@pytest.mark.parametrize(
    "call",
    [
        {"function_call": {"name": "w", "arguments": "{}"}},  # OpenAI's legacy form
        {"tool_calls": [{"id": "c9", "type": "custom", "custom": {"name": "w", "input": "x"}}]},
        {"tool_calls": [{**CALL, "function": {"name": "w", "arguments": '{"city": "Par'}}]},
    ],
    ids=["function_call", "custom", "arguments cut off"],
)
def test_compact_reads_a_tool_call_it_cannot_parse_as_the_text_beside_it(
    config: Path, tmp_path: Path, call: dict[str, Any]
) -> None:
    """Files such messages loaded from before tool calls were read (the text kept, the call
    left out) still load the same way."""
    turn = {"role": "assistant", "content": "Let me check.", **call}
    path = write(tmp_path, [OPENAI[0], turn])
    result = invoke("memory", "compact", "-i", path, "-c", config)
    assert result.exit_code == 0, result.output
    assert [(m.role, m.text()) for m in stored_in(config)] == [
        ("user", "Weather in Paris?"),
        ("assistant", "Let me check."),
    ]


@pytest.mark.parametrize(
    ("message", "error"),
    [
        ({"role": "tool", "content": "18C"}, "tool_call_id is null; expected a string"),
        (
            {"role": "assistant", "tool_calls": [{"type": "function", "function": {"name": "w"}}]},
            "tool_calls[0].id is null; expected a string",
        ),
        (
            {"role": "tool", "content": [{"type": "text", "text": "18C"}]},
            "a 'tool' message holds only tool_result blocks",
        ),
        ({"role": "user"}, 'must be an object with "role" and "content"'),
    ],
)
def test_compact_names_the_bad_message_in_one_line(
    config: Path, tmp_path: Path, message: dict[str, Any], error: str
) -> None:
    path = write(tmp_path, [OPENAI[0], message])
    result = invoke("memory", "compact", "-i", path, "-c", config)
    assert result.exit_code == 2, result.output
    assert result.stderr.startswith(f"error: {path}: message 2"), result.stderr
    assert error in result.stderr and len(result.stderr.splitlines()) == 1, result.stderr
    assert ": : " not in result.stderr and "Value error" not in result.stderr
