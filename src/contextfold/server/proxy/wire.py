"""The proxy's view of a request body, per provider wire format.

Each ``Wire`` reads a provider request (OpenAI Chat Completions, Anthropic Messages, Gemini
``generateContent``) and edits it copy-on-write — the client's dicts are never mutated, and
whatever the proxy does not touch keeps its exact keys and order, so serialising it again gives
the same values turn after turn:

- ``strip``: remove session markers from assistant messages (returns the tokens found). A
  block left empty is removed, but a ``cache_control`` breakpoint it carried moves to the block
  before it (else after it) in the same message: every breakpoint survives;
- ``parse``: the messages as ``Message`` values, each with the raw message(s) it came from.
  Parsing is tolerant — what is known is read, the rest is carried byte for byte and named in
  ``ParsedRequest.notes`` (the request's record): blocks and parts contextfold does not model
  (images, documents, thinking, server tools, audio, …), unknown roles, malformed blocks, a
  message the library parser still refuses. A ``system`` (or ``developer``) message inside
  Anthropic ``messages`` is read as instructions. A new client feature therefore never turns
  memory off for a whole conversation;
- ``drop``: remove whole raw messages (history compacted into memory);
- ``inject``: add the memory block (the ``<context-topics>`` hint included) at the **end** of
  the request: a text block after everything in the last user message (Anthropic: after its
  ``tool_result`` blocks; Gemini: a text part after its other parts), or, when the request ends
  with tool results that cannot carry text (an OpenAI ``tool`` message, a Gemini ``function``
  turn), a new user message after them. Everything before the memory — system prompt, tools,
  history, every ``cache_control`` breakpoint — is exactly what the client sent, so provider
  prompt caches keep hitting;
- ``add_tools``: offer the memory tools next to the client's own.

The response side (reply parsing, markers, streams) lives in ``stream``.
"""

from __future__ import annotations

import itertools
import json
import re
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from typing import Any, ClassVar

from contextfold._bounded import BoundedMemo, clip, text_size
from contextfold.errors import FormatError
from contextfold.formats import (
    parse_anthropic_messages,
    parse_gemini_contents,
    parse_openai_messages,
)
from contextfold.items import Message, TextBlock, ToolUseBlock
from contextfold.server.proxy.session import find_tokens, strip_markers

__all__ = ["WIRES", "AnthropicWire", "GeminiWire", "OpenAIWire", "ParsedRequest", "Wire"]

JSON = dict[str, Any]
_SEP = "\n\n"


class ParsedRequest:
    """The messages of a request. ``sources[i]`` are the raw indices (into the body's
    ``messages`` / ``contents``; ``-1`` is a separate system field) that ``messages[i]`` came
    from; a raw message no parsed message names was not read (it is forwarded as sent).
    ``query`` is the index in ``messages`` of the last user message with text; ``notes``
    says what the parse left unread."""

    __slots__ = ("messages", "notes", "query", "sources")

    def __init__(
        self,
        messages: list[Message],
        sources: list[tuple[int, ...]],
        notes: Sequence[str] = (),
    ) -> None:
        self.messages = messages
        self.sources = sources
        self.notes = list(notes)
        self.query: int | None = None
        for i in range(len(messages) - 1, -1, -1):
            m = messages[i]
            if m.role == "user" and any(
                isinstance(b, TextBlock) and b.text.strip() for b in m.content
            ):
                self.query = i
                break

    @property
    def query_text(self) -> str:
        if self.query is None:
            return ""
        return "\n".join(
            b.text for b in self.messages[self.query].content if isinstance(b, TextBlock)
        )


# Memos shared by requests: a chat client resends its whole history every turn, so the same
# message texts come back again and again. Bounded by entries and by the bytes of the texts
# they hold (a client's distinct 4 MB messages must not pile up).
_STRIPPED: BoundedMemo[str, tuple[str, tuple[str, ...]]] = BoundedMemo(
    entries=20_000, max_bytes=8 * 1024 * 1024
)
_MESSAGES: BoundedMemo[tuple[str, str], Message] = BoundedMemo(
    entries=20_000, max_bytes=16 * 1024 * 1024
)
#: What a memo entry costs beside its text (the tuple, the ``Message`` and its block).
_ENTRY = 600


