"""OpenAI Chat Completions format: ``{"messages": [...]}``.

Instructions form one system message; memory and retrieved context one user message placed
before the history; tool calls become ``tool_calls`` and each tool result a ``tool`` message.
Consecutive same-role messages (other than ``tool``) are merged.

``parse_openai_messages`` reads a request's ``messages`` back into ``Message`` values;
``message_from_dict`` reads one message given in either OpenAI's shape or contextfold's own.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

from pydantic import ValidationError

from contextfold.errors import FormatError
from contextfold.formats._parsing import (
    expect_dict,
    expect_list,
    expect_str,
    fail,
    optional_str,
    text_of_parts,
    type_name,
)
from contextfold.formats.base import BaseFormatter, layout_items
from contextfold.items import (
    ContentBlock,
    ContextItem,
    Message,
    Role,
    TextBlock,
    ToolResultBlock,
    ToolUseBlock,
)
from contextfold.tokens import OVERHEADS, TokenCounter

__all__ = [
    "IMAGE_TOKENS",
    "OpenAIFormatter",
    "count_openai_message",
    "message_from_dict",
    "message_to_openai",
    "parse_openai_message",
    "parse_openai_messages",
]

_JOIN = "\n\n"

#: Estimated tokens of one image content part by its ``detail`` (OpenAI bills ``low`` at 85 and
#: a 1024 × 1024 image at ``high`` at 765; the real cost depends on the image's size, which a
#: payload does not carry). contextfold never builds image parts; this only counts payloads
#: that carry them.
IMAGE_TOKENS = {"low": 85, "high": 765, "auto": 765}


def _compact(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def _part_tokens(part: Any, counter: TokenCounter) -> int:
    """One content part: a text part's text; an image its ``IMAGE_TOKENS`` estimate; anything
    else the tokens of its compact JSON (an estimate)."""
    if isinstance(part, dict):
        if part.get("type") == "text" and isinstance(part.get("text"), str):
            return counter.count(part["text"])
        if part.get("type") == "image_url":
            image = part.get("image_url")
            detail = image.get("detail", "auto") if isinstance(image, dict) else "auto"
            return IMAGE_TOKENS.get(detail, IMAGE_TOKENS["high"])
    if isinstance(part, str):
        return counter.count(part)
    return counter.count(_compact(part))


def _call_tokens(call: Any, counter: TokenCounter, per_part: int) -> int:
    """One tool call (an estimate): every string in it (``id``, ``type``, the function's
    ``name`` and ``arguments``) plus ``per_part``."""
    if not isinstance(call, dict):
        return counter.count(_compact(call)) + per_part
    total = per_part
    for key, value in call.items():
        if isinstance(value, str):
            total += counter.count(value)
        elif key == "function" and isinstance(value, dict):
            total += sum(counter.count(v) for v in value.values() if isinstance(v, str))
        else:
            total += counter.count(_compact(value))
    return total


def count_openai_message(message: dict[str, Any], counter: TokenCounter) -> int:
    """Tokens of one Chat Completions message by OpenAI's cookbook: 3, plus the tokens of every
    string value (the role included), plus 1 for a ``name``.

    What the cookbook does not define is estimated: a list of content parts costs its parts
    (text parts their text, images ``IMAGE_TOKENS``) plus 1 per part after the first; each tool
    call costs every string in it plus 1. ``None`` values (an assistant's ``content`` beside its
    tool calls) cost nothing.

    >>> from contextfold.tokens import TiktokenCounter
    >>> count_openai_message({"role": "user", "content": "Hello"}, TiktokenCounter())
    5
    """
    oh = OVERHEADS["openai"]
    total = oh.per_message
    for key, value in message.items():
        if isinstance(value, str):
            total += counter.count(value)
            if key == "name":
                total += oh.per_name
        elif key == "content" and isinstance(value, list):
            total += sum(_part_tokens(p, counter) for p in value)
            total += oh.per_part * max(0, len(value) - 1)
        elif key == "tool_calls" and isinstance(value, list):
            total += sum(_call_tokens(c, counter, oh.per_part) for c in value)
        elif value is not None:
            total += counter.count(_compact(value))
    return total


def message_to_openai(message: Message) -> list[dict[str, Any]]:
    """One message as OpenAI chat messages (a tool message becomes one per result)."""
    content = message.content
    if len(content) == 1 and isinstance(content[0], TextBlock) and message.role != "tool":
        # The common case, a plain text message, without the general path's passes.
        out: dict[str, Any] = {"role": message.role, "content": content[0].text}
        if message.name:
            out["name"] = message.name
        return [out]
    if message.role == "tool":
        return [
            {"role": "tool", "tool_call_id": b.tool_use_id, "content": b.content}
            for b in message.content
            if isinstance(b, ToolResultBlock)
        ]
    text = "\n".join(b.text for b in message.content if isinstance(b, TextBlock))
    out = {"role": message.role, "content": text}
    if message.name:
        out["name"] = message.name
    calls = [
        {
            "id": b.id,
            "type": "function",
            "function": {"name": b.name, "arguments": b.arguments_json()},
        }
        for b in message.content
        if isinstance(b, ToolUseBlock)
    ]
    if calls:
        out["content"] = text or None
        out["tool_calls"] = calls
    return [out]


def _merge(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    merged: list[dict[str, Any]] = []
    for msg in messages:
        prev = merged[-1] if merged else None
        if (
            prev is not None
            and prev["role"] == msg["role"] != "tool"
            and prev.get("name") == msg.get("name")
        ):
            texts = [t for t in (prev.get("content"), msg.get("content")) if t]
            prev["content"] = _JOIN.join(texts) if texts else None
            calls = prev.get("tool_calls", []) + msg.get("tool_calls", [])
            if calls:
                prev["tool_calls"] = calls
            continue
        merged.append(dict(msg))
    return merged


class OpenAIFormatter(BaseFormatter):
    """Chat Completions messages.

    >>> from contextfold.items import ContextItem, SourceType
    >>> OpenAIFormatter().format([ContextItem(content="Hi", source=SourceType.USER)])
    {'messages': [{'role': 'user', 'content': 'Hi'}]}
    """

    name: ClassVar[str] = "openai"

    def message_cost(self, message: Message, counter: TokenCounter) -> int:
        # Exactly what the message costs as it is written into the payload (a tool message
        # becomes one OpenAI message per result, each with its own overhead).
        content = message.content
        if len(content) == 1 and isinstance(content[0], TextBlock) and message.role != "tool":
            # The common case, counted without building the message (as count_openai_message
            # counts {"role", "content"[, "name"]}).
            oh = self.overhead
            total = oh.per_message + counter.count(message.role) + counter.count(content[0].text)
            if message.name:
                total += counter.count(message.name) + oh.per_name
            return total
        return sum(count_openai_message(m, counter) for m in message_to_openai(message))

    def base_cost(self, counter: TokenCounter) -> int:
        # The frame's messages: system, the context (user) and the query (user), roles counted.
        oh = self.overhead
        roles = counter.count("system") + 2 * counter.count("user")
        return oh.per_request + self.FRAME_MESSAGES * oh.per_message + roles

    def format(self, items: Sequence[ContextItem]) -> dict[str, Any]:
        layout = layout_items(items)
        system, context = self.split_memory(layout)
        messages: list[dict[str, Any]] = []
        if system:
            messages.append({"role": "system", "content": _JOIN.join(system)})
        if context:
            messages.append({"role": "user", "content": _JOIN.join(context)})
        for message in layout.history:
            messages.extend(message_to_openai(message))
        if layout.query:
            messages.append(
                {"role": "user", "content": _JOIN.join(q.content for q in layout.query)}
            )
        return {"messages": _merge(messages)}

    def count_payload(self, payload: Any, counter: TokenCounter) -> int:
        """The cookbook's count (``count_openai_message`` per message, plus 3 to prime the
        reply); tool definitions under ``tools``, which contextfold never adds itself, are
        estimated as the tokens of each definition's compact JSON."""
        total = self.overhead.per_request
        total += sum(count_openai_message(m, counter) for m in payload["messages"])
        total += sum(counter.count(_compact(tool)) for tool in payload.get("tools") or ())
        return total


