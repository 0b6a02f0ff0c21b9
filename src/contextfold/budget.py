"""Token budgets: how many tokens each section of the window may take, and what happens when
its candidates do not fit.

A ``TokenBudget`` has a total (``max_tokens``), a response reserve, and sections. Each
``SectionBudget`` reserves ``min`` tokens, caps at ``max``, fills in ``priority`` order (higher
first) and applies its ``overflow`` strategy. Tokens a section reserves but does not use return
to a shared pool for the other sections, unless the budget is ``strict``.

>>> budget = default_chat_budget(max_tokens=8192)
>>> budget.available
6964
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from enum import StrEnum
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from contextfold.errors import BudgetError
from contextfold.items import ContextItem, SourceType
from contextfold.tokens import TokenCounter

__all__ = [
    "OverflowStrategy",
    "SectionBudget",
    "SummarizeHook",
    "TokenBudget",
    "default_agent_budget",
    "default_chat_budget",
    "default_rag_budget",
    "fixed5_budget",
    "graph_budget",
]

#: ``hook(items, max_tokens, counter) -> replacement items``; used by the ``summarize``
#: overflow strategy. It must return items whose content fits ``max_tokens`` in total.
SummarizeHook = Callable[[Sequence[ContextItem], int, TokenCounter], Sequence[ContextItem]]


class OverflowStrategy(StrEnum):
    """What a section does with candidates that do not fit."""

    TRUNCATE = "truncate"  # keep by rank; cut the first misfit at a sentence boundary, marked
    DROP = "drop"  # keep whole items by rank; drop what does not fit
    TRUNCATE_OLDEST = "truncate_oldest"  # keep newest whole; cut the oldest kept (tool outputs)
    SUMMARIZE = "summarize"  # hand the misfits to a summarize hook, pack its output


class SectionBudget(BaseModel):
    """One section of the window.

    ``sources`` lists the source types whose items land here (an item may also name its section
    explicitly). ``min`` tokens are reserved for the section; ``max`` caps it (``None``: no cap
    beyond the total). ``recency``: items that tie on priority and score rank newest first
    (by ``created_at``, then the later candidate), so when the section overflows the older ones
    are dropped first, and their decisions say so; the presets set it for memory.
    """

    model_config = ConfigDict(frozen=True, extra="forbid", arbitrary_types_allowed=True)

    name: str = Field(min_length=1)
    sources: tuple[SourceType, ...] = ()
    min: int = 0
    max: int | None = None
    priority: int = 5
    overflow: OverflowStrategy = OverflowStrategy.DROP
    summarize: SummarizeHook | None = None
    description: str = ""
    recency: bool = False

    @model_validator(mode="after")
    def _check(self) -> SectionBudget:
        if self.min < 0 or (self.max is not None and self.max < 0):
            raise BudgetError(
                f"section {self.name!r}: min {self.min:,} and max {self.max} must be >= 0"
            )
        if not 1 <= self.priority <= 10:
            raise BudgetError(f"section {self.name!r}: priority {self.priority} is not in 1..10")
        if self.max is not None and self.min > self.max:
            raise BudgetError(
                f"section {self.name!r}: min {self.min:,} exceeds max {self.max:,}; "
                "lower min or raise max"
            )
        if self.overflow is OverflowStrategy.SUMMARIZE and self.summarize is None:
            raise BudgetError(
                f"section {self.name!r} uses overflow 'summarize' but has no summarize hook"
            )
        return self


class TokenBudget(BaseModel):
    """The whole window's budget.

    ``available = max_tokens - reserve_output`` is what the packed window may use. With no
    sections, every item competes in one pool by priority, then score.

    >>> TokenBudget(max_tokens=1000, reserve_output=200).available
    800
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    max_tokens: int
    reserve_output: int = 0
    sections: tuple[SectionBudget, ...] = ()
    strict: bool = False

    @model_validator(mode="after")
    def _check(self) -> TokenBudget:
        if self.max_tokens <= 0 or self.reserve_output < 0:
            raise BudgetError(
                f"max_tokens must be > 0 and reserve_output >= 0; got max_tokens "
                f"{self.max_tokens:,} and reserve_output {self.reserve_output:,}"
            )
        if self.reserve_output >= self.max_tokens:
            raise BudgetError(
                f"reserve_output {self.reserve_output:,} leaves nothing of max_tokens "
                f"{self.max_tokens:,}; lower the reserve or raise max_tokens"
            )
        names = [s.name for s in self.sections]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise BudgetError(f"section names must be unique; repeated: {duplicates}")
        owners: dict[SourceType, str] = {}
        for section in self.sections:
            for source in section.sources:
                if source in owners:
                    raise BudgetError(
                        f"source {source.value!r} is claimed by sections {owners[source]!r} and "
                        f"{section.name!r}; give each source to one section"
                    )
                owners[source] = section.name
        reserved = sum(s.min for s in self.sections)
        if reserved > self.available:
            raise BudgetError(
                f"sections reserve {reserved:,} tokens but the budget has {self.available:,} "
                f"after the {self.reserve_output:,}-token response reserve; lower the section "
                "minimums or raise max_tokens"
            )
        for section in self.sections:
            if section.max is not None and section.max > self.available:
                raise BudgetError(
                    f"section {section.name!r} max {section.max:,} exceeds the {self.available:,} "
                    "tokens available; lower it or raise max_tokens"
                )
        return self

    @property
    def available(self) -> int:
        """Tokens the packed window may use (``max_tokens - reserve_output``)."""
        return self.max_tokens - self.reserve_output

    def section_for(self, item: ContextItem) -> SectionBudget | None:
        """The section an item lands in: its explicit ``section`` name, else its source's."""
        for section in self.sections:
            if item.section is not None and section.name == item.section:
                return section
        if item.section is not None and not self.sections:
            return None
        for section in self.sections:
            if item.source in section.sources:
                return section
        return None


