"""A fake LLM provider: a real HTTP server on 127.0.0.1 speaking provider wire formats.

It runs ``http.server.ThreadingHTTPServer`` in a daemon thread on a free port, records every
request, and answers from a route table, so clients are tested through their real HTTP path.

Routes (non-streaming JSON, each in its provider's shape):

- OpenAI ``POST /v1/chat/completions`` and ``POST /v1/embeddings`` (root: ``base_url``);
- Anthropic ``POST /v1/messages`` (root: ``url``), which answers 400 like Anthropic when
  ``max_tokens`` is missing or a message has a role other than user/assistant;
- Gemini ``POST /v1beta/models/<model>:generateContent`` (root: ``url``), which answers 400
  for a role other than user/model, and with no candidates and a ``promptFeedback`` when
  ``block_reason`` is set (a blocked prompt).

Every chat route answers ``reply`` (a string, or a function of the request's JSON body in that
provider's shape returning a string or a ``ModelTurn`` — text and tool calls) and reports usage:
prompt tokens are the words of the JSON-encoded input, completion tokens the words of the reply.

Streaming (server-sent events, each in its provider's shape): OpenAI and Anthropic when the body
has ``"stream": true``; Gemini on ``…:streamGenerateContent`` (SSE with ``?alt=sse``, else a
JSON array sent piece by piece). The reply text goes out a word per event; tool calls follow.
``stream_delay`` pauses between events; ``stream_gate(i)`` is called before event ``i >= 1`` is
sent (a test can block there until its client has seen the earlier events).

Add a route with ``server.route("POST", regex, handler)``; a handler takes the
``RecordedRequest`` and the regex match and returns a ``Reply``.

With ``api_key`` set, a request without the provider's credential (``Authorization: Bearer``,
``x-api-key``, ``x-goog-api-key``) gets a 401.

Failures are scripted: ``fail_next(429, times=2)`` answers the next two requests with 429 before
normal service resumes; ``disconnect_next()`` drops the connection without an answer. Queued
failures apply to any route unless ``path`` is given. Unless ``body`` is given, an error body
has the shape of the provider the path belongs to (all three nest ``error.message``).
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass(frozen=True)
class ToolCall:
    """A tool call the fake model makes (``id`` defaults to ``call_<n>``)."""

    name: str
    arguments: dict[str, Any] = field(default_factory=dict)
    id: str | None = None


@dataclass(frozen=True)
class ModelTurn:
    """What the fake model answers: text, tool calls, or both."""

    text: str = ""
    tool_calls: tuple[ToolCall, ...] = ()


ReplyText = str | Callable[[dict[str, Any]], "str | ModelTurn"]


@dataclass(frozen=True)
class RecordedRequest:
    """One request as the server saw it; ``headers`` have lower-case names."""

    method: str
    path: str
    headers: dict[str, str]
    body: Any  # decoded JSON, or None when the body was empty or not JSON
    raw: bytes


@dataclass(frozen=True)
class Reply:
    """``body`` is JSON-serialisable or bytes sent as they are; ``stream`` (when given) is sent
    instead, piece by piece with chunked transfer encoding, ``gate(i)`` called before piece
    ``i >= 1``."""

    status: int = 200
    body: Any = None
    headers: dict[str, str] = field(default_factory=dict)
    stream: list[bytes] | None = None
    gate: Callable[[int], None] | None = None


@dataclass
class _Failure:
    status: int  # 0 means: close the connection without answering
    body: Any  # None: the provider-shaped default for the request's path
    headers: dict[str, str]
    path: str | None


Handler = Callable[[RecordedRequest, "re.Match[str]"], Reply]


def fake_vector(text: str, dim: int) -> list[float]:
    """A deterministic, unnormalised vector in [-1, 1)^dim from hashing ``text``."""
    data = hashlib.shake_256(text.encode("utf-8")).digest(2 * dim)
    return [int.from_bytes(data[2 * i : 2 * i + 2], "little") / 32768.0 - 1.0 for i in range(dim)]


def _words(value: Any) -> int:
    return len(json.dumps(value).split())


def _provider(path: str) -> str:
    """Which wire format a path belongs to: "anthropic", "gemini" or "openai"."""
    path = path.split("?", 1)[0]
    if path == "/v1/messages":
        return "anthropic"
    if path.startswith("/v1beta/"):
        return "gemini"
    return "openai"


_ANTHROPIC_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    429: "rate_limit_error",
    529: "overloaded_error",
}
_GOOGLE_STATUSES = {
    400: "INVALID_ARGUMENT",
    401: "UNAUTHENTICATED",
    403: "PERMISSION_DENIED",
    404: "NOT_FOUND",
    429: "RESOURCE_EXHAUSTED",
    503: "UNAVAILABLE",
}


#: The ``generationConfig`` fields the Gemini route accepts (Gemini rejects unknown names).
GEMINI_GENERATION_CONFIG = frozenset(
    {
        "temperature",
        "maxOutputTokens",
        "topP",
        "topK",
        "stopSequences",
        "seed",
        "presencePenalty",
        "frequencyPenalty",
        "candidateCount",
        "responseMimeType",
        "responseSchema",
        "thinkingConfig",
    }
)


def error_body(path: str, status: int, message: str) -> dict[str, Any]:
    """An error body in the shape of the provider ``path`` belongs to."""
    provider = _provider(path)
    if provider == "anthropic":
        kind = _ANTHROPIC_ERROR_TYPES.get(status, "api_error")
        return {"type": "error", "error": {"type": kind, "message": message}}
    if provider == "gemini":
        google_status = _GOOGLE_STATUSES.get(status, "INTERNAL")
        return {"error": {"code": status, "message": message, "status": google_status}}
    return {"error": {"message": message, "type": "fake_error"}}


class FakeLLMServer:
    """The fake provider. Use as a context manager or ``start()``/``stop()``.

    ``reply`` is the chat answer: a string, or a function of the request's JSON body.
    ``embedding_dim`` is the embedding length (a request's ``dimensions`` overrides it);
    ``reverse_embeddings`` returns ``data`` in reverse order (indices stay right). With
    ``api_key`` set, a request without the provider's credential gets a 401. ``block_reason``
    (e.g. ``"SAFETY"``) makes the Gemini route answer as for a blocked prompt.
    """

    def __init__(
        self,
        *,
        reply: ReplyText = "Hello from the fake LLM.",
        embedding_dim: int = 32,
        model: str = "fake-model",
    ) -> None:
        self.reply = reply
        self.embedding_dim = embedding_dim
        self.reverse_embeddings = False
        self.model = model
        self.api_key: str | None = None
        self.block_reason: str | None = None
        self.stream_delay = 0.0
        self.stream_gate: Callable[[int], None] | None = None
        self.requests: list[RecordedRequest] = []
        self._failures: list[_Failure] = []
        self._routes: list[tuple[str, re.Pattern[str], Handler]] = []
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self.route("POST", r"/v1/chat/completions", self._openai_chat)
        self.route("POST", r"/v1/embeddings", self._openai_embeddings)
        self.route("POST", r"/v1/messages", self._anthropic_messages)
        self.route(  # Gemini: v1beta, and v1 (google-genai's default with a base URL)
            "POST",
            r"/v1(?:beta)?/(?P<model>(?:tuned)?[mM]odels/[^/:]+):(?P<method>generateContent|"
            r"streamGenerateContent)",
            self._gemini,
        )
        # Azure OpenAI: a deployment's chat completions, and the v1 API's.
        self.route(
            "POST",
            r"/openai/(?:deployments/[^/]+|v1)/chat/completions",
            self._openai_chat,
        )

    # -- lifecycle ---------------------------------------------------------------------------

    def start(self) -> FakeLLMServer:
        server = _Server(("127.0.0.1", 0), _make_handler(self))
        server.daemon_threads = True
        self._server = server
        self._thread = threading.Thread(
            target=server.serve_forever, kwargs={"poll_interval": 0.01}, daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

    def __enter__(self) -> FakeLLMServer:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    @property
    def url(self) -> str:
        """``http://127.0.0.1:<port>`` (no path)."""
        assert self._server is not None, "start() the server first"
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    @property
    def base_url(self) -> str:
        """The OpenAI-style API root, ``{url}/v1``."""
        return f"{self.url}/v1"

    # -- scripting ---------------------------------------------------------------------------

    def route(self, method: str, pattern: str, handler: Handler) -> None:
        """Answer ``method`` requests whose path fully matches ``pattern`` with ``handler``;
        later routes win over earlier ones."""
        self._routes.insert(0, (method.upper(), re.compile(pattern), handler))

    def fail_next(
        self,
        status: int,
        *,
        times: int = 1,
        body: Any = None,
        headers: dict[str, str] | None = None,
        path: str | None = None,
    ) -> None:
        """Answer the next ``times`` requests (to ``path`` if given) with ``status``; ``body``
        defaults to the provider's error shape with message ``scripted failure <status>``."""
        with self._lock:
            for _ in range(times):
                self._failures.append(_Failure(status, body, dict(headers or {}), path))

    def disconnect_next(self, *, times: int = 1, path: str | None = None) -> None:
        """Close the connection without answering the next ``times`` requests."""
        with self._lock:
            for _ in range(times):
                self._failures.append(_Failure(0, None, {}, path))

    def paths(self) -> list[str]:
        return [r.path for r in self.requests]

    # -- dispatch ----------------------------------------------------------------------------

    def _take_failure(self, path: str) -> _Failure | None:
        with self._lock:
            for i, failure in enumerate(self._failures):
                if failure.path is None or failure.path == path:
                    return self._failures.pop(i)
        return None

    def handle(self, request: RecordedRequest) -> Reply | None:
        """The reply to ``request``; None means drop the connection."""
        with self._lock:
            self.requests.append(request)
        failure = self._take_failure(request.path)
        if failure is not None:
            if failure.status == 0:
                return None
            body = failure.body
            if body is None:
                body = error_body(
                    request.path, failure.status, f"scripted failure {failure.status}"
                )
            return Reply(failure.status, body, failure.headers)
        if self.api_key and self._credential(request) != self.api_key:
            return Reply(401, error_body(request.path, 401, "Incorrect API key provided"))
        path = request.path.split("?", 1)[0]
        for method, pattern, handler in self._routes:
            match = pattern.fullmatch(path)
            if match and method == request.method:
                return handler(request, match)
        return Reply(404, error_body(path, 404, f"no route for {request.method} {path}"))

    @staticmethod
    def _credential(request: RecordedRequest) -> str | None:
        provider = _provider(request.path)
        if provider == "anthropic":
            return request.headers.get("x-api-key")
        if provider == "gemini":
            return request.headers.get("x-goog-api-key")
        auth = request.headers.get("authorization", "")
        return auth.removeprefix("Bearer ") if auth.startswith("Bearer ") else None

    def _turn(self, body: dict[str, Any]) -> ModelTurn:
        answer = self.reply(body) if callable(self.reply) else self.reply
        return ModelTurn(text=answer) if isinstance(answer, str) else answer

    def _reply_text(self, body: dict[str, Any]) -> str:
        return self._turn(body).text

    def _sse(self, events: list[bytes]) -> Reply:
        """A streamed reply of SSE ``events`` (each already framed)."""
        headers = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
        return Reply(200, None, headers, stream=events, gate=self._gate)

    def _gate(self, index: int) -> None:
        if self.stream_delay:
            time.sleep(self.stream_delay)
        if self.stream_gate is not None:
            self.stream_gate(index)

    # -- OpenAI ------------------------------------------------------------------------------

    def _openai_chat(self, request: RecordedRequest, _: re.Match[str]) -> Reply:
        body = request.body if isinstance(request.body, dict) else {}
        turn = self._turn(body)
        n = len(self.requests)
        calls = [
            {
                "id": call.id or f"call_{n}_{i}",
                "type": "function",
                "function": {"name": call.name, "arguments": json.dumps(call.arguments)},
            }
            for i, call in enumerate(turn.tool_calls)
        ]
        prompt_tokens = _words(body.get("messages", []))
        completion_tokens = len(turn.text.split())
        usage = {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
        }
        finish = "tool_calls" if calls else "stop"
        model = body.get("model", self.model)
        if body.get("stream"):
            return self._sse(
                _openai_events(
                    f"chatcmpl-{n}",
                    model,
                    turn.text,
                    calls,
                    finish,
                    usage,
                    bool((body.get("stream_options") or {}).get("include_usage")),
                )
            )
        content = turn.text if turn.text or not calls else None
        message: dict[str, Any] = {"role": "assistant", "content": content}
        if calls:
            message["tool_calls"] = calls
        return Reply(
            200,
            {
                "id": f"chatcmpl-{n}",
                "object": "chat.completion",
                "created": 0,
                "model": model,
                "choices": [{"index": 0, "message": message, "finish_reason": finish}],
                "usage": usage,
            },
        )

    def _openai_embeddings(self, request: RecordedRequest, _: re.Match[str]) -> Reply:
        body = request.body if isinstance(request.body, dict) else {}
        inputs = body.get("input", [])
        if isinstance(inputs, str):
            inputs = [inputs]
        if not isinstance(inputs, list) or not inputs:
            return Reply(400, {"error": {"message": "'input' must be a non-empty list"}})
        dim = int(body.get("dimensions") or self.embedding_dim)
        data = [
            {"object": "embedding", "index": i, "embedding": fake_vector(str(text), dim)}
            for i, text in enumerate(inputs)
        ]
        if self.reverse_embeddings:
            data.reverse()
        tokens = sum(len(str(t).split()) for t in inputs)
        return Reply(
            200,
            {
                "object": "list",
                "data": data,
                "model": body.get("model", self.model),
                "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
            },
        )

    # -- Anthropic ---------------------------------------------------------------------------

    def _anthropic_messages(self, request: RecordedRequest, _: re.Match[str]) -> Reply:
        body = request.body if isinstance(request.body, dict) else {}
        messages = body.get("messages")
        problem = None
        if not isinstance(body.get("max_tokens"), int):
            problem = "max_tokens: Field required"
        elif not isinstance(messages, list) or not messages:
            problem = "messages: Field required"
        else:
            for i, message in enumerate(messages):
                role = message.get("role") if isinstance(message, dict) else None
                if role not in ("user", "assistant"):
                    problem = f"messages.{i}.role: Input should be 'user' or 'assistant'"
                    break
        if problem:
            return Reply(400, error_body(request.path, 400, problem))
        turn = self._turn(body)
        n = len(self.requests)
        content: list[dict[str, Any]] = [{"type": "text", "text": turn.text}] if turn.text else []
        content += [
            {
                "type": "tool_use",
                "id": call.id or f"toolu_{n}_{i}",
                "name": call.name,
                "input": call.arguments,
            }
            for i, call in enumerate(turn.tool_calls)
        ]
        if not content:
            content = [{"type": "text", "text": ""}]
        input_tokens = _words([body.get("system", ""), messages])
        message = {
            "id": f"msg_fake{n}",
            "type": "message",
            "role": "assistant",
            "model": body.get("model", self.model),
            "content": content,
            "stop_reason": "tool_use" if turn.tool_calls else "end_turn",
            "stop_sequence": None,
            "usage": {"input_tokens": input_tokens, "output_tokens": len(turn.text.split())},
        }
        if body.get("stream"):
            return self._sse(anthropic_events(message))
        return Reply(200, message)

    # -- Gemini ------------------------------------------------------------------------------

    def _gemini(self, request: RecordedRequest, match: re.Match[str]) -> Reply:
        body = request.body if isinstance(request.body, dict) else {}
        contents = body.get("contents")
        if not isinstance(contents, list) or not contents:
            return Reply(400, error_body(request.path, 400, "contents is not specified"))
        for i, content in enumerate(contents):
            role = content.get("role") if isinstance(content, dict) else None
            if role not in ("user", "model"):
                message = f"Please use a valid role: user, model. (contents[{i}].role={role!r})"
                return Reply(400, error_body(request.path, 400, message))
        unknown = sorted(set(body.get("generationConfig") or {}) - GEMINI_GENERATION_CONFIG)
        if unknown:
            message = (
                f'Invalid JSON payload received. Unknown name "{unknown[0]}" at generation_config'
            )
            return Reply(400, error_body(request.path, 400, message))
        prompt_tokens = _words([body.get("systemInstruction", ""), contents])
        model = match.group("model").split("/", 1)[1]
        if self.block_reason:
            return Reply(
                200,
                {
                    "promptFeedback": {"blockReason": self.block_reason, "safetyRatings": []},
                    "usageMetadata": {
                        "promptTokenCount": prompt_tokens,
                        "totalTokenCount": prompt_tokens,
                    },
                    "modelVersion": model,
                },
            )
        turn = self._turn(body)
        parts: list[dict[str, Any]] = [{"text": turn.text}] if turn.text else []
        parts += [{"functionCall": {"name": c.name, "args": c.arguments}} for c in turn.tool_calls]
        completion_tokens = len(turn.text.split())
        response = {
            "candidates": [
                {
                    "content": {"parts": parts or [{"text": ""}], "role": "model"},
                    "finishReason": "STOP",
                    "index": 0,
                }
            ],
            "usageMetadata": {
                "promptTokenCount": prompt_tokens,
                "candidatesTokenCount": completion_tokens,
                "totalTokenCount": prompt_tokens + completion_tokens,
            },
            "modelVersion": model,
            "responseId": f"fake-{len(self.requests)}",
        }
        if match.group("method") == "streamGenerateContent":
            sse = "alt=sse" in request.path.partition("?")[2]
            return self._stream_gemini(response, sse)
        return Reply(200, response)

    def _stream_gemini(self, response: dict[str, Any], sse: bool) -> Reply:
        candidate = response["candidates"][0]
        pieces = [
            {"candidates": [{"content": {"parts": [part], "role": "model"}, "index": 0}]}
            for part in _split_parts(candidate["content"]["parts"])
        ]
        pieces[-1]["candidates"][0]["finishReason"] = candidate["finishReason"]
        pieces[-1]["usageMetadata"] = response["usageMetadata"]
        pieces[-1]["modelVersion"] = response["modelVersion"]
        if sse:
            return self._sse([sse_event(piece) for piece in pieces])
        chunks = [
            ("[" if i == 0 else ",\r\n").encode() + json.dumps(piece).encode()
            for i, piece in enumerate(pieces)
        ]
        chunks[-1] += b"]"
        return Reply(200, None, {"Content-Type": "application/json"}, chunks, self._gate)


# --------------------------------------------------------------------------- SSE builders


def words_of(text: str) -> list[str]:
    """``text`` as stream pieces: each word with the whitespace that follows it."""
    return re.findall(r"\S+\s*|\s+", text) or [""]


def halves(text: str) -> list[str]:
    """``text`` in two pieces (tool arguments streamed as partial JSON)."""
    half = len(text) // 2
    return [p for p in (text[:half], text[half:]) if p]


def _split_parts(parts: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for part in parts:
        if "text" in part:
            out += [{"text": piece} for piece in words_of(part["text"])]
        else:
            out.append(part)
    return out


def sse_event(data: Any, name: str | None = None) -> bytes:
    """One server-sent event: ``event: name`` (when given) and ``data:`` the JSON."""
    head = f"event: {name}\n" if name else ""
    return f"{head}data: {json.dumps(data)}\n\n".encode()


def _openai_events(
    cid: str,
    model: str,
    text: str,
    calls: list[dict[str, Any]],
    finish: str,
    usage: dict[str, int],
    include_usage: bool,
) -> list[bytes]:
    def chunk(delta: dict[str, Any], finish_reason: str | None = None) -> bytes:
        choice = {"index": 0, "delta": delta, "finish_reason": finish_reason}
        body = {
            "id": cid,
            "object": "chat.completion.chunk",
            "created": 0,
            "model": model,
            "choices": [choice],
        }
        return sse_event(body)

    events = [chunk({"role": "assistant", "content": ""})]
    if text:
        events += [chunk({"content": piece}) for piece in words_of(text)]
    for i, call in enumerate(calls):
        head = {
            "index": i,
            "id": call["id"],
            "type": "function",
            "function": {"name": call["function"]["name"], "arguments": ""},
        }
        events.append(chunk({"tool_calls": [head]}))
        arguments = call["function"]["arguments"]
        half = len(arguments) // 2
        for piece in (arguments[:half], arguments[half:]):
            events.append(chunk({"tool_calls": [{"index": i, "function": {"arguments": piece}}]}))
    events.append(chunk({}, finish))
    if include_usage:
        events.append(
            sse_event(
                {
                    "id": cid,
                    "object": "chat.completion.chunk",
                    "created": 0,
                    "model": model,
                    "choices": [],
                    "usage": usage,
                }
            )
        )
    events.append(b"data: [DONE]\n\n")
    return events


def anthropic_events(message: dict[str, Any], *, start_tokens: int = 0) -> list[bytes]:
    """The Anthropic Messages stream of the finished ``message``: text in word pieces, tool
    input in two JSON halves, a ping after the first block's start. ``start_tokens``: the
    ``output_tokens`` ``message_start`` reports (the real API says 1). Also the scripted
    upstream's of the coding-agent tests (``tests/agents``)."""
    start = {
        **message,
        "content": [],
        "stop_reason": None,
        "usage": {**message["usage"], "output_tokens": start_tokens},
    }
    events = [sse_event({"type": "message_start", "message": start}, "message_start")]
    for index, block in enumerate(message["content"]):
        if block["type"] == "text":
            empty: dict[str, Any] = {"type": "text", "text": ""}
            deltas = [{"type": "text_delta", "text": piece} for piece in words_of(block["text"])]
        else:
            empty = {**block, "input": {}}
            deltas = [
                {"type": "input_json_delta", "partial_json": piece}
                for piece in halves(json.dumps(block["input"]))
            ]
        events.append(
            sse_event(
                {"type": "content_block_start", "index": index, "content_block": empty},
                "content_block_start",
            )
        )
        if index == 0:
            events.append(sse_event({"type": "ping"}, "ping"))
        events += [
            sse_event(
                {"type": "content_block_delta", "index": index, "delta": d}, "content_block_delta"
            )
            for d in deltas
        ]
        events.append(
            sse_event({"type": "content_block_stop", "index": index}, "content_block_stop")
        )
    events.append(
        sse_event(
            {
                "type": "message_delta",
                "delta": {"stop_reason": message["stop_reason"], "stop_sequence": None},
                "usage": {"output_tokens": message["usage"]["output_tokens"]},
            },
            "message_delta",
        )
    )
    events.append(sse_event({"type": "message_stop"}, "message_stop"))
    return events


class _Server(ThreadingHTTPServer):
    request_queue_size = 256  # many concurrent clients (a proxy under load) connect at once


def _make_handler(fake: FakeLLMServer) -> type[BaseHTTPRequestHandler]:
    class _Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        disable_nagle_algorithm = True  # small writes go out at once (no 40 ms ACK waits)

        def log_message(self, format: str, *args: Any) -> None:  # keep test output quiet
            pass

        def _serve(self) -> None:
            length = int(self.headers.get("content-length") or 0)
            raw = self.rfile.read(length) if length else b""
            try:
                body = json.loads(raw) if raw else None
            except (json.JSONDecodeError, UnicodeDecodeError):
                body = None
            headers = {k.lower(): v for k, v in self.headers.items()}
            request = RecordedRequest(self.command, self.path, headers, body, raw)
            reply = fake.handle(request)
            if reply is None:
                self.close_connection = True
                return
            if reply.stream is not None:
                self._stream(reply)
                return
            payload = (
                reply.body if isinstance(reply.body, bytes) else json.dumps(reply.body).encode()
            )
            try:
                self.send_response(reply.status)
                if "content-type" not in {k.lower() for k in reply.headers}:
                    self.send_header("Content-Type", "application/json")
                for key, value in reply.headers.items():
                    self.send_header(key, value)
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)
            except (BrokenPipeError, ConnectionResetError):
                self.close_connection = True

        def _stream(self, reply: Reply) -> None:
            """Send ``reply.stream`` with chunked transfer encoding, each piece flushed."""
            assert reply.stream is not None
            try:
                self.send_response(reply.status)
                for key, value in reply.headers.items():
                    self.send_header(key, value)
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                for i, piece in enumerate(reply.stream):
                    if i and reply.gate is not None:
                        reply.gate(i)
                    self.wfile.write(f"{len(piece):x}\r\n".encode() + piece + b"\r\n")
                    self.wfile.flush()
                self.wfile.write(b"0\r\n\r\n")
                self.wfile.flush()
            except (BrokenPipeError, ConnectionResetError):
                self.close_connection = True

        do_POST = do_GET = do_PUT = do_DELETE = _serve

    return _Handler
