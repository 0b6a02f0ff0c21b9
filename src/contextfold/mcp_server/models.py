"""The MCP tools' typed inputs and outputs. Each output model is the tool's ``outputSchema``;
a call returns it as structured content and as indented JSON text."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict

from contextfold.memory.compactor import CompactionReport, Level
from contextfold.memory.paging import PageChange
from contextfold.memory.recall import Quote
from contextfold.retrieval.base import SearchHit
from contextfold.store.models import Depth

__all__ = [
    "ChatMessage",
    "CompactResult",
    "ContextResult",
    "QuoteResult",
    "RecallResult",
    "SearchResult",
    "TopicPage",
]

_FROZEN = ConfigDict(frozen=True)


class ChatMessage(BaseModel):
    """One chat message as a tool input: a role and its text."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    role: Literal["system", "user", "assistant"]
    content: str


class RecallResult(BaseModel):
    """What memory adds for a message. ``prepend_text`` goes before the conversation (after the
    system prompt); ``tokens_used`` of ``budget`` is what it costs; ``turns_recalled`` stored
    turns made it in."""

    model_config = _FROZEN
    session_id: str
    prepend_text: str
    matched_tags: list[str]
    related_tags: list[str]
    broad: bool
    temporal: bool
    tokens_used: int
    budget: int
    turns_recalled: int


class CompactResult(BaseModel):
    """What ``compact_context`` stored and compacted. ``compactions`` is empty when nothing was
    compactable (every live turn is among the protected recent ones)."""

    model_config = _FROZEN
    session_id: str
    turns_stored: int
    total_turns: int
    compactions: list[CompactionReport]
    live_tokens: int
    level: Level


class TopicPage(BaseModel):
    """A topic after ``expand_topic`` / ``collapse_topic``: its depth and token cost, every
    change made (evictions included), the working set's total against its budget, and the text
    the topic now shows."""

    model_config = _FROZEN
    tag: str
    depth: Depth
    tokens: int
    changes: list[PageChange]
    working_set_tokens: int
    budget: int
    content: str


class QuoteResult(BaseModel):
    """``find_quote`` hits, best first."""

    model_config = _FROZEN
    query: str
    quotes: list[Quote]


class SearchResult(BaseModel):
    """``search_documents`` hits, best first."""

    model_config = _FROZEN
    query: str
    mode: Literal["bm25", "dense", "hybrid"]
    hits: list[SearchHit]


class ContextResult(BaseModel):
    """Composed context: the query, then the best chunks labelled ``[Source n: file] (score
    s)``; ``tokens`` counts it with the memory engine's counter."""

    model_config = _FROZEN
    query: str
    context: str
    tokens: int
    max_tokens: int
