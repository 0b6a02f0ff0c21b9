"""Memory tools for models that manage their own context: ``expand_topic``, ``collapse_topic``
and ``find_quote``, as tool definitions in each provider's wire format.

>>> [t["function"]["name"] for t in tool_definitions("openai")]
['expand_topic', 'collapse_topic', 'find_quote']
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from contextfold.errors import ConfigError

__all__ = ["TOOL_NAMES", "tool_definitions"]

_DEPTH = {"type": "string", "enum": ["none", "summary", "segments", "full"]}

_TOOLS: list[tuple[str, str, dict[str, Any]]] = [
    (
        "expand_topic",
        "Load a stored conversation topic in more detail: its segment summaries or the full "
        "original text. Costs tokens from the memory budget; cold topics are collapsed to fit.",
        {
            "type": "object",
            "properties": {"tag": {"type": "string"}, "depth": _DEPTH},
            "required": ["tag"],
        },
    ),
    (
        "collapse_topic",
        "Collapse a loaded topic back to its summary (or unload it) to free memory budget.",
        {
            "type": "object",
            "properties": {"tag": {"type": "string"}, "depth": _DEPTH},
            "required": ["tag"],
        },
    ),
    (
        "find_quote",
        "Search the full stored conversation text for a specific fact (a name, number, "
        "date or decision); returns excerpts with their topics.",
        {
            "type": "object",
            "properties": {
                "query": {"type": "string"},
                "limit": {"type": "integer", "minimum": 1, "maximum": 20},
            },
            "required": ["query"],
        },
    ),
]

TOOL_NAMES = tuple(name for name, _, _ in _TOOLS)


def tool_definitions(
    format: str = "openai", names: Sequence[str] = TOOL_NAMES
) -> list[dict[str, Any]]:
    """The tools ``names`` (default: all three) for ``format``: openai (function tools),
    anthropic (``input_schema``) or gemini (function declarations)."""
    tools = [tool for tool in _TOOLS if tool[0] in names]
    if format == "openai":
        return [
            {"type": "function", "function": {"name": n, "description": d, "parameters": p}}
            for n, d, p in tools
        ]
    if format == "anthropic":
        return [{"name": n, "description": d, "input_schema": p} for n, d, p in tools]
    if format == "gemini":
        return [{"name": n, "description": d, "parameters": p} for n, d, p in tools]
    raise ConfigError(f"unknown tool format {format!r}; use openai, anthropic or gemini")
