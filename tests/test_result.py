"""ContextResult: the printed budget table, explain() for every cut or dropped item, and a
JSON dump that carries the same numbers."""

from __future__ import annotations

import json
import re

import pytest

from contextfold import (
    Action,
    ContextItem,
    ContextPipeline,
    ContextResult,
    OpenAIFormatter,
    SectionBudget,
    SourceType,
    TokenBudget,
    fixed5_budget,
)
from contextfold.result import render_budget_table

SENTENCE = "The quick brown fox jumps over the lazy dog near the river bank. "
SECTIONS = ["instructions", "goal", "memory", "retrieval", "tool_outputs"]


@pytest.fixture(scope="module")
def over_retrieval() -> ContextResult:
    """fixed5 with 4 × 222 tokens of retrieval against its 550: two fit, one is cut, one goes."""
    docs = [
        ContextItem(id=f"doc{i}", content=f"Doc {i}. " + SENTENCE * 15, score=1 - i / 10)
        for i in range(4)
    ]
    pipeline = ContextPipeline().with_budget(fixed5_budget()).add_items(docs)
    return pipeline.add_system_prompt("Answer from the docs.").build("Where is the fox?")


def _row(table: str, name: str) -> str:
    return next(line for line in table.splitlines() if f" {name} " in line)


def test_table_lists_every_section_and_flags_retrieval(over_retrieval: ContextResult) -> None:
    table = str(over_retrieval.diagnostics)
    assert table.startswith("Context budget")
    for name in SECTIONS:
        assert name in table
    assert "⚠ TRUNCATED" in _row(table, "retrieval")
    assert table.count("⚠") == 1
    assert "550" in _row(table, "retrieval")
    assert "255" in _row(table, "instructions")
    d = over_retrieval.diagnostics
    flat = " ".join(table.split())  # rich wraps the totals line at the console width
    assert f"total {d.used_tokens:,} / 3,247 tokens" in flat
    assert "4 kept, 1 truncated, 1 dropped of 6" in flat


def test_retrieval_section_usage(over_retrieval: ContextResult) -> None:
    retrieval = next(s for s in over_retrieval.diagnostics.sections if s.name == "retrieval")
    assert (retrieval.limit, retrieval.candidates) == (550, 4)
    assert (retrieval.kept, retrieval.truncated, retrieval.dropped) == (2, 1, 1)
    assert retrieval.used <= 550
    assert retrieval.status == "TRUNCATED"
    assert over_retrieval.diagnostics.truncated_sections == ["retrieval"]
    assert [i.id for i in over_retrieval.overflow_items] == ["doc3"]


def test_explain_lists_every_cut_and_dropped_item(over_retrieval: ContextResult) -> None:
    text = over_retrieval.explain()
    assert text.startswith(str(over_retrieval.diagnostics).rstrip())
    cut = next(d for d in over_retrieval.decisions if d.item_id == "doc2")
    dropped = next(d for d in over_retrieval.decisions if d.item_id == "doc3")
    assert cut.action is Action.TRUNCATED and dropped.action is Action.DROPPED
    lines = [line for line in text.splitlines() if line.startswith("  ")]
    assert len(lines) == 2
    assert "truncated" in lines[0] and "doc2" in lines[0] and cut.reason in lines[0]
    assert f"{cut.tokens_before:,} → {cut.tokens_after:,} tokens" in lines[0]
    assert "dropped" in lines[1] and "doc3" in lines[1]
    assert "needs 222 tokens" in lines[1] and "left in section 'retrieval'" in lines[1]
    assert "doc0" not in text and "doc1" not in text  # kept items are not listed
    assert str(over_retrieval) == text


def test_truncated_item_is_marked_in_the_payload(over_retrieval: ContextResult) -> None:
    (cut,) = [i for i in over_retrieval.items if i.id == "doc2"]
    assert cut.content.endswith("[…truncated]")
    assert cut.content.startswith("Doc 2. The quick brown fox")
    assert cut.content in over_retrieval.text
    assert "Doc 3." not in over_retrieval.text


