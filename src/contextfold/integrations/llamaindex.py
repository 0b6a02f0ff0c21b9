"""LlamaIndex adapters (``pip install "contextfold[llamaindex]"``, llama-index-core ≥ 0.12).

- ``ContextfoldRetriever``: a LlamaIndex ``BaseRetriever`` over any contextfold ``Retriever``
  (a ``DocumentIndex``, a ``GraphRetriever`` …), so a ``RetrieverQueryEngine`` retrieves
  through contextfold.
- ``ContextfoldMemory``: a LlamaIndex ``BaseMemory`` backed by a ``MemoryEngine`` session:
  ``put`` stores turns (tool calls and results kept together), ``get`` returns the memory
  recalled for the newest user message as a system message, then the live history (the
  newest exchange always, even past ``max_tokens``).

LlamaIndex counts tokens with tiktoken's ``cl100k_base``, which tiktoken downloads on first
use; ``offline_tokenizer()`` is the same encoding from the file contextfold ships
(``Settings.tokenizer = offline_tokenizer()``), so nothing is downloaded.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Sequence
from typing import Any

from contextfold.integrations._messages import item_metadata, require

require("llama_index.core", "llamaindex")

from llama_index.core.base.llms.types import (  # noqa: E402
    ChatMessage,
    MessageRole,
    ToolCallBlock,
)
from llama_index.core.base.llms.types import TextBlock as LlamaText  # noqa: E402
from llama_index.core.memory.types import BaseMemory  # noqa: E402
from llama_index.core.retrievers import BaseRetriever  # noqa: E402
from llama_index.core.schema import NodeWithScore, TextNode  # noqa: E402
from llama_index.core.schema import QueryBundle as LlamaQuery  # noqa: E402
from pydantic import ConfigDict, Field, PrivateAttr  # noqa: E402

from contextfold.conversation import exchanges, trim_history  # noqa: E402
from contextfold.errors import ConfigError  # noqa: E402
from contextfold.items import (  # noqa: E402
    Message,
    QueryBundle,
    TextBlock,
    ToolResultBlock,
    ToolUseBlock,
)

__all__ = [
    "ContextfoldMemory",
    "ContextfoldRetriever",
    "from_llamaindex",
    "offline_tokenizer",
    "to_llamaindex",
]


def offline_tokenizer(encoding: str = "cl100k_base") -> Callable[[str], list[int]]:
    """``encoding``'s ``encode`` from the file the ``bpe-openai`` package ships (hash-checked),
    for ``Settings.tokenizer``: LlamaIndex's default downloads it."""
    from contextfold.tokens import load_encoding

    encode = load_encoding(encoding).encode

    def tokenize(text: str) -> list[int]:
        return encode(text, disallowed_special=())

    return tokenize


# -- retriever ------------------------------------------------------------------------------


class ContextfoldRetriever(BaseRetriever):
    """Any contextfold ``Retriever`` as a LlamaIndex retriever: each item becomes a
    ``NodeWithScore`` (a ``TextNode`` with the item's id, text and metadata)."""

    def __init__(self, retriever: Any, k: int = 4, **kwargs: Any) -> None:
        if not callable(getattr(retriever, "retrieve", None)):
            raise ConfigError(
                f"{type(retriever).__name__} has no retrieve(query, top_k) method; pass a "
                "DocumentIndex or another contextfold Retriever"
            )
        if k <= 0:
            raise ConfigError(f"k must be positive, got {k}")
        self.retriever = retriever
        self.k = k
        super().__init__(**kwargs)

    def _retrieve(self, query_bundle: LlamaQuery) -> list[NodeWithScore]:
        bundle = QueryBundle(
            query_str=query_bundle.query_str,
            embedding=list(query_bundle.embedding) if query_bundle.embedding else None,
        )
        return [
            NodeWithScore(
                node=TextNode(id_=item.id, text=item.content, metadata=item_metadata(item)),
                score=item.score,
            )
            for item in self.retriever.retrieve(bundle, self.k)
        ]


# -- messages -------------------------------------------------------------------------------

_ROLES = {
    MessageRole.SYSTEM: "system",
    MessageRole.DEVELOPER: "system",
    MessageRole.USER: "user",
    MessageRole.ASSISTANT: "assistant",
    MessageRole.CHATBOT: "assistant",
    MessageRole.MODEL: "assistant",
    MessageRole.TOOL: "tool",
}


def _arguments(raw: Any) -> dict[str, Any]:
    if isinstance(raw, dict):
        return dict(raw)
    try:
        parsed = json.loads(raw or "{}")
    except (TypeError, ValueError):
        return {"input": raw}
    return parsed if isinstance(parsed, dict) else {"input": parsed}


def from_llamaindex(message: ChatMessage) -> Message:
    """A LlamaIndex ``ChatMessage`` as a contextfold ``Message``: tool calls from
    ``ToolCallBlock``s or OpenAI-style ``additional_kwargs["tool_calls"]``, a ``tool`` role
    message's result matched by ``additional_kwargs["tool_call_id"]``."""
    role = _ROLES.get(message.role)
    if role is None:
        raise ConfigError(
            f"a {message.role.value!r} message has no chat role contextfold stores; use "
            "system, user, assistant or tool"
        )
    text = "\n".join(b.text for b in message.blocks if isinstance(b, LlamaText))
    extra = message.additional_kwargs
    if role == "tool":
        call_id = extra.get("tool_call_id")
        if not call_id:
            raise ConfigError("a tool message needs additional_kwargs['tool_call_id']")
        block = ToolResultBlock(tool_use_id=str(call_id), content=text, name=extra.get("name"))
        return Message(role="tool", content=(block,))
    if role != "assistant":
        return Message(role=role, content=text)
    calls = [
        ToolUseBlock(id=b.tool_call_id or "", name=b.tool_name, input=_arguments(b.tool_kwargs))
        for b in message.blocks
        if isinstance(b, ToolCallBlock)
    ]
    for call in extra.get("tool_calls") or []:
        function = call.get("function", {}) if isinstance(call, dict) else {}
        calls.append(
            ToolUseBlock(
                id=str(call.get("id", "")),
                name=str(function.get("name", "")),
                input=_arguments(function.get("arguments")),
            )
        )
    blocks: list[TextBlock | ToolUseBlock] = [TextBlock(text=text)] if text or not calls else []
    return Message(role="assistant", content=(*blocks, *calls))


