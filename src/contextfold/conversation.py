"""Token-aware conversation history: trim a message list to a budget, and ``MemoryManager``, a
sliding window that evicts the oldest exchanges.

Both work in whole exchanges: a user turn with the assistant's reply and every tool call and
result that follows it, up to the next user turn. So what they keep always starts on a user
turn (after the system prompt), as Anthropic and Gemini require, and a tool call never loses
its result."""

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


def exchanges(messages: Sequence[Message]) -> list[list[int]]:
    """Indices of ``messages`` grouped into whole exchanges, oldest first.

    An exchange starts at a user turn and runs up to the next one: the assistant's replies and
    the tool calls and results in between. Messages before the first user turn form a leading
    group of their own (the only group that does not start on a user turn). A tool call and its
    results are never split: a user turn that falls between them does not start an exchange.
    """
    starts = {i for i, m in enumerate(messages) if m.role == "user" and i > 0}
    for idxs in tool_units(messages):
        if len(idxs) > 1:
            starts.difference_update(range(idxs[0] + 1, idxs[-1] + 1))
    groups: list[list[int]] = []
    for i in range(len(messages)):
        if i == 0 or i in starts:
            groups.append([])
        groups[-1].append(i)
    return groups


def trim_history(
    messages: Sequence[Message],
    max_tokens: int,
    counter: TokenCounter,
    *,
    format: str = "openai",
    keep_system: bool = True,
) -> list[Message]:
    """The longest run of whole exchanges at the end of ``messages`` that fits ``max_tokens`` in
    ``format`` (per-message and per-request overhead included).

    What is kept after the system prompt starts on a user turn: an exchange (see
    ``exchanges``) is kept whole or not at all, and messages before the first user turn are
    left out. A leading system message is kept when ``keep_system`` (it must fit, or
    ``ConfigError``). Incomplete tool exchanges (a call whose result is missing, or a result
    whose call is) are left out of the exchange that holds them.

    >>> from contextfold.tokens import TiktokenCounter
    >>> history = [Message(role="system", content="Be terse."),
    ...            Message(role="user", content="Hi"), Message(role="assistant", content="Hello"),
    ...            Message(role="user", content="Bye"), Message(role="assistant", content="Bye")]
    >>> [m.text() for m in trim_history(history, 25, TiktokenCounter())]
    ['Be terse.', 'Bye', 'Bye']
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
    for group, incomplete in _newest_exchanges(body):
        if body[group[0]].role != "user":
            break  # the leading messages before any user turn
        idxs = [i for i in group if i not in incomplete]
        cost = count_messages((body[i] for i in idxs), counter, format)
        if cost > room:
            break
        room -= cost
        kept.extend(idxs)
    return head + [body[i] for i in sorted(kept)]


def _newest_exchanges(messages: Sequence[Message]) -> Iterator[tuple[list[int], set[int]]]:
    """``exchanges(messages)`` from the newest back, each with the indices of its incomplete
    tool traffic (a call missing a result, with the results of its message's other calls, or a
    result whose call is missing). Walked lazily from the end, so a caller that stops after a
    few exchanges never reads the rest of a long history."""
    span: list[int] = []
    waiting: dict[str, int] = {}  # result id -> its message, while the call is further back
    incomplete: set[int] = set()
    for i in range(len(messages) - 1, -1, -1):
        message = messages[i]
        span.append(i)
        content = message.content
        if not (len(content) == 1 and content[0].type == "text"):
            waiting.update(dict.fromkeys(message.tool_result_ids, i))
            calls = message.tool_use_ids
            if any(call not in waiting for call in calls):
                incomplete.add(i)
                incomplete.update(waiting[call] for call in calls if call in waiting)
            for call in calls:
                waiting.pop(call, None)
        if message.role == "user" and not waiting:
            span.reverse()
            yield span, incomplete
            span, incomplete = [], set()
    if span:  # results whose call never came held the rest open: group it the long way
        rest = messages[: span[0] + 1]
        bad = {i for idxs in tool_units(rest) if not _complete(rest, idxs) for i in idxs}
        for group in reversed(exchanges(rest)):
            yield group, bad.intersection(group)


class MemoryManager:
    """Sliding-window conversation memory measured in tokens.

    Each added message is kept until the window exceeds ``conversation_tokens``; then the
    oldest whole exchanges are evicted (a user turn with the replies, tool calls and results
    that follow it: see ``exchanges``), so the window always starts on a user turn once
    anything was evicted. The newest exchange goes too if it alone exceeds the window, unless
    a tool call in it still awaits its result; the replies that arrive after that go with it,
    until the next user turn. As a
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
        self.counter = counter if counter is not None else TiktokenCounter()
        self.format = format
        self.priority = priority
        self._items: list[ContextItem] = []
        self.evicted = 0  # messages evicted so far
        # The newest exchange was evicted whole: its later replies go too, until a user turn.
        self._orphaned = False

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
        if message.role == "user":
            self._orphaned = False
        elif self._orphaned:
            self.evicted += 1  # a reply whose user turn was already evicted
            return
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
        self._orphaned = False

    def _evict(self) -> None:
        messages = self.messages
        over = count_messages(messages, self.counter, self.format) - self.conversation_tokens
        if over <= 0:
            return
        drop: set[int] = set()
        groups = exchanges(messages)
        for n, idxs in enumerate(groups):
            if over <= 0:
                break
            if n == len(groups) - 1 and not _complete(messages, idxs):
                break  # never evict the newest exchange while a tool call awaits its result
            drop.update(idxs)
            over -= count_messages((messages[i] for i in idxs), self.counter, self.format)
            self._orphaned = n == len(groups) - 1
        self._items = [item for i, item in enumerate(self._items) if i not in drop]
        self.evicted += len(drop)

    def context_items(self, query: QueryBundle) -> list[ContextItem]:
        """The window as conversation items for a pipeline (the ``MemoryProvider`` protocol)."""
        return list(self._items)
