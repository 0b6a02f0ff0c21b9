"""A scripted fake LLM provider for the real coding agents: a real HTTP server on 127.0.0.1.

It speaks the three wire formats the agents use, each streaming (server-sent events) and not:

- Anthropic Messages, ``POST /v1/messages`` (Claude Code; ``?beta=true`` too), with text and
  ``tool_use`` blocks and usage including the cache fields, and
  ``POST /v1/messages/count_tokens``;
- OpenAI Responses, ``POST /v1/responses`` (Codex CLI): ``response.created``,
  ``response.output_item.added`` / ``.done``, ``response.output_text.delta``,
  ``response.completed``, with ``message`` and ``function_call`` items;
- OpenAI Chat Completions, ``POST /v1/chat/completions`` (aider, through litellm);
- ``GET /v1/models`` (both providers' shapes) and anything else: a small JSON answer.

**Scripted.** A test gives a list of ``Step``s. A request of the main conversation is answered
by the first step not yet used whose ``when`` text occurs in the request's *latest* message
(the user's prompt, or the latest tool result), or, failing that, by the first unused step
with no ``when``. A step replies with text, tool calls, or both (``Call``: a tool name and its
arguments, in the client's own tool vocabulary). A request no step answers gets
``UNSCRIPTED`` (a test then fails on the agent's output, and the recorded requests say why).

**Side calls.** Agents ask beside the conversation: Claude Code for a topic or title, a
one-token quota probe, token counts; aider for a commit message. ``side_reply(request)`` picks
their deterministic answer; such a request is recorded with ``side`` set, so a test can compare
the main conversation alone.

**Recorded.** Every request (method, path, query, headers, JSON body, raw bytes, whether it was
a side call) is kept in ``requests``, in arrival order.

**Prompt cache.** For Anthropic requests the fake keeps a prompt cache as Anthropic's works:
each ``cache_control`` breakpoint writes its prefix (tools, system, messages up to the block);
``usage.cache_read_input_tokens`` is the characters/4 of the longest prefix written before that
ends at a block boundary up to 20 blocks back from one of the request's breakpoints
(``cache_creation_input_tokens`` the rest up to the last breakpoint). A proxy that changes
bytes before a breakpoint shows up as fewer cache reads than the control run.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qsl, urlsplit

from fake_llm import anthropic_events, halves, sse_event, words_of

__all__ = [
    "UNSCRIPTED",
    "Call",
    "Recorded",
    "ScriptedUpstream",
    "Step",
    "latest_text",
]

UNSCRIPTED = "UNSCRIPTED REQUEST: the fake upstream has no step for this request."
JSON = dict[str, Any]


@dataclass(frozen=True)
class Call:
    """A tool call the fake model makes: the client's tool ``name`` and its ``arguments``.

    ``custom`` (Responses API only): send it as a freeform ``custom_tool_call`` whose input is
    ``arguments["input"]`` (Codex's ``apply_patch``)."""

    name: str
    arguments: JSON = field(default_factory=dict)
    custom: bool = False


@dataclass
class Step:
    """One scripted model turn: answer the first request whose latest message contains
    ``when`` (``None``: the next request no other step matches) with ``text`` and ``calls``."""

    text: str = ""
    calls: list[Call] = field(default_factory=list)
    when: str | None = None
    used: bool = False


@dataclass
class Recorded:
    method: str
    path: str
    query: dict[str, str]
    headers: dict[str, str]
    body: Any
    raw: bytes
    side: bool = False
    answer: str = ""  # "step N", "side: …", "unscripted", "passthrough"
    cache_read: int = 0  # Anthropic: the prompt-cache read tokens reported


#: Where the memory the proxy adds to a request starts (it goes at the end of the request):
#: the fake answers by what the client itself wrote last.
_MEMORY_STARTS = ("<context-topics>", "<memory>")


def _client_part(text: str) -> str:
    """``text`` without the memory the proxy appended to it."""
    cut = min((i for i in (text.find(m) for m in _MEMORY_STARTS) if i >= 0), default=-1)
    return text if cut < 0 else text[:cut].rstrip()


def latest_text(body: Any) -> str:
    """The text of a request's latest message — user prompt or tool result — in any of the
    three formats (blocks joined with newlines), without the memory the proxy appended."""
    if not isinstance(body, dict):
        return ""
    messages = body.get("messages")
    if isinstance(messages, list) and messages:
        # the latest user or tool message: Claude Code 2.1 puts a role "system" message last
        for message in reversed(messages):
            if isinstance(message, dict) and message.get("role") in {"user", "tool"}:
                text = _client_part(_content_text(message.get("content")))
                if text:
                    return text
        return _client_part(_content_text(messages[-1].get("content")))
    items = body.get("input")
    if isinstance(items, str):
        return items
    if isinstance(items, list) and items:
        for item in reversed(items):
            if not isinstance(item, dict):
                continue
            if item.get("type") in {"function_call_output", "custom_tool_call_output"}:
                return _content_text(item.get("output"))
            if item.get("role") == "user":
                text = _client_part(_content_text(item.get("content")))
                if text:
                    return text
        return ""
    return ""


def _content_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, dict):
        return _content_text(content.get("content") or content.get("text") or "")
    if isinstance(content, list):
        parts = []
        for block in content:
            if isinstance(block, str):
                parts.append(block)
            elif isinstance(block, dict):
                if "text" in block:
                    parts.append(str(block["text"]))
                elif "content" in block:
                    parts.append(_content_text(block["content"]))
                elif "output" in block:
                    parts.append(_content_text(block["output"]))
        return "\n".join(parts)
    return ""