_S = SourceType


def _shares(
    max_tokens: int,
    reserve_ratio: float,
    shares: dict[str, tuple[tuple[SourceType, ...], float, int, OverflowStrategy]],
    **kwargs: Any,
) -> TokenBudget:
    if not 0 <= reserve_ratio < 1:
        raise BudgetError(f"reserve ratio must be in [0, 1), got {reserve_ratio}")
    reserve = int(max_tokens * reserve_ratio)
    available = max_tokens - reserve
    sections = tuple(
        SectionBudget(
            name=name,
            sources=sources,
            min=int(available * share),
            priority=priority,
            overflow=overflow,
            recency=name == "memory",
        )
        for name, (sources, share, priority, overflow) in shares.items()
    )
    return TokenBudget(max_tokens=max_tokens, reserve_output=reserve, sections=sections, **kwargs)


_T, _D, _O = OverflowStrategy.TRUNCATE, OverflowStrategy.DROP, OverflowStrategy.TRUNCATE_OLDEST


def default_chat_budget(max_tokens: int, *, reserve_ratio: float = 0.15) -> TokenBudget:
    """Conversational apps: 60 % of the window reserved for the conversation.

    Shares (of what is left after the 15 % response reserve) are reserved minimums; what a
    section does not use flows to the others. Instructions 10 %, memory 10 %, conversation
    (history + query) 60 %, retrieval 15 %, tool outputs 5 %.
    """
    return _shares(
        max_tokens,
        reserve_ratio,
        {
            "system": ((_S.SYSTEM,), 0.10, 10, _T),
            "conversation": ((_S.USER, _S.CONVERSATION), 0.60, 9, _D),
            "memory": ((_S.MEMORY,), 0.10, 8, _D),
            "retrieval": ((_S.RETRIEVAL,), 0.15, 7, _T),
            "tools": ((_S.TOOL,), 0.05, 6, _O),
        },
    )


def default_rag_budget(max_tokens: int, *, reserve_ratio: float = 0.15) -> TokenBudget:
    """Retrieval-heavy apps: 40 % retrieval, 25 % conversation, 10 % each instructions, memory
    and tool outputs, 5 % unreserved; after a 15 % response reserve."""
    return _shares(
        max_tokens,
        reserve_ratio,
        {
            "system": ((_S.SYSTEM,), 0.10, 10, _T),
            "retrieval": ((_S.RETRIEVAL,), 0.40, 9, _T),
            "conversation": ((_S.USER, _S.CONVERSATION), 0.25, 8, _D),
            "memory": ((_S.MEMORY,), 0.10, 7, _D),
            "tools": ((_S.TOOL,), 0.10, 6, _O),
        },
    )


