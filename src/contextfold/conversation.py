"""Token-aware conversation history: trim a message list to a budget, and ``MemoryManager``, a
sliding window that evicts the oldest turns and never splits a tool call from its result."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import Any

from contextfold.errors import ConfigError
from contextfold.items import ContextItem, Message, QueryBundle
from contextfold.tokens import OVERHEADS, TiktokenCounter, TokenCounter, count_messages

__all__ = ["MemoryManager", "trim_history"]


def tool_units(messages: Sequence[Message]) -> list[list[int]]:
    """Indices of messages grouped into atomic units, in order of each unit's first message.

    Messages sharing a tool call id (a call and its results, and transitively every message
    linked to those) form one unit, indices ascending; every other message is a unit of one.
    Plain text messages (most of them) take no further work. Shared by the sliding window
    here and by history filtering (``contextfold.memory.history``); not part of the public
    API."""
    parent = list(range(len(messages)))

    def find(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    owner: dict[str, int] = {}
    for i, message in enumerate(messages):
        content = message.content
        if len(content) == 1 and content[0].type == "text":
            continue
        for tool_id in (*message.tool_use_ids, *message.tool_result_ids):
            if tool_id in owner:
                parent[find(i)] = find(owner[tool_id])
            else:
                owner[tool_id] = i
    groups: dict[int, list[int]] = {}
    for i in range(len(messages)):
        groups.setdefault(i if parent[i] == i else find(i), []).append(i)
    return sorted(groups.values(), key=lambda idxs: idxs[0])


def _complete(messages: Sequence[Message], idxs: list[int]) -> bool:
    calls = {t for i in idxs for t in messages[i].tool_use_ids}
    results = {t for i in idxs for t in messages[i].tool_result_ids}
    return calls == results


def trim_history(
    messages: Sequence[Message],
    max_tokens: int,
    counter: TokenCounter,
    *,
    format: str = "openai",
    keep_system: bool = True,
) -> list[Message]:
    """The longest contiguous suffix of ``messages`` that fits ``max_tokens`` in ``format``
    (per-message and per-request overhead included), cut only between whole tool exchanges.

    A leading system message is kept when ``keep_system`` (it must fit, or ``ConfigError``).
    Incomplete tool exchanges (a call whose result is missing) are left out.
    """
    if format not in OVERHEADS:
        raise ConfigError(f"unknown format {format!r}; choose one of {sorted(OVERHEADS)}")
    head: list[Message] = []
    body = list(messages)
    if keep_system and body and body[0].role == "system":
        head, body = body[:1], body[1:]
    room = max_tokens - OVERHEADS[format].per_request - count_messages(head, counter, format)
    if room < 0:
        if not head:  # nothing fits, not even an empty request's overhead
            return []
        raise ConfigError(
            f"the system message alone needs {max_tokens - room:,} tokens, more than the "
            f"{max_tokens:,} allowed; raise max_tokens"
        )
    kept: list[int] = []
    for idxs, complete in _newest_exchanges(body):
        if not complete:
            continue
        cost = count_messages((body[i] for i in idxs), counter, format)
        if cost > room:
            break
        room -= cost
        kept.extend(idxs)
    return head + [body[i] for i in sorted(kept)]


def _newest_exchanges(messages: Sequence[Message]) -> Iterator[tuple[list[int], bool]]:
    """Contiguous spans of messages from the newest back, each closed once every tool result
    in it has met its call; ``complete`` is false for a span with a call whose result is not in
    it (or results whose call never comes). Only the spans a caller consumes are examined."""
    span: list[int] = []
    waiting: set[str] = set()  # results seen whose call is still further back
    complete = True
    for i in range(len(messages) - 1, -1, -1):
        message = messages[i]
        span.append(i)
        content = message.content
        if not (len(content) == 1 and content[0].type == "text"):
            waiting.update(message.tool_result_ids)
            for call in message.tool_use_ids:
                if call in waiting:
                    waiting.discard(call)
                else:
                    complete = False  # a call without its result
        if not waiting:
            span.reverse()
            yield span, complete
            span, complete = [], True
    if span:
        span.reverse()
        yield span, False  # results whose call never came


class MemoryManager:
    """Sliding-window conversation memory measured in tokens.

    Each added message is kept until the window exceeds ``conversation_tokens``; then the
    oldest whole exchanges are evicted (a tool call and its results go together). As a
    pipeline memory it supplies the window as conversation items (priority 7).

    >>> memory = MemoryManager(conversation_tokens=4096)
    >>> memory.add_user_message("Hi!")
    >>> [m.role for m in memory.messages]
    ['user']
    """

    def __init__(
        self,
        conversation_tokens: int = 4096,
        *,
        counter: TokenCounter | None = None,
        format: str = "openai",
        priority: int = 7,
    ) -> None:
        if conversation_tokens <= 0:
            raise ConfigError(f"conversation_tokens must be > 0, got {conversation_tokens}")
        if format not in OVERHEADS:
            raise ConfigError(f"unknown format {format!r}; choose one of {sorted(OVERHEADS)}")
        if not 1 <= priority <= 10:
            raise ConfigError(f"priority must be in 1..10, got {priority}")
        self.conversation_tokens = conversation_tokens
        self.counter = counter or TiktokenCounter()
        self.format = format
        self.priority = priority
        self._items: list[ContextItem] = []
        self.evicted = 0  # messages evicted so far

    def __repr__(self) -> str:
        return (
            f"MemoryManager(conversation_tokens={self.conversation_tokens}, "
            f"messages={len(self._items)}, evicted={self.evicted})"
        )

    @property
    def messages(self) -> list[Message]:
        return [item.message for item in self._items if item.message is not None]

    @property
    def total_tokens(self) -> int:
        return count_messages(self.messages, self.counter, self.format)

    def add_message(self, message: Message | dict[str, Any]) -> None:
        if isinstance(message, dict):
            message = Message.model_validate(message)
        self._items.append(ContextItem.from_message(message, priority=self.priority))
        self._evict()

    def add_messages(self, messages: Iterable[Message | dict[str, Any]]) -> None:
        for message in messages:
            self.add_message(message)

    def add_user_message(self, text: str) -> None:
        self.add_message(Message(role="user", content=text))

    def add_assistant_message(self, text: str) -> None:
        self.add_message(Message(role="assistant", content=text))

    def clear(self) -> None:
        self._items.clear()

    def _evict(self) -> None:
        messages = self.messages
        over = count_messages(messages, self.counter, self.format) - self.conversation_tokens
        if over <= 0:
            return
        drop: set[int] = set()
        for idxs in tool_units(messages):
            if over <= 0:
                break
            if len(drop) + len(idxs) == len(messages) and not _complete(messages, idxs):
                break  # never evict a pending tool call that is the newest exchange
            drop.update(idxs)
            over -= count_messages((messages[i] for i in idxs), self.counter, self.format)
        self._items = [item for i, item in enumerate(self._items) if i not in drop]
        self.evicted += len(drop)

    def context_items(self, query: QueryBundle) -> list[ContextItem]:
        """The window as conversation items for a pipeline (the ``MemoryProvider`` protocol)."""
        return list(self._items)