def _edit_text(text: str, tokens: list[str]) -> str:
    if "contextfold:session=" not in text:
        return text
    stripped, found = _STRIPPED.get(
        text,
        lambda: (strip_markers(text), tuple(find_tokens(text))),
        size=2 * text_size(text) + _ENTRY,
    )
    tokens.extend(found)
    return stripped


def _strip_blocks(
    blocks: list[Any], text_of: Callable[[Any], str | None], tokens: list[str]
) -> list[Any] | None:
    """``blocks`` without markers (None: none found). A block that held only a marker is
    removed; a ``cache_control`` breakpoint on it moves to the block before it, else to the
    block after it (when that block has none of its own), so the request keeps every
    breakpoint. Where neither can take it, the block stays where it was (marker and all): the
    breakpoint wins."""
    out: list[Any] = []
    pending: tuple[Any, Any] | None = None  # (a breakpoint, its block) for the next block
    found = False
    for block in blocks:
        text = text_of(block)
        edited = _edit_text(text, tokens) if text is not None else None
        if edited is not None and edited != text:
            found = True
            if edited:
                block = {**block, "text": edited}
            else:  # the block held only a marker
                breakpoint_ = block.get("cache_control")
                if breakpoint_ is None:
                    continue
                if pending is not None:  # this block has its own: the pending one stays
                    out.append(pending[1])
                    pending = None
                if out and isinstance(out[-1], dict) and "cache_control" not in out[-1]:
                    out[-1] = {**out[-1], "cache_control": breakpoint_}
                else:
                    pending = (breakpoint_, block)
                continue
        if pending is not None:
            if isinstance(block, dict) and "cache_control" not in block:
                block = {**block, "cache_control": pending[0]}
            else:  # the next block has its own breakpoint: the marker block stays
                out.append(pending[1])
            pending = None
        out.append(block)
    if pending is not None:
        out.append(pending[1])
    return out if found else None


def _simple(role: Any, text: str) -> Message:
    """A plain text message, built once per (role, text)."""
    return _MESSAGES.get(
        (role, text), lambda: Message(role=role, content=text), size=text_size(text) + _ENTRY
    )


class _Unread:
    """What a parse left out of the messages (it stays in the forwarded body), for the
    request's notes: kinds counted, and the first few problems."""

    __slots__ = ("kinds", "problems")

    def __init__(self) -> None:
        self.kinds: dict[str, int] = {}
        self.problems: list[str] = []

    def add(self, kind: str) -> None:
        self.kinds[kind] = self.kinds.get(kind, 0) + 1

    def problem(self, text: str) -> None:
        if len(self.problems) < 3:
            self.problems.append(clip(text, 160))

    def notes(self) -> list[str]:
        notes = []
        if self.kinds:
            kinds = sorted(self.kinds.items())
            listed = ", ".join(f"{k} ×{n}" if n > 1 else k for k, n in kinds[:8])
            more = f" and {len(kinds) - 8} more kinds" if len(kinds) > 8 else ""
            notes.append(f"not read, forwarded as sent: {listed}{more}")
        notes += [f"not read, forwarded as sent: {p}" for p in self.problems]
        return notes


def _label(kind: Any) -> str:
    return repr(clip(kind, 40)) if isinstance(kind, str) else "untyped"


_PATH = re.compile(r"^(?:messages|contents)\[(\d+)\]")


def _parse_dropping(
    parse: Callable[[list[Any]], list[Message]],
    clean: list[Any],
    indices: list[int],
    key: str,
    unread: _Unread,
) -> list[Message]:
    """``parse(clean)``; when it refuses a message (``FormatError`` naming
    ``messages[k]``/``contents[k]``), that message is left out and noted, and the rest is
    parsed again. ``clean`` and ``indices`` (the raw index of each) shrink in place."""
    while True:
        try:
            return parse(clean)
        except FormatError as exc:
            match = _PATH.match(str(exc))
            if match is None or int(match.group(1)) >= len(clean):
                raise
            k = int(match.group(1))
            unread.problem(f"{key}[{indices[k]}]{str(exc)[match.end() :]}")
            del clean[k], indices[k]


