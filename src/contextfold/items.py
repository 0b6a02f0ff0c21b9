"""The values that flow through a build: context items, messages and queries.

Everything here is a frozen pydantic model. A ``Message`` holds typed content blocks, so tool
traffic from every provider (OpenAI ``tool_calls`` / ``tool`` messages, Anthropic ``tool_use`` /
``tool_result`` blocks, Gemini ``functionCall`` / ``functionResponse`` parts) has one shape.

Text entering these models is made valid Unicode (``valid_text``): a lone UTF-16 surrogate (an
emoji cut in half, JSON ``"\\ud83d"``, an undecodable command-line byte) becomes U+FFFD, so
nothing downstream fails to encode it.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from enum import StrEnum
from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    field_validator,
    model_validator,
)

if TYPE_CHECKING:
    from contextfold.tokens import TokenCounter

__all__ = [
    "ContentBlock",
    "ContextItem",
    "Message",
    "QueryBundle",
    "Role",
    "SourceType",
    "TextBlock",
    "ToolResultBlock",
    "ToolUseBlock",
    "ValidText",
    "valid_text",
]

_FROZEN = ConfigDict(frozen=True, extra="forbid")


def valid_text(text: str) -> str:
    """``text`` as valid Unicode: each lone UTF-16 surrogate becomes U+FFFD, and a high and a
    low surrogate in a row become the one character they encode. Valid text is returned as is.

    >>> valid_text("cut \\ud83d here") == "cut \\ufffd here"
    True
    >>> valid_text("\\ud83d\\ude00") == "\\U0001f600"
    True
    """
    if text.isascii():
        return text
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "replace")
    return text


def _valid_json(value: Any) -> Any:
    """``value`` (decoded JSON) with every string in it, keys included, made ``valid_text``."""
    if isinstance(value, str):
        return valid_text(value)
    if isinstance(value, dict):
        return {
            valid_text(k) if isinstance(k, str) else k: _valid_json(v) for k, v in value.items()
        }
    if isinstance(value, list | tuple):
        return type(value)(_valid_json(v) for v in value)
    return value


#: A ``str`` field whose value is made ``valid_text``.
ValidText = Annotated[str, AfterValidator(valid_text)]


class SourceType(StrEnum):
    """Where a candidate item comes from; budgets map sources onto sections."""

    SYSTEM = "system"  # instructions; pinned when added through add_system_prompt
    USER = "user"  # the current query; pinned
    CONVERSATION = "conversation"  # turns of the conversation history
    MEMORY = "memory"  # persistent facts, summaries, paged-in topics
    RETRIEVAL = "retrieval"  # retrieved chunks and graph nodes
    TOOL = "tool"  # tool execution outputs


Role = Literal["system", "user", "assistant", "tool"]


class TextBlock(BaseModel):
    """Plain text."""

    model_config = _FROZEN
    type: Literal["text"] = "text"
    text: ValidText


class ToolUseBlock(BaseModel):
    """A model's request to call a tool (OpenAI ``tool_calls``, Anthropic ``tool_use``,
    Gemini ``functionCall``)."""

    model_config = _FROZEN
    type: Literal["tool_use"] = "tool_use"
    id: ValidText
    name: ValidText
    input: Annotated[dict[str, Any], AfterValidator(_valid_json)] = Field(default_factory=dict)

    def arguments_json(self) -> str:
        """The arguments as compact JSON with sorted keys (stable bytes for caching)."""
        return json.dumps(self.input, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


class ToolResultBlock(BaseModel):
    """The result of a tool call (OpenAI ``tool`` message, Anthropic ``tool_result``,
    Gemini ``functionResponse``)."""

    model_config = _FROZEN
    type: Literal["tool_result"] = "tool_result"
    tool_use_id: ValidText
    content: ValidText
    name: ValidText | None = None  # Gemini matches responses by function name
    is_error: bool = False


ContentBlock = Annotated[TextBlock | ToolUseBlock | ToolResultBlock, Field(discriminator="type")]


class Message(BaseModel):
    """One chat message with typed content blocks.

    >>> Message(role="user", content="hi").text()
    'hi'
    """

    model_config = _FROZEN
    role: Role
    content: tuple[ContentBlock, ...]
    name: ValidText | None = None

    @field_validator("content", mode="before")
    @classmethod
    def _wrap_text(cls, value: Any) -> Any:
        if isinstance(value, str):
            return (TextBlock(text=value),)
        return value

    @model_validator(mode="after")
    def _check_roles(self) -> Message:
        results = [b for b in self.content if isinstance(b, ToolResultBlock)]
        if results and self.role != "tool":
            raise ValueError(f"tool_result blocks belong in a 'tool' message, not {self.role!r}")
        if self.role == "tool" and len(results) != len(self.content):
            raise ValueError("a 'tool' message holds only tool_result blocks")
        if any(isinstance(b, ToolUseBlock) for b in self.content) and self.role != "assistant":
            raise ValueError(f"tool_use blocks belong in an 'assistant' message, not {self.role!r}")
        return self

    def text(self) -> str:
        """The text of the message; tool calls and results rendered as short readable lines."""
        parts: list[str] = []
        for block in self.content:
            if isinstance(block, TextBlock):
                parts.append(block.text)
            elif isinstance(block, ToolUseBlock):
                parts.append(f"[tool call {block.name}({block.arguments_json()})]")
            else:
                parts.append(f"[tool result {block.tool_use_id}] {block.content}")
        return "\n".join(parts)

    @property
    def tool_use_ids(self) -> tuple[str, ...]:
        return tuple(b.id for b in self.content if isinstance(b, ToolUseBlock))

    @property
    def tool_result_ids(self) -> tuple[str, ...]:
        return tuple(b.tool_use_id for b in self.content if isinstance(b, ToolResultBlock))


def _new_id() -> str:
    return uuid.uuid4().hex[:16]


def _now() -> datetime:
    return datetime.now(UTC)


class ContextItem(BaseModel):
    """One candidate piece of context.

    ``priority`` (1–10) ranks items across a budget section, ``score`` ranks items of equal
    priority. Items with the same ``group_id`` are packed all-or-none; conversation items that
    carry a tool call and its result are grouped automatically. ``pinned`` items (instructions,
    the current query) are never dropped.

    >>> from contextfold.tokens import CharCounter
    >>> item = ContextItem(content="Paris is the capital of France.", source=SourceType.RETRIEVAL)
    >>> item.tokens(CharCounter())
    8
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    id: str = Field(default_factory=_new_id)
    content: ValidText = ""
    source: SourceType = SourceType.RETRIEVAL
    section: str | None = None
    priority: int = Field(default=5, ge=1, le=10)
    score: float = 0.0
    metadata: dict[str, Any] = Field(default_factory=dict)
    created_at: datetime = Field(default_factory=_now)
    group_id: str | None = None
    pinned: bool = False
    message: Message | None = None

    # key -> (content, metadata, source it was computed for, value). ``model_copy`` shares
    # private state, so every field a rendering may depend on is checked by identity: a copy
    # with new content, metadata (e.g. a document's source label) or source recomputes.
    _tokens: dict[str, tuple[str, dict[str, Any], SourceType, int]] = PrivateAttr(
        default_factory=dict
    )

    @model_validator(mode="before")
    @classmethod
    def _content_from_message(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("message") is not None and not data.get("content"):
            message = data["message"]
            if isinstance(message, dict):
                message = Message.model_validate(message)
            data = {**data, "message": message, "content": message.text()}
        return data

    @model_validator(mode="after")
    def _message_only_in_conversation(self) -> ContextItem:
        if self.message is not None and self.source is not SourceType.CONVERSATION:
            raise ValueError("only CONVERSATION items carry a message")
        return self

    @classmethod
    def from_message(cls, message: Message, **fields: Any) -> ContextItem:
        """A conversation item for ``message`` (priority 7 unless given)."""
        fields.setdefault("priority", 7)
        return cls(message=message, source=SourceType.CONVERSATION, **fields)

    def tokens(self, counter: TokenCounter) -> int:
        """Tokens in ``content`` under ``counter``; computed on first use and cached."""
        return self.memo(counter.name, lambda: counter.count(self.content))

    def memo(self, key: str, compute: Callable[[], int]) -> int:
        """A per-item cache for values derived from the item (token costs per counter and
        format); recomputed when its content, metadata or source changed."""
        # Read the private dict straight from its slot: pydantic's attribute fallback for
        # private names costs ~2 µs a call, which the packer would pay per item.
        cache: dict[str, tuple[str, dict[str, Any], SourceType, int]]
        cache = self.__pydantic_private__["_tokens"]  # type: ignore[index]
        cached = cache.get(key)
        if cached is not None:
            if (
                cached[0] is self.content
                and cached[1] is self.metadata
                and cached[2] is self.source
            ):
                return cached[3]
            # ``model_copy`` shares this dict with the original; give the copy its own so the
            # two stop overwriting each other's entries.
            cache = self.__pydantic_private__["_tokens"] = {}  # type: ignore[index]
        value = compute()
        cache[key] = (self.content, self.metadata, self.source, value)
        return value


class QueryBundle(BaseModel):
    """The query a build answers; ``build()`` wraps a plain ``str`` in one."""

    model_config = _FROZEN
    query_str: ValidText
    embedding: list[float] | None = None
    filters: dict[str, Any] = Field(default_factory=dict)
    metadata: dict[str, Any] = Field(default_factory=dict)
