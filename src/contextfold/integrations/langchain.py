"""LangChain adapters (``pip install "contextfold[langchain]"``, langchain-core ≥ 0.3).

- ``ContextfoldRetriever``: a LangChain ``BaseRetriever`` over any contextfold ``Retriever``
  (a ``DocumentIndex``, a ``HybridRetriever``, a ``GraphRetriever`` …).
- ``ContextApiRetriever``: a ``BaseRetriever`` over a server's ``POST /api/context``.
- ``ContextfoldChatHistory``: a ``BaseChatMessageHistory`` backed by ``MemoryEngine``: the
  turns a chain adds are stored (tool calls and their results kept together), ``messages``
  is the session's live history (at most ``max_tokens`` of whole exchanges).
- ``recall_memory``: a runnable that puts the memory recalled for the input (stored turns
  that left the live history, summaries, paged topics) into the chain's input.
- ``trim_messages`` and ``token_counter``: LangChain's ``trim_messages`` shape with
  contextfold's exact counts and whole exchanges (a tool call never loses its result).

>>> from langchain_core.messages import AIMessage, HumanMessage
>>> history = [HumanMessage("hi"), AIMessage("hello"), HumanMessage("bye"), AIMessage("bye")]
>>> [m.content for m in trim_messages(history, max_tokens=20)]
['bye', 'bye']
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from contextfold.integrations._messages import item_metadata, require

require("langchain_core", "langchain")

from langchain_core.callbacks import (  # noqa: E402
    AsyncCallbackManagerForRetrieverRun,
    CallbackManagerForRetrieverRun,
)
from langchain_core.chat_history import BaseChatMessageHistory  # noqa: E402
from langchain_core.documents import Document  # noqa: E402
from langchain_core.messages import (  # noqa: E402
    AIMessage,
    BaseMessage,
    HumanMessage,
    SystemMessage,
    ToolMessage,
)
from langchain_core.retrievers import BaseRetriever  # noqa: E402
from langchain_core.runnables import Runnable, RunnableConfig, RunnableLambda  # noqa: E402
from pydantic import ConfigDict, Field  # noqa: E402

from contextfold.conversation import trim_history  # noqa: E402
from contextfold.errors import ConfigError  # noqa: E402
from contextfold.items import (  # noqa: E402
    ContextItem,
    Message,
    QueryBundle,
    TextBlock,
    ToolResultBlock,
    ToolUseBlock,
)
from contextfold.tokens import OVERHEADS, TokenCounter, count_messages, counter_for_model  # noqa: E402

__all__ = [
    "ContextApiRetriever",
    "ContextfoldChatHistory",
    "ContextfoldRetriever",
    "from_langchain",
    "recall_memory",
    "to_langchain",
    "token_counter",
    "trim_messages",
]


# -- messages -------------------------------------------------------------------------------


def _text(content: Any) -> str:
    """A LangChain message content as text: a string, or the text parts of a list."""
    if isinstance(content, str):
        return content
    parts = []
    for part in content or []:
        if isinstance(part, str):
            parts.append(part)
        elif isinstance(part, dict) and part.get("type") == "text":
            parts.append(str(part.get("text", "")))
    return "\n".join(parts)


def from_langchain(message: BaseMessage) -> Message:
    """A LangChain message as a contextfold ``Message`` (tool calls and results as blocks).

    Raises ``ConfigError`` for a message type with no chat role here (``FunctionMessage``,
    a ``ChatMessage`` with a custom role)."""
    text = _text(message.content)
    if isinstance(message, SystemMessage):
        return Message(role="system", content=text)
    if isinstance(message, HumanMessage):
        return Message(role="user", content=text)
    if isinstance(message, AIMessage):
        blocks: list[TextBlock | ToolUseBlock] = [TextBlock(text=text)] if text else []
        blocks.extend(
            ToolUseBlock(id=call["id"] or "", name=call["name"], input=dict(call["args"]))
            for call in message.tool_calls
        )
        return Message(role="assistant", content=tuple(blocks) or (TextBlock(text=""),))
    if isinstance(message, ToolMessage):
        block = ToolResultBlock(
            tool_use_id=message.tool_call_id,
            content=text,
            name=message.name,
            is_error=message.status == "error",
        )
        return Message(role="tool", content=(block,))
    raise ConfigError(
        f"{type(message).__name__} has no chat role contextfold stores; use SystemMessage, "
        "HumanMessage, AIMessage or ToolMessage"
    )


def to_langchain(message: Message) -> list[BaseMessage]:
    """A contextfold ``Message`` as LangChain messages (a tool message with several results
    becomes one ``ToolMessage`` per result)."""
    text = "\n".join(b.text for b in message.content if isinstance(b, TextBlock))
    if message.role == "system":
        return [SystemMessage(content=text)]
    if message.role == "user":
        return [HumanMessage(content=text)]
    if message.role == "assistant":
        calls = [
            {"name": b.name, "args": dict(b.input), "id": b.id, "type": "tool_call"}
            for b in message.content
            if isinstance(b, ToolUseBlock)
        ]
        return [AIMessage(content=text, tool_calls=calls)]
    return [
        ToolMessage(
            content=b.content,
            tool_call_id=b.tool_use_id,
            name=b.name,
            status="error" if b.is_error else "success",
        )
        for b in message.content
        if isinstance(b, ToolResultBlock)
    ]


def _to_langchain_all(messages: Sequence[Message]) -> list[BaseMessage]:
    return [out for message in messages for out in to_langchain(message)]


# -- retrievers -----------------------------------------------------------------------------


def _document(item: ContextItem) -> Document:
    return Document(page_content=item.content, metadata=item_metadata(item), id=item.id)


class ContextfoldRetriever(BaseRetriever):
    """Any contextfold ``Retriever`` (``retrieve(QueryBundle, top_k) -> list[ContextItem]``)
    as a LangChain retriever: each item becomes a ``Document`` whose metadata holds the item's
    metadata (``doc_id``, ``chunk_index``, ``match_source`` … for a ``DocumentIndex``) with its
    ``id`` and ``score``."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    retriever: Any
    """A ``DocumentIndex`` or any object with ``retrieve(query, top_k)``."""
    k: int = Field(default=4, gt=0)

    def model_post_init(self, context: Any, /) -> None:
        if not callable(getattr(self.retriever, "retrieve", None)):
            raise ConfigError(
                f"{type(self.retriever).__name__} has no retrieve(query, top_k) method; pass "
                "a DocumentIndex or another contextfold Retriever"
            )

    def _get_relevant_documents(
        self, query: str, *, run_manager: CallbackManagerForRetrieverRun
    ) -> list[Document]:
        items = self.retriever.retrieve(QueryBundle(query_str=query), self.k)
        return [_document(item) for item in items]