def default_agent_budget(max_tokens: int, *, reserve_ratio: float = 0.15) -> TokenBudget:
    """Agentic apps, balanced: instructions 15 %, tool outputs 30 %, conversation 25 %,
    retrieval 20 %, memory 10 %; after a 15 % response reserve."""
    return _shares(
        max_tokens,
        reserve_ratio,
        {
            "system": ((_S.SYSTEM,), 0.15, 10, _T),
            "tools": ((_S.TOOL,), 0.30, 9, _O),
            "conversation": ((_S.USER, _S.CONVERSATION), 0.25, 8, _D),
            "retrieval": ((_S.RETRIEVAL,), 0.20, 7, _T),
            "memory": ((_S.MEMORY,), 0.10, 6, _D),
        },
    )


FIXED5_SECTIONS = {
    "instructions": 255,
    "goal": 1500,
    "memory": 55,
    "retrieval": 550,
    "tool_outputs": 855,
}


#: Tokens ``fixed5_budget`` adds for the payload's frame (message roles, per-request priming):
#: the five sections sum to the whole window, and the frame is not part of any of them.
FIXED5_FRAME_TOKENS = 32


def fixed5_budget(
    *, reserve_output: int = 0, scale: float = 1.0, frame_tokens: int = FIXED5_FRAME_TOKENS
) -> TokenBudget:
    """The fixed five-section budget: instructions 255, goal (query + recent history) 1500,
    memory 55, retrieval 550, tool outputs 855 — strict, so no section borrows from another.

    Instructions and the goal are protected; memory drops its oldest items, retrieval drops
    lower-ranked chunks and truncates one when space remains, tool outputs truncate the oldest.
    ``scale`` multiplies every section (e.g. 2.0 for a bigger model). ``max_tokens`` is the
    sections' sum plus ``frame_tokens`` for the format's own overhead plus ``reserve_output``,
    so every section can use its whole share.
    """
    plan = {
        "instructions": ((_S.SYSTEM,), 10, _T, "System prompt"),
        "goal": ((_S.USER, _S.CONVERSATION), 9, _D, "User input + conversation history"),
        "memory": ((_S.MEMORY,), 8, _D, "Conversation memory store"),
        "retrieval": ((_S.RETRIEVAL,), 7, _T, "Retrieved document chunks"),
        "tool_outputs": ((_S.TOOL,), 6, _O, "Tool execution history"),
    }
    if scale <= 0 or frame_tokens < 0:
        raise BudgetError(f"scale must be > 0 and frame_tokens >= 0, got {scale}, {frame_tokens}")
    sections = []
    for name, (sources, priority, overflow, description) in plan.items():
        size = int(FIXED5_SECTIONS[name] * scale)
        sections.append(
            SectionBudget(
                name=name,
                sources=sources,
                min=size,
                max=size,
                priority=priority,
                overflow=overflow,
                description=description,
                recency=name == "memory",
            )
        )
    total = sum(s.min for s in sections)
    return TokenBudget(
        max_tokens=total + frame_tokens + reserve_output,
        reserve_output=reserve_output,
        sections=tuple(sections),
        strict=True,
    )


def graph_budget(max_tokens: int, *, reserve_output: int = 0) -> TokenBudget:
    """Knowledge-graph context: 60 % entry points, 30 % expanded context, 10 % entities.

    Items name their section (``entry_points``, ``expanded``, ``entities``) explicitly; each
    section is capped at its share (strict), dropping lower-scored nodes first.
    """
    # Clamped so a reserve that swallows the total is reported by TokenBudget, with its numbers.
    available = max(0, max_tokens - reserve_output)
    shares = {"entry_points": (0.6, 10), "expanded": (0.3, 9), "entities": (0.1, 8)}
    sections = tuple(
        SectionBudget(name=name, max=int(available * share), priority=priority, overflow=_D)
        for name, (share, priority) in shares.items()
    )
    return TokenBudget(
        max_tokens=max_tokens, reserve_output=reserve_output, sections=sections, strict=True
    )
