"""Shared helpers for parsing provider payloads into ``Message`` values.

Every problem raises ``FormatError`` with the JSON path of the offending value
(``messages[3].tool_calls[0].function.arguments``) and what is wrong with it.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any, NoReturn

from contextfold.errors import FormatError
from contextfold.items import ContentBlock, Message, Role, TextBlock, ToolResultBlock

__all__ = [
    "expect_dict",
    "expect_list",
    "expect_str",
    "fail",
    "json_text",
    "optional_bool",
    "optional_str",
    "split_tool_results",
    "text_of_parts",
    "type_name",
]

_TYPE_NAMES: dict[type, str] = {
    dict: "an object",
    list: "an array",
    str: "a string",
    bool: "a boolean",
    int: "a number",
    float: "a number",
    type(None): "null",
}


def type_name(value: Any) -> str:
    """The JSON name of a value's type, with its article (``an object``, ``null``)."""
    return _TYPE_NAMES.get(type(value), type(value).__name__)


def fail(path: str, problem: str) -> NoReturn:
    raise FormatError(f"{path} {problem}")


def expect_dict(value: Any, path: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        fail(path, f"is {type_name(value)}; expected an object")
    return value


def expect_list(value: Any, path: str) -> list[Any]:
    if not isinstance(value, list):
        fail(path, f"is {type_name(value)}; expected an array")
    return value


def expect_str(value: Any, path: str) -> str:
    if not isinstance(value, str):
        fail(path, f"is {type_name(value)}; expected a string")
    return value


def optional_str(value: Any, path: str) -> str | None:
    return None if value is None else expect_str(value, path)


def optional_bool(value: Any, path: str) -> bool:
    if value is None:
        return False
    if not isinstance(value, bool):
        fail(path, f"is {type_name(value)}; expected a boolean")
    return value


def json_text(value: Any) -> str:
    """Compact JSON with sorted keys: stable bytes for a structured tool result."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def split_tool_results(
    role: Role, blocks: Sequence[ContentBlock], name: str | None = None
) -> list[Message]:
    """``blocks`` of one provider message as messages: runs of tool results become ``tool``
    messages, the other runs ``role`` messages, in order. No blocks: one empty message."""
    if not blocks:
        return [Message(role=role, content=(), name=name)]
    runs: list[list[ContentBlock]] = []
    for block in blocks:
        is_result = isinstance(block, ToolResultBlock)
        if runs and isinstance(runs[-1][0], ToolResultBlock) == is_result:
            runs[-1].append(block)
        else:
            runs.append([block])
    return [
        Message(role="tool", content=tuple(run))
        if isinstance(run[0], ToolResultBlock)
        else Message(role=role, content=tuple(run), name=name)
        for run in runs
    ]


def text_of_parts(parts: list[Any], path: str, *, allowed: str = "text parts") -> list[TextBlock]:
    """``[{"type": "text", "text": ...}, ...]`` as text blocks (other part types: not yet)."""
    blocks: list[TextBlock] = []
    for i, part in enumerate(parts):
        here = f"{path}[{i}]"
        part = expect_dict(part, here)
        kind = part.get("type")
        if kind != "text":
            if not isinstance(kind, str):
                fail(f"{here}.type", f"is {type_name(kind)}; expected a string such as 'text'")
            fail(here, f"has type {kind!r}, which is not supported yet (only {allowed})")
        blocks.append(TextBlock(text=expect_str(part.get("text"), f"{here}.text")))
    return blocks