def _with_simple(
    raw: list[Any],
    simple: Callable[[Any], Message | None],
    parse_run: Callable[[list[Any], int, _Unread], tuple[list[Message], list[tuple[int, ...]]]],
    head: Sequence[Message] = (),
    unread: _Unread | None = None,
) -> ParsedRequest:
    """Parse ``raw`` after the messages ``head`` (from a separate system field): plain text
    messages through the memo, runs of the others with ``parse_run(run, first_index,
    unread)``."""
    unread = unread or _Unread()
    messages: list[Message] = list(head)
    sources: list[tuple[int, ...]] = [(-1,)] * len(head)
    run: list[Any] = []
    start = 0
    for i, msg in enumerate(raw):
        message = simple(msg)
        if message is None:
            if not run:
                start = i
            run.append(msg)
            continue
        if run:
            parsed, mapped = parse_run(run, start, unread)
            messages += parsed
            sources += mapped
            run = []
        messages.append(message)
        sources.append((i,))
    if run:
        parsed, mapped = parse_run(run, start, unread)
        messages += parsed
        sources += mapped
    return ParsedRequest(messages, sources, unread.notes())


class Wire(ABC):
    """What the proxy does with one provider format's request bodies."""

    name: ClassVar[str]
    key: ClassVar[str]  # "messages" or "contents"
    assistant_role: ClassVar[str] = "assistant"

    def items(self, body: JSON) -> list[Any]:
        value = body.get(self.key)
        if not isinstance(value, list):
            raise FormatError(f"{self.key} is missing or not an array")
        return value

    def is_stream(self, body: JSON, path: str) -> bool:
        return body.get("stream") is True

    def model(self, body: JSON, path: str) -> str | None:
        """The body's ``model``, else an Azure deployment's name from the path."""
        value = body.get("model")
        if isinstance(value, str):
            return value
        _, found, rest = path.partition("/deployments/")
        return rest.split("/", 1)[0] or None if found else None

    # -- markers ---------------------------------------------------------------------------------

    def strip(self, body: JSON) -> tuple[JSON, list[str]]:
        """``body`` without session markers in assistant messages, and the tokens found (the
        latest message's first)."""
        tokens: list[str] = []
        items = self.items(body)
        out: list[Any] | None = None
        for i in range(len(items) - 1, -1, -1):
            msg = items[i]
            if not isinstance(msg, dict) or msg.get("role") != self.assistant_role:
                continue
            found: list[str] = []
            edited = self._strip_message(msg, found)
            if found:
                tokens.extend(found)
                if out is None:
                    out = list(items)
                out[i] = edited
        return ({**body, self.key: out} if out is not None else body), tokens

    @abstractmethod
    def _strip_message(self, msg: JSON, tokens: list[str]) -> JSON: ...

    # -- parsing ---------------------------------------------------------------------------------

    @abstractmethod
    def parse(self, body: JSON) -> ParsedRequest: ...

    # -- edits -----------------------------------------------------------------------------------

    def drop(self, body: JSON, indices: set[int]) -> JSON:
        """``body`` without the raw messages at ``indices``."""
        if not indices:
            return body
        items = self.items(body)
        return {**body, self.key: [m for i, m in enumerate(items) if i not in indices]}

    def raw_role(self, body: JSON, index: int) -> str:
        msg = self.items(body)[index]
        role = msg.get("role", "user") if isinstance(msg, dict) else "user"
        return str(role)

    def inject(self, body: JSON, text: str) -> JSON:
        """``body`` with ``text`` (the memory block) at its end, after the last breakpoint:
        appended to the last user message, or in a new user message after trailing tool
        results (``_append``). ``body`` itself when there is no place (no user message)."""
        if not text:
            return body
        items = self._append(list(self.items(body)), text)
        return {**body, self.key: items} if items is not None else body

    @abstractmethod
    def _append(self, items: list[Any], text: str) -> list[Any] | None: ...

    def add_tools(self, body: JSON, definitions: list[JSON]) -> JSON:
        tools = body.get("tools")
        existing = list(tools) if isinstance(tools, list) else []
        names = {self._tool_name(t) for t in existing}
        extra = [d for d in definitions if self._tool_name(d) not in names]
        return {**body, "tools": existing + extra} if extra else body

    @staticmethod
    def _tool_name(tool: Any) -> str | None:
        if not isinstance(tool, dict):
            return None
        fn = tool.get("function")
        name = fn.get("name") if isinstance(fn, dict) else tool.get("name")
        return name if isinstance(name, str) else None


