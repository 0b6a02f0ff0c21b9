"""OpenAI Chat Completions format: ``{"messages": [...]}``.

Instructions form one system message; memory and retrieved context one user message placed
before the history; tool calls become ``tool_calls`` and each tool result a ``tool`` message.
Consecutive same-role messages (other than ``tool``) are merged.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

from contextfold.formats.base import BaseFormatter, layout_items
from contextfold.items import ContextItem, Message, TextBlock, ToolResultBlock, ToolUseBlock
from contextfold.tokens import TokenCounter

__all__ = ["OpenAIFormatter", "message_to_openai"]

_JOIN = "\n\n"


def message_to_openai(message: Message) -> list[dict[str, Any]]:
    """One message as OpenAI chat messages (a tool message becomes one per result)."""
    if message.role == "tool":
        return [
            {"role": "tool", "tool_call_id": b.tool_use_id, "content": b.content}
            for b in message.content
            if isinstance(b, ToolResultBlock)
        ]
    text = "\n".join(b.text for b in message.content if isinstance(b, TextBlock))
    out: dict[str, Any] = {"role": message.role, "content": text}
    if message.name:
        out["name"] = message.name
    calls = [
        {
            "id": b.id,
            "type": "function",
            "function": {"name": b.name, "arguments": b.arguments_json()},
        }
        for b in message.content
        if isinstance(b, ToolUseBlock)
    ]
    if calls:
        out["content"] = text or None
        out["tool_calls"] = calls
    return [out]


def _merge(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    merged: list[dict[str, Any]] = []
    for msg in messages:
        prev = merged[-1] if merged else None
        if (
            prev is not None
            and prev["role"] == msg["role"] != "tool"
            and prev.get("name") == msg.get("name")
        ):
            texts = [t for t in (prev.get("content"), msg.get("content")) if t]
            prev["content"] = _JOIN.join(texts) if texts else None
            calls = prev.get("tool_calls", []) + msg.get("tool_calls", [])
            if calls:
                prev["tool_calls"] = calls
            continue
        merged.append(dict(msg))
    return merged


class OpenAIFormatter(BaseFormatter):
    """Chat Completions messages.

    >>> from contextfold.items import ContextItem, SourceType
    >>> OpenAIFormatter().format([ContextItem(content="Hi", source=SourceType.USER)])
    {'messages': [{'role': 'user', 'content': 'Hi'}]}
    """

    name: ClassVar[str] = "openai"

    def format(self, items: Sequence[ContextItem]) -> dict[str, Any]:
        layout = layout_items(items)
        system, context = self.split_memory(layout)
        messages: list[dict[str, Any]] = []
        if system:
            messages.append({"role": "system", "content": _JOIN.join(system)})
        if context:
            messages.append({"role": "user", "content": _JOIN.join(context)})
        for message in layout.history:
            messages.extend(message_to_openai(message))
        if layout.query:
            messages.append(
                {"role": "user", "content": _JOIN.join(q.content for q in layout.query)}
            )
        return {"messages": _merge(messages)}

    def count_payload(self, payload: Any, counter: TokenCounter) -> int:
        oh = self.overhead
        total = oh.per_request
        for msg in payload["messages"]:
            total += oh.per_message
            content = msg.get("content")
            if isinstance(content, str) and content:
                total += counter.count(content) + oh.per_part
            elif isinstance(content, list):
                total += sum(counter.count(p.get("text", "")) + oh.per_part for p in content)
            for call in msg.get("tool_calls", []):
                fn = call["function"]
                total += (
                    counter.count(fn["name"]) + counter.count(fn["arguments"]) + 2 * oh.per_part
                )
        return total