def test_to_json_round_trips_the_numbers(over_retrieval: ContextResult) -> None:
    data = json.loads(over_retrieval.to_json())
    d = over_retrieval.diagnostics
    assert data["diagnostics"]["used_tokens"] == d.used_tokens
    assert data["diagnostics"]["build_time_ms"] == d.build_time_ms
    assert [s["name"] for s in data["diagnostics"]["sections"]] == SECTIONS
    assert data["diagnostics"]["sections"] == [s.model_dump() for s in d.sections]
    assert [x["action"] for x in data["window"]["decisions"]] == [
        x.action.value for x in over_retrieval.decisions
    ]
    assert data["formatted_output"] == over_retrieval.formatted_output
    assert data["query"]["query_str"] == "Where is the fox?"
    assert json.loads(over_retrieval.to_json(indent=None)) == data
    assert "\n" not in over_retrieval.to_json(indent=None)


def test_a_result_that_fits_has_no_warnings() -> None:
    result = ContextPipeline(max_tokens=500).add_system_prompt("Be brief.").build("hi")
    assert "⚠" not in str(result)
    assert [line for line in result.explain().splitlines() if line.startswith("  ")] == []
    assert result.overflow_items == ()
    assert result.diagnostics.truncated_sections == []


def test_json_payload_of_a_provider_format() -> None:
    pipeline = ContextPipeline(max_tokens=500, formatter=OpenAIFormatter())
    result = pipeline.add_system_prompt("Be brief.").build("hi")
    data = json.loads(result.to_json())
    assert data["formatted_output"] == result.formatted_output
    assert isinstance(result.text, str) and "hi" in result.text
    assert data["diagnostics"]["format"] == "openai"


def test_estimated_counter_is_labelled() -> None:
    result = ContextPipeline(max_tokens=500, model="claude-sonnet-4").build("hi")
    table = render_budget_table(result.diagnostics)
    assert "o200k_base+15% (estimated)" in " ".join(table.split())
    exact = ContextPipeline(max_tokens=500).build("hi")
    assert "estimated" not in str(exact.diagnostics)
    assert render_budget_table(result.diagnostics, width=60).count("\n") > table.count("\n")


def test_pinned_over_a_section_cap_is_flagged() -> None:
    section = SectionBudget(name="rules", sources=(SourceType.SYSTEM,), max=5)
    pipeline = ContextPipeline(budget=TokenBudget(max_tokens=1000, sections=(section,)))
    result = pipeline.add_system_prompt("A system prompt far longer than five tokens.").build("q")
    assert "⚠ OVER CAP" in _row(str(result.diagnostics), "rules")
    assert result.diagnostics.truncated_sections == ["rules"]


def test_explain_names_dropped_chunks_and_turns_by_label_not_by_id() -> None:
    """A chunk is its document and position, a conversation item its role and turn: never the
    id (a content hash in the CLI's corpus)."""
    text = SENTENCE * 15
    chunks = [
        ContextItem(
            id=f"{i:064x}",
            content=f"Chunk {i}. {text}",
            score=1 - i / 10,
            metadata={"source": "travel_policy.txt", "chunk_index": i},
        )
        for i in range(4)
    ]
    turns = [
        ContextItem(
            content=f"Turn {i}. {text}",
            source=SourceType.CONVERSATION,
            metadata={"role": "user" if i % 2 == 0 else "assistant"},
        )
        for i in range(20)
    ]
    pipeline = ContextPipeline().with_budget(fixed5_budget()).add_items([*turns, *chunks])
    result = pipeline.build("Where is the fox?")
    lines = [line for line in result.explain().splitlines() if line.startswith("  ")]
    assert any(re.search(r"dropped\s+retrieval\s+travel_policy\.txt chunk 4 ", x) for x in lines)
    assert any(re.search(r"dropped\s+goal\s+user turn 1 ", x) for x in lines)
    assert not any(re.search(r"[0-9a-f]{16}", x) for x in lines)
    by_id = {d.item_id: d.label for d in result.decisions}
    assert by_id[chunks[0].id] == "travel_policy.txt chunk 1"
    assert by_id[turns[19].id] == "assistant turn 20"