# --------------------------------------------------------------------------- parsing

_ROLES: dict[str, Role] = {
    "system": "system",
    "developer": "system",
    "user": "user",
    "assistant": "assistant",
    "tool": "tool",
}


def parse_openai_messages(messages: list[dict[str, Any]]) -> list[Message]:
    """A Chat Completions ``messages`` list as ``Message`` values.

    ``developer`` becomes ``system``; text parts become text blocks; ``tool_calls`` become tool
    use blocks (``arguments`` decoded from JSON); consecutive ``tool`` messages become one
    ``tool`` message with a result block each. Raises ``FormatError`` naming the path of the
    first malformed value.

    >>> parse_openai_messages([{"role": "developer", "content": "Be brief."}])
    [Message(role='system', content=(TextBlock(type='text', text='Be brief.'),), name=None)]
    """
    out: list[Message] = []
    for i, raw in enumerate(expect_list(messages, "messages")):
        message = parse_openai_message(raw, f"messages[{i}]")
        if message.role == "tool" and out and out[-1].role == "tool":
            out[-1] = Message(role="tool", content=(*out[-1].content, *message.content))
        else:
            out.append(message)
    return out


def parse_openai_message(message: Any, path: str = "") -> Message:
    """One Chat Completions message as a ``Message`` (a ``tool`` message: one result block).

    ``path`` says where the message sits (``messages[2]``): a ``FormatError`` names the
    malformed value under it, or by its own path in the message when ``path`` is empty
    (``tool_calls[0].id is null; expected a string``).

    >>> parse_openai_message({"role": "tool", "tool_call_id": "c1", "content": "18C"}).text()
    '[tool result c1] 18C'
    """
    msg = expect_dict(message, path or "the message")
    role = _role(msg.get("role"), _at(path, "role"))
    if role == "tool":
        return Message(role="tool", content=(_tool_result(msg, path),))
    if msg.get("function_call") is not None:
        fail(_at(path, "function_call"), "(the legacy form) is not supported yet; use tool_calls")
    texts = _content(msg, path, role)
    blocks: list[ContentBlock] = list(texts)
    calls = msg.get("tool_calls")
    if calls is not None:
        if role != "assistant":
            fail(
                _at(path, "tool_calls"),
                f"appears in a {role!r} message; only assistant messages call tools",
            )
        calls = expect_list(calls, _at(path, "tool_calls"))
        blocks = [b for b in texts if b.text]  # some clients send "" instead of null
        blocks.extend(_tool_call(c, _at(path, f"tool_calls[{j}]")) for j, c in enumerate(calls))
    name = optional_str(msg.get("name"), _at(path, "name"))
    return Message(role=role, content=tuple(blocks), name=name)