def _append_last(
    items: list[Any],
    user: Callable[[Any], bool],
    tool: Callable[[Any], bool],
    into: Callable[[JSON, str], JSON | None],
    after: Callable[[str], JSON],
    text: str,
) -> list[Any] | None:
    """Walking back from the end: the first user message gets ``text`` appended (``into``);
    a tool-result message that cannot carry text gets a new user message after it
    (``after``). None when neither is found."""
    for i in range(len(items) - 1, -1, -1):
        msg = items[i]
        if not isinstance(msg, dict):
            continue
        if tool(msg):
            return [*items[: i + 1], after(text), *items[i + 1 :]]
        if user(msg):
            edited = into(msg, text)
            if edited is None:
                return None
            return [*items[:i], edited, *items[i + 1 :]]
    return None


def _runs(flags: Sequence[bool]) -> int:
    """How many messages ``split_tool_results`` makes of blocks whose result-ness is
    ``flags``."""
    if not flags:
        return 1
    return 1 + sum(1 for a, b in itertools.pairwise(flags) if a != b)


def _check(parsed: list[Message], sources: list[tuple[int, ...]], where: str) -> None:
    if len(parsed) != len(sources):  # a parser change this module does not know about
        raise FormatError(
            f"{where}: {len(parsed)} parsed messages but {len(sources)} mapped; not proxied"
        )


def _text_part(part: Any) -> bool:
    """An OpenAI text part or Anthropic text block the parsers read."""
    return (
        isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str)
    )


def _text_parts(parts: list[Any], what: str, unread: _Unread) -> list[Any]:
    """The text parts of ``parts``; the others are counted as unread (``what``: block or
    part)."""
    kept = []
    for part in parts:
        if _text_part(part):
            kept.append(part)
        else:
            unread.add(f"{_label(part.get('type') if isinstance(part, dict) else None)} {what}")
    return kept


def _is_json_object(arguments: Any) -> bool:
    if arguments is None:
        return True
    if not isinstance(arguments, str):
        return False
    if not arguments.strip():
        return True
    try:
        return isinstance(json.loads(arguments), dict)
    except (json.JSONDecodeError, RecursionError):
        return False


# --------------------------------------------------------------------------- OpenAI


_OPENAI_ROLES = {
    "system": "system",
    "developer": "system",
    "user": "user",
    "assistant": "assistant",
}


def _openai_simple(msg: Any) -> Message | None:
    if isinstance(msg, dict) and len(msg) == 2:
        content, role = msg.get("content"), _OPENAI_ROLES.get(msg.get("role"))  # type: ignore[arg-type]
        if role is not None and isinstance(content, str):
            return _simple(role, content)
    return None


def _openai_call(call: Any) -> bool:
    if not isinstance(call, dict) or call.get("type", "function") != "function":
        return False
    fn = call.get("function")
    return (
        isinstance(call.get("id"), str)
        and isinstance(fn, dict)
        and isinstance(fn.get("name"), str)
        and _is_json_object(fn.get("arguments"))
    )


