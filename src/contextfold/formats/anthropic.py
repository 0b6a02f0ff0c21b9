"""Anthropic Messages format: ``{"system": [blocks], "messages": [...]}``.

Instructions are system text blocks; memory and retrieved context are text blocks of the first
user message. The last stable block (the last memory block, else the last system block) carries
``cache_control`` so Anthropic's prompt cache covers everything up to it. Tool results become
``tool_result`` blocks in a user message; consecutive same-role messages are merged.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

from contextfold.formats.base import BaseFormatter, layout_items
from contextfold.items import ContextItem, Message, TextBlock, ToolUseBlock
from contextfold.tokens import TokenCounter

__all__ = ["AnthropicFormatter", "message_to_anthropic"]

CACHE_CONTROL = {"type": "ephemeral"}


def _text(text: str) -> dict[str, Any]:
    return {"type": "text", "text": text}


def message_to_anthropic(message: Message) -> dict[str, Any]:
    """One message as an Anthropic message (tool results go in a user message)."""
    blocks: list[dict[str, Any]] = []
    for b in message.content:
        if isinstance(b, TextBlock):
            blocks.append(_text(b.text))
        elif isinstance(b, ToolUseBlock):
            blocks.append({"type": "tool_use", "id": b.id, "name": b.name, "input": b.input})
        else:
            result: dict[str, Any] = {
                "type": "tool_result",
                "tool_use_id": b.tool_use_id,
                "content": b.content,
            }
            if b.is_error:
                result["is_error"] = True
            blocks.append(result)
    role = "assistant" if message.role == "assistant" else "user"
    return {"role": role, "content": blocks}


def _merge(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    merged: list[dict[str, Any]] = []
    for msg in messages:
        if merged and merged[-1]["role"] == msg["role"]:
            merged[-1]["content"] = merged[-1]["content"] + msg["content"]
        else:
            merged.append({"role": msg["role"], "content": list(msg["content"])})
    return merged


class AnthropicFormatter(BaseFormatter):
    """Anthropic Messages payload with a cache breakpoint after the stable prefix.

    >>> from contextfold.items import ContextItem, SourceType
    >>> out = AnthropicFormatter().format([
    ...     ContextItem(content="Be brief.", source=SourceType.SYSTEM, pinned=True),
    ...     ContextItem(content="Hi", source=SourceType.USER, pinned=True)])
    >>> out["system"][-1]["cache_control"]
    {'type': 'ephemeral'}
    """

    name: ClassVar[str] = "anthropic"

    def format(self, items: Sequence[ContextItem]) -> dict[str, Any]:
        layout = layout_items(items)
        system_parts, context_parts = self.split_memory(layout)
        system = [_text(t) for t in system_parts]
        context = [_text(t) for t in context_parts]
        stable_in_context = 0 if self.memory_as_system else len(layout.memory)
        if stable_in_context:
            context[stable_in_context - 1]["cache_control"] = dict(CACHE_CONTROL)
        elif system:
            system[-1]["cache_control"] = dict(CACHE_CONTROL)
        messages: list[dict[str, Any]] = []
        if context:
            messages.append({"role": "user", "content": context})
        messages.extend(message_to_anthropic(m) for m in layout.history)
        if layout.query:
            messages.append({"role": "user", "content": [_text(q.content) for q in layout.query]})
        payload: dict[str, Any] = {"messages": _merge(messages)}
        if system:
            payload = {"system": system, **payload}
        return payload

    def count_payload(self, payload: Any, counter: TokenCounter) -> int:
        oh = self.overhead
        total = oh.per_request
        if payload.get("system"):
            total += oh.per_message + self._blocks(payload["system"], counter)
        for msg in payload["messages"]:
            total += oh.per_message + self._blocks(msg["content"], counter)
        return total

    def _blocks(self, blocks: list[dict[str, Any]], counter: TokenCounter) -> int:
        per_part = self.overhead.per_part
        total = 0
        for block in blocks:
            kind = block["type"]
            if kind == "text":
                total += counter.count(block["text"]) + per_part
            elif kind == "tool_use":
                args = ToolUseBlock(id=block["id"], name=block["name"], input=block["input"])
                total += counter.count(block["name"]) + counter.count(args.arguments_json())
                total += 2 * per_part
            else:
                total += counter.count(block["content"]) + per_part
        return total
