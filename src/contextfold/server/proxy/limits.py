"""The limits a memory request must keep before the proxy does any work on it
(``LimitSettings``): messages per request (``messages``, ``contents``, the Responses API's
``input`` items), text per message, JSON depth.

One request must not make the proxy hold another: a history of 100,000 tiny messages fits in
the body limit, and without these each of them would be parsed, located, stored and tagged.
Each limit's error names the limit, its setting and the value found; nothing of the body is
quoted.

>>> from contextfold.server.config import LimitSettings
>>> check({"messages": [{"role": "user", "content": "hi"}]}, "messages", LimitSettings())
>>> status, message = check({"messages": [[[[[[[[[[1]]]]]]]]]]}, "messages",
...                         LimitSettings(max_json_depth=8))
>>> status, message.split(";")[0]
(400, 'request body is JSON nested deeper than 8 levels')
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from contextfold.server.config import LimitSettings

__all__ = ["check", "depth", "too_deep"]

#: Top-level fields that hold a system prompt (checked like a message).
_SYSTEM_KEYS = ("system", "system_instruction", "systemInstruction", "instructions")


def check(body: dict[str, Any], key: str, limits: LimitSettings) -> tuple[int, str] | None:
    """(status, message) for the first limit ``body`` breaks (``key``: ``messages`` or
    ``contents``), else ``None``."""
    items = body.get(key)
    if isinstance(items, list) and len(items) > limits.max_messages:
        return 413, (
            f"request has {len(items):,} messages in {key}; this proxy accepts at most "
            f"{limits.max_messages:,} per request (limits.max_messages)"
        )
    deep = too_deep(body, limits.max_json_depth, "this proxy")
    if deep is not None:
        return 400, deep
    parts: list[tuple[str, Any]] = [(k, body[k]) for k in _SYSTEM_KEYS if k in body]
    if isinstance(items, list):
        parts += [(f"{key}[{i}]", item) for i, item in enumerate(items)]
    elif isinstance(items, str):  # the Responses API's ``input`` as one string
        parts.append((key, items))
    for where, value in parts:
        size = _text_bytes(value)
        if size > limits.max_message_bytes:
            return 413, (
                f"{where} has {size:,} bytes of text; this proxy accepts at most "
                f"{limits.max_message_bytes:,} per message (limits.max_message_bytes)"
            )
    return None


def too_deep(
    body: Any, limit: int, who: str, *, setting: str = "limits.max_json_depth"
) -> str | None:
    """The error message for a JSON ``body`` nested deeper than ``limit`` levels (``who``
    accepts at most ``limit``, ``setting`` sets it), else ``None``.

    >>> too_deep({"a": {"b": [1]}}, 3, "this API") is None
    True
    >>> too_deep({"a": {"b": [1]}}, 2, "this API").split("; ")[1]
    'this API accepts at most 2 (limits.max_json_depth)'
    """
    if depth(body, limit) <= limit:
        return None
    return (
        f"request body is JSON nested deeper than {limit} levels;"
        f" {who} accepts at most {limit} ({setting})"
    )


def depth(value: Any, limit: int) -> int:
    """The nesting depth of ``value`` (a scalar is 0, ``{"a": [1]}`` is 2), counted up to
    ``limit + 1``: iterative, so any depth Python's ``json`` parsed is measured safely."""
    deepest = 0
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, dict):
            node = node.values()
        elif not isinstance(node, list):
            continue
        depth += 1
        if depth > deepest:
            deepest = depth
            if deepest > limit:
                return deepest
        stack.extend((child, depth) for child in node if isinstance(child, (dict, list)))
    return deepest


def _text_bytes(value: Any) -> int:
    """The UTF-8 bytes of every string (keys included) in ``value``."""
    total = 0
    stack = [value]
    while stack:
        node = stack.pop()
        if isinstance(node, str):
            total += len(node) if node.isascii() else len(node.encode("utf-8", "replace"))
        elif isinstance(node, dict):
            stack.extend(node.keys())
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
    return total