def _openai_clean(msg: Any, unread: _Unread) -> JSON | None:
    """A copy of ``msg`` holding only what the parser reads, in the shapes it accepts; None
    when there is nothing to read (an unknown role, a tool message without its call id)."""
    if not isinstance(msg, dict):
        unread.add("message that is not an object")
        return None
    role = msg.get("role")
    if role not in ("system", "developer", "user", "assistant", "tool"):
        unread.add(f"role {_label(role)}")  # the legacy "function" role included
        return None
    clean: JSON = {"role": role}
    content = msg.get("content")
    if isinstance(content, list):
        content = _text_parts(content, "part", unread)
    elif content is None:
        content = None if role == "assistant" else ""
    elif not isinstance(content, str):
        unread.add(f"content that is {type(content).__name__}")
        content = ""
    clean["content"] = content
    if isinstance(msg.get("name"), str):
        clean["name"] = msg["name"]
    if role == "tool":
        if not isinstance(msg.get("tool_call_id"), str):
            unread.add("tool message without a tool_call_id")
            return None
        clean["tool_call_id"] = msg["tool_call_id"]
    if msg.get("function_call") is not None:
        unread.add("legacy function_call")
    calls = msg.get("tool_calls")
    if isinstance(calls, list) and role == "assistant":
        kept = [c for c in calls if _openai_call(c)]
        for c in calls:
            if not _openai_call(c):
                kind = c.get("type", "function") if isinstance(c, dict) else None
                unread.add(f"{_label(kind)} tool call")
        if kept:
            clean["tool_calls"] = kept
    elif calls is not None:
        unread.add(f"tool_calls in a {_label(role)} message")
    return clean


def _openai_run(
    raw: list[Any], offset: int, unread: _Unread
) -> tuple[list[Message], list[tuple[int, ...]]]:
    clean: list[Any] = []
    indices: list[int] = []
    for i, msg in enumerate(raw):
        cleaned = _openai_clean(msg, unread)
        if cleaned is not None:
            clean.append(cleaned)
            indices.append(offset + i)
    parsed = _parse_dropping(parse_openai_messages, clean, indices, "messages", unread)
    sources: list[tuple[int, ...]] = []
    for k, msg in enumerate(clean):  # consecutive tool messages parse as one
        if msg["role"] == "tool" and k > 0 and clean[k - 1]["role"] == "tool":
            sources[-1] = (*sources[-1], indices[k])
        else:
            sources.append((indices[k],))
    _check(parsed, sources, "messages")
    return parsed, sources


def _openai_text(part: Any) -> str | None:
    return part["text"] if _text_part(part) else None


class OpenAIWire(Wire):
    name: ClassVar[str] = "openai"
    key: ClassVar[str] = "messages"

    def _strip_message(self, msg: JSON, tokens: list[str]) -> JSON:
        content = msg.get("content")
        if isinstance(content, str):
            text = _edit_text(content, tokens)
            return {**msg, "content": text} if text != content else msg
        if isinstance(content, list):
            parts = _strip_blocks(content, _openai_text, tokens)
            return {**msg, "content": parts} if parts is not None else msg
        return msg

    def parse(self, body: JSON) -> ParsedRequest:
        return _with_simple(self.items(body), _openai_simple, _openai_run)

    def _append(self, items: list[Any], text: str) -> list[Any] | None:
        def into(msg: JSON, text: str) -> JSON | None:
            content = msg.get("content")
            if isinstance(content, str):
                return {**msg, "content": content + _SEP + text}
            if isinstance(content, list):
                return {**msg, "content": [*content, {"type": "text", "text": text}]}
            return None

        return _append_last(
            items,
            lambda m: m.get("role") == "user",
            lambda m: m.get("role") in ("tool", "function"),
            into,
            lambda text: {"role": "user", "content": text},
            text,
        )


# --------------------------------------------------------------------------- Anthropic


