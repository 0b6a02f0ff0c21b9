"""contextfold as a Model Context Protocol server: conversation memory and the document corpus
as MCP tools, resources and prompts (``contextfold mcp`` runs it over stdio).

Built on the official ``mcp`` SDK 2.x (its ``MCPServer`` class). One server serves one session
of one ``MemoryEngine`` and the corpus ``contextfold ingest`` builds::

    tools      recall_context    memory for a message (MemoryEngine.on_message_inbound)
               compact_context   store messages, then compact (on_turn_complete / compact)
               domain_status     turns, tokens, watermark, topics, working set (status)
               expand_topic      page a stored topic in deeper (summary → segments → full)
               collapse_topic    page a topic back out to free memory budget
               find_quote        full-text search of the raw stored turns
               search_documents  ranked chunks of the corpus (DocumentIndex.search)
               get_context       composed context from the corpus (ContextEngine.get_context)
    resources  contextfold://topics        every topic: turn count, summary gist, depth
               contextfold://topics/{tag}  one topic: its tag summary and its segments
    prompts    recall            what memory holds about a topic, ready for the model
               summarize_session the session's topics and state, asking for a summary

The modules: :mod:`~contextfold.mcp_server.tools` (the tools),
:mod:`~contextfold.mcp_server.resources` (resources and prompts),
:mod:`~contextfold.mcp_server.models` (typed tool outputs) and
:mod:`~contextfold.mcp_server.backend` (the engines behind one lock).

Every call is validated against the tool's JSON schema; a bad call (a wrong type, an unknown
topic, a corpus never ingested) returns a tool error whose text says what to do, and never
stops the server.

Example (what ``contextfold mcp`` does)::

    engine = MemoryEngine(load_config("contextfold.yaml"), session_id="project-x")
    create_server(engine, corpus="docs.db").run()  # serves stdio until the client hangs up
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError, UnexpectedToolError
from mcp.shared.exceptions import MCPError
from mcp_types import (
    INVALID_PARAMS,
    CallToolResult,
    GetPromptResult,
    InputRequiredResult,
)
from mcp_types import Tool as MCPTool
from pydantic import ValidationError

from contextfold.mcp_server.arguments import explain, unknown_arguments
from contextfold.mcp_server.backend import Backend
from contextfold.mcp_server.models import (
    ChatMessage,
    CompactResult,
    ContextResult,
    QuoteResult,
    RecallResult,
    SearchResult,
    TopicPage,
)
from contextfold.mcp_server.resources import add_prompts, add_resources
from contextfold.mcp_server.tools import add_corpus_tools, add_memory_tools
from contextfold.memory.engine import MemoryEngine

__all__ = [
    "INSTRUCTIONS",
    "ChatMessage",
    "CompactResult",
    "ContextResult",
    "LogLevel",
    "QuoteResult",
    "RecallResult",
    "SearchResult",
    "TopicPage",
    "create_server",
]

LogLevel = Literal["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"]
INSTRUCTIONS = (
    "contextfold remembers this conversation beyond the context window and searches an "
    "ingested document corpus. Call recall_context with the user's message to get what memory "
    "holds about it; find_quote for an exact name, number or date said earlier; expand_topic "
    "for a topic's full detail. search_documents and get_context answer from the documents."
)


class _Server(MCPServer[Any]):
    """``MCPServer`` with an unknown prompt name as ``invalid params`` naming the prompts there
    are (the SDK reports it as a generic internal error), and tool calls as docs/mcp.md gives
    them: an argument the tool does not take is refused by name (every input schema says
    ``additionalProperties: false``), a bad argument is one short line naming it and what it
    takes (``arguments.explain``), and a tool's own error is its text alone; the SDK's
    ``Error executing tool <name>`` stays for unexpected failures."""

    async def list_tools(self) -> list[MCPTool]:
        tools = await super().list_tools()
        for tool in tools:
            tool.input_schema.setdefault("additionalProperties", False)
        return tools

    async def call_tool(
        self, name: str, arguments: dict[str, Any], context: Context[Any, Any] | None = None
    ) -> CallToolResult | InputRequiredResult:
        schema = {tool.name: tool.input_schema for tool in await self.list_tools()}.get(name)
        if schema is not None and (refused := unknown_arguments(name, arguments, schema)):
            raise ToolError(refused)
        try:
            return await super().call_tool(name, arguments, context)
        except UnexpectedToolError:
            raise
        except ToolError as exc:
            cause = exc.__cause__
            if isinstance(cause, ValidationError) and schema is not None:
                raise ToolError(explain(name, cause, schema)) from cause
            if isinstance(cause, ToolError) and not isinstance(cause, UnexpectedToolError):
                raise ToolError(str(cause)) from cause
            raise

    async def get_prompt(
        self,
        name: str,
        arguments: dict[str, Any] | None = None,
        context: Context[Any, Any] | None = None,
    ) -> GetPromptResult | InputRequiredResult:
        names = [p.name for p in await self.list_prompts()]
        if name not in names:
            raise MCPError(INVALID_PARAMS, f"unknown prompt {name!r}; prompts: {', '.join(names)}")
        return await super().get_prompt(name, arguments, context)


def create_server(
    memory: MemoryEngine,
    *,
    corpus: str | Path | None = None,
    embed: bool = True,
    name: str = "contextfold",
    log_level: LogLevel = "WARNING",
) -> MCPServer:
    """An ``MCPServer`` over ``memory`` (its ``session_id`` is the session served) and the
    document corpus at ``corpus`` (default ``$CONTEXTFOLD_HOME/documents.db``; opened on first
    use, so a corpus ingested later is found). ``embed=False`` keeps corpus search to BM25 (no
    model loads). The caller keeps ``memory`` and closes it after ``run()`` returns.

    Constructing the server configures the root logger (the SDK does so, on stderr, at
    ``log_level``); stdout belongs to the stdio transport.
    """
    from contextfold import __version__

    backend = Backend(memory, corpus, embed)
    app = _Server(name, version=__version__, instructions=INSTRUCTIONS, log_level=log_level)
    add_memory_tools(app, backend)
    add_corpus_tools(app, backend)
    add_resources(app, backend)
    add_prompts(app, backend)
    return app