def all_text(body: Any) -> str:
    """Every string in a body, joined (for "does the forwarded request hold this fact")."""
    out: list[str] = []

    def walk(value: Any) -> None:
        if isinstance(value, str):
            out.append(value)
        elif isinstance(value, dict):
            for v in value.values():
                walk(v)
        elif isinstance(value, list):
            for v in value:
                walk(v)

    walk(body)
    return "\n".join(out)


SideReply = Callable[[Recorded], str | None]


def default_side_reply(request: Recorded) -> str | None:
    """The answer to a side call, or ``None`` for a request of the main conversation.

    - Claude Code: a request without ``tools`` is a helper (topic/title detection answers
      JSON, the one-token quota probe and anything else ``OK``);
    - aider: a request whose system prompt asks for a commit message gets ``Add hello.py``;
    - Codex: a request without ``tools`` (its title / summary helpers).
    """
    body = request.body if isinstance(request.body, dict) else {}
    system = _content_text(body.get("system")) if "system" in body else ""
    if request.path.startswith("/v1/messages"):
        if latest_text(body).strip() == "Warmup":  # Claude Code 2.0 warms its sub-agents up
            return "OK"
        if body.get("tools"):
            return None
        lowered = (system + "\n" + latest_text(body)).lower()
        if "istopic" in lowered.replace("_", "").replace(" ", "") or "new topic" in lowered:
            return '{"isNewTopic": false, "title": null}'
        if "title" in lowered:
            return '{"title": "Scripted task"}'
        return "OK"
    if request.path.startswith("/v1/chat/completions"):
        messages = body.get("messages") or []
        first = _content_text(messages[0].get("content")) if messages else ""
        if "commit message" in first.lower():
            diff = latest_text(body)
            return "Print hello, world" if 'print("hello, world")' in diff else "Add hello.py"
        if "summar" in first.lower() and "conversation" in first.lower():
            return "The user asked for a file; it was created."
        return None
    if request.path.startswith("/v1/responses"):
        if body.get("tools"):
            return None
        return "OK"
    return None