def _anthropic_simple(msg: Any) -> Message | None:
    if not (isinstance(msg, dict) and len(msg) == 2):
        return None
    role, content = msg.get("role"), msg.get("content")
    if role not in ("user", "assistant"):
        return None
    if isinstance(content, str):
        return _simple(role, content)
    if (
        isinstance(content, list)
        and len(content) == 1
        and isinstance(block := content[0], dict)
        and block.get("type") == "text"
        and isinstance(block.get("text"), str)
        and set(block) <= {"type", "text", "citations"}
        and not block.get("citations")
        and not _client_context(block["text"])
    ):
        return _simple(role, block["text"])
    return None


def _client_context(text: str) -> bool:
    """A text block the client adds to the user's turn as context of its own (Claude Code's
    ``<system-reminder>`` blocks: CLAUDE.md, the environment, todo lists), re-sent with every
    request: not part of what the user said, so neither stored, nor the query, nor compared
    when a later request is recognised."""
    return text.lstrip().startswith("<system-reminder>")


def _anthropic_clean_block(block: Any, role: str, unread: _Unread) -> Any:
    """``block`` as the parser reads it (a tool result's content cut to its text blocks), or
    None when it is not read: another type (image, document, thinking, redacted_thinking,
    server tools, …), or a known type in the wrong place or shape."""
    kind = block.get("type") if isinstance(block, dict) else None
    if kind == "text" and isinstance(block.get("text"), str):
        if _client_context(block["text"]):
            unread.add("system-reminder text block")
            return None
        return block
    if (
        kind == "tool_use"
        and role == "assistant"
        and isinstance(block.get("id"), str)
        and isinstance(block.get("name"), str)
        and isinstance(block.get("input", {}), dict)
    ):
        return block
    if (
        kind == "tool_result"
        and role == "user"
        and isinstance(block.get("tool_use_id"), str)
        and isinstance(block.get("is_error", False), (bool, type(None)))
    ):
        content = block.get("content", "")
        if isinstance(content, list):
            kept = _text_parts(content, "block in a tool_result", unread)
            return {**block, "content": kept} if len(kept) != len(content) else block
        if content is None:
            return {**block, "content": ""}
        if isinstance(content, str):
            return block
    unread.add(f"{_label(kind)} block")
    return None


def _anthropic_system(content: Any, unread: _Unread) -> Message | None:
    """A system text (a string, or text blocks) as a system message (None: no text)."""
    if isinstance(content, str):
        return Message(role="system", content=content) if content else None
    if isinstance(content, list):
        texts = [TextBlock(text=b["text"]) for b in _text_parts(content, "block", unread)]
        return Message(role="system", content=tuple(texts)) if texts else None
    if content is not None:
        unread.add(f"system that is {type(content).__name__}")
    return None


def _anthropic_run(
    raw: list[Any], offset: int, unread: _Unread
) -> tuple[list[Message], list[tuple[int, ...]]]:
    """Each message on its own (Anthropic messages share no state): a ``system`` or
    ``developer`` message inside ``messages`` is read as instructions, another unknown role
    is not read, and neither is a block the parser would refuse."""
    messages: list[Message] = []
    sources: list[tuple[int, ...]] = []
    for i, msg in enumerate(raw):
        index = offset + i
        if not isinstance(msg, dict):
            unread.add("message that is not an object")
            continue
        role, content = msg.get("role"), msg.get("content")
        if role in ("system", "developer"):
            system = _anthropic_system(content, unread)
            if system is not None:
                messages.append(system)
                sources.append((index,))
            continue
        if role not in ("user", "assistant"):
            unread.add(f"role {_label(role)}")
            continue
        if isinstance(content, list):
            blocks = [b for b in (_anthropic_clean_block(b, role, unread) for b in content) if b]
            content = blocks
            count = _runs([b["type"] == "tool_result" for b in blocks])
        elif isinstance(content, str):
            count = 1
        else:
            unread.add(f"content that is {type(content).__name__}")
            content, count = [], 1
        try:
            parsed = parse_anthropic_messages([{"role": role, "content": content}])
        except FormatError as exc:  # a shape this module does not know about
            unread.problem(f"messages[{index}]{str(exc).removeprefix('messages[0]')}")
            continue
        if len(parsed) != count:
            raise FormatError(f"messages[{index}]: {len(parsed)} parsed but {count} mapped")
        messages += parsed
        sources += [(index,)] * count
    return messages, sources