#: Fields only an OpenAI Chat Completions message has (a ``Message`` has none of them).
_OPENAI_FIELDS = ("tool_calls", "tool_call_id", "function_call")


def message_from_dict(message: Mapping[str, Any]) -> Message:
    """A chat message given as a mapping, in either shape a caller may hold:

    - contextfold's own (``Message.model_dump()``): ``role``, ``content`` as text or blocks
      (an Anthropic assistant's ``tool_use`` blocks read the same), ``name``;
    - OpenAI Chat Completions: an assistant's ``tool_calls``, a ``tool`` message's
      ``tool_call_id`` and text, the ``developer`` role; read by ``parse_openai_message``.

    A plain ``{"role", "content"}`` reads the same either way. Raises ``FormatError``, one
    line naming the malformed field.

    >>> message_from_dict({"role": "tool", "tool_call_id": "c1", "content": "18C"}).role
    'tool'
    """
    role, content = message.get("role"), message.get("content")
    if (
        any(key in message for key in _OPENAI_FIELDS)
        or role in ("developer", "function")
        or (role == "tool" and not isinstance(content, list | tuple))
    ):
        return parse_openai_message(dict(message))
    try:
        return Message.model_validate(dict(message))
    except ValidationError as exc:
        error = exc.errors()[0]
        where = ".".join(str(part) for part in error["loc"])
        problem = error["msg"].removeprefix("Value error, ")
        raise FormatError(f"{where}: {problem}" if where else problem) from None


def _at(path: str, key: str) -> str:
    """The path of ``key`` in the message at ``path`` (``path`` empty: ``key`` alone)."""
    return f"{path}.{key}" if path else key


def _role(value: Any, path: str) -> Role:
    if not isinstance(value, str):
        fail(path, f"is {type_name(value)}; expected one of {sorted(_ROLES)}")
    if value not in _ROLES:
        legacy = " (the legacy function role is not supported yet; use tool)"
        fail(
            path,
            f"{value!r} is unknown; expected one of {sorted(_ROLES)}"
            + (legacy if value == "function" else ""),
        )
    return _ROLES[value]


def _content(msg: dict[str, Any], path: str, role: Role) -> list[TextBlock]:
    content = msg.get("content")
    if content is None:
        if role == "assistant":
            return []  # content may be null when the assistant only calls tools
        fail(_at(path, "content"), f"is missing or null; a {role} message needs text")
    if isinstance(content, str):
        return [TextBlock(text=content)]
    if isinstance(content, list):
        return text_of_parts(content, _at(path, "content"))
    fail(
        _at(path, "content"),
        f"is {type_name(content)}; expected a string, an array of text parts or null",
    )


def _tool_call(raw: Any, path: str) -> ToolUseBlock:
    call = expect_dict(raw, path)
    kind = call.get("type", "function")
    if kind != "function":
        fail(f"{path}.type", f"is {kind!r}; only 'function' tool calls are supported yet")
    fn = expect_dict(call.get("function"), f"{path}.function")
    arguments = expect_str(fn.get("arguments", "{}"), f"{path}.function.arguments")
    try:
        args = json.loads(arguments) if arguments.strip() else {}
    except json.JSONDecodeError as exc:
        fail(f"{path}.function.arguments", f"is not valid JSON: {exc}")
    if not isinstance(args, dict):
        fail(f"{path}.function.arguments", f"is {type_name(args)}; expected a JSON object")
    return ToolUseBlock(
        id=expect_str(call.get("id"), f"{path}.id"),
        name=expect_str(fn.get("name"), f"{path}.function.name"),
        input=args,
    )


def _tool_result(msg: dict[str, Any], path: str) -> ToolResultBlock:
    content = msg.get("content")
    if isinstance(content, list):
        text = "\n".join(b.text for b in text_of_parts(content, _at(path, "content")))
    elif isinstance(content, str):
        text = content
    else:
        fail(
            _at(path, "content"),
            f"is {type_name(content)}; a tool message needs a string or an array of text parts",
        )
    return ToolResultBlock(
        tool_use_id=expect_str(msg.get("tool_call_id"), _at(path, "tool_call_id")),
        content=text,
        name=optional_str(msg.get("name"), _at(path, "name")),
    )
