"""The proxy's view of a request body, per provider wire format.

Each ``Wire`` reads a provider request (OpenAI Chat Completions, Anthropic Messages, Gemini
``generateContent``) and edits it copy-on-write — the client's dicts are never mutated, and
whatever the proxy does not touch keeps its exact keys and order, so serialising it again gives
the same bytes turn after turn:

- ``strip``: remove session markers from assistant messages (returns the tokens found);
- ``parse``: the messages as ``Message`` values, each with the raw message(s) it came from.
  Blocks contextfold does not model (images, documents, thinking) are left out of the parse
  but stay in the body that is forwarded;
- ``drop``: remove whole raw messages (history compacted into memory);
- ``inject``: add the memory block — the slow-changing ``<context-topics>`` hint after the
  client's system prompt (its text kept byte for byte, the hint appended after it) and the
  dynamic recalled memory at the start of the last user message — so the stable prefix
  (system prompt, history) is byte-identical from one turn to the next;
- ``add_tools``: offer the memory tools next to the client's own.

The response side (reply parsing, markers, streams) lives in ``stream``.
"""

from __future__ import annotations

import itertools
import json
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from typing import Any, ClassVar

from contextfold._bounded import BoundedMemo, text_size
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
    from; ``query`` is the index in ``messages`` of the last user message with text."""

    __slots__ = ("messages", "query", "sources")

    def __init__(self, messages: list[Message], sources: list[tuple[int, ...]]) -> None:
        self.messages = messages
        self.sources = sources
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


def _simple(role: Any, text: str) -> Message:
    """A plain text message, built once per (role, text)."""
    return _MESSAGES.get(
        (role, text), lambda: Message(role=role, content=text), size=text_size(text) + _ENTRY
    )


def _with_simple(
    raw: list[Any],
    simple: Callable[[Any], Message | None],
    parse_run: Callable[[list[Any], int], tuple[list[Message], list[tuple[int, ...]]]],
) -> ParsedRequest:
    """Parse ``raw``: plain text messages through the memo, runs of the others with
    ``parse_run(run, first_index)``."""
    messages: list[Message] = []
    sources: list[tuple[int, ...]] = []
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
            parsed, mapped = parse_run(run, start)
            messages += parsed
            sources += mapped
            run = []
        messages.append(message)
        sources.append((i,))
    if run:
        parsed, mapped = parse_run(run, start)
        messages += parsed
        sources += mapped
    return ParsedRequest(messages, sources)


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
        value = body.get("model")
        return value if isinstance(value, str) else None

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

    def inject(self, body: JSON, hint: str, dynamic: str, query_raw: int) -> JSON:
        """Add ``hint`` after the system prompt and ``dynamic`` at the start of the raw message
        ``query_raw`` (the last user message)."""
        out = body
        if dynamic:
            items = list(self.items(out))
            items[query_raw] = self._prepend(items[query_raw], dynamic)
            out = {**out, self.key: items}
        if hint:
            out = self._add_system(out, hint)
        return out

    @abstractmethod
    def _prepend(self, msg: JSON, text: str) -> JSON: ...

    @abstractmethod
    def _add_system(self, body: JSON, text: str) -> JSON: ...

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


def _sources(counts: Sequence[int]) -> list[tuple[int, ...]]:
    return [(i,) for i, n in enumerate(counts) for _ in range(n)]


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


def _keep_blocks(blocks: list[Any], keep: Callable[[Any], bool]) -> list[Any] | None:
    """``blocks`` without the unmodelled ones; None when all are kept (no copy needed)."""
    if all(keep(b) for b in blocks):
        return None
    return [b for b in blocks if keep(b)]


# --------------------------------------------------------------------------- OpenAI


def _openai_part(part: Any) -> bool:
    return isinstance(part, dict) and part.get("type") == "text"


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


def _openai_run(raw: list[Any], offset: int) -> tuple[list[Message], list[tuple[int, ...]]]:
    clean: list[Any] = []
    for msg in raw:
        content = msg.get("content") if isinstance(msg, dict) else None
        if isinstance(content, list):
            kept = _keep_blocks(content, _openai_part)
            if kept is not None:
                msg = {**msg, "content": kept}
        clean.append(msg)
    parsed = parse_openai_messages(clean)
    sources: list[tuple[int, ...]] = []
    for i, msg in enumerate(raw):
        tool = isinstance(msg, dict) and msg.get("role") == "tool"
        prev_tool = i > 0 and isinstance(raw[i - 1], dict) and raw[i - 1].get("role") == "tool"
        if tool and prev_tool:
            sources[-1] = (*sources[-1], offset + i)
        else:
            sources.append((offset + i,))
    _check(parsed, sources, "messages")
    return parsed, sources


class OpenAIWire(Wire):
    name: ClassVar[str] = "openai"
    key: ClassVar[str] = "messages"

    def _strip_message(self, msg: JSON, tokens: list[str]) -> JSON:
        content = msg.get("content")
        if isinstance(content, str):
            text = _edit_text(content, tokens)
            return {**msg, "content": text} if text != content else msg
        if isinstance(content, list):
            parts = []
            for part in content:
                if _openai_part(part) and isinstance(part.get("text"), str):
                    text = _edit_text(part["text"], tokens)
                    if text != part["text"]:
                        if not text:
                            continue
                        part = {**part, "text": text}
                parts.append(part)
            return {**msg, "content": parts} if tokens else msg
        return msg

    def parse(self, body: JSON) -> ParsedRequest:
        return _with_simple(self.items(body), _openai_simple, _openai_run)

    def _prepend(self, msg: JSON, text: str) -> JSON:
        content = msg.get("content")
        if isinstance(content, str):
            return {**msg, "content": text + _SEP + content}
        if isinstance(content, list):
            return {**msg, "content": [{"type": "text", "text": text}, *content]}
        return msg

    def _add_system(self, body: JSON, text: str) -> JSON:
        items = list(self.items(body))
        lead = 0
        while (
            lead < len(items)
            and isinstance(items[lead], dict)
            and items[lead].get("role") in ("system", "developer")
        ):
            lead += 1
        if lead:
            last = items[lead - 1]
            content = last.get("content")
            if isinstance(content, str):
                items[lead - 1] = {**last, "content": content + _SEP + text}
                return {**body, self.key: items}
            if isinstance(content, list):
                items[lead - 1] = {**last, "content": [*content, {"type": "text", "text": text}]}
                return {**body, self.key: items}
        items.insert(lead, {"role": "system", "content": text})
        return {**body, self.key: items}


# --------------------------------------------------------------------------- Anthropic

_ANTHROPIC_BLOCKS = frozenset({"text", "tool_use", "tool_result"})


def _anthropic_block(block: Any) -> bool:
    return isinstance(block, dict) and block.get("type") in _ANTHROPIC_BLOCKS


def _clean_anthropic_block(block: JSON) -> JSON:
    content = block.get("content")
    if block.get("type") == "tool_result" and isinstance(content, list):
        kept = _keep_blocks(content, _openai_part)  # text blocks only
        if kept is not None:
            return {**block, "content": kept}
    return block


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
    ):
        return _simple(role, block["text"])
    return None


def _anthropic_run(raw: list[Any], offset: int) -> tuple[list[Message], list[tuple[int, ...]]]:
    clean: list[Any] = []
    counts: list[int] = []
    for msg in raw:
        content = msg.get("content") if isinstance(msg, dict) else None
        if isinstance(content, list):
            blocks = [_clean_anthropic_block(b) for b in content if _anthropic_block(b)]
            msg = {**msg, "content": blocks}
            counts.append(_runs([b.get("type") == "tool_result" for b in blocks]))
        else:
            counts.append(1)
        clean.append(msg)
    parsed = parse_anthropic_messages(clean)
    sources: list[tuple[int, ...]] = [(offset + i,) for i, n in enumerate(counts) for _ in range(n)]
    _check(parsed, sources, "messages")
    return parsed, sources


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
        blocks = []
        for block in content:
            if isinstance(block, dict) and block.get("type") == "text":
                text = _edit_text(str(block.get("text", "")), tokens)
                if text != block.get("text"):
                    if not text:  # a block that held only the marker
                        continue
                    block = {**block, "text": text}
            blocks.append(block)
        return {**msg, "content": blocks} if tokens else msg

    def parse(self, body: JSON) -> ParsedRequest:
        system = body.get("system")
        if isinstance(system, list):
            kept = _keep_blocks(system, _openai_part)
            system = kept if kept is not None else system
        head = parse_anthropic_messages([], system)
        parsed = _with_simple(self.items(body), _anthropic_simple, _anthropic_run)
        return ParsedRequest([*head, *parsed.messages], [(-1,)] * len(head) + parsed.sources)

    def _prepend(self, msg: JSON, text: str) -> JSON:
        content = msg.get("content")
        block = {"type": "text", "text": text}
        if isinstance(content, str):
            return {**msg, "content": [block, {"type": "text", "text": content}]}
        if isinstance(content, list):
            # Tool results must lead a user message: the memory goes after them.
            at = 0
            while (
                at < len(content)
                and isinstance(content[at], dict)
                and content[at].get("type") == "tool_result"
            ):
                at += 1
            return {**msg, "content": [*content[:at], block, *content[at:]]}
        return msg

    def _add_system(self, body: JSON, text: str) -> JSON:
        system = body.get("system")
        if isinstance(system, str) and system:
            return {**body, "system": system + _SEP + text}
        if isinstance(system, list) and system:
            return {**body, "system": [*system, {"type": "text", "text": text}]}
        return {**body, "system": text}


# --------------------------------------------------------------------------- Gemini

_GEMINI_KEYS = frozenset(
    {"text", "functionCall", "function_call", "functionResponse", "function_response"}
)
_RESPONSE_KEYS = frozenset({"functionResponse", "function_response"})


def _gemini_part(part: Any) -> bool:
    return (
        isinstance(part, dict)
        and part.get("thought") is not True
        and bool(_GEMINI_KEYS & part.keys())
    )


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
        out = []
        for part in parts:
            if isinstance(part, dict) and isinstance(part.get("text"), str):
                text = _edit_text(part["text"], tokens)
                if text != part["text"]:
                    if not text:
                        continue
                    part = {**part, "text": text}
            out.append(part)
        return {**msg, "parts": out} if tokens else msg

    def parse(self, body: JSON) -> ParsedRequest:
        raw = self.items(body)
        system = body.get(self._system_key(body))
        if isinstance(system, dict) and isinstance(system.get("parts"), list):
            kept = _keep_blocks(system["parts"], lambda p: isinstance(p, dict) and "text" in p)
            if kept is not None:
                system = {**system, "parts": kept}
        clean: list[Any] = []
        counts: list[int] = []
        for turn in raw:
            parts = turn.get("parts") if isinstance(turn, dict) else None
            if isinstance(parts, list):
                kept = _keep_blocks(parts, _gemini_part)
                if kept is not None:
                    turn = {**turn, "parts": kept}
                    parts = kept
                if turn.get("role") == "function":
                    counts.append(1)
                else:
                    counts.append(_runs([bool(_RESPONSE_KEYS & p.keys()) for p in parts]))
            else:
                counts.append(1)
            clean.append(turn)
        parsed = parse_gemini_contents(clean, system if isinstance(system, dict) else None)
        sources = _sources(counts)
        if parsed and parsed[0].role == "system" and len(parsed) == len(sources) + 1:
            sources.insert(0, (-1,))
        _check(parsed, sources, "contents")
        return ParsedRequest(parsed, sources)

    def _prepend(self, msg: JSON, text: str) -> JSON:
        parts = msg.get("parts")
        if not isinstance(parts, list):
            return msg
        at = 0
        while at < len(parts) and isinstance(parts[at], dict) and _RESPONSE_KEYS & parts[at].keys():
            at += 1
        return {**msg, "parts": [*parts[:at], {"text": text}, *parts[at:]]}

    def _add_system(self, body: JSON, text: str) -> JSON:
        key = self._system_key(body)
        system = body.get(key)
        if isinstance(system, dict) and isinstance(system.get("parts"), list):
            return {**body, key: {**system, "parts": [*system["parts"], {"text": text}]}}
        return {**body, key: {"parts": [{"text": text}]}}

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
