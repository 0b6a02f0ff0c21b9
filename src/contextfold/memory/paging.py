"""Paging: a per-session working set of topics, each loaded at a depth, within a token budget.

Depths, shallow to deep: ``none`` (not loaded), ``summary`` (the tag summary), ``segments``
(the summaries of every segment carrying the tag) and ``full`` (those segments' full text).
``expand`` loads a topic deeper and, when the working set then exceeds the budget, evicts the
least recently used other topics one depth at a time (full → segments → summary → none)
until it fits; the expanded topic itself is cut back only as a last resort. Every change is
reported with its token cost. The working set is stored, so it survives restarts.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

from contextfold.errors import ConfigError
from contextfold.store.models import Depth
from contextfold.store.protocols import MemoryStorage

__all__ = ["DEPTHS", "PageChange", "PagedTopic", "Pager", "PagingResult"]

DEPTHS: tuple[Depth, ...] = ("none", "summary", "segments", "full")


class PageChange(BaseModel):
    model_config = ConfigDict(frozen=True)
    tag: str
    before: Depth
    after: Depth
    tokens_before: int
    tokens_after: int
    reason: str


class PagingResult(BaseModel):
    """What an expand or collapse did: the topic's new depth and cost, every change made (the
    request itself first, then evictions), and the working set's total against its budget."""

    model_config = ConfigDict(frozen=True)
    tag: str
    depth: Depth
    tokens: int
    changes: tuple[PageChange, ...]
    total_tokens: int
    budget: int


class PagedTopic(BaseModel):
    model_config = ConfigDict(frozen=True)
    tag: str
    depth: Depth
    text: str
    tokens: int


class Pager:
    """Working-set operations over a ``MemoryStorage`` (see the module docstring)."""

    def __init__(self, store: MemoryStorage, *, budget: int = 4096) -> None:
        if budget < 0:
            raise ConfigError(f"paging budget must be >= 0, got {budget}")
        self.store = store
        self.budget = budget

    def __repr__(self) -> str:
        return f"Pager(budget={self.budget})"

    def topic_text(self, session_id: str, tag: str, depth: Depth) -> str:
        """What ``tag`` shows at ``depth`` ("" at ``none`` or when nothing is stored)."""
        if depth == "none":
            return ""
        if depth == "summary":
            summary = self.store.paging.tag_summaries(session_id).get(tag)
            if summary is not None:
                return summary.summary
            depth = "segments"  # not summarised yet: the segment summaries stand in
        # The topic's segments only, their full text only at depth "full".
        segments = self.store.segments(session_id, tag=tag, full_text=depth == "full")
        if depth == "segments":
            return "\n".join(s.summary for s in segments)
        return "\n".join(s.full_text for s in segments)

    def topic_tokens(self, session_id: str, tag: str, depth: Depth) -> int:
        text = self.topic_text(session_id, tag, depth)
        return self.store.counter.count(text) if text else 0

    def costs(self, session_id: str, tag: str) -> dict[Depth, int]:
        """The token cost of ``tag`` at every depth."""
        return {depth: self.topic_tokens(session_id, tag, depth) for depth in DEPTHS}

    def _known(self, session_id: str, tag: str) -> None:
        if self.store.segments(session_id, tag=tag, full_text=False):
            return
        tags = {t for s in self.store.segments(session_id, full_text=False) for t in s.tags}
        if tag not in tags:
            known = ", ".join(sorted(tags)[:20]) or "none yet (nothing is compacted)"
            raise ConfigError(f"no stored topic {tag!r}; stored topics: {known}")

    def expand(self, session_id: str, tag: str, depth: Depth = "full") -> PagingResult:
        """Load ``tag`` at ``depth`` (deeper or shallower), then evict LRU topics to fit."""
        self._known(session_id, tag)
        return self._set(session_id, tag, depth, reason="expand")

    def collapse(self, session_id: str, tag: str, depth: Depth = "summary") -> PagingResult:
        """Load ``tag`` at a shallower ``depth`` (``summary`` or ``none``) to free budget.

        ``tag`` must be a stored topic (the same error as ``expand``), or one loaded in the
        working set: an entry whose segments no stored segment carries any more still holds
        budget, and collapsing it is how that budget is freed."""
        current = self.store.paging.working_set(session_id).get(tag)
        if current is None or current.depth == "none":
            self._known(session_id, tag)
        before = current.depth if current else "none"
        if DEPTHS.index(depth) > DEPTHS.index(before):
            raise ConfigError(
                f"collapse goes shallower: {tag!r} is at {before!r}, cannot collapse to "
                f"{depth!r}; use expand"
            )
        return self._set(session_id, tag, depth, reason="collapse")

    def touch(self, session_id: str, tags: list[str]) -> None:
        """Mark loaded topics as just used (automatic mode: the inbound message's tags)."""
        ws = self.store.paging.working_set(session_id)
        for tag in tags:
            if tag in ws and ws[tag].depth != "none":
                self.store.paging.set_working_set(session_id, tag, ws[tag].depth, ws[tag].tokens)

    def loaded(self, session_id: str) -> list[PagedTopic]:
        """The topics loaded at a depth other than ``none``, least recently used first."""
        out = []
        for tag, entry in self.store.paging.working_set(session_id).items():
            if entry.depth == "none":
                continue
            text = self.topic_text(session_id, tag, entry.depth)
            out.append(PagedTopic(tag=tag, depth=entry.depth, text=text, tokens=entry.tokens))
        return out

    def _set(self, session_id: str, tag: str, depth: Depth, *, reason: str) -> PagingResult:
        ws = self.store.paging.working_set(session_id)
        before = ws[tag].depth if tag in ws else "none"
        tokens_before = ws[tag].tokens if tag in ws else 0
        tokens = self.topic_tokens(session_id, tag, depth)
        self.store.paging.set_working_set(session_id, tag, depth, tokens)
        changes = [
            PageChange(
                tag=tag,
                before=before,
                after=depth,
                tokens_before=tokens_before,
                tokens_after=tokens,
                reason=reason,
            )
        ]
        changes += self._evict(session_id, keep=tag)
        final = self.store.paging.working_set(session_id)
        return PagingResult(
            tag=tag,
            depth=final[tag].depth,
            tokens=final[tag].tokens,
            changes=tuple(changes),
            total_tokens=sum(e.tokens for e in final.values()),
            budget=self.budget,
        )

    def _evict(self, session_id: str, *, keep: str) -> list[PageChange]:
        changes: list[PageChange] = []
        while True:
            ws = self.store.paging.working_set(session_id)  # least recently used first
            total = sum(e.tokens for e in ws.values())
            if total <= self.budget:
                return changes
            victims = [e for t, e in ws.items() if t != keep and e.depth != "none"]
            victim = victims[0] if victims else ws.get(keep)
            if victim is None or victim.depth == "none":
                return changes
            shallower = DEPTHS[DEPTHS.index(victim.depth) - 1]
            tokens = self.topic_tokens(session_id, victim.tag, shallower)
            self.store.paging.set_working_set(
                session_id, victim.tag, shallower, tokens, last_used=victim.last_used
            )
            changes.append(
                PageChange(
                    tag=victim.tag,
                    before=victim.depth,
                    after=shallower,
                    tokens_before=victim.tokens,
                    tokens_after=tokens,
                    reason=f"evicted: working set over its {self.budget}-token budget",
                )
            )