def _anthropic_text(block: Any) -> str | None:
    if isinstance(block, dict) and block.get("type") == "text":
        text = block.get("text", "")
        return text if isinstance(text, str) else None
    return None


class AnthropicWire(Wire):
    name: ClassVar[str] = "anthropic"
    key: ClassVar[str] = "messages"

    def _strip_message(self, msg: JSON, tokens: list[str]) -> JSON:
        content = msg.get("content")
        if isinstance(content, str):
            text = _edit_text(content, tokens)
            return {**msg, "content": text} if text != content else msg
        if not isinstance(content, list):
            return msg
        blocks = _strip_blocks(content, _anthropic_text, tokens)
        return {**msg, "content": blocks} if blocks is not None else msg

    def parse(self, body: JSON) -> ParsedRequest:
        unread = _Unread()
        system = _anthropic_system(body.get("system"), unread)
        head = [system] if system is not None else []
        return _with_simple(self.items(body), _anthropic_simple, _anthropic_run, head, unread)

    def _append(self, items: list[Any], text: str) -> list[Any] | None:
        def into(msg: JSON, text: str) -> JSON | None:
            content = msg.get("content")
            if isinstance(content, str):
                return {**msg, "content": content + _SEP + text}
            if isinstance(content, list):  # after the tool_result blocks and everything else
                return {**msg, "content": [*content, {"type": "text", "text": text}]}
            return None

        return _append_last(
            items,
            lambda m: m.get("role") == "user",
            lambda m: False,  # a user message holds the tool results, and takes text too
            into,
            lambda text: {"role": "user", "content": text},
            text,
        )


# --------------------------------------------------------------------------- Gemini

_GEMINI_KEYS = frozenset(
    {"text", "functionCall", "function_call", "functionResponse", "function_response"}
)
_CALL_KEYS = frozenset({"functionCall", "function_call"})
_RESPONSE_KEYS = frozenset({"functionResponse", "function_response"})
_GEMINI_ROLES = {"user": "user", "model": "assistant", "function": "tool"}


def _gemini_part(part: Any, role: str, unread: _Unread) -> bool:
    """Whether the parser reads ``part`` in a turn of ``role`` (``user``, ``model`` or
    ``function``); the others (inlineData, fileData, executableCode, thoughts, …) are counted
    as unread."""
    if not isinstance(part, dict):
        unread.add("part that is not an object")
        return False
    keys = _GEMINI_KEYS & part.keys()
    if part.get("thought") is True:
        unread.add("thought part")
        return False
    if len(keys) != 1:
        others = sorted(k for k in part if k not in _GEMINI_KEYS)
        unread.add(f"{_label(others[0] if others and not keys else 'mixed')} part")
        return False
    (key,) = keys
    value = part[key]
    if key == "text":
        ok = isinstance(value, str) and role != "function"
    elif key in _CALL_KEYS:
        ok = (
            role == "model"
            and isinstance(value, dict)
            and isinstance(value.get("name"), str)
            and isinstance(value.get("args", {}), dict)
            and isinstance(value.get("id", ""), str)
        )
    else:
        ok = (
            role != "model"
            and isinstance(value, dict)
            and isinstance(value.get("name"), str)
            and isinstance(value.get("response"), dict)
            and isinstance(value.get("id", ""), str)
        )
    if not ok:
        unread.add(f"{_label(key)} part in a {role} turn")
    return ok


