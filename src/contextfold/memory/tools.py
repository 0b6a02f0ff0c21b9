"""Memory tools for models that manage their own context: ``expand_topic``, ``collapse_topic``
and ``find_quote``, as tool definitions in each provider's wire format.

>>> [t["function"]["name"] for t in tool_definitions("openai")]
['expand_topic', 'collapse_topic', 'find_quote']
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from contextfold._bounded import clip
from contextfold.errors import ConfigError

if TYPE_CHECKING:
    from contextfold.memory.engine import MemoryEngine

__all__ = ["TOOL_NAMES", "run_tool_call", "tool_definitions"]

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


def run_tool_call(
    engine: MemoryEngine,
    name: str,
    arguments: Mapping[str, Any],
    *,
    session_id: str | None = None,
) -> str:
    """``MemoryEngine.handle_tool_call``: run a memory tool call from a model; the tool result
    text (JSON). A bad call returns an error text for the model instead of raising."""
    if name not in TOOL_NAMES:
        return json.dumps({"error": f"unknown tool {clip(name)!r}; tools: {', '.join(TOOL_NAMES)}"})
    if not isinstance(arguments, Mapping):
        return json.dumps({"error": f"{name}: the arguments must be a JSON object"})
    try:
        if name == "find_quote":
            limit = arguments.get("limit", 5)
            if isinstance(limit, str) and limit.strip().isdigit():
                limit = int(limit)  # models often quote numbers
            if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= 20:
                return json.dumps(
                    {
                        "error": f"find_quote: limit must be a whole number from 1 to 20, "
                        f"not {clip(json.dumps(limit), 40)}"
                    }
                )
            quotes = engine.find_quote(str(arguments["query"]), limit=limit, session_id=session_id)
            return json.dumps([q.model_dump() for q in quotes])
        op = engine.expand_topic if name == "expand_topic" else engine.collapse_topic
        default = "full" if name == "expand_topic" else "summary"
        result = op(str(arguments["tag"]), arguments.get("depth", default), session_id=session_id)
        sid = session_id or engine.session_id
        text = engine.pager.topic_text(sid, result.tag, result.depth)
        return json.dumps({**result.model_dump(), "content": text})
    except KeyError as exc:
        return json.dumps({"error": f"{name} needs the argument {exc.args[0]!r}"})
    except (ConfigError, ValueError, TypeError) as exc:  # a bad argument, for the model
        return json.dumps({"error": f"{name}: {clip(str(exc))}"})
