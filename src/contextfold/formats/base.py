"""What every formatter shares: the cache-stable layout, how items render as text parts, and
the cost model the packer uses.

Layout (DESIGN §6): ``[instructions] [slow-changing memory] ⟨cache breakpoint⟩ [retrieved
context, tool outputs] [history] [current query]``. Instructions become the system prompt;
memory and retrieved content go in a user-role context message unless ``memory_as_system``.
"""

from __future__ import annotations

import re
import sys
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from operator import attrgetter
from typing import Any, ClassVar, Protocol, runtime_checkable
from xml.sax.saxutils import quoteattr

from contextfold.items import ContextItem, Message, SourceType
from contextfold.tokens import OVERHEADS, MessageOverhead, TokenCounter, block_strings

__all__ = ["OPENING_TURN", "BaseFormatter", "Formatter", "Layout", "layout_items", "render_part"]

#: The text of the user turn Anthropic and Gemini payloads open with when nothing else would
#: come before the first assistant turn (both APIs require the first turn to be the user's;
#: a history cut to fit can start with a reply). Its cost is in those formatters' ``base_cost``.
OPENING_TURN = "(conversation continues)"


@runtime_checkable
class Formatter(Protocol):
    """Turns the kept items of a window into a provider payload.

    Implementers guarantee: ``format`` never drops or reorders kept items within a layout slot
    and merges consecutive same-role messages instead of dropping them; ``item_cost`` is an upper
    bound of the tokens an item adds to the payload as ``count_payload`` counts it, and
    ``base_cost`` bounds what the payload costs beyond its items.
    """

    @property
    def name(self) -> str: ...

    def item_cost(self, item: ContextItem, counter: TokenCounter) -> int: ...

    def item_costs(self, items: Sequence[ContextItem], counter: TokenCounter) -> list[int]: ...

    def base_cost(self, counter: TokenCounter) -> int: ...

    def format(self, items: Sequence[ContextItem]) -> Any: ...

    def count_payload(self, payload: Any, counter: TokenCounter) -> int: ...


@dataclass(frozen=True, slots=True)
class Layout:
    """Kept items sorted into the cache-stable slots."""

    system: tuple[ContextItem, ...]
    memory: tuple[ContextItem, ...]
    dynamic: tuple[ContextItem, ...]  # retrieval by rank, then tool outputs oldest first
    history: tuple[Message, ...]
    query: tuple[ContextItem, ...]


def item_message(item: ContextItem) -> Message:
    """The message a conversation item carries (a bare text item becomes a user message, or
    the role named in ``metadata["role"]``)."""
    if item.message is not None:
        return item.message
    return Message(role=item.metadata.get("role", "user"), content=item.content)


_SOURCE = attrgetter("source")


def layout_items(items: Sequence[ContextItem]) -> Layout:
    by: dict[SourceType, list[ContextItem]] = {source: [] for source in SourceType}
    # Each item appended to its source's list by a C-level loop (a window holds thousands).
    any(map(list.append, map(by.__getitem__, map(_SOURCE, items)), items))
    ranked = sorted(by[SourceType.RETRIEVAL], key=lambda i: (-i.priority, -i.score))
    return Layout(
        system=tuple(by[SourceType.SYSTEM]),
        memory=tuple(by[SourceType.MEMORY]),
        dynamic=(*ranked, *by[SourceType.TOOL]),
        history=tuple(map(item_message, by[SourceType.CONVERSATION])),
        query=tuple(by[SourceType.USER]),
    )


_TAGS = {
    SourceType.MEMORY: "memory",
    SourceType.RETRIEVAL: "document",
    SourceType.TOOL: "tool_output",
}
_ATTRS = ("source", "title", "tool_name")


_ESCAPED = re.compile(r'[&<>"\n\r\t]')  # what ``quoteattr`` rewrites


def _quoteattr(value: str) -> str:
    """``quoteattr(value)``, without its seven replaces when there is nothing to escape."""
    return quoteattr(value) if _ESCAPED.search(value) else f'"{value}"'


def render_part(item: ContextItem) -> str:
    """The text an item contributes to a payload: instructions and the query verbatim; memory,
    documents and tool outputs wrapped in a tag that names them."""
    tag = _TAGS.get(item.source)
    if tag is None:
        return item.content
    metadata = item.metadata
    attrs = (
        "".join([f" {key}={_quoteattr(str(metadata[key]))}" for key in _ATTRS if key in metadata])
        if metadata
        else ""
    )
    return f"<{tag}{attrs}>\n{item.content}\n</{tag}>"


class BaseFormatter(ABC):
    """Shared cost model: a part costs its tokens plus ``per_part``; a conversation message
    costs ``per_message`` plus its parts; the frame (system, context and query messages and the
    per-request overhead) is charged once up front."""

    name: ClassVar[str] = "base"
    #: messages the frame may add around the items: system, context, query
    FRAME_MESSAGES: ClassVar[int] = 3

    def __init__(self, *, memory_as_system: bool = False) -> None:
        self.memory_as_system = memory_as_system

    def __repr__(self) -> str:
        return f"{type(self).__name__}(memory_as_system={self.memory_as_system})"

    @property
    def overhead(self) -> MessageOverhead:
        return OVERHEADS[self.name]

    def message_cost(self, message: Message, counter: TokenCounter) -> int:
        oh = self.overhead
        return oh.per_message + sum(counter.count(s) + oh.per_part for s in block_strings(message))

    def item_cost(self, item: ContextItem, counter: TokenCounter) -> int:
        key = sys.intern(f"{self.name}/{counter.name}")
        if item.source is SourceType.CONVERSATION:
            return item.memo(key, lambda: self.message_cost(item_message(item), counter))
        return item.memo(key, lambda: counter.count(render_part(item)) + self.overhead.per_part)

    def item_costs(self, items: Sequence[ContextItem], counter: TokenCounter) -> list[int]:
        """``item_cost`` for many items; cache hits are read inline (the packer's hot loop)."""
        key = sys.intern(f"{self.name}/{counter.name}")
        costs = []
        for item in items:
            hit = item.__pydantic_private__["_tokens"].get(key)  # type: ignore[index]
            if (
                hit is not None
                and hit[0] is item.content
                and hit[1] is item.metadata
                and hit[2] is item.source
            ):
                costs.append(hit[3])
            else:
                costs.append(self.item_cost(item, counter))
        return costs

    def base_cost(self, counter: TokenCounter) -> int:
        return self.overhead.per_request + self.FRAME_MESSAGES * self.overhead.per_message

    @abstractmethod
    def format(self, items: Sequence[ContextItem]) -> Any:
        """The provider payload for the kept items."""

    @abstractmethod
    def count_payload(self, payload: Any, counter: TokenCounter) -> int:
        """Tokens of a payload this formatter produced, walked from the payload itself."""

    def split_memory(self, layout: Layout) -> tuple[list[str], list[str]]:
        """(system parts, context parts) in layout order, honouring ``memory_as_system``."""
        system = list(map(render_part, layout.system))
        memory = list(map(render_part, layout.memory))
        dynamic = list(map(render_part, layout.dynamic))
        if self.memory_as_system:
            return system + memory, dynamic
        return system, memory + dynamic