class GeminiWire(Wire):
    name: ClassVar[str] = "gemini"
    key: ClassVar[str] = "contents"
    assistant_role: ClassVar[str] = "model"

    def is_stream(self, body: JSON, path: str) -> bool:
        return path.endswith(":streamGenerateContent")

    def model(self, body: JSON, path: str) -> str | None:
        name = path.rsplit("/", 1)[-1].split(":", 1)[0]
        return name or None

    def _system_key(self, body: JSON) -> str:
        return "system_instruction" if "system_instruction" in body else "systemInstruction"

    def _strip_message(self, msg: JSON, tokens: list[str]) -> JSON:
        parts = msg.get("parts")
        if not isinstance(parts, list):
            return msg
        out = _strip_blocks(
            parts,
            lambda p: p["text"] if isinstance(p, dict) and isinstance(p.get("text"), str) else None,
            tokens,
        )
        return {**msg, "parts": out} if out is not None else msg

    def parse(self, body: JSON) -> ParsedRequest:
        unread = _Unread()
        system = body.get(self._system_key(body))
        instruction: JSON | None = None
        if isinstance(system, dict) and isinstance(system.get("parts"), list):
            texts = [
                p for p in system["parts"] if isinstance(p, dict) and isinstance(p.get("text"), str)
            ]
            if len(texts) != len(system["parts"]):
                unread.add("non-text part in systemInstruction")
            instruction = {"parts": [{"text": p["text"]} for p in texts]}
        elif system is not None:
            unread.add("systemInstruction that is not an object with parts")
        clean: list[Any] = []
        indices: list[int] = []
        for i, turn in enumerate(self.items(body)):
            if not isinstance(turn, dict):
                unread.add("content that is not an object")
                continue
            role = turn.get("role", "user")
            if role not in _GEMINI_ROLES:
                unread.add(f"role {_label(role)}")
                continue
            parts = turn.get("parts")
            if not isinstance(parts, list):
                unread.add("content without parts")
                continue
            kept = [p for p in parts if _gemini_part(p, role, unread)]
            clean.append({"role": role, "parts": kept})
            indices.append(i)

        def parse(contents: list[Any]) -> list[Message]:
            return parse_gemini_contents(contents, instruction)

        parsed = _parse_dropping(parse, clean, indices, "contents", unread)
        sources: list[tuple[int, ...]] = []
        for turn, index in zip(clean, indices, strict=True):
            parts = turn["parts"]
            if turn["role"] == "function":
                count = 1
            else:
                count = _runs([bool(_RESPONSE_KEYS & p.keys()) for p in parts])
            sources += [(index,)] * count
        if parsed and parsed[0].role == "system" and len(parsed) == len(sources) + 1:
            sources.insert(0, (-1,))
        _check(parsed, sources, "contents")
        return ParsedRequest(parsed, sources, unread.notes())

    def _append(self, items: list[Any], text: str) -> list[Any] | None:
        def into(msg: JSON, text: str) -> JSON | None:
            parts = msg.get("parts")
            if not isinstance(parts, list):
                return None
            return {**msg, "parts": [*parts, {"text": text}]}

        return _append_last(
            items,
            lambda m: m.get("role", "user") == "user",
            lambda m: m.get("role") == "function",
            into,
            lambda text: {"role": "user", "parts": [{"text": text}]},
            text,
        )

    def add_tools(self, body: JSON, definitions: list[JSON]) -> JSON:
        tools = body.get("tools")
        existing = list(tools) if isinstance(tools, list) else []
        names = {
            d.get("name")
            for t in existing
            if isinstance(t, dict)
            for d in (t.get("functionDeclarations") or t.get("function_declarations") or [])
            if isinstance(d, dict)
        }
        extra = [d for d in definitions if d["name"] not in names]
        if not extra:
            return body
        return {**body, "tools": [*existing, {"functionDeclarations": extra}]}


WIRES: dict[str, Wire] = {w.name: w for w in (OpenAIWire(), AnthropicWire(), GeminiWire())}


def reply_message(text: str, calls: Sequence[ToolUseBlock]) -> Message:
    """The assistant message of a reply (text first, then tool calls)."""
    blocks: list[TextBlock | ToolUseBlock] = [TextBlock(text=text)] if text or not calls else []
    blocks.extend(calls)
    return Message(role="assistant", content=tuple(blocks))


def dumps(body: JSON) -> bytes:
    """Compact JSON in the body's own key order: the same body gives the same bytes."""
    return json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