def to_llamaindex(message: Message) -> list[ChatMessage]:
    """A contextfold ``Message`` as LlamaIndex messages (one ``tool`` message per result)."""
    text = "\n".join(b.text for b in message.content if isinstance(b, TextBlock))
    if message.role == "tool":
        return [
            ChatMessage(
                role=MessageRole.TOOL,
                content=b.content,
                additional_kwargs={"tool_call_id": b.tool_use_id, "name": b.name},
            )
            for b in message.content
            if isinstance(b, ToolResultBlock)
        ]
    blocks: list[Any] = [LlamaText(text=text)]
    blocks.extend(
        ToolCallBlock(tool_call_id=b.id, tool_name=b.name, tool_kwargs=dict(b.input))
        for b in message.content
        if isinstance(b, ToolUseBlock)
    )
    return [ChatMessage(role=MessageRole(message.role), blocks=blocks)]


def _all(messages: Sequence[Message]) -> list[ChatMessage]:
    return [out for message in messages for out in to_llamaindex(message)]


# -- memory ---------------------------------------------------------------------------------


class ContextfoldMemory(BaseMemory):
    """A LlamaIndex memory backed by a ``MemoryEngine`` session.

    ``put`` stores a message as a turn (system messages are not turns; an assistant tool
    call waits for its results, so the call and results are stored together); ``get(input)``
    is the memory recalled for ``input`` (default: the newest stored user message) as one
    system message, then the live history: the turns compaction has not folded away, cut to
    the newest whole exchanges within ``max_tokens`` when given. The newest exchange (the
    newest user message with the replies and tool traffic after it) is always kept, even when
    it alone is over ``max_tokens``, so the model is never sent a history without the message
    it answers (LlamaIndex's ``ChatMemoryBuffer`` likewise returns its newest message past
    ``token_limit``). ``get_all`` is every stored turn; ``reset`` deletes the session."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    engine: Any = Field(exclude=True)
    session_id: str = "default"
    max_tokens: int | None = Field(default=None, gt=0)
    _pending: list[Message] = PrivateAttr(default_factory=list)

    @classmethod
    def class_name(cls) -> str:
        return "ContextfoldMemory"

    @classmethod
    def from_defaults(cls, **kwargs: Any) -> ContextfoldMemory:
        """``ContextfoldMemory(engine=MemoryEngine(...), session_id=...)``; ``chat_history``
        (LlamaIndex's keyword) is stored as the session's first turns."""
        history = kwargs.pop("chat_history", None) or []
        kwargs.pop("token_limit", None)  # LlamaIndex's buffer size; max_tokens here
        if "engine" not in kwargs:
            raise ConfigError("ContextfoldMemory needs engine=MemoryEngine(...)")
        memory = cls(**kwargs)
        memory.put_messages(history)
        return memory

    def _live(self) -> tuple[list[Message], str]:
        """The live history (within ``max_tokens``) and the newest user message's text."""
        store = self.engine.store
        sid = self.engine._session(self.session_id)
        start = max(store.session(sid).compaction_watermark, 1)
        turns = [t.message for t in store.turns(sid, start=start)]
        users = [m for m in turns if m.role == "user"]
        newest = users[-1].text() if users else ""
        if self.max_tokens is None:
            return turns, newest
        kept = trim_history(turns, self.max_tokens, self.engine.counter)
        if users and not any(m.role == "user" for m in kept):
            # The newest exchange alone is over max_tokens: keep it anyway, so the model gets
            # the message it answers (ChatMemoryBuffer keeps its newest message the same way).
            last = exchanges(turns)[-1]
            tail = [turns[i] for i in last]
            whole = trim_history(tail, sys.maxsize, self.engine.counter, keep_system=False)
            kept.extend(whole if any(m.role == "user" for m in whole) else users[-1:])
        return kept, newest

    def get(self, input: str | None = None, **kwargs: Any) -> list[ChatMessage]:
        live, newest = self._live()
        query = newest if input is None else input
        out: list[ChatMessage] = []
        if query:
            assembled = self.engine.on_message_inbound(query, live, session_id=self.session_id)
            if assembled.prepend_text:
                out.append(ChatMessage(role=MessageRole.SYSTEM, content=assembled.prepend_text))
        return [*out, *_all(live)]

    def get_all(self) -> list[ChatMessage]:
        sid = self.engine._session(self.session_id)
        return _all([t.message for t in self.engine.store.turns(sid)])

    def put(self, message: ChatMessage) -> None:
        self._pending.append(from_llamaindex(message))
        open_calls = {c for m in self._pending for c in m.tool_use_ids} - {
            r for m in self._pending for r in m.tool_result_ids
        }
        if open_calls:
            return  # a tool call is stored with its results
        turns, self._pending = self._pending, []
        self.engine.on_turn_complete(turns, session_id=self.session_id, new_only=True)

    def set(self, messages: list[ChatMessage]) -> None:
        self.reset()
        self.put_messages(messages)

    def reset(self) -> None:
        self._pending = []
        self.engine.delete_session(self.session_id)
