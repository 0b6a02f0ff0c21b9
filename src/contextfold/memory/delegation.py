"""Model-tiered delegation: how much of its memory a model manages itself (``paging.mode:
tools``).

Not every model manages context well. ``tier_of`` reads the model's name against
``paging.tiers`` (fnmatch patterns, first match wins, case-insensitive; ``paging.default_tier``
when none matches):

- **weak** models (small and fast ones: ``*haiku*``, ``*-mini*``, ``llama*``…) get the plain
  topic list and one tool, ``expand_topic``: they may ask for a topic in detail, and
  contextfold decides all eviction (least recently used topics collapse to fit the paging
  budget);
- **strong** models (``*opus*``, ``*sonnet*``, ``gpt-4*``…) get a budget dashboard — each
  topic's token cost at every depth, the paging budget with what is used and left, what is
  loaded at which depth — and ``expand_topic`` / ``collapse_topic`` / ``find_quote`` to make
  the trade-offs themselves.

In both tiers contextfold enforces the budget (an expansion past it evicts), and automatic
paging stays on as the fallback for a model that does not manage: topics the message names
are kept warm, cold ones collapse first.

>>> tier_of("claude-3-5-haiku-latest", DEFAULT_TIERS, "strong")
'weak'
>>> tier_of("gpt-4o", DEFAULT_TIERS, "weak"), tier_of("my-model", DEFAULT_TIERS, "weak")
('strong', 'weak')
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from fnmatch import fnmatchcase
from typing import Literal

from contextfold._bounded import SessionLRU
from contextfold.memory.paging import Pager
from contextfold.store.models import Depth
from contextfold.store.protocols import MemoryStorage
from contextfold.tokens import TokenCounter

__all__ = ["DEFAULT_TIERS", "TIER_TOOLS", "Delegation", "Tier", "tier_of"]

Tier = Literal["weak", "strong"]

#: The built-in model-name table: tier → fnmatch patterns (lower-case), weak ones tried first.
DEFAULT_TIERS: dict[str, list[str]] = {
    "weak": [
        "*haiku*",
        "*-mini*",
        "*-nano*",
        "*flash-lite*",
        "*-8b*",
        "*-7b*",
        "*-3b*",
        "*-1b*",
        "llama*",
        "qwen*",
        "mistral*",
        "phi*",
        "gemma*",
        "gpt-3.5*",
    ],
    "strong": [
        "*opus*",
        "*sonnet*",
        "gpt-4*",
        "gpt-5*",
        "o1*",
        "o3*",
        "o4*",
        "gemini-*-pro*",
        "gemini-*-flash*",
        "deepseek*",
    ],
}

#: The memory tools each tier is offered.
TIER_TOOLS: dict[str, tuple[str, ...]] = {
    "weak": ("expand_topic",),
    "strong": ("expand_topic", "collapse_topic", "find_quote"),
}


def tier_of(model: str | None, tiers: Mapping[str, Sequence[str]], default: Tier) -> Tier:
    """The tier of ``model`` by ``tiers`` (weak patterns first); ``default`` when none match
    or the model is unknown."""
    if not model:
        return default
    name = model.lower().rsplit("/", 1)[-1]  # "models/gemini-…", "openai/gpt-4o"
    for tier in ("weak", "strong"):
        if any(fnmatchcase(name, pattern.lower()) for pattern in tiers.get(tier, ())):
            return "weak" if tier == "weak" else "strong"
    return default


class Delegation:
    """The strong tier's budget dashboard for a session (``dashboard``), its topic costs
    computed once per generation of the session."""

    def __init__(
        self, store: MemoryStorage, pager: Pager, counter: TokenCounter, *, sessions: int = 1000
    ) -> None:
        self.store = store
        self.pager = pager
        self.counter = counter
        self._costs: SessionLRU[tuple[int, dict[str, dict[Depth, int]]]] = SessionLRU(sessions)

    def costs(self, sid: str, topics: Sequence[str]) -> dict[str, dict[Depth, int]]:
        """Each topic's tokens at ``summary``, ``segments`` and ``full``."""
        version = self.store.session_version(sid)
        generation = version[1] if version is not None else 0
        cached = self._costs.peek(sid)
        if cached is None or cached[0] != generation:
            cached = (generation, {})
            self._costs.put(sid, cached)
        known = cached[1]
        missing = [t for t in topics if t not in known]
        if missing:
            summaries = self.store.paging.tag_summaries(sid, tags=missing)
            for tag in missing:
                mine = self.store.segments(sid, tag=tag)  # this topic's segments only
                seg = "\n".join(s.summary for s in mine)
                full = "\n".join(s.full_text for s in mine)
                summary = summaries[tag].summary if tag in summaries else seg
                known[tag] = {
                    "summary": self.counter.count(summary) if summary else 0,
                    "segments": self.counter.count(seg) if seg else 0,
                    "full": self.counter.count(full) if full else 0,
                }
        return {t: known[t] for t in topics}

    def dashboard(self, sid: str, topics: Sequence[str], limit: int = 12) -> str:
        """The ``<memory-budget>`` block: the paging budget, used and left, what is loaded,
        and the cost of each of the first ``limit`` ``topics`` at every depth."""
        loaded = {t: e for t, e in self.store.paging.working_set(sid).items() if e.depth != "none"}
        shown = list(dict.fromkeys([*loaded, *topics]))[:limit]
        if not shown:
            return ""
        used = sum(e.tokens for e in loaded.values())
        budget = self.pager.budget
        lines = [
            "<memory-budget>",
            f"Paging budget: {budget} tokens; {used} used, {max(budget - used, 0)} left.",
            "Topic tokens at summary / segments / full depth:",
        ]
        costs = self.costs(sid, shown)
        for tag in shown:
            c = costs[tag]
            at = f" [loaded: {loaded[tag].depth}]" if tag in loaded else ""
            lines.append(f"- {tag}: {c['summary']} / {c['segments']} / {c['full']}{at}")
        lines.append(
            "expand_topic(tag, depth) loads a topic deeper, collapse_topic(tag, depth) frees "
            "budget; an expansion past the budget collapses the least recently used topics."
        )
        lines.append("</memory-budget>")
        return "\n".join(lines)