class ContextApiRetriever(BaseRetriever):
    """A LangChain retriever over a contextfold server's ``POST /api/context``: the entry
    points, expanded nodes and entities of the knowledge graph, as ``Document``s (metadata:
    ``node_id``, ``node_type``, ``section``, ``score``, ``path`` …). ``api_key`` is sent as
    ``Authorization: Bearer``; an error answer raises ``contextfold.client.APIError`` with
    the status and the server's message. Sync and async (``ainvoke``), through
    ``contextfold.client``."""

    url: str = "http://127.0.0.1:5757"
    tenant_ids: list[str] = Field(default_factory=list)
    api_key: str | None = None
    entry_limit: int = 10
    max_depth: int = 2
    expand: bool = True
    include_entities: bool = True
    max_tokens: int | None = None
    timeout: float = 30.0

    def _request(self, query: str) -> Any:
        from contextfold.client import Requests

        options: dict[str, Any] = {
            "entry_limit": self.entry_limit,
            "max_depth": self.max_depth,
            "expand": self.expand,
            "include_entities": self.include_entities,
            "max_tokens": self.max_tokens,
        }
        return Requests().context(query, self.tenant_ids, **options)

    @staticmethod
    def _documents(result: Any) -> list[Document]:
        from contextfold.retrieval.graph import to_context_items

        return [_document(item) for item in to_context_items(result)]

    def _get_relevant_documents(
        self, query: str, *, run_manager: CallbackManagerForRetrieverRun
    ) -> list[Document]:
        from contextfold.client import Client

        with Client(self.url, api_key=self.api_key, timeout=self.timeout) as client:
            return self._documents(client.send(self._request(query)))

    async def _aget_relevant_documents(
        self, query: str, *, run_manager: AsyncCallbackManagerForRetrieverRun
    ) -> list[Document]:
        from contextfold.client import AsyncClient

        async with AsyncClient(self.url, api_key=self.api_key, timeout=self.timeout) as client:
            return self._documents(await client.send(self._request(query)))


# -- memory ---------------------------------------------------------------------------------


