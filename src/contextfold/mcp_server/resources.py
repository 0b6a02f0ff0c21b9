"""The MCP resources (the session's topics as JSON) and prompts (``recall``,
``summarize_session``).

A bad read or prompt call is a protocol error with a message: an unknown topic is
``invalid params`` (-32602) naming the closest stored tags; a prompt called without a
required argument says which one.
"""

from __future__ import annotations

import json
from typing import Annotated, Any

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ResourceNotFoundError
from mcp.server.mcpserver.prompts.base import Prompt
from mcp.shared.exceptions import MCPError
from mcp_types import INVALID_PARAMS
from pydantic import Field

from contextfold.errors import ContextfoldError
from contextfold.mcp_server.backend import Backend

__all__ = ["add_prompts", "add_resources"]


def _json(data: Any) -> str:
    return json.dumps(data, ensure_ascii=False, separators=(",", ":"))


def add_resources(app: MCPServer, backend: Backend) -> None:
    """``contextfold://topics`` and ``contextfold://topics/{tag}``."""

    @app.resource(
        "contextfold://topics",
        name="topics",
        title="Conversation topics",
        description="Every topic tag of the session, most turns first: turn count, segments, a "
        "gist of its summary, whether that summary is stale, and its working-set depth.",
        mime_type="application/json",
    )
    def topics() -> str:
        with backend.lock:
            return _json(backend.topics())

    @app.resource(
        "contextfold://topics/{tag}",
        name="topic",
        title="One conversation topic",
        description="One topic (any spelling or alias): its tag summary and every segment tagged "
        "with it (turn range, tags, summary, token counts).",
        mime_type="application/json",
    )
    def topic(tag: str) -> str:
        with backend.lock:
            try:
                return _json(backend.topic(tag))
            except ContextfoldError as exc:
                raise ResourceNotFoundError(str(exc)) from None


class _Prompt(Prompt):
    """A prompt whose missing or unknown arguments are an ``invalid params`` error naming them
    (the SDK's own checks end as a generic internal error)."""

    async def render(self, arguments: dict[str, Any] | None, context: Any) -> Any:
        given = arguments or {}
        known = [a.name for a in self.arguments or []]
        missing = [a.name for a in self.arguments or [] if a.required and a.name not in given]
        if missing:
            raise MCPError(
                INVALID_PARAMS, f"prompt {self.name!r} needs the argument(s): {', '.join(missing)}"
            )
        if unknown := sorted(set(given) - set(known)):
            raise MCPError(
                INVALID_PARAMS,
                f"prompt {self.name!r} has no argument(s) {', '.join(unknown)}; "
                f"it takes: {', '.join(known) or 'none'}",
            )
        return await super().render(arguments, context)


def add_prompts(app: MCPServer, backend: Backend) -> None:
    """``recall`` and ``summarize_session``."""
    memory = backend.memory

    def recall(
        topic: Annotated[str, Field(description="What to recall: a topic or a question.")],
    ) -> str:
        if not topic.strip():
            raise MCPError(INVALID_PARAMS, "prompt 'recall' needs a non-empty topic")
        try:
            with backend.lock:
                ctx = memory.on_message_inbound(topic)
        except ContextfoldError as exc:
            raise MCPError(INVALID_PARAMS, str(exc)) from None
        if not ctx.prepend_text:
            return (
                f"contextfold's memory holds nothing about {topic!r} yet. Search the raw "
                "conversation with the find_quote tool, or read contextfold://topics for the "
                "topics there are."
            )
        tags = ", ".join(ctx.matched_tags) or "none matched by tag"
        return (
            f"Recall what we discussed about {topic!r}. contextfold's memory of this "
            f"conversation (matched topics: {tags}) holds:\n\n{ctx.prepend_text}\n\n"
            "Answer from it. If a detail is missing, call find_quote with the exact words, or "
            "expand_topic with one of the matched topics for the full original text."
        )

    def summarize_session(
        focus: Annotated[str, Field(description="Optional: a topic to focus the summary on.")] = "",
    ) -> str:
        with backend.lock:
            status = memory.status()
            topics = backend.topics()["topics"]
        share = status.live_tokens / status.context_window
        lines = [
            f"Summarize the conversation session {status.session_id!r}"
            + (f", focusing on {focus.strip()!r}" if focus.strip() else "")
            + ": the decisions made, the facts and numbers that matter, and what is still open.",
            "",
            f"It has {status.turns} stored turns; {status.live_turns} are live "
            f"({status.live_tokens:,} tokens, {share:.0%} of the {status.context_window:,}-token "
            f"window) and {status.segments} segments are compacted. Topics (turns):",
        ]
        lines += [
            f"- {t['tag']} ({t['turns']})" + (f": {t['gist']}" if t["gist"] else "")
            for t in topics[:30]
        ] or ["- none yet"]
        if len(topics) > 30:
            lines.append(f"- … and {len(topics) - 30} more (contextfold://topics lists them all)")
        if status.level != "none":
            lines += [
                "",
                f"The live window is past the {status.level} compaction threshold: call "
                "compact_context to fold older turns into summaries.",
            ]
        lines += ["", "Use expand_topic or find_quote for any detail the gists leave out."]
        return "\n".join(lines)

    for fn, description in (
        (recall, "Recall what the conversation's memory holds about a topic: a message for the "
         "model with the recalled summaries and turns, and how to dig deeper."),
        (summarize_session, "Ask for a summary of the session: its topics with their gists, the "
         "live window's size, and a compaction hint when the window is getting full."),
    ):  # fmt: skip
        app.add_prompt(_Prompt.from_function(fn, description=description))
