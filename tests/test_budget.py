"""Token budgets: validation with the numbers in the message, the presets' shares and reserves,
and which section an item lands in."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from pydantic import ValidationError

from contextfold.budget import (
    FIXED5_FRAME_TOKENS,
    OverflowStrategy,
    SectionBudget,
    TokenBudget,
    default_agent_budget,
    default_chat_budget,
    default_rag_budget,
    fixed5_budget,
    graph_budget,
)
from contextfold.errors import BudgetError, ConfigError
from contextfold.items import ContextItem, SourceType

S = SourceType


def _summarize(items: Any, max_tokens: int, counter: Any) -> list[ContextItem]:
    return []


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"min": 500, "max": 400}, "min 500 exceeds max 400"),
        ({"min": 2500, "max": 1200}, "min 2,500 exceeds max 1,200"),
        ({"min": -1}, "min -1"),
        ({"max": -5}, "max -5 must be >= 0"),
        ({"priority": 0}, "priority 0 is not in 1..10"),
        ({"priority": 11}, "priority 11 is not in 1..10"),
        ({"overflow": "summarize"}, "uses overflow 'summarize' but has no summarize hook"),
    ],
)
def test_section_validation(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(BudgetError, match=message) as info:
        SectionBudget(name="docs", **kwargs)
    assert "'docs'" in str(info.value)
    assert isinstance(info.value, ConfigError)


def test_summarize_with_hook_is_valid() -> None:
    section = SectionBudget(name="docs", overflow="summarize", summarize=_summarize)
    assert section.overflow is OverflowStrategy.SUMMARIZE
    assert section.summarize is _summarize


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"max_tokens": 0}, "got max_tokens 0 and reserve_output 0"),
        ({"max_tokens": -10}, "got max_tokens -10"),
        ({"max_tokens": 100, "reserve_output": -1}, "reserve_output -1"),
        ({"max_tokens": 4096, "reserve_output": 4096}, "reserve_output 4,096 leaves nothing"),
        ({"max_tokens": 4096, "reserve_output": 5000}, "of max_tokens 4,096"),
    ],
)
def test_totals_validation(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(BudgetError, match=message):
        TokenBudget(**kwargs)


def test_section_reserves_over_total_name_both_numbers() -> None:
    sections = (SectionBudget(name="a", min=5000), SectionBudget(name="b", min=2000))
    with pytest.raises(BudgetError) as info:
        TokenBudget(max_tokens=8000, reserve_output=1024, sections=sections)
    message = str(info.value)
    assert "sections reserve 7,000 tokens" in message
    assert "has 6,976" in message
    assert "1,024-token response reserve" in message
    # Exactly the available tokens is fine.
    TokenBudget(max_tokens=8024, reserve_output=1024, sections=sections)


def test_section_max_over_available() -> None:
    with pytest.raises(BudgetError, match="max 950 exceeds the 900 tokens available"):
        TokenBudget(
            max_tokens=1000, reserve_output=100, sections=(SectionBudget(name="a", max=950),)
        )


def test_duplicate_section_names() -> None:
    sections = tuple(SectionBudget(name=n) for n in ("docs", "tools", "docs", "tools", "x"))
    with pytest.raises(BudgetError, match=r"repeated: \['docs', 'tools'\]"):
        TokenBudget(max_tokens=1000, sections=sections)


def test_source_claimed_twice() -> None:
    sections = (
        SectionBudget(name="docs", sources=(S.RETRIEVAL, S.MEMORY)),
        SectionBudget(name="facts", sources=(S.MEMORY,)),
    )
    with pytest.raises(BudgetError, match="'memory' is claimed by sections 'docs' and 'facts'"):
        TokenBudget(max_tokens=1000, sections=sections)


@pytest.mark.parametrize(
    ("factory", "shares"),
    [
        (
            default_chat_budget,
            {
                "system": 0.10,
                "conversation": 0.60,
                "memory": 0.10,
                "retrieval": 0.15,
                "tools": 0.05,
            },
        ),
        (
            default_rag_budget,
            {
                "system": 0.10,
                "retrieval": 0.40,
                "conversation": 0.25,
                "memory": 0.10,
                "tools": 0.10,
            },
        ),
        (
            default_agent_budget,
            {
                "system": 0.15,
                "tools": 0.30,
                "conversation": 0.25,
                "retrieval": 0.20,
                "memory": 0.10,
            },
        ),
    ],
)
@pytest.mark.parametrize("max_tokens", [8192, 128_000])
def test_presets_reserve_15_percent_and_share_the_rest(
    factory: Callable[[int], TokenBudget], shares: dict[str, float], max_tokens: int
) -> None:
    budget = factory(max_tokens)
    assert budget.max_tokens == max_tokens
    assert budget.reserve_output == int(max_tokens * 0.15)
    assert budget.available == max_tokens - int(max_tokens * 0.15)
    assert {s.name: s.min for s in budget.sections} == {
        name: int(budget.available * share) for name, share in shares.items()
    }
    assert budget.strict is False
    assert all(s.max is None for s in budget.sections)
    priorities = [s.priority for s in budget.sections]
    assert priorities == sorted(priorities, reverse=True)


def test_chat_budget_doc_numbers_and_custom_reserve() -> None:
    budget = default_chat_budget(8192)
    assert (budget.reserve_output, budget.available) == (1228, 6964)
    assert default_chat_budget(1000, reserve_ratio=0.0).reserve_output == 0
    assert default_rag_budget(1000, reserve_ratio=0.5).available == 500
    with pytest.raises(BudgetError, match="reserve ratio must be in"):
        default_agent_budget(1000, reserve_ratio=1.0)


def test_fixed5_sections_exact_and_strict() -> None:
    budget = fixed5_budget()
    assert [(s.name, s.min, s.max) for s in budget.sections] == [
        ("instructions", 255, 255),
        ("goal", 1500, 1500),
        ("memory", 55, 55),
        ("retrieval", 550, 550),
        ("tool_outputs", 855, 855),
    ]
    assert budget.strict is True
    # The sections' 3,215 plus the frame tokens a format adds around them.
    assert FIXED5_FRAME_TOKENS == 32
    assert (budget.max_tokens, budget.reserve_output, budget.available) == (3247, 0, 3247)
    overflow = {s.name: s.overflow for s in budget.sections}
    assert overflow["retrieval"] is OverflowStrategy.TRUNCATE
    assert overflow["tool_outputs"] is OverflowStrategy.TRUNCATE_OLDEST
    assert overflow["memory"] is OverflowStrategy.DROP


def test_fixed5_scale_and_reserve() -> None:
    budget = fixed5_budget(scale=2.0, reserve_output=1000)
    assert [s.max for s in budget.sections] == [510, 3000, 110, 1100, 1710]
    assert (budget.max_tokens, budget.available) == (7430 + 32, 6430 + 32)
    assert fixed5_budget(frame_tokens=0).max_tokens == 3215
    with pytest.raises(BudgetError, match="scale must be > 0 and frame_tokens >= 0, got 0, 32"):
        fixed5_budget(scale=0)
    with pytest.raises(BudgetError, match=r"got 1\.0, -1"):
        fixed5_budget(frame_tokens=-1)


@pytest.mark.parametrize(("max_tokens", "reserve"), [(1000, 0), (10_000, 1000)])
def test_graph_budget_60_30_10(max_tokens: int, reserve: int) -> None:
    budget = graph_budget(max_tokens, reserve_output=reserve)
    available = max_tokens - reserve
    assert [(s.name, s.max) for s in budget.sections] == [
        ("entry_points", int(available * 0.6)),
        ("expanded", int(available * 0.3)),
        ("entities", int(available * 0.1)),
    ]
    assert budget.strict is True
    assert all(s.sources == () for s in budget.sections)


def test_graph_budget_reserve_over_total_names_the_reserve() -> None:
    with pytest.raises(BudgetError, match="reserve_output 200 leaves nothing of max_tokens 100"):
        graph_budget(100, reserve_output=200)


@pytest.mark.parametrize(
    ("item", "expected"),
    [
        (ContextItem(content="x", source=S.SYSTEM), "system"),
        (ContextItem(content="x", source=S.USER), "conversation"),
        (ContextItem(content="x", source=S.CONVERSATION), "conversation"),
        (ContextItem(content="x", source=S.TOOL), "tools"),
        (ContextItem(content="x", source=S.RETRIEVAL, section="memory"), "memory"),  # explicit
        (ContextItem(content="x", source=S.RETRIEVAL, section="nope"), "retrieval"),  # fallback
    ],
)
def test_section_for_chat_budget(item: ContextItem, expected: str) -> None:
    section = default_chat_budget(8192).section_for(item)
    assert section is not None
    assert section.name == expected


def test_section_for_unmapped_and_sectionless() -> None:
    graph = graph_budget(1000)
    assert graph.section_for(ContextItem(content="x", section="expanded")).name == "expanded"
    assert graph.section_for(ContextItem(content="x")) is None  # no section takes retrieval
    assert TokenBudget(max_tokens=10).section_for(ContextItem(content="x", section="z")) is None
    partial = TokenBudget(max_tokens=100, sections=(SectionBudget(name="t", sources=(S.TOOL,)),))
    assert partial.section_for(ContextItem(content="x", source=S.MEMORY)) is None


def test_budgets_are_frozen() -> None:
    budget = fixed5_budget()
    with pytest.raises(ValidationError, match="frozen"):
        budget.max_tokens = 1  # type: ignore[misc]
    with pytest.raises(ValidationError, match="Extra inputs"):
        TokenBudget(max_tokens=10, reserve=1)  # type: ignore[call-arg]
