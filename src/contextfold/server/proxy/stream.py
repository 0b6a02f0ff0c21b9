"""The response side of the proxy, per provider wire format: replies and streams.

- ``Reply``: the assistant's text and tool calls, read from a JSON response or accumulated
  from a stream;
- ``mark_json``: the JSON response with the session marker appended to its reply's last text
  (none in a reply with tool calls or without text; which requests get one: ``markers``);
- ``SseSplitter``: cuts a byte stream into whole server-sent events, exactly as received
  (an event is forwarded the moment its blank line arrives; nothing waits for more);
- ``StreamState`` (one per format): accumulates the reply from the events and inserts the
  marker as one extra event where the format allows — OpenAI and Gemini: a text chunk just
  before the finishing chunk (just after it when the finishing chunk itself carries text),
  Anthropic: one more ``text_delta`` into the last text block, just before that block's
  ``content_block_stop`` (never a block of its own: some clients print only the last block;
  while markers are on, a text block's stop event waits for the next event, which says
  whether the reply ends there) — decided at the end of the reply, from what was streamed (a
  reply with tool calls gets none);
- ``synthesize``: a complete SSE stream for a finished JSON response (used when the
  in-proxy tool loop ran non-streamed for a streaming client);
- ``continuation``: the request body that answers memory tool calls and asks again.
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from contextfold.items import ToolUseBlock

__all__ = [
    "Reply",
    "SseSplitter",
    "StreamState",
    "continuation",
    "mark_json",
    "reply_of",
    "stream_state",
    "synthesize",
]

JSON = dict[str, Any]


@dataclass
class Reply:
    """An assistant reply: its text, its tool calls, and the stop reason when known."""

    text: str = ""
    calls: list[ToolUseBlock] = field(default_factory=list)
    stop: str | None = None

    @property
    def has_calls(self) -> bool:
        """Any tool call: the client is in a tool loop, so the reply gets no marker."""
        return bool(self.calls)

    @property
    def tool_only(self) -> bool:
        """Only tool calls, no text: the client expects no text (OpenAI ``content: null``),
        so such a reply gets no session marker."""
        return bool(self.calls) and not self.text.strip()


def _args(raw: Any) -> dict[str, Any]:
    if isinstance(raw, dict):
        return raw
    if isinstance(raw, str) and raw.strip():
        try:
            value = json.loads(raw)
        except json.JSONDecodeError:
            return {"_raw": raw}
        return value if isinstance(value, dict) else {"_value": value}
    return {}


def _call(call_id: Any, name: Any, arguments: Any) -> ToolUseBlock | None:
    if not isinstance(name, str) or not name:
        return None
    return ToolUseBlock(id=str(call_id or name), name=name, input=_args(arguments))


# --------------------------------------------------------------------------- JSON responses


def reply_of(fmt: str, body: Any) -> Reply:
    """The reply in a (successful) JSON response of format ``fmt``."""
    if fmt == "responses":  # the OpenAI Responses API (``responses``)
        from contextfold.server.proxy.responses import response_reply

        return response_reply(body)
    reply = Reply()
    if not isinstance(body, dict):
        return reply
    if fmt == "openai":
        choices = body.get("choices")
        choice = choices[0] if isinstance(choices, list) and choices else {}
        message = choice.get("message") if isinstance(choice, dict) else None
        if isinstance(message, dict):
            content = message.get("content")
            if isinstance(content, str):
                reply.text = content
            calls = list(message.get("tool_calls") or [])
            if isinstance(message.get("function_call"), dict):  # the legacy ``functions`` API
                calls.append({"function": message["function_call"]})
            for call in calls:
                fn = call.get("function") if isinstance(call, dict) else None
                if isinstance(fn, dict):
                    block = _call(call.get("id"), fn.get("name"), fn.get("arguments"))
                    if block is not None:
                        reply.calls.append(block)
            reply.stop = choice.get("finish_reason")
    elif fmt == "anthropic":
        texts = []
        for block in body.get("content") or []:
            if not isinstance(block, dict):
                continue
            if block.get("type") == "text":
                texts.append(str(block.get("text", "")))
            elif block.get("type") == "tool_use":
                call = _call(block.get("id"), block.get("name"), block.get("input"))
                if call is not None:
                    reply.calls.append(call)
        reply.text = "".join(texts)
        reply.stop = body.get("stop_reason")
    else:
        for n, part in enumerate(_gemini_parts(body)):
            _gemini_part_into(reply, part, n)
        candidate = _gemini_candidate(body)
        reply.stop = candidate.get("finishReason")
    return reply


def _gemini_candidate(body: JSON) -> JSON:
    candidates = body.get("candidates")
    if isinstance(candidates, list) and candidates and isinstance(candidates[0], dict):
        return candidates[0]
    return {}


def _gemini_parts(body: JSON) -> list[Any]:
    content = _gemini_candidate(body).get("content")
    parts = content.get("parts") if isinstance(content, dict) else None
    return parts if isinstance(parts, list) else []


def _gemini_part_into(reply: Reply, part: Any, n: int) -> None:
    if not isinstance(part, dict) or part.get("thought") is True:
        return
    if isinstance(part.get("text"), str):
        reply.text += part["text"]
    fn = part.get("functionCall") or part.get("function_call")
    if isinstance(fn, dict):
        call = _call(fn.get("id") or f"call_{n}", fn.get("name"), fn.get("args"))
        if call is not None:
            reply.calls.append(call)


def mark_json(fmt: str, body: Any, marker: str) -> Any:
    """``body`` with ``marker`` appended to the reply's last text (Anthropic: its last text
    block). Returns ``body`` unchanged when it has no reply to mark, no text, or tool calls."""
    if not isinstance(body, dict):
        return body
    reply = reply_of(fmt, body)
    if reply.has_calls or not reply.text:
        return body
    if fmt == "openai":
        choices = body.get("choices")
        if not (isinstance(choices, list) and choices and isinstance(choices[0], dict)):
            return body
        message = choices[0].get("message")
        if not isinstance(message, dict):
            return body
        text = message.get("content")
        marked = (text if isinstance(text, str) else "") + marker
        choice = {**choices[0], "message": {**message, "content": marked}}
        return {**body, "choices": [choice, *choices[1:]]}
    if fmt == "anthropic":
        content = body.get("content")
        if not isinstance(content, list):
            return body
        at = next(
            (
                i
                for i in range(len(content) - 1, -1, -1)
                if isinstance(content[i], dict)
                and content[i].get("type") == "text"
                and isinstance(content[i].get("text"), str)
            ),
            None,
        )
        if at is None:
            return body
        last = content[at]
        return {
            **body,
            "content": [*content[:at], {**last, "text": last["text"] + marker}, *content[at + 1 :]],
        }
    candidate = _gemini_candidate(body)
    content = candidate.get("content")
    if not isinstance(content, dict):
        return body
    parts = list(content.get("parts") or [])
    last = parts[-1] if parts else None
    if isinstance(last, dict) and isinstance(last.get("text"), str) and not last.get("thought"):
        parts[-1] = {**last, "text": last["text"] + marker}
    else:
        parts.append({"text": marker.lstrip()})
    candidates = body["candidates"]
    return {**body, "candidates": [{**candidate, "content": {**content, "parts": parts}},
                                   *candidates[1:]]}  # fmt: skip


# --------------------------------------------------------------------------- SSE


class SseSplitter:
    """Whole server-sent events out of arbitrary byte chunks, bytes untouched."""

    def __init__(self) -> None:
        self._buffer = b""

    def feed(self, chunk: bytes) -> list[bytes]:
        self._buffer += chunk
        events: list[bytes] = []
        while True:
            cut = _event_end(self._buffer)
            if cut < 0:
                return events
            events.append(self._buffer[:cut])
            self._buffer = self._buffer[cut:]

    def rest(self) -> bytes:
        """Bytes after the last complete event (a stream cut short)."""
        rest, self._buffer = self._buffer, b""
        return rest


def _event_end(buffer: bytes) -> int:
    ends = [i + len(sep) for sep in (b"\n\n", b"\r\n\r\n", b"\r\r") if (i := buffer.find(sep)) >= 0]
    return min(ends) if ends else -1


def _parse_event(raw: bytes) -> tuple[str | None, str]:
    name = None
    data: list[str] = []
    for line in raw.decode("utf-8", "replace").splitlines():
        if line.startswith("event:"):
            name = line[6:].strip()
        elif line.startswith("data:"):
            data.append(line[5:].removeprefix(" "))
    return name, "\n".join(data)


def _frame(data: Any, name: str | None = None) -> bytes:
    head = f"event: {name}\n" if name else ""
    return f"{head}data: {json.dumps(data, ensure_ascii=False)}\n\n".encode()


#: Pass as the marker to have the stream keep the marker's place with ``MARKER_SLOT``: the
#: relay commits the reply there and puts in ``render_marker(text)`` (or nothing).
DEFERRED = "\x00deferred marker\x00"
MARKER_SLOT = b"\x00marker slot\x00"


class StreamState(ABC):
    """Accumulates a streamed reply and decides where the marker event goes."""

    def __init__(self, marker: str | None) -> None:
        self.marker = marker
        self.marked = marker is None
        self.reply = Reply()
        self.error: str | None = None
        #: Whether the stream's final event arrived (the reply is whole): a stream that ends
        #: without it, or with an error event, is stored marked partial.
        self.ended = False
        #: Whether a marker may be rendered at all (``proxy.markers``): a deferred marker
        #: keeps its slot either way (the commit happens there).
        self.may_mark = True

    def feed(self, raw: bytes) -> list[bytes]:
        """The bytes to send for the event ``raw``: the event itself, with the marker event
        before or after it when this is the place."""
        name, data = _parse_event(raw)
        payload: Any = None
        if data and data != "[DONE]":
            try:
                payload = json.loads(data)
            except (json.JSONDecodeError, RecursionError):  # forwarded as it came
                payload = None
        return self._feed(name, data, payload, raw)

    @abstractmethod
    def _feed(self, name: str | None, data: str, payload: Any, raw: bytes) -> list[bytes]: ...

    def finish(self) -> list[bytes]:
        """What to send when the upstream stream has ended (the reply is then complete)."""
        self.collect()
        return []

    def collect(self) -> None:  # noqa: B027 - a hook, a no-op unless a format needs it
        """Complete ``reply`` from what has arrived (also for a stream cut short)."""

    def feed_raw(self, chunk: bytes) -> None:  # noqa: B027 - a hook, as collect
        """Keep ``chunk`` of a stream that is not SSE (read whole by ``collect``)."""

    def _mark(self, event: bytes) -> bytes:
        self.marked = True
        return event

    def _slot(self) -> bytes | None:
        """``MARKER_SLOT`` when the marker is deferred (the place is marked taken)."""
        if self.marker is DEFERRED:
            self.marked = True
            return MARKER_SLOT
        return None

    def render_marker(self, marker: str) -> bytes:
        """The marker event(s) for ``marker`` text, in place of a ``MARKER_SLOT``."""
        self.marker = marker
        return self._render()

    @abstractmethod
    def _render(self) -> bytes: ...

    def _due(self) -> bool:
        """Whether the marker goes in now, at the end of the reply: once, never into a reply
        of only tool calls (decided from what has been streamed), and never into one that is
        not whole (no final event, or an error event: it is stored partial)."""
        if self.marked or not self.ended or self.error is not None:
            return False
        self.collect()
        if self.reply.has_calls:
            self.marked = True
            return False
        return True


class OpenAIStream(StreamState):
    def __init__(self, marker: str | None) -> None:
        super().__init__(marker)
        self._template: JSON = {}
        self._calls: dict[int, dict[str, str]] = {}

    def _marker_event(self) -> bytes:
        return self._slot() or self._render()

    def _render(self) -> bytes:
        assert self.marker is not None
        template = {k: v for k, v in self._template.items() if k in ("id", "created", "model")}
        chunk = {
            **template,
            "object": "chat.completion.chunk",
            "choices": [{"index": 0, "delta": {"content": self.marker}, "finish_reason": None}],
        }
        return self._mark(_frame(chunk))

    def _feed(self, name: str | None, data: str, payload: Any, raw: bytes) -> list[bytes]:
        if data == "[DONE]":
            self.ended = True
            return [*self.finish(), raw]
        if not isinstance(payload, dict):
            return [raw]
        if payload.get("error"):
            self.error = str(payload["error"])[:500]
        if not self._template:
            self._template = payload
        choices = payload.get("choices")
        choice = choices[0] if isinstance(choices, list) and choices else None
        if not isinstance(choice, dict):
            return [raw]
        delta = choice.get("delta") or {}
        text = delta.get("content") if isinstance(delta, dict) else None
        if isinstance(text, str):
            self.reply.text += text
        calls = list((delta.get("tool_calls") or []) if isinstance(delta, dict) else [])
        if isinstance(delta, dict) and isinstance(delta.get("function_call"), dict):
            calls.append({"index": -1, "function": delta["function_call"]})  # legacy API
        for call in calls:
            slot = self._calls.setdefault(int(call.get("index", 0)), {"args": ""})
            fn = call.get("function") or {}
            if call.get("id"):
                slot["id"] = call["id"]
            if fn.get("name"):
                slot["name"] = fn["name"]
            slot["args"] += fn.get("arguments") or ""
        if choice.get("finish_reason") is not None:
            self.reply.stop = choice["finish_reason"]
            self.ended = True
            if self._due():
                if text:
                    return [raw, self._marker_event()]
                return [self._marker_event(), raw]
        return [raw]

    def collect(self) -> None:
        self.reply.calls = [
            call
            for _, slot in sorted(self._calls.items())
            if (call := _call(slot.get("id"), slot.get("name"), slot["args"])) is not None
        ]

    def finish(self) -> list[bytes]:
        self.collect()
        if (self.reply.text or self._calls) and self._due():
            return [self._marker_event()]
        return []


class AnthropicStream(StreamState):
    def __init__(self, marker: str | None) -> None:
        super().__init__(marker)
        self._blocks: dict[int, dict[str, Any]] = {}
        # The ``content_block_stop`` of the latest text block, held back while the marker may
        # still go into that block: the next event says whether the reply ends there.
        self._held: tuple[int, bytes] | None = None
        self._into: int | None = None  # the text block the marker goes into

    def _marker_events(self) -> list[bytes]:
        slot = self._slot()
        return [slot] if slot else self._events()

    def _render(self) -> bytes:
        return b"".join(self._events())

    def _events(self) -> list[bytes]:
        assert self.marker is not None
        self.marked = True
        if self._into is None:  # no text block to append to: no marker
            return []
        return [
            _frame(
                {
                    "type": "content_block_delta",
                    "index": self._into,
                    "delta": {"type": "text_delta", "text": self.marker},
                },
                "content_block_delta",
            )
        ]

    def _release(self) -> list[bytes]:
        held, self._held = self._held, None
        return [held[1]] if held is not None else []

    def _feed(self, name: str | None, data: str, payload: Any, raw: bytes) -> list[bytes]:
        if not isinstance(payload, dict):
            return [raw]
        kind = payload.get("type") or name
        index = payload.get("index")
        before: list[bytes] = []
        if self._held is not None and kind not in ("ping", "message_delta"):
            before = self._release()  # another block follows: the held one was not the last
        if kind == "content_block_start" and isinstance(index, int):
            block = payload.get("content_block") or {}
            self._blocks[index] = {
                "type": block.get("type"),
                "id": block.get("id"),
                "name": block.get("name"),
                "text": block.get("text") or "",
                "json": "",
            }
        elif kind == "content_block_delta" and isinstance(index, int):
            slot = self._blocks.setdefault(index, {"type": "text", "text": "", "json": ""})
            delta = payload.get("delta") or {}
            if delta.get("type") == "text_delta":
                slot["text"] += delta.get("text") or ""
            elif delta.get("type") == "input_json_delta":
                slot["json"] += delta.get("partial_json") or ""
        elif kind == "content_block_stop" and isinstance(index, int):
            block = self._blocks.get(index) or {}
            if self.may_mark and not self.marked and block.get("type") == "text":
                self._held = (index, raw)
                return before
        elif kind == "message_delta":
            self.reply.stop = (payload.get("delta") or {}).get("stop_reason")
            self.ended = self.ended or self.reply.stop is not None
            if self._due():
                self._into = self._held[0] if self._held is not None else None
                return [*before, *self._marker_events(), *self._release(), raw]
            return [*before, *self._release(), raw]
        elif kind == "message_stop":
            self.ended = True
        elif kind == "error":
            self.error = str(payload.get("error"))[:500]
        return [*before, raw]

    def finish(self) -> list[bytes]:
        self.collect()
        return self._release()

    def collect(self) -> None:
        texts, calls = [], []
        for _, block in sorted(self._blocks.items()):
            if block["type"] == "text":
                texts.append(block["text"])
            elif block["type"] == "tool_use":
                call = _call(block["id"], block["name"], block["json"] or "{}")
                if call is not None:
                    calls.append(call)
        self.reply.text, self.reply.calls = "".join(texts), calls


class GeminiStream(StreamState):
    """Gemini SSE (``alt=sse``); without it the stream is a JSON array, forwarded untouched
    and read at the end (no marker: use the session header)."""

    def __init__(self, marker: str | None, sse: bool = True) -> None:
        super().__init__(marker if sse else None)
        self.sse = sse
        self._raw = b""
        self._parts = 0

    def _marker_event(self) -> bytes:
        return self._slot() or self._render()

    def _render(self) -> bytes:
        assert self.marker is not None
        chunk = {
            "candidates": [
                {"content": {"parts": [{"text": self.marker}], "role": "model"}, "index": 0}
            ]
        }
        return self._mark(_frame(chunk))

    def _feed(self, name: str | None, data: str, payload: Any, raw: bytes) -> list[bytes]:
        if not isinstance(payload, dict):
            return [raw]
        if payload.get("error"):
            self.error = str(payload["error"])[:500]
        before = len(self.reply.text)
        for part in _gemini_parts(payload):
            _gemini_part_into(self.reply, part, self._parts)
            self._parts += 1
        finish = _gemini_candidate(payload).get("finishReason")
        if finish:
            self.reply.stop = finish
            self.ended = True
            if self._due():
                if len(self.reply.text) > before:
                    return [raw, self._marker_event()]
                return [self._marker_event(), raw]
        return [raw]

    def feed_raw(self, chunk: bytes) -> None:
        self._raw += chunk

    def collect(self) -> None:
        if not self.sse and self._raw:
            raw, self._raw = self._raw, b""
            try:
                pieces = json.loads(raw)
            except json.JSONDecodeError:
                pieces = []
            for piece in pieces if isinstance(pieces, list) else []:
                self._feed(None, "", piece, b"")

    def finish(self) -> list[bytes]:
        self.collect()
        if (self.reply.text or self.reply.calls) and self._due():
            return [self._marker_event()]
        return []


def stream_state(
    fmt: str, marker: str | None, *, sse: bool = True, may_mark: bool = True
) -> StreamState:
    """The stream state for format ``fmt``; ``may_mark``: whether a marker can be rendered
    (``proxy.markers``; a deferred marker keeps its slot either way)."""
    state: StreamState
    if fmt == "responses":  # the OpenAI Responses API (``responses``)
        from contextfold.server.proxy.responses import ResponsesStream

        state = ResponsesStream(marker)
    elif fmt == "openai":
        state = OpenAIStream(marker)
    elif fmt == "anthropic":
        state = AnthropicStream(marker)
    else:
        state = GeminiStream(marker, sse)
    state.may_mark = may_mark
    return state


# --------------------------------------------------------------------------- synthesized streams


def synthesize(fmt: str, body: JSON, *, include_usage: bool = False, sse: bool = True) -> bytes:
    """The SSE stream a streaming client expects for the finished response ``body``."""
    return b"".join(_synthesize(fmt, body, include_usage, sse))


def _synthesize(fmt: str, body: JSON, include_usage: bool, sse: bool) -> Iterator[bytes]:
    if fmt == "gemini":
        if sse:
            yield _frame(body)
        else:
            yield b"[" + json.dumps(body, ensure_ascii=False).encode() + b"]"
        return
    if fmt == "openai":
        head = {k: body.get(k) for k in ("id", "created", "model")}
        choice = (body.get("choices") or [{}])[0]
        message = choice.get("message") or {}

        def chunk(delta: JSON, finish: str | None = None) -> bytes:
            choices = [{"index": 0, "delta": delta, "finish_reason": finish}]
            return _frame({**head, "object": "chat.completion.chunk", "choices": choices})

        yield chunk({"role": "assistant", "content": message.get("content") or ""})
        calls = message.get("tool_calls") or []
        if calls:
            yield chunk({"tool_calls": [{**c, "index": i} for i, c in enumerate(calls)]})
        yield chunk({}, choice.get("finish_reason") or "stop")
        if include_usage and body.get("usage"):
            tail: JSON = {**head, "object": "chat.completion.chunk", "choices": []}
            yield _frame({**tail, "usage": body["usage"]})
        yield b"data: [DONE]\n\n"
        return
    usage: JSON = body.get("usage") or {}
    start = {**body, "content": [], "stop_reason": None, "usage": {**usage, "output_tokens": 0}}
    yield _frame({"type": "message_start", "message": start}, "message_start")
    for index, block in enumerate(body.get("content") or []):
        if block.get("type") == "tool_use":
            empty = {**block, "input": {}}
            delta = {"type": "input_json_delta", "partial_json": json.dumps(block.get("input"))}
        else:
            empty = {"type": "text", "text": ""}
            delta = {"type": "text_delta", "text": block.get("text", "")}
        yield _frame(
            {"type": "content_block_start", "index": index, "content_block": empty},
            "content_block_start",
        )
        yield _frame(
            {"type": "content_block_delta", "index": index, "delta": delta}, "content_block_delta"
        )
        yield _frame({"type": "content_block_stop", "index": index}, "content_block_stop")
    yield _frame(
        {
            "type": "message_delta",
            "delta": {"stop_reason": body.get("stop_reason"), "stop_sequence": None},
            "usage": {"output_tokens": usage.get("output_tokens", 0)},
        },
        "message_delta",
    )
    yield _frame({"type": "message_stop"}, "message_stop")


# --------------------------------------------------------------------------- tool loop


def continuation(
    fmt: str, body: JSON, response: JSON, results: list[tuple[ToolUseBlock, str]]
) -> JSON:
    """``body`` with the model's memory tool calls and their ``results`` appended, ready to
    ask again. Calls to the client's own tools in the same response are left out (the model
    asks again for them once it has the memory it wanted)."""
    key = "contents" if fmt == "gemini" else "messages"
    items = list(body.get(key) or [])
    ids = {call.id for call, _ in results}
    if fmt == "openai":
        message = ((response.get("choices") or [{}])[0]).get("message") or {}
        calls = [c for c in message.get("tool_calls") or [] if c.get("id") in ids]
        items.append({"role": "assistant", "content": message.get("content"), "tool_calls": calls})
        items += [{"role": "tool", "tool_call_id": c.id, "content": r} for c, r in results]
    elif fmt == "anthropic":
        blocks = [
            b
            for b in response.get("content") or []
            if b.get("type") == "text" or (b.get("type") == "tool_use" and b.get("id") in ids)
        ]
        items.append({"role": "assistant", "content": blocks})
        items.append(
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": c.id, "content": r} for c, r in results
                ],
            }
        )
    else:
        names = {call.name for call, _ in results}
        parts = [
            p
            for p in _gemini_parts(response)
            if "text" in p or (p.get("functionCall") or {}).get("name") in names
        ]
        items.append({"role": "model", "parts": parts})
        items.append(
            {
                "role": "user",
                "parts": [
                    {"functionResponse": {"name": c.name, "response": {"content": r}}}
                    for c, r in results
                ],
            }
        )
    return {**body, key: items}
