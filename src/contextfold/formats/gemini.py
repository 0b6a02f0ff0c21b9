"""Gemini ``generateContent`` format: ``{"system_instruction": {...}, "contents": [...]}``.

Instructions are ``system_instruction`` parts; memory and retrieved context are text parts of
the first user turn. Tool calls become ``functionCall`` parts of a ``model`` turn and tool
results ``functionResponse`` parts of a user turn; consecutive same-role turns are merged.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

from contextfold.formats.base import BaseFormatter, layout_items
from contextfold.items import ContextItem, Message, TextBlock, ToolUseBlock
from contextfold.tokens import TokenCounter

__all__ = ["GeminiFormatter", "message_to_gemini"]


def message_to_gemini(message: Message, tool_names: dict[str, str]) -> dict[str, Any]:
    """One message as a Gemini turn; ``tool_names`` maps tool call ids to function names
    (Gemini matches responses by name) and is updated with this message's calls."""
    parts: list[dict[str, Any]] = []
    for b in message.content:
        if isinstance(b, TextBlock):
            parts.append({"text": b.text})
        elif isinstance(b, ToolUseBlock):
            tool_names[b.id] = b.name
            parts.append({"functionCall": {"id": b.id, "name": b.name, "args": b.input}})
        else:
            name = b.name or tool_names.get(b.tool_use_id, b.tool_use_id)
            parts.append(
                {
                    "functionResponse": {
                        "id": b.tool_use_id,
                        "name": name,
                        "response": {"content": b.content},
                    }
                }
            )
    return {"role": "model" if message.role == "assistant" else "user", "parts": parts}


def _merge(contents: list[dict[str, Any]]) -> list[dict[str, Any]]:
    merged: list[dict[str, Any]] = []
    for turn in contents:
        if merged and merged[-1]["role"] == turn["role"]:
            merged[-1]["parts"] = merged[-1]["parts"] + turn["parts"]
        else:
            merged.append({"role": turn["role"], "parts": list(turn["parts"])})
    return merged


class GeminiFormatter(BaseFormatter):
    """Gemini ``generateContent`` request body.

    >>> from contextfold.items import ContextItem, SourceType
    >>> GeminiFormatter().format([ContextItem(content="Hi", source=SourceType.USER)])
    {'contents': [{'role': 'user', 'parts': [{'text': 'Hi'}]}]}
    """

    name: ClassVar[str] = "gemini"

    def format(self, items: Sequence[ContextItem]) -> dict[str, Any]:
        layout = layout_items(items)
        system, context = self.split_memory(layout)
        contents: list[dict[str, Any]] = []
        if context:
            contents.append({"role": "user", "parts": [{"text": t} for t in context]})
        tool_names: dict[str, str] = {}
        contents.extend(message_to_gemini(m, tool_names) for m in layout.history)
        if layout.query:
            contents.append({"role": "user", "parts": [{"text": q.content} for q in layout.query]})
        payload: dict[str, Any] = {"contents": _merge(contents)}
        if system:
            payload = {"system_instruction": {"parts": [{"text": t} for t in system]}, **payload}
        return payload

    def count_payload(self, payload: Any, counter: TokenCounter) -> int:
        oh = self.overhead
        total = oh.per_request
        turns = list(payload["contents"])
        if "system_instruction" in payload:
            turns.append(payload["system_instruction"])
        for turn in turns:
            total += oh.per_message
            for part in turn["parts"]:
                if "text" in part:
                    total += counter.count(part["text"]) + oh.per_part
                elif "functionCall" in part:
                    call = part["functionCall"]
                    args = ToolUseBlock(id="", name=call["name"], input=call["args"])
                    total += counter.count(call["name"]) + counter.count(args.arguments_json())
                    total += 2 * oh.per_part
                else:
                    response = part["functionResponse"]["response"]["content"]
                    total += counter.count(response) + oh.per_part
        return total
