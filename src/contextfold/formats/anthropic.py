"""Anthropic Messages format: ``{"system": [blocks], "messages": [...]}``.

Instructions are system text blocks; memory and retrieved context are text blocks of the first
user message. The last stable block (the last memory block, else the last system block) carries
``cache_control`` so Anthropic's prompt cache covers everything up to it. Tool results become
``tool_result`` blocks in a user message; consecutive same-role messages are merged.

``parse_anthropic_messages`` reads a request's ``system`` and ``messages`` back into ``Message``
values.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

from contextfold.formats._parsing import (
    expect_dict,
    expect_list,
    expect_str,
    fail,
    optional_bool,
    split_tool_results,
    text_of_parts,
    type_name,
)
from contextfold.formats.base import OPENING_TURN, BaseFormatter, layout_items
from contextfold.items import (
    ContentBlock,
    ContextItem,
    Message,
    Role,
    TextBlock,
    ToolResultBlock,
    ToolUseBlock,
)
from contextfold.tokens import TokenCounter

__all__ = ["AnthropicFormatter", "message_to_anthropic", "parse_anthropic_messages"]

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


def _results_first(blocks: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A user turn's ``tool_result`` blocks ahead of its other blocks (the API requires them
    first), each group in its own order."""
    results = [b for b in blocks if b["type"] == "tool_result"]
    if not results:
        return blocks
    return results + [b for b in blocks if b["type"] != "tool_result"]


def _merge(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Consecutive same-role messages merged so roles alternate, opening with a user turn."""
    merged: list[dict[str, Any]] = []
    for msg in messages:
        if merged and merged[-1]["role"] == msg["role"]:
            merged[-1]["content"] = merged[-1]["content"] + msg["content"]
        else:
            merged.append({"role": msg["role"], "content": list(msg["content"])})
    if merged and merged[0]["role"] != "user":
        merged.insert(0, {"role": "user", "content": [_text(OPENING_TURN)]})
    for msg in merged:
        if msg["role"] == "user":
            msg["content"] = _results_first(msg["content"])
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

    def base_cost(self, counter: TokenCounter) -> int:
        # The frame, plus the opening user turn's text in case the history opens the messages
        # with a reply (it then takes the place of the context message the frame counts).
        return super().base_cost(counter) + counter.count(OPENING_TURN) + self.overhead.per_part

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


# --------------------------------------------------------------------------- parsing


_ROLES: dict[str, Role] = {"user": "user", "assistant": "assistant"}


def parse_anthropic_messages(
    messages: list[dict[str, Any]], system: str | list[dict[str, Any]] | None = None
) -> list[Message]:
    """A Messages request's ``system`` and ``messages`` as ``Message`` values.

    ``system`` (a string or text blocks) becomes a leading system message; a user message that
    carries ``tool_result`` blocks becomes a ``tool`` message for each run of results and a
    user message for each run of other blocks, in order. Tool result content given as text
    blocks is joined with newlines. Raises ``FormatError`` naming the path of the first
    malformed value.

    >>> parse_anthropic_messages([{"role": "user", "content": "Hi"}], system="Be brief.")[0]
    Message(role='system', content=(TextBlock(type='text', text='Be brief.'),), name=None)
    """
    out: list[Message] = []
    if isinstance(system, str):
        if system:
            out.append(Message(role="system", content=system))
    elif isinstance(system, list):
        blocks = text_of_parts(system, "system", allowed="text blocks")
        if blocks:
            out.append(Message(role="system", content=tuple(blocks)))
    elif system is not None:
        fail("system", f"is {type_name(system)}; expected a string or an array of text blocks")
    for i, raw in enumerate(expect_list(messages, "messages")):
        path = f"messages[{i}]"
        msg = expect_dict(raw, path)
        role_value = msg.get("role")
        if not isinstance(role_value, str):
            fail(f"{path}.role", f"is {type_name(role_value)}; expected 'user' or 'assistant'")
        role = _ROLES.get(role_value)
        if role is None:
            hint = "; put system text in the system parameter" if role_value == "system" else ""
            fail(
                f"{path}.role",
                f"{role_value!r} is unknown; expected 'user' or 'assistant'{hint}",
            )
        out.extend(split_tool_results(role, _blocks(msg.get("content"), f"{path}.content", role)))
    return out


def _blocks(content: Any, path: str, role: Role) -> list[ContentBlock]:
    if isinstance(content, str):
        return [TextBlock(text=content)]
    blocks: list[ContentBlock] = []
    for j, raw in enumerate(expect_list(content, path)):
        here = f"{path}[{j}]"
        block = expect_dict(raw, here)
        kind = block.get("type")
        if kind == "text":
            blocks.append(TextBlock(text=expect_str(block.get("text"), f"{here}.text")))
        elif kind == "tool_use":
            if role != "assistant":
                fail(
                    here, f"is a tool_use block in a {role} message; only the assistant calls tools"
                )
            blocks.append(_tool_use(block, here))
        elif kind == "tool_result":
            if role != "user":
                fail(
                    here,
                    f"is a tool_result block in an {role} message; tool results go in "
                    "a user message",
                )
            blocks.append(_tool_result(block, here))
        elif isinstance(kind, str):
            fail(
                here,
                f"has type {kind!r}, which is not supported yet (only text, tool_use "
                "and tool_result blocks)",
            )
        else:
            fail(f"{here}.type", f"is {type_name(kind)}; expected a string such as 'text'")
    return blocks


def _tool_use(block: dict[str, Any], path: str) -> ToolUseBlock:
    return ToolUseBlock(
        id=expect_str(block.get("id"), f"{path}.id"),
        name=expect_str(block.get("name"), f"{path}.name"),
        input=expect_dict(block.get("input", {}), f"{path}.input"),
    )


def _tool_result(block: dict[str, Any], path: str) -> ToolResultBlock:
    content = block.get("content", "")
    if isinstance(content, list):
        parts = text_of_parts(content, f"{path}.content", allowed="text blocks")
        content = "\n".join(b.text for b in parts)
    elif not isinstance(content, str):
        fail(
            f"{path}.content",
            f"is {type_name(content)}; expected a string or an array of text blocks",
        )
    return ToolResultBlock(
        tool_use_id=expect_str(block.get("tool_use_id"), f"{path}.tool_use_id"),
        content=content,
        is_error=optional_bool(block.get("is_error"), f"{path}.is_error"),
    )