class ContextfoldChatHistory(BaseChatMessageHistory):
    """A LangChain chat history backed by a ``MemoryEngine`` session.

    ``add_messages`` stores the turns (system messages are not turns) through
    ``on_turn_complete(..., new_only=True)``: tagged, and compacted when the session crosses
    its threshold. ``messages`` is the session's live history (the turns compaction has not
    folded into summaries), cut to the newest whole exchanges that fit ``max_tokens`` when
    given, so a tool call and its result stay together. What leaves the history is not lost:
    ``recall_memory`` (or ``recall``) brings back what a new message needs. ``clear`` deletes
    the session."""

    def __init__(
        self,
        engine: Any,
        session_id: str | None = None,
        *,
        max_tokens: int | None = None,
        counter: TokenCounter | None = None,
        format: str = "openai",
    ) -> None:
        if max_tokens is not None and max_tokens <= 0:
            raise ConfigError(f"max_tokens must be positive, got {max_tokens}")
        self.engine = engine
        self.session_id = engine._sid(session_id)  # (an empty id is an error)
        self.max_tokens = max_tokens
        self.counter = counter if counter is not None else engine.counter
        self.format = format

    def stored(self) -> list[Message]:
        """The session's live turns as contextfold messages, oldest first."""
        store = self.engine.store
        sid = self.engine._session(self.session_id)
        start = max(store.session(sid).compaction_watermark, 1)
        turns = [t.message for t in store.turns(sid, start=start)]
        if self.max_tokens is not None:
            turns = trim_history(turns, self.max_tokens, self.counter, format=self.format)
        return turns

    @property
    def messages(self) -> list[BaseMessage]:  # type: ignore[override]
        return _to_langchain_all(self.stored())

    def add_messages(self, messages: Sequence[BaseMessage]) -> None:
        self.engine.on_turn_complete(
            [from_langchain(m) for m in messages], session_id=self.session_id, new_only=True
        )

    def recall(self, query: str, history: Sequence[BaseMessage] | None = None) -> str:
        """The memory block for ``query`` (empty when nothing stored is relevant); turns in
        ``history`` (default: ``messages``) are not recalled again."""
        held = self.stored() if history is None else [from_langchain(m) for m in history]
        return str(
            self.engine.on_message_inbound(query, held, session_id=self.session_id).prepend_text
        )

    def clear(self) -> None:
        self.engine.delete_session(self.session_id)


def recall_memory(
    engine: Any,
    *,
    input_key: str = "input",
    history_key: str = "history",
    output_key: str = "memory",
    session_id: str | None = None,
) -> Runnable[dict[str, Any], dict[str, Any]]:
    """A runnable that adds ``output_key`` (the memory block ``engine`` recalls for the
    input's ``input_key`` text) to a dict input, for a prompt's system message.

    The session is ``session_id``, else the config's ``configurable.session_id`` (what
    ``RunnableWithMessageHistory`` passes), else the engine's. Turns already in the input's
    ``history_key`` messages are not recalled again."""

    def assign(inputs: dict[str, Any], config: RunnableConfig) -> dict[str, Any]:
        if not isinstance(inputs, dict) or input_key not in inputs:
            raise ConfigError(f"recall_memory needs a dict input with the key {input_key!r}")
        sid = session_id or (config.get("configurable") or {}).get("session_id")
        query = inputs[input_key]
        text = query if isinstance(query, str) else _text(getattr(query, "content", query))
        history = [from_langchain(m) for m in inputs.get(history_key) or []]
        assembled = engine.on_message_inbound(text, history, session_id=sid)
        return {**inputs, output_key: assembled.prepend_text}

    return RunnableLambda(assign, name="recall_memory")


# -- trimming -------------------------------------------------------------------------------


def _counter(model: str | None, counter: TokenCounter | None) -> TokenCounter:
    if model is not None and counter is not None:
        raise ConfigError("give either model or counter, not both")
    if counter is not None:
        return counter
    return counter_for_model(model) if model else counter_for_model("gpt-4o")


def token_counter(
    model: str | None = None, *, counter: TokenCounter | None = None, format: str = "openai"
) -> Callable[[list[BaseMessage]], int]:
    """A list token counter for LangChain's own ``trim_messages(token_counter=...)``: the
    exact cost of the messages in ``format`` (per-message overhead, roles, tool calls), as
    contextfold's formatters count it (the per-request overhead not included)."""
    if format not in OVERHEADS:
        raise ConfigError(f"unknown format {format!r}; choose one of {sorted(OVERHEADS)}")
    chosen = _counter(model, counter)

    def count(messages: list[BaseMessage]) -> int:
        return count_messages([from_langchain(m) for m in messages], chosen, format)

    return count


def trim_messages(
    messages: Sequence[BaseMessage] | None = None,
    *,
    max_tokens: int,
    model: str | None = None,
    counter: TokenCounter | None = None,
    format: str = "openai",
    include_system: bool = True,
) -> Any:
    """LangChain's ``trim_messages`` shape: the newest messages that fit ``max_tokens``
    (the request's overhead included), cut at whole exchanges (a user turn with its replies
    and every tool call and result), so a tool call never loses its result and what is kept
    starts on a human turn. A leading system message is kept when ``include_system``.
    Without ``messages`` it returns a runnable, as LangChain's does
    (``trim_messages(max_tokens=...) | model``). The same message objects come back."""
    chosen = _counter(model, counter)

    def trim(batch: Sequence[BaseMessage]) -> list[BaseMessage]:
        originals = list(batch)
        converted = [from_langchain(m) for m in originals]
        by_id = {id(c): i for i, c in enumerate(converted)}
        kept = trim_history(
            converted, max_tokens, chosen, format=format, keep_system=include_system
        )
        return [originals[by_id[id(m)]] for m in kept]

    if messages is None:
        return RunnableLambda(trim, name="trim_messages")
    if isinstance(messages, str | bytes) or not isinstance(messages, Sequence):
        raise ConfigError(f"trim_messages takes a list of messages, got {type(messages).__name__}")
    return trim(messages)
