"""The in-proxy memory tool loop's edits to a request (``paging.mode: tools``).

The proxy offers expand_topic / collapse_topic / find_quote next to the client's tools, runs
the model's calls to them itself and asks again, at most ``proxy.max_tool_continuations``
times (``Proxy._tool_loop``). The loop reads whole replies, so it asks without streaming
(``unstreamed``), and its last round asks without the memory tools, so the model answers
(``without_memory_tools``).
"""

from __future__ import annotations

from typing import Any

from contextfold.memory.tools import TOOL_NAMES
from contextfold.server.proxy.outputs import RESTORE_TOOL
from contextfold.server.proxy.wire import Wire

__all__ = ["unstreamed", "without_memory_tools"]


def unstreamed(fmt: str, body: dict[str, Any], url: str) -> tuple[dict[str, Any], str]:
    """The request asked without streaming (the tool loop reads whole replies)."""
    if fmt == "gemini":
        base, _, query = url.partition("?")
        query = "&".join(p for p in query.split("&") if p and p != "alt=sse")
        base = base.replace(":streamGenerateContent", ":generateContent")
        return body, base + (f"?{query}" if query else "")
    out = {k: v for k, v in body.items() if k != "stream_options"}
    if "stream" in out:
        out["stream"] = False
    return out, url


_PROXY_TOOLS = frozenset((*TOOL_NAMES, RESTORE_TOOL))


def without_memory_tools(body: dict[str, Any]) -> dict[str, Any]:
    """``body`` without the tools the proxy answers itself (memory tools, restore)."""
    tools = body.get("tools")
    if not isinstance(tools, list):
        return body
    kept = []
    for tool in tools:
        if not isinstance(tool, dict):
            kept.append(tool)
            continue
        declarations = tool.get("functionDeclarations")
        if isinstance(declarations, list):
            rest = [d for d in declarations if d.get("name") not in _PROXY_TOOLS]
            if rest:
                kept.append({**tool, "functionDeclarations": rest})
            continue
        if Wire._tool_name(tool) not in _PROXY_TOOLS:
            kept.append(tool)
    out = {k: v for k, v in body.items() if k != "tools"}
    if kept:
        out["tools"] = kept
    return out