class ScriptedUpstream:
    """The fake provider. ``with ScriptedUpstream(steps) as up:`` serves on ``up.url``."""

    def __init__(
        self,
        steps: list[Step] | None = None,
        *,
        model: str = "claude-sonnet-4-5",
        side_reply: SideReply = default_side_reply,
    ) -> None:
        self.steps: list[Step] = list(steps or [])
        self.model = model
        self.side_reply = side_reply
        self.requests: list[Recorded] = []
        self._lock = threading.Lock()
        self._ids = itertools.count(1)
        self._cache: set[str] = set()
        self._server = _Server(("127.0.0.1", 0), _make_handler(self))
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    # -- lifecycle ---------------------------------------------------------------------------

    def start(self) -> ScriptedUpstream:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(10)

    def __enter__(self) -> ScriptedUpstream:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def script(self, steps: list[Step]) -> None:
        """Replace the script (the steps are copied: each run starts with all unused)."""
        with self._lock:
            self.steps = [replace(s, used=False) for s in steps]

    def reset(self, steps: list[Step]) -> None:
        """A new run: this script, no requests recorded, an empty prompt cache."""
        with self._lock:
            self.steps = [replace(s, used=False) for s in steps]
            self.requests = []
            self._cache = set()
            self._ids = itertools.count(1)

    # -- views for tests ---------------------------------------------------------------------

    def main_requests(self, path_prefix: str = "") -> list[Recorded]:
        """The requests of the main conversation (no side calls), in order."""
        return [
            r
            for r in self.requests
            if not r.side
            and r.method == "POST"
            and r.path.startswith(path_prefix)
            and r.answer.startswith(("step", "unscripted"))
        ]

    def describe(self) -> str:
        """One line per request: what came, what it was answered with (for failure output)."""
        lines = []
        for i, r in enumerate(self.requests):
            latest = latest_text(r.body).replace("\n", " ")[:100]
            lines.append(f"{i}: {r.method} {r.path} -> {r.answer}; latest: {latest!r}")
        return "\n".join(lines)

    # -- answering ---------------------------------------------------------------------------

    def _next_step(self, body: Any) -> tuple[int, Step] | None:
        text = latest_text(body)
        with self._lock:
            for i, step in enumerate(self.steps):
                if not step.used and step.when is not None and step.when in text:
                    step.used = True
                    return i, step
            for i, step in enumerate(self.steps):
                if not step.used and step.when is None:
                    step.used = True
                    return i, step
        return None

    def answer(self, request: Recorded) -> tuple[int, dict[str, str], bytes | Iterator[bytes]]:
        with self._lock:
            self.requests.append(request)
        path, body = request.path, request.body
        if request.method == "GET":
            request.answer = "models"
            return 200, {}, json.dumps(self._models(path)).encode()
        if path == "/v1/messages/count_tokens":
            request.answer = "count_tokens"
            tokens = max(1, len(request.raw) // 4)
            return 200, {}, json.dumps({"input_tokens": tokens}).encode()
        if not isinstance(body, dict) or path not in {
            "/v1/messages",
            "/v1/responses",
            "/v1/chat/completions",
        }:
            request.answer = "passthrough"
            return 404, {}, json.dumps({"error": {"message": f"no route {path}"}}).encode()
        side = self.side_reply(request)
        if side is not None:
            request.side = True
            request.answer = f"side: {side[:40]}"
            tag = f"side{next(self._ids)}"
            text, calls = side, []
        else:
            found = self._next_step(body)
            if found is None:
                request.answer = "unscripted"
                tag = f"x{next(self._ids)}"
                text, calls = UNSCRIPTED, []
            else:
                request.answer = f"step {found[0]}"
                tag = f"s{found[0]}"
                text, calls = found[1].text, found[1].calls
        stream = bool(body.get("stream"))
        if path == "/v1/messages":
            message = self._anthropic(tag, body, text, calls, request.raw)
            request.cache_read = message["usage"]["cache_read_input_tokens"]
            if stream:
                return 200, _SSE, iter(anthropic_events(message, start_tokens=1))
            return 200, {}, json.dumps(message).encode()
        if path == "/v1/responses":
            response = self._responses(tag, body, text, calls, request.raw)
            if stream:
                return 200, _SSE, iter(_responses_events(response))
            return 200, {}, json.dumps(response).encode()
        completion = self._chat(tag, body, text, calls, request.raw)
        if stream:
            include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
            return 200, _SSE, iter(_chat_events(completion, include_usage))
        return 200, {}, json.dumps(completion).encode()

    def _models(self, path: str) -> JSON:
        """A model list both SDKs can read (OpenAI's ``data`` items, Anthropic's fields)."""
        return {
            "object": "list",
            "data": [
                {
                    "id": self.model,
                    "object": "model",
                    "created": 0,
                    "owned_by": "fake",
                    "type": "model",
                    "display_name": self.model,
                    "created_at": "2025-01-01T00:00:00Z",
                }
            ],
            "has_more": False,
            "first_id": self.model,
            "last_id": self.model,
        }

    # Anthropic ------------------------------------------------------------------------------

    def _cache_usage(self, body: JSON, raw: bytes) -> tuple[int, int, int]:
        """(input, cache_creation, cache_read) tokens (characters/4), as Anthropic's prompt
        cache counts them: each breakpoint writes its prefix (tools, system, messages up to
        the block); a read is the longest prefix written before that ends at a block boundary
        up to 20 blocks back from a breakpoint. Where the ``cache_control`` keys sit is not
        part of a prefix."""
        prefixes = _block_prefixes(body)  # (hash, characters, is a breakpoint) per block
        total = max(1, len(raw) // 4)
        read = 0
        last_breakpoint = 0
        with self._lock:
            for i, (_, _, breakpoint) in enumerate(prefixes):
                if not breakpoint:
                    continue
                for j in range(i, max(-1, i - 21), -1):
                    if prefixes[j][0] in self._cache:
                        read = max(read, prefixes[j][1])
                        break
            for digest, chars, breakpoint in prefixes:
                if breakpoint:
                    self._cache.add(digest)
                    last_breakpoint = chars
        read //= 4
        created = max(0, last_breakpoint // 4 - read)
        return max(1, total - read - created), created, read

    def _anthropic(self, tag: str, body: JSON, text: str, calls: list[Call], raw: bytes) -> JSON:
        content: list[JSON] = []
        if text:
            content.append({"type": "text", "text": text})
        for k, call in enumerate(calls):
            content.append(
                {
                    "type": "tool_use",
                    "id": f"toolu_{tag}_{k}",
                    "name": call.name,
                    "input": call.arguments,
                }
            )
        fresh, created, read = self._cache_usage(body, raw)
        return {
            "id": f"msg_{tag}",
            "type": "message",
            "role": "assistant",
            "model": body.get("model") or self.model,
            "content": content,
            "stop_reason": "tool_use" if calls else "end_turn",
            "stop_sequence": None,
            "usage": {
                "input_tokens": fresh,
                "cache_creation_input_tokens": created,
                "cache_read_input_tokens": read,
                "output_tokens": max(1, len(json.dumps(content)) // 4),
                "service_tier": "standard",
            },
        }

    # OpenAI Responses ----------------------------------------------------------------------

    def _responses(self, tag: str, body: JSON, text: str, calls: list[Call], raw: bytes) -> JSON:
        output: list[JSON] = []
        if text:
            output.append(
                {
                    "type": "message",
                    "id": f"msg_{tag}",
                    "status": "completed",
                    "role": "assistant",
                    "content": [{"type": "output_text", "text": text, "annotations": []}],
                }
            )
        for k, call in enumerate(calls):
            if call.custom:
                output.append(
                    {
                        "type": "custom_tool_call",
                        "id": f"ctc_{tag}_{k}",
                        "status": "completed",
                        "call_id": f"call_{tag}_{k}",
                        "name": call.name,
                        "input": call.arguments.get("input", ""),
                    }
                )
            else:
                output.append(
                    {
                        "type": "function_call",
                        "id": f"fc_{tag}_{k}",
                        "status": "completed",
                        "call_id": f"call_{tag}_{k}",
                        "name": call.name,
                        "arguments": json.dumps(call.arguments),
                    }
                )
        tokens = max(1, len(raw) // 4)
        out_tokens = max(1, len(json.dumps(output)) // 4)
        return {
            "id": f"resp_{tag}",
            "object": "response",
            "created_at": 0,
            "status": "completed",
            "model": body.get("model") or self.model,
            "output": output,
            "usage": {
                "input_tokens": tokens,
                "input_tokens_details": {"cached_tokens": 0},
                "output_tokens": out_tokens,
                "output_tokens_details": {"reasoning_tokens": 0},
                "total_tokens": tokens + out_tokens,
            },
        }

    # OpenAI Chat Completions ---------------------------------------------------------------

    def _chat(self, tag: str, body: JSON, text: str, calls: list[Call], raw: bytes) -> JSON:
        message: JSON = {"role": "assistant", "content": text or None}
        if calls:
            message["tool_calls"] = [
                {
                    "id": f"call_{tag}_{k}",
                    "type": "function",
                    "function": {"name": c.name, "arguments": json.dumps(c.arguments)},
                }
                for k, c in enumerate(calls)
            ]
        prompt = max(1, len(raw) // 4)
        completion = max(1, len(text) // 4)
        return {
            "id": f"chatcmpl_{tag}",
            "object": "chat.completion",
            "created": 0,
            "model": body.get("model") or self.model,
            "choices": [
                {
                    "index": 0,
                    "message": message,
                    "logprobs": None,
                    "finish_reason": "tool_calls" if calls else "stop",
                }
            ],
            "usage": {
                "prompt_tokens": prompt,
                "completion_tokens": completion,
                "total_tokens": prompt + completion,
            },
        }


def _block_prefixes(body: JSON) -> list[tuple[str, int, bool]]:
    """For each block of the prompt in Anthropic's cache order (tools, system blocks, message
    blocks): the hash of the prompt up to and including it (without ``cache_control`` keys),
    its length in characters, and whether the block is a breakpoint."""
    running = hashlib.sha256()
    chars = 0
    out: list[tuple[str, int, bool]] = []

    def visit(kind: str, value: Any) -> None:
        nonlocal chars
        breakpoint = isinstance(value, dict) and "cache_control" in value
        if breakpoint:
            value = {k: v for k, v in value.items() if k != "cache_control"}
        text = json.dumps([kind, value], sort_keys=True)
        running.update(text.encode())
        chars += len(text)
        out.append((running.copy().hexdigest(), chars, breakpoint))

    for tool in body.get("tools") or []:
        visit("tool", tool)
    system = body.get("system")
    if isinstance(system, list):
        for block in system:
            visit("system", block)
    elif system:
        visit("system", system)
    for i, message in enumerate(body.get("messages") or []):
        content = message.get("content")
        role = f"m{i}:{message.get('role')}"
        if isinstance(content, list):
            for block in content:
                visit(role, block)
        else:
            visit(role, content)
    return out


# -- wire: server-sent events ----------------------------------------------------------------

_SSE = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}


def _responses_events(response: JSON) -> list[bytes]:
    seq = itertools.count()

    def ev(kind: str, **data: Any) -> bytes:
        return sse_event({"type": kind, "sequence_number": next(seq), **data}, kind)

    shell = {**response, "status": "in_progress", "output": [], "usage": None}
    events = [ev("response.created", response=shell), ev("response.in_progress", response=shell)]
    for index, item in enumerate(response["output"]):
        if item["type"] == "message":
            text = item["content"][0]["text"]
            events.append(
                ev(
                    "response.output_item.added",
                    output_index=index,
                    item={**item, "status": "in_progress", "content": []},
                )
            )
            part = {"type": "output_text", "text": "", "annotations": []}
            events.append(
                ev(
                    "response.content_part.added",
                    item_id=item["id"],
                    output_index=index,
                    content_index=0,
                    part=part,
                )
            )
            for piece in words_of(text):
                events.append(
                    ev(
                        "response.output_text.delta",
                        item_id=item["id"],
                        output_index=index,
                        content_index=0,
                        delta=piece,
                    )
                )
            events.append(
                ev(
                    "response.output_text.done",
                    item_id=item["id"],
                    output_index=index,
                    content_index=0,
                    text=text,
                )
            )
            events.append(
                ev(
                    "response.content_part.done",
                    item_id=item["id"],
                    output_index=index,
                    content_index=0,
                    part={**part, "text": text},
                )
            )
        elif item["type"] == "function_call":
            events.append(
                ev(
                    "response.output_item.added",
                    output_index=index,
                    item={**item, "status": "in_progress", "arguments": ""},
                )
            )
            for piece in halves(item["arguments"]):
                events.append(
                    ev(
                        "response.function_call_arguments.delta",
                        item_id=item["id"],
                        output_index=index,
                        delta=piece,
                    )
                )
            events.append(
                ev(
                    "response.function_call_arguments.done",
                    item_id=item["id"],
                    output_index=index,
                    arguments=item["arguments"],
                )
            )
        else:
            events.append(
                ev(
                    "response.output_item.added",
                    output_index=index,
                    item={**item, "status": "in_progress"},
                )
            )
        events.append(ev("response.output_item.done", output_index=index, item=item))
    events.append(ev("response.completed", response=response))
    return events


def _chat_events(completion: JSON, include_usage: bool) -> list[bytes]:
    choice = completion["choices"][0]
    message = choice["message"]

    def chunk(delta: JSON, finish: str | None = None) -> bytes:
        return sse_event(
            {
                "id": completion["id"],
                "object": "chat.completion.chunk",
                "created": 0,
                "model": completion["model"],
                "choices": [
                    {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
                ],
            }
        )

    events = [chunk({"role": "assistant", "content": ""})]
    if message.get("content"):
        events += [chunk({"content": p}) for p in words_of(message["content"])]
    for i, call in enumerate(message.get("tool_calls") or []):
        head = {
            "index": i,
            "id": call["id"],
            "type": "function",
            "function": {"name": call["function"]["name"], "arguments": ""},
        }
        events.append(chunk({"tool_calls": [head]}))
        for piece in halves(call["function"]["arguments"]):
            events.append(chunk({"tool_calls": [{"index": i, "function": {"arguments": piece}}]}))
    events.append(chunk({}, choice["finish_reason"]))
    if include_usage:
        events.append(
            sse_event(
                {
                    "id": completion["id"],
                    "object": "chat.completion.chunk",
                    "created": 0,
                    "model": completion["model"],
                    "choices": [],
                    "usage": completion["usage"],
                }
            )
        )
    events.append(b"data: [DONE]\n\n")
    return events


# -- the HTTP server -------------------------------------------------------------------------


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 64


def _make_handler(fake: ScriptedUpstream) -> type[BaseHTTPRequestHandler]:
    class _Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        disable_nagle_algorithm = True

        def log_message(self, format: str, *args: Any) -> None:
            pass

        def _serve(self) -> None:
            length = int(self.headers.get("content-length") or 0)
            raw = self.rfile.read(length) if length else b""
            if self.headers.get("transfer-encoding", "").lower() == "chunked":
                raw = self._read_chunked()
            try:
                body = json.loads(raw) if raw else None
            except (json.JSONDecodeError, UnicodeDecodeError):
                body = None
            split = urlsplit(self.path)
            headers = {k.lower(): v for k, v in self.headers.items()}
            request = Recorded(
                self.command, split.path, dict(parse_qsl(split.query)), headers, body, raw
            )
            status, extra, payload = fake.answer(request)
            try:
                self.send_response(status)
                if isinstance(payload, bytes):
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(payload)))
                    self.end_headers()
                    self.wfile.write(payload)
                    return
                for key, value in extra.items():
                    self.send_header(key, value)
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                for piece in payload:
                    self.wfile.write(f"{len(piece):x}\r\n".encode() + piece + b"\r\n")
                    self.wfile.flush()
                self.wfile.write(b"0\r\n\r\n")
                self.wfile.flush()
            except (BrokenPipeError, ConnectionResetError):
                self.close_connection = True

        def _read_chunked(self) -> bytes:
            out = b""
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    self.rfile.readline()
                    return out
                out += self.rfile.read(size)
                self.rfile.readline()

        do_POST = do_GET = do_PUT = do_DELETE = do_HEAD = _serve

    return _Handler
