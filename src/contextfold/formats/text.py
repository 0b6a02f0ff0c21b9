"""Plain text: headed sections in the cache-stable order, for any model or for reading."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

from contextfold.formats.base import BaseFormatter, item_message, layout_items, render_part
from contextfold.items import ContextItem, Message, SourceType
from contextfold.tokens import TokenCounter

__all__ = ["GenericTextFormatter"]

_TITLES = ("Instructions", "Memory", "Context", "Conversation", "Question")
_JOIN = "\n\n"


def _line(message: Message) -> str:
    return f"{message.role}: {message.text()}"


class GenericTextFormatter(BaseFormatter):
    """One string with ``## Instructions``, ``## Memory``, ``## Context``, ``## Conversation``
    and ``## Question`` sections (empty ones left out).

    >>> from contextfold.items import ContextItem, SourceType
    >>> print(GenericTextFormatter().format([ContextItem(content="Hi", source=SourceType.USER)]))
    ## Question
    Hi
    """

    name: ClassVar[str] = "text"

    def message_cost(self, message: Message, counter: TokenCounter) -> int:
        # +1: joining parts with a blank line may cost a token beyond the parts themselves.
        return counter.count(_line(message)) + 1

    def item_cost(self, item: ContextItem, counter: TokenCounter) -> int:
        key = f"{self.name}/{counter.name}"
        if item.source is SourceType.CONVERSATION:
            return item.memo(key, lambda: self.message_cost(item_message(item), counter))
        return item.memo(key, lambda: counter.count(render_part(item)) + 1)

    def base_cost(self, counter: TokenCounter) -> int:
        return sum(counter.count(f"## {title}\n") + 1 for title in _TITLES)

    def format(self, items: Sequence[ContextItem]) -> str:
        layout = layout_items(items)
        system, context = self.split_memory(layout)
        memory = [] if self.memory_as_system else context[: len(layout.memory)]
        dynamic = context[len(memory) :]
        sections = zip(
            _TITLES,
            (
                system,
                memory,
                dynamic,
                [_line(m) for m in layout.history],
                [q.content for q in layout.query],
            ),
            strict=True,
        )
        return _JOIN.join(f"## {title}\n" + _JOIN.join(parts) for title, parts in sections if parts)

    def count_payload(self, payload: Any, counter: TokenCounter) -> int:
        return counter.count(payload)
