"""Lone UTF-16 surrogates (an emoji cut in half, JSON ``"\\ud83d"``, undecodable argv bytes)
become U+FFFD where text enters: message, item and document content, so nothing downstream
fails to encode it. A surrogate pair written as two escapes is the character it encodes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner, Result

from contextfold import ContextPipeline
from contextfold.cli import app
from contextfold.formats import OpenAIFormatter
from contextfold.items import (
    ContextItem,
    Message,
    QueryBundle,
    TextBlock,
    ToolResultBlock,
    ToolUseBlock,
    valid_text,
)
from contextfold.memory.config import MemoryConfig, load_config
from contextfold.memory.engine import MemoryEngine
from contextfold.retrieval.loaders import load_documents

HALF = "\ud83d"  # the high half of 😀 (U+1F600), alone
BAD = f"cut {HALF} here"
FIXED = "cut \ufffd here"


def invoke(*args: str | Path) -> Result:
    return CliRunner().invoke(app, [str(a) for a in args])


@pytest.mark.parametrize(
    ("raw", "clean"),
    [
        (BAD, FIXED),
        ("low \udc00 alone", "low \ufffd alone"),
        ("caf\udce9", "caf\ufffd"),  # how Python decodes the argv byte 0xE9 (surrogateescape)
        ("\ude00\ud83d", "\ufffd\ufffd"),  # a pair in the wrong order is two halves
        ("pair \ud83d\ude00 joined", "pair \U0001f600 joined"),
        ("plain ascii", "plain ascii"),
        ("ünïcode 😀 stays", "ünïcode 😀 stays"),
    ],
)
def test_valid_text_replaces_lone_surrogates(raw: str, clean: str) -> None:
    assert valid_text(raw) == clean
    valid_text(raw).encode("utf-8")  # never raises


def test_json_gives_a_pair_of_escapes_as_the_real_character() -> None:
    # json.loads already joins a pair; a half alone is what reaches the models.
    assert json.loads('"\\ud83d\\ude00"') == "\U0001f600"
    assert json.loads('"\\ud83d x"') == f"{HALF} x"


def test_message_item_and_query_text_is_made_valid() -> None:
    message = Message(role="user", content=BAD, name=f"n{HALF}")
    assert message.text() == FIXED
    assert message.name == "n\ufffd"
    assert Message.model_validate({"role": "user", "content": [{"type": "text", "text": BAD}]})
    assert TextBlock(text=BAD).text == FIXED
    assert ContextItem(content=BAD).content == FIXED
    assert ContextItem.from_message(message).content == FIXED
    assert QueryBundle(query_str=BAD).query_str == FIXED
    call = ToolUseBlock(id=f"c{HALF}", name="w", input={"q": BAD, "list": [BAD, 1]})
    assert call.id == "c\ufffd"
    assert call.input == {"q": FIXED, "list": [FIXED, 1]}
    call.arguments_json().encode("utf-8")
    assert ToolResultBlock(tool_use_id="c", content=BAD).content == FIXED


def test_a_build_with_a_half_emoji_renders_encodable_text() -> None:
    result = ContextPipeline(max_tokens=500, formatter=OpenAIFormatter()).build(BAD)
    json.dumps(result.formatted_output, ensure_ascii=False).encode("utf-8")
    assert FIXED in result.to_json()


def test_memory_stores_a_half_emoji_as_the_replacement_character() -> None:
    engine = MemoryEngine(MemoryConfig(), store=":memory:", embedder=None)
    engine.on_turn_complete(
        [{"role": "user", "content": BAD}, {"role": "assistant", "content": "ok"}]
    )
    assert [t.message.text() for t in engine.store.turns("default")] == [FIXED, "ok"]


def test_documents_with_a_half_emoji_load_as_valid_text(tmp_path: Path) -> None:
    path = tmp_path / "docs.jsonl"
    rows = [{"title": f"T{HALF}", "text": BAD, "tag": HALF}, {"text": "pair \ud83d\ude00"}]
    path.write_text("\n".join(json.dumps(r) for r in rows), encoding="utf-8")
    first, second = load_documents(path)
    assert first.text == f"T\ufffd\n{FIXED}"
    assert first.metadata == {"title": "T\ufffd", "tag": "\ufffd", "source": "docs.jsonl"}
    assert second.text == "pair \U0001f600"
    (tmp_path / "one.json").write_text(json.dumps([BAD]), encoding="utf-8")
    assert [d.text for d in load_documents(tmp_path / "one.json")] == [FIXED]


def test_an_index_stores_and_finds_a_half_emoji_document(tmp_path: Path) -> None:
    from contextfold.retrieval.index import DocumentIndex

    index = DocumentIndex(str(tmp_path / "docs.db"), embedder=None)
    (added,) = index.add_documents([(BAD, {})])
    assert added.added
    (record,) = index.store.documents()
    assert record.text == FIXED
    assert index.add_documents([(FIXED, {})])[0].added is False  # the same text, stored once


# --------------------------------------------------------------------------- the CLI


def test_ingest_stores_a_half_emoji_document_and_search_finds_it(tmp_path: Path) -> None:
    path = tmp_path / "docs.jsonl"
    rows = [{"text": "Hotels are capped at 200 a night."}, {"text": f"Taxis {HALF} are fine."}]
    path.write_text("\n".join(json.dumps(r) for r in rows), encoding="utf-8")
    db = tmp_path / "docs.db"
    result = invoke("ingest", path, "--db", db)
    assert result.exit_code == 0, result.output
    assert "ingested 2 new document(s)" in result.stdout
    assert "skipped" not in result.stderr
    # `contextfold search $'taxis caf\xe9'`: the query embeds (hybrid) with U+FFFD in it.
    found = invoke("search", "taxis caf\udce9", "--db", db, "-k", "1", "--json")
    assert found.exit_code == 0, found.output
    assert [h["text"] for h in json.loads(found.stdout)] == ["Taxis \ufffd are fine."]


def test_memory_compact_stores_a_half_emoji_turn(tmp_path: Path) -> None:
    config = tmp_path / "contextfold.yaml"
    config.write_text(
        f"recall: {{embedder: none}}\nstorage_path: {tmp_path / 'memory.db'}\n", encoding="utf-8"
    )
    conversation = tmp_path / "conv.json"
    conversation.write_text(
        json.dumps([{"role": "user", "content": BAD}, {"role": "assistant", "content": "ok"}]),
        encoding="utf-8",
    )
    result = invoke("memory", "compact", "-i", conversation, "-c", config)
    assert result.exit_code == 0, result.output
    engine = MemoryEngine(load_config(config))
    try:
        assert [t.message.text() for t in engine.store.turns("default")] == [FIXED, "ok"]
    finally:
        engine.close()


def test_build_with_a_half_emoji_query_prints_the_replacement_character(tmp_path: Path) -> None:
    request = tmp_path / "request.json"
    request.write_text(json.dumps({"system": f"Be {HALF}.", "query": BAD}), encoding="utf-8")
    result = invoke("build", "-i", request)
    assert result.exit_code == 0, result.output
    assert FIXED in result.stdout and "Be \ufffd." in result.stdout


def test_build_with_undecodable_argv_bytes_prints_the_replacement_character() -> None:
    # `contextfold build --query $'caf\xe9'` in a UTF-8 locale: Python hands over "caf\udce9".
    result = invoke("build", "--query", "caf\udce9 hotel", "--format", "openai")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["messages"][-1]["content"] == "caf\ufffd hotel"
