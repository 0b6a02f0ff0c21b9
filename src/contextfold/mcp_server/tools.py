"""The MCP tools: six over conversation memory, two over the document corpus.

Each tool's input schema comes from its typed, annotated parameters (the SDK validates every
call against it before the body runs; numbers and booleans are strict, so a JSON string or a
boolean never passes for a number); its output schema from its return model. Descriptions
are written for the model that decides when to call the tool.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any, Literal, TypeVar

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp_types import ToolAnnotations
from pydantic import Field, StrictBool, StrictInt

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
from contextfold.memory.engine import MemoryStatus
from contextfold.store.models import Depth

__all__ = ["add_corpus_tools", "add_memory_tools"]

Text = Annotated[str, Field(min_length=1, max_length=100_000)]
Tag = Annotated[
    str, Field(min_length=1, max_length=200, description="A topic tag (any spelling or alias).")
]
F = TypeVar("F", bound=Callable[..., Any])
READ_ONLY = ToolAnnotations(read_only_hint=True, destructive_hint=False, open_world_hint=False)
# Writes that add, never remove: stored turns, summaries, the working set.
ADDS = ToolAnnotations(read_only_hint=False, destructive_hint=False, open_world_hint=False)


def _tool(app: MCPServer, annotations: ToolAnnotations) -> Callable[[F], F]:
    """``app.tool`` with the function's docstring as the description, on one line (a
    docstring's line breaks and indentation are noise in a client's tool list)."""

    def register(fn: F) -> F:
        description = " ".join((fn.__doc__ or "").split())
        return app.tool(description=description, annotations=annotations)(fn)

    return register


def add_memory_tools(app: MCPServer, backend: Backend) -> None:
    """recall_context, compact_context, domain_status, expand_topic, collapse_topic,
    find_quote."""
    memory = backend.memory

    @_tool(app, ADDS)
    def recall_context(
        message: Annotated[Text, Field(description="The user's new message.")],
        history: Annotated[
            list[ChatMessage],
            Field(
                max_length=10_000,
                description="The live conversation so far; turns in it are not recalled again.",
            ),
        ] = [],  # noqa: B006 (validated into a fresh list per call, never mutated)
        budget: Annotated[
            StrictInt | None,
            Field(ge=64, le=200_000, description="Memory budget in tokens (default: config)."),
        ] = None,
    ) -> RecallResult:
        """Recall what the conversation's memory holds for a new user message: tag it, rank
        stored turns and summaries (topic tags, full text, embeddings), page matching topics in,
        and return `prepend_text` (put it before the conversation) with the matched tags and the
        tokens it costs. Compacted turns far outside the context window are recalled too."""

        def run() -> RecallResult:
            history_ = [m.model_dump() for m in history]
            ctx = memory.on_message_inbound(message, history_, budget=budget)
            return RecallResult(
                session_id=ctx.session_id,
                prepend_text=ctx.prepend_text,
                matched_tags=list(ctx.matched_tags),
                related_tags=list(ctx.related_tags),
                broad=ctx.broad,
                temporal=ctx.temporal,
                tokens_used=ctx.budget.used,
                budget=ctx.budget.budget,
                turns_recalled=ctx.budget.turns_recalled,
            )

        return backend.run(run)

    @_tool(app, ADDS)
    def compact_context(
        messages: Annotated[
            list[ChatMessage],
            Field(
                max_length=10_000,
                description="Messages to store first: the whole history or only new turns "
                "(turns already stored are skipped). May be empty.",
            ),
        ] = [],  # noqa: B006
        force: Annotated[
            StrictBool,
            Field(
                description="true: compact now, whatever the thresholds say; false: only when "
                "the live turns cross the soft (70%) or hard (85%) threshold of the window."
            ),
        ] = True,
    ) -> CompactResult:
        """Store conversation turns in memory (tagged by topic), then compact: older turns
        become segment and topic summaries, the raw turns are kept for find_quote and
        expand_topic. The newest turns are never compacted."""

        def run() -> CompactResult:
            sid = backend.session
            before = memory.store.last_seq(sid)
            reports = []
            if messages and (r := memory.on_turn_complete([m.model_dump() for m in messages])):
                reports.append(r)
            if force and (r := memory.compact()) is not None:
                reports.append(r)
            status = memory.status()
            return CompactResult(
                session_id=sid,
                turns_stored=status.turns - before,
                total_turns=status.turns,
                compactions=reports,
                live_tokens=status.live_tokens,
                level=status.level,
            )

        return backend.run(run)

    @_tool(app, READ_ONLY)
    def domain_status() -> MemoryStatus:
        """The state of this session's memory: stored turns; live (not yet compacted) turns and
        their tokens against the context window; the compaction level and watermark; segments;
        every topic tag with its turn count; tag summaries (and how many are stale); and the
        working set (topic → depth it is paged in at)."""
        return backend.run(memory.status)

    def page(op: Literal["expand", "collapse"], tag: str, depth: Depth) -> TopicPage:
        def run() -> TopicPage:
            fn = memory.expand_topic if op == "expand" else memory.collapse_topic
            result = fn(tag, depth)
            return TopicPage(
                tag=result.tag,
                depth=result.depth,
                tokens=result.tokens,
                changes=list(result.changes),
                working_set_tokens=result.total_tokens,
                budget=result.budget,
                content=memory.pager.topic_text(backend.session, result.tag, result.depth),
            )

        return backend.run(run)

    @_tool(app, ADDS)
    def expand_topic(
        tag: Tag,
        depth: Annotated[
            Literal["summary", "segments", "full"],
            Field(
                description="summary: the topic summary; segments: each segment's summary; "
                "full: the original turns' text."
            ),
        ] = "full",
    ) -> TopicPage:
        """Load a stored (compacted) conversation topic into the working set in more detail and
        return its text. Costs tokens from the paging budget; the least recently used other
        topics are collapsed to fit. domain_status or contextfold://topics lists the topics."""
        return page("expand", tag, depth)

    @_tool(app, ADDS)
    def collapse_topic(
        tag: Tag,
        depth: Annotated[
            Literal["summary", "none"],
            Field(description="summary: keep only the topic summary; none: unload the topic."),
        ] = "summary",
    ) -> TopicPage:
        """Collapse a loaded topic back to its summary (or unload it) to free memory budget."""
        return page("collapse", tag, depth)

    @_tool(app, READ_ONLY)
    def find_quote(
        query: Annotated[Text, Field(description="Words to find verbatim: a name, number, date.")],
        limit: Annotated[StrictInt, Field(ge=1, le=50, description="Most hits to return.")] = 5,
    ) -> QuoteResult:
        """Full-text search of every stored turn of the conversation, compacted or not,
        bypassing topic tags: the escape hatch when recall misses a detail. Each hit has an
        excerpt, the turn number, its role and its tags (call expand_topic with one of them for
        the surrounding detail)."""
        quotes = backend.run(lambda: memory.find_quote(query, limit=limit))
        return QuoteResult(query=query, quotes=quotes)


