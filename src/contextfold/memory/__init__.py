"""Conversation memory: turns are stored raw, tagged by topic, compacted into summaries and paged
back in on demand (see ``MemoryEngine``).

Importing this package loads no model and opens no database; the engine does that when built.
"""

from contextfold.memory.assemble import MemoryBudget, Room
from contextfold.memory.canonical import AliasSuggestion, TagCanonicalizer
from contextfold.memory.compactor import CompactionReport, Compactor, TokenMonitor, segment_turns
from contextfold.memory.config import MemoryConfig, load_config, template
from contextfold.memory.engine import AssembledContext, MemoryEngine, MemoryStatus
from contextfold.memory.history import FilteredHistory, filter_history
from contextfold.memory.paging import Pager, PagingResult
from contextfold.memory.recall import Quote, RankedTurn, Recaller
from contextfold.memory.rules import TagRule, TagRules
from contextfold.memory.summarize import ExtractiveSummarizer, LLMSummarizer, Summarizer
from contextfold.memory.tagging import (
    EmbeddingTagger,
    KeywordTagger,
    LLMTagger,
    Tagger,
    TagResult,
    detect_broad,
    detect_temporal,
)
from contextfold.memory.tools import tool_definitions

__all__ = [
    "AliasSuggestion",
    "AssembledContext",
    "CompactionReport",
    "Compactor",
    "EmbeddingTagger",
    "ExtractiveSummarizer",
    "FilteredHistory",
    "KeywordTagger",
    "LLMSummarizer",
    "LLMTagger",
    "MemoryBudget",
    "MemoryConfig",
    "MemoryEngine",
    "MemoryStatus",
    "Pager",
    "PagingResult",
    "Quote",
    "RankedTurn",
    "Recaller",
    "Room",
    "Summarizer",
    "TagCanonicalizer",
    "TagResult",
    "TagRule",
    "TagRules",
    "Tagger",
    "TokenMonitor",
    "detect_broad",
    "detect_temporal",
    "filter_history",
    "load_config",
    "segment_turns",
    "template",
    "tool_definitions",
]