def add_corpus_tools(app: MCPServer, backend: Backend) -> None:
    """search_documents and get_context over the ingested corpus."""

    @_tool(app, READ_ONLY)
    def search_documents(
        query: Annotated[Text, Field(description="What to search for.")],
        k: Annotated[StrictInt, Field(ge=1, le=100, description="Number of chunks to return.")] = 5,
        mode: Annotated[
            Literal["bm25", "dense", "hybrid"],
            Field(description="bm25 (keywords), dense (embeddings) or hybrid (both, fused)."),
        ] = "hybrid",
        tenants: Annotated[
            list[str] | None, Field(description="Only documents of these tenants.")
        ] = None,
    ) -> SearchResult:
        """Search the ingested document corpus (the one `contextfold ingest` builds) and return
        the best chunks: each with its text, score, source file, and the rank each signal
        (bm25, vector) gave it."""
        if mode == "dense" and not backend.embed:
            raise ToolError(
                "dense search needs the embedding model, but this server runs with --no-embed; "
                "use mode bm25 or hybrid (which is BM25 alone here)"
            )
        hits = backend.run(lambda: backend.index().search(query, k, mode=mode, tenants=tenants))
        return SearchResult(query=query, mode=mode, hits=hits)

    @_tool(app, READ_ONLY)
    def get_context(
        query: Annotated[Text, Field(description="The question the context is for.")],
        k: Annotated[StrictInt, Field(ge=1, le=50, description="Chunks to retrieve.")] = 5,
        max_tokens: Annotated[
            StrictInt, Field(ge=64, le=200_000, description="Most tokens the context may take.")
        ] = 4096,
    ) -> ContextResult:
        """Composed context for a question from the document corpus, ready to put in a prompt:
        the query, then the k best chunks (hybrid search), each labelled `[Source n: file]
        (score s)`; the chunk that does not fit max_tokens is cut at a sentence boundary."""

        def run() -> ContextResult:
            text = backend.context_engine(max_tokens).get_context(query, k)
            tokens = backend.memory.counter.count(text)
            return ContextResult(query=query, context=text, tokens=tokens, max_tokens=max_tokens)

        return backend.run(run)
